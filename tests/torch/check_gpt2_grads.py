#!/usr/bin/python3
"""Cross-check meshlm's GPT-2 loss and parameter gradients against PyTorch.

Usage:
  check_gpt2_grads.py TOOL --n_layer L --n_head NH --n_embd C --vocab_size V
                      --seq_len T --batch B [--seed S] [--tol 1e-4]
                      [--precision fp32|bf16|fp16]
  check_gpt2_grads.py --self-test [same options]

Runs `TOOL grads OUT.h5 --n_layer L --n_head NH --n_embd C --vocab_size V
--seq_len T --batch B --seed S`, which writes one forward/backward of meshlm:

  root attributes: n_layer, n_head, n_embd, vocab_size, padded_vocab_size,
                   max_seq_len, batch, seq_len (int), loss (float, mean CE)
  /tokens (B,T) int32, /targets (B,T) int32
  /params/<name> float32, /grads/<name> float32  (d loss / d param)

The parameters are loaded in float64 into the reference model of
gpt2_torch.py, whose loss and gradients (autograd) are the reference:
  |loss - loss_ref| <= tol * |loss_ref|
  per parameter: max|g - g_ref| <= tol * max|g_ref|
wte is compared on its V real rows; the padded rows [V, Vp) of meshlm's
gradient must be exactly 0. The dump must hold exactly the expected
parameter set. Exit status 1 on any failure.

--precision bf16 (fp16) has meshlm compute at train.precision = bf16 (the
CPU's emulated rounding: `TOOL grads ... --precision bf16`), and the
reference round the inputs of each of its matrix products to
torch.bfloat16 (gpt2_torch.RoundedMatmul), still in float64. The check is
then also required to tell the precisions apart: meshlm's loss must be at
least 3 times further from the unrounded (fp32) reference's than from the
rounded one's.

--self-test checks the checker without meshlm: it writes dumps from the
reference model itself (float32), one correct and several subtly wrong, and
requires the first to pass and every other to fail.
"""

import argparse
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import GPT2, GPT2Config, expected_param_shapes, padded_vocab  # noqa: E402
import refcheck  # noqa: E402

INT_ATTRS = ["n_layer", "n_head", "n_embd", "vocab_size", "padded_vocab_size",
             "max_seq_len", "batch", "seq_len"]


def check_dump(path, args, out=sys.stdout):
    """Compares the dump at `path` with the reference. Returns True on PASS."""
    c = refcheck.Checks(out)

    with h5py.File(path, "r") as f:
        missing_attrs = [a for a in INT_ATTRS + ["loss"] if a not in f.attrs]
        if missing_attrs:
            c.fail(f"missing root attributes {missing_attrs}")
            return c.finish()
        a = {k: int(refcheck.scalar(f.attrs[k])) for k in INT_ATTRS}
        loss_ours = float(refcheck.scalar(f.attrs["loss"]))
        for k, want in [("n_layer", args.n_layer), ("n_head", args.n_head), ("n_embd", args.n_embd),
                        ("vocab_size", args.vocab_size), ("seq_len", args.seq_len), ("batch", args.batch)]:
            if a[k] != want:
                c.fail(f"attribute {k}={a[k]} but {want} was requested")
        if a["padded_vocab_size"] < a["vocab_size"]:
            c.fail(f"padded_vocab_size {a['padded_vocab_size']} < vocab_size {a['vocab_size']}")
        if a["max_seq_len"] < a["seq_len"]:
            c.fail(f"max_seq_len {a['max_seq_len']} < seq_len {a['seq_len']}")
        if not c.ok:
            return c.finish()

        B, T, V = a["batch"], a["seq_len"], a["vocab_size"]
        cfg = GPT2Config(n_layer=a["n_layer"], n_head=a["n_head"], n_embd=a["n_embd"],
                         vocab_size=V, padded_vocab_size=a["padded_vocab_size"],
                         max_seq_len=a["max_seq_len"])
        shapes = expected_param_shapes(cfg)

        tokens = np.asarray(f["tokens"]) if "tokens" in f else None
        targets = np.asarray(f["targets"]) if "targets" in f else None
        for nm, arr in [("tokens", tokens), ("targets", targets)]:
            if arr is None:
                c.fail(f"/{nm} missing")
            elif arr.shape != (B, T):
                c.fail(f"/{nm} shape {arr.shape} != {(B, T)}")
            elif arr.min() < 0 or arr.max() >= V:
                c.fail(f"/{nm} values outside [0, {V}): min {arr.min()} max {arr.max()}")

        groups = {}
        for g in ["params", "grads"]:
            names = set(f[g].keys()) if g in f else set()
            if g not in f:
                c.fail(f"/{g} group missing")
            missing = sorted(set(shapes) - names, key=list(shapes).index)
            extra = sorted(names - set(shapes))
            if missing:
                c.fail(f"/{g} lacks {missing}")
            if extra:
                c.fail(f"/{g} has unexpected {extra}")
            groups[g] = {}
            for n in shapes:
                if n in names:
                    arr = np.asarray(f[g][n])
                    if arr.shape != shapes[n]:
                        c.fail(f"/{g}/{n} shape {arr.shape} != expected {shapes[n]}")
                    else:
                        groups[g][n] = arr
        if not c.ok:
            return c.finish()
        params, grads = groups["params"], groups["grads"]

    model, loss_ref = reference(cfg, params, tokens, targets, GEMM_INPUTS[args.precision])

    loss_rel = abs(loss_ours - loss_ref) / abs(loss_ref) if loss_ref != 0 else abs(loss_ours - loss_ref)
    loss_ok = abs(loss_ours - loss_ref) <= args.tol * abs(loss_ref)
    print(f"{'loss':<28s} ours {loss_ours:.9g} ref {loss_ref:.9g} rel {loss_rel:.3e} "
          f"{'ok' if loss_ok else 'FAIL'}", file=out)
    if not loss_ok:
        c.ok = False

    print(f"{'name':<28s} {'shape':<16s} {'max|ref|':>11s} {'max|diff|':>11s} {'rel':>10s}", file=out)
    worst = 0.0
    for name, p in model.named_parameters():
        g_ref = p.grad.detach().numpy()
        g_ours = grads[name].astype(np.float64)
        extra_note = ""
        if name == "wte.weight":
            pad = g_ours[V:]
            if pad.size and not np.all(pad == 0):
                c.ok = False
                extra_note = f"  FAIL: padded rows [{V},{cfg.padded_vocab_size}) not zero " \
                             f"(max|.|={np.max(np.abs(pad)):.3e})"
            g_ours, g_ref = g_ours[:V], g_ref[:V]
        ref_max, diff, rel = refcheck.compare(g_ours, g_ref)
        good = diff <= args.tol * ref_max  # False for NaN
        if not good:
            c.ok = False
        worst = max(worst, rel) if np.isfinite(rel) else float("inf")
        print(f"{name:<28s} {str(tuple(p.shape)):<16s} {ref_max:11.4e} {diff:11.4e} {rel:10.3e}"
              f"{'' if good else '  FAIL'}{extra_note}", file=out)
    print(f"worst rel {worst:.3e} (tol {args.tol:g})", file=out)
    if args.precision != "fp32":
        # The rounding must show: the loss is further from the unrounded
        # reference. (The gradients are a poor judge: inputs a float32
        # rounding apart can round to bf16 values an ulp apart, so the
        # float32 and float64 rounded references themselves differ by up to
        # about 5e-3 of max|g|, which --tol must allow.)
        plain, loss_plain = reference(cfg, params, tokens, targets, None)
        off_plain, off_rounded = abs(loss_ours - loss_plain), abs(loss_ours - loss_ref)
        distinct = off_plain >= 3 * off_rounded
        print(f"loss from the unrounded reference {loss_plain:.9g}: |diff| {off_plain:.3e}, "
              f"{'ok' if distinct else 'FAIL'} (must be >= 3 x {off_rounded:.3e})", file=out)
        if not distinct:
            c.ok = False
    return c.finish()


GEMM_INPUTS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def reference(cfg, params, tokens, targets, gemm_inputs):
    """The float64 reference model with meshlm's parameters after one
    forward and backward of (tokens, targets), and its loss."""
    torch.manual_seed(0)
    model = GPT2(cfg, gemm_inputs=gemm_inputs).double()
    model.load_from_arrays(params)
    model.zero_grad(set_to_none=True)
    _, loss = model(torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(targets.astype(np.int64)))
    loss.backward()
    return model, loss.item()


# ----------------------------------------------------------------------------
# self-test: dumps written from the reference model itself

def write_reference_dump(path, args, corrupt=None):
    """Writes a dump in meshlm's format from the float32 reference model.
    `corrupt` selects a deliberate defect (None = correct dump)."""
    V = args.vocab_size
    cfg = GPT2Config(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                     vocab_size=V, padded_vocab_size=padded_vocab(V), max_seq_len=2 * args.seq_len)
    torch.manual_seed(args.seed)
    # larger than GPT-2's 0.02 so that activations leave the near-linear regime
    # (GELU variants, LayerNorm eps etc. then change the gradients visibly)
    model = GPT2(cfg).init_weights(seed=args.seed, std=0.2)
    with torch.no_grad():  # non-trivial LayerNorm parameters and biases
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    g = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, V, (args.batch, args.seq_len), generator=g, dtype=torch.int32)
    targets = torch.randint(0, V, (args.batch, args.seq_len), generator=g, dtype=torch.int32)
    _, loss = model(tokens, targets)
    loss.backward()
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    grads = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()}
    loss_v = loss.item()
    C = args.n_embd
    if corrupt == "grad":  # one element of one gradient off by 0.1%
        gq = grads["h.0.attn.c_attn.weight"]
        i = np.unravel_index(np.argmax(np.abs(gq)), gq.shape)
        gq[i] *= 1.001
    elif corrupt == "qk_swap":  # q and k gradient blocks swapped
        gq = grads[f"h.{args.n_layer - 1}.attn.c_attn.bias"]
        gq[:C], gq[C:2 * C] = gq[C:2 * C].copy(), gq[:C].copy()
    elif corrupt == "pad":  # gradient leaking into a padded wte row
        grads["wte.weight"][-1, 0] = 1e-12
    elif corrupt == "loss":
        loss_v *= 1.001
    elif corrupt == "missing":
        del grads["ln_f.bias"]
    elif corrupt == "extra":
        params["lm_head.weight"] = params["wte.weight"]
        grads["lm_head.weight"] = grads["wte.weight"]
    elif corrupt == "nan":
        grads["h.0.mlp.c_fc.bias"][0] = np.nan
    with h5py.File(path, "w") as f:
        for k, v in [("n_layer", cfg.n_layer), ("n_head", cfg.n_head), ("n_embd", cfg.n_embd),
                     ("vocab_size", V), ("padded_vocab_size", cfg.padded_vocab_size),
                     ("max_seq_len", cfg.max_seq_len), ("batch", args.batch), ("seq_len", args.seq_len)]:
            f.attrs[k] = np.int64(v)
        f.attrs["loss"] = np.float64(loss_v)
        f["tokens"] = tokens.numpy()
        f["targets"] = targets.numpy()
        for n, a in params.items():
            f[f"params/{n}"] = a.astype(np.float32)
        for n, a in grads.items():
            f[f"grads/{n}"] = a.astype(np.float32)


def self_test(args):
    variants = [None, "grad", "qk_swap", "pad", "loss", "missing", "extra", "nan"]
    if padded_vocab(args.vocab_size) == args.vocab_size:
        variants.remove("pad")  # no padded rows to corrupt
    return refcheck.self_test(variants,
                              lambda path, corrupt: write_reference_dump(path, args, corrupt),
                              lambda path, out: check_dump(path, args, out=out),
                              dump_name="dump.h5", width=8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tool", nargs="?", help="meshlm tool executable (runs `TOOL grads OUT.h5 ...`)")
    ap.add_argument("--n_layer", type=int, default=2)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=64)
    ap.add_argument("--vocab_size", type=int, default=100)
    ap.add_argument("--seq_len", type=int, default=16)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--precision", choices=sorted(GEMM_INPUTS), default="fp32",
                    help="meshlm's train.precision, and the rounding of the reference's products")
    ap.add_argument("--self-test", action="store_true",
                    help="check the checker against dumps written by the reference model")
    args = ap.parse_args()

    if args.self_test:
        sys.exit(0 if self_test(args) else 1)
    if not args.tool:
        ap.error("TOOL is required (or --self-test)")

    options = ["--n_layer", str(args.n_layer), "--n_head", str(args.n_head), "--n_embd", str(args.n_embd),
               "--vocab_size", str(args.vocab_size), "--seq_len", str(args.seq_len),
               "--batch", str(args.batch), "--seed", str(args.seed), "--precision", args.precision]
    ok = refcheck.run_tool(args.tool, "grads", "grads.h5", options, lambda path: check_dump(path, args))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
