#!/usr/bin/python3
"""Writes a small meshlm checkpoint with h5py, exactly as docs/formats.md
("Checkpoints") describes it, knowing nothing of meshlm's C++ code: a tiny
GPT-2 (n_layer 2, n_head 2, n_embd 16, vocab 64, max_seq_len 32 by default)
in full training, /params, /optimizer/<name>/{m,v}, every dataset's xxh3
attribute, /meta/checksums, and the attributes of / and /meta.

usage: make_fixture.py OUT.h5 [--seed S] [--n_layer L] [--n_embd C] [--vocab V]
                       [--perturb NAME=SCALE] [--offset NAME=VALUE] [--nonfinite NAME]

--perturb adds SCALE * N(0, 1) noise (its own seed) to params/NAME, so two
fixtures of one seed differ in that tensor alone (and its checksums).
--offset adds VALUE to every value of params/NAME (a large mean beside a
small spread: a one-pass variance would cancel).
--nonfinite puts NaNs and infinities into params/NAME.
"""
import argparse

import h5py
import numpy as np
import xxhash

FORMAT_VERSION = 1
KIND = "meshlm checkpoint"


def param_table(n_layer, n_embd, vocab, max_seq_len):
    """(name, shape) of the GPT-2 parameter table, in meshlm's order."""
    C = n_embd
    Vp = (vocab + 63) // 64 * 64
    t = [("wte.weight", (Vp, C)), ("wpe.weight", (max_seq_len, C))]
    for l in range(n_layer):
        h = f"h.{l}."
        t += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
              (h + "attn.c_attn.weight", (3 * C, C)), (h + "attn.c_attn.bias", (3 * C,)),
              (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
              (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
              (h + "mlp.c_fc.weight", (4 * C, C)), (h + "mlp.c_fc.bias", (4 * C,)),
              (h + "mlp.c_proj.weight", (C, 4 * C)), (h + "mlp.c_proj.bias", (C,))]
    t += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return t


def checksum(arr):
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(arr, dtype="<f4").tobytes())


def config_text(n_layer, n_head, n_embd, vocab, max_seq_len, seed):
    return (f"[model]\nn_layer = {n_layer}\nn_head = {n_head}\nn_embd = {n_embd}\n"
            f"vocab_size = {vocab}\nseq_len = {max_seq_len}\nmax_seq_len = {max_seq_len}\n\n"
            f"[train]\nsteps = 100\nbatch_size = 4\nlr = 0.001\nseed = {seed}\n\n"
            f"[checkpoint]\ndir = out/fixture/checkpoints\n")


def tensors(n_layer, n_embd, vocab, max_seq_len, seed):
    """{dataset path: float32 array} of /params and /optimizer."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_table(n_layer, n_embd, vocab, max_seq_len):
        if name.endswith(".weight") and len(shape) == 1:  # LayerNorm gains
            p = 1.0 + 0.05 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            p = 0.01 * rng.standard_normal(shape)
        else:
            p = 0.02 * rng.standard_normal(shape)
        if name == "wte.weight":
            p[vocab:] = 0.0  # padded rows
        out["params/" + name] = p.astype(np.float32)
        out[f"optimizer/{name}/m"] = (1e-3 * rng.standard_normal(shape)).astype(np.float32)
        out[f"optimizer/{name}/v"] = (1e-6 * np.abs(rng.standard_normal(shape))).astype(np.float32)
    return out


def write(path, seed=1, n_layer=2, n_head=2, n_embd=16, vocab=64, max_seq_len=32,
          perturb=None, nonfinite=None, offset=None):
    data = tensors(n_layer, n_embd, vocab, max_seq_len, seed)
    if perturb:
        name, scale = perturb
        a = data["params/" + name]
        noise = np.random.default_rng(10_000 + seed).standard_normal(a.shape)
        data["params/" + name] = (a + scale * noise).astype(np.float32)
    if offset:
        name, value = offset
        data["params/" + name] = (data["params/" + name] + np.float32(value)).astype(np.float32)
    if nonfinite:
        a = data["params/" + nonfinite].reshape(-1)
        a[1] = np.nan
        a[3] = np.inf
        a[5] = -np.inf
        a[-1] = np.nan
    with h5py.File(path, "w") as f:
        model = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab,
                     max_seq_len=max_seq_len)
        f.attrs["format_version"] = np.int32(FORMAT_VERSION)
        for k, v in model.items():
            f.attrs[k] = np.int64(v)
        sums = f.create_group("meta/checksums")
        for name, arr in data.items():
            d = f.create_dataset(name, data=arr, dtype="<f4")
            c = np.uint64(checksum(arr))
            d.attrs["xxh3"] = c
            sums.attrs[name] = c
        m = f["meta"].attrs
        m["format_version"] = np.int64(FORMAT_VERSION)
        m["kind"] = KIND
        m["meshlm_version"] = "0.1.0"
        m["created"] = "2024-01-01T00:00:00Z"
        m["config"] = config_text(n_layer, n_head, n_embd, vocab, max_seq_len, seed)
        for k, v in model.items():
            m[k] = np.int64(v)
        m["finetune_mode"] = "full"
        ints = dict(step=100, tokens_seen=100 * 4 * max_seq_len, adamw_step=100,
                    loss_scale_good_steps=0, skipped_steps=0, overflow_steps=0, data_epoch=0,
                    data_position=400, data_windows_per_epoch=1000, data_seq_len=max_seq_len,
                    data_shuffle=1, seed=seed, layout_dp=1, layout_tp=1, layout_pp=1,
                    layout_zero_stage=0, layout_micro_batches=4, layout_world=1)
        for k, v in ints.items():
            m[k] = np.int64(v)
        m["loss_scale"] = np.float64(1.0)
        m["data_path"] = "data/gpl3.h5"
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n_layer", type=int, default=2)
    ap.add_argument("--n_head", type=int, default=2)
    ap.add_argument("--n_embd", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--max_seq_len", type=int, default=32)
    ap.add_argument("--perturb", help="NAME=SCALE")
    ap.add_argument("--offset", help="NAME=VALUE")
    ap.add_argument("--nonfinite", help="NAME")
    a = ap.parse_args()
    perturb = None
    if a.perturb:
        name, scale = a.perturb.split("=")
        perturb = (name, float(scale))
    offset = None
    if a.offset:
        name, value = a.offset.split("=")
        offset = (name, float(value))
    write(a.out, a.seed, a.n_layer, a.n_head, a.n_embd, a.vocab, a.max_seq_len, perturb,
          a.nonfinite, offset)


if __name__ == "__main__":
    main()
