#!/usr/bin/python3
"""Cross-check meshlm's AdamW step (with global-norm gradient clipping)
against torch.optim.AdamW in float64.

Usage:
  check_adamw.py TOOL [--tol 1e-5]
  check_adamw.py --self-test

Runs `TOOL adamw OUT.h5`, which writes:

  root attributes: beta1, beta2, eps, weight_decay, grad_clip (float; 0 = no
                   clipping), n_steps (int)
  /params_before/<name>  float32, initial values
  /step_<k> (k = 0..n_steps-1), attributes lr (learning rate of the step) and
            grad_norm (meshlm's global gradient norm before clipping)
  /step_<k>/grads/<name> float32, the raw gradients given at that step
  /params_after/<name>   float32, values after the n_steps steps

A tensor whose dataset has ndim >= 2 is a matrix and gets decoupled weight
decay; every other tensor gets none. Per step the reference sets .grad,
takes the global norm (torch.nn.utils.clip_grad_norm_ when grad_clip > 0),
compares it with grad_norm (relative tolerance), sets the step's lr and steps
torch.optim.AdamW(betas=(beta1, beta2), eps). Finally, per tensor:
  max|after - after_ref| <= tol * max|after_ref| + 1e-7
Exit status 1 on any failure.

--self-test checks the checker without meshlm: it writes dumps from an
explicit float32 numpy AdamW (the textbook formulas, not torch's code), one
correct and several subtly wrong, and requires the first to pass and every
other to fail.
"""

import argparse
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refcheck  # noqa: E402

ABS_FLOOR = 1e-7


def check_dump(path, tol, norm_tol, out=sys.stdout):
    c = refcheck.Checks(out)

    with h5py.File(path, "r") as f:
        need = ["beta1", "beta2", "eps", "weight_decay", "grad_clip", "n_steps"]
        missing = [a for a in need if a not in f.attrs]
        if missing:
            c.fail(f"missing root attributes {missing}")
            return c.finish()
        beta1, beta2, eps, wd, clip = (float(refcheck.scalar(f.attrs[k]))
                                       for k in ["beta1", "beta2", "eps", "weight_decay", "grad_clip"])
        n_steps = int(refcheck.scalar(f.attrs["n_steps"]))
        print(f"beta1={beta1:g} beta2={beta2:g} eps={eps:g} weight_decay={wd:g} "
              f"grad_clip={clip:g} n_steps={n_steps}", file=out)
        for g in ["params_before", "params_after"]:
            if g not in f:
                c.fail(f"/{g} missing")
        if not c.ok:
            return c.finish()
        before = {n: np.asarray(f["params_before"][n]) for n in f["params_before"]}
        after = {n: np.asarray(f["params_after"][n]) for n in f["params_after"]}
        names = sorted(before)
        if not names:
            c.fail("/params_before is empty")
        if set(after) != set(before):
            c.fail(f"params_after names differ: missing {sorted(set(before) - set(after))} "
                   f"extra {sorted(set(after) - set(before))}")
        for n in names:
            if n in after and after[n].shape != before[n].shape:
                c.fail(f"{n}: params_after shape {after[n].shape} != params_before {before[n].shape}")
        steps = []
        for k in range(n_steps):
            s = f"step_{k}"
            if s not in f or "grads" not in f[s]:
                c.fail(f"/{s}/grads missing")
                continue
            if "lr" not in f[s].attrs or "grad_norm" not in f[s].attrs:
                c.fail(f"/{s} lacks attribute lr or grad_norm")
                continue
            grads = {n: np.asarray(f[s]["grads"][n]) for n in f[s]["grads"]}
            if set(grads) != set(before):
                c.fail(f"/{s}/grads names differ: missing {sorted(set(before) - set(grads))} "
                       f"extra {sorted(set(grads) - set(before))}")
                continue
            for n in names:
                if grads[n].shape != before[n].shape:
                    c.fail(f"/{s}/grads/{n} shape {grads[n].shape} != {before[n].shape}")
            steps.append((float(refcheck.scalar(f[s].attrs["lr"])),
                          float(refcheck.scalar(f[s].attrs["grad_norm"])), grads))
        extra_steps = [k for k in f.keys() if k.startswith("step_") and
                       not (k[5:].isdigit() and int(k[5:]) < n_steps)]
        if extra_steps:
            c.fail(f"unexpected groups {extra_steps} (n_steps={n_steps})")
        if not c.ok:
            return c.finish()

    params = {n: torch.nn.Parameter(torch.from_numpy(before[n].astype(np.float64))) for n in names}
    plist = [params[n] for n in names]
    decay = [params[n] for n in names if before[n].ndim >= 2]
    no_decay = [params[n] for n in names if before[n].ndim < 2]
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": wd})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(beta1, beta2), eps=eps)

    for k, (lr, norm_ours, grads) in enumerate(steps):
        for n in names:
            params[n].grad = torch.from_numpy(grads[n].astype(np.float64))
        if clip > 0:
            norm_ref = float(torch.nn.utils.clip_grad_norm_(plist, clip))
        else:
            norm_ref = float(torch.sqrt(sum((p.grad ** 2).sum() for p in plist)))
        rel = abs(norm_ours - norm_ref) / norm_ref if norm_ref > 0 else abs(norm_ours - norm_ref)
        good = abs(norm_ours - norm_ref) <= norm_tol * norm_ref  # False for NaN
        if not good:
            c.ok = False
        print(f"step {k}: lr {lr:.6g} grad_norm ours {norm_ours:.9g} ref {norm_ref:.9g} rel {rel:.3e}"
              f"{' clipped' if clip > 0 and norm_ref > clip else ''}{'' if good else '  FAIL'}", file=out)
        for gr in opt.param_groups:
            gr["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)

    print(f"{'name':<28s} {'shape':<14s} {'wd':>3s} {'max|ref|':>11s} {'max|diff|':>11s} {'rel':>10s}"
          f" {'max|dref|':>11s} {'rel(d)':>10s}", file=out)
    for n in names:
        ref = params[n].detach().numpy()
        ours = after[n].astype(np.float64)
        ref_max, diff, rel = refcheck.compare(ours, ref)
        # the update itself (after - before), for information
        dref = float(np.max(np.abs(ref - before[n]))) if ref.size else 0.0
        rel_d = refcheck.ratio(diff, dref)
        good = diff <= tol * ref_max + ABS_FLOOR
        if not good:
            c.ok = False
        print(f"{n:<28s} {str(before[n].shape):<14s} {'yes' if before[n].ndim >= 2 else 'no':>3s} "
              f"{ref_max:11.4e} {diff:11.4e} {rel:10.3e} {dref:11.4e} {rel_d:10.3e}"
              f"{'' if good else '  FAIL'}", file=out)
    return c.finish()


# ----------------------------------------------------------------------------
# self-test: dumps written by a float32 numpy AdamW

def write_reference_dump(path, corrupt=None, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"wte.weight": (40, 16), "h.0.attn.c_attn.weight": (48, 16), "h.0.attn.c_attn.bias": (48,),
              "h.0.ln_1.weight": (16,), "conv": (3, 4, 5), "ln_f.bias": (16,)}
    beta1, beta2, eps, wd, clip, n_steps = 0.9, 0.95, 1e-8, 0.1, 1.0, 6
    params = {n: (rng.standard_normal(s) * 0.5).astype(np.float32) for n, s in shapes.items()}
    params["h.0.ln_1.weight"] += 1.0
    before = {n: p.copy() for n, p in params.items()}
    m = {n: np.zeros_like(p) for n, p in params.items()}
    v = {n: np.zeros_like(p) for n, p in params.items()}
    steps = []
    for k in range(n_steps):
        lr = np.float32(1e-2 * (k + 1) / n_steps if k < 3 else 1e-2 * 0.5 ** (k - 2))
        scale = [0.01, 0.3, 0.02, 0.2, 0.005, 0.1][k]  # norms on both sides of the clip threshold
        grads = {n: (rng.standard_normal(s) * scale).astype(np.float32) for n, s in shapes.items()}
        grads["conv"][0, 0, 0] = 0.0
        norm = np.float32(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())))
        c = np.float32(min(1.0, clip / norm)) if clip > 0 else np.float32(1.0)
        if corrupt == "no_clip":
            c = np.float32(1.0)
        t = k + 1
        for n in shapes:
            g = grads[n] * c
            if corrupt == "coupled_wd" and params[n].ndim >= 2:  # L2 in the gradient (Adam, not AdamW)
                g = g + np.float32(wd) * params[n]
            m[n] = beta1 * m[n] + (1 - beta1) * g
            v[n] = beta2 * v[n] + (1 - beta2) * g * g
            mhat = m[n] / (1 - beta1 ** t)
            vhat = v[n] / (1 - beta2 ** (t if corrupt != "bias_corr" else 1))
            decay = wd if params[n].ndim >= 2 or corrupt == "wd_all" else 0.0
            if corrupt == "coupled_wd":
                decay = 0.0
            params[n] = (params[n] * (1 - lr * decay) - lr * mhat / (np.sqrt(vhat) + eps)).astype(np.float32)
        reported = norm * c if corrupt == "norm_after_clip" else norm
        steps.append((lr, reported, grads))
    if corrupt == "tiny":  # one element off by 2 updates' worth
        params["h.0.attn.c_attn.bias"][3] += 2e-5
    with h5py.File(path, "w") as f:
        for key, val in [("beta1", beta1), ("beta2", beta2), ("eps", eps), ("weight_decay", wd),
                         ("grad_clip", clip)]:
            f.attrs[key] = np.float64(val)
        f.attrs["n_steps"] = np.int64(n_steps)
        for n, p in before.items():
            f[f"params_before/{n}"] = p
        for k, (lr, norm, grads) in enumerate(steps):
            g = f.create_group(f"step_{k}")
            g.attrs["lr"] = np.float64(lr)
            g.attrs["grad_norm"] = np.float64(norm)
            for n, a in grads.items():
                if corrupt == "missing" and k == 2 and n == "conv":
                    continue
                g[f"grads/{n}"] = a
        for n, p in params.items():
            f[f"params_after/{n}"] = p


def self_test(tol, norm_tol):
    variants = [None, "no_clip", "bias_corr", "wd_all", "coupled_wd", "norm_after_clip", "tiny", "missing"]
    return refcheck.self_test(variants,
                              lambda path, corrupt: write_reference_dump(path, corrupt),
                              lambda path, out: check_dump(path, tol, norm_tol, out=out),
                              dump_name="adamw.h5", width=15)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tool", nargs="?", help="meshlm tool executable (runs `TOOL adamw OUT.h5`)")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--norm_tol", type=float, default=None,
                    help="relative tolerance on the gradient norm (default: --tol)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the checker against dumps written by a numpy AdamW")
    args = ap.parse_args()
    norm_tol = args.tol if args.norm_tol is None else args.norm_tol

    if args.self_test:
        sys.exit(0 if self_test(args.tol, norm_tol) else 1)
    if not args.tool:
        ap.error("TOOL is required (or --self-test)")

    ok = refcheck.run_tool(args.tool, "adamw", "adamw.h5", [],
                           lambda path: check_dump(path, args.tol, norm_tol))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
