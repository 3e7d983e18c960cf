#!/usr/bin/env bash
# Fine-tuning's bf16 check: the same full fine-tune of SmolLM2 on tiny Shakespeare run twice, with
# --precision f32 and --precision bf16 (side by side, one thread each), and the two final losses
# with their relative difference printed (the target: within 1%).
# Usage: bash scripts/finetune_bf16_vs_f32.sh --model GGUF_OR_HF_DIR [--data FILE] [--steps 200]
#        [--batch 1] [--seq 64] [--build build] [--out DIR]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
usage="usage: bash scripts/finetune_bf16_vs_f32.sh --model GGUF_OR_HF_DIR [--data FILE] [--steps N] [--batch B] [--seq T] [--build DIR] [--out DIR]"

model="" data="${TAPEGRAD_SHAKESPEARE:-$repo/../shared/data/tinyshakespeare.txt}"
steps=200 batch=1 seq=64 build="$repo/build" out="$repo/out/bf16_vs_f32"
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "finetune_bf16_vs_f32.sh: '$1' needs a value ($usage)" >&2; exit 2; }
  case "$1" in
    --model) model="$2" ;;
    --data) data="$2" ;;
    --steps) steps="$2" ;;
    --batch) batch="$2" ;;
    --seq) seq="$2" ;;
    --build) build="$2" ;;
    --out) out="$2" ;;
    *) echo "finetune_bf16_vs_f32.sh: unknown argument '$1' ($usage)" >&2; exit 2 ;;
  esac
  shift 2
done
[ -n "$model" ] || { echo "finetune_bf16_vs_f32.sh: --model is required ($usage)" >&2; exit 2; }
[ -e "$model" ] || { echo "finetune_bf16_vs_f32.sh: model '$model' not found" >&2; exit 2; }
[ -f "$data" ] || { echo "finetune_bf16_vs_f32.sh: data '$data' not found (--data or TAPEGRAD_SHAKESPEARE)" >&2; exit 2; }
[ -x "$build/train" ] || { echo "finetune_bf16_vs_f32.sh: '$build/train' not built (cmake --build $build --target train)" >&2; exit 2; }
mkdir -p "$out"

# Identical flags but --precision: same seed, batches and schedule, so the losses differ only by
# the products' rounding. One thread each, so the two runs can share a two-core machine.
run() {
  OMP_NUM_THREADS=1 "$build/train" --init "$model" --data "$data" --out "$out/$1.safetensors" \
    --precision "$1" --threads 1 --steps "$steps" --batch "$batch" --seq "$seq" --lr 1e-4 \
    --min-lr 1e-5 --eval-every "$steps" --eval-batches 8 --save-every 0 --seed 0 \
    > "$out/$1.log" 2>&1
}
run f32 & f32_pid=$!
run bf16 & bf16_pid=$!
wait "$f32_pid" || { echo "the f32 run failed, see $out/f32.log" >&2; exit 1; }
wait "$bf16_pid" || { echo "the bf16 run failed, see $out/bf16.log" >&2; exit 1; }

# The final validation loss (same windows for both) and the mean training loss of the last 20 steps.
final_losses() {
  awk -F, 'NR > 1 { if ($2 != "") { train[++n] = $2 } if ($3 != "") { val = $3 } }
           END { s = 0; k = (n < 20 ? n : 20); for (i = n - k + 1; i <= n; ++i) s += train[i];
                 printf "%s %.6f\n", val, s / k }' "$out/$1.metrics.csv"
}
read -r f32_val f32_train <<< "$(final_losses f32)"
read -r bf16_val bf16_train <<< "$(final_losses bf16)"
awk -v a="$f32_val" -v b="$bf16_val" -v c="$f32_train" -v d="$bf16_train" -v s="$steps" -v bt="$batch x $seq" 'BEGIN {
  printf "%d steps, B x T = %s, one thread each\n", s, bt
  printf "final validation loss: f32 %.5f, bf16 %.5f, relative difference %.3f%%\n", a, b, 100 * (b - a) / a
  printf "training loss, mean of the last 20 steps: f32 %.5f, bf16 %.5f, relative difference %.3f%%\n", c, d, 100 * (d - c) / c
}'
