#!/usr/bin/env bash
# Installs the Debian packages tapegrad builds, tests and documents with, when any is missing.
set -euo pipefail
packages=(build-essential cmake ccache libxtensor-dev xtl-dev libxsimd-dev doctest-dev
          clang libclang-rt-14-dev libomp-dev libfmt-dev libopenblas-dev libopenblas-openmp-dev libcli11-dev nlohmann-json3-dev libpcre2-dev pkg-config libcpp-httplib-dev python3-numpy python3-pip python3-venv doxygen
          libopenmpi-dev openmpi-bin iproute2)
# Headless Chromium for the playground's browser test (tests/serve/test_playground.cpp): about 30 s
# of apt-get on a fresh machine.
packages+=(chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
