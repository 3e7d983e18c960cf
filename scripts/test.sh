#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (Release), runs every doctest case (the
# example programs' end-to-end tests among them), then checks that an installed tapegrad works
# from another CMake project (scripts/check_install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
(cd build && ./tapegrad_tests)
bash scripts/check_install.sh build
