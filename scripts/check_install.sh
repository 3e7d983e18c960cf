#!/usr/bin/env bash
# Installs tapegrad from a build folder into a temporary prefix, then configures, builds and runs
# tests/consumer (find_package(tapegrad) + tapegrad::tapegrad) against it. Usage: check_install.sh [BUILD_DIR]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$repo/build}" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$repo/tests/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/consumer" -j"$(nproc)" >/dev/null
"$tmp/consumer/consumer"
echo "check_install: find_package(tapegrad) from $tmp/prefix builds and runs"
