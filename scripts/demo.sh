#!/usr/bin/env bash
# The README's main job: installs the packages, builds (Release), finds the tiny-Shakespeare
# text, trains a small character model (about two minutes on two cores) with a live progress
# line, saves the checkpoint to out/demo.safetensors and prints a sample from it.
# Usage: bash scripts/demo.sh [--data FILE]   (else $DATA, else ../shared/data/tinyshakespeare.txt
# beside the repository, else a download checked by its sha256 into ~/.cache/tapegrad).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
data="${DATA:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --data) [ $# -ge 2 ] || { echo "demo.sh: --data needs a file" >&2; exit 2; }; data="$2"; shift 2 ;;
    --data=*) data="${1#--data=}"; shift ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (usage: bash scripts/demo.sh [--data FILE])" >&2; exit 2 ;;
  esac
done

if [ -z "$data" ] && [ -f "$repo/../shared/data/tinyshakespeare.txt" ]; then
  data="$repo/../shared/data/tinyshakespeare.txt"
fi
if [ -z "$data" ]; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/tapegrad"
  data="$cache/tinyshakespeare.txt"
  if [ ! -f "$data" ] || [ "$(sha256sum "$data" | cut -d' ' -f1)" != "$sha256" ]; then
    mkdir -p "$cache"
    part="$data.part.$$"
    trap 'rm -f "$part"' EXIT
    echo "downloading tiny Shakespeare from $url"
    if command -v curl >/dev/null; then curl -fsSL -o "$part" "$url" || rm -f "$part"
    elif command -v wget >/dev/null; then wget -q -O "$part" "$url" || rm -f "$part"
    fi
    if [ ! -s "$part" ]; then
      echo "demo.sh: no corpus: could not download $url (offline, or neither curl nor wget)." >&2
      echo "demo.sh: download it elsewhere and run: bash scripts/demo.sh --data /path/to/input.txt (or DATA=/path/to/input.txt bash scripts/demo.sh)" >&2
      exit 1
    fi
    got="$(sha256sum "$part" | cut -d' ' -f1)"
    if [ "$got" != "$sha256" ]; then
      echo "demo.sh: $url has sha256 $got, expected $sha256; not using it (pass --data FILE to use another text)" >&2
      exit 1
    fi
    mv "$part" "$data"
  fi
fi
[ -f "$data" ] || { echo "demo.sh: $data: no such file (pass --data FILE)" >&2; exit 1; }

bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target train_char generate evaluate

# d64 h4 L2 (139,777 parameters with 65 characters), windows of 128 (= max_len, so every position
# the sample uses is trained), batches of 16: 2,800 steps take about two minutes on two cores.
# OpenMP's passive wait policy (threads sleep at once at a barrier instead of spinning) costs
# about a quarter of the speed on idle cores but keeps 2-thread training 4-6x faster when other
# work shares the cores, as on a busy build machine; override by setting it.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
start=$(date +%s)
build/train_char --data "$data" --out out/demo.safetensors --d-model 64 --heads 4 --blocks 2 --max-len 128 \
  --seq 128 --batch 16 --steps 2800 --eval-every 200 --save-every 500 --seed 0
echo "trained in $(( $(date +%s) - start )) s"
echo
echo "--- a sample: build/generate --checkpoint out/demo.safetensors --prompt 'ROMEO:' --max-new 120 ---"
build/generate --checkpoint out/demo.safetensors --prompt "ROMEO:" --max-new 120 --seed 0
echo
