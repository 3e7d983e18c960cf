"""compare_report: the table of bench/compare.sh. Merges its per-config runs of bench_train (train_<config>.json)
and of torch_reference.py (torch_<interpreter>_<config>.json, torch_<interpreter>_decode.json, one interpreter
each: Debian's torch, a pip torch) into train_cpu.json and torch_cpu.json, and writes compare.md: per config,
tapegrad against PyTorch's best (the fastest of every torch version, mode and thread count, named) and peak
memory against PyTorch's lowest; decoding one sequence, and S sequences as one batch against PyTorch's best batched
decoding. Standard library only, so any python3 runs it.
  python3 bench/compare_report.py RESULTS_DIR WORK_DIR "LOAD_START" "LOAD_END" CONFIG..."""

import glob
import json
import os
import sys

# Targets as ratios tapegrad / PyTorch's best in the same run: tokens/s per config; the (c) model FLOP/s as a
# fraction of the FMA peak; peak memory on (d).
TOKENS_TARGET = {"a": 2.0, "b": 2.0, "c": 2.0, "d": 3.0, "a-gpt2": 2.0}
FMA_TARGET = ("c", 0.70)
MEMORY_TARGET = ("d", 0.5)
# Decoding: one sequence's time per token; S sequences decoded as one batch, tokens/s on 2 threads, absolute and as
# a ratio to PyTorch's best batched decoding of S sequences (any torch and thread count).
TOKEN_US_TARGET = 6.0
BATCHED_TARGET = {"64": (250_000, 5.0)}


def load(path):
    with open(path) as f:
        return json.load(f)


def dump(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def merge_train(parts):
    """One train_cpu.json from one bench_train run per config: each peak (sgemm, FMA) is the best of every
    measurement of every run, and each config's fractions are taken against it."""
    train = dict(parts[0])
    train["configs"] = {}
    for runs_key, peak_key in (("sgemm_runs", "sgemm_peak_gflops"), ("fma_runs", "fma_peak_gflops")):
        train[runs_key], train[peak_key] = {}, {}
        for part in parts:
            for t, runs in part.get(runs_key, {}).items():
                train[runs_key].setdefault(t, []).extend(runs)
        for t, runs in train[runs_key].items():
            train[peak_key][t] = max(r["best_gflops"] for r in runs)
    for part in parts:
        for name, entry in part["configs"].items():
            for t, r in entry["threads"].items():
                r["fraction_of_peak"] = r["model_gflops"] / train["sgemm_peak_gflops"][t]
                if t in train["fma_peak_gflops"]:
                    r["fraction_of_fma_peak"] = r["model_gflops"] / train["fma_peak_gflops"][t]
            train["configs"][name] = entry
    train["note"] = "merged by compare.sh from one bench_train run per config, each followed by PyTorch's"
    return train


def merge_torch(parts):
    """One torch_cpu.json from every torch_reference.py run: runs, agreement, configs and decoding keyed by
    "<torch version> <mode>"; each config's "best" is the fastest run."""
    torch = {"machine": parts[0]["machine"], "date": parts[0]["date"], "interpreters": {}, "runs": {},
             "agreement": {}, "configs": {}, "decode": {"runs": {}}}
    for key in ("threads_note", "modes_are", "peak_memory_is", "warmup_steps", "steps"):
        torch[key] = parts[0].get(key)
    for part in parts:
        torch["interpreters"][part["torch"]] = {"python": part["python"], "simd_level": part["machine"]["simd_level"],
                                                "blas": part["machine"]["blas"], "blas_core": part["machine"]["blas_core"]}
        torch["runs"].update(part["runs"])
        for label, per_config in part.get("agreement", {}).items():
            torch["agreement"].setdefault(label, {}).update(per_config)
        for name, entry in part.get("configs", {}).items():
            torch["configs"].setdefault(name, {"runs": {}})["runs"].update(entry["runs"])
        torch["decode"]["runs"].update(part.get("decode", {}).get("runs", {}))
    for entry in torch["configs"].values():
        timed = {k: r for k, r in entry["runs"].items() if "best_tokens_per_s" in r}
        if timed:
            best = max(timed, key=lambda k: timed[k]["best_tokens_per_s"])
            entry["best"] = {"run": best, "torch": timed[best]["torch"], "mode": timed[best]["mode"],
                             "threads": timed[best]["best_threads"], "tokens_per_s": timed[best]["best_tokens_per_s"]}
    return torch


def best_threads(threads, key="tokens_per_s_median"):
    t = max(threads, key=lambda k: threads[k][key])
    return t, threads[t]


def met(ok):
    return "yes" if ok else "NO"


def main(argv):
    results, work, load_start, load_end, configs = argv[1], argv[2], argv[3], argv[4], argv[5:]
    train = merge_train([load(os.path.join(work, f"train_{c}.json")) for c in configs])
    dump(os.path.join(results, "train_cpu.json"), train)
    torch_parts = [load(p) for p in sorted(glob.glob(os.path.join(work, "torch_*.json")))]
    torch = merge_torch(torch_parts) if torch_parts else None
    if torch:
        dump(os.path.join(results, "torch_cpu.json"), torch)
    kv = load(os.path.join(results, "kv_cache_cpu.json"))

    rows = []
    for name in configs:
        t_threads, t = best_threads(train["configs"][name]["threads"])
        target = TOKENS_TARGET.get(name)
        tg = f"{t['tokens_per_s_median']:,.0f} ({t_threads} thr)"
        best = torch and torch["configs"].get(name, {}).get("best")
        if best:
            ratio = t["tokens_per_s_median"] / best["tokens_per_s"]
            rows.append((f"training ({name}) tokens/s", tg,
                         f"{best['tokens_per_s']:,.0f} (torch {best['run']}, {best['threads']} thr)", f"{ratio:.2f}",
                         f">= {target}" if target else "", met(ratio >= target) if target else ""))
        else:
            rows.append((f"training ({name}) tokens/s", tg, "n/a", "n/a", f">= {target}" if target else "", "n/a"))
    for name in configs:  # against PyTorch's lowest peak memory
        mine = train["configs"][name]["peak_memory_mib"]
        runs = torch["configs"].get(name, {}).get("runs", {}) if torch else {}
        measured = {k: r["peak_memory_mib"] for k, r in runs.items() if "peak_memory_mib" in r}
        target = MEMORY_TARGET[1] if name == MEMORY_TARGET[0] else None
        if measured:
            lowest = min(measured, key=measured.get)
            ratio = mine / measured[lowest]
            rows.append((f"training ({name}) peak memory", f"{mine:.0f} MiB", f"{measured[lowest]:.0f} MiB (torch {lowest})",
                         f"{ratio:.2f}", f"<= {target}" if target else "", met(ratio <= target) if target else ""))
        else:
            rows.append((f"training ({name}) peak memory", f"{mine:.0f} MiB", "n/a", "n/a",
                         f"<= {target}" if target else "", "n/a"))
    fma_config, fma_target = FMA_TARGET
    if fma_config in train["configs"]:
        thr = train["configs"][fma_config]["threads"]
        for peak_key, fraction_key, label, target in (
                ("fma_peak_gflops", "fraction_of_fma_peak", "FMA peak", fma_target),
                ("sgemm_peak_gflops", "fraction_of_peak", "sgemm peak", None)):
            if not train.get(peak_key):
                continue
            t_best, r = best_threads(thr, fraction_key)
            f = r[fraction_key]
            rows.append((f"training ({fma_config}) model FLOP/s / {label}",
                         f"{r['model_gflops']:.1f} / {train[peak_key][t_best]:.1f} GFLOP/s = {100 * f:.0f}% ({t_best} thr)",
                         "", "", f">= {100 * target:.0f}%" if target else "", met(f >= target) if target else ""))
    cache_ms = kv["cache"]["median_s"] * 1e3
    decode_runs = torch["decode"]["runs"] if torch else {}
    if decode_runs:
        fastest = min(decode_runs, key=lambda k: decode_runs[k]["best_cache_median_s"])
        d = decode_runs[fastest]
        p_ms = d["best_cache_median_s"] * 1e3
        rows.append(("cached decoding, 100 tokens: time", f"{cache_ms:.2f} ms (1 thr)",
                     f"{p_ms:.1f} ms (torch {fastest}, {d['best_threads']} thr)",
                     f"{cache_ms / p_ms:.4f} (PyTorch takes {p_ms / cache_ms:.1f}x as long)", "<= 0.05 (20x faster)",
                     met(p_ms / cache_ms >= 20)))
    else:
        rows.append(("cached decoding, 100 tokens: time", f"{cache_ms:.2f} ms (1 thr)", "n/a", "n/a",
                     "<= 0.05 (20x faster)", "n/a"))
    rows.append(("cached decoding, 100 tokens: absolute", f"{cache_ms:.2f} ms", "", "", "<= 2 ms", met(cache_ms <= 2)))
    token_us = cache_ms * 1e3 / kv["new_tokens"]
    rows.append(("cached decoding, one sequence: time per token", f"{token_us:.1f} us (1 thr)", "", "",
                 f"<= {TOKEN_US_TARGET:g} us", met(token_us <= TOKEN_US_TARGET)))
    for size, per in sorted(kv.get("batched", {}).items(), key=lambda item: int(item[0])):
        mine = per["threads"].get("2")
        if not mine:
            continue
        tokens = mine["tokens_per_s"]
        absolute, ratio_target = BATCHED_TARGET.get(size, (None, None))
        peers = {k: r["batched"][size] for k, r in decode_runs.items() if size in r.get("batched", {})}
        if peers:
            fastest = max(peers, key=lambda k: peers[k]["best_tokens_per_s"])
            best = peers[fastest]
            peer_threads = max(best["threads"], key=lambda t: best["threads"][t]["tokens_per_s"])
            ratio = tokens / best["best_tokens_per_s"]
            rows.append((f"batched decoding, S = {size}: tokens/s", f"{tokens:,.0f} (2 thr)",
                         f"{best['best_tokens_per_s']:,.0f} (torch {fastest}, {peer_threads} thr)", f"{ratio:.2f}",
                         f">= {ratio_target:g}" if ratio_target else "", met(ratio >= ratio_target) if ratio_target else ""))
        if absolute:
            rows.append((f"batched decoding, S = {size}: absolute", f"{tokens:,.0f} tokens/s (2 thr)", "", "",
                         f">= {absolute:,}", met(tokens >= absolute)))

    m = train["machine"]
    lines = [f"# tapegrad vs PyTorch, {train['date']}", "",
             f"Machine: {m['cpu']} (family {m['cpu_family']} model {m['cpu_model_number']}, {m['nproc']} cores); "
             f"tapegrad SIMD level {m['simd_level']}, OpenBLAS core {m['openblas_core']}, commit {train['commit']}; "
             f"load average {load_start} at the start, {load_end} at the end.", ""]
    if torch:
        lines.append("PyTorch runs (every figure below names its torch version and mode):")
        for label, run in torch["runs"].items():
            interp = torch["interpreters"][run["torch"]]
            state = "timed" if run["available"] else f"not run: {run.get('error', '')}"
            lines.append(f"- torch {label}: Python {run['python']}; torch's kernels {interp['simd_level']}, BLAS "
                         f"{os.path.basename(interp['blas'])} (core {interp['blas_core']}); {state}")
        lines.append("")
    else:
        lines += ["PyTorch: not run (no torch could be installed).", ""]
    lines += ["Medians of the timed steps (decoding: of the repeats). Training: each side's best of its thread counts; "
              "PyTorch's best is the fastest of every torch version and mode. Peak memory: a fresh process at 1 thread, "
              "against PyTorch's lowest. tapegrad decodes on 1 thread. Same weights and batches on both sides, checked "
              "to agree before timing in every mode.", ""]
    header = ("measure", "tapegrad", "PyTorch's best", "tapegrad / PyTorch", "target", "met")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]

    if torch and torch["runs"]:
        labels = [k for k, r in torch["runs"].items() if r["available"]]
        lines += ["", "Every PyTorch run: tokens/s at its best thread count (threads), peak MiB; under torch.compile "
                      "also the longest compilation of the config (the agreement check's first step, or a thread "
                      "count's first step less a median one; a graph already in inductor's on-disk cache compiles "
                      "faster).", "",
                  "| config | tapegrad | " + " | ".join(f"torch {k}" for k in labels) + " |",
                  "|" + "---|" * (len(labels) + 2)]
        for name in configs:
            t_threads, t = best_threads(train["configs"][name]["threads"])
            cells = [f"{t['tokens_per_s_median']:,.0f} ({t_threads}), {train['configs'][name]['peak_memory_mib']:.0f} MiB"]
            for k in labels:
                r = torch["configs"].get(name, {}).get("runs", {}).get(k)
                if not r:
                    cells.append("")
                elif "error" in r:
                    cells.append(f"failed: {r['error'][:80]}")
                else:
                    cell = f"{r['best_tokens_per_s']:,.0f} ({r['best_threads']}), {r['peak_memory_mib']:.0f} MiB"
                    if r["mode"] == "compile":  # the longest compilation: later ones may hit inductor's cache
                        agreed = torch["agreement"].get(k, {}).get(name, {})
                        longest = max([x.get("compile_s", 0) for x in r["threads"].values()] +
                                      [agreed.get("first_step_s", 0)])
                        cell += f", compile {longest:.0f} s"
                    cells.append(cell)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        agreement = []
        for label, per in torch["agreement"].items():
            losses = "; ".join(f"({k}) {v['loss_tapegrad']:.6f} vs {v['loss_torch']:.6f}, grad norm rel "
                               f"{abs(v['grad_norm_torch'] - v['grad_norm_tapegrad']) / v['grad_norm_tapegrad']:.0e}"
                               for k, v in sorted(per.items()) if k != "decode")
            if "decode" in per:
                d = per["decode"]
                losses += (f"; decoding: prefill logits max |diff| {d['prefill_logits_max_abs_diff']:.1e}, "
                           f"{d['steps_agreeing']}/{d['steps']} greedy steps agree")
            agreement.append(f"- torch {label}: {losses}")
        if agreement:
            lines += ["", "Agreement (tapegrad vs PyTorch, loss tolerance 1e-4):"] + agreement
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(results, "compare.md"), "w") as f:
        f.write(text)
    print(f"wrote {os.path.join(results, 'compare.md')}, train_cpu.json" + (", torch_cpu.json" if torch else ""))


if __name__ == "__main__":
    main(sys.argv)
