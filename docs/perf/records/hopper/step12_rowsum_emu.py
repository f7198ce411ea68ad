#!/usr/bin/env python3
"""step12_rowsum_emu.py - CPU emulation of the Hopper forward's row sum at
D = 64 (docs/perf/hopper.md, "Step 12: numerics"): the fp32 sum of P the
kernel keeps today against the sum of P rounded to the dtype that the
tensor core forms when P V runs as m64n72 with a slab of ones
(SK90_ROWSUM_TC). Rows are drawn like the forward GPU suite's random cases
(tests/gpu/gpu_util.c, gt_case_random: lengths up to 640 with tails and
tiny ones, blocks of 64 / 128, causal or not, one block / a few / dense /
random density, default, positive and negative scales, q amplitude 1 or
3); each row runs the kernel's online softmax block by block in fp32
(scores, exp2 with the pre-scaled max, the rescale by corr) and is checked
against an fp64 reference under three rules:
  gpu   the forward GPU suite's (gt_tolerance_lse, gpu_util.c):
        2 u_dtype (|LSE| + sum_k p_k |s_k|) + 1e-5
  f32   the varlen / paged suites' (tu_attn_tol_lse, tests/common):
        2 u_f32 (|LSE| + sqrt(D) smag + sqrt(n)) + 2^-24
  cp    the context-parallel suite's (test_cp_gpu.c), one GPU against
        another visiting order (local blocks first, then the rest with the
        carried LSE as the kernel's carry-in does): 1e-4 (1 + |LSE|)
Prints the worst error / tolerance per rule, dtype and row sum. Usage:
  python3 step12_rowsum_emu.py [cases per dtype] [seed]
"""
import sys

import numpy as np

LOG2E = np.float32(1.4426950408889634)
U = {"bf16": 2.0**-8, "f16": 2.0**-11}


def round_dtype(x, dt):
    """Round fp32 values to the dtype (nearest even) and back to fp32."""
    x = np.asarray(x, dtype=np.float32)
    if dt == "f16":
        return x.astype(np.float16).astype(np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def kernel_lse(s_blocks, scale, tc, carry=None):
    """The kernel's LSE of one row from its blocks of raw scores (fp32 dots,
    -inf where masked): fp32 online softmax, l as the fp32 sum of P (tc =
    False) or the fp32 sum of P rounded to the dtype (tc = dtype name).
    carry: an LSE to continue from (m = LSE / |scale|, l = 1)."""
    a = np.float32(abs(scale))
    c = np.float32(a * LOG2E)
    m, l = np.float32(-np.inf), np.float32(0.0)
    if carry is not None and carry != -np.inf:
        m, l = np.float32(np.float32(carry) / a), np.float32(1.0)
    for s in s_blocks:
        mx = max(m, np.float32(s.max()))
        ms = np.float32(0.0) if mx == -np.inf else np.float32(mx * c)
        corr = np.exp2(np.float32(m * c) - ms, dtype=np.float32)
        p = np.exp2(np.float32(s * c) - ms, dtype=np.float32)  # FFMA then EX2
        add = p if not tc else round_dtype(p, tc)
        l = np.float32(l * corr + np.float32(add.sum(dtype=np.float32)))
        m = mx
    return np.float32(m * a + np.log(l)) if l > 0 else -np.inf


def draw_case(rng, dt):
    """A case like gt_case_random's (D = 64): lengths, blocks, layout rows."""
    bk = int(rng.choice([64, 128]))
    bq = int(rng.choice([64, 128]))
    causal = bool(rng.integers(0, 2))

    def pick_len(block):
        r = rng.random()
        if r < 0.3:
            return int(rng.integers(1, max(640 // block, 1) + 1)) * block
        if r < 0.4:
            return int(rng.integers(1, 25))
        return int(rng.integers(1, 641))

    sk = pick_len(bk)
    sq = sk if rng.random() < 0.35 else pick_len(bq)
    r = rng.random()
    kind = "one" if r < 0.2 else "few" if r < 0.4 else "dense" if r < 0.6 else "density"
    density = 0.1 + 0.6 * rng.random()
    r = rng.random()
    scale = (1 / 8) if r < 0.8 else (0.02 + 0.28 * rng.random()) if r < 0.9 else -(0.02 + 0.18 * rng.random())
    amp = 3.0 if rng.random() < 0.3 else 1.0
    q = round_dtype(rng.standard_normal((sq, 64)) * amp, dt)
    k = round_dtype(rng.standard_normal((sk, 64)), dt)
    nbk, nbq = (sk + bk - 1) // bk, (sq + bq - 1) // bq
    rows = []
    for _ in range(nbq):
        if kind == "one":
            sel = rng.choice(nbk, 1, replace=False)
        elif kind == "few":
            sel = rng.choice(nbk, min(nbk, int(rng.integers(2, 5))), replace=False)
        elif kind == "dense":
            sel = np.arange(nbk)
        else:
            sel = np.flatnonzero(rng.random(nbk) < density)
        rows.append(np.sort(sel))
    return dict(bk=bk, bq=bq, causal=causal, sq=sq, sk=sk, scale=float(np.float32(scale)), q=q, k=k, rows=rows)


def row_blocks(cs, i, blocks):
    """The kernel's fp32 score blocks of query i over the given key blocks:
    negated when the scale is negative, then masked (-inf), as
    sk90_mask_block does."""
    out = []
    for j in blocks:
        k0 = j * cs["bk"]
        kk = cs["k"][k0:min(k0 + cs["bk"], cs["sk"])]
        s = (kk @ cs["q"][i]).astype(np.float32)
        if cs["scale"] < 0:
            s = -s
        keys = np.arange(k0, k0 + len(kk))
        if cs["causal"]:
            s = np.where(keys > i + cs["sk"] - cs["sq"], np.float32(-np.inf), s)
        if np.all(s == -np.inf) and cs["causal"] and j * cs["bk"] > ((i // cs["bq"] + 1) * cs["bq"] - 1) + cs["sk"] - cs["sq"]:
            continue  # the kernel skips blocks no row of the tile sees
        out.append(s)
    return out


def main():
    cases = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    print(f"step12_rowsum_emu: {cases} cases per dtype, seed {seed}, D = 64")
    for dt in ("bf16", "f16"):
        rng = np.random.default_rng(seed)
        u = U[dt]
        worst = {(rule, tc): 0.0 for rule in ("gpu", "f32", "cp") for tc in ("fp32 l", "rounded-P l")}
        fails = dict.fromkeys(worst, 0)
        nrows = 0
        for _ in range(cases):
            cs = draw_case(rng, dt)
            kmax = float(np.sqrt((cs["k"].astype(np.float64) ** 2).sum(1)).max())
            for i in range(cs["sq"]):
                blocks = cs["rows"][i // cs["bq"]]
                sb = row_blocks(cs, i, blocks)
                s64 = np.concatenate(sb).astype(np.float64) * abs(cs["scale"]) if sb else np.zeros(0)
                s64 = s64[np.isfinite(s64)]
                if len(s64) == 0:
                    continue
                nrows += 1
                mref = s64.max()
                w = np.exp(s64 - mref)
                ref = mref + np.log(w.sum())
                w /= w.sum()
                tol = {"gpu": 2 * u * (abs(ref) + (w * np.abs(s64)).sum()) + 1e-5,
                       "f32": 2 * 2.0**-24 * (abs(ref) + 8 * abs(cs["scale"]) * np.linalg.norm(cs["q"][i]) * kmax
                                               + np.sqrt(len(s64))) + 2.0**-24}
                half = len(sb) // 2
                for tc, tcv in (("fp32 l", False), ("rounded-P l", dt)):
                    got = float(kernel_lse(sb, cs["scale"], tcv))
                    for rule in ("gpu", "f32"):
                        r = abs(got - ref) / tol[rule]
                        worst[(rule, tc)] = max(worst[(rule, tc)], r)
                        fails[(rule, tc)] += r > 1
                    if half == 0:
                        continue
                    # CP: the later blocks first (a rank's local pass), then the
                    # earlier ones continuing from its LSE (the carry-in pass).
                    first = float(kernel_lse(sb[half:], cs["scale"], tcv))
                    cp = float(kernel_lse(sb[:half], cs["scale"], tcv, carry=first))
                    if np.isfinite(cp):
                        r = abs(cp - got) / (1e-4 * (1 + abs(got)))
                        worst[("cp", tc)] = max(worst[("cp", tc)], r)
                        fails[("cp", tc)] += r > 1
        print(f"{dt}: {nrows} rows")
        for (rule, tc), v in worst.items():
            print(f"  rule {rule:4s} {tc:12s}: worst error/tolerance {v:8.3f}, rows over {fails[(rule, tc)]}")


if __name__ == "__main__":
    main()
