#!/usr/bin/env python3
"""Checkpoint write and read throughput of GPT-2 124M with its optimizer
state, at 1, 2 and 4 ranks, beside a plain sequential write and read of the
same number of bytes to the same directory in the same run.

  tests/bench/checkpoint_bench.py BUILD SCRATCH [--ranks 1,2,4] [--threads T]

BUILD holds meshlm; SCRATCH (on the disk to measure) receives the token
file, the runs' output and checkpoints, and the plain files, all removed at
the end. Per rank count:

  write   mpiexec -n N meshlm train, dp N ZeRO 1, checkpoint.every = 1 for 2
          steps: the time of each save as meshlm reports it (temporary file,
          collective writes, read back and hashed, checksums and /meta,
          fsync, rename, `latest`), bytes = the file's size. The best of
          the two.
  read    the step-2 checkpoint's pages dropped from the page cache
          (posix_fadvise DONTNEED after its fsync), then a resume from it:
          "loaded and verified in" (every checksum recomputed, then every
          rank reads its part).
  plain   one process writes the same number of bytes in 16 MiB blocks and
          fsyncs (the time includes the fsync, as the checkpoint's does),
          drops the file's pages, reads it back in 16 MiB blocks. The best
          of two.
  async   checkpoint.async = true, a checkpoint every 2 steps of 6: the
          training stall per checkpoint (the main thread's time in save:
          the snapshot copy and any wait for the write before) against the
          copy alone, and the step times while a write goes on against a
          run without checkpoints.

Prints a Markdown table (docs/PERFORMANCE.md).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

MIB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "inputs", "tiny.cfg")  # every key it sets is overridden below
BLOCK = 16 * MIB
GPT2 = ["--model.n_layer=12", "--model.n_head=12", "--model.n_embd=768",
        "--model.vocab_size=50304", "--model.seq_len=64", "--model.max_seq_len=64",
        "--train.micro_batch_size=1", "--train.warmup_steps=0", "--train.log_every=1"]


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_memory(gib):
    """Touches `gib` GiB and frees them: a virtual machine that backs its
    memory on first touch (as the one of docs/PERFORMANCE.md does, at about
    0.4 GB/s) then serves meshlm's buffers, the page cache and the peer's
    alike at memory speed."""
    t0 = time.perf_counter()
    block = bytearray(1 << 30)
    for _ in range(gib):
        b = bytearray(1 << 30)
        b[::4096] = block[::4096]
        del b
    return time.perf_counter() - t0


def plain_write_read(path, nbytes):
    buf = os.urandom(BLOCK)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    left = nbytes
    while left > 0:
        left -= os.write(fd, buf[:min(BLOCK, left)])
    os.fsync(fd)
    os.close(fd)
    t_write = time.perf_counter() - t0
    drop_cache(path)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    got = 0
    while True:
        b = os.read(fd, BLOCK)
        if not b:
            break
        got += len(b)
    os.close(fd)
    t_read = time.perf_counter() - t0
    assert got == nbytes
    os.remove(path)
    return t_write, t_read


def run(cmd, log):
    with open(log, "w") as out:
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    text = open(log).read()
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{text[-3000:]}")
    return text


def step_times(text):
    """ms/step of each logged step, by step number."""
    out = {}
    for m in re.finditer(r"^\s+(\d+)\s+[\d.]+\s+[\d.e+-]+\s+[\d.]+\s+([\d.]+)\s+\d+\s*$", text, re.M):
        out[int(m.group(1))] = float(m.group(2)) / 1e3
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("scratch")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--threads", type=int, default=1, help="runtime.threads per rank")
    ap.add_argument("--warm-gib", type=int, default=12,
                    help="GiB of memory touched and freed before each rank count (0: none)")
    a = ap.parse_args()
    meshlm = os.path.abspath(os.path.join(a.build, "meshlm"))
    os.makedirs(a.scratch, exist_ok=True)
    scratch = os.path.abspath(a.scratch)
    tokens = os.path.join(scratch, "gpl3.h5")
    base = GPT2 + [f"--data.path={tokens}", "--data.tokenize_from=/usr/share/common-licenses/GPL-3",
                   f"--runtime.threads={a.threads}", "--output.overwrite=true",
                   "--train.lr=1e-4"]
    mpi = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
    rows = []
    for n in [int(x) for x in a.ranks.split(",")]:
        d = os.path.join(scratch, f"n{n}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        ck = os.path.join(d, "ck")
        if a.warm_gib > 0:
            print(f"# {n} rank(s): {a.warm_gib} GiB of memory touched in {warm_memory(a.warm_gib):.1f} s",
                  file=sys.stderr)
        common = base + [f"--parallel.dp={n}", "--parallel.zero_stage=1",
                         f"--train.batch_size={n}", f"--checkpoint.dir={ck}",
                         "--checkpoint.keep_last=0"]
        # Write: two saves.
        text = run(mpi + ["-n", str(n), meshlm, "train", TINY, f"--output.dir={d}/w", "--train.steps=2",
                          "--checkpoint.every=1", "--checkpoint.final=false"] + common,
                   os.path.join(d, "write.log"))
        saves = re.findall(r"# checkpoint: step \d+ -> \S+ \| .*? in ([\d.]+) s \(.*?\): data ([\d.]+) s, "
                           r"read back and hashed ([\d.]+) s, on disk and renamed ([\d.]+) s", text)
        assert len(saves) == 2, text[-2000:]
        best = min(saves, key=lambda s: float(s[0]))
        f2 = os.path.join(ck, "step_00000002.h5")
        nbytes = os.path.getsize(f2)
        # Read: a resume from step 2 with nothing left to train.
        os.remove(os.path.join(ck, "step_00000001.h5"))
        drop_cache(f2)
        text = run(mpi + ["-n", str(n), meshlm, "train", TINY, f"--output.dir={d}/r", "--train.steps=2",
                          f"--checkpoint.resume={f2}", "--checkpoint.final=false"] + common,
                   os.path.join(d, "read.log"))
        load = float(re.search(r"loaded and verified in ([\d.]+) s", text).group(1))
        # Plain, same bytes, same directory.
        plain = [plain_write_read(os.path.join(d, "plain.bin"), nbytes) for _ in range(2)]
        pw, pr = min(p[0] for p in plain), min(p[1] for p in plain)
        # Async: a checkpoint every 2 steps of 6, against no checkpoints.
        shutil.rmtree(ck, ignore_errors=True)
        text_a = run(mpi + ["-n", str(n), meshlm, "train", TINY, f"--output.dir={d}/a", "--train.steps=6",
                            "--checkpoint.every=2", "--checkpoint.final=false",
                            "--checkpoint.async=true"] + common, os.path.join(d, "async.log"))
        stalls = re.findall(r"copied to the host snapshot \(.*?\) in ([\d.]+) s; training waited "
                            r"([\d.]+) s in all", text_a)
        bg = re.findall(r"ended ([\d.]+) s after it began; training waited ([\d.]+) s for it at "
                        r"the end and ([\d.]+) s for HDF5", text_a)
        text_n = run(mpi + ["-n", str(n), meshlm, "train", TINY, f"--output.dir={d}/n", "--train.steps=6",
                            "--checkpoint.final=false"] + common, os.path.join(d, "none.log"))
        ta, tn = step_times(text_a), step_times(text_n)
        during = [ta[s] for s in (3, 5) if s in ta]  # the steps after a snapshot
        quiet = [tn[s] for s in (3, 5) if s in tn]
        rows.append(dict(n=n, bytes=nbytes, write=float(best[0]), data=float(best[1]),
                         hashed=float(best[2]), flushed=float(best[3]), read=load, pw=pw, pr=pr,
                         copy=max(float(s[0]) for s in stalls),
                         stall=max(float(s[1]) for s in stalls),
                         bg=max(float(b[0]) for b in bg) if bg else float("nan"),
                         h5wait=max(float(b[2]) for b in bg) if bg else float("nan"),
                         during=sum(during) / len(during), quiet=sum(quiet) / len(quiet)))
        shutil.rmtree(d, ignore_errors=True)
    if os.path.exists(tokens):
        os.remove(tokens)

    gb = 1e9
    print("| ranks | checkpoint | write | plain write | ratio | read (verified) | plain read | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['n']} | {r['bytes'] / gb:.2f} GB | {r['write']:.2f} s ({r['bytes'] / gb / r['write']:.2f} GB/s) "
              f"| {r['pw']:.2f} s ({r['bytes'] / gb / r['pw']:.2f} GB/s) | {r['pw'] / r['write']:.2f} "
              f"| {r['read']:.2f} s ({r['bytes'] / gb / r['read']:.2f} GB/s) "
              f"| {r['pr']:.2f} s ({r['bytes'] / gb / r['pr']:.2f} GB/s) | {r['pr'] / r['read']:.2f} |")
    print()
    print("| ranks | data written | read back and hashed | fsync and rename | write without the read-back | ratio to plain |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        w = r['data'] + r['flushed']
        print(f"| {r['n']} | {r['data']:.2f} s | {r['hashed']:.2f} s | {r['flushed']:.2f} s | {w:.2f} s "
              f"({r['bytes'] / gb / w:.2f} GB/s) | {r['pw'] / w:.2f} |")
    print()
    print("| ranks | snapshot copy | stall per checkpoint (worst) | background write | main thread's HDF5 waits | step during a write | step without checkpoints |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['n']} | {r['copy']:.3f} s | {r['stall']:.3f} s | {r['bg']:.2f} s | {r['h5wait']:.3f} s "
              f"| {r['during']:.2f} s | {r['quiet']:.2f} s |")


if __name__ == "__main__":
    main()
