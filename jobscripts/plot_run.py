#!/usr/bin/python3
"""Plots of a finished (or running, or killed) meshlm run, for a login node
with Debian's python3-h5py and python3-matplotlib: no display needed (Agg),
nothing of meshlm imported; it reads the run log and checkpoints as
docs/formats.md describes them ("Run log", "Checkpoints").

usage: plot_run.py OUT_DIR_OR_RUN_H5 [--checkpoint FILE ...] [-o plots/]

writes into the output directory (created when missing):
  loss_lr.png        loss, learning rate and gradient norm over the logged steps;
                     the held-out loss (metrics/val_loss at val_step, train.eval_every)
                     on the loss axis when the run evaluated
  tokens_per_s.png   training tokens per second over the logged steps
  memory.png         per rank: the memory model's prediction beside the tracked
                     peak, per category (stacked), and the process's predicted
                     peak beside VmHWM (rss_peak_bytes) and PSS from /proc
  timing.png         seconds per section (/timing/<section>/seconds)
  norms_<name>.png   with --checkpoint: the L2 norm of every tensor of /params
  norms_over_checkpoints.png
                     with two checkpoints or more: the norm of each layer's
                     parameters (embeddings, h.<l>, ln_f) against the step

A plot whose data the log does not hold yet (memory and timing are written
at the end of a run) is left out, saying so.

  python3 jobscripts/plot_run.py out/demo -o plots/
  python3 jobscripts/plot_run.py out/demo/run.h5 --checkpoint out/demo/checkpoints/step_*.h5
"""
import argparse
import math
import os
import re
import sys

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

MIB = 1024.0 * 1024.0
# Tensors are read this many bytes of rows at a time: a checkpoint of a large
# model never has to fit in a login node's memory.
BLOCK_BYTES = 64 << 20
SECTIONS = ["forward", "backward", "tp-comm", "pp-comm", "dp-comm", "optimizer", "data",
            "checkpoint", "other"]


def open_h5(path):
    """Read-only, without HDF5's file lock, so a running job's log opens."""
    try:
        return h5py.File(path, "r", locking=False)
    except TypeError:  # h5py older than 3.5
        return h5py.File(path, "r")


def save(fig, out_dir, name):
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path}")


def plot_metrics(f, out_dir):
    if "metrics/step" not in f or len(f["metrics/step"]) == 0:
        print("no logged steps in /metrics: loss_lr.png and tokens_per_s.png left out")
        return
    step = f["metrics/step"][...]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    for ax, key, label in zip(axes, ("loss", "lr", "grad_norm"),
                              ("training loss", "learning rate", "gradient norm (before clipping)")):
        ax.plot(step, f["metrics/" + key][...], marker=".", lw=1, label=label)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    # Evaluations (train.eval_every): the held-out loss on the same axis.
    if "metrics/val_step" in f and len(f["metrics/val_step"]) > 0:
        val_step = f["metrics/val_step"][...]
        axes[0].plot(val_step, f["metrics/val_loss"][...], marker="o", lw=1,
                     label="validation loss (held-out)")
        axes[0].set_ylabel("loss")
        axes[0].legend(fontsize=8)
        print(f"val_loss: {len(val_step)} evaluations plotted with the training loss")
    axes[0].set_title("loss, learning rate and gradient norm per logged step")
    axes[-1].set_xlabel("step")
    save(fig, out_dir, "loss_lr.png")

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(step, f["metrics/tokens_per_s"][...], marker=".", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training tokens / s")
    ax.set_title("throughput per logged step")
    ax.grid(alpha=0.3)
    save(fig, out_dir, "tokens_per_s.png")


def plot_memory(f, out_dir):
    if "memory" not in f:
        print("no /memory in the log (written at the end of a run): memory.png left out")
        return
    mem = f["memory"]
    cats = [c for c in mem if c not in ("process", "phases", "node")
            and "predicted_bytes" in mem[c] and "peak_bytes" in mem[c]]
    proc = mem["process"] if "process" in mem else None
    n_ranks = len(mem[cats[0]]["peak_bytes"]) if cats else len(proc["rss_peak_bytes"])
    ranks = np.arange(n_ranks)
    fig, axes = plt.subplots(2, 1, figsize=(max(7, 1.2 * n_ranks + 3), 9))

    # Tracked memory: prediction (left bar) and measured peak (right bar) per
    # rank, each stacked by category.
    ax = axes[0]
    width = 0.38
    colors = plt.get_cmap("tab10")
    bottom_p = np.zeros(n_ranks)
    bottom_m = np.zeros(n_ranks)
    for i, c in enumerate(cats):
        p = mem[c]["predicted_bytes"][...] / MIB
        m = mem[c]["peak_bytes"][...] / MIB
        if not (p.any() or m.any()):
            continue
        ax.bar(ranks - width / 2, p, width, bottom=bottom_p, color=colors(i % 10), label=c,
               edgecolor="black", linewidth=0.3)
        ax.bar(ranks + width / 2, m, width, bottom=bottom_m, color=colors(i % 10), hatch="//",
               edgecolor="black", linewidth=0.3)
        bottom_p += p
        bottom_m += m
    ax.set_xticks(ranks)
    ax.set_xticklabels([f"rank {r}" for r in ranks])
    ax.set_ylabel("MiB")
    ax.set_title("tracked memory per rank: predicted (left) | measured peak (right, hatched)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(axis="y", alpha=0.3)

    # The process as /proc sees it.
    ax = axes[1]
    series = []
    if proc is not None:
        for key, label in (("predicted_peak_bytes", "predicted peak"),
                           ("rss_peak_bytes", "VmHWM (peak RSS)"),
                           ("rss_bytes", "RSS at the end"), ("pss_bytes", "PSS at the end")):
            if key in proc:
                series.append((label, proc[key][...] / MIB))
    w = 0.8 / max(len(series), 1)
    for i, (label, v) in enumerate(series):
        ax.bar(ranks - 0.4 + w * (i + 0.5), v, w, label=label)
    if proc is not None and "error" in proc:
        err = proc["error"][...]
        top = max(v.max() for _, v in series) if series else 0
        for r in ranks:
            ax.text(r, top * 1.03, f"{100 * err[r]:+.1f}%", ha="center", fontsize=8)
        ax.set_ylim(0, top * 1.12)
    ax.set_xticks(ranks)
    ax.set_xticklabels([f"rank {r}" for r in ranks])
    ax.set_ylabel("MiB")
    ax.set_title("process memory per rank (/proc); above: (predicted - VmHWM) / VmHWM")
    if series:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save(fig, out_dir, "memory.png")


def plot_timing(f, out_dir):
    if "timing" not in f:
        print("no /timing in the log (written at the end of a run): timing.png left out")
        return
    # docs/formats.md's order of the sections, then any other.
    names = sorted((s for s in f["timing"] if "seconds" in f["timing"][s]),
                   key=lambda s: (SECTIONS.index(s) if s in SECTIONS else len(SECTIONS), s))
    sections = [(s, float(f["timing"][s]["seconds"][()])) for s in names]
    total = sum(v for _, v in sections)
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(sections) + 1.5))
    names = [s for s, _ in sections]
    vals = [v for _, v in sections]
    ax.barh(names, vals)
    ax.invert_yaxis()
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.3f} s ({100 * v / total:.1f}%)" if total > 0 else f" {v:.3f} s",
                va="center", fontsize=8)
    ax.set_xlabel("seconds (rank 0)")
    ax.set_title(f"time per section, {total:.2f} s in all")
    ax.set_xlim(0, max(vals + [1e-9]) * 1.35)
    save(fig, out_dir, "timing.png")


def tensor_norm(ds):
    """L2 norm of a dataset in float64, a block of rows at a time."""
    if ds.ndim == 0:
        return float(abs(ds[()]))
    row = int(np.prod(ds.shape[1:])) if ds.ndim > 1 else 1
    per = max(1, BLOCK_BYTES // (8 * max(row, 1)))
    s = 0.0
    for r0 in range(0, ds.shape[0], per):
        x = ds[r0:r0 + per].astype(np.float64)
        s += float(np.sum(x * x))
    return math.sqrt(s)


def layer_of(name):
    m = re.match(r"^(h\.\d+)\.", name)
    if m:
        return m.group(1)
    if name.startswith(("wte.", "wpe.")):
        return "embeddings"
    return name.split(".")[0]


def layer_key(layer):
    if layer == "embeddings":
        return (-1, "")
    if layer.startswith("h."):
        return (int(layer[2:]), "")
    return (1 << 30, layer)


def checkpoint_norms(path):
    """(step, [(tensor name, norm)]) of a checkpoint's /params."""
    with open_h5(path) as f:
        if "params" not in f:
            raise SystemExit(f"{path}: no /params group (a LoRA checkpoint keeps /lora only)")
        step = None
        if "meta" in f and "step" in f["meta"].attrs:
            step = int(f["meta"].attrs["step"])
        names = []
        f["params"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        return step, [(n, tensor_norm(f["params"][n])) for n in names]


def plot_checkpoints(paths, out_dir):
    per_ckpt = []
    for path in paths:
        step, norms = checkpoint_norms(path)
        stem = os.path.splitext(os.path.basename(path))[0]
        per_ckpt.append((stem, step, norms))
        fig, ax = plt.subplots(figsize=(8, 0.16 * len(norms) + 1.5))
        ax.barh([n for n, _ in norms], [v for _, v in norms])
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.tick_params(axis="y", labelsize=6)
        ax.set_xlabel("L2 norm")
        ax.set_title(f"{os.path.basename(path)}: /params norms"
                     + (f" (step {step})" if step is not None else ""))
        ax.grid(axis="x", alpha=0.3)
        save(fig, out_dir, f"norms_{stem}.png")
    if len(per_ckpt) < 2:
        return
    per_ckpt.sort(key=lambda c: (c[1] is None, c[1] if c[1] is not None else 0))
    xs = [c[1] if c[1] is not None else i for i, c in enumerate(per_ckpt)]
    layers = {}
    for i, (_, _, norms) in enumerate(per_ckpt):
        for n, v in norms:
            layers.setdefault(layer_of(n), [0.0] * len(per_ckpt))[i] += v * v
    fig, ax = plt.subplots(figsize=(8, 5))
    for layer in sorted(layers, key=layer_key):
        ax.plot(xs, np.sqrt(layers[layer]), marker="o", label=layer)
    ax.set_xlabel("step")
    ax.set_ylabel("L2 norm of the layer's parameters")
    ax.set_title("parameter norms per layer across checkpoints")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    save(fig, out_dir, "norms_over_checkpoints.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="the run's output directory (output.dir) or its run.h5")
    ap.add_argument("--checkpoint", nargs="+", default=[], metavar="FILE",
                    help="checkpoint files whose /params norms to plot")
    ap.add_argument("-o", "--out", default="plots", help="output directory (default plots/)")
    a = ap.parse_args()
    log = os.path.join(a.run, "run.h5") if os.path.isdir(a.run) else a.run
    if not os.path.exists(log):
        sys.exit(f"plot_run.py: {log}: no such file")
    os.makedirs(a.out, exist_ok=True)
    with open_h5(log) as f:
        plot_metrics(f, a.out)
        plot_memory(f, a.out)
        plot_timing(f, a.out)
    plot_checkpoints(a.checkpoint, a.out)


if __name__ == "__main__":
    main()
