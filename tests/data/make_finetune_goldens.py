# Writes tests/data/finetune_golden.json: the first 3 AdamW steps of the committed tiny Llama
# (tests/data/models/tiny_llama) on one fixed batch, in transformers + torch.optim.AdamW: the loss
# before each step and after the last, and each step's gradient norm. tests/nn/test_finetune_golden.cpp
# runs tapegrad's Llama and optim::AdamW on the same batch and compares.
# Run from the repository root: bench/.venv/bin/python tests/data/make_finetune_goldens.py
import json
import os
import re
from importlib.metadata import version
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaForCausalLM

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.logging.set_verbosity_error()

DATA = Path(__file__).resolve().parent
MODEL = DATA / "models" / "tiny_llama"
BATCH, SEQ, STEPS = 2, 16, 3
# tapegrad's trainer settings (examples/training/trainer.h): betas 0.9/0.95, weight decay 0.1 on
# matrices only (optim::AdamWOptions::decay_all_params false), torch's eps.
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.95), 1e-8, 0.1


def main():
    model = LlamaForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="eager")
    model.train()  # no dropout in this config: train mode changes nothing but is what fine-tuning uses
    vocab = model.config.vocab_size
    rng = np.random.default_rng(41)
    windows = rng.integers(0, vocab, size=(BATCH, SEQ + 1), dtype=np.int64)
    inputs, targets = torch.from_numpy(windows[:, :-1]), torch.from_numpy(windows[:, 1:])

    decayed = [p for p in model.parameters() if p.dim() >= 2]
    kept = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": WEIGHT_DECAY},
                                   {"params": kept, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)

    def loss_of_batch():
        logits = model(input_ids=inputs).logits  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))  # the mean over B*T

    losses, grad_norms = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = loss_of_batch()
        loss.backward()
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters()))
        losses.append(loss.item())
        grad_norms.append(norm.item())
        optimizer.step()
    with torch.no_grad():
        losses.append(loss_of_batch().item())

    golden = {
        "about": "tests/data/make_finetune_goldens.py: transformers' LlamaForCausalLM and torch.optim.AdamW",
        "versions": {name: version(name) for name in ("torch", "transformers")},
        "model": "tests/data/models/tiny_llama",
        "batch": BATCH, "seq": SEQ, "windows": windows.tolist(),
        "lr": LR, "beta1": BETAS[0], "beta2": BETAS[1], "eps": EPS, "weight_decay": WEIGHT_DECAY,
        "decayed_parameters": sum(p.numel() for p in decayed), "kept_parameters": sum(p.numel() for p in kept),
        "losses": losses, "grad_norms": grad_norms,
    }
    text = json.dumps(golden, indent=1)
    text = re.sub(r"\[\s+([-0-9.e, \n]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)  # rows on a line
    (DATA / "finetune_golden.json").write_text(text + "\n")
    print("losses", losses, "grad norms", grad_norms)


if __name__ == "__main__":
    main()
