#!/usr/bin/python3
"""write_reference_values: PyTorch's outputs and gradients for a handful of ops and for both architectures (the
rotary decoder and gpt2) at a tiny size, written to tests/data/torch_reference.json, which the test suite checks
tapegrad against on every machine, with or without PyTorch (tests/nn/test_torch_reference.cpp).

Regenerate (after changing what is computed here, or to check a new torch):
    bench/.venv/bin/python bench/write_reference_values.py

Every input and weight is drawn here as float32 and stored, so the test starts from the very same numbers; PyTorch
then computes in float64, so that the stored values are the exact answers for those inputs and the test's tolerance
measures tapegrad's float32 error alone. An op's gradients are those of loss = sum(op(inputs) * R) for a stored R;
a model's are those of its mean next-token cross-entropy. The models are torch_models.py's, imported."""

import json
import os
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import Gpt2, RotaryDecoder, rms_norm, rope, rope_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "torch_reference.json")
# The sizes of both models: two blocks of two heads of 4, a d_ff that is not 4 d_model.
MODEL = dict(vocab=11, d_model=8, n_heads=2, n_blocks=2, max_len=6, d_ff=12)
BATCH, SEQ_LEN = 2, 6

generator = torch.Generator().manual_seed(28)


def normal(*shape, std=1.0, mean=0.0):
    """float32 draws from this script's generator."""
    return torch.randn(shape, generator=generator) * std + mean


def ids(n, vocab):
    return torch.randint(0, vocab, (n,), generator=generator)


def tensor_json(t):
    """{"shape", "values"}: float32 inputs exactly, float64 results to 17 digits (JSON numbers)."""
    t = t.detach()
    return {"shape": list(t.shape), "values": [float(v) for v in t.double().flatten()]}


def op_case(f, inputs, args=None):
    """inputs name -> float32 tensor; f(**inputs as float64 leaves) -> y. The output, and the gradients of
    sum(y * R) for a stored R of y's shape."""
    leaves = {name: x.double().requires_grad_(True) for name, x in inputs.items()}
    y = f(**leaves)
    R = normal(*y.shape)
    (y * R.double()).sum().backward()
    return {"args": args or {}, "inputs": {n: tensor_json(x) for n, x in inputs.items()}, "R": tensor_json(R),
            "output": tensor_json(y), "grads": {n: tensor_json(x.grad) for n, x in leaves.items()}}


def attention(q, k, v, n_heads):
    """Causal attention of (B, T, H*Dh) rows, heads as contiguous column chunks: torch's own kernel."""
    B, T, D = q.shape
    heads = lambda x: x.view(B, T, n_heads, D // n_heads).transpose(1, 2)
    y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
    return y.transpose(1, 2).reshape(B, T, D)


def rope_case():
    B, T, H, Dh, offset, max_len = 2, 3, 2, 4, 2, 5
    cos, sin = rope_table(max_len, Dh)
    f = lambda x: rope(x.view(B, T, H, Dh), cos[offset:offset + T].double(), sin[offset:offset + T].double()).reshape(B, T, H * Dh)
    return op_case(f, {"x": normal(B, T, H * Dh)}, {"n_heads": H, "offset": offset, "max_len": max_len})


def ops():
    targets = ids(4, 5)
    return {
        "softmax": op_case(lambda x: torch.softmax(x, dim=-1), {"x": normal(3, 5, std=2.0)}),
        "cross_entropy": op_case(lambda logits: F.cross_entropy(logits, targets), {"logits": normal(4, 5, std=2.0)},
                                 {"targets": targets.tolist()}),
        "rms_norm": op_case(lambda x, weight: rms_norm(x, weight), {"x": normal(3, 8), "weight": normal(8, mean=1.0)}),
        "layer_norm": op_case(lambda x, weight, bias: F.layer_norm(x, (8,), weight, bias, 1e-5),
                              {"x": normal(3, 8), "weight": normal(8, mean=1.0), "bias": normal(8, std=0.1)}),
        "rope": rope_case(),
        "attention": op_case(lambda q, k, v: attention(q, k, v, 2),
                             {"q": normal(2, 4, 8), "k": normal(2, 4, 8), "v": normal(2, 4, 8)}, {"n_heads": 2}),
        "swiglu": op_case(lambda a, b: F.silu(a) * b, {"a": normal(3, 6, std=2.0), "b": normal(3, 6)}),
        "gelu_tanh": op_case(lambda x: F.gelu(x, approximate="tanh"), {"x": normal(3, 6, std=2.0)}),
    }


def model_case(cls):
    """Random weights of a spread that gives every path signal: matrices N(0, 0.3^2), norm weights
    N(1, 0.1^2), biases N(0, 0.1^2)."""
    model = cls(**MODEL)
    weights = {}
    for name, p in model.spec_params().items():
        is_norm = name.startswith("norm.") or "_norm." in name
        if p.dim() == 2:
            weights[name] = normal(*p.shape, std=0.3)
        elif is_norm and name.endswith(".weight"):
            weights[name] = normal(*p.shape, mean=1.0, std=0.1)
        else:
            weights[name] = normal(*p.shape, std=0.1)
    model.load({name: w.numpy() for name, w in weights.items()})
    model.double()
    inputs, targets = ids(BATCH * SEQ_LEN, MODEL["vocab"]), ids(BATCH * SEQ_LEN, MODEL["vocab"])
    logits = model.forward(inputs.view(BATCH, SEQ_LEN))
    loss = F.cross_entropy(logits.reshape(-1, MODEL["vocab"]), targets)
    loss.backward()
    params = model.spec_params()
    return {"config": MODEL, "batch": BATCH, "seq_len": SEQ_LEN, "inputs": inputs.tolist(),
            "targets": targets.tolist(), "weights": {n: tensor_json(w) for n, w in weights.items()},
            "logits": tensor_json(logits), "loss": loss.item(),
            "grads": {n: tensor_json(params[n].grad) for n in weights}}


def main():
    torch.manual_seed(0)  # nothing below draws from it; the generator above fixes every number
    data = {
        "about": "PyTorch's values for tests/nn/test_torch_reference.cpp; regenerate with "
                 "bench/.venv/bin/python bench/write_reference_values.py",
        "torch_version": torch.__version__,
        "ops": ops(),
        "models": {"rotary": model_case(RotaryDecoder), "gpt2": model_case(Gpt2)},
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(data, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes, torch {torch.__version__})")


if __name__ == "__main__":
    main()
