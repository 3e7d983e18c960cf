"""Loads a LoRA adapter folder written by tapegrad (nn/lora.h) with the peft package onto its
Hugging Face base and compares the logits with tapegrad's (tests/nn/test_lora.cpp runs it).

usage: check_peft_adapter.py BASE_FOLDER ADAPTER_FOLDER LOGITS.safetensors
LOGITS.safetensors holds tapegrad's "logits" (T, V) of the ids in its metadata "ids" ("1,5,7").
Prints the largest absolute difference; exits 1 when it is above 1e-5 or peft changed nothing.
"""
import sys

import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM


def main() -> int:
    base_folder, adapter_folder, logits_path = sys.argv[1:4]
    torch.set_num_threads(1)
    with safe_open(logits_path, framework="pt") as f:
        ids = [int(i) for i in f.metadata()["ids"].split(",")]
        expected = f.get_tensor("logits").double()
    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    base.eval()
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        base_logits = base(input_ids).logits[0].double()
        model = PeftModel.from_pretrained(base, adapter_folder)
        model.eval()
        logits = model(input_ids).logits[0].double()
    adapter_effect = (logits - base_logits).abs().max().item()
    diff = (logits - expected).abs().max().item()
    print(f"max |peft - tapegrad| {diff:.3g}; the adapter moves the logits by up to {adapter_effect:.3g}")
    return 0 if diff <= 1e-5 and adapter_effect > 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
