#!/usr/bin/python3
"""`meshlm generate` against independent PyTorch models (tests/torch/
gpt2_torch.py and llama_torch.py, float64, written from the published
definitions): greedy generation must pick, at every generated position, the
token the reference ranks first.

usage: check_generate.py --meshlm PATH --mpiexec "mpiexec -n 1 ..." --case CASE
                         [--backend cpu|emulated|cuda] [--keep DIR]

The greedy check: `meshlm generate MODEL --prompt-ids P --temperature 0
--max-new-tokens 32 --print ids` gives ids G; the reference runs P + G once and
at each position t from len(P) - 1 on, the id meshlm chose next must be one the
reference ranks first: its logit within 1e-4 of the row's largest (a near-tie
is the only excuse, and a wrong id with a clear gap fails). The models are
random with weights large enough that the top two logits are well apart:
the check also requires at least 90% of the positions to have a gap above 1e-3
(so that it is not passing on ties) and reports the smallest gap.

CASE:
  gpt2        a random GPT-2 (L=2, C=32, NH=4, V=250 padded to 256, 64
              positions) as a Hugging Face directory (config.json and
              model.safetensors, Conv1D weights (in, out)): greedy against
              gpt2_torch; the same weights as one GPT-2 safetensors file
              (--n_head) give the same ids; sampling (temperature 1.2, top-k
              40, top-p 0.95) gives the same ids twice with one --seed, other
              ids with another, every id below V; --top-k 1 at temperature 1
              gives the greedy ids. A model whose real logits are all negative
              (ln_f's gain 0, every wte row against its bias) and whose padded
              rows are zero: greedy picks the largest real logit, never a
              padded column, and sampling gives only ids below V.
  llama       random Llamas as Hugging Face directories (L=2, C=64, NH=4,
              F=96, V=300 padded to 320, 64 positions): NKV=2 with Llama 3 rope
              scaling (factor 8, original 16 positions, so that the scaled
              frequencies matter within the run) and an untied lm_head; NKV=1,
              no scaling, tied. Greedy against llama_torch. The first with
              config.json's eos_token_id set to its greedy run's 17th id: the
              run ends at that id's first occurrence; with a
              generation_config.json eos_token_id list holding it (and
              config.json another id): the same; a generation_config.json
              eos_token_id that is no id: an error naming the file and key.
  checkpoint  meshlm checkpoints of short runs (meshlm train, checkpoint.final):
              a GPT-2 trained from its initialisation and a Llama trained from
              the untied GQA directory (quant.base = DIR): greedy against the
              references on the checkpoints' /params (read with h5py). A
              run from that directory with config.json's eos_token_id a list
              holding the greedy run's 17th id: its checkpoint's generation
              ends at that id's first occurrence.
  lora        a LoRA run (nf4 base = the GPT-2 directory, rank 4, every
              GPT-2 target, lr 1e-2, 3 steps): greedy from the LoRA checkpoint
              (its base from /meta quant_base) against gpt2_torch on `meshlm
              ckpt export --merge`'s weights; the same ids with --base DIR; a
              base that is not the one trained on is refused naming base_hash.
  text        a Hugging Face directory with a tokenizer.json (byte-level BPE:
              the 256 bytes, <|endoftext|> = 256, <|begin_of_text|> = 257 put
              first by its post-processor) found by default: --prompt "hi
              there" runs the ids 257 and the bytes (--no-bos: the bytes);
              --print text (the default) writes the bytes of the ids --print
              ids gives, nothing else; a model that always ranks
              <|endoftext|> first stops after it (--print ids "256", the text
              empty). A checkpoint with --tokenizer byte: the text is the
              bytes of the ids.
  errors      each an error, exit status non-zero, the message naming what is
              wrong: a prompt longer than the context (both lengths), no such
              model file, --prompt-ids not numbers, an id >= vocab_size (the
              id), both --prompt and --prompt-ids, neither, --prompt without a
              tokenizer (--tokenizer), an unknown option, --temperature -1,
              --top-p 0; prompt + --max-new-tokens past the context stops at
              the context, saying so with both lengths.
--backend runs every `meshlm generate` of the case on that backend (the
model's parameters, cache and scratch in device memory under emulated and
cuda) and checks that its line on stderr names it; the references are the
same. Under cuda, a machine without a GPU meshlm can use exits 77 (skipped),
saying why.

Exit status 1 on any failure.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt2_torch  # noqa: E402
import llama_torch  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402

NEW = 32            # new tokens per greedy run
TIE = 1e-4          # a chosen id's reference logit within this of the row's largest
CLEAR = 1e-3        # a top-2 gap above this is a clear decision
NPOS = 64
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def padded(v):
    return (v + 63) // 64 * 64


# ---------------------------------------------------------------------------
# Running meshlm
# ---------------------------------------------------------------------------

class Meshlm:
    def __init__(self, exe, mpiexec, d, backend="cpu"):
        self.exe, self.mpiexec, self.d, self.backend = exe, shlex.split(mpiexec), d, backend
        self.env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")

    def run(self, *args, ok=True):
        args = list(args)
        if args[0] == "generate" and self.backend != "cpu":
            args += ["--backend", self.backend]
        cmd = self.mpiexec + [self.exe] + [str(a) for a in args]
        p = subprocess.run(cmd, cwd=self.d, capture_output=True, timeout=300, env=self.env)
        out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
        if self.backend == "cuda" and p.returncode != 0 and "can use no GPU" in err:
            print(error_line(err))
            print("SKIP: no GPU")
            raise SystemExit(77)
        if ok and p.returncode != 0:
            print("$", " ".join(cmd))
            print(out[-2000:], err[-3000:])
            check(False, f"meshlm {' '.join(str(a) for a in args[:2])} exited with {p.returncode}")
            raise SystemExit(1)
        return p.returncode, p.stdout, err

    def generate(self, model, *args):
        """The ids of --print ids (its one line of output)."""
        _, out, err = self.run("generate", model, "--print", "ids", *args)
        lines = [ln for ln in out.decode().splitlines() if ln.strip()]
        check(len(lines) == 1, f"--print ids writes one line on stdout (got {len(lines)})")
        return [int(x) for x in lines[-1].split(",")], err

    def greedy(self, model, prompt, *args):
        ids, err = self.generate(model, "--prompt-ids", ",".join(map(str, prompt)), "--temperature", "0",
                                 "--max-new-tokens", NEW, *args)
        check(len(ids) == NEW, f"{NEW} new ids (got {len(ids)})")
        check(re.search(r"prefill \d+ tokens in .* tokens/s\), decode \d+ tokens in .* tokens/s\)", err)
              is not None, "a line on stderr with the prefill's and the decode's tokens/s")
        on = re.search(r"# generate: .*; backend (\S+)", err)
        check(on is not None and on.group(1).startswith(self.backend),
              f"the line on stderr names the backend {self.backend} (got {on.group(1) if on else None})")
        # A device's first kernels run before the prefill's clock (and the
        # ids, checked by the caller, are those of a run without them).
        warmed = re.search(r"device warmed up in [\d.]+ s", err) is not None
        check(warmed == (self.backend != "cpu"),
              f"the device's warm-up is reported on a device backend only (got {warmed})")
        return ids


def write_tokens(path, V, n, seed):
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f["tokens"] = rng.integers(0, V, size=n).astype(np.uint16)
        f.attrs["vocab_size"] = V


def error_line(msg):
    lines = [ln for ln in msg.splitlines() if "ERROR" in ln]
    return lines[0][:400] if lines else msg[-800:]


# ---------------------------------------------------------------------------
# The greedy check
# ---------------------------------------------------------------------------

def check_greedy(what, logits, prompt, ids):
    """logits: (len(prompt) + len(ids), V) float64 of the reference on
    prompt + ids. Each id must be ranked first at the position before it."""
    seq = list(prompt) + list(ids)
    wrong, clear, gaps = [], 0, []
    for t in range(len(prompt) - 1, len(seq) - 1):
        row = logits[t]
        top2 = torch.topk(row, 2).values
        gap = float(top2[0] - top2[1])
        gaps.append(gap)
        clear += gap > CLEAR
        chosen = seq[t + 1]
        if float(row[chosen]) < float(top2[0]) - TIE:
            wrong.append((t, chosen, int(torch.argmax(row)), float(top2[0] - row[chosen])))
    n = len(seq) - len(prompt)
    print(f"      {what}: {n} positions, smallest top-2 gap {min(gaps):.2e}, {clear} above {CLEAR}, "
          f"{len(set(ids))} distinct ids")
    check(not wrong, f"{what}: every generated id is the reference's argmax (within {TIE})"
          + (f"; first wrong: position {wrong[0][0]} chose {wrong[0][1]}, the reference {wrong[0][2]} "
             f"by {wrong[0][3]:.3e}" if wrong else ""))
    check(clear >= 0.9 * n, f"{what}: the reference's top two logits are clearly apart at >= 90% of "
                            f"the positions ({clear} of {n})")


# ---------------------------------------------------------------------------
# GPT-2
# ---------------------------------------------------------------------------

def gpt2_params(seed, V, L=2, C=32, scale=0.8, wte_scale=0.5):
    """meshlm's names and layout ((out, in) weights, wte padded with zero rows);
    the scales keep greedy generation from repeating one token."""
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=scale):
        return (torch.randn(*s, generator=g) * sc).numpy()

    wte = np.zeros((padded(V), C), np.float32)
    wte[:V] = r(V, C, sc=wte_scale)
    t = {"wte.weight": wte, "wpe.weight": r(NPOS, C), "ln_f.weight": 1 + r(C, sc=0.1),
         "ln_f.bias": r(C, sc=0.1)}
    for i in range(L):
        h = f"h.{i}."
        t[h + "ln_1.weight"], t[h + "ln_1.bias"] = 1 + r(C, sc=0.1), r(C, sc=0.1)
        t[h + "ln_2.weight"], t[h + "ln_2.bias"] = 1 + r(C, sc=0.1), r(C, sc=0.1)
        t[h + "attn.c_attn.weight"], t[h + "attn.c_attn.bias"] = r(3 * C, C), r(3 * C, sc=0.1)
        t[h + "attn.c_proj.weight"], t[h + "attn.c_proj.bias"] = r(C, C), r(C, sc=0.1)
        t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = r(4 * C, C), r(4 * C, sc=0.1)
        t[h + "mlp.c_proj.weight"], t[h + "mlp.c_proj.bias"] = r(C, 4 * C), r(C, sc=0.1)
    return {k: v.astype(np.float32) for k, v in t.items()}


def gpt2_file_tensors(p, V):
    """GPT2Model's state dict: Conv1D weights (in, out), wte's V rows."""
    out = {}
    for k, v in p.items():
        if k.endswith(CONV1D):
            v = np.ascontiguousarray(v.T)
        if k == "wte.weight":
            v = v[:V]
        out[k] = v
    return out


def gpt2_config_json(V, L=2, C=32, NH=4):
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_head": NH,
            "n_embd": C, "vocab_size": V, "n_positions": NPOS, "n_ctx": NPOS,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}


def write_gpt2_dir(d, p, V, L=2, C=32, NH=4):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(gpt2_config_json(V, L, C, NH), f)
    write_safetensors(os.path.join(d, "model.safetensors"), gpt2_file_tensors(p, V), {"format": "pt"})


def gpt2_logits(p, V, seq, L=2, C=32, NH=4, npos=NPOS):
    cfg = gpt2_torch.GPT2Config(n_layer=L, n_head=NH, n_embd=C, vocab_size=V,
                                padded_vocab_size=padded(V), max_seq_len=npos)
    model = gpt2_torch.GPT2(cfg).double()
    model.load_from_arrays(p)
    with torch.no_grad():
        logits, _ = model(torch.tensor([seq]))
    return logits[0]


def prompt_of(V, n, seed):
    return [int(x) for x in np.random.default_rng(seed).integers(0, V, size=n)]


def case_gpt2(m, d):
    V = 250
    p = gpt2_params(1, V)
    write_gpt2_dir(os.path.join(d, "gpt2"), p, V)
    prompt = prompt_of(V, 12, 2)
    ids = m.greedy("gpt2", prompt)
    check_greedy("GPT-2 directory", gpt2_logits(p, V, prompt + ids), prompt, ids)
    write_safetensors(os.path.join(d, "gpt2.safetensors"), gpt2_file_tensors(p, V))
    check(m.greedy("gpt2.safetensors", prompt, "--n_head", 4) == ids,
          "the same weights as one safetensors file (--n_head 4): the same ids")

    sample = ["--prompt-ids", ",".join(map(str, prompt)), "--temperature", "1.2", "--top-k", "40",
              "--top-p", "0.95", "--max-new-tokens", NEW]
    a, _ = m.generate("gpt2", *sample, "--seed", 5)
    b, _ = m.generate("gpt2", *sample, "--seed", 5)
    c, _ = m.generate("gpt2", *sample, "--seed", 6)
    check(a == b and len(a) == NEW, "sampling: the same --seed gives the same ids")
    check(a != c, "sampling: another --seed gives other ids")
    check(all(0 <= x < V for x in a + c), "sampling: every id below vocab_size")
    k1, _ = m.generate("gpt2", "--prompt-ids", ",".join(map(str, prompt)), "--temperature", "1",
                       "--top-k", "1", "--max-new-tokens", NEW, "--seed", 9)
    check(k1 == ids, "--top-k 1 at temperature 1: the greedy ids")

    # Real logits all negative, the padded columns' zero: never chosen.
    q = dict(p)
    bias = np.random.default_rng(4).standard_normal(32).astype(np.float32)
    q["ln_f.weight"] = np.zeros(32, np.float32)
    q["ln_f.bias"] = bias
    s = np.random.default_rng(5).uniform(1, 2, size=V).astype(np.float32)
    wte = np.zeros((padded(V), 32), np.float32)
    wte[:V] = -s[:, None] * bias[None, :]
    q["wte.weight"] = wte
    write_gpt2_dir(os.path.join(d, "negative"), q, V)
    g = m.greedy("negative", prompt)
    check(g == [int(np.argmin(s))] * NEW,
          f"real logits all below the padded columns' 0: greedy picks the largest real one "
          f"({int(np.argmin(s))}), never a padded column (got {sorted(set(g))})")
    sm, _ = m.generate("negative", "--prompt-ids", "1,2", "--temperature", "1", "--max-new-tokens", NEW)
    check(all(x < V for x in sm), f"sampling from it: every id below {V} (got {max(sm)} at most)")


# ---------------------------------------------------------------------------
# Llama
# ---------------------------------------------------------------------------

LC, LNH, LF, LV = 64, 4, 96, 300
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}


def llama_tensors(seed, nkv, tied, L=2):
    """LlamaForCausalLM's state dict ("model." names), float32 numpy."""
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.2):
        return (torch.randn(*s, generator=g) * sc).numpy()

    kv = nkv * LC // LNH
    t = {"model.embed_tokens.weight": r(LV, LC, sc=1.0), "model.norm.weight": 1 + r(LC, sc=0.1)}
    if not tied:
        t["lm_head.weight"] = r(LV, LC, sc=1.0)
    for i in range(L):
        h = f"model.layers.{i}."
        t[h + "input_layernorm.weight"] = 1 + r(LC, sc=0.1)
        t[h + "post_attention_layernorm.weight"] = 1 + r(LC, sc=0.1)
        t[h + "self_attn.q_proj.weight"] = r(LC, LC)
        t[h + "self_attn.k_proj.weight"] = r(kv, LC)
        t[h + "self_attn.v_proj.weight"] = r(kv, LC)
        t[h + "self_attn.o_proj.weight"] = r(LC, LC)
        t[h + "mlp.gate_proj.weight"] = r(LF, LC)
        t[h + "mlp.up_proj.weight"] = r(LF, LC)
        t[h + "mlp.down_proj.weight"] = r(LC, LF)
    return {k: v.astype(np.float32) for k, v in t.items()}


def llama_config(nkv, tied, scaling, L=2):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": L,
            "num_attention_heads": LNH, "num_key_value_heads": nkv, "hidden_size": LC,
            "intermediate_size": LF, "vocab_size": LV, "max_position_embeddings": NPOS,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": scaling,
            "tie_word_embeddings": tied, "hidden_act": "silu", "torch_dtype": "float32"}


def write_llama_dir(d, t, cfg):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    write_safetensors(os.path.join(d, "model.safetensors"), t, {"format": "pt"})


def llama_logits(t, cfg, seq):
    """llama_torch on tensors named as Hugging Face's ("model." or not) or meshlm's."""
    p = {(k[len("model."):] if k.startswith("model.") else k): torch.as_tensor(np.asarray(v)).double()
         for k, v in t.items()}
    rc = {"n_layer": cfg["num_hidden_layers"], "n_head": cfg["num_attention_heads"],
          "n_kv_head": cfg["num_key_value_heads"], "n_embd": cfg["hidden_size"],
          "vocab_size": cfg["vocab_size"], "rms_norm_eps": cfg["rms_norm_eps"],
          "rope_theta": cfg["rope_theta"], "rope_scaling": cfg["rope_scaling"],
          "tie_word_embeddings": cfg["tie_word_embeddings"]}
    with torch.no_grad():
        return llama_torch.Llama(rc, p).logits(torch.tensor([seq]))[0]


LLAMAS = (("untied GQA (2 key/value heads), llama3 rope scaling", 2, False, SCALING, 3),
          ("tied MQA (1 key/value head), no rope scaling", 1, True, None, 4))


def until_stop(ids, stops):
    """The greedy ids up to and with the first of `stops`."""
    for i, x in enumerate(ids):
        if x in stops:
            return ids[:i + 1]
    return ids


def check_eos_stops(m, d, t, cfg, prompt, ids):
    """The model's eos_token_id ends generation: config.json's (a number),
    generation_config.json's (a list, before config.json's); a bad one is an
    error naming the file and the key."""
    stop = ids[NEW // 2]
    cases = (("config.json eos_token_id (a number)", {"eos_token_id": stop}, None),
             ("generation_config.json eos_token_id (a list), before config.json's",
              {"eos_token_id": LV - 1 if stop != LV - 1 else 0}, {"eos_token_id": [LV + 5, stop]}))
    for i, (what, extra, generation) in enumerate(cases):
        name = f"eos{i}"
        write_llama_dir(os.path.join(d, name), t, {**cfg, **extra})
        if generation is not None:
            with open(os.path.join(d, name, "generation_config.json"), "w") as f:
                json.dump(generation, f)
        _, out, _ = m.run("generate", name, "--print", "ids", "--prompt-ids", ",".join(map(str, prompt)),
                          "--temperature", "0", "--max-new-tokens", NEW)
        got = [int(x) for x in out.decode().split(",")]
        check(got == until_stop(ids, {stop}),
              f"{what}: generation ends at the first {stop} ({len(got)} of {NEW} ids)")
    with open(os.path.join(d, "eos1", "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": ["x"]}, f)
    rc, _, err = m.run("generate", "eos1", "--prompt-ids", "1", ok=False)
    check(rc != 0 and "generation_config.json" in err and "eos_token_id" in err,
          "a generation_config.json eos_token_id that is no token id: an error naming the file and the key")
    print("      " + error_line(err))


def case_llama(m, d):
    for what, nkv, tied, scaling, seed in LLAMAS:
        t, cfg = llama_tensors(seed, nkv, tied), llama_config(nkv, tied, scaling)
        name = f"llama{seed}"
        write_llama_dir(os.path.join(d, name), t, cfg)
        prompt = prompt_of(LV, 10, seed)
        ids = m.greedy(name, prompt)
        check_greedy(f"Llama {what}", llama_logits(t, cfg, prompt + ids), prompt, ids)
        if seed == LLAMAS[0][4]:
            check_eos_stops(m, d, t, cfg, prompt, ids)


# ---------------------------------------------------------------------------
# Checkpoints of meshlm train, LoRA
# ---------------------------------------------------------------------------

def train(m, name, cfg_text, *args):
    with open(os.path.join(m.d, name + ".cfg"), "w") as f:
        f.write(cfg_text)
    m.run("train", name + ".cfg", f"--output.dir={name}", *args)
    ck = os.path.join(m.d, name, "checkpoints")
    return os.path.join(ck, open(os.path.join(ck, "latest")).read().strip())


def h5_params(path):
    with h5py.File(path, "r") as f:
        return {k: np.asarray(v[()], np.float32) for k, v in f["params"].items()}


RUN = ("[train]\nsteps = 3\nbatch_size = 2\nmicro_batch_size = 1\nlr = 1e-2\nwarmup_steps = 0\n"
       "log_every = 1\nseed = 3\n[data]\npath = {tokens}\n[checkpoint]\nfinal = true\n")


def case_checkpoint(m, d):
    V = 250
    write_tokens(os.path.join(d, "tokens250.h5"), V, 4000, 1)
    ck = train(m, "gpt2run", "[model]\nn_layer = 2\nn_head = 4\nn_embd = 32\nvocab_size = 250\n"
               f"seq_len = 32\nmax_seq_len = {NPOS}\n" + RUN.format(tokens="tokens250.h5"))
    p = h5_params(ck)
    prompt = prompt_of(V, 12, 7)
    ids = m.greedy(ck, prompt)
    check_greedy("GPT-2 checkpoint of meshlm train", gpt2_logits(p, V, prompt + ids), prompt, ids)

    what, nkv, tied, scaling, seed = LLAMAS[0]
    t, cfg = llama_tensors(seed, nkv, tied), llama_config(nkv, tied, scaling)
    write_llama_dir(os.path.join(d, "llama"), t, cfg)
    write_tokens(os.path.join(d, "tokens300.h5"), LV, 4000, 2)
    ck = train(m, "llamarun", "[model]\nseq_len = 16\n" + RUN.format(tokens="tokens300.h5"),
               f"--quant.base={os.path.join(d, 'llama')}", "--train.lr=1e-3")
    p = h5_params(ck)
    prompt = prompt_of(LV, 10, 8)
    ids = m.greedy(ck, prompt)
    check_greedy(f"Llama checkpoint ({what}, trained from its directory)", llama_logits(p, cfg, prompt + ids),
                 prompt, ids)
    # A run from a directory whose config.json has eos_token_id: its
    # checkpoint keeps it (/meta hf_config), and generation ends there.
    stop = ids[NEW // 2]
    write_llama_dir(os.path.join(d, "llama_eos"), t, {**cfg, "eos_token_id": [LV + 7, stop]})
    ck = train(m, "llamarun_eos", "[model]\nseq_len = 16\n" + RUN.format(tokens="tokens300.h5"),
               f"--quant.base={os.path.join(d, 'llama_eos')}", "--train.lr=1e-3")
    _, out, _ = m.run("generate", ck, "--print", "ids", "--prompt-ids", ",".join(map(str, prompt)),
                      "--temperature", "0", "--max-new-tokens", NEW)
    got = [int(x) for x in out.decode().split(",")]
    check(got == until_stop(ids, {stop}),
          f"the checkpoint of a run from a directory with eos_token_id [{LV + 7}, {stop}]: generation "
          f"ends at the first {stop} ({len(got)} of {NEW} ids)")


def case_lora(m, d):
    V = 250
    p = gpt2_params(1, V)
    base = os.path.join(d, "gpt2")
    write_gpt2_dir(base, p, V)
    write_tokens(os.path.join(d, "tokens250.h5"), V, 4000, 3)
    ck = train(m, "lorarun", "[model]\nseq_len = 32\n[finetune]\nmode = lora\nlora_rank = 4\n"
               "lora_alpha = 8\nlora_targets = qkv,attn-out,mlp-up,mlp-down\n[quant]\ntype = nf4\n"
               f"base = {base}\n" + RUN.format(tokens="tokens250.h5"))
    merged = os.path.join(d, "merged.safetensors")
    m.run("ckpt", "export", ck, "--merge", "-o", merged)
    ref = {}
    for k, v in read_st(merged).items():
        if k.endswith(CONV1D):
            v = v.T
        if k == "wte.weight":
            v = np.concatenate([v, np.zeros((padded(V) - V, v.shape[1]), np.float32)])
        ref[k] = np.ascontiguousarray(v)
    with h5py.File(ck, "r") as f:
        moved = float(np.abs(f["lora/h.0.attn.c_attn.weight/B"][()]).max())
    check(moved > 0, "the adapters moved (B != 0)")
    prompt = prompt_of(V, 12, 9)
    ids = m.greedy(ck, prompt)
    check_greedy("LoRA checkpoint (nf4 base from /meta quant_base) against ckpt export --merge",
                 gpt2_logits(ref, V, prompt + ids), prompt, ids)
    check(m.greedy(ck, prompt, "--base", base) == ids, "--base DIR (the same base): the same ids")
    other = os.path.join(d, "other")
    write_gpt2_dir(other, gpt2_params(2, V), V)
    rc, _, err = m.run("generate", ck, "--base", other, "--prompt-ids", "1,2", ok=False)
    check(rc != 0 and "base_hash" in err and other in err,
          "a base other than the one trained on: refused naming it and /meta base_hash")
    print("      " + error_line(err))


def read_st(path):
    """name -> float32 numpy array of an F32 safetensors file."""
    import struct
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    out = {}
    for k, e in header.items():
        assert e["dtype"] == "F32", e["dtype"]
        b, f = e["data_offsets"]
        out[k] = np.frombuffer(body[b:f], "<f4").reshape(e["shape"]).copy()
    return out


# ---------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte -> printable character map of byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tokenizer_json():
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": 256, "content": "<|endoftext|>", "special": True},
                             {"id": 257, "content": "<|begin_of_text|>", "special": True}],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [], "special_tokens": {}},
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                      "byte_fallback": False, "vocab": vocab, "merges": []}}


def case_text(m, d):
    V = 258
    p = gpt2_params(11, V)
    t = os.path.join(d, "withtok")
    write_gpt2_dir(t, p, V)
    with open(os.path.join(t, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f)
    want = [257] + list(b"hi there")
    ids_p, _ = m.generate("withtok", "--prompt", "hi there", "--temperature", "0", "--max-new-tokens", NEW)
    ids_i, _ = m.generate("withtok", "--prompt-ids", ",".join(map(str, want)), "--temperature", "0",
                          "--max-new-tokens", NEW)
    check(ids_p == ids_i, "--prompt 'hi there' with the directory's tokenizer.json runs <|begin_of_text|> "
                          "and the bytes")
    nb, _ = m.generate("withtok", "--prompt", "hi there", "--no-bos", "--temperature", "0",
                       "--max-new-tokens", NEW)
    nbi, _ = m.generate("withtok", "--prompt-ids", ",".join(map(str, want[1:])), "--temperature", "0",
                        "--max-new-tokens", NEW)
    check(nb == nbi, "--no-bos: the bytes alone")
    _, out, _ = m.run("generate", "withtok", "--prompt", "hi there", "--temperature", "0",
                      "--max-new-tokens", NEW)
    stop = ids_p.index(256) if 256 in ids_p else len(ids_p)
    text = bytes(x for x in ids_p[:stop] if x < 256) + b"\n"
    check(out == text, f"--print text (the default with a tokenizer): the bytes of the ids, then a "
                       f"newline ({len(out)} bytes)")

    # A model that always ranks <|endoftext|> first: ln_f's output is its
    # bias b, and wte[256] = 10 b.
    q = dict(p)
    b = np.random.default_rng(6).standard_normal(32).astype(np.float32)
    q["ln_f.weight"], q["ln_f.bias"] = np.zeros(32, np.float32), b
    q["wte.weight"] = q["wte.weight"].copy()
    q["wte.weight"][256] = 10 * b
    e = os.path.join(d, "eot")
    write_gpt2_dir(e, q, V)
    shutil.copy(os.path.join(t, "tokenizer.json"), e)
    ids, err = m.generate("eot", "--prompt", "hi", "--max-new-tokens", NEW)
    check(ids == [256], f"the end-of-text id ends the generation (--print ids: {ids})")
    _, out, _ = m.run("generate", "eot", "--prompt", "hi", "--max-new-tokens", NEW)
    check(out == b"\n", "... and is not written as text")

    write_tokens(os.path.join(d, "tokens256.h5"), 256, 4000, 5)
    ck = train(m, "byterun", "[model]\nn_layer = 2\nn_head = 4\nn_embd = 32\nvocab_size = 256\n"
               f"seq_len = 32\nmax_seq_len = {NPOS}\n" + RUN.format(tokens="tokens256.h5"))
    args = ["--prompt", "GPL", "--tokenizer", "byte", "--temperature", "0.8", "--seed", "3",
            "--max-new-tokens", NEW]
    ids, _ = m.generate(ck, *args)
    ids_b, _ = m.generate(ck, "--prompt-ids", ",".join(str(x) for x in b"GPL"), *args[4:])
    check(ids == ids_b, "--tokenizer byte: --prompt 'GPL' runs its bytes")
    _, out, _ = m.run("generate", ck, *args)
    check(out == bytes(ids) + b"\n", "--tokenizer byte --print text: the bytes of the ids")


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

def case_errors(m, d):
    V = 250
    write_gpt2_dir(os.path.join(d, "gpt2"), gpt2_params(1, V), V)
    long = ",".join(["1"] * (NPOS + 1))
    cases = [
        (["gpt2", "--prompt-ids", long], ["65", "64"], "a prompt longer than the context names both lengths"),
        (["nothere.h5", "--prompt-ids", "1"], ["nothere.h5"], "a missing model file is named"),
        (["nothere", "--prompt-ids", "1"], ["nothere"], "a missing model directory is named"),
        (["gpt2", "--prompt-ids", "1,x,3"], ["--prompt-ids", "'x'"], "--prompt-ids with a word"),
        (["gpt2", "--prompt-ids", "1,,3"], ["--prompt-ids"], "--prompt-ids with an empty item"),
        (["gpt2", "--prompt-ids", "1,-2"], ["--prompt-ids", "'-2'"], "--prompt-ids with a negative id"),
        (["gpt2", "--prompt-ids", f"1,{V}"], [str(V), "vocabulary"], "an id >= vocab_size is named"),
        (["gpt2", "--prompt-ids", "1", "--prompt", "x"], ["--prompt", "--prompt-ids"], "both prompts"),
        (["gpt2"], ["--prompt"], "no prompt"),
        (["gpt2", "--prompt", "hello"], ["--tokenizer"], "--prompt without a tokenizer names --tokenizer"),
        (["gpt2", "--prompt-ids", "1", "--print", "text"], ["--tokenizer"], "--print text without one"),
        (["gpt2", "--prompt-ids", "1", "--frobnicate", "1"], ["--frobnicate"], "an unknown option"),
        (["gpt2", "--prompt-ids", "1", "--max-new-token", "3"],
         ["'--max-new-token'", "did you mean '--max-new-tokens'?"], "a near option named"),
        (["gpt2", "--prompt-ids", "1", "--temperature", "-1"], ["--temperature"], "a negative temperature"),
        (["gpt2", "--prompt-ids", "1", "--top-p", "0"], ["--top-p"], "--top-p 0"),
        (["gpt2", "--prompt-ids", "1", "--max-new-tokens", "0"], ["--max-new-tokens"], "--max-new-tokens 0"),
        (["gpt2", "--prompt-ids", "1", "--backend", "gpu"], ["--backend", "'gpu'", "cuda"],
         "an unknown backend, the choices named"),
    ]
    for args, want, what in cases:
        rc, out, err = m.run("generate", *args, ok=False)
        line = error_line(err)
        check(rc != 0 and all(w in line for w in want), f"{what}: an error naming {want}")
        print("      " + line)
    ids, err = m.generate("gpt2", "--prompt-ids", ",".join(["1"] * 60), "--max-new-tokens", 10)
    check(len(ids) == 4 and "60" in err and "64" in err,
          f"60 prompt tokens + 10 new past the context of 64: 4 new tokens, said with both lengths "
          f"({len(ids)} new)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshlm", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--case", required=True, choices=["gpt2", "llama", "checkpoint", "lora", "text", "errors"])
    ap.add_argument("--backend", default="cpu", choices=["cpu", "emulated", "cuda"])
    ap.add_argument("--keep", help="work in this directory and keep it")
    a = ap.parse_args()
    d = a.keep or tempfile.mkdtemp(prefix="meshlm-generate-")
    os.makedirs(d, exist_ok=True)
    try:
        m = Meshlm(os.path.abspath(a.meshlm), a.mpiexec, d, a.backend)
        {"gpt2": case_gpt2, "llama": case_llama, "checkpoint": case_checkpoint, "lora": case_lora,
         "text": case_text, "errors": case_errors}[a.case](m, d)
    finally:
        if not a.keep:
            shutil.rmtree(d, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
