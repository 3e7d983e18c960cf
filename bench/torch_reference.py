#!/usr/bin/python3
"""torch_reference: the same models (the rotary decoder, gpt2), training step and cached decoding as bench_train
and bench_kv_cache, in PyTorch, eager and under torch.compile, so bench/compare.sh can print tapegrad / PyTorch
ratios. It first checks that both implementations agree on checkpoints written by
`bench_train --write-agreement DIR`, in every mode it times. Writes bench/results/torch_cpu.json, where every
figure names the torch version and mode it was measured with. Runs with any torch: Debian's python3-torch
(/usr/bin/python3; 1.13 has no torch.compile, which is then reported, not fatal) or a pip torch in a venv."""

import argparse
import ctypes
import datetime
import json
import os
import platform
import subprocess
import statistics
import traceback
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import Gpt2, RotaryDecoder, read_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# bench_train's training configurations; vocab 65, max_len = seq, d_ff = 4 d_model.
CONFIGS = {
    "a": dict(d_model=64, n_heads=4, n_blocks=2, seq_len=128, batch=16),
    "b": dict(d_model=128, n_heads=4, n_blocks=4, seq_len=64, batch=12),
    "c": dict(d_model=256, n_heads=8, n_blocks=4, seq_len=256, batch=8),
    "d": dict(d_model=256, n_heads=8, n_blocks=4, seq_len=1024, batch=2),  # long context
    # gpt2 at (a)'s size.
    "a-gpt2": dict(d_model=64, n_heads=4, n_blocks=2, seq_len=128, batch=16, arch="gpt2"),
}
VOCAB = 65
ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)  # as bench/train_common.h
CLIP = 1.0
LOSS_TOLERANCE = 1e-4
MODES = ("eager", "compile")
# Untimed steps before the timed ones: under torch.compile the first compiles (its time is reported apart)
# and the second shows that nothing recompiles.
WARMUP_STEPS = {"eager": 1, "compile": 2}


def loaded_openblas():
    """The OpenBLAS that torch loaded (Debian's torch calls the system libblas.so.3), or None."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libopenblas" in line}
    if not paths:
        return None
    path = sorted(paths)[0]
    return path, ctypes.CDLL(path)


def set_threads(n):
    """n threads for torch's own kernels (OpenMP) and for its BLAS: torch.set_num_threads does not
    reach an external OpenBLAS, which otherwise runs on every core whatever torch is told."""
    torch.set_num_threads(n)
    blas = loaded_openblas()
    if blas:
        blas[1].openblas_set_num_threads(n)


def make_optimizer(model):
    """AdamW with decoupled weight decay on matrices only (never norm weights or biases)."""
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    options = dict(ADAMW)
    wd = options.pop("weight_decay")
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                             **options)


def compile_unavailable():
    """Why torch.compile cannot run with this torch, or None when it can be tried."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile (it came with torch 2.0)"
    return None


def loss_function(model, mode, threads):
    """model.loss, or under mode "compile" a fresh torch.compile of it (forward and loss in one graph; the
    backward graph is compiled from it by AOTAutograd). Clip and AdamW stay eager in both modes."""
    if mode == "eager":
        return model.loss
    # A fresh start: graphs of earlier models neither count against the recompile limit (past which
    # torch silently falls back to eager) nor are reused at another thread count.
    torch._dynamo.reset()
    inductor = getattr(torch, "_inductor", None)
    if inductor is not None and hasattr(inductor.config, "cpp") and hasattr(inductor.config.cpp, "threads"):
        inductor.config.cpp.threads = threads  # generated kernels take their thread count from here
    return torch.compile(model.loss, fullgraph=True)


def train_step(model, optimizer, inputs, targets, loss_fn=None):
    """forward, backward, clip_grad_norm(1.0), AdamW step, zero_grad; returns (loss, grad norm). loss_fn
    (default model.loss) computes the loss, compiled or not."""
    loss = (loss_fn or model.loss)(inputs, targets)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item(), float(norm)


def model_for(config, max_len=None):
    cls = Gpt2 if config.get("arch") == "gpt2" else RotaryDecoder
    return cls(VOCAB, config["d_model"], config["n_heads"], config["n_blocks"], max_len or config["seq_len"])


def check_agreement(directory, names, mode="eager"):
    """Loads tapegrad's checkpoints and batches; the losses (of the model run in `mode`) must agree within
    LOSS_TOLERANCE. The loss after the step is computed eagerly: it checks the gradients (through AdamW)."""
    set_threads(1)
    results = {}
    ok = True
    for name in names:
        with open(os.path.join(directory, f"agreement_{name}.json")) as f:
            ref = json.load(f)
        tensors, meta = read_safetensors(os.path.join(directory, f"agreement_{name}.safetensors"))
        c = ref["config"]
        assert int(meta["d_model"]) == c["d_model"] and int(meta["max_len"]) == c["max_len"]
        cls = Gpt2 if c.get("arch") == "gpt2" else RotaryDecoder
        model = cls(c["vocab"], c["d_model"], c["n_heads"], c["n_blocks"], c["max_len"], c["d_ff"])
        model.load(tensors)
        B, T = ref["batch"], ref["seq_len"]
        inputs = torch.tensor(ref["inputs"], dtype=torch.long).view(B, T)
        targets = torch.tensor(ref["targets"], dtype=torch.long).view(B, T)
        optimizer = make_optimizer(model)
        start = time.perf_counter()
        loss, norm = train_step(model, optimizer, inputs, targets, loss_function(model, mode, 1))
        first_step_s = time.perf_counter() - start  # under torch.compile: mostly the compilation
        with torch.no_grad():
            loss_after = model.loss(inputs, targets).item()
        diff = abs(loss - ref["loss"])
        norm_rel = abs(norm - ref["grad_norm"]) / ref["grad_norm"]
        after_diff = abs(loss_after - ref["loss_after_step"])
        passed = diff <= LOSS_TOLERANCE
        ok &= passed
        print(f"  agreement {name} ({mode}): loss tapegrad {ref['loss']:.7f} torch {loss:.7f} |diff| {diff:.2e} "
              f"({'ok' if passed else 'FAIL'}, tolerance {LOSS_TOLERANCE:g}); grad norm {ref['grad_norm']:.6f} vs "
              f"{norm:.6f} (rel {norm_rel:.1e}); loss after one AdamW step {ref['loss_after_step']:.7f} vs "
              f"{loss_after:.7f} (|diff| {after_diff:.1e})")
        results[name] = dict(loss_tapegrad=ref["loss"], loss_torch=loss, abs_diff=diff, grad_norm_tapegrad=ref["grad_norm"],
                             grad_norm_torch=norm, loss_after_step_tapegrad=ref["loss_after_step"],
                             loss_after_step_torch=loss_after, passed=passed, first_step_s=first_step_s)
    if mode != "eager":
        return ok, results

    # Decoding: the prefill logits agree, and teacher-forcing tapegrad's 100 greedy tokens through the
    # torch cache, torch picks the same token at every step (or its top two are within 1e-4: a tie).
    with open(os.path.join(directory, "agreement_decode.json")) as f:
        ref = json.load(f)
    tensors, _ = read_safetensors(os.path.join(directory, "agreement_decode.safetensors"))
    m = ref["model"]
    model = RotaryDecoder(m["vocab"], m["d_model"], m["n_heads"], m["n_blocks"], m["max_len"])
    model.load(tensors)
    cache = model.make_cache()
    prompt = torch.tensor(ref["prompt"], dtype=torch.long)
    logits = model.run_cached(prompt, cache)
    prefill_diff = float((logits - torch.tensor(ref["prefill_logits"]).view_as(logits)).abs().max())
    same = 0
    last = logits[-1]
    for token in ref["tokens"]:
        top2 = torch.topk(last, 2).values
        if int(torch.argmax(last)) == token or float(top2[0] - top2[1]) < 1e-4:
            same += 1
        last = model.run_cached(torch.tensor([token]), cache)[0]
    passed = prefill_diff <= LOSS_TOLERANCE and same == len(ref["tokens"])
    ok &= passed
    print(f"  agreement decode: prefill logits max |diff| {prefill_diff:.2e}; greedy tokens agree at "
          f"{same}/{len(ref['tokens'])} steps ({'ok' if passed else 'FAIL'})")
    results["decode"] = dict(prefill_logits_max_abs_diff=prefill_diff, steps_agreeing=same,
                             steps=len(ref["tokens"]), passed=passed)
    return ok, results


def training_setup(name, directory):
    """The model and batch of config `name`: tapegrad's own (seed-0 weights, seeded ids) from the agreement
    directory when given, otherwise tapegrad's initialisation scheme with torch's random numbers."""
    config = CONFIGS[name]
    model = model_for(config)
    B, T = config["batch"], config["seq_len"]
    if directory:
        with open(os.path.join(directory, f"agreement_{name}.json")) as f:
            ref = json.load(f)
        model.load(read_safetensors(os.path.join(directory, f"agreement_{name}.safetensors"))[0])
        inputs = torch.tensor(ref["inputs"], dtype=torch.long).view(B, T)
        targets = torch.tensor(ref["targets"], dtype=torch.long).view(B, T)
    else:
        model.init_like_tapegrad()
        g = torch.Generator().manual_seed(1234)
        inputs = torch.randint(0, VOCAB, (B, T), generator=g)
        targets = torch.randint(0, VOCAB, (B, T), generator=g)
    return model, inputs, targets


def bench_training(name, threads, steps, directory, mode="eager"):
    """A fresh model: WARMUP_STEPS[mode] untimed steps (the first one compiles under torch.compile), then
    `steps` timed ones."""
    set_threads(threads)
    model, inputs, targets = training_setup(name, directory)
    optimizer = make_optimizer(model)
    loss_fn = loss_function(model, mode, threads)
    start = time.perf_counter()
    first, _ = train_step(model, optimizer, inputs, targets, loss_fn)
    first_step_s = time.perf_counter() - start
    for _ in range(WARMUP_STEPS[mode] - 1):
        train_step(model, optimizer, inputs, targets, loss_fn)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        last, _ = train_step(model, optimizer, inputs, targets, loss_fn)
        times.append(time.perf_counter() - start)
    assert last < first, f"config {name}: the loss did not fall ({first} -> {last})"
    ms = [t * 1e3 for t in times]
    median = statistics.median(ms)
    B, T = inputs.shape
    result = dict(ms_per_step_median=median, ms_per_step_min=min(ms), ms_per_step_max=max(ms),
                  tokens_per_s_median=B * T / (median * 1e-3), loss_first=first, loss_last=last,
                  first_step_s=first_step_s)
    if mode == "compile":
        result["compile_s"] = max(0.0, first_step_s - median * 1e-3)  # the first step less an ordinary one
    return result


def reset_peak_rss():
    """Makes the kernel's peak resident set (VmHWM) start again from the current one; False where it may not."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def vm_hwm_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("/proc/self/status has no VmHWM")


def peak_memory_here(name, directory, mode="eager"):
    """(steps, whole) MiB of this process training `name` in `mode` at 1 thread: steps is the peak resident
    set of one step after the warm-up (and the compilation), whole the peak over the process's life (the
    compiler's peak included); equal to whole where the peak cannot be reset. Both are VmHWM, not
    ru_maxrss: after fork and exec, ru_maxrss starts from the parent's peak (a torch process itself)."""
    set_threads(1)
    model, inputs, targets = training_setup(name, directory)
    optimizer = make_optimizer(model)
    loss_fn = loss_function(model, mode, 1)
    for _ in range(WARMUP_STEPS[mode]):
        train_step(model, optimizer, inputs, targets, loss_fn)
    before = vm_hwm_mib()
    was_reset = reset_peak_rss()
    train_step(model, optimizer, inputs, targets, loss_fn)
    steps = vm_hwm_mib()
    return (steps if was_reset else max(before, steps)), max(before, steps)


def measure_peak_memory(name, directory, mode="eager"):
    """peak_memory_here in a fresh interpreter, so that no other config's buffers count (as bench_train)."""
    command = [sys.executable, os.path.abspath(__file__), "--peak-memory", name, "--modes", mode]
    command += ["--agreement", directory] if directory else ["--skip-agreement"]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"peak memory of config {name} ({mode}): {' '.join(command)} failed: "
                           f"{run.stderr.strip().splitlines()[-1] if run.stderr.strip() else run.returncode}")
    steps, whole = run.stdout.split()[-2:]
    return float(steps), float(whole)


def bench_decoding(threads, repeats, directory):
    """bench_kv_cache's work: model (65, 64, 4, 2, 256), prompt 8, 100 greedy tokens; 1 warm-up; its
    seed-0 weights when the agreement directory is given."""
    set_threads(threads)
    model = RotaryDecoder(65, 64, 4, 2, 256)
    if directory:
        model.load(read_safetensors(os.path.join(directory, "agreement_decode.safetensors"))[0])
    else:
        model.init_like_tapegrad()
    prompt = torch.tensor([18, 47, 56, 57, 58, 1, 15, 47], dtype=torch.long)
    cached, uncached = model.generate_cached(prompt, 100), model.generate_uncached(prompt, 100)
    result = {"tokens_agree_with_no_cache": cached == uncached}
    for label, fn in (("cache", model.generate_cached), ("no_cache", model.generate_uncached)):
        fn(prompt, 100)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(prompt, 100)
            times.append(time.perf_counter() - start)
        result[label] = dict(median_s=statistics.median(times), min_s=min(times), max_s=max(times))
    return result


def bench_batched_decoding(threads, repeats, sizes=(1, 8, 64)):
    """bench_kv_cache's batched work: S sequences with prompts of 8, 100 new greedy tokens each; tokens/s =
    S * 100 / median time. Checks first that sequence s decoded in the batch gives what it gives alone."""
    set_threads(threads)
    model = RotaryDecoder(65, 64, 4, 2, 256)
    model.init_like_tapegrad()
    out = {}
    for S in sizes:
        g = torch.Generator().manual_seed(S)
        prompts = torch.randint(0, 65, (S, 8), generator=g)
        batch = model.generate_cached_batch(prompts, 100)
        alone = model.generate_cached_batch(prompts[-1:], 100)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model.generate_cached_batch(prompts, 100)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        out[str(S)] = dict(tokens_per_s=S * 100 / median, median_s=median, min_s=min(times), max_s=max(times),
                           last_sequence_equals_alone=bool(torch.equal(batch[-1], alone[0])))
    return out


def cpuinfo(field):
    """The first value of a /proc/cpuinfo field, as bench_common.h reads it."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == field:
                return value.strip()
    return "unknown"


def cpu_capability():
    """The instruction set torch's own kernels dispatch to ("AVX2"), from torch or its build summary."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        for line in torch.__config__.show().splitlines():
            if "CPU capability usage" in line:
                return line.split(":", 1)[1].strip()
    return "unknown"


def blas_info():
    """(library, core): the OpenBLAS torch loaded and the kernel it picked ("Zen"), or torch's own BLAS
    from its build summary (pip wheels link MKL statically)."""
    blas = loaded_openblas()
    if blas:
        corename = blas[1].openblas_get_corename
        corename.restype = ctypes.c_char_p
        return blas[0], corename().decode()
    config = torch.__config__.show()
    library = next((part.split("=", 1)[1].rstrip(",") for part in config.split() if part.startswith("BLAS_INFO=")),
                   "unknown")
    return library, f"chosen by {library} inside torch at run time"


def interpreter_name():
    """The interpreter as results files name it: relative to the repository inside it (bench/.venv), so
    that no file names this machine's folders; a system one by its own path (/usr/bin/python3)."""
    path = os.path.abspath(sys.executable)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def machine():
    """The CPU (model, family, model number), cores, instruction set and BLAS core, as bench_common.h's run_header."""
    library, core = blas_info()
    return {"cpu": cpuinfo("model name"), "cpu_family": cpuinfo("cpu family"), "cpu_model_number": cpuinfo("model"),
            "nproc": os.cpu_count(), "simd_level": cpu_capability(), "blas": library, "blas_core": core}


def run_label(mode):
    """The name of every figure of this interpreter in `mode`: "1.13.0a0 eager", "2.5.1 compile"."""
    return f"{torch.__version__} {mode}"


def short_error(error):
    """The last line of an exception's message, for a one-line report."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:300]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agreement", metavar="DIR", help="checkpoints from `bench_train --write-agreement DIR`")
    parser.add_argument("--skip-agreement", action="store_true", help="time without checking (not recommended)")
    parser.add_argument("--configs", default="a,b,c,d", help="training configs to time: a,b,c,d,a-gpt2 (may be empty)")
    parser.add_argument("--modes", default="eager",
                        help="training modes: eager, compile (torch.compile of forward + loss), or both: eager,compile")
    parser.add_argument("--no-decode", action="store_true", help="skip the decoding benchmark (always eager)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5, help="decoding repeats")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "torch_cpu.json"))
    parser.add_argument("--peak-memory", metavar="CONFIG", help=argparse.SUPPRESS)  # the child of measure_peak_memory
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes eager, compile or eager,compile, not {args.modes!r}")
    if args.peak_memory:
        print("%.1f %.1f" % peak_memory_here(args.peak_memory, args.agreement, modes[0]))
        return 0
    names = [n for n in args.configs.split(",") if n]
    threads = [int(t) for t in args.threads.split(",") if t]
    if any(n not in CONFIGS for n in names) or not threads or min(threads) < 1 or args.steps < 1 or args.repeats < 1:
        parser.error(f"configs are {', '.join(CONFIGS)}; threads and steps are positive")
    if not args.agreement and not args.skip_agreement:
        parser.error("--agreement DIR is required (or --skip-agreement)")

    now = datetime.datetime.now(datetime.timezone.utc)
    torch.ones(2, 2) @ torch.ones(2, 2)  # loads the BLAS
    info = machine()
    print(f"torch_reference on {info['cpu']} ({info['nproc']} cores, family {info['cpu_family']} model "
          f"{info['cpu_model_number']}, torch's kernels {info['simd_level']}), torch {torch.__version__} "
          f"(Python {platform.python_version()}, {interpreter_name()}), {now.strftime('%Y-%m-%d')}")
    print(f"  BLAS: {info['blas']}, core {info['blas_core']}")
    out = {"machine": info, "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "torch": torch.__version__,
           "python": f"{platform.python_version()} ({interpreter_name()})",
           "loadavg_before": open("/proc/loadavg").read().strip(),
           "threads_note": "t threads = torch.set_num_threads(t) and openblas_set_num_threads(t); under torch.compile "
                           "also the generated kernels' thread count",
           "steps": args.steps, "warmup_steps": {m: WARMUP_STEPS[m] for m in modes},
           "modes_are": {"eager": "the step as written",
                         "compile": "torch.compile(model.loss, fullgraph=True): forward and loss, and the backward "
                                    "AOTAutograd derives from them, compiled by inductor; clip_grad_norm and AdamW "
                                    "eager; compile_s = the first step's time less the median step (short when inductor's on-disk "
                                    "cache already holds the same graph)"},
           "peak_memory_is": "fresh `torch_reference.py --peak-memory CONFIG --modes MODE` process at 1 thread: "
                             "peak_memory_mib = peak resident set of one step after the warm-up steps (the kernel's "
                             "peak reset first, so the compiler's own peak is left out); peak_memory_mib_whole_process "
                             "= the peak over its life (VmHWM both); both the whole process (interpreter, torch, model, AdamW "
                             "state, autograd graph)",
           "runs": {}, "agreement": {}, "configs": {}}

    usable = []
    for mode in modes:
        label = run_label(mode)
        why_not = compile_unavailable() if mode == "compile" else None
        out["runs"][label] = {"torch": torch.__version__, "mode": mode, "python": out["python"],
                              "available": why_not is None}
        if why_not:
            out["runs"][label]["error"] = why_not
            print(f"  {mode}: not available here: {why_not}; {mode} figures are left out")
        else:
            usable.append(mode)

    # Agreement first, in every mode: a mode that disagrees is not timed, and the run fails.
    agreed = []
    for mode in usable:
        label = run_label(mode)
        if not args.agreement:
            agreed.append(mode)
            continue
        try:
            ok, agreement = check_agreement(args.agreement, names, mode)
        except Exception as error:  # torch.compile can fail on a machine (no compiler, an unsupported op)
            if mode == "eager":
                raise
            message = short_error(error)
            print(f"  {mode}: failed while checking agreement: {message}; {mode} figures are left out", flush=True)
            traceback.print_exc(limit=3)
            out["runs"][label].update(available=False, error=message)
            continue
        out["agreement"][label] = agreement
        if not ok:
            print(f"torch_reference: tapegrad and PyTorch ({label}) disagree; not timing", file=sys.stderr)
            return 1
        agreed.append(mode)

    if names and agreed:
        print("\n| config | torch | mode | threads | ms/step median (min-max) | tokens/s | first step s |\n"
              "|---|---|---|---|---|---|---|")
    for name in names:
        entry = {"runs": {}}
        for mode in agreed:
            label = run_label(mode)
            run = {"torch": torch.__version__, "mode": mode, "threads": {}}
            try:
                for t in threads:
                    r = bench_training(name, t, args.steps, args.agreement, mode)
                    run["threads"][str(t)] = r
                    print(f"| {name} | {torch.__version__} | {mode} | {t} | {r['ms_per_step_median']:.1f} "
                          f"({r['ms_per_step_min']:.1f}-{r['ms_per_step_max']:.1f}) | {r['tokens_per_s_median']:.0f} | "
                          f"{r['first_step_s']:.1f} |", flush=True)
                best = max(run["threads"], key=lambda k: run["threads"][k]["tokens_per_s_median"])
                run["best_threads"] = int(best)
                run["best_tokens_per_s"] = run["threads"][best]["tokens_per_s_median"]
                run["peak_memory_mib"], run["peak_memory_mib_whole_process"] = measure_peak_memory(
                    name, args.agreement, mode)
                print(f"  config {name} ({label}) peak memory (fresh process, 1 thread): "
                      f"{run['peak_memory_mib']:.1f} MiB in a step after warm-up, "
                      f"{run['peak_memory_mib_whole_process']:.1f} MiB over the process", flush=True)
            except Exception as error:
                if mode == "eager":
                    raise
                run = {"torch": torch.__version__, "mode": mode, "error": short_error(error)}
                print(f"  config {name} ({label}): failed: {run['error']}; left out", flush=True)
            entry["runs"][label] = run
        timed = {k: r for k, r in entry["runs"].items() if "best_tokens_per_s" in r}
        if timed:
            best = max(timed, key=lambda k: timed[k]["best_tokens_per_s"])
            entry["best"] = {"run": best, "torch": timed[best]["torch"], "mode": timed[best]["mode"],
                             "threads": timed[best]["best_threads"], "tokens_per_s": timed[best]["best_tokens_per_s"]}
        out["configs"][name] = entry

    if not args.no_decode:
        decode = {"torch": torch.__version__, "mode": "eager", "model": [65, 64, 4, 2, 256], "prompt_len": 8,
                  "new_tokens": 100, "repeats": args.repeats, "threads": {}}
        for t in threads:
            d = bench_decoding(t, args.repeats, args.agreement)
            decode["threads"][str(t)] = d
            print(f"  decode ({torch.__version__} eager), {t} thread(s): cache median {d['cache']['median_s'] * 1e3:.2f} ms "
                  f"(min {d['cache']['min_s'] * 1e3:.2f}, max {d['cache']['max_s'] * 1e3:.2f}); no cache median "
                  f"{d['no_cache']['median_s'] * 1e3:.1f} ms; cached tokens = uncached: {d['tokens_agree_with_no_cache']}")
        best = min(decode["threads"], key=lambda k: decode["threads"][k]["cache"]["median_s"])
        decode["best_threads"] = int(best)
        decode["best_cache_median_s"] = decode["threads"][best]["cache"]["median_s"]
        batched = {}
        for t in threads:
            for size, r in bench_batched_decoding(t, args.repeats).items():
                batched.setdefault(size, {"threads": {}})["threads"][str(t)] = r
                print(f"  batched decode S={size}, {t} thread(s): {r['tokens_per_s']:.0f} tokens/s "
                      f"(median {r['median_s'] * 1e3:.1f} ms)", flush=True)
        for entry in batched.values():
            entry["best_tokens_per_s"] = max(r["tokens_per_s"] for r in entry["threads"].values())
        decode["batched"] = batched
        out["decode"] = {"runs": {run_label("eager"): decode}}

    out["loadavg_after"] = open("/proc/loadavg").read().strip()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"  wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
