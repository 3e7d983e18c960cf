#!/usr/bin/env python3
"""Reads a tapegrad checkpoint (a safetensors file) with json, struct and numpy alone.

Usage: python3 scripts/read_checkpoint.py FILE            the metadata (one JSON line), then each
                                                          tensor's name and shape, one per line
       python3 scripts/read_checkpoint.py FILE TENSOR     TENSOR's values, one per line
"""
import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    """Returns ({name: numpy array}, {metadata key: string}) of a safetensors file of F32 tensors."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]  # u64 little-endian header length
        header = json.loads(f.read(n))         # JSON, padded with spaces
        data = f.read()                        # raw little-endian float32, row-major
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]      # byte offsets into the data section
        tensors[name] = np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"])
    return tensors, metadata


if __name__ == "__main__":
    tensors, metadata = read_safetensors(sys.argv[1])
    if len(sys.argv) > 2:
        for value in tensors[sys.argv[2]].ravel():
            print(repr(float(value)))
    else:
        print(json.dumps(metadata, ensure_ascii=False, sort_keys=True))
        for name, tensor in tensors.items():
            print(name, *tensor.shape)
