#!/usr/bin/env bash
# Sets up a virtual environment (bench/.venv, or the one named) with bench/requirements.txt, once:
# the suite reads tapegrad's exports back with transformers, peft and gguf from it, and the
# benchmarks time PyTorch in it. An environment that already imports them is left as it is.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$root/bench/.venv}"
modules="torch, transformers, tokenizers, peft, gguf, safetensors, numpy"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import $modules" 2>/dev/null; then
  exit 0
fi
echo "python_tools.sh: installing bench/requirements.txt into $venv (about 5.6 GB)" >&2
python3 -m venv "$venv"
if ! "$venv/bin/pip" install --quiet --no-cache-dir -r "$root/bench/requirements.txt" >&2; then
  echo "python_tools.sh: could not install bench/requirements.txt from PyPI into $venv (offline?)" >&2
  exit 1
fi
