"""Writes tests/data/gguf_types/: one small tensor of every GGUF tensor type tapegrad reads and a
metadata value of every GGUF value type, as tensor_types.gguf (v3, alignment 32) and
tensor_types_v2.gguf (version 2, alignment 64), and tensor_types.json with what the gguf package
reads back: per tensor its type, PyTorch shape, the FNV-1a 64 hash of gguf.quants.dequantize's
float32 little-endian bytes and its first 8 values' bits; per metadata key its type and value.

Run with bench/.venv/bin/python tests/data/make_gguf_types.py (deterministic: fixed seed)."""
import json
import os

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf_types")
rng = np.random.default_rng(40)


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def random_k_blocks(n_blocks: int, block_bytes: int, scale_offsets: list[int]) -> np.ndarray:
    """Random bytes with finite f16 scales at the given byte offsets of each block (the K types,
    which the gguf package cannot quantize)."""
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for offset in scale_offsets:
        scales = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def special_floats(dtype) -> np.ndarray:
    """Infinities, signed zeros, a quiet NaN, subnormals and the largest finite values."""
    info = np.finfo(dtype) if dtype != "bf16" else None
    values = [np.inf, -np.inf, 0.0, -0.0, np.nan]
    if info is not None:
        values += [float(info.smallest_subnormal), -float(info.max), float(info.max)]
    return np.array(values, dtype=np.float32)


def tensors() -> list[tuple[str, Q, np.ndarray]]:
    """(name, type, stored array) with the stored array as add_tensor takes it."""
    out = []
    f32 = rng.standard_normal((2, 1, 3, 8)).astype(np.float32)
    f32.reshape(-1)[:8] = special_floats(np.float32)
    out.append(("t.f32", Q.F32, f32))
    f16 = rng.standard_normal((2, 16)).astype(np.float16)
    f16.reshape(-1)[:8] = special_floats(np.float16).astype(np.float16)
    out.append(("t.f16", Q.F16, f16))
    bf16_source = rng.standard_normal((2, 16)).astype(np.float32)
    bf16_source.reshape(-1)[:5] = special_floats("bf16")
    bf16_source.reshape(-1)[5] = np.float32(1e-40)  # a subnormal
    out.append(("t.bf16", Q.BF16, gguf.quants.quantize(bf16_source, Q.BF16)))
    out.append(("t.q8_0", Q.Q8_0, gguf.quants.quantize(rng.standard_normal((2, 2, 64)).astype(np.float32), Q.Q8_0)))
    out.append(("t.q4_0", Q.Q4_0, gguf.quants.quantize(rng.standard_normal((3, 64)).astype(np.float32), Q.Q4_0)))
    out.append(("t.q4_1", Q.Q4_1, gguf.quants.quantize(rng.standard_normal((3, 32)).astype(np.float32), Q.Q4_1)))
    # Q4_K: f16 d at byte 0, f16 dmin at byte 2. Q6_K: f16 d at byte 208.
    out.append(("t.q4_K", Q.Q4_K, random_k_blocks(3, 144, [0, 2]).reshape(3, 144)))
    out.append(("t.q6_K", Q.Q6_K, random_k_blocks(2, 210, [208]).reshape(2, 210)))
    return out


# key -> (type, element type or None, value as written)
METADATA = {
    "test.u8": (V.UINT8, None, 200),
    "test.i8": (V.INT8, None, -100),
    "test.u16": (V.UINT16, None, 60000),
    "test.i16": (V.INT16, None, -30000),
    "test.u32": (V.UINT32, None, 4000000000),
    "test.i32": (V.INT32, None, -2000000000),
    "test.f32": (V.FLOAT32, None, float(np.float32(0.1))),
    "test.u64": (V.UINT64, None, 2**63 - 1),
    "test.i64": (V.INT64, None, -(2**62)),
    "test.f64": (V.FLOAT64, None, 0.1),
    "test.true": (V.BOOL, None, True),
    "test.false": (V.BOOL, None, False),
    "test.string": (V.STRING, None, "h\u00e9llo \u2713 \U0001F999"),
    "test.empty_string": (V.STRING, None, ""),
    "test.ints": (V.ARRAY, V.INT32, [1, -2, 3, 2147483647]),
    "test.u8s": (V.ARRAY, V.UINT8, [0, 1, 255]),
    "test.floats": (V.ARRAY, V.FLOAT32, [float(np.float32(x)) for x in (0.5, -1.25, 3.1)]),
    "test.bools": (V.ARRAY, V.BOOL, [True, False, True]),
    "test.strings": (V.ARRAY, V.STRING, ["\u0120t", "", "merges \u010a"]),
    "test.nested": (V.ARRAY, V.ARRAY, [[1, 2], [3], [4, 5, 6]]),
}

TYPE_NAMES = {V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32", V.INT32: "i32",
              V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "string", V.ARRAY: "array", V.UINT64: "u64",
              V.INT64: "i64", V.FLOAT64: "f64"}


def write(path: str, alignment: int | None, version: int) -> None:
    writer = gguf.GGUFWriter(path, arch="test")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, (vtype, sub_type, value) in METADATA.items():
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, qtype, array in tensors_list:
        writer.add_tensor(name, array, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if version != gguf.GGUF_VERSION:  # v2 and v3 share the layout; v3 only allowed big-endian files
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(version.to_bytes(4, "little"))


def expected() -> dict:
    reader = gguf.GGUFReader(os.path.join(HERE, "tensor_types.gguf"))
    out_tensors = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype("<f4")
        shape = [int(n) for n in reversed(t.shape)]  # ggml's ne reversed: PyTorch order
        assert values.size == int(np.prod(shape))
        out_tensors[t.name] = {
            "type": t.tensor_type.name.lower() if not t.tensor_type.name.endswith("_K") else t.tensor_type.name[:-2].lower() + "_K",
            "shape": shape,
            "fnv1a64": f"{fnv1a64(values.tobytes()):016x}",
            "first_bits": [int(b) for b in values.reshape(-1)[:8].view("<u4")],
        }
    metadata = {}
    for key, (vtype, sub_type, value) in METADATA.items():
        metadata[key] = {"type": TYPE_NAMES[vtype], "value": value}
        if sub_type is not None:
            metadata[key]["element_type"] = TYPE_NAMES[sub_type]
    metadata["general.architecture"] = {"type": "string", "value": "test"}
    return {"tensors": out_tensors, "metadata": metadata,
            "files": {"tensor_types.gguf": {"version": 3, "alignment": 32},
                      "tensor_types_v2.gguf": {"version": 2, "alignment": 64}}}


if __name__ == "__main__":
    os.makedirs(HERE, exist_ok=True)
    tensors_list = tensors()
    write(os.path.join(HERE, "tensor_types.gguf"), None, 3)
    write(os.path.join(HERE, "tensor_types_v2.gguf"), 64, 2)
    with open(os.path.join(HERE, "tensor_types.json"), "w") as f:
        json.dump(expected(), f, indent=1, ensure_ascii=False)
        f.write("\n")
