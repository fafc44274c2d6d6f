#!/usr/bin/python3
"""meshlm tokenize against independent reference tokenizers, on a real
corpus (tests/text/make_corpus.py: Debian's licenses and changelogs, a
document of every script and whitespace case, one with special tokens
written in its text).

usage: check_tokenize.py --meshlm PATH --mpiexec "mpiexec -n 1 ..."
                         --mpiexec-two "mpiexec -n 2 ..." --scratch DIR --case CASE

The references (fetched by jobscripts/fetch-fixtures.sh, which
`jobscripts/install-deps.sh --tests` runs):
  GPT-2    OpenAI's encoder ported to JavaScript (npm gpt-3-encoder@1.1.4,
           tests/text/reference_gpt2.js), cross-checked against
           tests/text/openai_bpe.py (case references);
  Llama 3  npm llama3-tokenizer-js@1.2.0 (tests/text/reference_llama3.js),
           cross-checked against tests/text/hf_bpe.py reading the
           tokenizer.json that make_tokenizer_json.py builds from the
           package's data;
  SentencePiece  Debian's python3-sentencepiece on models trained here with
           Debian's spm_train.
The token stream of a corpus is, document by document in input order,
[BOS] ids [EOT]: BOS where the tokenizer's post-processor adds one (Llama 3's
128000; a SentencePiece model's <s> when it has one), EOT the
end-of-text id (GPT-2 50256, Llama 3 128001, SentencePiece </s>).

"<|endoftext|>" written in a document is text to OpenAI's encoder (meshlm
from encoder.json + vocab.bpe: gpt2_pair) and id 50256 to Hugging Face's
(meshlm from a tokenizer.json: the reference then splits the text at it and
puts 50256 between the parts, as tokenizers does).

CASE:
  gpt2_pair        --tokenizer encoder.json --merges vocab.bpe: /tokens equals
                   the JS reference's stream id for id (uint16); the
                   attributes (vocab_size 50257, eot_id 50256, bos_id -1,
                   documents, val_documents 0, bytes_read, tokenizer "bpe",
                   tokenizer_xxh3 and merges_xxh3 = XXH3-64 of the files,
                   max_id, format_version); without --merges (vocab.bpe found
                   beside encoder.json) the same ids.
  gpt2_json        a GPT-2 tokenizer.json (merges as "a b"): the Hugging Face
                   stream ("<|endoftext|>" in the text = 50256).
  gpt2_json_pairs  the same with merges as [a, b] pairs.
  llama3_json      Llama 3's tokenizer.json (post-processor Sequence[ByteLevel,
                   TemplateProcessing], as published; and TemplateProcessing
                   alone): [128000] ids [128001] per document, uint32,
                   vocab_size 128256, bos_id 128000.
  sentencepiece    three models trained on the corpus with spm_train
                   (vocabulary 2000): BPE (<unk> 0, <s> 1, </s> 2: stream [1]
                   ids [2]), unigram with byte_fallback and no <s> (stream ids
                   [2]), and BPE whose end-of-sequence piece is <eos> (as
                   Gemma's; stream [1] ids [2]: the eot is the model's eos id,
                   whatever its name); ids from python3-sentencepiece's
                   encode of each document.
  jsonl            --input jsonl corpus.jsonl (every non-ASCII character a
                   \\u escape) gives the same /tokens as the text files; so
                   do two jsonl files with --jsonl-key body, other keys
                   around it and blank lines between.
  ranks            1 rank and 2 ranks (--mpiexec-two): the same bytes in
                   /tokens and /val_tokens and the same attributes, for text
                   and jsonl input with --val-fraction 0.1 (GPT-2), and for
                   Llama 3 (uint32) without held-out documents.
  val_fraction     --val-fraction 0.1 and 0.5: document i is held out when
                   floor((i+1)F) > floor(iF); /val_tokens is the held-out
                   documents' stream, /tokens the others', the attributes
                   documents (kept) and val_documents count them.
  bad              each a non-zero exit on every rank, a message naming the
                   file (and line or key), and no OUT.h5 nor temporary file
                   left: tokenizer.json cut short (malformed JSON); model type
                   WordPiece, Unigram (the message names the type); a merge
                   naming a token not in the vocabulary; a jsonl line that is
                   not JSON (line 3, and line 70 on 2 ranks, where the second
                   rank reads it) and one lacking the key (the line and the
                   key named), then with --skip-bad-lines both skipped and
                   counted, the other lines' ids right; a jsonl line with a
                   byte that is not UTF-8 (quoted as \xff, never raw); an
                   empty corpus (an empty jsonl file, one of blank lines, an
                   empty text file with --eot none); --eot an id the
                   tokenizer leaves unassigned (a tokenizer.json whose ids
                   have gaps); --eot 256 with the byte tokenizer, the error
                   labelled --eot; an existing HDF5 file with /tokens that
                   meshlm did not write (h5py: /tokens and /weights, no
                   meshlm attributes) refused by name and left byte for
                   byte as it was, while a token file meshlm wrote is
                   replaced.
  references       the references against each other, without meshlm:
                   reference_gpt2.js = openai_bpe.py on every document (both
                   readings of "<|endoftext|>"), hf_bpe.py on the GPT-2
                   tokenizer.json files = the split JS reference, and
                   reference_llama3.js = hf_bpe.py on Llama 3's tokenizer.json.

The corpus, the tokenizer files, the SentencePiece models and the reference
ids are made once into DIR/cache (under a lock: cases may run at the same
time) and made again when this directory's scripts, the fixtures or the
machine's Debian documentation change. Exit status 1 on any failure.
"""
import argparse
import fcntl
import glob
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

PYTHON = sys.executable
INSTALL_HINT = "run jobscripts/install-deps.sh --tests"

GPT2_EOT = 50256
LLAMA3_BOS, LLAMA3_EOT = 128000, 128001
SPECIAL = "<|endoftext|>"

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def need(cond, what):
    """A missing prerequisite: fail now, saying how to install it."""
    if not cond:
        print(f"FAIL  {what}: {INSTALL_HINT}", flush=True)
        sys.exit(1)


def run(cmd, what, timeout=600, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if p.returncode != 0:
        print("$", " ".join(shlex.quote(c) for c in cmd))
        print((p.stdout + p.stderr)[-3000:])
        check(False, f"{what} exited with {p.returncode}")
        raise SystemExit(1)
    return p.stdout


# ---------------------------------------------------------------------------
# Fixtures, corpus and references (made once, cached)
# ---------------------------------------------------------------------------

class Cache:
    """DIR/cache: corpus/, tok/<name>/tokenizer.json, spm/<name>.model,
    refs/<name>.json; all of it made again when the stamp changes."""

    def __init__(self, scratch):
        self.root = os.path.join(scratch, "cache")
        self.lock_path = os.path.join(scratch, "cache.lock")
        self.fixtures = os.environ.get("MESHLM_FIXTURES") or \
            os.path.join(os.path.expanduser("~"), ".cache", "meshlm", "fixtures")
        need(os.path.isfile(os.path.join(self.fixtures, "gpt-3-encoder", "Encoder.js")) and
             os.path.isfile(os.path.join(self.fixtures, "llama3-tokenizer-js", "package.json")),
             f"the tokenizer fixtures are not in {self.fixtures}")
        need(shutil.which("node"), "node (Node.js) is not on PATH")
        self.gpt2_dir = os.path.join(self.fixtures, "gpt-3-encoder")
        os.makedirs(scratch, exist_ok=True)
        self.lock_fd = open(self.lock_path, "a")
        self.depth = 0

    # Re-entrant: a reference made from another takes the lock twice.
    def __enter__(self):
        if self.depth == 0:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth == 0:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def stamp(self):
        h = hashlib.sha256()
        for p in sorted(glob.glob(os.path.join(HERE, "*.py")) + glob.glob(os.path.join(HERE, "*.js"))):
            if os.path.basename(p) != "check_tokenize.py":
                with open(p, "rb") as f:
                    h.update(f.read())
        for pkg in ("gpt-3-encoder", "llama3-tokenizer-js"):
            with open(os.path.join(self.fixtures, pkg, "package.json"), "rb") as f:
                h.update(f.read())
        # The corpus's sources: names, sizes and times of the Debian files.
        for p in sorted(glob.glob("/usr/share/common-licenses/*") +
                        glob.glob("/usr/share/doc/*/changelog.Debian.gz")):
            try:
                st = os.stat(p)
                h.update(f"{p} {st.st_size} {st.st_mtime_ns}\n".encode())
            except OSError:
                pass
        return h.hexdigest()

    def prepare(self):
        """Makes the corpus and the tokenizer.json files (under the lock)."""
        with self:
            stamp = self.stamp()
            stamp_file = os.path.join(self.root, "STAMP")
            if os.path.isfile(stamp_file) and open(stamp_file).read() == stamp:
                return
            shutil.rmtree(self.root, ignore_errors=True)
            os.makedirs(self.root)
            t0 = time.time()
            run([PYTHON, os.path.join(HERE, "make_corpus.py"), self.path("corpus")], "make_corpus.py")
            run([PYTHON, os.path.join(HERE, "make_tokenizer_json.py"), self.path("tok"),
                 "--fixtures", self.fixtures], "make_tokenizer_json.py")
            with open(stamp_file, "w") as f:
                f.write(stamp)
            print(f"# corpus and tokenizer files made in {self.root} ({time.time() - t0:.1f} s)")

    def path(self, *p):
        return os.path.join(self.root, *p)

    def docs(self):
        return sorted(glob.glob(self.path("corpus", "*.txt")))

    def tokenizer_json(self, name):
        return self.path("tok", name, "tokenizer.json")

    def ref(self, name, make):
        """The cached list of per-document id lists `name`, made by make()."""
        p = self.path("refs", name + ".json")
        with self:
            if not os.path.isfile(p):
                t0 = time.time()
                ids = make()
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p + ".tmp", "w") as f:
                    json.dump(ids, f)
                os.replace(p + ".tmp", p)
                print(f"# reference {name} made ({time.time() - t0:.1f} s)")
        with open(p) as f:
            return json.load(f)

    # The references, one id list per document of docs().

    def js_lines(self, script, args, files):
        out = run(["node", os.path.join(HERE, script), "--fixtures", self.fixtures] + args + files,
                  script)
        return [json.loads(line) for line in out.splitlines()]

    def gpt2_openai(self):
        """OpenAI's reading: "<|endoftext|>" is text."""
        return self.ref("gpt2_openai", lambda: self.js_lines("reference_gpt2.js", [], self.docs()))

    def gpt2_hf(self):
        """Hugging Face's reading: "<|endoftext|>" is 50256. Only the
        documents that hold it are encoded again (the JS encoder is slow)."""
        def make():
            plain = self.gpt2_openai()
            docs = self.docs()
            special = [i for i, d in enumerate(docs) if SPECIAL.encode() in open(d, "rb").read()]
            split = self.js_lines("reference_gpt2.js", ["--special", SPECIAL], [docs[i] for i in special])
            for i, ids in zip(special, split):
                plain[i] = ids
            return plain
        return self.ref("gpt2_hf", make)

    def llama3(self):
        """Without BOS and EOS."""
        return self.ref("llama3", lambda: self.js_lines("reference_llama3.js", [], self.docs()))

    def spm_model(self, name, extra):
        """A SentencePiece model trained on the corpus with spm_train."""
        model = self.path("spm", name + ".model")
        with self:
            if not os.path.isfile(model):
                need(shutil.which("spm_train"), "spm_train (Debian: sentencepiece) is not on PATH")
                os.makedirs(self.path("spm"), exist_ok=True)
                t0 = time.time()
                run(["spm_train", "--input=" + ",".join(self.docs()), "--model_prefix=" + model[:-6],
                     "--vocab_size=2000", "--num_threads=2", "--input_sentence_size=0",
                     "--minloglevel=2"] + extra, "spm_train " + name)
                print(f"# SentencePiece model {name} trained ({time.time() - t0:.1f} s)")
        return model

    def spm_ids(self, name, model):
        def make():
            try:
                import sentencepiece
            except ImportError:
                need(False, "python3-sentencepiece is not installed")
            sp = sentencepiece.SentencePieceProcessor(model_file=model)
            return [sp.encode(open(d, "rb").read().decode("utf-8")) for d in self.docs()]
        return self.ref("spm_" + name, make)


# ---------------------------------------------------------------------------
# Running meshlm, reading its files
# ---------------------------------------------------------------------------

class Meshlm:
    def __init__(self, exe, mpiexec, mpiexec_two, work):
        self.exe, self.work = exe, work
        self.mpiexec = {1: shlex.split(mpiexec), 2: shlex.split(mpiexec_two)}
        self.env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")

    def tokenize(self, inputs, out, *opts, ranks=1, ok=True):
        cmd = self.mpiexec[ranks] + [self.exe, "tokenize"] + list(inputs) + [out] + list(opts)
        # Bytes that are not UTF-8 in a message stay visible (as surrogates).
        p = subprocess.run(cmd, cwd=self.work, capture_output=True, text=True, errors="surrogateescape",
                           timeout=600, env=self.env)
        text = p.stdout + p.stderr
        if ok and p.returncode != 0:
            print("$", " ".join(shlex.quote(c) for c in cmd[:len(self.mpiexec[ranks]) + 3]), "...",
                  " ".join(shlex.quote(c) for c in [out] + list(opts)))
            print(text[-3000:])
            check(False, f"meshlm tokenize {' '.join(opts)} exited with {p.returncode}")
            raise SystemExit(1)
        return p.returncode, text


def read_h5(path):
    """(/tokens, /val_tokens or None, {attribute: value})."""
    import h5py
    with h5py.File(path, "r") as f:
        tokens = f["tokens"][:]
        val = f["val_tokens"][:] if "val_tokens" in f else None
        attrs = {}
        for k, v in f.attrs.items():
            if isinstance(v, bytes):
                v = v.decode()
            elif hasattr(v, "item"):
                v = v.item()
            attrs[k] = v
    return tokens, val, attrs


def stream(per_doc, bos, eot, keep=None):
    """[bos] ids [eot] for each document (those with keep(i) true)."""
    import numpy as np
    out = []
    for i, ids in enumerate(per_doc):
        if keep is not None and not keep(i):
            continue
        if bos is not None:
            out.append(bos)
        out.extend(ids)
        if eot is not None:
            out.append(eot)
    return np.asarray(out, dtype=np.int64)


def doc_starts(per_doc, bos, eot, keep=None):
    """The stream offset of each kept document (for naming a mismatch)."""
    starts, n = [], 0
    for i, ids in enumerate(per_doc):
        if keep is not None and not keep(i):
            continue
        starts.append((n, i))
        n += len(ids) + (bos is not None) + (eot is not None)
    return starts


def same_stream(got, per_doc, bos, eot, what, names, keep=None):
    """/tokens (or /val_tokens) against the reference, id for id; a mismatch
    is reported with its document and the ids around it."""
    import numpy as np
    want = stream(per_doc, bos, eot, keep)
    if got is None:
        return check(False, f"{what}: the dataset is missing")
    got = np.asarray(got, dtype=np.int64)
    if len(got) == len(want) and np.array_equal(got, want):
        return check(True, f"{what}: {len(got)} ids = the reference's")
    n = min(len(got), len(want))
    diff = np.nonzero(got[:n] != want[:n])[0]
    at = int(diff[0]) if len(diff) else n
    doc = max((s for s in doc_starts(per_doc, bos, eot, keep) if s[0] <= at), default=(0, 0))
    lo = max(0, at - 6)
    print(f"      first difference at id {at} (document {doc[1]}, {names[doc[1]]}, its id {at - doc[0]}):")
    print(f"      meshlm    ...{got[lo:at + 8].tolist()}")
    print(f"      reference ...{want[lo:at + 8].tolist()}")
    return check(False, f"{what}: {len(got)} ids vs the reference's {len(want)}, first difference at {at}")


def xxh3_file(path):
    import xxhash
    with open(path, "rb") as f:
        return xxhash.xxh3_64_intdigest(f.read())


def check_attrs(attrs, want, what):
    bad = {k: (attrs.get(k, "<missing>"), v) for k, v in want.items() if attrs.get(k, "<missing>") != v}
    shown = ", ".join(f"{k} {v}" for k, v in want.items() if not isinstance(v, int) or v < 1 << 32)
    check(not bad, f"{what}: attributes {shown}" +
          ("" if not bad else "; wrong (got, want): " + ", ".join(f"{k} {g!r} vs {w!r}" for k, (g, w) in bad.items())))
    fv = attrs.get("format_version")
    check(isinstance(fv, int) and fv >= 1, f"{what}: format_version present ({fv})")


def corpus_bytes(docs):
    return sum(os.path.getsize(d) for d in docs)


def names_of(docs):
    return [os.path.basename(d) for d in docs]


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

def bpe_case(m, c, tokenizer_opts, per_doc, bos, eot, vocab, what, hashed, dtype,
             merges_hashed=None, out="out.h5", kind="bpe"):
    """Tokenizes the corpus' files on one rank; /tokens against per_doc; the
    attributes. Returns /tokens."""
    docs = c.docs()
    m.tokenize(docs, out, *tokenizer_opts)
    tokens, val, attrs = read_h5(os.path.join(m.work, out))
    same_stream(tokens, per_doc, bos, eot, what, names_of(docs))
    check(tokens.dtype.name == dtype, f"{what}: /tokens is {tokens.dtype.name} ({dtype})")
    check(val is None, f"{what}: no /val_tokens without --val-fraction")
    want = {"vocab_size": vocab, "eot_id": -1 if eot is None else eot, "bos_id": -1 if bos is None else bos,
            "documents": len(docs), "val_documents": 0, "bytes_read": corpus_bytes(docs),
            "tokenizer": kind,
            "tokenizer_xxh3": xxh3_file(hashed), "max_id": int(stream(per_doc, bos, eot).max())}
    if merges_hashed:
        want["merges_xxh3"] = xxh3_file(merges_hashed)
    check_attrs(attrs, want, what)
    return tokens


def case_gpt2_pair(m, c):
    enc, bpe = os.path.join(c.gpt2_dir, "encoder.json"), os.path.join(c.gpt2_dir, "vocab.bpe")
    ref = c.gpt2_openai()
    tokens = bpe_case(m, c, ["--tokenizer", enc, "--merges", bpe], ref, None, GPT2_EOT, 50257,
                      "encoder.json + vocab.bpe", enc, "uint16", merges_hashed=bpe)
    m.tokenize(c.docs(), "beside.h5", "--tokenizer", enc)
    t2, _, _ = read_h5(os.path.join(m.work, "beside.h5"))
    import numpy as np
    check(np.array_equal(tokens, t2), "encoder.json without --merges (vocab.bpe beside it): the same ids")


def case_gpt2_json(m, c, name="gpt2"):
    tj = c.tokenizer_json(name)
    bpe_case(m, c, ["--tokenizer", tj], c.gpt2_hf(), None, GPT2_EOT, 50257,
             f"GPT-2 tokenizer.json ({name})", tj, "uint16")


def case_llama3_json(m, c):
    ref = c.llama3()
    for name in ("llama3", "llama3-template"):
        tj = c.tokenizer_json(name)
        bpe_case(m, c, ["--tokenizer", tj], ref, LLAMA3_BOS, LLAMA3_EOT, 128256,
                 f"Llama 3 tokenizer.json ({name})", tj, "uint32", out=name + ".h5")


SPM_MODELS = {
    # name: (spm_train options, bos id, eos id)
    "bpe": (["--model_type=bpe"], 1, 2),
    "unigram_bytes": (["--model_type=unigram", "--byte_fallback=true", "--bos_id=-1"], None, 2),
    # The end-of-sequence piece named as Gemma's: the eot is the model's eos id.
    "eos_named": (["--model_type=bpe", "--eos_piece=<eos>"], 1, 2),
}


def case_sentencepiece(m, c):
    for name, (opts, bos, eos) in SPM_MODELS.items():
        model = c.spm_model(name, opts)
        ids = c.spm_ids(name, model)
        bpe_case(m, c, ["--tokenizer", model], ids, bos, eos, 2000,
                 f"SentencePiece {name} (spm_train {' '.join(opts)})", model, "uint16", out=name + ".h5",
                 kind="sentencepiece")


def write_jsonl_variants(c, work):
    """Two jsonl files holding the corpus' documents under "body", with other
    keys around it and blank lines between (--jsonl-key body)."""
    docs = c.docs()
    half = len(docs) // 2
    paths = []
    for k, part in enumerate((docs[:half], docs[half:])):
        p = os.path.join(work, f"part{k}.jsonl")
        with open(p, "w", encoding="utf-8") as f:
            for j, d in enumerate(part):
                text = open(d, "rb").read().decode("utf-8")
                f.write(json.dumps({"id": j, "text": "not this one", "body": text, "meta": {"body": "x"}},
                                   ensure_ascii=False) + "\n")
                if j % 7 == 3:
                    f.write("\n  \n")
        paths.append(p)
    return paths


def case_jsonl(m, c):
    import numpy as np
    docs = c.docs()
    tj = c.tokenizer_json("gpt2")
    ref = c.gpt2_hf()
    m.tokenize(docs, "text.h5", "--tokenizer", tj)
    text_tokens, _, text_attrs = read_h5(os.path.join(m.work, "text.h5"))
    m.tokenize([c.path("corpus", "corpus.jsonl")], "jsonl.h5", "--tokenizer", tj, "--input", "jsonl")
    tokens, _, attrs = read_h5(os.path.join(m.work, "jsonl.h5"))
    same_stream(tokens, ref, None, GPT2_EOT, "corpus.jsonl (--input jsonl)", names_of(docs))
    check(np.array_equal(tokens, text_tokens), "corpus.jsonl: the same /tokens as the text files")
    check(attrs.get("documents") == len(docs), f"corpus.jsonl: documents {attrs.get('documents')} ({len(docs)})")
    check(attrs.get("bytes_read") == corpus_bytes(docs),
          f"corpus.jsonl: bytes_read {attrs.get('bytes_read')} = the documents' UTF-8 bytes ({corpus_bytes(docs)})")
    for k in ("vocab_size", "eot_id", "bos_id", "max_id", "tokenizer", "tokenizer_xxh3"):
        check(attrs.get(k) == text_attrs.get(k), f"corpus.jsonl: attribute {k} as the text files' ({attrs.get(k)})")
    parts = write_jsonl_variants(c, m.work)
    m.tokenize(parts, "keyed.h5", "--tokenizer", tj, "--input", "jsonl", "--jsonl-key", "body")
    keyed, _, kattrs = read_h5(os.path.join(m.work, "keyed.h5"))
    check(np.array_equal(keyed, text_tokens),
          "two jsonl files, --jsonl-key body (other keys, blank lines): the same /tokens as the text files")
    check(kattrs.get("documents") == len(docs), f"two jsonl files: documents {kattrs.get('documents')} ({len(docs)})")


def held_out(i, f):
    import math
    return math.floor((i + 1) * f) > math.floor(i * f)


def compare_files(a, b, what):
    """Two token files: the same datasets (dtype and bytes), the same attributes."""
    ta, va, aa = read_h5(a)
    tb, vb, ab = read_h5(b)
    check(ta.dtype == tb.dtype and ta.tobytes() == tb.tobytes(),
          f"{what}: /tokens the same bytes ({len(ta)} {ta.dtype.name} vs {len(tb)} {tb.dtype.name})")
    if va is None or vb is None:
        check(va is None and vb is None, f"{what}: /val_tokens in both or neither")
    else:
        check(va.dtype == vb.dtype and va.tobytes() == vb.tobytes(),
              f"{what}: /val_tokens the same bytes ({len(va)} vs {len(vb)})")
    diff = {k for k in set(aa) | set(ab) if aa.get(k) != ab.get(k)}
    check(not diff, f"{what}: the same attributes" +
          ("" if not diff else " except " + ", ".join(f"{k} ({aa.get(k)!r} vs {ab.get(k)!r})" for k in sorted(diff))))


def case_ranks(m, c):
    docs = c.docs()
    tj = c.tokenizer_json("gpt2")
    ref = c.gpt2_hf()
    f = 0.1
    runs = [("text", docs, []), ("jsonl", [c.path("corpus", "corpus.jsonl")], ["--input", "jsonl"])]
    for label, inputs, extra in runs:
        opts = ["--tokenizer", tj, "--val-fraction", str(f)] + extra
        m.tokenize(inputs, f"{label}1.h5", *opts, ranks=1)
        m.tokenize(inputs, f"{label}2.h5", *opts, ranks=2)
        compare_files(os.path.join(m.work, f"{label}1.h5"), os.path.join(m.work, f"{label}2.h5"),
                      f"GPT-2 {label}, --val-fraction {f}: 1 rank vs 2 ranks")
        t2, v2, _ = read_h5(os.path.join(m.work, f"{label}2.h5"))
        same_stream(t2, ref, None, GPT2_EOT, f"GPT-2 {label} on 2 ranks: /tokens", names_of(docs),
                    keep=lambda i: not held_out(i, f))
        same_stream(v2, ref, None, GPT2_EOT, f"GPT-2 {label} on 2 ranks: /val_tokens", names_of(docs),
                    keep=lambda i: held_out(i, f))
    tj = c.tokenizer_json("llama3")
    m.tokenize(docs, "llama1.h5", "--tokenizer", tj, ranks=1)
    m.tokenize(docs, "llama2.h5", "--tokenizer", tj, ranks=2)
    compare_files(os.path.join(m.work, "llama1.h5"), os.path.join(m.work, "llama2.h5"),
                  "Llama 3 text: 1 rank vs 2 ranks")


def case_val_fraction(m, c):
    docs = c.docs()
    tj = c.tokenizer_json("gpt2")
    ref = c.gpt2_hf()
    for f in (0.1, 0.5):
        out = f"val{f}.h5"
        m.tokenize(docs, out, "--tokenizer", tj, "--val-fraction", str(f))
        tokens, val, attrs = read_h5(os.path.join(m.work, out))
        held = [i for i in range(len(docs)) if held_out(i, f)]
        same_stream(tokens, ref, None, GPT2_EOT, f"--val-fraction {f}: /tokens (the kept documents)",
                    names_of(docs), keep=lambda i: not held_out(i, f))
        same_stream(val, ref, None, GPT2_EOT, f"--val-fraction {f}: /val_tokens (documents {held[:4]}...)",
                    names_of(docs), keep=lambda i: held_out(i, f))
        check(val is not None and val.dtype == tokens.dtype, f"--val-fraction {f}: /val_tokens of /tokens' type")
        check(attrs.get("val_documents") == len(held) and attrs.get("documents") == len(docs) - len(held),
              f"--val-fraction {f}: documents {attrs.get('documents')} ({len(docs) - len(held)}), "
              f"val_documents {attrs.get('val_documents')} ({len(held)})")
        check(attrs.get("bytes_read") == corpus_bytes(docs),
              f"--val-fraction {f}: bytes_read {attrs.get('bytes_read')} counts every document")


# --- bad inputs -------------------------------------------------------------

def expect_refusal(m, inputs, opts, what, must_name, ranks=1, out="bad.h5"):
    """meshlm tokenize fails: non-zero exit, each of must_name in its message,
    no OUT.h5 and no temporary file beside it."""
    for old in glob.glob(os.path.join(m.work, out + "*")):
        os.remove(old)
    rc, text = m.tokenize(inputs, out, *opts, ranks=ranks, ok=False)
    left = glob.glob(os.path.join(m.work, out + "*"))
    missing = [s for s in must_name if s not in text]
    good = rc != 0 and not missing and not left
    check(good, f"{what}: refused (exit {rc}), naming {', '.join(repr(s) for s in must_name)}"
          + (f"; not named: {missing}" if missing else "") + (f"; left behind: {left}" if left else ""))
    if not good:
        print("      " + text.strip()[-1500:].replace("\n", "\n      "))
    return text


def edited_tokenizer(c, work, name, edit):
    """A copy of GPT-2's tokenizer.json with edit(dict) applied."""
    with open(c.tokenizer_json("gpt2"), encoding="utf-8") as f:
        d = json.load(f)
    edit(d)
    p = os.path.join(work, name)
    with open(p, "w", encoding="utf-8") as f:
        json.dump(d, f)
    return p


def case_bad(m, c):
    docs = c.docs()
    few = docs[:3]
    w = m.work
    # tokenizer.json cut short in the middle of its vocabulary.
    cut = os.path.join(w, "cut.json")
    with open(c.tokenizer_json("gpt2"), "rb") as f:
        data = f.read()
    with open(cut, "wb") as f:
        f.write(data[:len(data) // 2])
    expect_refusal(m, few, ["--tokenizer", cut], "tokenizer.json cut short (malformed JSON)", [cut])
    expect_refusal(m, few, ["--tokeniser", "byte"], "a misspelt option, the one meant named",
                   ["--tokeniser", "did you mean '--tokenizer'?"])

    def model_type(t):
        def edit(d):
            d["model"]["type"] = t
        return edit
    for t in ("WordPiece", "Unigram"):
        p = edited_tokenizer(c, w, f"{t.lower()}.json", model_type(t))
        expect_refusal(m, few, ["--tokenizer", p], f"tokenizer.json of model type {t}", [p, t])

    def unknown_merge(d):
        d["model"]["merges"].insert(5, "Ġ zzqqxunknown")
    p = edited_tokenizer(c, w, "unknown_merge.json", unknown_merge)
    expect_refusal(m, few, ["--tokenizer", p], "a merge naming a token not in the vocabulary",
                   [p, "zzqqxunknown"])

    # JSON lines: 80 good lines, then one broken at line 3 or line 70.
    tj = c.tokenizer_json("gpt2")
    lines = [json.dumps({"text": open(d, "rb").read().decode("utf-8")}) for d in docs]
    ref = c.gpt2_hf()

    def jsonl(name, bad_at, bad_line):
        p = os.path.join(w, name)
        body = list(lines)
        body.insert(bad_at - 1, bad_line)
        with open(p, "w", encoding="utf-8") as f:
            f.write("\n".join(body) + "\n")
        return p
    not_json = jsonl("not_json.jsonl", 3, "this line is not JSON {")
    expect_refusal(m, [not_json], ["--tokenizer", tj, "--input", "jsonl"], "a jsonl line that is not JSON",
                   [not_json, "line 3"])
    late = jsonl("late.jsonl", 70, '{"text": "cut')
    expect_refusal(m, [late], ["--tokenizer", tj, "--input", "jsonl"],
                   "a broken jsonl line in the second rank's share, on 2 ranks", [late, "line 70"], ranks=2)
    no_key = jsonl("no_key.jsonl", 5, json.dumps({"body": "the text is under another key"}))
    expect_refusal(m, [no_key], ["--tokenizer", tj, "--input", "jsonl"], "a jsonl line without the key 'text'",
                   [no_key, "line 5", "text"])
    # Both bad lines in one file, skipped: counted, and the other lines' ids right.
    both = os.path.join(w, "both.jsonl")
    body = list(lines)
    body.insert(2, "this line is not JSON {")
    body.insert(4, json.dumps({"body": "no text key"}))
    with open(both, "w", encoding="utf-8") as f:
        f.write("\n".join(body) + "\n")
    for ranks in (1, 2):
        out = f"skipped{ranks}.h5"
        rc, text = m.tokenize([both], out, "--tokenizer", tj, "--input", "jsonl", "--skip-bad-lines",
                              ranks=ranks, ok=False)
        check(rc == 0, f"--skip-bad-lines on {ranks} rank(s): exit 0 ({rc})")
        if rc == 0:
            check(re.search(r"\b2\b[^\n]*bad line", text) is not None,
                  f"--skip-bad-lines on {ranks} rank(s): the 2 skipped lines counted in the log")
            tokens, _, attrs = read_h5(os.path.join(w, out))
            same_stream(tokens, ref, None, GPT2_EOT, f"--skip-bad-lines on {ranks} rank(s): the good lines' ids",
                        names_of(docs))
            check(attrs.get("documents") == len(docs),
                  f"--skip-bad-lines on {ranks} rank(s): documents {attrs.get('documents')} ({len(docs)})")
        else:
            print("      " + text.strip()[-1500:].replace("\n", "\n      "))

    # Empty corpora.
    empty = os.path.join(w, "empty.jsonl")
    open(empty, "w").close()
    expect_refusal(m, [empty], ["--tokenizer", tj, "--input", "jsonl"], "an empty jsonl file", [empty])
    blank = os.path.join(w, "blank.jsonl")
    with open(blank, "w") as f:
        f.write("\n\n   \n")
    expect_refusal(m, [blank], ["--tokenizer", tj, "--input", "jsonl"], "a jsonl file of blank lines", [blank])
    empty_txt = os.path.join(w, "empty.txt")
    open(empty_txt, "w").close()
    expect_refusal(m, [empty_txt], ["--tokenizer", tj, "--eot", "none"],
                   "an empty text file with --eot none (no token at all)", [empty_txt])
    expect_refusal(m, [empty], ["--tokenizer", tj, "--input", "jsonl"], "an empty jsonl file, on 2 ranks",
                   [empty], ranks=2)

    # A line with a byte that is not UTF-8: quoted printable in the message.
    bad_utf8 = os.path.join(w, "bad_utf8.jsonl")
    with open(bad_utf8, "wb") as f:
        f.write(b'{"text": "ok"}\n{"text": "\xff"}\n')
    text = expect_refusal(m, [bad_utf8], ["--tokenizer", tj, "--input", "jsonl"],
                          "a jsonl line with a byte that is not UTF-8", [bad_utf8, "line 2", "\\xff"])
    check("\udcff" not in text, "... the byte quoted as \\xff, not written raw")

    # --eot an id the tokenizer leaves unassigned (ids 50257-50299 of a
    # tokenizer.json with an added token at 50300).
    def gap(d):
        d["added_tokens"].append({"id": 50300, "content": "<|gap|>", "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
    gaps = edited_tokenizer(c, w, "gaps.json", gap)
    expect_refusal(m, few, ["--tokenizer", gaps, "--eot", "50280"], "--eot an id the tokenizer leaves unassigned",
                   ["--eot 50280", "unassigned"])

    # Errors about --eot are labelled --eot.
    text = expect_refusal(m, few, ["--eot", "256"], "--eot 256 with the byte tokenizer", ["--eot 256", "256"])
    check("--tokenizer" not in text, "--eot 256: the error labelled --eot, not --tokenizer")

    # An HDF5 file with /tokens that another tool wrote: refused, unchanged.
    import h5py
    import numpy as np
    foreign = os.path.join(w, "foreign.h5")
    with h5py.File(foreign, "w") as f:
        f["tokens"] = np.arange(5, dtype=np.uint16)
        f["weights"] = np.ones(3)
    before = open(foreign, "rb").read()
    rc, text = m.tokenize(few, foreign, "--tokenizer", tj, ok=False)
    check(rc != 0 and foreign in text and "not a meshlm token file" in text,
          f"an HDF5 file with /tokens that meshlm did not write: refused, named (exit {rc})")
    check(open(foreign, "rb").read() == before and not glob.glob(foreign + ".*"),
          "... and left as it was, nothing beside it")
    own = os.path.join(w, "own.h5")
    m.tokenize(few, own, "--tokenizer", tj)
    m.tokenize(few[:1], own, "--tokenizer", tj)
    _, _, attrs = read_h5(own)
    check(attrs.get("documents") == 1, "a token file meshlm wrote is replaced")


# --- the references against each other --------------------------------------

def case_references(m, c):
    import hf_bpe
    import openai_bpe
    docs = c.docs()
    texts = [open(d, "rb").read().decode("utf-8") for d in docs]
    enc = openai_bpe.Encoder.from_files(os.path.join(c.gpt2_dir, "encoder.json"),
                                        os.path.join(c.gpt2_dir, "vocab.bpe"))
    js_plain, js_hf = c.gpt2_openai(), c.gpt2_hf()
    py_plain = [enc.encode(t) for t in texts]
    py_hf = [enc.encode_special(t, SPECIAL) for t in texts]

    def agree(a, b, what):
        bad = [names_of(docs)[i] for i in range(len(docs)) if a[i] != b[i]]
        check(not bad, f"{what} on all {len(docs)} documents ({sum(map(len, b))} ids)" +
              (f"; they differ on {bad[:5]}" if bad else ""))
    agree(js_plain, py_plain, "GPT-2: reference_gpt2.js = openai_bpe.py, \"<|endoftext|>\" as text")
    agree(js_hf, py_hf, "GPT-2: reference_gpt2.js = openai_bpe.py, \"<|endoftext|>\" as 50256")
    check(js_plain != js_hf, "GPT-2: the corpus holds \"<|endoftext|>\" (the two readings differ)")
    for name in ("gpt2", "gpt2-pairs"):
        t = hf_bpe.TokenizerJson(c.tokenizer_json(name))
        agree([t.encode(x) for x in texts], js_hf, f"GPT-2: hf_bpe.py on tokenizer.json ({name}) = reference_gpt2.js")
    t = hf_bpe.TokenizerJson(c.tokenizer_json("llama3"))
    check(t.vocab_size == 128256 and t.bos_id == LLAMA3_BOS,
          f"Llama 3 tokenizer.json: vocabulary {t.vocab_size} (128256), BOS {t.bos_id} ({LLAMA3_BOS})")
    agree([t.encode(x) for x in texts], c.llama3(), "Llama 3: hf_bpe.py on tokenizer.json = reference_llama3.js")


CASES = {
    "gpt2_pair": case_gpt2_pair,
    "gpt2_json": case_gpt2_json,
    "gpt2_json_pairs": lambda m, c: case_gpt2_json(m, c, "gpt2-pairs"),
    "llama3_json": case_llama3_json,
    "sentencepiece": case_sentencepiece,
    "jsonl": case_jsonl,
    "ranks": case_ranks,
    "val_fraction": case_val_fraction,
    "bad": case_bad,
    "references": case_references,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshlm", help="the meshlm binary (all cases but references)")
    ap.add_argument("--mpiexec", default="", help="the command prefix of a 1-rank run")
    ap.add_argument("--mpiexec-two", default="", help="the command prefix of a 2-rank run")
    ap.add_argument("--scratch", required=True, help="work directory (its cache/ is shared by the cases)")
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    a = ap.parse_args()
    t0 = time.time()
    try:
        c = Cache(os.path.abspath(a.scratch))
        c.prepare()
        work = os.path.join(os.path.abspath(a.scratch), a.case)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        # openai_bpe.py and hf_bpe.py need it.
        need(importlib.util.find_spec("regex") is not None,
             "Python's regex module (Debian: python3-regex) is not installed")
        if a.case != "references":
            need(a.meshlm and os.path.isfile(a.meshlm), f"--meshlm {a.meshlm}: no such file")
        m = Meshlm(os.path.abspath(a.meshlm) if a.meshlm else "", a.mpiexec, a.mpiexec_two or a.mpiexec, work)
        CASES[a.case](m, c)
    except SystemExit as e:
        if e.code not in (None, 0) and not failures:
            failures.append("stopped")
    print(f"({time.time() - t0:.1f} s)")
    if failures:
        print(f"FAIL: {len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
