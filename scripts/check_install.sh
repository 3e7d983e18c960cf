#!/usr/bin/env bash
# Installs tapegrad from a build folder into a temporary prefix, then configures, builds and runs
# against it tests/consumer (find_package(tapegrad 0.2) + tapegrad::tapegrad, this version's
# spellings, no warning allowed) and tests/consumer_0_1 (0.1's spellings through their deprecated
# forwarders: warnings expected, errors fail the check). Usage: check_install.sh [BUILD_DIR]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$repo/build}" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
# consumer_dir, name, extra flags: configure, build (the compiler's output kept in a log) and run.
build_and_run() {
  local name="$1" flags="$2"
  cmake -S "$repo/tests/$name" -B "$tmp/$name" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS="$flags" >/dev/null
  if ! cmake --build "$tmp/$name" -j"$(nproc)" >"$tmp/$name.log" 2>&1; then
    cat "$tmp/$name.log"
    echo "check_install: tests/$name does not build against the installed package" >&2
    exit 1
  fi
  "$tmp/$name/$name"
}
build_and_run consumer "-Werror"
build_and_run consumer_0_1 ""
deprecated="$(grep -c "warning: .*deprecated" "$tmp/consumer_0_1.log" || true)"
echo "check_install: find_package(tapegrad) from $tmp/prefix builds and runs tests/consumer and" \
  "tests/consumer_0_1 (0.1's spellings: $deprecated deprecation warnings)"
