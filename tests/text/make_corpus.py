#!/usr/bin/python3
"""The text corpus of meshlm's tokenizer tests: real text from the machine's
Debian packages and two written documents, one document per file.

usage: make_corpus.py OUT_DIR [--size-kb N]

Writes into OUT_DIR (made if missing, its old *.txt and corpus.jsonl
replaced):
  NNNN-<name>.txt   one document a file, in corpus order (sorted by name);
  corpus.jsonl      the same documents in the same order, {"text": ...} a line;
  MANIFEST          name, bytes and SHA-256 of each document.

The documents, in this order:
  license-*         /usr/share/common-licenses/* (regular files, by name);
  unicode           written here: every script and whitespace case that a
                    pre-tokenizer treats specially (see UNICODE_DOC);
  changelog-*       /usr/share/doc/*/changelog.Debian.gz, decompressed, each
                    cut to its first 64 KiB at a line end, chosen in the
                    order of the SHA-256 of the package's name (a spread over
                    the alphabet) until the corpus holds --size-kb;
  special           written here: "<|endoftext|>" and Llama 3's special
                    tokens literally in the text (SPECIAL_DOC).
Only files that are valid UTF-8 are taken, and no document holds a character
on which the regular-expression engines of the references disagree
(DISPUTED, below); a file that does is left out and named on stderr.

Deterministic for a given set of installed packages: another machine's
packages give another corpus, never a different one on the same machine.
"""
import argparse
import glob
import gzip
import hashlib
import json
import os
import sys
import unicodedata

# Characters on which \s differs between the references' regular-expression
# engines (node's /u, Python's `regex`, PCRE2 10.42 with UCP):
#   U+FEFF  (zero-width no-break space, the byte-order mark) is \s in
#           JavaScript only;
#   U+0085  (next line) is \s in `regex` and PCRE2, not in JavaScript;
#   U+180E  (Mongolian vowel separator) is \s in PCRE2 only (Unicode 6.3
#           made it a format character).
# Letters and digits assigned after Unicode 14 (PCRE2 10.42's tables) are
# \p{L}/\p{N} in the newer engines only: characters unassigned in this
# Python's Unicode database are refused too (Debian 12's Python has 14.0).
DISPUTED = {"\ufeff": "U+FEFF", "\x85": "U+0085", "\u180e": "U+180E"}

CHANGELOG_CUT = 64 * 1024

# The written document: scripts, marks, emoji, whitespace and numbers. Held
# as escapes where the character would be invisible in this file.
UNICODE_DOC = "".join([
    "Unicode and whitespace cases for meshlm's tokenizer tests\n\n",
    # Accented Latin, precomposed and decomposed (combining marks).
    "Latin: Café naïve façade Ångström Ørsted Straße œuvre Dvořák Łódź Şişli ÆØÅ æøå ĳ ﬁ\n",
    "Combining: Cafe\u0301 nai\u0308ve A\u030angstro\u0308m n\u0303 Z\u0351\u0352\u0353\u0354 "
    "q\u0307\u0323 \u0301\u0301 e\u0301\u0301\u0301\n",
    "Greek: Καλημέρα κόσμε, ἀρχὴ ΣΊΣΥΦΟΣ ὀδυσσεύς ς σ Σ ϐ ϑ\n",
    "Cyrillic: Съешь же ещё этих мягких французских булок, да выпей чаю. Їжак Ґанок ЁЛКА\n",
    "CJK: 日本語のテキスト、漢字とかな。中文测试：你好，世界！繁體中文字。한국어 텍스트입니다. ｶﾀｶﾅ ＡＢＣ１２３\n",
    "Arabic: مرحبا بالعالم، هذا نص عربي ١٢٣٤٥ ۱۲۳ — Hebrew: שָׁלוֹם עולם\n",
    "Devanagari: नमस्ते दुनिया क्षत्रिय — Thai: สวัสดีชาวโลก — Tamil: வணக்கம்\n",
    # Emoji: skin tones, ZWJ families and professions, flags (regional
    # indicator pairs), a tag sequence, keycaps, variation selectors.
    "Emoji: 👍 👍🏽 🦙 😀😃😄 ❤️ ♥\ufe0e 👨\u200d👩\u200d👧\u200d👦 👩🏿\u200d💻 🏳️\u200d🌈 🤷\u200d♀️ "
    "🇫🇷🇯🇵🇺🇸🇩🇪 🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f 1️⃣ #️⃣ 🧑\u200d🤝\u200d🧑\n",
    # Contractions, in both cases (GPT-2's pattern matches lower case only;
    # Llama 3's any case), and the typographic apostrophe.
    "Contractions: it's don't they're we've I'm you'll he'd IT'S DON'T THEY'RE WE'VE I'M "
    "YOU'LL HE'D She'Ll We'Re it’s don’t 's 't 're 've 'm 'll 'd ''s\n",
    # Numbers: many digits (Llama 3 groups them by three), separators.
    "Numbers: 0 7 42 123 1234 12345 123456 1234567890123456789012345678901234567890 "
    "3.14159265358979323846264338327950288 1,000,000 1.000.000,00 -273.15 6.022e23 "
    "0x7fffffff 0b1011 12:34:56 2024-01-31 +1-555-0100 ½ ² Ⅻ ①②③\n",
    "Symbols: § ¶ © ® ™ € £ ¥ ∑ ∫ √ ∞ ≠ ≤ ≥ → ⇒ ∀ ∃ ° ± × ÷ «» „“ ‘’ … — – ¿¡ ‰\n",
    "Code: def f(x):\n    return x ** 2  # square\n\tif (a && b || !c) { y[i] += 1; }\n",
    "<html><body class=\"x\">Text&nbsp;here</body></html> C:\\path\\to\\file.txt "
    "https://example.com/a/b?c=d&e=f#g user@example.com $HOME ~/.cache\n",
    # Runs of spaces, tabs and newlines; trailing spaces; \r\n lines; other
    # Unicode spaces (no-break, thin, ideographic, line separator), vertical
    # tab and form feed.
    "Spaces: a  b   c    d     e\t\tf \t \tg\n\n\n   \n\t\n \n",
    "trailing spaces   \n" "trailing tab\t\n" "   leading spaces\n" "\t\tleading tabs\n",
    "windows line\r\nanother windows line\r\n\r\n  \r\nmixed\n\r\n\r\r\n",
    "no\u00a0break thin\u2009space ideographic\u3000space line\u2028separator "
    "para\u2029separator vertical\x0btab form\x0cfeed zero\u200bwidth joiner\u200dhere\n",
    "Controls: bell\x07 escape\x1b[0m delete\x7f unit\x1fsep\n",
    "Long: Pneumonoultramicroscopicsilicovolcanoconiosis Donaudampfschifffahrtsgesellschaftskapitän ",
    "a" * 300, " ", "!" * 40, " ", "=" * 72, "\n", ",,,,,,,,,,,,,,,,", " ,,, ,, , ...... ---- ____ ****\n",
    " " * 200, "x\n",
    "\t" * 20, "y\n",
    "\n" * 12,
    "ending with whitespace  \n\n  ",
])

# "<|endoftext|>" is GPT-2's end of text: Hugging Face's encode (and meshlm's,
# from a tokenizer.json) turns it into id 50256, OpenAI's encoder and its JS
# port read it as text. Kept in a document of its own so that a check can
# leave it out or split it as Hugging Face does. Llama 3's special tokens
# (and one that only looks like one) are here too.
SPECIAL_DOC = (
    "A document with special tokens written in its text.\n"
    "Before<|endoftext|>after, then  <|endoftext|>  with spaces, twice "
    "<|endoftext|><|endoftext|> and at the end of a line<|endoftext|>\n"
    "Not special: <|endoftext |> <endoftext> <|endoftext| > <||>\n"
    "Llama 3: <|begin_of_text|>Hello<|eot_id|> <|start_header_id|>user<|end_header_id|>\n\n"
    "<|end_of_text|> <|reserved_special_token_0|> <|reserved_special_token_250|> (no such token)\n"
    "<|endoftext|>"
)


def disputed(text):
    """The first character of `text` the engines may disagree on, or None."""
    for ch in text:
        if ch in DISPUTED:
            return DISPUTED[ch]
        if ord(ch) > 0x7F and unicodedata.category(ch) == "Cn":
            return f"U+{ord(ch):04X} (unassigned in Unicode {unicodedata.unidata_version})"
    return None


def cut_at_line(text, limit):
    """The first `limit` characters of `text`, ending at a line end when the
    text is longer."""
    if len(text) <= limit:
        return text
    end = text.rfind("\n", 0, limit)
    return text[:end + 1] if end > 0 else text[:limit]


def as_text(data, path):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        print(f"make_corpus: {path}: not UTF-8, left out", file=sys.stderr)
        return None


def documents(size_bytes):
    """[(name, text)] in corpus order."""
    docs = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            text = as_text(f.read(), path)
        if text:
            docs.append(("license-" + os.path.basename(path), text))
    docs.append(("unicode", UNICODE_DOC))
    total = sum(len(t.encode()) for _, t in docs) + len(SPECIAL_DOC.encode())
    logs = sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"),
                  key=lambda p: hashlib.sha256(p.split("/")[4].encode()).hexdigest())
    for path in logs:
        if total >= size_bytes:
            break
        try:
            with gzip.open(path, "rb") as f:
                data = f.read()
        except (OSError, EOFError) as e:
            print(f"make_corpus: {path}: {e}, left out", file=sys.stderr)
            continue
        text = as_text(data, path)
        if not text or not text.strip():
            continue
        text = cut_at_line(text, CHANGELOG_CUT)
        docs.append(("changelog-" + path.split("/")[4], text))
        total += len(text.encode())
    docs.append(("special", SPECIAL_DOC))
    kept = []
    for name, text in docs:
        bad = disputed(text)
        if bad:
            print(f"make_corpus: {name}: holds {bad}, left out", file=sys.stderr)
            continue
        kept.append((name, text))
    return kept


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--size-kb", type=int, default=1280,
                    help="stop taking changelogs at this many KiB (default 1280)")
    a = ap.parse_args()
    docs = documents(a.size_kb * 1024)
    total = sum(len(t.encode()) for _, t in docs)
    if total < 1 << 20 and a.size_kb >= 1024:
        sys.exit(f"make_corpus: only {total} bytes of text found (need 1 MiB): are "
                 "/usr/share/doc/*/changelog.Debian.gz there?")
    os.makedirs(a.out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(a.out_dir, "*.txt")):
        os.remove(old)
    manifest = []
    with open(os.path.join(a.out_dir, "corpus.jsonl"), "w", encoding="utf-8") as jl:
        for i, (name, text) in enumerate(docs):
            data = text.encode("utf-8")
            fname = f"{i:04d}-{name}.txt"
            with open(os.path.join(a.out_dir, fname), "wb") as f:
                f.write(data)
            # ensure_ascii: every non-ASCII character as a \u escape (surrogate
            # pairs above U+FFFF), so the JSON reader's escapes are exercised.
            jl.write(json.dumps({"text": text}, ensure_ascii=True) + "\n")
            manifest.append(f"{fname}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}")
    with open(os.path.join(a.out_dir, "MANIFEST"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    print(f"make_corpus: {len(docs)} documents, {total} bytes -> {a.out_dir}")


if __name__ == "__main__":
    main()
