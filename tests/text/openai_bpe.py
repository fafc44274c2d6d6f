#!/usr/bin/python3
"""GPT-2's byte-level BPE encoder, transcribed from the algorithm of OpenAI's
gpt-2 repository (src/encoder.py): an independent reference for meshlm's
tokenizer, in plain Python with the `regex` module (Debian: python3-regex).

The algorithm:
  1. pre-tokenize the text with GPT-2's pattern (PAT below): contractions,
     an optional space and a run of letters, of digits, or of other
     non-space characters, whitespace not followed by a non-space, whitespace;
  2. map each pre-token's UTF-8 bytes to printable characters
     (bytes_to_unicode: the printable Latin-1 bytes stand for themselves,
     the other 68 go to U+0100 and up, in byte order);
  3. merge adjacent symbols of the pre-token, always the pair of lowest rank
     (its line in vocab.bpe), every occurrence of it from left to right, until
     no pair has a rank;
  4. look each symbol up in encoder.json.
Special tokens are not recognised: "<|endoftext|>" in the text is text, as
in OpenAI's encoder (split_special() gives Hugging Face's behaviour).

usage as a module:
    enc = Encoder.from_files("encoder.json", "vocab.bpe")
    ids = enc.encode("Hello world")
usage as a command:
    openai_bpe.py ENCODER.json VOCAB.bpe FILE...        one JSON array of ids
                                                        per file, one a line
    openai_bpe.py ENCODER.json VOCAB.bpe --text "..."   the ids of a string
    options: --special TOKEN  split the text at TOKEN and put its id between
                              the parts (Hugging Face's added tokens)
"""
import argparse
import json
import sys

import regex

# GPT-2's pre-tokenizer pattern, as in OpenAI's encoder.py. \s, \p{L} and
# \p{N} are Unicode classes here; JavaScript's /u and PCRE2's UCP agree with
# the `regex` module on them except on a few characters (make_corpus.py keeps
# those out of the corpus).
PAT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    """byte -> printable character: bytes that print as themselves in Latin-1
    ('!'..'~', '\xa1'..'\xac', '\xae'..'\xff') keep their code point; the
    rest, in increasing byte order, take 256, 257, ..."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    table = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_merges(path):
    """vocab.bpe: a version line, then one merge "a b" a line, highest
    priority first. Returns {(a, b): rank}."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    ranks = {}
    for line in lines[1:]:
        if not line.strip():
            continue
        a, b = line.split()
        ranks.setdefault((a, b), len(ranks))
    return ranks


class Encoder:
    def __init__(self, encoder, ranks):
        self.encoder = encoder           # symbol string -> id
        self.decoder = {v: k for k, v in encoder.items()}
        self.ranks = ranks               # (a, b) -> rank
        self.byte_map = bytes_to_unicode()
        self.byte_unmap = {c: b for b, c in self.byte_map.items()}
        self.cache = {}

    @classmethod
    def from_files(cls, encoder_json, vocab_bpe):
        with open(encoder_json, encoding="utf-8") as f:
            encoder = json.load(f)
        return cls(encoder, read_merges(vocab_bpe))

    def bpe(self, word):
        """The merged symbols of one byte-mapped pre-token."""
        if word in self.cache:
            return self.cache[word]
        symbols = list(word)
        while len(symbols) > 1:
            best, best_rank = None, None
            for pair in zip(symbols, symbols[1:]):
                r = self.ranks.get(pair)
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = pair, r
            if best is None:
                break
            merged = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == best[0] and symbols[i + 1] == best[1]:
                    merged.append(best[0] + best[1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        self.cache[word] = symbols
        return symbols

    def pretokens(self, text):
        return PAT.findall(text)

    def encode(self, text):
        ids = []
        for piece in PAT.findall(text):
            word = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[s] for s in self.bpe(word))
        return ids

    def encode_special(self, text, special):
        """Hugging Face's way with an added token: the text split at each
        occurrence of `special`, each part encoded alone, the token's id
        between the parts."""
        sid = self.encoder[special]
        ids = []
        for i, part in enumerate(text.split(special)):
            if i:
                ids.append(sid)
            ids.extend(self.encode(part))
        return ids

    def decode(self, ids):
        s = "".join(self.decoder[i] for i in ids)
        return bytes(self.byte_unmap[c] for c in s).decode("utf-8", errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("encoder_json")
    ap.add_argument("vocab_bpe")
    ap.add_argument("files", nargs="*")
    ap.add_argument("--text")
    ap.add_argument("--special", help="an added token (e.g. '<|endoftext|>')")
    a = ap.parse_intermixed_args()
    enc = Encoder.from_files(a.encoder_json, a.vocab_bpe)

    def ids_of(text):
        return enc.encode_special(text, a.special) if a.special else enc.encode(text)

    if a.text is not None:
        print(json.dumps(ids_of(a.text)))
    for path in a.files:
        # Bytes decoded here: text mode would turn "\r\n" into "\n".
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        sys.stdout.write(json.dumps(ids_of(text), separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
