"""Generators of the files the bad-input cases feed to meshlm.

Every function writes into the case's work directory (the current working
directory of the case, passed as `w`, a pathlib.Path) and returns nothing:
the files themselves are what the case hashes before and after meshlm runs.

Valid files come from the fixtures (run_cases.make_fixtures: a token file
written by `meshlm tokenize`, a cache written by `meshlm quantize`, a
safetensors and a meshlm HDF5 base of the tiny model); the hostile ones are
made here, byte by byte, so that each case says exactly what is wrong with
its input.

numpy and h5py are imported only by the functions that need them: the
table (cases.py) is built, and a case that writes no HDF5 or safetensors
file runs, without them.
"""
import json
import os
import shutil
import struct

# The model of the cases: inputs/tiny.cfg's [model] section.
TINY = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=256, seq_len=32, max_seq_len=32)


# ---------------------------------------------------------------------------
# Parameter files
# ---------------------------------------------------------------------------

def base_config():
    """The sections of the cases' parameter file, in order: tiny.cfg with a
    two-step run, data.path = tokens.h5 (no tokenizing) and output.dir = out,
    both relative to the work directory."""
    return [
        ("model", [("n_layer", "2"), ("n_head", "2"), ("n_embd", "32"), ("vocab_size", "256"),
                   ("seq_len", "32"), ("max_seq_len", "32")]),
        ("train", [("steps", "2"), ("batch_size", "4"), ("micro_batch_size", "1"), ("lr", "1e-3"),
                   ("warmup_steps", "1"), ("log_every", "1"), ("seed", "1337")]),
        ("data", [("path", "tokens.h5")]),
        ("output", [("dir", "out")]),
    ]


def config_text(set=None, drop=(), drop_sections=(), extra=""):
    """INI text of base_config() with keys changed or added (set: {"train.lr":
    "nan"}; a key of a section the base lacks adds the section), keys or
    whole sections left out, and `extra` text appended verbatim."""
    sections = [(s, list(kv)) for s, kv in base_config() if s not in drop_sections]
    for full, value in (set or {}).items():
        sec, key = full.split(".", 1)
        for s, kv in sections:
            if s == sec:
                for i, (k, _) in enumerate(kv):
                    if k == key:
                        kv[i] = (k, value)
                        break
                else:
                    kv.append((key, value))
                break
        else:
            sections.append((sec, [(key, value)]))
    lines = []
    for s, kv in sections:
        lines.append("[%s]" % s)
        for k, v in kv:
            if "%s.%s" % (s, k) not in drop:
                lines.append("%s = %s" % (k, v))
        lines.append("")
    return "\n".join(lines) + extra


def write(w, name, data):
    p = w / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)


def cfg(name="run.cfg", **kw):
    """Setup step: writes the parameter file `name` (config_text(**kw))."""
    return lambda w, fx: write(w, name, config_text(**kw))


def huge_cfg(name, head, size):
    """Setup step: `head`, then one line of `size` bytes 'y' (no '=')."""
    def step(w, fx):
        with open(w / name, "wb") as f:
            f.write(head.encode())
            chunk = b"y" * (1 << 20)
            for _ in range(size >> 20):
                f.write(chunk)
            f.write(b"\n")
    return step


def raw_cfg(data, name="run.cfg"):
    """Setup step: writes `data` (bytes or str) as the parameter file."""
    return lambda w, fx: write(w, name, data)


# ---------------------------------------------------------------------------
# Generic setup steps
# ---------------------------------------------------------------------------

def fixture(src, dest=None):
    """Setup step: copies fixture `src` into the work directory as `dest`."""
    def step(w, fx):
        d = w / (dest or src)
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fx / src, d)
    return step


def tokens(dest="tokens.h5"):
    """Setup step: the valid token file (35149 byte-level tokens of the GPL-3,
    written by `meshlm tokenize`)."""
    return fixture("tokens.h5", dest)


def blob(name, data):
    """Setup step: a file with exactly these bytes."""
    return lambda w, fx: write(w, name, data)


def mkdir(name):
    return lambda w, fx: (w / name).mkdir(parents=True, exist_ok=True)


def symlink(name, target):
    return lambda w, fx: os.symlink(target, w / name)


def fifo(name):
    return lambda w, fx: os.mkfifo(w / name)


def truncate(name, size):
    """Setup step: cuts file `name` to `size` bytes (negative: that many fewer)."""
    def step(w, fx):
        p = w / name
        n = size if size >= 0 else p.stat().st_size + size
        os.truncate(p, n)
    return step


def patch_bytes(name, offset, data):
    """Setup step: overwrites bytes of `name` at `offset` with `data`."""
    def step(w, fx):
        with open(w / name, "r+b") as f:
            f.seek(offset)
            f.write(data)
    return step


def flip_byte(name, offset_from_end):
    """Setup step: inverts one byte of `name`, counted from the end."""
    def step(w, fx):
        p = w / name
        b = bytearray(p.read_bytes())
        b[len(b) - offset_from_end] ^= 0xFF
        p.write_bytes(bytes(b))
    return step


# ---------------------------------------------------------------------------
# Token files (docs/formats.md, io/tokens.h)
# ---------------------------------------------------------------------------

def gpl_ids(n=4000):
    """`n` byte-level ids (a list of ints) of a fixed text: a token file
    long enough for a few steps of tiny.cfg."""
    text = b"This program is free software: you can redistribute it and/or modify it. "
    return list((text * (n // len(text) + 1))[:n])


def raw_tokens_bytes(ids, bpt=2, magic=b"MESHTOK1", version=1, n_tokens=None, trailing=b""):
    """A raw token file: the 24-byte header, then the ids little-endian in
    `bpt` bytes each (2 bytes for a bpt that is neither 1, 2, 4 nor 8)."""
    n = len(ids) if n_tokens is None else n_tokens
    header = magic + struct.pack("<IIQ", version, bpt, n)
    code = {1: "B", 2: "H", 4: "I", 8: "Q"}.get(bpt, "H")
    return header + struct.pack("<%d%s" % (len(ids), code), *ids) + trailing


def raw_tokens(name, ids=None, **kw):
    """Setup step: a meshlm raw token file (fields overridable to break it)."""
    return lambda w, fx: write(w, name, raw_tokens_bytes(gpl_ids() if ids is None else ids, **kw))


def h5_tokens(name, data=None, dtype="uint16", dset="tokens", attrs=None, dset_attrs=None,
              group_instead=False, shape=None):
    """Setup step: an HDF5 token file. `data` defaults to gpl_ids(), stored
    as `dtype` in `shape`; `dset` names the dataset (None: no dataset)."""
    def step(w, fx):
        import h5py
        import numpy as np
        arr = np.asarray(gpl_ids() if data is None else data).astype(dtype)
        if shape is not None:
            arr = arr.reshape(shape)
        with h5py.File(w / name, "w") as f:
            if group_instead:
                f.create_group("tokens")
            elif dset is not None:
                d = f.create_dataset(dset, data=arr)
                for k, v in (dset_attrs or {}).items():
                    d.attrs[k] = v
            for k, v in (attrs or {}).items():
                f.attrs[k] = v
    return step


def h5_tokens_with_val(name, val, val_dtype="uint16"):
    """Setup step: an HDF5 token file with gpl_ids() as /tokens and `val`
    (a list of ids) as /val_tokens, the held-out part of meshlm tokenize
    --val-fraction."""
    def step(w, fx):
        import h5py
        import numpy as np
        with h5py.File(w / name, "w") as f:
            f["tokens"] = np.asarray(gpl_ids(), dtype="uint16")
            f["val_tokens"] = np.asarray(val, dtype=val_dtype)
            f.attrs["vocab_size"] = 256
    return step


# ---------------------------------------------------------------------------
# Base weights: safetensors (io/safetensors.h) and meshlm HDF5 (load/base_source.h)
# ---------------------------------------------------------------------------

def gpt2_tensors(prefix="", m=TINY, seed=0):
    """Hugging Face GPT-2 tensors of the tiny model (Conv1D weights stored
    (in, out)), name -> float32 array, in a fixed order."""
    import numpy as np
    rng = np.random.default_rng(seed)
    C, V, T = m["n_embd"], m["vocab_size"], m["max_seq_len"]
    t = {}

    def add(name, shape, scale=0.02, value=None):
        t[prefix + name] = (np.full(shape, value, np.float32) if value is not None
                            else (rng.standard_normal(shape) * scale).astype(np.float32))
    add("wte.weight", (V, C))
    add("wpe.weight", (T, C), 0.01)
    for layer in range(m["n_layer"]):
        h = "h.%d." % layer
        add(h + "ln_1.weight", (C,), value=1.0)
        add(h + "ln_1.bias", (C,), value=0.0)
        add(h + "attn.c_attn.weight", (C, 3 * C))
        add(h + "attn.c_attn.bias", (3 * C,), value=0.0)
        add(h + "attn.c_proj.weight", (C, C))
        add(h + "attn.c_proj.bias", (C,), value=0.0)
        add(h + "ln_2.weight", (C,), value=1.0)
        add(h + "ln_2.bias", (C,), value=0.0)
        add(h + "mlp.c_fc.weight", (C, 4 * C))
        add(h + "mlp.c_fc.bias", (4 * C,), value=0.0)
        add(h + "mlp.c_proj.weight", (4 * C, C))
        add(h + "mlp.c_proj.bias", (C,), value=0.0)
    add("ln_f.weight", (C,), value=1.0)
    add("ln_f.bias", (C,), value=0.0)
    return t


_ST_DTYPES = {"float32": "F32", "float16": "F16", "float64": "F64", "int64": "I64", "int32": "I32"}


def safetensors_bytes(tensors, header_patch=None, metadata=None, header_len=None,
                      header_pad=b"", data_trailing=b"", raw_header=None):
    """A safetensors file: 8-byte little-endian header length, JSON header,
    data. `header_patch(header)` may change the header dict after offsets are
    computed; `raw_header` (bytes) replaces the JSON text outright;
    `header_len` overrides the length field."""
    import numpy as np
    header, chunks, pos = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _ST_DTYPES[arr.dtype.name], "shape": list(arr.shape),
                        "data_offsets": [pos, pos + len(data)]}
        chunks.append(data)
        pos += len(data)
    if header_patch:
        header_patch(header)
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    text += header_pad
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + b"".join(chunks) + data_trailing


def safetensors(name="base.safetensors", edit=None, prefix="", **kw):
    """Setup step: a safetensors base of the tiny model; `edit(tensors)` may
    change the dict of arrays first (drop, reshape, poison a value)."""
    def step(w, fx):
        t = gpt2_tensors(prefix)
        if edit:
            edit(t)
        write(w, name, safetensors_bytes(t, **kw))
    return step


def params_h5(name="base.h5", edit=None, attrs=None, dtype="float32"):
    """Setup step: a meshlm HDF5 base (/params/<name>, meshlm layout: linear
    weights (out, in), wte padded to a multiple of 64 rows)."""
    def step(w, fx):
        import h5py
        import numpy as np
        t = {}
        for k, v in gpt2_tensors().items():
            if v.ndim == 2 and not k.startswith(("wte", "wpe")):
                v = np.ascontiguousarray(v.T)
            t[k] = v
        if edit:
            edit(t)
        with h5py.File(w / name, "w") as f:
            for k, v in t.items():
                v = np.asarray(v)
                f.create_dataset("params/" + k, data=v if dtype is None else v.astype(dtype))
            base = {"format_version": 1, "n_layer": 2, "n_head": 2, "n_embd": 32,
                    "vocab_size": 256, "max_seq_len": 32}
            base.update(attrs or {})
            for k, v in base.items():
                f.attrs[k] = np.int32(v)
    return step


# ---------------------------------------------------------------------------
# Quantized caches (io/quant_cache.h): the fixture's valid cache, changed
# ---------------------------------------------------------------------------

def cache_edit(name, edit):
    """Setup step: copies the valid fixture cache to `name` and runs
    edit(h5py.File) on it."""
    def step(w, fx):
        import h5py
        shutil.copyfile(fx / "cache-nf4.h5", w / name)
        with h5py.File(w / name, "r+") as f:
            edit(f)
    return step


def set_attr(obj, key, value):
    """Replaces an attribute keeping the kind of type meshlm wrote: fixed
    strings stay fixed strings, int32 stays int32."""
    import numpy as np
    if key in obj.attrs:
        old = obj.attrs[key]
        if isinstance(old, (bytes, np.bytes_)):
            v = value.encode() if isinstance(value, str) else value
            obj.attrs.create(key, np.bytes_(v), dtype="S%d" % (len(v) + 1))
            return
        if isinstance(old, np.generic):
            obj.attrs.create(key, np.asarray(value, dtype=old.dtype))
            return
    obj.attrs[key] = value
