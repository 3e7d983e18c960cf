#!/usr/bin/env bash
# compare.sh: tapegrad against eager PyTorch on this machine, same model, same work (issue 7):
# training tokens/s for configs (a), (b), (c) and cached decoding of 100 tokens. Builds (Release) if
# needed, runs bench_train, bench_kv_cache and torch_reference.py in one run, and prints one table of
# ratios, also saved as bench/results/compare.md.
#   [STEPS=30] [REPEATS=5] [WAIT_QUIET=seconds] [BUILD_DIR=build] [RESULTS_DIR=bench/results] bash bench/compare.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
steps="${STEPS:-30}"
repeats="${REPEATS:-5}"
results="${RESULTS_DIR:-$root/bench/results}"
python=/usr/bin/python3  # Debian's python3-torch lives in the system Python
mkdir -p "$results"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

load() { cut -d' ' -f1-3 /proc/loadavg; }
# WAIT_QUIET=N: before each phase, wait up to N seconds for 5 consecutive one-second samples in
# which no other process is runnable (the machine is shared; timings under load are not comparable).
wait_quiet() {
  local budget="${WAIT_QUIET:-0}" quiet=0 waited=0
  [ "$budget" -gt 0 ] || return 0
  while [ "$quiet" -lt 5 ] && [ "$waited" -lt "$budget" ]; do
    running="$(cut -d' ' -f4 /proc/loadavg | cut -d/ -f1)"  # includes the cut reading it
    if [ "$running" -le 1 ]; then quiet=$((quiet + 1)); else quiet=0; fi
    sleep 1
    waited=$((waited + 1))
  done
  [ "$quiet" -ge 5 ] || echo "   (the machine stayed busy for ${budget} s; measuring anyway)"
}

echo "== build (Release) in $build"
bash "$root/scripts/deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTAPEGRAD_BUILD_TESTS=OFF -DTAPEGRAD_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" -j2 --target bench_train bench_kv_cache >/dev/null

echo "== PyTorch"
have_torch=1
if ! "$python" -c "import torch" 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  echo "python3-torch is missing: installing it with apt-get"
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-torch python3-numpy >/dev/null; } \
     || ! "$python" -c "import torch" 2>/dev/null; then
    echo "compare.sh: could not install python3-torch (needs root or passwordless sudo, and network);"
    echo "            SKIPPING the PyTorch part: the table shows tapegrad's figures only."
    have_torch=0
  fi
fi

load_start="$(load)"
wait_quiet
echo "== bench_train (load average $(load))"
"$build/bench_train" --steps "$steps" --out "$results/train_cpu.json"
wait_quiet
echo "== bench_kv_cache (load average $(load))"
"$build/bench_kv_cache" --repeats "$repeats" --out "$results/kv_cache_cpu.json"
if [ "$have_torch" = 1 ]; then
  "$build/bench_train" --write-agreement "$work/agreement"
  wait_quiet
  echo "== torch_reference.py (load average $(load))"
  "$python" "$root/bench/torch_reference.py" --agreement "$work/agreement" --steps "$steps" --repeats "$repeats" \
    --out "$results/torch_cpu.json"
fi
load_end="$(load)"

echo "== comparison"
"$python" - "$results" "$have_torch" "$load_start" "$load_end" <<'EOF'
import json, os, sys

results, have_torch, load_start, load_end = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4]
train = json.load(open(os.path.join(results, "train_cpu.json")))
kv = json.load(open(os.path.join(results, "kv_cache_cpu.json")))
torch = json.load(open(os.path.join(results, "torch_cpu.json"))) if have_torch else None

def best(threads):
    t = max(threads, key=lambda k: threads[k]["tokens_per_s_median"])
    return t, threads[t]

rows = []
targets = {"a": 2.0, "b": 2.0, "c": 1.3}
for name, target in targets.items():
    if name not in train["configs"]:
        continue
    t_threads, t = best(train["configs"][name]["threads"])
    tg = f"{t['tokens_per_s_median']:,.0f} ({t_threads} thr)"
    if torch and name in torch["configs"]:
        p_threads, p = best(torch["configs"][name]["threads"])
        ratio = t["tokens_per_s_median"] / p["tokens_per_s_median"]
        rows.append((f"training ({name}) tokens/s", tg, f"{p['tokens_per_s_median']:,.0f} ({p_threads} thr)",
                     f"{ratio:.2f}x", f">= {target}x", "yes" if ratio >= target else "NO"))
    else:
        rows.append((f"training ({name}) tokens/s", tg, "n/a", "n/a", f">= {target}x", "n/a"))
if "c" in train["configs"]:
    thr = train["configs"]["c"]["threads"]
    t_threads = max(thr, key=lambda k: thr[k]["fraction_of_peak"])
    f = thr[t_threads]["fraction_of_peak"]
    rows.append(("training (c) model FLOP/s / sgemm peak",
                 f"{thr[t_threads]['model_gflops']:.1f} GFLOP/s = {100 * f:.0f}% of {train['sgemm_peak_gflops'][t_threads]:.1f} ({t_threads} thr)",
                 "", "", ">= 60%", "yes" if f >= 0.6 else "NO"))
cache_ms = kv["cache"]["median_s"] * 1e3
if torch:
    p_ms = torch["decode"]["best_cache_median_s"] * 1e3
    speedup = p_ms / cache_ms
    rows.append(("cached decoding, 100 tokens (ms)", f"{cache_ms:.2f} (1 thr)",
                 f"{p_ms:.1f} ({torch['decode']['best_threads']} thr)",
                 f"{cache_ms / p_ms:.3f} (PyTorch/tapegrad = {speedup:.1f}x)", ">= 20x faster",
                 "yes" if speedup >= 20 else "NO"))
else:
    rows.append(("cached decoding, 100 tokens (ms)", f"{cache_ms:.2f} (1 thr)", "n/a", "n/a", ">= 20x faster", "n/a"))
rows.append(("cached decoding, 100 tokens, absolute", f"{cache_ms:.2f} ms", "", "", "<= 2 ms",
             "yes" if cache_ms <= 2 else "NO"))

header = ("measure", "tapegrad", "PyTorch (eager)", "tapegrad / PyTorch", "target (issue 7)", "met")
lines = [f"# tapegrad vs PyTorch, {train['date']}", "",
         f"Machine: {train['machine']}; tapegrad commit {train['commit']}; "
         + (f"PyTorch {torch['torch']} (BLAS {torch['blas']}); " if torch else "PyTorch: not run; ")
         + f"load average {load_start} at the start, {load_end} at the end.", "",
         "Medians; each side's best of 1 and 2 threads for training; tapegrad decodes on 1 thread. "
         "Same weights and batches on both sides (checked to agree before timing).", "",
         "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
lines += ["| " + " | ".join(r) + " |" for r in rows]
if torch and "agreement" in torch:
    a = torch["agreement"]
    lines += ["", "Agreement: " + "; ".join(
        f"{k}: loss {v['loss_tapegrad']:.6f} vs {v['loss_torch']:.6f}" for k, v in a.items() if k != "decode")
        + (f"; decode: prefill logits max |diff| {a['decode']['prefill_logits_max_abs_diff']:.1e}, "
           f"{a['decode']['steps_agreeing']}/{a['decode']['steps']} greedy steps agree" if "decode" in a else "")]
text = "\n".join(lines) + "\n"
print(text)
open(os.path.join(results, "compare.md"), "w").write(text)
print(f"wrote {os.path.join(results, 'compare.md')}")
EOF
