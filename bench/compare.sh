#!/usr/bin/env bash
# compare.sh: tapegrad against eager PyTorch on this machine, same model, same weights, same work:
# training tokens/s for configs (a)-(d), peak memory, and cached decoding of 100 tokens. Builds
# (Release) if needed, runs bench_train, bench_kv_cache and torch_reference.py, and prints one table
# of ratios, also saved as bench/results/compare.md.
#   [STEPS=30] [REPEATS=5] [WAIT_QUIET=seconds] [BUILD_DIR=build] [RESULTS_DIR=bench/results] bash bench/compare.sh
# The two sides run back to back per config (tapegrad, then PyTorch), so that a change in the load
# of a shared machine hits both sides of a ratio alike; the per-config results are merged into
# train_cpu.json and torch_cpu.json (the sgemm peak is the best of every measurement).
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
# WAIT_QUIET=N: before each measurement, wait up to N seconds for a quiet spell: 10 one-second
# samples of which at least 8 see no other runnable process (timings under load are not comparable).
wait_quiet() {
  local budget="${WAIT_QUIET:-0}" waited=0 quiet running i
  [ "$budget" -gt 0 ] || return 0
  while [ "$waited" -lt "$budget" ]; do
    quiet=0
    for i in 1 2 3 4 5 6 7 8 9 10; do
      running="$(cut -d' ' -f4 /proc/loadavg | cut -d/ -f1)"  # counts the cut reading it
      [ "$running" -gt 1 ] || quiet=$((quiet + 1))
      sleep 1
    done
    waited=$((waited + 10))
    [ "$quiet" -lt 8 ] || return 0
  done
  echo "   (the machine stayed busy for ${budget} s; measuring anyway)"
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
torch_run() {  # torch_reference.py on tapegrad's own weights and batches, after checking agreement
  "$python" "$root/bench/torch_reference.py" --agreement "$work/agreement" --steps "$steps" --repeats "$repeats" "$@"
}
[ "$have_torch" = 0 ] || "$build/bench_train" --write-agreement "$work/agreement"

load_start="$(load)"
for config in a b c d; do
  wait_quiet
  echo "== config $config: bench_train (load average $(load))"
  "$build/bench_train" --configs "$config" --steps "$steps" --out "$work/train_$config.json"
  if [ "$have_torch" = 1 ]; then
    echo "== config $config: torch_reference.py (load average $(load))"
    torch_run --configs "$config" --no-decode --out "$work/torch_$config.json"
  fi
done
wait_quiet
echo "== decoding: bench_kv_cache (load average $(load))"
"$build/bench_kv_cache" --repeats "$repeats" --out "$results/kv_cache_cpu.json"
if [ "$have_torch" = 1 ]; then
  echo "== decoding: torch_reference.py (load average $(load))"
  torch_run --configs "" --out "$work/torch_decode.json"
fi
load_end="$(load)"

echo "== comparison"
"$python" - "$results" "$work" "$have_torch" "$load_start" "$load_end" <<'EOF'
import json, os, sys

results, work, have_torch, load_start, load_end = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4], sys.argv[5]
load = lambda path: json.load(open(path))

# Merge the per-config runs into train_cpu.json: the peak is the best of every sgemm measurement.
parts = [load(os.path.join(work, f"train_{c}.json")) for c in "abcd"]
train = dict(parts[0])
train["configs"], train["sgemm_runs"], train["sgemm_peak_gflops"] = {}, {}, {}
for part in parts:
    for t, runs in part["sgemm_runs"].items():
        train["sgemm_runs"].setdefault(t, []).extend(runs)
for t, runs in train["sgemm_runs"].items():
    train["sgemm_peak_gflops"][t] = max(r["best_gflops"] for r in runs)
for part in parts:
    for name, entry in part["configs"].items():
        for t, r in entry["threads"].items():
            r["fraction_of_peak"] = r["model_gflops"] / train["sgemm_peak_gflops"][t]
        train["configs"][name] = entry
train["note"] = "merged by compare.sh from one bench_train run per config, each followed by PyTorch's"
json.dump(train, open(os.path.join(results, "train_cpu.json"), "w"), indent=2)
kv = load(os.path.join(results, "kv_cache_cpu.json"))
torch = None
if have_torch:
    torch = load(os.path.join(work, "torch_decode.json"))
    for c in "abcd":
        part = load(os.path.join(work, f"torch_{c}.json"))
        torch["configs"].update(part["configs"])
        torch["agreement"].update(part["agreement"])
    json.dump(torch, open(os.path.join(results, "torch_cpu.json"), "w"), indent=2)

def best(threads):
    t = max(threads, key=lambda k: threads[k]["tokens_per_s_median"])
    return t, threads[t]

rows = []
for name, target in {"a": 2.0, "b": 2.0, "c": 1.3, "d": 3.0}.items():
    t_threads, t = best(train["configs"][name]["threads"])
    tg = f"{t['tokens_per_s_median']:,.0f} ({t_threads} thr)"
    if torch:
        p_threads, p = best(torch["configs"][name]["threads"])
        ratio = t["tokens_per_s_median"] / p["tokens_per_s_median"]
        rows.append((f"training ({name}) tokens/s", tg, f"{p['tokens_per_s_median']:,.0f} ({p_threads} thr)",
                     f"{ratio:.2f}", f">= {target}", "yes" if ratio >= target else "NO"))
    else:
        rows.append((f"training ({name}) tokens/s", tg, "n/a", "n/a", f">= {target}", "n/a"))
for name in "abcd":  # target for peak memory: at most half of PyTorch's on (d)
    mine = train["configs"][name]["peak_memory_mib"]
    theirs = torch["configs"][name].get("peak_memory_mib") if torch else None
    rows.append((f"training ({name}) peak memory", f"{mine:.0f} MiB",
                 f"{theirs:.0f} MiB" if theirs else "n/a", f"{mine / theirs:.2f}" if theirs else "n/a",
                 "<= 0.5" if name == "d" else "", ("yes" if mine <= 0.5 * theirs else "NO") if theirs and name == "d" else ""))
thr = train["configs"]["c"]["threads"]
t_best = max(thr, key=lambda k: thr[k]["fraction_of_peak"])
f = thr[t_best]["fraction_of_peak"]
rows.append(("training (c) model FLOP/s / sgemm peak",
             f"{thr[t_best]['model_gflops']:.1f} / {train['sgemm_peak_gflops'][t_best]:.1f} GFLOP/s = {100 * f:.0f}% ({t_best} thr)",
             "", "", ">= 60%", "yes" if f >= 0.6 else "NO"))
cache_ms = kv["cache"]["median_s"] * 1e3
if torch:
    p_ms = torch["decode"]["best_cache_median_s"] * 1e3
    rows.append(("cached decoding, 100 tokens: time", f"{cache_ms:.2f} ms (1 thr)",
                 f"{p_ms:.1f} ms ({torch['decode']['best_threads']} thr)",
                 f"{cache_ms / p_ms:.4f} (PyTorch takes {p_ms / cache_ms:.1f}x as long)", "<= 0.05 (20x faster)",
                 "yes" if p_ms / cache_ms >= 20 else "NO"))
else:
    rows.append(("cached decoding, 100 tokens: time", f"{cache_ms:.2f} ms (1 thr)", "n/a", "n/a", "<= 0.05 (20x faster)", "n/a"))
rows.append(("cached decoding, 100 tokens: absolute", f"{cache_ms:.2f} ms", "", "", "<= 2 ms",
             "yes" if cache_ms <= 2 else "NO"))

header = ("measure", "tapegrad", "PyTorch (eager)", "tapegrad / PyTorch", "target", "met")
lines = [f"# tapegrad vs PyTorch, {train['date']}", "",
         f"Machine: {train['machine']}; tapegrad commit {train['commit']}; "
         + (f"PyTorch {torch['torch']} (BLAS {os.path.basename(torch['blas'])}); " if torch else "PyTorch: not run; ")
         + f"load average {load_start} at the start, {load_end} at the end.", "",
         "Medians of the timed steps (decoding: of the repeats); training: each side's best of 1 and 2 threads; "
         "tapegrad decodes on 1 thread, PyTorch's best of 1 and 2. Same weights and batches on both sides, checked to "
         "agree before timing.", "",
         "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
lines += ["| " + " | ".join(r) + " |" for r in rows]
if torch:
    a = torch["agreement"]
    lines += ["", "Agreement (tapegrad vs PyTorch, tolerance 1e-4): " + "; ".join(
        f"({k}) loss {v['loss_tapegrad']:.6f} vs {v['loss_torch']:.6f}" for k, v in sorted(a.items()) if k != "decode")
        + f"; decoding: prefill logits max |diff| {a['decode']['prefill_logits_max_abs_diff']:.1e}, "
          f"{a['decode']['steps_agreeing']}/{a['decode']['steps']} greedy steps agree."]
text = "\n".join(lines) + "\n"
print(text)
open(os.path.join(results, "compare.md"), "w").write(text)
print(f"wrote {os.path.join(results, 'compare.md')}, train_cpu.json" + (", torch_cpu.json" if torch else ""))
EOF
