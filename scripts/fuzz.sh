#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (coverage + ASan + UBSan) and runs them side by side for
# ${1:-60} seconds each from the seed corpora in fuzz/corpus; any crash fails the script and
# leaves its input in build-fuzz/crashes/. Run longer with: bash scripts/fuzz.sh 3600
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTAPEGRAD_FUZZ=ON \
  -DTAPEGRAD_BUILD_TESTS=OFF -DTAPEGRAD_BUILD_EXAMPLES=OFF -DTAPEGRAD_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_checkpoint fuzz_utf8 fuzz_completion_request fuzz_chat_request fuzz_gguf \
  fuzz_tokenizer_json
mkdir -p build-fuzz/crashes
# The targets run side by side (one core each); then each one's statistics, or its last lines.
targets=(checkpoint utf8 completion_request chat_request gguf tokenizer_json)
pids=()
for target in "${targets[@]}"; do
  work=build-fuzz/corpus-$target
  mkdir -p "$work"
  seeds=(fuzz/corpus/$target)
  # GGUF's seeds are the suite's tensor-type files (every block and value type, v2 and v3), made
  # by tests/data/make_gguf_types.py: no GGUF file is kept twice.
  [ "$target" = gguf ] && seeds=(tests/data/gguf_types)
  ./build-fuzz/fuzz_$target -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=512 \
    -artifact_prefix=build-fuzz/crashes/$target- -print_final_stats=1 "$work" "${seeds[@]}" \
    2>build-fuzz/fuzz_$target.log &
  pids+=($!)
done
failed=0
for i in "${!targets[@]}"; do
  target=${targets[$i]}
  echo "fuzz_$target: ${seconds}s"
  if wait "${pids[$i]}"; then
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" build-fuzz/fuzz_$target.log | sed "s/^/  /"
  else
    tail -n 40 build-fuzz/fuzz_$target.log
    failed=1
  fi
done
exit $failed
