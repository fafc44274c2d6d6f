#!/usr/bin/python3
"""A byte-level BPE tokenizer.json encoder in plain Python, written from
Hugging Face tokenizers' documented behaviour for the files that
make_tokenizer_json.py writes (GPT-2, Llama 3): a second reference for
meshlm's tokenizer.json reader, next to the JavaScript packages.

What it does with a tokenizer.json:
  1. added tokens: the text is split at each occurrence of an added token's
     content (leftmost, then longest, as tokenizers' Aho-Corasick search);
     each becomes its id, the parts between are encoded alone;
  2. pre-tokenizer: ByteLevel with use_regex (GPT-2's pattern), or a Sequence
     of Split (a Regex, behaviour Isolated: the matches and the text between
     them are the pieces) and ByteLevel without regex; ByteLevel maps each
     piece's UTF-8 bytes to GPT-2's printable characters;
  3. model BPE: merges by rank (their order in "merges", "a b" strings or
     [a, b] pairs), lowest first, left to right; with ignore_merges a piece
     that is itself in the vocabulary is taken whole;
  4. post-processor: the id a TemplateProcessing (alone or in a Sequence)
     puts before the sequence, reported by bos_id (encode never adds it).
Anything else (normalizers, other models, other pre-tokenizers) is refused:
this is a reference for two known files, not a general reader.

usage: hf_bpe.py TOKENIZER.json FILE...   one JSON array of ids per file
       hf_bpe.py TOKENIZER.json --text "..."
"""
import argparse
import json
import sys

import regex

from openai_bpe import PAT as GPT2_PAT, bytes_to_unicode


class TokenizerJson:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        m = d["model"]
        if m.get("type") != "BPE":
            raise ValueError(f"{path}: model type {m.get('type')!r}, not BPE")
        if d.get("normalizer") is not None:
            raise ValueError(f"{path}: normalizers are not supported here")
        self.vocab = dict(m["vocab"])
        self.ranks = {}
        for r, merge in enumerate(m["merges"]):
            a, b = merge.split(" ") if isinstance(merge, str) else merge
            self.ranks.setdefault((a, b), r)
        self.ignore_merges = bool(m.get("ignore_merges", False))
        self.added = {t["content"]: t["id"] for t in d.get("added_tokens", [])}
        self.vocab_size = 1 + max(list(self.vocab.values()) + list(self.added.values()))
        self.byte_map = bytes_to_unicode()
        self.splitters = self._pre_tokenizer(d.get("pre_tokenizer"))
        self.bos_id = self._bos(d.get("post_processor"))
        # Longest first: regex alternation takes the first alternative that
        # matches at the leftmost position, so this is leftmost-longest.
        names = sorted(self.added, key=len, reverse=True)
        self.added_re = regex.compile("|".join(regex.escape(n) for n in names)) if names else None
        self.cache = {}

    def _pre_tokenizer(self, p):
        """A list of compiled patterns, applied in turn (Isolated splits)."""
        if p is None:
            raise ValueError("no pre_tokenizer")
        if p["type"] == "ByteLevel":
            if p.get("add_prefix_space"):
                raise ValueError("ByteLevel add_prefix_space is not supported here")
            return [GPT2_PAT] if p.get("use_regex", True) else []
        if p["type"] == "Sequence":
            out = []
            for q in p["pretokenizers"]:
                if q["type"] == "Split":
                    if q.get("behavior") != "Isolated" or q.get("invert"):
                        raise ValueError("only Split behavior Isolated, invert false")
                    pat = q["pattern"]
                    out.append(regex.compile(pat["Regex"]) if "Regex" in pat
                               else regex.compile(regex.escape(pat["String"])))
                else:
                    out.extend(self._pre_tokenizer(q))
            return out
        raise ValueError(f"pre_tokenizer {p['type']} is not supported here")

    def _bos(self, p):
        if p is None:
            return None
        if p["type"] == "Sequence":
            for q in p["processors"]:
                b = self._bos(q)
                if b is not None:
                    return b
            return None
        if p["type"] == "TemplateProcessing":
            first = p["single"][0]
            if "SpecialToken" in first:
                name = first["SpecialToken"]["id"]
                return p["special_tokens"][name]["ids"][0]
        return None

    @staticmethod
    def _isolated(pattern, pieces):
        """Split's "Isolated": each match is a piece, and so is the text
        between two matches."""
        out = []
        for s in pieces:
            prev = 0
            for mt in pattern.finditer(s):
                if mt.start() > prev:
                    out.append(s[prev:mt.start()])
                if mt.end() > mt.start():
                    out.append(mt.group())
                prev = mt.end()
            if prev < len(s):
                out.append(s[prev:])
        return out

    def bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        if self.ignore_merges and word in self.vocab:
            ids = [self.vocab[word]]
            self.cache[word] = ids
            return ids
        symbols = list(word)
        while len(symbols) > 1:
            best, best_rank = None, None
            for pair in zip(symbols, symbols[1:]):
                r = self.ranks.get(pair)
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = pair, r
            if best is None:
                break
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == best[0] and symbols[i + 1] == best[1]:
                    merged.append(best[0] + best[1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        ids = [self.vocab[s] for s in symbols]
        self.cache[word] = ids
        return ids

    def encode_plain(self, text):
        pieces = [text] if text else []
        for pat in self.splitters:
            pieces = self._isolated(pat, pieces)
        ids = []
        for piece in pieces:
            ids.extend(self.bpe("".join(self.byte_map[b] for b in piece.encode("utf-8"))))
        return ids

    def encode(self, text):
        """Ids of `text`, added tokens recognised, no BOS."""
        if self.added_re is None:
            return self.encode_plain(text)
        ids, prev = [], 0
        for mt in self.added_re.finditer(text):
            ids.extend(self.encode_plain(text[prev:mt.start()]))
            ids.append(self.added[mt.group()])
            prev = mt.end()
        ids.extend(self.encode_plain(text[prev:]))
        return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tokenizer_json")
    ap.add_argument("files", nargs="*")
    ap.add_argument("--text")
    a = ap.parse_intermixed_args()
    t = TokenizerJson(a.tokenizer_json)
    if a.text is not None:
        print(json.dumps(t.encode(a.text)))
    for path in a.files:
        with open(path, "rb") as f:
            sys.stdout.write(json.dumps(t.encode(f.read().decode("utf-8")), separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
