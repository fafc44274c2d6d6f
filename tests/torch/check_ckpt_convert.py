#!/usr/bin/python3
"""`meshlm ckpt export` and `meshlm ckpt import` against independent references:
safetensors files written and parsed here by hand (8-byte header length, JSON,
data; Debian has no python3-safetensors), h5py, torch and numpy.

usage: check_ckpt_convert.py --meshlm PATH --mpiexec "mpiexec -n 1 ..." --case CASE

CASE:
  roundtrip   a Hugging Face GPT-2 file (some names prefixed "transformer.",
              attention masks, Conv1D weights (in, out)) -> import -> h5py finds
              /params in meshlm's layout (transposed, wte padded with zeros),
              the xxh3 attributes and /meta/checksums equal to Python's xxhash,
              the /meta and root attributes; -> export --dtype fp32 gives the
              original tensors bit for bit (names without the prefix, no masks,
              wte's vocab_size rows); bf16 and fp16 exports equal torch's
              .to(torch.bfloat16) and .half() bit for bit (ties, fp16
              subnormals, the largest fp16 included); the fp32 export imports
              again (n_head from its __metadata__) to the same /params.
  torch_loss  the exported weights loaded into the independent PyTorch GPT-2
              (tests/torch/gpt2_torch.py), whose float64 loss on the first batch
              of a token file must equal meshlm train's step-1 loss (quant.base =
              the imported checkpoint, finetune.mode = full) within 1e-5 relative.
  lora_merge  a LoRA checkpoint made here with h5py (random A and B, quant_type
              nf4 and int8, the base a safetensors file named by quant_base with
              its XXH3-128 in base_hash): export --merge equals, per matrix,
              W_deq + (alpha/r) B A where W_deq is the base quantized and
              dequantized by tests/torch/check_nf4.py's numpy implementation of
              the formats; unadapted matrices equal W_deq, vectors the base
              exactly; without --merge the adapters come out as stored; a base
              whose hash differs, or a missing base, is an error.
  lora_trained a LoRA checkpoint written by meshlm train (nf4 base from a
              safetensors file), exported with --merge: the PyTorch loss of the
              merged model equals meshlm's LoRA loss with the same adapters
              (a run started from them, finetune.adapters_from) within 1e-5.
  bad_inputs  import of a file with a missing tensor, a wrong shape, a
              truncated data block, a NaN; export of a checkpoint with a
              damaged dataset, a value past fp16's range, a NaN; outputs that
              are not of the tool's kind: each an error naming the file and the
              tensor, with nothing written.
Exit status 1 on any failure.
"""
import argparse
import json
import os
import shlex
import struct
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt2_torch  # noqa: E402
import check_nf4  # noqa: E402  (the numpy reference of the nf4 and int8 formats)
from safetensors_io import write_safetensors  # noqa: E402

try:
    import xxhash
except ImportError:
    sys.exit("FAIL: the Python module xxhash is missing (Debian: apt-get install python3-xxhash; "
             f"interpreter {sys.executable})")

# The 16 NF4 levels as QLoRA publishes them (bitsandbytes' NF4 table).
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=np.float32)
# The numpy reference forms nf4's block scale in float64 (meshlm: one fused
# multiply-add in float32): dequantized values may differ by a float32
# rounding of the tensor's scale (tests/torch/check_nf4.py allows 1e-6 of it).
DEQ_TOL = 1e-6
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
KIND = "meshlm checkpoint"

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)
    return cond


# ---------------------------------------------------------------------------
# safetensors by hand
# ---------------------------------------------------------------------------

def read_safetensors(path):
    """(header without __metadata__, metadata, name -> raw bytes as numpy array of its dtype)."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    np_dtype = {"F32": "<f4", "BF16": "<u2", "F16": "<u2"}
    out = {}
    end = 0
    for name, e in header.items():
        b, f = e["data_offsets"]
        end = max(end, f)
        out[name] = np.frombuffer(body[b:f], dtype=np_dtype[e["dtype"]]).reshape(e["shape"])
    check(end == len(body), f"{os.path.basename(path)}: the data block ends where the last tensor does")
    check((8 + n) % 8 == 0, f"{os.path.basename(path)}: the data block starts 8-aligned")
    return header, meta, out


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------

def hf_state(L, C, V, T, seed):
    """A Hugging Face GPT-2 state dict (numpy float32, Conv1D weights (in, out))."""
    g = np.random.default_rng(seed)

    def rnd(*shape, scale=0.02):
        return (g.standard_normal(shape) * scale).astype(np.float32)

    sd = {"wte.weight": rnd(V, C), "wpe.weight": rnd(T, C, scale=0.01)}
    for l in range(L):
        h = f"h.{l}."
        sd[h + "ln_1.weight"] = 1 + rnd(C, scale=0.1)
        sd[h + "ln_1.bias"] = rnd(C)
        sd[h + "attn.c_attn.weight"] = rnd(C, 3 * C)
        sd[h + "attn.c_attn.bias"] = rnd(3 * C)
        sd[h + "attn.c_proj.weight"] = rnd(C, C)
        sd[h + "attn.c_proj.bias"] = rnd(C)
        sd[h + "ln_2.weight"] = 1 + rnd(C, scale=0.1)
        sd[h + "ln_2.bias"] = rnd(C)
        sd[h + "mlp.c_fc.weight"] = rnd(C, 4 * C)
        sd[h + "mlp.c_fc.bias"] = rnd(4 * C)
        sd[h + "mlp.c_proj.weight"] = rnd(4 * C, C) * 3
        sd[h + "mlp.c_proj.bias"] = rnd(C)
    sd["ln_f.weight"] = 1 + rnd(C, scale=0.1)
    sd["ln_f.bias"] = rnd(C)
    return sd


def file_tensors(sd, T, prefix_every=3):
    """The tensors as a file holds them: some names prefixed "transformer.", masks added."""
    out = {}
    for i, (name, t) in enumerate(sd.items()):
        out[("transformer." if i % prefix_every == 0 else "") + name] = t
        if name.endswith("ln_1.bias"):
            out[name.replace("ln_1.bias", "attn.bias")] = np.tril(np.ones((T, T), np.float32)).reshape(1, 1, T, T)
    return out


def padded(V):
    return (V + 63) // 64 * 64


def meshlm_layout(sd, name, V):
    """The logical tensor meshlm keeps for Hugging Face tensor `name`."""
    t = sd[name]
    if name.endswith(CONV1D):
        t = t.T
    if name == "wte.weight":
        t = np.concatenate([t, np.zeros((padded(V) - V, t.shape[1]), np.float32)])
    return np.ascontiguousarray(t, np.float32)


def xxh3_64(a):
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(a, "<f4").tobytes())


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


# ---------------------------------------------------------------------------
# Running meshlm
# ---------------------------------------------------------------------------

class Meshlm:
    def __init__(self, exe, mpiexec, cwd):
        self.exe, self.mpiexec, self.cwd = exe, shlex.split(mpiexec), cwd

    def run(self, *args, ok=True):
        cmd = self.mpiexec + [self.exe] + list(args)
        p = subprocess.run(cmd, cwd=self.cwd, capture_output=True, text=True, timeout=600)
        out = p.stdout + p.stderr
        if ok and p.returncode != 0:
            print("$", " ".join(cmd))
            print(out)
            sys.exit(f"FAIL: meshlm exited with {p.returncode}")
        return p.returncode, out

    def fails(self, what, args, must_say, absent=None, unchanged=None):
        """meshlm must exit non-zero, its message must hold every string of
        must_say, `absent` must not exist afterwards, `unchanged` (path,
        bytes) must keep its bytes."""
        rc, out = self.run(*args, ok=False)
        said = all(s in out for s in must_say)
        check(rc != 0 and said, f"{what}: refused, naming {must_say}")
        if rc == 0 or not said:
            print(out)
        if absent:
            check(not os.path.exists(os.path.join(self.cwd, absent)), f"{what}: {absent} not written")
            left = [f for f in os.listdir(os.path.join(self.cwd, os.path.dirname(absent) or "."))
                    if ".tmp." in f]
            check(not left, f"{what}: no temporary file left ({left})")
        if unchanged:
            path, data = unchanged
            check(open(os.path.join(self.cwd, path), "rb").read() == data, f"{what}: {path} unchanged")


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

def special_values(n):
    """Values whose 16-bit rounding is delicate: ties of bf16 and fp16, fp16
    subnormals and its largest finite, signed zeros."""
    v = [0.0, -0.0, 65504.0, -65504.0, 65519.0, 65488.0, 6.1035156e-05, 6.0e-05, 2.0 ** -24,
         2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -25 * 1.0000001, 1e-7, 5.96e-08, -3e-6,
         1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11,
         -(1.0 + 2.0 ** -8), 3.0e38 / 1e34, 1e-40 * 1e20]
    v = np.array(v, np.float32)
    # bf16 ties: a float32 whose low 16 bits are exactly 0x8000.
    ties = (np.arange(8, dtype=np.uint32) * 0x10000 + 0x3f808000).view(np.float32)
    out = np.concatenate([v, ties, -ties])
    return np.resize(out, n).astype(np.float32)


def case_roundtrip(m, d):
    L, C, NH, V, T = 2, 64, 4, 100, 16
    sd = hf_state(L, C, V, T, seed=5)
    sd["ln_f.bias"] = special_values(C)
    sd["h.1.ln_2.bias"] = (special_values(C)[::-1] * np.float32(0.5)).copy()
    write_safetensors(os.path.join(d, "hf.safetensors"), file_tensors(sd, T), {"format": "pt"})

    m.run("ckpt", "import", "hf.safetensors", "-o", "ck.h5", f"--n_head={NH}")
    with h5py.File(os.path.join(d, "ck.h5"), "r") as f:
        names = sorted(f["params"].keys())
        check(names == sorted(sd), "import: /params holds every tensor of the model, nothing else")
        check("optimizer" not in f and "lora" not in f, "import: no /optimizer, no /lora")
        exact, sums, table = True, True, True
        for name in sd:
            ds = f["params"][name]
            ref = meshlm_layout(sd, name, V)
            got = ds[()]
            if ds.dtype != np.float32 or got.shape != ref.shape or not np.array_equal(
                    got.view(np.uint32), ref.view(np.uint32)):
                exact = False
                print(f"  {name}: {got.shape} {ds.dtype} vs {ref.shape}")
            if int(ds.attrs["xxh3"]) != xxh3_64(ref):
                sums = False
            if int(f["meta/checksums"].attrs[f"params/{name}"]) != xxh3_64(ref):
                table = False
        check(exact, "import: every tensor in meshlm's layout, bit for bit (Conv1D transposed, "
                     "wte padded with zero rows)")
        check(sums, "import: each dataset's xxh3 attribute is Python's xxh3_64 of its float32 values")
        check(table, "import: /meta/checksums holds the same checksums")
        meta = dict(f["meta"].attrs)
        want = {"format_version": 1, "n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V,
                "max_seq_len": T, "step": 0}
        check(all(int(meta.get(k, -1)) == v for k, v in want.items()), f"import: /meta has {want}")
        check(text(meta.get("kind")) == KIND and text(meta.get("finetune_mode")) == "full",
              "import: /meta kind and finetune_mode = full")
        root = dict(f.attrs)
        check(all(int(root.get(k, -1)) == v for k, v in want.items() if k not in ("step",)),
              "import: root attributes format_version, n_layer, n_head, n_embd, vocab_size, max_seq_len")

    originals = {n: sd[n] for n in sd}
    for dtype, st, conv in (("fp32", "F32", None), ("bf16", "BF16", torch.bfloat16),
                            ("fp16", "F16", torch.float16)):
        out = f"out_{dtype}.safetensors"
        m.run("ckpt", "export", "ck.h5", "--format", "safetensors", "--dtype", dtype, "-o", out)
        header, meta, got = read_safetensors(os.path.join(d, out))
        check(sorted(header) == sorted(originals),
              f"export {dtype}: the Hugging Face names, no prefix, no masks")
        check(meta.get("format") == "pt" and meta.get("meshlm.step") == "0"
              and meta.get("meshlm.source") == "ck.h5",
              f"export {dtype}: __metadata__ format = pt, meshlm.step, meshlm.source")
        check(all(e["dtype"] == st for e in header.values()), f"export {dtype}: every tensor {st}")
        bad = []
        for name, ref in originals.items():
            if list(header[name]["shape"]) != list(ref.shape):
                bad.append(f"{name} shape {header[name]['shape']}")
                continue
            if conv is None:
                want = ref.view(np.uint32)
                have = got[name].view(np.uint32)
            else:
                want = torch.from_numpy(ref).to(conv).view(torch.int16).numpy().view(np.uint16)
                have = got[name]
            if not np.array_equal(want, have):
                k = int(np.argmax(want.reshape(-1) != have.reshape(-1)))
                bad.append(f"{name}[{k}] of {ref.reshape(-1)[k]!r}: {have.reshape(-1)[k]:#x} "
                           f"instead of {want.reshape(-1)[k]:#x}")
        what = {"fp32": "the original tensors bit for bit",
                "bf16": "torch's .to(torch.bfloat16) bit for bit",
                "fp16": "torch's .half() bit for bit"}[dtype]
        check(not bad, f"export {dtype}: {what} (shapes (in, out) for Conv1D, wte {V} rows)")
        for b in bad[:5]:
            print("  ", b)

    # The export imports again (n_head from its __metadata__) to the same /params.
    _, out = m.run("ckpt", "import", "out_fp32.safetensors", "-o", "again.h5")
    check("n_head 4" in out, "import of an export: n_head taken from its __metadata__")
    with h5py.File(os.path.join(d, "ck.h5"), "r") as a, h5py.File(os.path.join(d, "again.h5"), "r") as b:
        check(all(np.array_equal(a["params"][n][()], b["params"][n][()]) for n in sd),
              "export then import: the same /params")
    # A checkpoint is replaced by another import.
    m.run("ckpt", "import", "hf.safetensors", "-o", "again.h5", "--model.n_head", "4")
    check(True, "import over an existing checkpoint")
    # An existing safetensors output is replaced.
    m.run("ckpt", "export", "ck.h5", "-o", "out_fp32.safetensors")
    check(True, "export over an existing safetensors file")


def first_batch_loss_torch(params, cfg, tokens, B, T):
    model = gpt2_torch.GPT2(cfg).double()
    model.load_from_arrays(params)
    x = np.stack([tokens[w * T: w * T + T] for w in range(B)]).astype(np.int64)
    y = np.stack([tokens[w * T + 1: w * T + T + 1] for w in range(B)]).astype(np.int64)
    with torch.no_grad():
        _, loss = model(torch.from_numpy(x), torch.from_numpy(y))
    return float(loss)


def case_torch_loss(m, d):
    L, C, NH, V, T = 2, 64, 4, 100, 16
    B = 4
    sd = hf_state(L, C, V, T, seed=11)
    # Larger weights than GPT-2's initialisation, so the loss is far from log(V).
    for k in sd:
        if k.endswith(".weight") and sd[k].ndim == 2:
            sd[k] = sd[k] * np.float32(5)
    write_safetensors(os.path.join(d, "hf.safetensors"), file_tensors(sd, T))
    m.run("ckpt", "import", "hf.safetensors", "-o", "ck.h5", "--n_head", str(NH))
    m.run("ckpt", "export", "ck.h5", "--dtype", "fp32", "-o", "model.safetensors")

    rng = np.random.default_rng(3)
    tokens = rng.integers(0, V, size=B * T * 3 + 1).astype(np.uint16)
    with h5py.File(os.path.join(d, "tokens.h5"), "w") as f:
        f["tokens"] = tokens
        f.attrs["vocab_size"] = V

    # The PyTorch side reads only the exported file.
    header, meta, got = read_safetensors(os.path.join(d, "model.safetensors"))
    params = {}
    for name, t in got.items():
        a = np.array(t, np.float32)
        if name.endswith(CONV1D):
            a = a.T
        if name == "wte.weight":
            a = np.concatenate([a, np.zeros((padded(V) - V, C), np.float32)])
        params[name] = a
    cfg = gpt2_torch.GPT2Config(n_layer=L, n_head=NH, n_embd=C, vocab_size=V,
                                padded_vocab_size=padded(V), max_seq_len=T)
    ref = first_batch_loss_torch(params, cfg, tokens, B, T)

    with open(os.path.join(d, "run.cfg"), "w") as f:
        f.write(f"[model]\nn_layer = {L}\nn_head = {NH}\nn_embd = {C}\nvocab_size = {V}\n"
                f"seq_len = {T}\nmax_seq_len = {T}\n[train]\nsteps = 1\nbatch_size = {B}\n"
                f"micro_batch_size = {B}\nlr = 1e-30\nwarmup_steps = 0\nlog_every = 1\n"
                f"[data]\npath = tokens.h5\nshuffle = false\n[finetune]\nmode = full\n"
                f"[quant]\nbase = ck.h5\n[output]\ndir = out\n[checkpoint]\nfinal = true\n")
    m.run("train", "run.cfg")
    with h5py.File(os.path.join(d, "out", "run.h5"), "r") as f:
        got_loss = float(f["metrics/loss"][0])
    rel = abs(got_loss - ref) / abs(ref)
    print(f"  meshlm step-1 loss {got_loss:.9f}, PyTorch (float64) {ref:.9f}, relative {rel:.2e}")
    check(abs(ref - np.log(V)) > 0.05, "the loss is not that of a uniform prediction")
    check(rel <= 1e-5, "meshlm's loss at the imported weights equals PyTorch's on the exported "
                       "weights within 1e-5 relative")

    # The checkpoint that training wrote exports too: every tensor its /params
    # holds, in Hugging Face's layout.
    ck = os.path.join("out", "checkpoints", "step_00000001.h5")
    m.run("ckpt", "export", ck, "-o", "trained.safetensors")
    _, meta, got = read_safetensors(os.path.join(d, "trained.safetensors"))
    with h5py.File(os.path.join(d, ck), "r") as f:
        def hf(n):
            x = f["params"][n][()]
            return x.T if n.endswith(CONV1D) else x[:V] if n == "wte.weight" else x
        same = sorted(got) == sorted(f["params"].keys()) and all(
            np.array_equal(np.array(got[n]), hf(n)) for n in got)
    check(same and meta.get("meshlm.step") == "1",
          "a checkpoint written by meshlm train exports to its /params in Hugging Face's layout")


def dequantized(x, qtype):
    """The numpy reference's dequantized values of a logical tensor (tests/torch/check_nf4.py)."""
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)
    if qtype == "nf4":
        _, deq, _ = check_nf4.ref_nf4(flat, NF4)
    else:
        _, deq = check_nf4.ref_int8(flat)
    return deq.reshape(x.shape)


def write_lora_checkpoint(path, cfg, r, alpha, targets, qtype, base, base_hash, seed, step, rng):
    """A LoRA checkpoint per docs/formats.md; returns {matrix: (A, B)}."""
    L, C, V, T = cfg
    slots = {"qkv": ("attn.c_attn.weight", 3 * C, C), "attn-out": ("attn.c_proj.weight", C, C),
             "mlp-up": ("mlp.c_fc.weight", 4 * C, C), "mlp-down": ("mlp.c_proj.weight", C, 4 * C)}
    adapters = {}
    with h5py.File(path, "w") as f:
        sums = f.require_group("meta/checksums")
        for l in range(L):
            for slot in targets.split(","):
                name, out_f, in_f = slots[slot]
                mat = f"h.{l}.{name}"
                A = (rng.standard_normal((r, in_f)) / np.sqrt(in_f)).astype(np.float32)
                B = (rng.standard_normal((out_f, r)) * 0.05).astype(np.float32)
                adapters[mat] = (A, B)
                for part, a in (("A", A), ("B", B)):
                    ds = f.create_dataset(f"lora/{mat}/{part}", data=a)
                    ds.attrs["xxh3"] = np.uint64(xxh3_64(a))
                    sums.attrs[f"lora/{mat}/{part}"] = np.uint64(xxh3_64(a))
        meta = f["meta"]
        for k, v in {"format_version": 1, "n_layer": L, "n_head": 4, "n_embd": C, "vocab_size": V,
                     "max_seq_len": T, "step": step, "lora_rank": r, "seed": seed}.items():
            meta.attrs[k] = np.int64(v)
        meta.attrs["lora_alpha"] = np.float64(alpha)
        for k, v in {"kind": KIND, "finetune_mode": "lora", "lora_targets": targets,
                     "quant_type": qtype, "quant_base": base, "base_hash": base_hash}.items():
            meta.attrs[k] = v
        for k, v in {"format_version": 1, "n_layer": L, "n_head": 4, "n_embd": C,
                     "vocab_size": V, "max_seq_len": T}.items():
            f.attrs[k] = np.int64(v)
    return adapters


def case_lora_merge(m, d):
    L, C, V, T = 2, 64, 100, 16
    r, alpha, targets = 4, 8.0, "qkv,mlp-down"
    sd = hf_state(L, C, V, T, seed=21)
    write_safetensors(os.path.join(d, "base.safetensors"), file_tensors(sd, T))
    base_hash = xxhash.xxh3_128_hexdigest(open(os.path.join(d, "base.safetensors"), "rb").read())
    rng = np.random.default_rng(9)
    for qtype in ("nf4", "int8"):
        ck = f"lora_{qtype}.h5"
        adapters = write_lora_checkpoint(os.path.join(d, ck), (L, C, V, T), r, alpha, targets, qtype,
                                         "base.safetensors", base_hash, 1234, 7, rng)
        out = f"merged_{qtype}.safetensors"
        m.run("ckpt", "export", ck, "--merge", "-o", out)
        header, meta, got = read_safetensors(os.path.join(d, out))
        check(sorted(header) == sorted(sd), f"{qtype} --merge: every tensor of the model")
        check(meta.get("meshlm.step") == "7" and meta.get("meshlm.quant_type") == qtype,
              f"{qtype} --merge: __metadata__ meshlm.step and quant_type")
        s = np.float32(alpha) / np.float32(r)
        worst, vectors_exact, shapes = 0.0, True, True  # worst: |error| / max |W| of its tensor
        for name in sd:
            ref = meshlm_layout(sd, name, V)
            g = np.array(got[name], np.float32)
            if ref.ndim == 1:
                vectors_exact &= np.array_equal(g.view(np.uint32), ref.view(np.uint32))
                continue
            want = dequantized(ref, qtype).astype(np.float64)
            if name in adapters:
                A, B = adapters[name]
                want = want + float(s) * (B.astype(np.float64) @ A.astype(np.float64))
            if name.endswith(CONV1D):
                want = want.T
            if name == "wte.weight":
                want = want[:V]
            if g.shape != want.shape:
                shapes = False
                print(f"  {name}: {g.shape} vs {want.shape}")
                continue
            worst = max(worst, float(np.max(np.abs(g - want)) / np.max(np.abs(ref))))
        check(shapes, f"{qtype} --merge: Hugging Face shapes")
        check(vectors_exact, f"{qtype} --merge: vectors are the base's, bit for bit")
        check(worst <= DEQ_TOL, f"{qtype} --merge: every matrix is W_deq (+ (alpha/r) B A where "
                                f"adapted) within {DEQ_TOL} of max|W| (worst {worst:.2e})")
        # An unadapted matrix: the dequantized base alone (no adapter slipped
        # in), and not the base itself (it was quantized).
        n = "h.0.attn.c_proj.weight"
        ref = meshlm_layout(sd, n, V)
        g = np.array(got[n], np.float32).T
        check(np.max(np.abs(g - dequantized(ref, qtype))) <= DEQ_TOL * np.max(np.abs(ref))
              and np.max(np.abs(g - ref)) > 1e-4 * np.max(np.abs(ref)),
              f"{qtype} --merge: an unadapted matrix ({n}) is W_deq, not W")

        # Without --merge: the adapters as stored.
        m.run("ckpt", "export", ck, "-o", f"adapters_{qtype}.safetensors")
        header, meta, got = read_safetensors(os.path.join(d, f"adapters_{qtype}.safetensors"))
        want = {f"{mat}.lora_{p}": a for mat, (A, B) in adapters.items() for p, a in (("A", A), ("B", B))}
        check(sorted(header) == sorted(want) and all(np.array_equal(got[k], v) for k, v in want.items()),
              f"{qtype}: export without --merge writes <matrix>.lora_A / lora_B as stored")

    # A base other than the one the run used.
    other = dict(sd)
    other["wpe.weight"] = sd["wpe.weight"].copy()
    other["wpe.weight"][0, 0] += 1
    write_safetensors(os.path.join(d, "other.safetensors"), file_tensors(other, T))
    m.fails("--merge onto another base", ["ckpt", "export", "lora_nf4.h5", "--merge", "--base",
                                          "other.safetensors", "-o", "bad.safetensors"],
            ["other.safetensors", "base_hash", base_hash], absent="bad.safetensors")
    os.rename(os.path.join(d, "base.safetensors"), os.path.join(d, "moved.safetensors"))
    m.fails("--merge with the base gone", ["ckpt", "export", "lora_nf4.h5", "--merge",
                                           "-o", "bad.safetensors"],
            ["base.safetensors", "--base"], absent="bad.safetensors")
    m.run("ckpt", "export", "lora_nf4.h5", "--merge", "--base", "moved.safetensors", "-o",
          "moved_merge.safetensors")
    _, _, a = read_safetensors(os.path.join(d, "moved_merge.safetensors"))
    _, _, b = read_safetensors(os.path.join(d, "merged_nf4.safetensors"))
    check(all(np.array_equal(a[k], b[k]) for k in b), "--base FILE gives the same merged tensors")
    m.fails("--merge onto the initialisation of a run trained on a file",
            ["ckpt", "export", "lora_nf4.h5", "--merge", "--base", "", "-o", "bad.safetensors"],
            ["base_hash", "--base"], absent="bad.safetensors")


def case_lora_trained(m, d):
    """A LoRA checkpoint written by meshlm train itself, merged: its loss in
    PyTorch equals the loss meshlm's LoRA forward (quantized base + adapters)
    computes with the same adapters."""
    L, C, NH, V, T, B, r = 2, 64, 4, 100, 16, 4, 4
    sd = hf_state(L, C, V, T, seed=41)
    for k in sd:
        if k.endswith(".weight") and sd[k].ndim == 2:
            sd[k] = sd[k] * np.float32(5)
    write_safetensors(os.path.join(d, "base.safetensors"), file_tensors(sd, T))
    rng = np.random.default_rng(8)
    tokens = rng.integers(0, V, size=B * T * 3 + 1).astype(np.uint16)
    with h5py.File(os.path.join(d, "tokens.h5"), "w") as f:
        f["tokens"] = tokens
    with open(os.path.join(d, "lora.cfg"), "w") as f:
        f.write(f"[model]\nn_layer = {L}\nn_head = {NH}\nn_embd = {C}\nvocab_size = {V}\n"
                f"seq_len = {T}\nmax_seq_len = {T}\n[train]\nsteps = 3\nbatch_size = {B}\n"
                f"micro_batch_size = {B}\nlr = 1e-2\nwarmup_steps = 0\nlog_every = 1\n"
                f"[data]\npath = tokens.h5\nshuffle = false\n[finetune]\nmode = lora\n"
                f"lora_rank = {r}\nlora_alpha = 12\nlora_targets = qkv,attn-out,mlp-down\n"
                f"[quant]\nbase = base.safetensors\ntype = nf4\n[checkpoint]\nfinal = true\n")
    m.run("train", "lora.cfg", "--output.dir=trained")
    ck = os.path.join("trained", "checkpoints", "step_00000003.h5")
    m.run("ckpt", "export", ck, "--merge", "-o", "merged.safetensors")
    # meshlm's LoRA forward with these adapters: a run that starts from them
    # (finetune.adapters_from) and barely moves (lr 1e-30); its step-1 loss
    # is the loss of windows 0 .. B-1.
    m.run("train", "lora.cfg", "--output.dir=again", f"--finetune.adapters_from={ck}",
          "--train.steps=1", "--train.lr=1e-30", "--checkpoint.final=false")
    with h5py.File(os.path.join(d, "again", "run.h5"), "r") as f:
        lora_loss = float(f["metrics/loss"][0])
    _, meta, got = read_safetensors(os.path.join(d, "merged.safetensors"))
    params = {}
    for name, t in got.items():
        a = np.array(t, np.float32)
        if name.endswith(CONV1D):
            a = a.T
        if name == "wte.weight":
            a = np.concatenate([a, np.zeros((padded(V) - V, C), np.float32)])
        params[name] = a
    cfg = gpt2_torch.GPT2Config(n_layer=L, n_head=NH, n_embd=C, vocab_size=V,
                                padded_vocab_size=padded(V), max_seq_len=T)
    ref = first_batch_loss_torch(params, cfg, tokens, B, T)
    with h5py.File(os.path.join(d, ck), "r") as f:
        moved = max(float(np.abs(f[f"lora/h.{l}.attn.c_attn.weight/B"][()]).max()) for l in range(L))
    check(moved > 0, "the trained adapters are not zero (B moved from its start)")
    check(meta.get("meshlm.step") == "3", "__metadata__ meshlm.step = 3")
    rel = abs(lora_loss - ref) / abs(ref)
    print(f"  meshlm LoRA loss {lora_loss:.9f}, PyTorch on the merged export {ref:.9f}, "
          f"relative {rel:.2e}")
    check(rel <= 1e-5, "the merged export's PyTorch loss equals meshlm's LoRA loss with the same "
                       "adapters on the nf4 base within 1e-5 relative")


def case_bad_inputs(m, d):
    L, C, NH, V, T = 2, 64, 4, 100, 16
    sd = hf_state(L, C, V, T, seed=31)
    good = file_tensors(sd, T, prefix_every=1000)

    def variant(name, change):
        t = dict(good)
        change(t)
        write_safetensors(os.path.join(d, name), t)

    variant("missing.safetensors", lambda t: t.pop("h.1.mlp.c_fc.bias"))
    m.fails("import: a missing tensor", ["ckpt", "import", "missing.safetensors", "-o", "o.h5", "--n_head=4"],
            ["missing.safetensors", "h.1.mlp.c_fc.bias"], absent="o.h5")
    variant("shape.safetensors", lambda t: t.update({"h.0.attn.c_attn.weight":
                                                     np.ascontiguousarray(t["h.0.attn.c_attn.weight"].T)}))
    m.fails("import: a wrong shape", ["ckpt", "import", "shape.safetensors", "-o", "o.h5", "--n_head=4"],
            ["shape.safetensors", "h.0.attn.c_attn.weight", "[192, 64]"], absent="o.h5")

    def nan(t):
        w = t["h.1.mlp.c_proj.weight"].copy()
        w[5, 7] = np.nan
        t["h.1.mlp.c_proj.weight"] = w
    variant("nan.safetensors", nan)
    m.fails("import: a NaN", ["ckpt", "import", "nan.safetensors", "-o", "o.h5", "--n_head=4"],
            ["nan.safetensors", "h.1.mlp.c_proj.weight", "NaN"], absent="o.h5")
    write_safetensors(os.path.join(d, "good.safetensors"), good)
    data = open(os.path.join(d, "good.safetensors"), "rb").read()
    open(os.path.join(d, "truncated.safetensors"), "wb").write(data[:-100])
    m.fails("import: a truncated file", ["ckpt", "import", "truncated.safetensors", "-o", "o.h5"],
            ["truncated.safetensors", "ln_f.bias"], absent="o.h5")
    with h5py.File(os.path.join(d, "tokens.h5"), "w") as f:
        f["tokens"] = np.arange(100, dtype=np.uint16)
    tok = open(os.path.join(d, "tokens.h5"), "rb").read()
    m.fails("import over a file that is not a checkpoint",
            ["ckpt", "import", "good.safetensors", "-o", "tokens.h5"],
            ["tokens.h5", "not a meshlm checkpoint"], unchanged=("tokens.h5", tok))
    m.fails("import: no input", ["ckpt", "import", "none.safetensors", "-o", "o.h5"],
            ["none.safetensors"], absent="o.h5")
    m.fails("import: heads that do not divide n_embd (GPT-2's 12 by default)",
            ["ckpt", "import", "good.safetensors", "-o", "o.h5"], ["n_head", "--n_head"], absent="o.h5")

    m.run("ckpt", "import", "good.safetensors", "-o", "ck.h5", "--n_head", str(NH))
    open(os.path.join(d, "notes.txt"), "w").write("not a safetensors file\n")
    m.fails("export over a file that is not a safetensors file",
            ["ckpt", "export", "ck.h5", "-o", "notes.txt"],
            ["notes.txt", "not a safetensors file"], unchanged=("notes.txt", b"not a safetensors file\n"))
    m.fails("export of a file that is not a checkpoint",
            ["ckpt", "export", "tokens.h5", "-o", "x.safetensors"], ["tokens.h5"], absent="x.safetensors")
    m.fails("export --merge of a full checkpoint",
            ["ckpt", "export", "ck.h5", "--merge", "-o", "x.safetensors"], ["--merge", "ck.h5"],
            absent="x.safetensors")
    m.fails("export: an unknown dtype", ["ckpt", "export", "ck.h5", "--dtype", "fp8", "-o", "x.safetensors"],
            ["fp8"], absent="x.safetensors")

    def edited(name, fn, fix_sum):
        import shutil
        shutil.copy(os.path.join(d, "ck.h5"), os.path.join(d, name))
        with h5py.File(os.path.join(d, name), "r+") as f:
            ds = f["params/h.0.mlp.c_fc.weight"]
            a = ds[()]
            fn(a)
            ds[...] = a
            if fix_sum:
                ds.attrs["xxh3"] = np.uint64(xxh3_64(a))
                f["meta/checksums"].attrs["params/h.0.mlp.c_fc.weight"] = np.uint64(xxh3_64(a))

    edited("damaged.h5", lambda a: a.__setitem__((3, 3), a[3, 3] + 1), fix_sum=False)
    m.fails("export of a damaged dataset", ["ckpt", "export", "damaged.h5", "-o", "x.safetensors"],
            ["damaged.h5", "params/h.0.mlp.c_fc.weight", "checksum"], absent="x.safetensors")
    edited("big.h5", lambda a: a.__setitem__((3, 5), 1e5), fix_sum=True)
    m.fails("export --dtype fp16 of a value past fp16's range",
            ["ckpt", "export", "big.h5", "--dtype", "fp16", "-o", "x.safetensors"],
            ["big.h5", "h.0.mlp.c_fc.weight", "fp16", "row 5, column 3"], absent="x.safetensors")
    m.run("ckpt", "export", "big.h5", "--dtype", "bf16", "-o", "x.safetensors")
    check(os.path.exists(os.path.join(d, "x.safetensors")), "the same checkpoint exports as bf16")
    os.remove(os.path.join(d, "x.safetensors"))
    edited("nan.h5", lambda a: a.__setitem__((0, 1), np.nan), fix_sum=True)
    m.fails("export of a NaN", ["ckpt", "export", "nan.h5", "-o", "x.safetensors"],
            ["nan.h5", "h.0.mlp.c_fc.weight", "NaN"], absent="x.safetensors")
    import shutil
    shutil.copy(os.path.join(d, "ck.h5"), os.path.join(d, "gap.h5"))
    with h5py.File(os.path.join(d, "gap.h5"), "r+") as f:
        del f["params/ln_f.bias"]
    m.fails("export of a checkpoint missing a tensor", ["ckpt", "export", "gap.h5", "-o", "x.safetensors"],
            ["gap.h5", "params/ln_f.bias"], absent="x.safetensors")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshlm", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--case", required=True, choices=["roundtrip", "torch_loss", "lora_merge", "lora_trained",
                                                      "bad_inputs"])
    ap.add_argument("--keep", help="work in this directory and keep it")
    a = ap.parse_args()
    cases = {"roundtrip": case_roundtrip, "torch_loss": case_torch_loss,
             "lora_merge": case_lora_merge, "lora_trained": case_lora_trained,
             "bad_inputs": case_bad_inputs}
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
        cases[a.case](Meshlm(a.meshlm, a.mpiexec, a.keep), a.keep)
    else:
        with tempfile.TemporaryDirectory() as d:
            cases[a.case](Meshlm(a.meshlm, a.mpiexec, d), d)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
