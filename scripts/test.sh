#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (Release), runs every doctest case (the
# example programs' end-to-end tests among them, and the checks of README.md's and docs/'s code
# blocks), builds the API reference (Doxygen; any warning fails) and checks that an installed
# tapegrad works from another CMake project; then (unless TAPEGRAD_QUICK=1) the same suite under
# AddressSanitizer + UndefinedBehaviorSanitizer, and each fuzzer for 60 seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, for keeping the whole run (CI: 2 cores) in its budget.
phase_start=$SECONDS
phase() { echo "== $1 ($((SECONDS - phase_start)) s since the start)"; }
bash scripts/deps.sh
phase "build"
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
phase "the suite"
# SmolLM2 for the real-model tests (tests/support/real_model.h): CI must have it, elsewhere they skip.
if smollm2=$(bash scripts/fetch_model.sh); then
  export TAPEGRAD_SMOLLM2=$smollm2
elif [ -n "${CI:-}" ]; then
  echo "scripts/fetch_model.sh failed: CI runs the real-model tests, so the run fails" >&2
  exit 1
else
  echo "warning: SmolLM2 could not be fetched; the tests that need it will skip" >&2
fi
# transformers, peft and gguf in bench/.venv, which read the exports back (tests/support/helpers.h).
if ! bash scripts/python_tools.sh; then
  if [ -n "${CI:-}" ]; then
    echo "scripts/python_tools.sh failed: CI reads the exports back with transformers and peft, so the run fails" >&2
    exit 1
  fi
  echo "warning: bench/.venv could not be set up; the checks with transformers, peft and gguf will skip" >&2
fi
(cd build && ./tapegrad_tests)
phase "docs and the install check"
cmake --build build --target docs
bash scripts/check_install.sh build
[ "${TAPEGRAD_QUICK:-0}" = 1 ] && exit 0

phase "the suite again under ASan + UBSan"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTAPEGRAD_SANITIZE=ON -DTAPEGRAD_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ./tapegrad_tests)

phase "fuzzing"
bash scripts/fuzz.sh 60
phase "done"
