#!/usr/bin/python3
"""Writes a GPT-2-shaped safetensors file with random weights, in the layout of
a Hugging Face GPT-2 checkpoint (model.safetensors of "gpt2"):

    wte.weight                (V, C)        token embedding, V = vocab_size (unpadded)
    wpe.weight                (maxT, C)     position embedding
    h.N.ln_1.weight/.bias     (C,)
    h.N.attn.bias             (1, 1, maxT, maxT)  causal mask, as older HF files hold
    h.N.attn.c_attn.weight    (C, 3C)       Conv1D: stored (in, out)
    h.N.attn.c_attn.bias      (3C,)
    h.N.attn.c_proj.weight    (C, C)
    h.N.attn.c_proj.bias      (C,)
    h.N.ln_2.weight/.bias     (C,)
    h.N.mlp.c_fc.weight       (C, 4C)
    h.N.mlp.c_fc.bias         (4C,)
    h.N.mlp.c_proj.weight     (4C, C)
    h.N.mlp.c_proj.bias       (C,)
    ln_f.weight/.bias         (C,)

All F32. Matrices are N(0, 0.02), biases small, LayerNorm gains near 1. The
file is streamed (header first, then each tensor generated and written in
pieces of 16 MiB), so this script's memory stays small whatever the model.

safetensors: 8-byte little-endian header length, the JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end)}} (offsets relative to
the end of the header, padded here with spaces to a multiple of 8), then the
data, little-endian.

    /usr/bin/python3 tests/bench/make_gpt2_safetensors.py --n_layer 6 --n_embd 1024 \
        --n_head 16 --vocab_size 50257 --max_seq_len 1024 --out /tmp/gpt2-6x1024.safetensors
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def tensor_list(n_layer, n_embd, vocab_size, max_seq_len):
    """(name, shape, kind) in file order; kind picks how the values are drawn."""
    C, T = n_embd, max_seq_len
    out = [("wte.weight", (vocab_size, C), "matrix"), ("wpe.weight", (T, C), "matrix")]
    for i in range(n_layer):
        h = f"h.{i}."
        out += [
            (h + "ln_1.weight", (C,), "gain"),
            (h + "ln_1.bias", (C,), "bias"),
            (h + "attn.bias", (1, 1, T, T), "mask"),
            (h + "attn.c_attn.weight", (C, 3 * C), "matrix"),
            (h + "attn.c_attn.bias", (3 * C,), "bias"),
            (h + "attn.c_proj.weight", (C, C), "matrix"),
            (h + "attn.c_proj.bias", (C,), "bias"),
            (h + "ln_2.weight", (C,), "gain"),
            (h + "ln_2.bias", (C,), "bias"),
            (h + "mlp.c_fc.weight", (C, 4 * C), "matrix"),
            (h + "mlp.c_fc.bias", (4 * C,), "bias"),
            (h + "mlp.c_proj.weight", (4 * C, C), "matrix"),
            (h + "mlp.c_proj.bias", (C,), "bias"),
        ]
    out += [("ln_f.weight", (C,), "gain"), ("ln_f.bias", (C,), "bias")]
    return out


CHUNK_ELEMS = 1 << 22  # 16 MiB of float32: the most this script holds at once


def write_values(f, shape, kind, rng):
    """Writes one tensor, row-major, in pieces of at most CHUNK_ELEMS."""
    if kind == "mask":  # causal: 1 on and below the diagonal
        T = shape[-1]
        rows = max(1, CHUNK_ELEMS // T)
        for r0 in range(0, T, rows):
            r = np.arange(r0, min(T, r0 + rows))[:, None]
            f.write((np.arange(T)[None, :] <= r).astype("<f4").tobytes())
        return
    n = int(np.prod(shape))
    for done in range(0, n, CHUNK_ELEMS):
        v = rng.standard_normal(min(CHUNK_ELEMS, n - done), dtype=np.float32)
        if kind == "gain":
            v = 1.0 + 0.02 * v
        else:
            v *= 0.02 if kind == "matrix" else 0.01
        f.write(v.astype("<f4", copy=False).tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n_layer", type=int, required=True)
    ap.add_argument("--n_embd", type=int, required=True)
    ap.add_argument("--n_head", type=int, required=True)
    ap.add_argument("--vocab_size", type=int, required=True)
    ap.add_argument("--max_seq_len", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.n_embd % a.n_head:
        sys.exit(f"n_embd {a.n_embd} is not a multiple of n_head {a.n_head}")

    tensors = tensor_list(a.n_layer, a.n_embd, a.vocab_size, a.max_seq_len)
    header, offset = {}, 0
    for name, shape, _ in tensors:
        nbytes = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt", "n_head": str(a.n_head),
                              "made_by": "meshlm tests/bench/make_gpt2_safetensors.py"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)

    rng = np.random.default_rng(a.seed)
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape, kind in tensors:
            write_values(f, shape, kind, rng)
    os.replace(tmp, a.out)
    params = sum(int(np.prod(s)) for n, s, k in tensors if k != "mask")
    print(f"{a.out}: {len(tensors)} tensors, {params} parameters (+ masks), "
          f"{os.path.getsize(a.out) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
