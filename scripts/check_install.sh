#!/usr/bin/env bash
# Installs tapegrad from a build folder into a temporary prefix, then configures, builds and runs
# against it tests/consumer (find_package(tapegrad 0.3) + tapegrad::tapegrad, this version's
# spellings, no warning allowed) and tests/consumer_0_2 (find_package(tapegrad 0.2), 0.2's spellings
# through their deprecated forwarders: warnings expected, errors fail the check). Usage: check_install.sh [BUILD_DIR]
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
# Which requests the installed version meets (README.md, "Versions": 0.M is met by 0.M and 0.(M+1)).
version_file="$(find "$tmp/prefix" -name tapegradConfigVersion.cmake)"
cat >"$tmp/meets.cmake" <<'EOF'
string(REPLACE "." ";" parts "${PACKAGE_FIND_VERSION}")
list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
set(CMAKE_SIZEOF_VOID_P 8)
include("${VERSION_FILE}")
message("${PACKAGE_VERSION_COMPATIBLE}")
EOF
installed="$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$version_file")"
IFS=. read -r major minor _ <<<"$installed"
for request in "$major.$((minor - 1)):TRUE" "$major.$minor:TRUE" "$major.$((minor - 2)):FALSE" \
               "$major.$((minor + 1)):FALSE" "$((major + 1)).$minor:FALSE"; do
  meets="$(cmake -DVERSION_FILE="$version_file" -DPACKAGE_FIND_VERSION="${request%%:*}" -P "$tmp/meets.cmake" 2>&1)"
  if [[ "$meets" != "${request##*:}" ]]; then
    echo "check_install: find_package(tapegrad ${request%%:*}) against $installed gives '$meets', not ${request##*:}" >&2
    exit 1
  fi
done
build_and_run consumer "-Werror"
build_and_run consumer_0_2 ""
deprecated="$(grep -c "warning: .*deprecated" "$tmp/consumer_0_2.log" || true)"
echo "check_install: find_package(tapegrad) from $tmp/prefix builds and runs tests/consumer and" \
  "tests/consumer_0_2 (0.2's spellings: $deprecated deprecation warnings)"
