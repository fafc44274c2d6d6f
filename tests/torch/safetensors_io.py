"""Safetensors files written by hand (the format: an 8-byte little-endian
header length, the JSON header, the tensors' bytes), for the tests that
give meshlm Hugging Face files: check_ckpt_convert.py, check_quant_cache.py,
check_hf_dir.py. No dependency beyond numpy and torch.

  write_safetensors(path, tensors, metadata=None)
      tensors: name -> array, or (array, dtype) with dtype one of F32
      (the default), BF16, F16, I64, F8_E4M3 (every element 1.0); an array is a numpy array or a torch
      tensor.
"""
import json
import struct

import numpy as np
import torch


def _raw(t, dtype):
    t = torch.as_tensor(np.ascontiguousarray(t) if isinstance(t, np.ndarray) else t)
    if dtype == "BF16":
        return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
    if dtype == "F16":
        return t.to(torch.float16).contiguous().numpy().tobytes()
    if dtype == "I64":
        return t.to(torch.int64).contiguous().numpy().astype("<i8").tobytes()
    if dtype == "F8_E4M3":  # 1.0 (0x38) in every element: a dtype meshlm refuses
        return np.full(t.numel(), 0x38, np.uint8).tobytes()
    return t.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, value in tensors.items():
        t, dtype = value if isinstance(value, tuple) else (value, "F32")
        raw = _raw(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
