#!/usr/bin/python3
"""Hugging Face Llama directories: quant.base = DIR, `meshlm ckpt export` to a
directory and `meshlm ckpt import` of one, against the independent PyTorch
Llama (tests/torch/llama_torch.py, float64) and safetensors files written and
parsed here by hand.

usage: check_hf_llama.py --meshlm PATH --mpiexec "mpiexec -n 1 ..." --case CASE
                         [--mpiexec-many "mpiexec -n 8 ..."]

The model: a random Llama, L=2, C=64, NH=4, NKV=2, F=96, V=300 (meshlm pads
the vocabulary to 320 rows), rms_norm_eps 1e-5, rope_theta 500000, "llama3"
rope scaling (factor 8, low 1, high 4, original_max_position_embeddings 64),
max_position_embeddings 256, weights large enough that the loss is far from
log(V), every value a bf16 value. Step-1 losses come from a token file
(data.shuffle = false, train.lr = 1e-30: the loss of windows 0 .. B-1, B=4,
T=16) and the reference is Llama(cfg, params).loss on the same windows.

CASE:
  loss          the model written as a directory: config.json and three BF16
                shards named by model.safetensors.index.json ("model." names,
                lm_head.weight); meshlm train's step-1 loss with quant.base =
                DIR and no [model] shape key (only model.seq_len) equals the
                reference's within 1e-5 relative. A tied variant
                (tie_word_embeddings true, no lm_head tensor, one
                model.safetensors with unprefixed F32 names, rope_scaling null,
                num_key_value_heads 1) likewise. Every [model] key given and
                agreeing with config.json, or model.max_seq_len below
                max_position_embeddings: the same loss bits;
                original_max_position_embeddings 64.0 as 64; no
                num_key_value_heads with --model.n_kv_head=0. rope_scaling
                null beside transformers 5's rope_parameters of type llama3:
                the scaled model's loss bits. A snapshot of Hugging Face's
                download cache (each file a link to ../../blobs/<hash>): the
                directory's loss bits. A key that
                disagrees (n_kv_head, rope_theta, tie_word_embeddings,
                rope_factor, max_seq_len above max_position_embeddings) is an
                error naming the key, config.json and its value there, with no
                output directory written.
  export        full training from the directory, 2 steps, checkpoint.final;
                `ckpt export` of the final checkpoint with --dtype fp32
                --shard-mb 0.1 writes several shards: the index's weight_map
                names every tensor, only shards that exist and every shard,
                each shard holds exactly the tensors mapped to it, nothing else
                is in the directory; config.json (LlamaForCausalLM) has the
                model's values and torch_dtype float32; every tensor equals
                the checkpoint's /params bit for bit (embed_tokens and lm_head
                cut to vocab_size rows); the reference's loss on the exported
                tensors equals meshlm train's step-1 loss with quant.base = the
                export within 1e-5 relative. The default export (no --dtype) is
                BF16, torch's .to(torch.bfloat16) of /params bit for bit, with
                torch_dtype bfloat16. Exporting over a non-empty directory
                meshlm did not write fails naming it, every byte unchanged;
                re-exporting over meshlm's own export (other dtype, other shard
                count) replaces it, no stale shard left, the files meshlm does
                not write (tokenizer.json, a folder) kept as they were. A
                model with Llama 3's bos, eos (a list) and pad ids, trained
                at model.max_seq_len 128 of its 256 (full, and LoRA exported
                with --merge): the export's config.json has those ids and
                max_position_embeddings 256.
  import_export `ckpt import` of the BF16 sharded directory, then `ckpt export`
                (bf16, the default): per name the same dtype, shape and raw
                bytes as the input, and config.json's model values and token
                ids equal the input's; the imported checkpoint as quant.base with no
                [model] key (its /meta's taken), or with every one given,
                gives the same step-1 loss bits as the directory, one that
                disagrees with /meta is refused naming it, and a run that leaves out tie_word_embeddings or the
                rope keys, which the checkpoint's /meta records, takes /meta's
                values (the same bits) or is refused naming the key and the
                file, never a silently different model. The tied variant (F32,
                unprefixed) imports and exports --dtype fp32 to the same bytes
                under "model." names, without lm_head.weight.
  lora_merge    LoRA (quant.type nf4, rank 4, alpha 12, all seven targets)
                from the directory, 2 steps, checkpoint.final; `ckpt export
                --merge --dtype fp32 -o DIR`: the reference's loss on the
                merged weights equals meshlm's LoRA loss with the same adapters
                (a run started from them with finetune.adapters_from, 1 step,
                lr 1e-30) within 1e-5 relative; the adapters moved (B != 0).
  bad           each a clear error: exit status non-zero, a message naming the
                file and the key or tensor, no output directory (so no run.h5)
                written: config.json missing; malformed JSON; model_type
                "mistral"; hidden_act "gelu"; num_attention_heads not a
                multiple of num_key_value_heads; head_dim other than
                hidden_size / num_attention_heads; hidden_size not a
                multiple of num_attention_heads (with a head_dim); attention_bias true;
                rope_scaling of rope_type "yarn"; q_proj of a wrong shape;
                intermediate_size 128 against tensors of 96; a missing tensor;
                a tensor in two shards; an index naming ../x.safetensors (an
                existing file), an absolute path, a symbolic link out of DIR, a
                shard that does not exist; a NaN (named by the file's tensor
                name, row and column); model.safetensors a link out of
                DIR; a snapshot of the download cache (DIR = .../snapshots/REV)
                linking a shard to another repository's blobs; a truncated shard; an F8_E4M3 and an
                I64 tensor; a [model] key that disagrees (model.n_layer = 3).
                Tensor errors name DIR and the tensor, config errors
                DIR/config.json and the key, index errors the index file.
  layouts       inputs/llama-tiny.cfg with quant.base = a directory of its
                shape (two BF16 shards, untied): 6 steps on one rank and on
                dp 2 x tp 2 x pp 2 (--mpiexec-many, 8 ranks), the losses within
                1e-5; LoRA on an NF4 base of it (quant.cache) likewise, with
                the 8 ranks as two nodes of four: the quantized base held once
                per node (memory/quantized of run.h5: ranks 0 and 4 only, each
                the one-rank run's bytes).
Exit status 1 on any failure.
"""
import argparse
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_torch  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402

L, C, NH, NKV, F, V, T, B = 2, 64, 4, 2, 96, 300, 16, 4
NPOS = 256
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 64}
# config.json keys that describe the model (compared between input and export).
MODEL_KEYS = ("model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "hidden_size", "intermediate_size", "vocab_size", "max_position_embeddings",
              "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings", "hidden_act")
TOL = 1e-5
# Every [model] key of the model, as the run names them.
MODEL_ARGS = ["--model.arch=llama", f"--model.n_layer={L}", f"--model.n_head={NH}", f"--model.n_kv_head={NKV}",
              f"--model.n_embd={C}", f"--model.vocab_size={V}", f"--model.intermediate_size={F}",
              f"--model.max_seq_len={NPOS}", "--model.norm_eps=1e-5", "--model.rope_theta=500000",
              "--model.rope_factor=8", "--model.rope_low_freq_factor=1", "--model.rope_high_freq_factor=4",
              "--model.rope_original_max_positions=64", "--model.tie_word_embeddings=false"]

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


# ---------------------------------------------------------------------------
# The model, its directory
# ---------------------------------------------------------------------------

def llama_tensors(seed, nkv=NKV, tied=False, bf16=True):
    """Hugging Face LlamaForCausalLM's state dict ("model." names), float32
    torch tensors, bf16 values when `bf16`."""
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.15):
        return torch.randn(*s, generator=g) * sc

    kv = nkv * C // NH
    t = {"model.embed_tokens.weight": r(V, C, sc=0.4 if tied else 1.0), "model.norm.weight": 1 + r(C)}
    if not tied:
        t["lm_head.weight"] = r(V, C, sc=0.3)
    for i in range(L):
        h = f"model.layers.{i}."
        t[h + "input_layernorm.weight"] = 1 + r(C)
        t[h + "post_attention_layernorm.weight"] = 1 + r(C)
        t[h + "self_attn.q_proj.weight"] = r(C, C)
        t[h + "self_attn.k_proj.weight"] = r(kv, C)
        t[h + "self_attn.v_proj.weight"] = r(kv, C)
        t[h + "self_attn.o_proj.weight"] = r(C, C)
        t[h + "mlp.gate_proj.weight"] = r(F, C)
        t[h + "mlp.up_proj.weight"] = r(F, C)
        t[h + "mlp.down_proj.weight"] = r(C, F)
    if bf16:
        t = {k: v.to(torch.bfloat16).float() for k, v in t.items()}
    return t


def config(**change):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": L,
         "num_attention_heads": NH, "num_key_value_heads": NKV, "hidden_size": C,
         "intermediate_size": F, "vocab_size": V, "max_position_embeddings": NPOS,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": dict(SCALING),
         "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
         "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
    c.update(change)
    return c


def tied_config():
    return config(tie_word_embeddings=True, rope_scaling=None, num_key_value_heads=1,
                  torch_dtype="float32")


def shard_names(n):
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def write_dir(d, tensors, shards=3, cfg=None, strip_prefix=False, dtype="BF16", dtypes=None,
              index_edit=None):
    """config.json and model.safetensors (shards=1) or `shards` shards with
    model.safetensors.index.json. `cfg`: a dict or the text itself."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(cfg if isinstance(cfg, str) else json.dumps(cfg or config(), indent=2))
    named = {(k[len("model."):] if strip_prefix and k.startswith("model.") else k): v
             for k, v in tensors.items()}

    def entry(k):
        return (named[k], (dtypes or {}).get(k, dtype))

    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), {k: entry(k) for k in named},
                          {"format": "pt"})
        return
    names = sorted(named)
    files = shard_names(shards)
    weight_map = {}
    for i, file in enumerate(files):
        part = names[i::shards]
        write_safetensors(os.path.join(d, file), {k: entry(k) for k in part}, {"format": "pt"})
        weight_map.update({k: file for k in part})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    if index_edit:
        index_edit(index)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)


# ---------------------------------------------------------------------------
# safetensors by hand
# ---------------------------------------------------------------------------

ST_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "F8_E4M3": 1}


def read_st(path):
    """(header without __metadata__, metadata, name -> raw bytes)."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    raw, end = {}, 0
    for name, e in header.items():
        b, f = e["data_offsets"]
        end = max(end, f)
        raw[name] = body[b:f]
        numel = int(np.prod(e["shape"])) if e["shape"] else 1
        if f - b != numel * ST_BYTES.get(e["dtype"], 0):
            check(False, f"{os.path.basename(path)}: {name}'s offsets cover its shape and dtype")
    if end != len(body):
        check(False, f"{os.path.basename(path)}: the data block ends where the last tensor does")
    if (8 + n) % 8:
        check(False, f"{os.path.basename(path)}: the data block starts 8-aligned")
    return header, meta, raw


def as_float32(raw, dtype, shape):
    if dtype == "F32":
        a = np.frombuffer(raw, "<f4").copy()
    elif dtype == "BF16":
        a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    elif dtype == "F16":
        a = np.frombuffer(raw, "<f2").astype(np.float32)
    else:
        raise ValueError(dtype)
    return a.reshape(shape)


def read_dir(d):
    """A Hugging Face directory: (config, index or None, name -> (dtype, shape, raw), name -> file)."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    index = None
    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
        files = sorted(set(index["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors, where = {}, {}
    for file in files:
        header, _, raw = read_st(os.path.join(d, file))
        for name, e in header.items():
            tensors[name] = (e["dtype"], list(e["shape"]), raw[name])
            where[name] = file
    return cfg, index, tensors, where


def dir_floats(d):
    _, _, tensors, _ = read_dir(d)
    return {k: torch.from_numpy(as_float32(raw, dt, shape)) for k, (dt, shape, raw) in tensors.items()}


def snapshot(d):
    out = {}
    for root, dirs, files in os.walk(d):
        for f in files + dirs:
            p = os.path.join(root, f)
            rel = os.path.relpath(p, d)
            out[rel] = open(p, "rb").read() if os.path.isfile(p) else None
    return out


# ---------------------------------------------------------------------------
# The reference
# ---------------------------------------------------------------------------

def windows(tokens):
    x = np.stack([tokens[w * T: w * T + T] for w in range(B)]).astype(np.int64)
    y = np.stack([tokens[w * T + 1: w * T + T + 1] for w in range(B)]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def ref_loss(tensors, cfg, tokens):
    """float64 loss of llama_torch on Hugging Face named tensors and a config.json dict."""
    p = {(k[len("model."):] if k.startswith("model.") else k): torch.as_tensor(v).double()
         for k, v in tensors.items()}
    rc = {"n_layer": cfg["num_hidden_layers"], "n_head": cfg["num_attention_heads"],
          "n_kv_head": cfg["num_key_value_heads"], "n_embd": cfg["hidden_size"],
          "vocab_size": cfg["vocab_size"], "rms_norm_eps": cfg["rms_norm_eps"],
          "rope_theta": cfg["rope_theta"], "rope_scaling": cfg.get("rope_scaling"),
          "tie_word_embeddings": cfg.get("tie_word_embeddings", False)}
    x, y = windows(tokens)
    with torch.no_grad():
        return float(llama_torch.Llama(rc, p).loss(x, y))


# ---------------------------------------------------------------------------
# Running meshlm
# ---------------------------------------------------------------------------

class Meshlm:
    def __init__(self, exe, mpiexec, d):
        self.exe, self.mpiexec, self.d = exe, shlex.split(mpiexec), d
        self.env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
        rng = np.random.default_rng(3)
        self.tokens = rng.integers(0, V, size=B * T * 3 + 1).astype(np.uint16)
        with h5py.File(os.path.join(d, "tokens.h5"), "w") as f:
            f["tokens"] = self.tokens
            f.attrs["vocab_size"] = V
        self.cfg = os.path.join(d, "run.cfg")
        with open(self.cfg, "w") as f:
            f.write(f"[model]\nseq_len = {T}\n[train]\nsteps = 1\nbatch_size = {B}\n"
                    f"micro_batch_size = {B}\nlr = 1e-30\nwarmup_steps = 0\nlog_every = 1\n"
                    f"[data]\npath = {d}/tokens.h5\nshuffle = false\n[finetune]\nmode = full\n"
                    "[checkpoint]\nfinal = false\n")
        self.n = 0

    def run(self, *args, ok=True):
        cmd = self.mpiexec + [self.exe] + list(args)
        p = subprocess.run(cmd, cwd=self.d, capture_output=True, text=True, timeout=300, env=self.env)
        out = p.stdout + p.stderr
        if ok and p.returncode != 0:
            print("$", " ".join(cmd))
            print(out[-3000:])
            check(False, f"meshlm {' '.join(args[:2])} exited with {p.returncode}")
            raise SystemExit(1)
        return p.returncode, out

    def train(self, *args, ok=True, out=None):
        self.n += 1
        out = out or os.path.join(self.d, f"out{self.n}")
        rc, msg = self.run("train", self.cfg, f"--output.dir={out}", *args, ok=ok)
        return rc, msg, out

    def loss(self, *args, out=None):
        """meshlm's step-1 loss."""
        _, _, out = self.train(*args, out=out)
        with h5py.File(os.path.join(out, "run.h5"), "r") as f:
            return float(f["metrics/loss"][0])


def error_line(msg):
    """meshlm's ERROR line (the last lines are mpiexec's), or the message's tail."""
    lines = [ln for ln in msg.splitlines() if ln.startswith("ERROR")]
    return lines[0][:500] if lines else msg[-1500:]


def compare(what, got, ref):
    rel = abs(got - ref) / abs(ref)
    print(f"  meshlm {got:.9f}, PyTorch (float64) {ref:.9f}, relative {rel:.2e}")
    return check(rel <= TOL, f"{what}: meshlm's step-1 loss equals the reference's within {TOL} relative")


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

def case_loss(m, d):
    t = llama_tensors(5)
    base = os.path.join(d, "dir")
    write_dir(base, t, shards=3)
    _, index, tensors, _ = read_dir(base)
    check(len(set(index["weight_map"].values())) == 3 and all(v[0] == "BF16" for v in tensors.values()),
          "the input: three BF16 shards")
    ref = ref_loss(t, config(), m.tokens)
    check(abs(ref - np.log(V)) > 0.5, f"the loss ({ref:.4f}) is not that of a uniform prediction "
                                      f"({np.log(V):.4f})")
    got = m.loss(f"--quant.base={base}")
    compare("three BF16 shards, \"model.\" names, llama3 rope scaling, no [model] shape key", got, ref)

    tt = llama_tensors(6, nkv=1, tied=True, bf16=False)
    tied = os.path.join(d, "tied")
    write_dir(tied, tt, shards=1, cfg=tied_config(), strip_prefix=True, dtype="F32")
    ref_t = ref_loss(tt, tied_config(), m.tokens)
    check(abs(ref_t - np.log(V)) > 0.5, f"tied: the loss ({ref_t:.4f}) is not that of a uniform prediction")
    compare("tied, one F32 model.safetensors, unprefixed names, rope_scaling null, one key head",
            m.loss(f"--quant.base={tied}"), ref_t)

    # transformers 5's rope_parameters beside a null rope_scaling: the scaling
    # is rope_parameters' (transformers: rope_scaling or rope_parameters).
    params = os.path.join(d, "rope_parameters")
    write_dir(params, t, shards=3, cfg=config(rope_scaling=None,
                                              rope_parameters={**SCALING, "rope_theta": 500000.0}))
    y = m.loss(f"--quant.base={params}")
    check(np.float32(y).tobytes() == np.float32(got).tobytes(),
          f"rope_scaling null beside rope_parameters of type llama3: the scaled model's loss bits "
          f"({y!r} vs {got!r})")
    # original_max_position_embeddings written as a float (64.0): the same model.
    as_float = os.path.join(d, "float_positions")
    write_dir(as_float, t, shards=3,
              cfg=config(rope_scaling={**SCALING, "original_max_position_embeddings": 64.0}))
    y = m.loss(f"--quant.base={as_float}")
    check(np.float32(y).tobytes() == np.float32(got).tobytes(),
          f"original_max_position_embeddings 64.0: the loss bits of 64 ({y!r} vs {got!r})")
    # No num_key_value_heads (LlamaConfig: the heads); model.n_kv_head = 0 means the same.
    mha = os.path.join(d, "mha")
    cfg_mha = config()
    del cfg_mha["num_key_value_heads"]
    write_dir(mha, llama_tensors(7, nkv=NH), shards=3, cfg=cfg_mha)
    x = m.loss(f"--quant.base={mha}")
    y = m.loss(f"--quant.base={mha}", "--model.n_kv_head=0")
    check(np.float32(y).tobytes() == np.float32(x).tobytes(),
          f"no num_key_value_heads in config.json, --model.n_kv_head=0 (= n_head): taken, the same "
          f"loss bits ({y!r} vs {x!r})")
    # Hugging Face's download cache: snapshots/<revision>/* link to ../../blobs/<hash>.
    repo = os.path.join(d, "hub", "models--org--llama")
    snap = os.path.join(repo, "snapshots", "0123abcd")
    os.makedirs(snap)
    os.makedirs(os.path.join(repo, "blobs"))
    for i, f in enumerate(sorted(os.listdir(base))):
        shutil.copy(os.path.join(base, f), os.path.join(repo, "blobs", f"{i:064x}"))
        os.symlink(os.path.join("..", "..", "blobs", f"{i:064x}"), os.path.join(snap, f))
    y = m.loss(f"--quant.base={snap}")
    check(np.float32(y).tobytes() == np.float32(got).tobytes(),
          f"a snapshot of Hugging Face's download cache (each file a link into blobs/): the "
          f"directory's loss bits ({y!r} vs {got!r})")

    again = m.loss(f"--quant.base={base}", *MODEL_ARGS)
    check(np.float32(again).tobytes() == np.float32(got).tobytes(),
          f"[model] keys that agree with config.json: the same loss bits ({again!r} vs {got!r})")
    below = m.loss(f"--quant.base={base}", "--model.max_seq_len=128")
    check(np.float32(below).tobytes() == np.float32(got).tobytes(),
          "model.max_seq_len below max_position_embeddings: the same loss bits")
    cj = os.path.join(base, "config.json")
    for key, says in (("n_kv_head=4", "num_key_value_heads 2"), ("rope_theta=10000", "rope_theta 500000"),
                      ("tie_word_embeddings=true", "tie_word_embeddings false"),
                      ("rope_factor=1", "factor 8"), ("max_seq_len=512", "max_position_embeddings 256")):
        rc, msg, out = m.train(f"--quant.base={base}", f"--model.{key}", ok=False)
        want = [f"model.{key.replace('=', ' = ')}", cj, says]
        check(rc != 0 and all(w in msg for w in want) and not os.path.exists(out),
              f"a [model] key that disagrees: refused naming {want}, nothing written")
        print("      " + error_line(msg))


def train_final(m, base, steps, *args):
    out = os.path.join(m.d, f"trained{m.n + 1}")
    m.train(f"--quant.base={base}", f"--train.steps={steps}", "--train.lr=1e-2", "--checkpoint.final=true",
            *args, out=out)
    return os.path.join(out, "checkpoints", f"step_{steps:08d}.h5")


def check_export_dir(what, e, ck, dtype, torch_dtype, kept=()):
    """The directory `e` exported from checkpoint `ck` in `dtype` (F32 or BF16);
    `kept`: the user's files there besides meshlm's."""
    cfg, index, tensors, where = read_dir(e)
    names = sorted(tensors)
    with h5py.File(ck, "r") as f:
        params = {k: f["params"][k][()] for k in f["params"]}
    want = sorted(("model." + k) if k != "lm_head.weight" else k for k in params)
    check(names == want, f"{what}: the tensors are /params' under Hugging Face's names")
    if index is not None:
        files = set(index["weight_map"].values())
        on_disk = {f for f in os.listdir(e) if f.endswith(".safetensors")}
        n = len(on_disk)
        check(sorted(index["weight_map"]) == names, f"{what}: the index's weight_map names every tensor")
        check(files == on_disk and on_disk == set(shard_names(n)),
              f"{what}: the index names exactly the {n} shards model-0000K-of-{n:05d} there")
        check(all(where[k] == index["weight_map"][k] for k in names),
              f"{what}: each shard holds exactly the tensors the index maps to it")
        extra = set(os.listdir(e)) - on_disk - {"config.json", "model.safetensors.index.json"}
    else:
        extra = set(os.listdir(e)) - {"config.json", "model.safetensors"}
    extra -= set(kept)
    check(not extra, f"{what}: nothing else in the directory ({sorted(extra)})")
    check(all(v[0] == dtype for v in tensors.values()), f"{what}: every tensor {dtype}")
    bad = []
    for k, a in params.items():
        name = ("model." + k) if k != "lm_head.weight" else k
        if name not in tensors:
            continue
        if k in ("embed_tokens.weight", "lm_head.weight"):
            a = a[:V]
        a = np.ascontiguousarray(a, np.float32)
        dt, shape, raw = tensors[name]
        if dtype == "F32":
            ref = a.astype("<f4").tobytes()
        else:
            ref = torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
        if shape != list(a.shape) or raw != ref:
            bad.append(f"{name} {shape} vs {list(a.shape)}")
    check(not bad, f"{what}: every tensor equals /params " +
          ("bit for bit" if dtype == "F32" else "as torch's .to(torch.bfloat16), bit for bit") +
          f" (embed_tokens, lm_head cut to {V} rows) {bad[:4]}")
    with h5py.File(ck, "r") as f:
        meta = dict(f["meta"].attrs)
    model = {"model_type": "llama", "num_hidden_layers": int(meta["n_layer"]),
             "num_attention_heads": int(meta["n_head"]), "num_key_value_heads": int(meta["n_kv_head"]),
             "hidden_size": int(meta["n_embd"]), "intermediate_size": int(meta["intermediate_size"]),
             "vocab_size": int(meta["vocab_size"]), "max_position_embeddings": int(meta["max_seq_len"]),
             "rms_norm_eps": float(meta["norm_eps"]), "rope_theta": float(meta["rope_theta"]),
             "tie_word_embeddings": bool(meta["tie_word_embeddings"]), "hidden_act": "silu",
             "architectures": ["LlamaForCausalLM"], "torch_dtype": torch_dtype}
    diff = {k: (cfg.get(k), v) for k, v in model.items() if cfg.get(k) != v}
    check(not diff, f"{what}: config.json holds the model's values {diff}")
    rs = cfg.get("rope_scaling")
    if float(meta["rope_factor"]) != 1.0 or rs is not None:
        want = {"rope_type": "llama3", "factor": float(meta["rope_factor"]),
                "low_freq_factor": float(meta["rope_low_freq_factor"]),
                "high_freq_factor": float(meta["rope_high_freq_factor"]),
                "original_max_position_embeddings": int(meta["rope_original_max_positions"])}
        check(isinstance(rs, dict) and all(rs.get(k) == v for k, v in want.items()),
              f"{what}: config.json's rope_scaling {rs}")
    check(cfg.get("head_dim", C // NH) == cfg["hidden_size"] // cfg["num_attention_heads"]
          and cfg.get("attention_bias", False) is False and cfg.get("mlp_bias", False) is False,
          f"{what}: head_dim, attention_bias, mlp_bias consistent")
    return cfg


def case_export(m, d):
    t = llama_tensors(5)
    base = os.path.join(d, "dir")
    write_dir(base, t, shards=3)
    ck = train_final(m, base, 2)
    check(os.path.exists(ck), "full training from the directory wrote its final checkpoint")

    e32 = os.path.join(d, "e32")
    m.run("ckpt", "export", ck, "-o", e32, "--dtype", "fp32", "--shard-mb", "0.1")
    n = len([f for f in os.listdir(e32) if f.endswith(".safetensors")])
    check(n >= 3, f"--shard-mb 0.1: several shards ({n})")
    cfg = check_export_dir("export --dtype fp32", e32, ck, "F32", "float32")
    diff = {k: (config()[k], cfg.get(k)) for k in MODEL_KEYS if config()[k] != cfg.get(k)}
    check(not diff, f"export: config.json's model values are the input directory's {diff}")
    check(cfg.get("meshlm", {}).get("step") == "2", f"export: config.json's meshlm object has step 2 "
                                                     f"({cfg.get('meshlm')})")
    got = m.loss(f"--quant.base={e32}")
    ref = ref_loss(dir_floats(e32), cfg, m.tokens)
    compare("the fp32 export as quant.base vs the reference on its tensors", got, ref)
    with h5py.File(ck, "r") as f:
        moved = float(np.abs(f["params/layers.0.self_attn.q_proj.weight"][()]
                             - t["model.layers.0.self_attn.q_proj.weight"].numpy()).max())
    check(moved > 0, "the trained weights moved from the input's")

    e16 = os.path.join(d, "e16")
    m.run("ckpt", "export", ck, "-o", e16)
    check_export_dir("export (default dtype)", e16, ck, "BF16", "bfloat16")

    # A run of a shorter context (model.max_seq_len 128 of 256) from a model
    # with Llama 3's token ids: the export keeps the model's context and ids.
    ids = {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "pad_token_id": 7}
    ids_dir = os.path.join(d, "ids")
    write_dir(ids_dir, t, shards=3, cfg=config(**ids))
    for what, extra in (("full training", ()),
                        ("LoRA, export --merge", ("--finetune.mode=lora", "--quant.type=nf4"))):
        ck_short = train_final(m, ids_dir, 1, "--model.max_seq_len=128", *extra)
        with h5py.File(ck_short, "r") as f:
            check(int(f["meta"].attrs["max_seq_len"]) == 128, f"{what}: the run's max_seq_len is 128")
        e = os.path.join(d, "e_ids" + str(len(extra)))
        m.run("ckpt", "export", ck_short, "-o", e, *(("--merge",) if extra else ()))
        with open(os.path.join(e, "config.json")) as f:
            cfg_ids = json.load(f)
        kept = {k: cfg_ids.get(k) for k in (*ids, "max_position_embeddings")}
        check(kept == {**ids, "max_position_embeddings": NPOS},
              f"{what}: the export keeps the model's token ids and its context of {NPOS} ({kept})")

    # A non-empty directory meshlm did not write.
    foreign = os.path.join(d, "foreign")
    os.makedirs(os.path.join(foreign, "sub"))
    open(os.path.join(foreign, "notes.txt"), "w").write("mine\n")
    open(os.path.join(foreign, "config.json"), "w").write('{"model_type": "llama"}\n')
    open(os.path.join(foreign, "sub", "x.bin"), "wb").write(b"\0\1\2")
    before = snapshot(foreign)
    rc, msg = m.run("ckpt", "export", ck, "-o", foreign, ok=False)
    said = foreign in msg and "a directory meshlm did not export is there" in msg
    check(rc != 0 and said, "export over a non-empty directory meshlm did not write: refused, naming it")
    print("      " + error_line(msg))
    check(snapshot(foreign) == before, "  ... every file there unchanged, nothing added")
    check(not [f for f in os.listdir(d) if f.startswith("foreign") and f != "foreign"],
          "  ... no temporary directory left beside it")
    # A Hugging Face directory someone else wrote is not meshlm's either.
    before = snapshot(base)
    rc, msg = m.run("ckpt", "export", ck, "-o", base, ok=False)
    check(rc != 0 and snapshot(base) == before,
          "export over the input directory (not meshlm's export): refused, unchanged")

    # Over its own export: fp32 in several shards replaced by bf16 in one
    # file; what the user put beside the weights (a tokenizer, a folder) kept.
    open(os.path.join(e32, "tokenizer.json"), "w").write('{"model": {}}\n')
    os.makedirs(os.path.join(e32, "extra"))
    open(os.path.join(e32, "extra", "notes.txt"), "w").write("mine\n")
    m.run("ckpt", "export", ck, "-o", e32, "--dtype", "bf16")
    left = sorted(os.listdir(e32))
    check(left == ["config.json", "extra", "model.safetensors", "tokenizer.json"],
          f"re-export over meshlm's own export: replaced, no stale shard or index, the user's "
          f"files kept ({left})")
    check(open(os.path.join(e32, "tokenizer.json")).read() == '{"model": {}}\n'
          and open(os.path.join(e32, "extra", "notes.txt")).read() == "mine\n",
          "  ... their contents unchanged")
    mine = ("tokenizer.json", "extra")
    check_export_dir("re-export (bf16, one file)", e32, ck, "BF16", "bfloat16", mine)
    m.run("ckpt", "export", ck, "-o", e32, "--dtype", "fp32", "--shard-mb", "0.1")
    check_export_dir("re-export again (fp32, shards)", e32, ck, "F32", "float32", mine)
    check(not [f for f in os.listdir(d) if f.startswith("e32") and f != "e32"],
          "no temporary directory left beside the export")


def case_import_export(m, d):
    t = llama_tensors(5)
    base = os.path.join(d, "dir")
    write_dir(base, t, shards=3)
    m.run("ckpt", "import", base, "-o", "imp.h5")
    m.run("ckpt", "export", "imp.h5", "-o", "exp")
    cfg_in, _, a, _ = read_dir(base)
    cfg_out, _, b, _ = read_dir(os.path.join(d, "exp"))
    check(sorted(a) == sorted(b), "import then export: the same tensor names")
    same = [k for k in a if k in b and a[k] == b[k]]
    check(len(same) == len(a), "import then export (bf16): per name the same dtype, shape and raw bytes "
                               f"({len(a) - len(same)} differ: {[k for k in a if k not in same][:4]})")
    diff = {k: (cfg_in[k], cfg_out.get(k)) for k in MODEL_KEYS + ("bos_token_id", "eos_token_id")
            if cfg_in[k] != cfg_out.get(k)}
    check(not diff, f"import then export: config.json's model values and token ids are the input's {diff}")
    x = m.loss(f"--quant.base={base}")
    imp = os.path.join(d, "imp.h5")
    y = m.loss(f"--quant.base={imp}", *MODEL_ARGS)
    check(np.float32(x).tobytes() == np.float32(y).tobytes(),
          f"the imported checkpoint as quant.base (its model's [model] keys given): the directory's "
          f"step-1 loss bits ({y!r} vs {x!r})")
    y = m.loss(f"--quant.base={imp}")
    check(np.float32(x).tobytes() == np.float32(y).tobytes(),
          f"the imported checkpoint as quant.base, no [model] key given (its /meta's taken): the "
          f"directory's step-1 loss bits ({y!r} vs {x!r})")
    rc, msg, out = m.train(f"--quant.base={imp}", "--model.rope_theta=10000", ok=False)
    check(rc != 0 and "imp.h5" in msg and "rope_theta" in msg and not os.path.exists(out),
          "the imported checkpoint as quant.base with a [model] key that disagrees with its /meta: "
          "an error naming the key and the file, nothing written")
    # The checkpoint's /meta records tie_word_embeddings and the rope: a run
    # that leaves those keys out must not silently build another model (the
    # classifier tied, lm_head.weight unused; rope without its scaling).
    for drop in ("--model.tie_word_embeddings", "--model.rope_"):
        args = [a for a in MODEL_ARGS if not a.startswith(drop)]
        rc, msg, out = m.train(f"--quant.base={imp}", *args, ok=False)
        z = None
        if rc == 0:
            with h5py.File(os.path.join(out, "run.h5"), "r") as f:
                z = float(f["metrics/loss"][0])
        check((rc == 0 and np.float32(z).tobytes() == np.float32(x).tobytes())
              or (rc != 0 and "imp.h5" in msg and drop[2:] in msg),
              f"the imported checkpoint as quant.base, {drop}* left out: /meta's value taken (the same "
              f"loss bits) or an error naming it and imp.h5 (exit {rc}, loss {z!r} vs {x!r})")
        if rc != 0:
            print("      " + error_line(msg))

    tt = llama_tensors(6, nkv=1, tied=True, bf16=False)
    tied = os.path.join(d, "tied")
    write_dir(tied, tt, shards=1, cfg=tied_config(), strip_prefix=True, dtype="F32")
    m.run("ckpt", "import", tied, "-o", "imp_tied.h5")
    m.run("ckpt", "export", "imp_tied.h5", "-o", "exp_tied", "--dtype", "fp32")
    cfg_in, _, a, _ = read_dir(tied)
    cfg_out, _, b, _ = read_dir(os.path.join(d, "exp_tied"))
    check(sorted(b) == sorted("model." + k for k in a) and "lm_head.weight" not in b,
          "tied: the export has the \"model.\" names, no lm_head.weight")
    check(all(b.get("model." + k) == v for k, v in a.items()),
          "tied: import then export --dtype fp32: the same dtype, shape and raw bytes")
    diff = {k: (cfg_in[k], cfg_out.get(k)) for k in MODEL_KEYS if cfg_in[k] != cfg_out.get(k)}
    check(not diff, f"tied: config.json's model values are the input's (rope_scaling null) {diff}")


def case_lora_merge(m, d):
    t = llama_tensors(5)
    base = os.path.join(d, "dir")
    write_dir(base, t, shards=3)
    lora = ["--finetune.mode=lora", "--quant.type=nf4", "--finetune.lora_rank=4",
            "--finetune.lora_alpha=12"]
    ck = train_final(m, base, 2, *lora)
    with h5py.File(ck, "r") as f:
        mats = sorted(f["lora"].keys()) if "lora" in f else []
        moved = max((float(np.abs(f["lora"][k]["B"][()]).max()) for k in mats), default=0.0)
        meta = dict(f["meta"].attrs)
    want = sorted(f"layers.{i}.{s}.weight" for i in range(L) for s in
                  ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))
    check(mats == want, f"the LoRA checkpoint adapts all seven matrices of each layer ({mats[:3]}...)")
    check(moved > 0, "the trained adapters are not zero (B moved from its start)")
    check(str(meta.get("quant_type", b"")).find("nf4") >= 0, "the checkpoint's quant_type is nf4")

    merged = os.path.join(d, "merged")
    m.run("ckpt", "export", ck, "--merge", "--dtype", "fp32", "-o", merged)
    cfg, _, tensors, _ = read_dir(merged)
    check(sorted(tensors) == sorted(t) and all(v[0] == "F32" for v in tensors.values()),
          "--merge --dtype fp32: every tensor of the model, F32")
    ref = ref_loss(dir_floats(merged), cfg, m.tokens)
    got = m.loss(f"--quant.base={base}", *lora, f"--finetune.adapters_from={ck}")
    compare("meshlm's LoRA loss (nf4 base + the trained adapters) vs the reference on the merged export",
            got, ref)
    base_loss = ref_loss(t, config(), m.tokens)
    check(abs(ref - base_loss) > 1e-4 * abs(base_loss),
          f"the merged model's loss ({ref:.6f}) is not the base's ({base_loss:.6f})")


def case_bad(m, d):
    t = llama_tensors(5)
    first = shard_names(3)

    todo = []

    def bad(name, expect, make=None, args=()):
        dd = os.path.join(d, "bad_" + name)
        if make:
            make(dd)
        expect = [e.replace("DIR", dd) for e in expect]
        todo.append((name, dd, expect, [f"--quant.base={dd}", *args]))

    def dir_with(**kw):
        return lambda dd: write_dir(dd, t, **kw)

    def cfg_with(**change):
        return dir_with(cfg=config(**change))

    def no_config(dd):
        write_dir(dd, t)
        os.remove(os.path.join(dd, "config.json"))

    def edit(fn):
        return lambda dd: write_dir(dd, t, index_edit=fn)

    def without(name):
        return lambda dd: write_dir(dd, {k: v for k, v in t.items() if k != name})

    def reshaped(name, shape):
        return lambda dd: write_dir(dd, {**t, name: torch.zeros(shape)})

    def in_two_shards(dd):
        write_dir(dd, t)
        # The first shard holds its tensors and one of the second shard's too.
        other = sorted(t)[1]
        write_safetensors(os.path.join(dd, first[0]),
                          {**{k: (t[k], "BF16") for k in sorted(t)[0::3]}, other: (t[other], "BF16")})

    def truncated(dd):
        write_dir(dd, t)
        p = os.path.join(dd, first[1])
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) - 100)

    def symlink_out(dd):
        write_dir(dd, t)
        outside = os.path.join(d, "elsewhere.safetensors")
        shutil.move(os.path.join(dd, first[2]), outside)
        os.symlink(outside, os.path.join(dd, first[2]))

    def single_symlink_out(dd):
        write_dir(dd, t, shards=1)
        outside = os.path.join(d, "elsewhere_single.safetensors")
        shutil.move(os.path.join(dd, "model.safetensors"), outside)
        os.symlink(outside, os.path.join(dd, "model.safetensors"))

    def other_repos_blobs(dd):
        # DIR = <repo>/snapshots/<rev>, a shard linked to another repo's blobs.
        write_dir(dd, t)
        other = os.path.join(d, "models--other", "blobs")
        os.makedirs(other, exist_ok=True)
        shutil.move(os.path.join(dd, first[2]), os.path.join(other, "f" * 64))
        os.symlink(os.path.join(other, "f" * 64), os.path.join(dd, first[2]))

    def nan(dd):
        tn = dict(t)
        w = tn["model.layers.1.mlp.down_proj.weight"].clone()
        w[3, 5] = float("nan")
        tn["model.layers.1.mlp.down_proj.weight"] = w
        write_dir(dd, tn)

    def f8(dd):
        write_dir(dd, t, shards=1)
        up = "model.layers.1.mlp.up_proj.weight"
        write_safetensors(os.path.join(dd, "model.safetensors"),
                          {k: (v, "F8_E4M3" if k == up else "BF16") for k, v in t.items()},
                          {"format": "pt"})

    k0 = sorted(t)[0]
    cj = "DIR/config.json"
    ix = "DIR/model.safetensors.index.json"
    # A real safetensors file outside the directories, for the index to point at.
    write_safetensors(os.path.join(d, "x.safetensors"), {k0: (t[k0], "BF16")})
    bad("no_config", [cj, "no such file"], no_config)
    bad("malformed", [cj, "is not valid JSON"], dir_with(cfg='{"model_type": "llama",'))
    bad("model_type", [cj, "model_type 'mistral'"], cfg_with(model_type="mistral"))
    bad("hidden_act", [cj, "hidden_act", "gelu"], cfg_with(hidden_act="gelu"))
    bad("heads_kv", [cj, "num_attention_heads 4", "num_key_value_heads 3"], cfg_with(num_key_value_heads=3))
    bad("head_dim", [cj, "head_dim"], cfg_with(head_dim=32))
    bad("heads_6_of_64", [cj, "hidden_size 64 is not a multiple of num_attention_heads 6", "head_dim 16"],
        cfg_with(num_attention_heads=6, head_dim=16))
    bad("attention_bias", [cj, "attention_bias"], cfg_with(attention_bias=True))
    bad("rope_yarn", [cj, "rope_scaling", "yarn"],
        cfg_with(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}))
    bad("q_shape", ["DIR", "model.layers.1.self_attn.q_proj.weight", "[64, 32]", "[64, 64]"],
        reshaped("model.layers.1.self_attn.q_proj.weight", (64, 32)))
    bad("intermediate", ["DIR", "model.layers.0.mlp.gate_proj.weight", "[96, 64]", "[128, 64]"],
        cfg_with(intermediate_size=128))
    bad("missing_tensor", ["DIR", "model.layers.1.post_attention_layernorm.weight"],
        without("model.layers.1.post_attention_layernorm.weight"))
    bad("in_two_shards", [sorted(t)[1], "is in both", "DIR/" + first[0], "DIR/" + first[1]], in_two_shards)
    bad("dot_dot", [ix, "'../x.safetensors'", "lies outside"],
        edit(lambda x: x["weight_map"].__setitem__(k0, "../x.safetensors")))
    bad("absolute", [ix, os.path.join(d, "x.safetensors"), "not a file name inside the directory"],
        edit(lambda x: x["weight_map"].__setitem__(k0, os.path.join(d, "x.safetensors"))))
    bad("symlink_out", [ix, first[2], "lies outside"], symlink_out)
    bad("single_symlink_out", ["DIR", "'model.safetensors'", "lies outside"], single_symlink_out)
    bad("hub/snapshots/0123abcd", [ix, first[2], "lies outside"], other_repos_blobs)
    bad("missing_shard", [ix, "model-00009-of-00009.safetensors", "does not exist"],
        edit(lambda x: x["weight_map"].__setitem__(k0, "model-00009-of-00009.safetensors")))
    bad("truncated", ["DIR/" + first[1], "run past the end of the file"], truncated)
    bad("f8", ["DIR", "model.layers.1.mlp.up_proj.weight", "F8_E4M3"], f8)
    bad("int64", ["DIR", "model.norm.weight", "I64"], dir_with(dtypes={"model.norm.weight": "I64"}))
    bad("nan", ["DIR", "tensor 'model.layers.1.mlp.down_proj.weight'", "NaN", "row 3, column 5"], nan)
    bad("disagreeing_key", ["model.n_layer = 3", cj, "num_hidden_layers 2"], dir_with(), ["--model.n_layer=3"])

    # mpiexec takes about two seconds to end a job whose rank failed: run a few at once.
    def one(job):
        name, dd, expect, args = job
        out = os.path.join(d, "out_" + name)
        rc, msg = m.run("train", m.cfg, f"--output.dir={out}", *args, ok=False)
        return rc, msg, out

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, todo))
    for (name, dd, expect, _), (rc, msg, out) in zip(todo, results):
        said = all(e in msg for e in expect)
        check(rc != 0 and said and not os.path.exists(out),
              f"{name}: exit {rc}, {expect} in the message, nothing written")
        print("      " + error_line(msg))


def case_layouts(m, d, many):
    """inputs/llama-tiny.cfg from a directory of its shape on one rank and on
    dp 2 x tp 2 x pp 2; LoRA on an NF4 base of it likewise, the machine split
    into two nodes of four ranks."""
    g = torch.Generator().manual_seed(9)
    Ct, Ft, Vt, Lt = 64, 160, 256, 2
    r = lambda *shape: (torch.randn(*shape, generator=g) * 0.1)  # noqa: E731
    t = {"model.embed_tokens.weight": r(Vt, Ct) * 5, "model.norm.weight": 1 + r(Ct),
         "lm_head.weight": r(Vt, Ct)}
    for i in range(Lt):
        h = f"model.layers.{i}."
        t[h + "input_layernorm.weight"], t[h + "post_attention_layernorm.weight"] = 1 + r(Ct), 1 + r(Ct)
        for n, shape in (("self_attn.q_proj", (Ct, Ct)), ("self_attn.k_proj", (Ct // 2, Ct)),
                         ("self_attn.v_proj", (Ct // 2, Ct)), ("self_attn.o_proj", (Ct, Ct)),
                         ("mlp.gate_proj", (Ft, Ct)), ("mlp.up_proj", (Ft, Ct)), ("mlp.down_proj", (Ct, Ft))):
            t[h + n + ".weight"] = r(*shape)
    base = os.path.join(d, "tiny")
    write_dir(base, t, shards=2, cfg=config(num_hidden_layers=Lt, intermediate_size=Ft, vocab_size=Vt,
                                            max_position_embeddings=32, rope_theta=10000.0,
                                            rope_scaling=None))
    cfg = os.path.join(os.path.dirname(HERE), "..", "inputs", "llama-tiny.cfg")
    many_m = Meshlm(m.exe, many, d)

    def run(runner, name, *args):
        out = os.path.join(d, name)
        rc, msg = runner.run("train", os.path.abspath(cfg), f"--quant.base={base}", "--train.steps=6",
                             "--train.log_every=1", f"--output.dir={out}", *args)
        with h5py.File(os.path.join(out, "run.h5"), "r") as f:
            return (np.asarray(f["metrics/loss"][:], np.float64),
                    np.asarray(f["memory/quantized/peak_bytes"][:]))

    layout = ["--parallel.dp=2", "--parallel.tp=2", "--parallel.pp=2"]
    one, _ = run(m, "full1")
    eight, _ = run(many_m, "full8", *layout)
    rel = float(np.max(np.abs(eight - one) / np.abs(one)))
    check(len(one) == 6 and one[-1] < one[0], f"llama-tiny.cfg from the directory learns on one rank {one}")
    check(len(eight) == 6 and rel <= TOL,
          f"dp 2 x tp 2 x pp 2: the one-rank losses within {TOL} (worst {rel:.2e})")
    lora = ["--finetune.mode=lora", "--quant.type=nf4", "--train.lr=1e-2",
            f"--quant.cache={os.path.join(d, 'cache.h5')}"]
    lone, q1 = run(m, "lora1", *lora)
    leight, q8 = run(many_m, "lora8", *lora, *layout, "--parallel.ranks_per_node=4")
    rel = float(np.max(np.abs(leight - lone) / np.abs(lone)))
    check(np.all(np.isfinite(leight)) and rel <= TOL,
          f"LoRA on an NF4 base of it under dp 2 x tp 2 x pp 2: the one-rank losses within {TOL} "
          f"(worst {rel:.2e})")
    check(q1[0] > 0 and list(np.nonzero(q8)[0]) == [0, 4] and q8[0] == q1[0] and q8[4] == q1[0],
          f"one copy of the quantized base per node (two nodes of four ranks): held by ranks 0 and "
          f"4 only, each the whole base of one rank's run ({list(q8)} vs {q1[0]})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshlm", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--mpiexec-many", help="mpiexec of 8 ranks (the layouts case)")
    ap.add_argument("--case", required=True,
                    choices=["loss", "export", "import_export", "lora_merge", "bad", "layouts"])
    ap.add_argument("--keep", help="work in this directory and keep it")
    a = ap.parse_args()
    cases = {"loss": case_loss, "export": case_export, "import_export": case_import_export,
             "lora_merge": case_lora_merge, "bad": case_bad,
             "layouts": lambda m, d: case_layouts(m, d, a.mpiexec_many)}
    exe = os.path.abspath(a.meshlm)
    t0 = time.time()
    try:
        if a.keep:
            d = os.path.abspath(a.keep)
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            cases[a.case](Meshlm(exe, a.mpiexec, d), d)
        else:
            with tempfile.TemporaryDirectory() as d:
                cases[a.case](Meshlm(exe, a.mpiexec, d), d)
    except SystemExit:
        pass
    print(f"({time.time() - t0:.1f} s)")
    if failures:
        print(f"FAIL: {len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
