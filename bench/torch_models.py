"""torch_models: tapegrad's rotary decoder and gpt2 in PyTorch, with matrices stored (in, out) as in tapegrad's
checkpoints, and a reader of those checkpoints: the reference models of the benchmark harness (torch_reference.py)
and of the stored reference values (write_reference_values.py)."""

import json
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F


def read_safetensors(path):
    """name -> float32 numpy array, and the metadata; u64 LE header length, JSON header, raw data."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", f"{path}: {name} has dtype {info['dtype']}"
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"]).copy()
    return tensors, meta


def rope_table(max_len, head_dim, theta=10000.0):
    """cos, sin (max_len, Dh/2): angles m * theta^(-2i/Dh) in double, rounded to float once."""
    i = np.arange(head_dim // 2, dtype=np.float64)
    angles = np.arange(max_len, dtype=np.float64)[:, None] * np.power(theta, -2.0 * i / head_dim)[None, :]
    return (torch.from_numpy(np.cos(angles).astype(np.float32)), torch.from_numpy(np.sin(angles).astype(np.float32)))


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):
    """x (B, T, H, Dh) with positions given by the rows of cos, sin (T, Dh/2); interleaved pairs."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


class Block(torch.nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        P = lambda *shape: torch.nn.Parameter(torch.zeros(*shape))
        self.attn_norm, self.ffn_norm = P(d_model), P(d_model)
        self.wq, self.wk, self.wv, self.wo = P(d_model, d_model), P(d_model, d_model), P(d_model, d_model), P(d_model, d_model)
        self.w1, self.w3, self.w2 = P(d_model, d_ff), P(d_model, d_ff), P(d_ff, d_model)

    def ffn(self, x):
        h = rms_norm(x, self.ffn_norm)
        return (F.silu(h @ self.w1) * (h @ self.w3)) @ self.w2


class RotaryDecoder(torch.nn.Module):
    """tapegrad's rotary decoder; matrices are stored (in, out) and used as x @ W, as in tapegrad's checkpoints."""

    def __init__(self, vocab, d_model, n_heads, n_blocks, max_len, d_ff=None):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.vocab, self.d_model, self.n_heads, self.n_blocks, self.max_len = vocab, d_model, n_heads, n_blocks, max_len
        self.head_dim = d_model // n_heads
        self.embed = torch.nn.Parameter(torch.zeros(vocab, d_model))
        self.blocks = torch.nn.ModuleList(Block(d_model, d_ff) for _ in range(n_blocks))
        self.norm = torch.nn.Parameter(torch.zeros(d_model))
        self.head = torch.nn.Parameter(torch.zeros(d_model, vocab))
        self.head_bias = torch.nn.Parameter(torch.zeros(vocab))
        cos, sin = rope_table(max_len, self.head_dim)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.register_buffer("mask", torch.triu(torch.ones(max_len, max_len, dtype=torch.bool), diagonal=1))

    def spec_params(self):
        """Checkpoint tensor name -> parameter."""
        out = {"embed.weight": self.embed}
        for i, b in enumerate(self.blocks):
            out.update({f"blocks.{i}.attn_norm.weight": b.attn_norm, f"blocks.{i}.attn.wq.weight": b.wq,
                        f"blocks.{i}.attn.wk.weight": b.wk, f"blocks.{i}.attn.wv.weight": b.wv,
                        f"blocks.{i}.attn.wo.weight": b.wo, f"blocks.{i}.ffn_norm.weight": b.ffn_norm,
                        f"blocks.{i}.ffn.w1.weight": b.w1, f"blocks.{i}.ffn.w3.weight": b.w3,
                        f"blocks.{i}.ffn.w2.weight": b.w2})
        out.update({"norm.weight": self.norm, "head.weight": self.head, "head.bias": self.head_bias})
        return out

    def load(self, tensors):
        params = self.spec_params()
        assert set(params) == set(tensors), f"tensor names differ: {sorted(set(params) ^ set(tensors))}"
        with torch.no_grad():
            for name, value in tensors.items():
                assert tuple(params[name].shape) == value.shape, f"{name}: {tuple(params[name].shape)} vs {value.shape}"
                params[name].copy_(torch.from_numpy(value))

    def init_like_tapegrad(self, seed=0):
        """tapegrad's initialisation scheme (not its numbers): N(0, 0.02^2) matrices, residual outputs
        N(0, (0.02 / sqrt(2 n_blocks))^2), zero head bias, unit norm weights."""
        g = torch.Generator().manual_seed(seed)
        out_std = 0.02 / math.sqrt(2 * self.n_blocks)
        with torch.no_grad():
            for name, p in self.spec_params().items():
                if p.dim() < 2:
                    p.fill_(0.0 if name == "head.bias" else 1.0)
                else:
                    p.normal_(0.0, out_std if name.endswith(("wo.weight", "w2.weight")) else 0.02, generator=g)

    def forward(self, ids):
        """ids (B, T) -> logits (B, T, vocab)."""
        B, T = ids.shape
        H, Dh = self.n_heads, self.head_dim
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.blocks:
            h = rms_norm(x, b.attn_norm)
            q = rope((h @ b.wq).view(B, T, H, Dh), cos, sin).transpose(1, 2)  # (B, H, T, Dh)
            k = rope((h @ b.wk).view(B, T, H, Dh), cos, sin).transpose(1, 2)
            v = (h @ b.wv).view(B, T, H, Dh).transpose(1, 2)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(Dh)  # (B, H, T, T)
            scores = scores.masked_fill(self.mask[:T, :T], float("-inf"))
            att = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, self.d_model)
            x = x + att @ b.wo
            x = x + b.ffn(x)
        return rms_norm(x, self.norm) @ self.head + self.head_bias

    def loss(self, inputs, targets):
        logits = self.forward(inputs)
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))

    # ---- eager KV-cache decoding (one sequence: a batch of one) -------------------------------
    def make_cache(self, sequences=1):
        shape = (self.n_blocks, sequences, self.n_heads, self.max_len, self.head_dim)
        return {"k": torch.zeros(shape), "v": torch.zeros(shape), "pos": 0}

    def run_cached(self, tokens, cache):
        """tokens (T,) at cache positions pos..pos+T-1 -> logits (T, vocab); writes K, V rows."""
        return self.run_cached_batch(tokens[None], cache)[0]

    @torch.inference_mode()
    def generate_cached(self, prompt, max_new):
        """Greedy: prefill the prompt in one pass, then one cached step per new token."""
        cache = self.make_cache()
        logits = self.run_cached(prompt, cache)[-1]
        out = []
        for _ in range(max_new):
            token = int(torch.argmax(logits))  # the first maximum: the lowest id wins ties
            out.append(token)
            if len(out) == max_new:
                break
            logits = self.run_cached(torch.tensor([token]), cache)[0]
        return out

    # ---- eager KV-cache decoding of S sequences (prompts of one length) -----------------------
    @torch.inference_mode()
    def run_cached_batch(self, tokens, cache):
        """tokens (S, T) at positions pos..pos+T-1 of every sequence -> logits (S, T, vocab)."""
        S, T = tokens.shape
        H, Dh = self.n_heads, self.head_dim
        pos = cache["pos"]
        end = pos + T
        cos, sin = self.cos[pos:end], self.sin[pos:end]
        x = F.embedding(tokens, self.embed)  # (S, T, d)
        for i, b in enumerate(self.blocks):
            h = rms_norm(x, b.attn_norm)
            q = rope((h @ b.wq).view(S, T, H, Dh), cos, sin).transpose(1, 2)  # (S, H, T, Dh)
            cache["k"][i, :, :, pos:end] = rope((h @ b.wk).view(S, T, H, Dh), cos, sin).transpose(1, 2)
            cache["v"][i, :, :, pos:end] = (h @ b.wv).view(S, T, H, Dh).transpose(1, 2)
            k, v = cache["k"][i, :, :, :end], cache["v"][i, :, :, :end]  # rows 0..end-1 only
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(Dh)  # (S, H, T, end)
            if T > 1:
                scores = scores.masked_fill(self.mask[pos:end, :end], float("-inf"))
            att = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(S, T, self.d_model)
            x = x + att @ b.wo
            x = x + b.ffn(x)
        cache["pos"] = end
        return rms_norm(x, self.norm) @ self.head + self.head_bias

    @torch.inference_mode()
    def generate_cached_batch(self, prompts, max_new):
        """Greedy for S prompts (S, T) at once: one prefill pass, then one step of S tokens per new token."""
        cache = self.make_cache(prompts.shape[0])
        tokens = torch.argmax(self.run_cached_batch(prompts, cache)[:, -1], dim=-1)
        out = [tokens]
        for _ in range(max_new - 1):
            tokens = torch.argmax(self.run_cached_batch(tokens[:, None], cache)[:, 0], dim=-1)
            out.append(tokens)
        return torch.stack(out, dim=1)

    @torch.inference_mode()
    def generate_uncached(self, prompt, max_new):
        """Greedy with the full forward over the whole text for every new token."""
        text = prompt.tolist()
        for _ in range(max_new):
            logits = self.forward(torch.tensor([text]))[0, -1]
            text.append(int(torch.argmax(logits)))
        return text[len(prompt):]


class Gpt2(torch.nn.Module):
    """tapegrad's gpt2: pre-LN GPT-2 with learned positions, gelu_tanh MLP and a tied head; matrices
    stored (in, out) as in tapegrad's checkpoints."""

    def __init__(self, vocab, d_model, n_heads, n_blocks, max_len, d_ff=None):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.n_heads, self.n_blocks = n_heads, n_blocks
        self.params = torch.nn.ParameterDict()
        self.names = {}

        def param(name, *shape, fill=0.0):
            p = torch.nn.Parameter(torch.full(shape, fill))
            self.params[name.replace(".", "_")] = p
            self.names[name] = p

        param("embed.weight", vocab, d_model)
        param("pos.weight", max_len, d_model)
        for i in range(n_blocks):
            b = f"blocks.{i}."
            param(b + "attn_norm.weight", d_model, fill=1.0)
            param(b + "attn_norm.bias", d_model)
            for w in ("wq", "wk", "wv", "wo"):
                param(b + f"attn.{w}.weight", d_model, d_model)
                param(b + f"attn.{w}.bias", d_model)
            param(b + "ffn_norm.weight", d_model, fill=1.0)
            param(b + "ffn_norm.bias", d_model)
            param(b + "ffn.w1.weight", d_model, d_ff)
            param(b + "ffn.w1.bias", d_ff)
            param(b + "ffn.w2.weight", d_ff, d_model)
            param(b + "ffn.w2.bias", d_model)
        param("norm.weight", d_model, fill=1.0)
        param("norm.bias", d_model)
        self.register_buffer("mask", torch.triu(torch.ones(max_len, max_len, dtype=torch.bool), diagonal=1))

    def spec_params(self):
        return self.names

    load = RotaryDecoder.load

    def init_like_tapegrad(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        out_std = 0.02 / math.sqrt(2 * self.n_blocks)
        with torch.no_grad():
            for name, p in self.names.items():
                if p.dim() >= 2:
                    p.normal_(0.0, out_std if name.endswith(("wo.weight", "w2.weight")) else 0.02, generator=g)

    def forward(self, ids):
        """ids (B, T) -> logits (B, T, vocab)."""
        P = self.names
        B, T = ids.shape
        x = P["embed.weight"][ids] + P["pos.weight"][:T]
        D = x.shape[-1]
        H, Dh = self.n_heads, D // self.n_heads
        for i in range(self.n_blocks):
            b = f"blocks.{i}."
            lin = lambda t, w: t @ P[b + w + ".weight"] + P[b + w + ".bias"]
            h = F.layer_norm(x, (D,), P[b + "attn_norm.weight"], P[b + "attn_norm.bias"], 1e-5)
            q, k, v = [lin(h, "attn." + w).view(B, T, H, Dh).transpose(1, 2) for w in ("wq", "wk", "wv")]
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
            scores = scores.masked_fill(self.mask[:T, :T], float("-inf"))
            att = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, D)
            x = x + lin(att, "attn.wo")
            h = F.layer_norm(x, (D,), P[b + "ffn_norm.weight"], P[b + "ffn_norm.bias"], 1e-5)
            x = x + lin(F.gelu(lin(h, "ffn.w1"), approximate="tanh"), "ffn.w2")
        x = F.layer_norm(x, (D,), P["norm.weight"], P["norm.bias"], 1e-5)
        return x @ P["embed.weight"].t()

    def loss(self, inputs, targets):
        logits = self.forward(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
