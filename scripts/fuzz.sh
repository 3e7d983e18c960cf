#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (coverage + ASan + UBSan) and runs each for
# ${1:-60} seconds from the seed corpora in fuzz/corpus; any crash fails the script and leaves
# its input in build-fuzz/crashes/. Run longer with: bash scripts/fuzz.sh 3600
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTAPEGRAD_FUZZ=ON \
  -DTAPEGRAD_BUILD_TESTS=OFF -DTAPEGRAD_BUILD_EXAMPLES=OFF -DTAPEGRAD_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_checkpoint fuzz_utf8
mkdir -p build-fuzz/crashes
for target in checkpoint utf8; do
  work=build-fuzz/corpus-$target
  mkdir -p "$work"
  echo "fuzz_$target: ${seconds}s"
  ./build-fuzz/fuzz_$target -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=512 \
    -artifact_prefix=build-fuzz/crashes/$target- -print_final_stats=1 "$work" fuzz/corpus/$target \
    2>build-fuzz/fuzz_$target.log || { tail -n 40 build-fuzz/fuzz_$target.log; exit 1; }
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" build-fuzz/fuzz_$target.log | sed "s/^/  /"
done
