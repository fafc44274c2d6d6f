#!/usr/bin/env python3
"""The folders of meshlm point one way: every #include of a meshlm header
must follow the table below, and only comm/ and mesh/ call MPI.

Usage: check_layers.py SOURCE_DIR

The same table is in docs/DESIGN.md ("Layers"); this script also checks that
the two agree, so the documented arrows are the enforced ones. Exit 1 with one
line per broken rule.
"""
import os
import re
import sys

# folder -> the folders its files may include (besides its own). The paths
# are those of the #include lines: "core/error.h" is src/core, "io/h5.h" is
# io/, "cuda/..." is cuda/.
ALLOWED = {
    "core": [],
    "ops": ["core"],
    "comm": ["core"],
    "io": ["core"],
    "mesh": ["core", "comm"],
    "quant": ["core", "ops", "comm"],
    "model": ["core", "ops", "comm", "quant"],
    "load": ["core", "comm", "mesh", "quant", "model", "io"],
    "plan": ["core", "mesh", "quant", "model"],
    "train": ["core", "ops", "comm", "mesh", "quant", "model", "io", "load", "plan", "cuda"],
    "app": ["core", "ops", "comm", "mesh", "quant", "model", "io", "load", "plan", "train"],
    "cuda": ["core", "ops", "quant"],
}
# Only these folders call MPI functions (types such as MPI_Comm may appear
# anywhere in a signature).
MPI_CALLERS = {"comm", "mesh"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"', re.M)
MPI_CALL = re.compile(r"\bMPI_[A-Z][a-z_]*[a-z]\s*\(")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def folders(root):
    """(folder name, path) of every source folder."""
    out = []
    for name in sorted(os.listdir(os.path.join(root, "src"))):
        path = os.path.join(root, "src", name)
        if os.path.isdir(path):
            out.append((name, path))
    for name in ("io", "cuda"):
        out.append((name, os.path.join(root, name)))
    return out


def design_table(root):
    """The folder -> allowed table of docs/DESIGN.md's "may include" column."""
    text = open(os.path.join(root, "docs", "DESIGN.md"), encoding="utf-8").read()
    table = {}
    for line in text.splitlines():
        m = re.match(r"^\|\s*`(?:src/)?([a-z]+)/?`\s*\|([^|]*)\|([^|]*)\|\s*$", line)
        if not m:
            continue
        deps = re.findall(r"`([a-z]+)`", m.group(3))
        table[m.group(1)] = deps
    return table


def check(root):
    errors = []
    doc = design_table(root)
    for k in sorted(set(doc) | set(ALLOWED)):
        a, b = sorted(ALLOWED.get(k, ["(missing)"])), sorted(doc.get(k, ["(missing)"]))
        if a != b:
            errors.append(f"docs/DESIGN.md and this test disagree on {k}: test {a}, docs {b}")
    for name, path in folders(root):
        if name not in ALLOWED:
            errors.append(f"{name}/: a folder with no row in the table of allowed includes")
            continue
        for dirpath, _, files in os.walk(path):
            for f in sorted(files):
                if not f.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                file = os.path.join(dirpath, f)
                rel = os.path.relpath(file, root)
                text = open(file, encoding="utf-8").read()
                for m in INCLUDE.finditer(text):
                    to = m.group(1)
                    if to != name and to not in ALLOWED[name]:
                        line = text.count("\n", 0, m.start()) + 1
                        header = m.group(0).split('"')[1]
                        errors.append(f"{rel}:{line}: {name} may not include {to} ({header})")
                if name not in MPI_CALLERS:
                    code = COMMENT.sub("", text)
                    for m in MPI_CALL.finditer(code):
                        errors.append(f"{rel}: calls {m.group(0).rstrip('( ')} outside comm/ and mesh/")
    return errors


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    errors = check(sys.argv[1])
    for e in errors:
        print("FAIL:", e)
    if not errors:
        print(f"layers: {len(ALLOWED)} folders, every include follows the table, "
              "MPI only in comm/ and mesh/")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
