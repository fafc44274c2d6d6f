#!/usr/bin/python3
"""Cross-check meshlm's quantization formats (src/quant/formats.h) against an
independent implementation in numpy, and the NF4 levels against the normal
quantiles that define them.

Usage:
  check_nf4.py TOOL

TOOL is meshlm_quantdump (tests/tools/quantdump.cpp):
  TOOL levels OUT                   the 16 NF4 levels, float32
  TOOL quantize TYPE IN.f32 OUTDIR  OUTDIR/<array>.bin for each array of the
                                    tensor (data, absmax, absmax2, offset) and
                                    OUTDIR/dequant.f32

Checks:
  1. The NF4 levels as QLoRA defines them (bitsandbytes
     create_normal_map(offset=0.9677083, use_extra_value=True)):
       positive = ndtri(linspace(offset, 0.5, 9)[:-1])     (8 values)
       negative = -ndtri(linspace(offset, 0.5, 8)[:-1])    (7 values)
       levels   = sort(positive, 0, negative) / max
     computed with torch.special.ndtri and again with statistics.NormalDist,
     must equal meshlm's table within 1e-6.
  2. For several tensors (random normal with a partial last block and
     several double-quantization groups, zero and constant blocks, values on
     the levels, n = 1, odd n), meshlm's nf4 and int8 arrays must equal
     byte for byte those of the numpy implementation below, and meshlm's
     dequantized values must match numpy's within float32 rounding.
Exit status 1 on any failure.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import torch

BLOCK = 64            # elements per block (int8 and nf4)
ABSMAX_BLOCK = 256    # nf4 blocks per group of the double quantization
NF4_ZERO_CODE = 7
LEVEL_TOL = 1e-6


def normal_map_torch(offset=0.9677083):
    # As bitsandbytes: linspace in float32, quantiles in float64, the result
    # in float32, divided by its largest value.
    pos = torch.special.ndtri(torch.linspace(offset, 0.5, 9)[:-1].double())
    neg = -torch.special.ndtri(torch.linspace(offset, 0.5, 8)[:-1].double())
    v = torch.cat([pos, torch.zeros(1, dtype=torch.float64), neg]).float()
    v = v.sort().values
    return (v / v.max()).numpy()


def normal_map_stdlib(offset=0.9677083):
    nd = statistics.NormalDist()
    lin = lambda a, b, k: [a + (b - a) * i / (k - 1) for i in range(k)]
    pos = [nd.inv_cdf(p) for p in lin(offset, 0.5, 9)[:-1]]
    neg = [-nd.inv_cdf(p) for p in lin(offset, 0.5, 8)[:-1]]
    v = sorted(pos + [0.0] + neg)
    return np.array([x / max(v) for x in v])


def round_half_away(y):
    """Round float32 values half away from zero, exactly (in float64)."""
    y = y.astype(np.float64)
    return np.sign(y) * np.floor(np.abs(y) + 0.5)


def blocks_of(x):
    n = x.size
    nb = -(-n // BLOCK)
    padded = np.zeros(nb * BLOCK, np.float32)
    padded[:n] = x
    return padded.reshape(nb, BLOCK)


def ref_int8(x):
    b = blocks_of(x)
    absmax = np.abs(b).max(axis=1)
    safe = np.where(absmax > 0, absmax, np.float32(1))
    y = (b / safe[:, None]) * np.float32(127)
    q = np.clip(round_half_away(y), -127, 127)
    q[absmax == 0] = 0
    q = q.reshape(-1)[: x.size].astype(np.int8)
    deq = q.astype(np.float32) * np.repeat(absmax / np.float32(127), BLOCK)[: x.size]
    return {"data": q.tobytes(), "absmax": absmax.astype(np.float32).tobytes()}, deq


def ref_nf4(x, levels):
    n = x.size
    b = blocks_of(x)
    nb = b.shape[0]
    absmax = np.abs(b).max(axis=1)
    safe = np.where(absmax > 0, absmax, np.float32(1))
    v = b / safe[:, None]
    # Nearest level in float32; argmin takes the first, i.e. lower, index on a tie.
    codes = np.argmin(np.abs(v[:, :, None] - levels[None, None, :]), axis=2)
    codes[absmax == 0] = NF4_ZERO_CODE
    codes = codes.reshape(-1)[:n].astype(np.uint8)
    if n % 2:
        codes = np.append(codes, np.uint8(0))
    packed = (codes[0::2] << 4) | codes[1::2]

    # Double quantization: the mean summed in double in block order.
    s = 0.0
    for a in absmax:
        s += float(a)
    offset = np.float32(s / nb)
    d = absmax - offset
    ng = -(-nb // ABSMAX_BLOCK)
    absmax2 = np.array([np.abs(d[g * ABSMAX_BLOCK:(g + 1) * ABSMAX_BLOCK]).max()
                        for g in range(ng)], np.float32)
    a2 = np.repeat(absmax2, ABSMAX_BLOCK)[:nb]
    ratio = np.where(a2 > 0, d / np.where(a2 > 0, a2, np.float32(1)), np.float32(0))
    absmax_q = np.clip(round_half_away(np.float32(127) * ratio.astype(np.float32)), -127, 127)
    absmax_q = absmax_q.astype(np.int8)

    absmax_dq = absmax_q.astype(np.float64) * np.float64(a2 / np.float32(127)) + np.float64(offset)
    deq = (levels[codes[:n]].astype(np.float64) *
           np.repeat(absmax_dq.astype(np.float32), BLOCK)[:n]).astype(np.float32)
    arrays = {"data": packed.astype(np.uint8).tobytes(), "absmax": absmax_q.tobytes(),
              "absmax2": absmax2.tobytes(), "offset": np.array([offset], np.float32).tobytes()}
    return arrays, deq, absmax


def run_tool(tool, qtype, x, tmp):
    path = os.path.join(tmp, "x.f32")
    x.astype(np.float32).tofile(path)
    out = os.path.join(tmp, qtype)
    os.makedirs(out, exist_ok=True)
    subprocess.run([tool, "quantize", qtype, path, out], check=True)
    arrays = {}
    for name in ("data", "absmax", "absmax2", "offset"):
        p = os.path.join(out, name + ".bin")
        if os.path.exists(p):
            with open(p, "rb") as f:
                arrays[name] = f.read()
            os.remove(p)
    deq = np.fromfile(os.path.join(out, "dequant.f32"), np.float32)
    return arrays, deq


def test_tensors(levels):
    rng = np.random.default_rng(1234)
    out = []
    # GPT-2-like weights: 3 groups (the last partial), a partial last block, odd n.
    x = (rng.standard_normal(BLOCK * ABSMAX_BLOCK * 2 + BLOCK * 5 + 37) * 0.02).astype(np.float32)
    x[BLOCK * 3:BLOCK * 4] = 0                       # a zero block
    x[BLOCK * 7:BLOCK * 8] = np.float32(0.031)       # constant blocks
    x[BLOCK * 9:BLOCK * 10] = np.float32(-0.5)
    x[BLOCK * 11:BLOCK * 12] = np.float32(0.25) * np.tile(levels, 4)  # exactly on levels
    out.append(("random normal, 3 groups", x))
    # Blocks of scales 1e-3 .. 1e3 in one tensor.
    y = rng.standard_normal(BLOCK * 300).astype(np.float32)
    y *= np.float32(10.0) ** np.repeat((np.arange(300) % 7 - 3).astype(np.float32), BLOCK)
    out.append(("mixed block scales", y.astype(np.float32)))
    out.append(("n = 1", np.array([-0.7], np.float32)))
    out.append(("n = 3", np.array([0.5, -0.25, 0.125], np.float32)))
    out.append(("one block", rng.standard_normal(BLOCK).astype(np.float32)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tool")
    args = ap.parse_args()
    failures = []

    with tempfile.TemporaryDirectory() as tmp:
        lp = os.path.join(tmp, "levels.f32")
        subprocess.run([args.tool, "levels", lp], check=True)
        levels = np.fromfile(lp, np.float32)
        for what, ref in (("torch.special.ndtri", normal_map_torch()),
                          ("statistics.NormalDist", normal_map_stdlib())):
            err = float(np.abs(levels.astype(np.float64) - ref).max())
            print(f"NF4 levels vs {what}: max |diff| = {err:.2e}")
            if levels.size != 16 or err > LEVEL_TOL:
                failures.append(f"levels differ from {what} by {err:.2e}")

        for what, x in test_tensors(levels):
            got, got_deq = run_tool(args.tool, "nf4", x, tmp)
            want, want_deq, absmax = ref_nf4(x, levels)
            for name, w in want.items():
                g = got.get(name)
                if g != w:
                    diff = -1 if g is None or len(g) != len(w) else \
                        int(np.argmax(np.frombuffer(g, np.uint8) != np.frombuffer(w, np.uint8)))
                    failures.append(f"nf4 {what}: array '{name}' differs (first byte {diff})")
            # Dequantized values: numpy forms absmax' in float64 (not one fused
            # multiply-add in float32), so allow a float32 rounding of absmax.
            scale = np.repeat(absmax, BLOCK)[: x.size].astype(np.float64)
            diff = np.abs(got_deq.astype(np.float64) - want_deq)
            derr = float((diff / np.maximum(scale, 1e-38)).max())
            if got_deq.size != x.size or derr > 1e-6:
                failures.append(f"nf4 {what}: dequantized values differ by {derr:.2e} of absmax")
            # The comparison can tell the packing apart: the low-nibble-first
            # order would give different bytes for this tensor.
            if x.size > 2:
                p = np.frombuffer(want["data"], np.uint8)
                swapped = ((p & 0x0F) << 4 | (p >> 4)).astype(np.uint8).tobytes()
                if swapped == got["data"] and swapped != want["data"]:
                    failures.append(f"nf4 {what}: nibbles in the wrong order")
            print(f"nf4  {what:26s} n={x.size:6d}: {len(got['data'])} data bytes equal, "
                  f"dequantized within {derr:.1e} of absmax")

            got, got_deq = run_tool(args.tool, "int8", x, tmp)
            want, want_deq = ref_int8(x)
            for name, w in want.items():
                if got.get(name) != w:
                    failures.append(f"int8 {what}: array '{name}' differs")
            if not np.array_equal(got_deq, want_deq):
                failures.append(f"int8 {what}: dequantized values differ")
            print(f"int8 {what:26s} n={x.size:6d}: arrays and dequantized values equal")

    for f in failures:
        print("FAIL:", f)
    print("OK" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
