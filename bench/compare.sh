#!/usr/bin/env bash
# compare.sh: tapegrad against every PyTorch this machine has, same models, same weights, same work:
# training tokens/s for configs (a)-(d) and a-gpt2, peak memory, and cached decoding of 100 tokens.
# The PyTorch side is Debian's python3-torch (installed with apt-get if missing) and, where PyPI
# is reachable, the pip torch of bench/requirements.txt in the virtual environment bench/.venv
# (scripts/python_tools.sh creates it if missing; PIP_TORCH=0 skips it, TORCH_VENV=DIR uses
# another), each eager and under torch.compile (where that torch has it). Builds (Release) if
# needed, runs bench_train, bench_kv_cache and bench/torch_reference.py, and prints one table of
# ratios against PyTorch's best (bench/compare_report.py), also saved as bench/results/compare.md.
#   [STEPS=30] [REPEATS=5] [MODES=eager,compile] [CONFIGS="a b c d a-gpt2"] [PIP_TORCH=1]
#   [TORCH_VENV=DIR] [WAIT_QUIET=seconds] [BUILD_DIR=build-bench] [RESULTS_DIR=bench/results] bash bench/compare.sh
# tapegrad and every PyTorch run back to back per config, so that a change in the load of a shared
# machine hits every side of a ratio alike; the per-config results are merged into train_cpu.json and
# torch_cpu.json (the sgemm and FMA peaks are the best of every measurement).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# A build of its own: it configures without tests and examples, which would leave a developer's
# build/ with a stale test binary.
build="${BUILD_DIR:-$root/build-bench}"
steps="${STEPS:-30}"
repeats="${REPEATS:-5}"
modes="${MODES:-eager,compile}"
configs="${CONFIGS:-a b c d a-gpt2}"
results="${RESULTS_DIR:-$root/bench/results}"
debian_python=/usr/bin/python3  # Debian's python3-torch lives in the system Python
venv="${TORCH_VENV:-$root/bench/.venv}"
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
pythons=()  # every interpreter with a torch, each timed in every mode of $modes
if ! "$debian_python" -c "import torch" 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  echo "python3-torch is missing: installing it with apt-get"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-torch python3-numpy >/dev/null; } \
    || echo "compare.sh: could not install python3-torch (needs root or passwordless sudo, and network)"
fi
if "$debian_python" -c "import torch" 2>/dev/null; then pythons+=("$debian_python"); fi
if [ "${PIP_TORCH:-1}" != 0 ]; then
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    bash "$root/scripts/python_tools.sh" "$venv" || echo "compare.sh: no pip torch in $venv"
  fi
  if "$venv/bin/python" -c "import torch" 2>/dev/null; then pythons+=("$venv/bin/python"); fi
fi
if [ "${#pythons[@]}" = 0 ]; then
  echo "compare.sh: no PyTorch at all: SKIPPING the PyTorch part; the table shows tapegrad's figures only."
fi
for python in "${pythons[@]}"; do
  echo "   $python: torch $("$python" -c 'import torch; print(torch.__version__)')"
done
torch_run() {  # PYTHON WHAT ARGS...: torch_reference.py on tapegrad's own weights and batches, after checking agreement
  local python="$1" what="$2"
  shift 2
  local i
  for i in "${!pythons[@]}"; do [ "${pythons[$i]}" != "$python" ] || break; done
  echo "== $what: torch_reference.py with $python (load average $(load))"
  "$python" "$root/bench/torch_reference.py" --agreement "$work/agreement" --steps "$steps" --repeats "$repeats" \
    --out "$work/torch_${i}_${what// /_}.json" "$@"
}
# shellcheck disable=SC2086  # $configs is a list
[ "${#pythons[@]}" = 0 ] || "$build/bench_train" --write-agreement "$work/agreement" --configs "$(echo $configs | tr ' ' ,)"

load_start="$(load)"
for config in $configs; do
  wait_quiet
  echo "== config $config: bench_train (load average $(load))"
  "$build/bench_train" --configs "$config" --steps "$steps" --out "$work/train_$config.json"
  for python in "${pythons[@]}"; do
    torch_run "$python" "config $config" --configs "$config" --modes "$modes" --no-decode
  done
done
wait_quiet
echo "== decoding: bench_kv_cache (load average $(load))"
"$build/bench_kv_cache" --repeats "$repeats" --out "$results/kv_cache_cpu.json"
for python in "${pythons[@]}"; do
  torch_run "$python" "decode" --configs ""
done
load_end="$(load)"

echo "== comparison"
# shellcheck disable=SC2086  # $configs is a list
python3 "$root/bench/compare_report.py" "$results" "$work" "$load_start" "$load_end" $configs
