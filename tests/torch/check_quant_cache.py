#!/usr/bin/env python3
"""The quantized base model end to end, against independent references.

A small GPT-2 is made with torch in Hugging Face's layout (Conv1D weights
stored (in, out), a "transformer." prefix on some names, attention masks,
F32 and BF16 tensors) and written as safetensors by this script. `meshlm
quantize` turns it into the HDF5 cache, which h5py reads back and numpy
decodes from the published formats alone (not from meshlm's code):

  * every tensor is present with its logical shape (wte padded to 64 rows);
  * vectors are kept exactly (f32);
  * NF4: codes high nibble first, absmax double-quantized around its mean;
    every element within its block's bound of the torch weight;
    the rms error is that of 4-bit NormalFloat (about 0.09 of the rms);
  * int8: every element within absmax/254 of the torch weight;
  * the xxh3_64 attribute is consistent with the arrays (Python's xxhash
    module, Debian's python3-xxhash: missing, it is a failure, not a skip)
    and /meta records the source hash and the settings;
  * a second `meshlm quantize` finds the cache up to date; a changed
    setting rewrites it.

    check_quant_cache.py --meshlm build/meshlm --mpiexec "mpiexec -n 1 ..."
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import write_safetensors  # noqa: E402

try:
    import xxhash
except ImportError:
    # A missing module must not turn the hash check into a silent skip.
    sys.exit("FAIL: the Python module xxhash is missing, so the caches' xxh3_64 attributes "
             f"cannot be checked (Debian: apt-get install python3-xxhash; interpreter {sys.executable})")

# The 16 NF4 levels as QLoRA publishes them (bitsandbytes' NF4 table).
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=np.float32)
HALF_MAX_GAP = (NF4[1] - NF4[0]) / 2  # the widest gap between levels is the first


def hf_gpt2(L, C, V, T, seed):
    """Hugging Face GPT-2 state dict: name -> (tensor, dtype)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}

    def rnd(*shape, scale=0.02):
        return torch.randn(*shape, generator=g) * scale

    sd["wte.weight"] = rnd(V, C)
    sd["wpe.weight"] = rnd(T, C)
    for l in range(L):
        h = f"h.{l}."
        sd[h + "ln_1.weight"] = 1 + rnd(C, scale=0.1)
        sd[h + "ln_1.bias"] = rnd(C)
        sd[h + "attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)  # causal mask buffer
        sd[h + "attn.c_attn.weight"] = rnd(C, 3 * C)  # Conv1D: (in, out)
        sd[h + "attn.c_attn.bias"] = rnd(3 * C)
        sd[h + "attn.c_proj.weight"] = rnd(C, C)
        sd[h + "attn.c_proj.bias"] = rnd(C)
        sd[h + "ln_2.weight"] = 1 + rnd(C, scale=0.1)
        sd[h + "ln_2.bias"] = rnd(C)
        sd[h + "mlp.c_fc.weight"] = rnd(C, 4 * C)
        sd[h + "mlp.c_fc.bias"] = rnd(4 * C)
        sd[h + "mlp.c_proj.weight"] = rnd(4 * C, C) * 3  # a different scale per tensor
        sd[h + "mlp.c_proj.bias"] = rnd(C)
    sd["ln_f.weight"] = 1 + rnd(C, scale=0.1)
    sd["ln_f.bias"] = rnd(C)
    return sd


def meshlm_layout(sd, name, V, Vp):
    """The logical tensor meshlm stores for `name`, as float32 numpy."""
    t = sd[name].to(torch.float32)
    if any(name.endswith(k) for k in ("c_attn.weight", "c_proj.weight", "c_fc.weight")):
        t = t.t()
    if name == "wte.weight":
        t = torch.cat([t, torch.zeros(Vp - V, t.shape[1])])
    return t.contiguous().numpy()


def decode(group, fmt, n):
    if fmt == "f32":
        return group["data"][()].astype(np.float32), None
    if fmt == "int8":
        q = group["data"][()].astype(np.float32)
        absmax = group["absmax"][()]
        blk = np.repeat(absmax, 64)[:n]
        return q * blk / 127.0, blk
    assert fmt == "nf4", fmt
    packed = group["data"][()]
    codes = np.stack([packed >> 4, packed & 15], axis=1).reshape(-1)[:n]
    aq = group["absmax"][()].astype(np.float32)
    a2 = group["absmax2"][()]
    off = group["offset"][()][0]
    absmax = aq / 127.0 * np.repeat(a2, 256)[: len(aq)] + off
    blk = np.repeat(absmax, 64)[:n]
    return NF4[codes] * blk, blk


def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshlm", required=True)
    ap.add_argument("--mpiexec", required=True)
    a = ap.parse_args()
    L, C, NH, V, T = 2, 64, 4, 100, 16
    Vp = (V + 63) // 64 * 64
    sd = hf_gpt2(L, C, V, T, seed=3)
    tensors = {}
    for i, (name, t) in enumerate(sd.items()):
        dtype = "BF16" if i % 5 == 3 else "F32"
        if dtype == "BF16":
            sd[name] = t.to(torch.bfloat16).to(torch.float32)  # what the file holds
        tensors[("transformer." if i % 3 == 0 else "") + name] = (sd[name], dtype)
    fails = []
    with tempfile.TemporaryDirectory() as d:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        with open(os.path.join(d, "run.cfg"), "w") as f:
            f.write(f"[model]\nn_layer = {L}\nn_head = {NH}\nn_embd = {C}\nvocab_size = {V}\n"
                    f"seq_len = {T}\nmax_seq_len = {T}\n[finetune]\nmode = lora\n[quant]\n"
                    f"base = model.safetensors\ncache = cache.h5\n[data]\npath = unused.h5\n")
        for qtype in ("nf4", "int8"):
            out = run(shlex.split(a.mpiexec) + [a.meshlm, "quantize", "run.cfg", f"--quant.type={qtype}"], d)
            print(out)
            if "written to cache.h5" not in out:
                fails.append(f"{qtype}: the cache was not (re)written")
            again = run(shlex.split(a.mpiexec) + [a.meshlm, "quantize", "run.cfg", f"--quant.type={qtype}"], d)
            if "cache is up to date" not in again:
                fails.append(f"{qtype}: a second quantize did not find the cache")
            with h5py.File(os.path.join(d, "cache.h5"), "r") as f:
                meta = dict(f["meta"].attrs)
                if meta.get("quant_type") not in (qtype, qtype.encode()):
                    fails.append(f"{qtype}: /meta quant_type = {meta.get('quant_type')}")
                if not re.fullmatch(r"[0-9a-f]{32}", str(meta["source_hash"].decode()
                                                          if isinstance(meta["source_hash"], bytes)
                                                          else meta["source_hash"])):
                    fails.append(f"{qtype}: /meta source_hash is not 32 hex digits")
                names = [k for k in sd if not re.fullmatch(r"h\.\d+\.attn\.bias", k)]
                if sorted(f["q"].keys()) != sorted(names):
                    fails.append(f"{qtype}: tensors {sorted(set(f['q'].keys()) ^ set(names))}")
                worst_ratio, rms = 0.0, []
                for name in names:
                    ref = meshlm_layout(sd, name, V, Vp)
                    g = f["q"][name]
                    fmt = g.attrs["format"]
                    fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
                    if list(g.attrs["shape"]) != list(ref.shape):
                        fails.append(f"{qtype} {name}: shape {list(g.attrs['shape'])} != {list(ref.shape)}")
                        continue
                    x = ref.reshape(-1)
                    got, blk = decode(g, fmt, x.size)
                    if ref.ndim == 1:
                        if fmt != "f32" or not np.array_equal(got, x):
                            fails.append(f"{qtype} {name}: vector not kept exactly ({fmt})")
                        continue
                    if fmt != qtype:
                        fails.append(f"{qtype} {name}: format {fmt}")
                        continue
                    err = np.abs(got - x)
                    if qtype == "int8":
                        bound = blk / 254.0 * (1 + 1e-4) + 1e-12
                    else:  # level gap + the double quantization of absmax + rounding
                        true_absmax = np.array([np.abs(x[i:i + 64]).max() for i in range(0, x.size, 64)])
                        tb = np.repeat(true_absmax, 64)[: x.size]
                        bound = tb * HALF_MAX_GAP + np.abs(blk - tb) + 1e-6 * (tb + 1e-12)
                    worst_ratio = max(worst_ratio, float(np.max(err / np.maximum(bound, 1e-30))))
                    if np.any(err > bound):
                        fails.append(f"{qtype} {name}: {int(np.sum(err > bound))} elements beyond the bound")
                    if name == "wte.weight" and np.any(got.reshape(Vp, C)[V:] != 0):
                        fails.append(f"{qtype} wte.weight: padded rows are not zero")
                    rms.append(float(np.sqrt(np.mean(err ** 2)) / np.sqrt(np.mean(x ** 2))))
                print(f"{qtype}: worst error / bound {worst_ratio:.4f}, rms error / rms "
                      f"{min(rms):.4f} .. {max(rms):.4f}")
                limit = 0.12 if qtype == "nf4" else 0.01
                if max(rms) > limit:
                    fails.append(f"{qtype}: rms error {max(rms):.4f} > {limit}")
                for name in names:
                    g = f["q"][name]
                    arrays = [k for k in ("data", "absmax", "absmax2", "offset") if k in g]
                    digest = xxhash.xxh3_64(b"".join(g[k][()].tobytes() for k in arrays)).intdigest()
                    if digest != int(g.attrs["xxh3_64"]):
                        fails.append(f"{qtype} {name}: xxh3_64 attribute does not match its arrays")
    if fails:
        print("\n".join("FAIL: " + x for x in fails))
        return 1
    print("quantized cache: every tensor decoded from the published formats agrees with torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
