"""Writes tests/data/quant_golden.json: float32 inputs (as their bits) and what the gguf package's
gguf.quants.quantize makes of them as F16, BF16 and Q8_0 (bytes in hex), for the suite's check that
tapegrad's quantizers (core/quant/block_format.h) give the same bits. The inputs cover rounding
ties, NaNs with payloads, infinities, signed zeros, subnormals, overflow, and Q8_0 blocks of zeros,
of exact halves, of huge values (the f16 scale overflows) and of tiny ones (it underflows).

Run with bench/.venv/bin/python tests/data/make_quant_golden.py (deterministic: fixed seed)."""
import importlib.metadata
import json
import os

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant_golden.json")
rng = np.random.default_rng(41)


def from_bits(bits: list[int]) -> np.ndarray:
    return np.array(bits, dtype=np.uint32).view(np.float32)


def scattered(n: int, low_exponent: int, high_exponent: int) -> np.ndarray:
    """Random signs and mantissas with exponents spread over [low, high] (powers of two)."""
    mantissas = rng.uniform(1.0, 2.0, size=n)
    exponents = rng.integers(low_exponent, high_exponent + 1, size=n)
    signs = rng.choice([-1.0, 1.0], size=n)
    return (signs * mantissas * np.exp2(exponents)).astype(np.float32)


SPECIAL_BITS = [
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # zeros, infinities
    0x7FC00000, 0x7F800001, 0xFFA12345, 0x7FBFFFFF, 0xFF802000,  # NaNs: quiet, signaling, payloads
    0x00000001, 0x807FFFFF, 0x00800000,  # subnormals, the smallest normal
    0x7F7FFFFF, 0xFF7F8000, 0x7F7F7FFF,  # the largest float, rounding to infinity or not (bf16)
    0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # bf16 ties to even, just above, just below
    0x3F801000, 0x3F803000, 0x3F801001,  # f16 ties to even and just above
]

F16_EDGES = [65504.0, 65519.0, 65520.0, 65536.0, 1e5, -65520.0,  # the largest half and overflow
             2.0**-14, 2.0**-14 * (1 - 2.0**-11), 2.0**-24, 2.0**-25, 2.0**-25 * 1.5, 2.0**-26, 3 * 2.0**-25,
             5.96e-8, 6.1e-5, -2.0**-24 * 2.5, 2.0**-24 * 3.5]


def scalar_inputs() -> np.ndarray:
    values = [from_bits(SPECIAL_BITS), np.array(F16_EDGES, dtype=np.float32),
              scattered(200, -30, 17), scattered(100, -130, 127), rng.standard_normal(100).astype(np.float32)]
    return np.concatenate(values)


def q8_0_inputs() -> np.ndarray:
    blocks = [rng.standard_normal((6, 32)).astype(np.float32) * np.float32(0.05),
              np.zeros((1, 32), dtype=np.float32),
              # amax 127: d = 1 exactly, so each x is its own scaled value; halves round away from zero
              np.array([[127.0, -127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 0.49999997, -0.0] +
                        [float(i) + 0.5 for i in range(20)]], dtype=np.float32),
              scattered(32, 20, 23).reshape(1, 32),  # d above 65504: the f16 scale is infinite
              scattered(32, -110, -100).reshape(1, 32),  # d below the halves: the f16 scale is zero
              scattered(64, -20, 10).reshape(2, 32)]
    return np.concatenate(blocks).reshape(-1)


def case(values: np.ndarray, qtype: Q) -> dict:
    quantized = gguf.quants.quantize(values, qtype)
    return {"input_bits": values.view(np.uint32).tolist(), "output_hex": quantized.tobytes().hex()}


def main() -> None:
    scalars = scalar_inputs()
    with np.errstate(over="ignore", invalid="ignore"):
        golden = {"numpy": np.__version__, "gguf": importlib.metadata.version("gguf"),
                  "f16": case(scalars, Q.F16), "bf16": case(scalars, Q.BF16), "q8_0": case(q8_0_inputs(), Q.Q8_0)}
    with open(OUT, "w") as f:
        json.dump(golden, f)
        f.write("\n")


if __name__ == "__main__":
    main()
