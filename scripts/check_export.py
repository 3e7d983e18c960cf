"""Checks tapegrad's exports with the reference readers (the suite's tests/nn/test_export.cpp runs
it where bench/.venv exists): transformers loads the Hugging Face folder (from_pretrained) to
tapegrad's logits within 1e-5 and its tokenizer to tapegrad's ids, and the gguf package reads the
GGUF file (metadata, tokenizer, chat template, every tensor dequantized to finite values).

Usage: python scripts/check_export.py HF_DIR GGUF_FILE EXPECTED_JSON
EXPECTED_JSON: {"text", "ids", "logits" (T * vocab floats), "chat_template", "gguf_arch" (default "llama")}. Exit status 0 when all hold."""
import json
import sys

import numpy as np


def check_hf(folder: str, expected: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = expected["ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
    want = np.array(expected["logits"], dtype=np.float32).reshape(logits.shape)
    worst = float(np.abs(logits - want).max())
    assert worst <= 1e-5, f"transformers' logits differ from tapegrad's by {worst}"
    print(f"transformers: logits within 1e-5 (worst {worst:.3g}, shape {list(logits.shape)})")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    got = tokenizer(expected["text"], add_special_tokens=True)["input_ids"]
    assert got == ids, f"transformers' tokenizer gives {got}, tapegrad {ids}"
    assert tokenizer.chat_template == expected["chat_template"], "the chat template differs"
    print("transformers: tokenizer ids and chat template equal")


def check_gguf(path: str, expected: dict) -> None:
    import gguf

    reader = gguf.GGUFReader(path)
    fields = reader.fields
    arch = expected.get("gguf_arch", "llama")
    assert fields["general.architecture"].contents() == arch, f"general.architecture is not {arch}"
    assert fields["tokenizer.chat_template"].contents() == expected["chat_template"], "the chat template differs"
    tokens = fields["tokenizer.ggml.tokens"].contents()
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(values).all(), f"{tensor.name} holds non-finite values"
    print(f"gguf: read {len(reader.tensors)} tensors, {len(fields)} fields, {len(tokens)} tokens")


def main() -> None:
    folder, gguf_path, expected_path = sys.argv[1:4]
    with open(expected_path) as f:
        expected = json.load(f)
    check_hf(folder, expected)
    check_gguf(gguf_path, expected)


if __name__ == "__main__":
    main()
