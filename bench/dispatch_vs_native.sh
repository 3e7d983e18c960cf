#!/usr/bin/env bash
# The cost of run-time SIMD dispatch: the default build (kernels per level, the rest for any
# x86-64) against a -DTAPEGRAD_NATIVE=ON build of the same commit, run in turn on this machine.
# Prints, per benchmark figure, the medians over ROUNDS alternating runs and their ratio.
#   [ROUNDS=3] [STEPS=8] bash bench/dispatch_vs_native.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${ROUNDS:-3}"
steps="${STEPS:-8}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for kind in default native; do
  flag=OFF; [ "$kind" = native ] && flag=ON
  cmake -S "$root" -B "$root/build-$kind" -DCMAKE_BUILD_TYPE=Release -DTAPEGRAD_NATIVE=$flag \
    -DTAPEGRAD_BUILD_TESTS=OFF -DTAPEGRAD_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$root/build-$kind" -j"$(nproc)" --target bench_kernels bench_train bench_kv_cache >/dev/null
done
for round in $(seq "$rounds"); do
  for kind in default native; do
    b="$root/build-$kind"
    "$b/bench_kv_cache" --repeats 20 --out "$work/kv-$kind-$round.json" >/dev/null
    "$b/bench_train" --configs a,b,c --threads 1 --steps "$steps" --out "$work/train-$kind-$round.json" >/dev/null
    "$b/bench_kernels" --quick --threads 1 --out "$work/kernels-$kind-$round.json" >/dev/null
  done
done
python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def load(name, kind): return [json.load(open(f"{work}/{name}-{kind}-{r}.json")) for r in range(1, rounds + 1)]
def figures(name, extract):
    out = {}
    for kind in ("default", "native"):
        for j in load(name, kind):
            for key, value in extract(j):
                out.setdefault(key, {}).setdefault(kind, []).append(value)
    return out
kv = figures("kv", lambda j: [("decode 100 tokens, cache (ms)", 1e3 * j["cache"]["median_s"])])
train = figures("train", lambda j: [(f"train config {c} 1 thread (ms/step)", v["threads"]["1"]["ms_per_step_median"])
                                    for c, v in j["configs"].items()])
kernels = figures("kernels", lambda j: [(f"{r['kernel']} {r['shape']} (us)", 1e6 * r["median_s"]) for r in j["results"]])
machine = load("kv", "default")[0]["machine"]
print(f"dispatch (default build) against -march=native, {rounds} alternating rounds; {machine}")
print(f"{'figure':<64} {'default':>10} {'native':>10} {'ratio':>7}")
for table in (kv, train, kernels):
    for key, sides in table.items():
        d, n = statistics.median(sides["default"]), statistics.median(sides["native"])
        print(f"{key[:64]:<64} {d:>10.3f} {n:>10.3f} {d / n:>7.3f}")
PY
