#!/usr/bin/python3
"""quant.base = DIR, a Hugging Face GPT-2 directory, against the same
weights in one safetensors file.

  check_hf_dir.py --mpiexec "mpiexec -n 1 ..." --meshlm BUILD/meshlm

A random GPT-2 (L=2, C=32, NH=2, V=256, 64 positions) is written three
ways: one .safetensors file (GPT2Model's names), a directory with config.json
and model.safetensors, and a directory whose index splits the tensors over
two shards (GPT2LMHeadModel's "transformer." names, one shard bf16). Then:

  * full training from each, 3 steps: the directories' losses are the same
    bits as the file's (the bf16 shard's values are bf16 in all three), with
    no [model] shape key given for the directories (config.json's are
    taken), and with keys that agree; model.max_seq_len below n_positions;
  * LoRA on an NF4 base from the sharded directory runs and caches the base;
  * bad directories and keys, each a clear error naming the file and the
    key or tensor, exit 1 and nothing written: no config.json, malformed
    JSON, an unknown model_type, a shape key that is not a positive integer,
    a [model] key that disagrees, an activation meshlm does not compute, an
    index naming a file outside DIR (../x, an absolute path, a symbolic link
    out of DIR), a missing shard, a tensor in two shards, an index that puts
    a tensor in the wrong shard, a truncated shard, an I64 tensor.
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import write_safetensors  # noqa: E402

L, NH, C, V, NPOS = 2, 2, 32, 256, 64

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def gpt2_tensors(seed):
    """GPT2Model's state dict (Conv1D weights (in, out)), float32 numpy."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=g) * 0.05).numpy()  # noqa: E731
    t = {"wte.weight": r(V, C), "wpe.weight": r(NPOS, C), "ln_f.weight": 1 + r(C), "ln_f.bias": r(C)}
    for i in range(L):
        h = f"h.{i}."
        t[h + "ln_1.weight"], t[h + "ln_1.bias"] = 1 + r(C), r(C)
        t[h + "ln_2.weight"], t[h + "ln_2.bias"] = 1 + r(C), r(C)
        t[h + "attn.c_attn.weight"], t[h + "attn.c_attn.bias"] = r(C, 3 * C), r(3 * C)
        t[h + "attn.c_proj.weight"], t[h + "attn.c_proj.bias"] = r(C, C), r(C)
        t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = r(C, 4 * C), r(4 * C)
        t[h + "mlp.c_proj.weight"], t[h + "mlp.c_proj.bias"] = r(4 * C, C), r(C)
    return t


def bf16_round(a):
    return torch.from_numpy(a).to(torch.bfloat16).to(torch.float32).numpy()


def write_st(path, tensors, dtypes=None):
    write_safetensors(path, {k: (v, (dtypes or {}).get(k, "F32")) for k, v in tensors.items()})


def config(**change):
    c = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_head": NH,
         "n_embd": C, "vocab_size": V, "n_positions": NPOS, "n_ctx": NPOS,
         "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    c.update(change)
    return c


def write_dir(d, tensors, shards=1, cfg=None, prefix="", dtypes=None, index_edit=None):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(cfg if isinstance(cfg, str) else json.dumps(cfg or config()))
    named = {prefix + k: v for k, v in tensors.items()}
    if shards == 1:
        write_st(os.path.join(d, "model.safetensors"), named, dtypes)
        return
    names = sorted(named)
    parts = [names[i::shards] for i in range(shards)]
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {}
    for part, file in zip(parts, files):
        write_st(os.path.join(d, file), {k: named[k] for k in part}, dtypes)
        weight_map.update({k: file for k in part})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    if index_edit:
        index_edit(index)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)


class Runner:
    def __init__(self, mpiexec, meshlm, scratch):
        self.mpiexec, self.meshlm, self.scratch = mpiexec, meshlm, scratch
        self.cfg = os.path.join(scratch, "run.cfg")
        with open(self.cfg, "w") as f:
            f.write("[model]\nseq_len = 32\n[train]\nsteps = 3\nbatch_size = 2\nmicro_batch_size = 1\n"
                    "lr = 1e-3\nwarmup_steps = 1\nlog_every = 1\nseed = 7\n"
                    f"[data]\npath = {scratch}/gpl3.h5\ntokenize_from = /usr/share/common-licenses/GPL-3\n")
        self.n = 0

    def train(self, *args):
        self.n += 1
        out = os.path.join(self.scratch, f"out{self.n}")
        r = subprocess.run(self.mpiexec + [self.meshlm, "train", self.cfg, f"--output.dir={out}"] + list(args),
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE"))
        return r, out

    def losses(self, *args):
        r, out = self.train(*args)
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-2000:])
            return None
        with h5py.File(os.path.join(out, "run.h5"), "r") as f:
            return np.asarray(f["metrics/loss"][:], dtype=np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--meshlm", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as s:
        run = Runner(shlex.split(a.mpiexec), a.meshlm, s)
        t = gpt2_tensors(3)
        # The bf16 shard's tensors: bf16 values in every form.
        bf16 = {k for k in t if k.startswith("h.1.")}
        for k in bf16:
            t[k] = bf16_round(t[k])
        shape = [f"--model.n_layer={L}", f"--model.n_head={NH}", f"--model.n_embd={C}",
                 f"--model.vocab_size={V}", f"--model.max_seq_len={NPOS}"]
        file = os.path.join(s, "base.safetensors")
        write_safetensors(file, t)
        one, two = os.path.join(s, "one"), os.path.join(s, "two")
        write_dir(one, t)
        write_dir(two, t, shards=2, prefix="transformer.",
                  dtypes={"transformer." + k: "BF16" for k in bf16})

        want = run.losses("--finetune.mode=full", f"--quant.base={file}", *shape)
        check(want is not None and len(want) == 3, "full training from the file")
        for d, args, what in ((one, [], "model.safetensors, no [model] key"),
                              (two, [], "two shards of an index, one bf16, prefixed names"),
                              (two, shape, "the same with every shape key given and agreeing")):
            got = run.losses("--finetune.mode=full", f"--quant.base={d}", *args)
            check(got is not None and want is not None and got.tobytes() == want.tobytes(),
                  f"{what}: the file's losses, bit for bit ({got} vs {want})")
        got = run.losses("--finetune.mode=full", f"--quant.base={two}", "--model.max_seq_len=32")
        check(got is not None, "model.max_seq_len below n_positions: the first rows of wpe")
        cache = os.path.join(s, "cache.h5")
        got = run.losses("--finetune.mode=lora", "--quant.type=nf4", f"--quant.base={two}",
                         f"--quant.cache={cache}")
        check(got is not None and os.path.exists(cache) and np.all(np.isfinite(got)),
              "LoRA on an NF4 base from the sharded directory, its cache written")

        def bad(name, expect, make=None, args=()):
            d = os.path.join(s, "bad_" + name)
            if make:
                make(d)
            r, out = run.train("--finetune.mode=full", f"--quant.base={d}", *args)
            msg = r.stdout + r.stderr
            check(r.returncode != 0 and expect in msg and not os.path.exists(out),
                  f"{name}: exit {r.returncode}, '{expect}' in the message, nothing written"
                  + ("" if expect in msg else f"\n{msg[-1500:]}"))

        def dir_with(**kw):
            return lambda d: write_dir(d, t, **kw)

        def no_config(d):
            write_dir(d, t)
            os.remove(os.path.join(d, "config.json"))

        def truncated(d):
            write_dir(d, t, shards=2)
            p = os.path.join(d, "model-00002-of-00002.safetensors")
            with open(p, "r+b") as f:
                f.truncate(os.path.getsize(p) - 100)

        def symlink_out(d):
            write_dir(d, t, shards=2)
            outside = os.path.join(s, "elsewhere.safetensors")
            shutil.move(os.path.join(d, "model-00002-of-00002.safetensors"), outside)
            os.symlink(outside, os.path.join(d, "model-00002-of-00002.safetensors"))

        def both(d):
            write_dir(d, t, shards=2)
            p = os.path.join(d, "model-00001-of-00002.safetensors")
            first = sorted(t)[1]  # a tensor of the second shard
            write_safetensors(p, {**{k: t[k] for k in sorted(t)[0::2]}, first: t[first]})

        def edit(fn):
            return lambda d: write_dir(d, t, shards=2, index_edit=fn)

        k0 = sorted(t)[0]
        bad("no_config", "config.json': no such file", no_config)
        bad("malformed", "is not valid JSON", dir_with(cfg='{"model_type": "gpt2",'))
        bad("model_type", "model_type 'bert' is not one meshlm trains", dir_with(cfg=config(model_type="bert")))
        bad("n_layer_text", "'n_layer' must be a positive integer", dir_with(cfg=config(n_layer="two")))
        bad("activation", "is not GPT-2's tanh GELU", dir_with(cfg=config(activation_function="relu")))
        bad("disagreeing_key", f"model.n_layer = 3, but quant.base's", dir_with(), ["--model.n_layer=3"])
        bad("dot_dot", "lies outside", edit(lambda x: x["weight_map"].__setitem__(k0, "../base.safetensors")))
        bad("absolute", "not a file name inside the directory",
            edit(lambda x: x["weight_map"].__setitem__(k0, os.path.join(s, "base.safetensors"))))
        bad("symlink_out", "lies outside", symlink_out)
        bad("missing_shard", "which does not exist",
            edit(lambda x: x["weight_map"].__setitem__(k0, "model-00009-of-00009.safetensors")))
        bad("in_two_shards", "is in both", both)
        bad("wrong_shard", "which does not hold it",
            edit(lambda x: x["weight_map"].__setitem__(k0, "model-00002-of-00002.safetensors")))
        bad("truncated", "model-00002-of-00002.safetensors", truncated)
        bad("int64", "cannot read as float", dir_with(dtypes={"wpe.weight": "I64"}))
        bad("nothing", "holds neither model.safetensors nor", lambda d: os.makedirs(d)
            or open(os.path.join(d, "config.json"), "w").write(json.dumps(config())))
    print("PASS" if not failures else f"FAIL ({len(failures)})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
