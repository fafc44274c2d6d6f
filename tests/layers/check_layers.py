#!/usr/bin/env python3
"""The folders of meshlm point one way: every #include of a meshlm header
must follow the table below, only comm/ and mesh/ call MPI, and only io/
calls HDF5's C API.

Usage: check_layers.py SOURCE_DIR
       check_layers.py --self-test SOURCE_DIR

The same table is in docs/DESIGN.md ("Layers"); this script also checks that
the two agree, so the documented arrows are the enforced ones. Exit 1 with one
line per broken rule. --self-test copies the sources to a scratch folder,
plants one violation of each rule there in turn (an include of a folder
above, an MPI call outside comm/ and mesh/, an HDF5 call outside io/, a
table that disagrees with DESIGN.md) and exits 1 unless the check reports
each one.
"""
import os
import re
import shutil
import sys
import tempfile

# folder -> the folders its files may include (besides its own). The paths
# are those of the #include lines: "core/error.h" is src/core, "io/h5.h" is
# io/, "cuda/..." is cuda/.
ALLOWED = {
    "core": [],
    "ops": ["core"],
    "comm": ["core"],
    "text": ["core"],
    "io": ["core"],
    "mesh": ["core", "comm"],
    "quant": ["core", "ops", "comm"],
    "model": ["core", "ops", "comm", "quant"],
    "load": ["core", "comm", "mesh", "quant", "model", "io"],
    "plan": ["core", "ops", "comm", "mesh", "quant", "model"],
    "train": ["core", "ops", "comm", "mesh", "quant", "model", "io", "load", "plan", "cuda"],
    "app": ["core", "ops", "comm", "mesh", "quant", "model", "io", "load", "plan", "train", "text"],
    "cuda": ["core", "ops", "comm", "quant"],
}
# Only these folders call MPI functions (types such as MPI_Comm may appear
# anywhere in a signature).
MPI_CALLERS = {"comm", "mesh"}
# Only io/ calls HDF5's C API (H5Fopen, H5Dread, ...; its types and constants
# may appear elsewhere in a signature).
HDF5_CALLERS = {"io"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"', re.M)
MPI_CALL = re.compile(r"\bMPI_[A-Z][a-z_]*[a-z]\s*\(")
HDF5_CALL = re.compile(r"\bH5[A-Z]?[a-z_][A-Za-z0-9_]*\s*\(")
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
                code = COMMENT.sub("", text)
                if name not in MPI_CALLERS:
                    for m in MPI_CALL.finditer(code):
                        errors.append(f"{rel}: calls {m.group(0).rstrip('( ')} outside comm/ and mesh/")
                if name not in HDF5_CALLERS:
                    for m in HDF5_CALL.finditer(code):
                        errors.append(f"{rel}: calls {m.group(0).rstrip('( ')} outside io/")
    return errors


def plant(root, rel, line):
    """Appends `line` to the file `rel` under root."""
    with open(os.path.join(root, rel), "a", encoding="utf-8") as f:
        f.write("\n" + line + "\n")


def self_test(root):
    """Each planted violation must add its own complaint; 0 when all do."""
    plants = [
        ("an include of a folder above", "src/core/error.h", '#include "train/engine.h"',
         "src/core/error.h", "core may not include train"),
        ("an MPI call outside comm/ and mesh/", "src/ops/kernels.cpp",
         "static void planted() { MPI_Barrier(MPI_COMM_WORLD); }", "src/ops/kernels.cpp",
         "calls MPI_Barrier outside comm/ and mesh/"),
        ("an HDF5 call outside io/", "src/model/gpt.cpp",
         "static void planted() { H5Fflush(0, H5F_SCOPE_LOCAL); }", "src/model/gpt.cpp",
         "calls H5Fflush outside io/"),
        ("an HDF5 call with a version digit outside io/", "src/plan/memory.cpp",
         "static void planted() { H5Literate2(0, H5_INDEX_NAME, H5_ITER_INC, 0, 0, 0); }",
         "src/plan/memory.cpp", "calls H5Literate2 outside io/"),
        ("a table that disagrees with DESIGN.md", "docs/DESIGN.md",
         "| `src/core/` | planted | `train` |", "docs/DESIGN.md", "disagree on core"),
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as scratch:
        for what, rel, line, _, expected in plants:
            copy = os.path.join(scratch, "tree")
            shutil.rmtree(copy, ignore_errors=True)
            for part in ("src", "io", "cuda", "docs"):
                shutil.copytree(os.path.join(root, part), os.path.join(copy, part))
            before = set(check(copy))
            plant(copy, rel, line)
            added = [e for e in check(copy) if e not in before]
            if any(expected in e for e in added):
                print(f"self-test: {what} is reported: {next(e for e in added if expected in e)}")
            else:
                print(f"FAIL: self-test: {what} ({rel}) is not reported; new complaints: {added}")
                failures += 1
    return 1 if failures else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--self-test":
        return self_test(sys.argv[2])
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    errors = check(sys.argv[1])
    for e in errors:
        print("FAIL:", e)
    if not errors:
        print(f"layers: {len(ALLOWED)} folders, every include follows the table, "
              "MPI only in comm/ and mesh/, HDF5 only in io/")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
