"""Varlen and paged prefill against their peers, same run, same GPU
(issue 30: "FlexAttention with a document mask, and FA4 varlen /
flashinfer paged prefill where they install").

    PYTHONPATH=python SPARSEK_LIBRARY=$PWD/build/libsparsek.so \
        python3 bench/varlen_peers.py --out varlen_peers.json [--site /tmp/site] [--quick]

Cases (bf16, H32 (Hq = Hkv, as build/varlen_speed), D 128):
  varlen  64 sequences, lengths uniform in [512, 16384] (numpy seed 30),
          causal window of 2048 (left 2047) per sequence, packed.
  paged   one sequence of 64K tokens, the same window; K/V in a paged
          cache of 128- or 16-token pages (shuffled), against contiguous.
Implementations:
  sparsek        sparsek.attention_varlen / attention_paged through the
                 Python call (one-shot: plan kernels + forward, workspace
                 from torch; the layout's device copy cached)
  flex           FlexAttention on the packed tensor [1, H, T, D] with a
                 document mask: same sequence, causal, and the key's block
                 (of its sequence) at most 16 blocks before the query's, so
                 Flex attends exactly the pairs of SparseK's layout (the
                 window layout selects the blocks holding a pair p - 2047 <=
                 k <= p: j >= i - 16); Flex's own BlockMask, 128 x 128,
                 over packed positions (sequence starts are not multiples
                 of 128, so its blocks straddle sequences)
  flashinfer     BatchPrefillWithRaggedKVCacheWrapper (varlen) and
                 BatchPrefillWithPagedKVCacheWrapper (paged), causal,
                 window_left 2047: a token-exact window, so it computes
                 fewer pairs than the block layout (its rate is not
                 counted; its time is compared), when importable
Times: CUDA events around each call, 3 warm-ups, median of `reps`.
TFLOPS: 4 D 128 x 128 per selected block and head of SparseK's layout,
the same count for every implementation (issue 30's convention). Each
peer's O is compared with sparsek's (max |diff|).
"""

import argparse
import json
import site
import subprocess
import sys

import numpy as np
import torch

import sparsek
from decode_peers import timed as timed_us  # CUDA events, 3 warm-ups, median (bench/)

H, D, BLOCK, LEFT = 32, 128, 128, 2047
WINDOW_BLOCKS = (LEFT + BLOCK - 1) // BLOCK  # 16: j >= i - 16


def timed(fn, reps):
    return timed_us(fn, reps) / 1e3  # ms


def tflops(blocks, ms):
    return 4.0 * D * BLOCK * BLOCK * blocks / (ms * 1e-3) / 1e12


def selected_blocks(lengths):
    """Blocks of the causal block window per sequence, times H."""
    n = 0
    for length in lengths:
        nb = -(-int(length) // BLOCK)
        n += sum(min(i, WINDOW_BLOCKS) + 1 for i in range(nb))
    return n * H


def flex_document(q, k, v, cu, reps):
    """FlexAttention with a document + causal + block-window mask_mod."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    total = q.shape[0]
    cu_t = torch.as_tensor(cu, device="cuda", dtype=torch.int64)
    doc = torch.searchsorted(cu_t[1:], torch.arange(total, device="cuda"), right=True)
    start = cu_t[doc]

    def mask_mod(b, h, qi, ki):
        same = doc[qi] == doc[ki]
        ql, kl = qi - start[qi], ki - start[ki]
        return same & (kl <= ql) & (kl // BLOCK >= ql // BLOCK - WINDOW_BLOCKS)

    bm = create_block_mask(mask_mod, None, None, total, total, device="cuda", BLOCK_SIZE=BLOCK, _compile=True)
    fa = torch.compile(flex_attention, dynamic=False)
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    run = lambda: fa(qt, kt, vt, block_mask=bm)
    ms = timed(run, reps)
    return ms, run()[0].transpose(0, 1)


def flashinfer_ragged(q, k, v, cu, reps):
    import flashinfer

    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    indptr = torch.as_tensor(cu, device="cuda", dtype=torch.int32)
    w.plan(indptr, indptr, H, H, D, causal=True, window_left=LEFT, q_data_type=torch.bfloat16)
    run = lambda: w.run(q, k, v)
    return timed(run, reps), run()


def flashinfer_paged(q, kc, vc, table, length, page, reps):
    import flashinfer

    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    pages = -(-length // page)
    qo = torch.tensor([0, length], device="cuda", dtype=torch.int32)
    kv_indptr = torch.tensor([0, pages], device="cuda", dtype=torch.int32)
    kv_indices = table[0, :pages].contiguous()
    last = torch.tensor([length - (pages - 1) * page], device="cuda", dtype=torch.int32)
    w.plan(qo, kv_indptr, kv_indices, last, H, H, D, page, causal=True, window_left=LEFT,
           q_data_type=torch.bfloat16)
    run = lambda: w.run(q, (kc, vc))
    return timed(run, reps), run()


def peer(name, fn, ref, blocks, rows, base_ms):
    try:
        ms, out = fn()
        diff = (out.float() - ref.float()).abs().max().item()
        rows.append({"impl": name, "ms": ms, "tflops": tflops(blocks, ms), "max_abs_diff_vs_sparsek": diff,
                     "sparsek_speedup": ms / base_ms})
    except Exception as e:  # a peer that does not install or refuses the case
        rows.append({"impl": name, "error": f"{type(e).__name__}: {e}"[:300]})
    print(json.dumps(rows[-1]), flush=True)


def case_varlen(reps, quick):
    rng = np.random.default_rng(30)
    lengths = rng.integers(512, 16384 + 1, size=16 if quick else 64)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(cu[-1])
    g = torch.Generator(device="cuda").manual_seed(30)
    q, k, v = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    layout = sparsek.VarlenLayout.window(cu, left=LEFT, block=BLOCK)
    cu_d = torch.as_tensor(cu, device="cuda")
    mx = int(lengths.max())
    run = lambda: sparsek.attention_varlen(q, k, v, cu_d, cu_d, layout, mx, mx, causal=True)
    ms = timed(run, reps)
    ref = run()
    blocks = selected_blocks(lengths)
    assert blocks == layout.nnz * H, (blocks, layout.nnz)
    rows = [{"impl": "sparsek", "ms": ms, "tflops": tflops(blocks, ms)}]
    print(json.dumps(rows[-1]), flush=True)
    peer("flex_document_mask", lambda: flex_document(q, k, v, cu, reps), ref, blocks, rows, ms)
    peer("flashinfer_ragged_window", lambda: flashinfer_ragged(q, k, v, cu, reps), ref, blocks, rows, ms)
    return {"sequences": len(lengths), "total_tokens": total, "window": LEFT + 1, "selected_blocks": blocks,
            "rows": rows}


def case_paged(reps, quick):
    length = 16384 if quick else 65536
    g = torch.Generator(device="cuda").manual_seed(30)
    q, k, v = (torch.randn(length, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    cu = np.array([0, length], dtype=np.int32)
    cu_d = torch.as_tensor(cu, device="cuda")
    layout = sparsek.VarlenLayout.window(cu, left=LEFT, block=BLOCK)
    blocks = selected_blocks([length])
    assert blocks == layout.nnz * H, (blocks, layout.nnz)
    contiguous = lambda: sparsek.attention_varlen(q, k, v, cu_d, cu_d, layout, length, length, causal=True)
    base = timed(contiguous, reps)
    ref = contiguous()
    out = {"seq": length, "window": LEFT + 1, "selected_blocks": blocks,
           "contiguous": {"impl": "sparsek", "ms": base, "tflops": tflops(blocks, base)}, "pages": []}
    print(json.dumps(out["contiguous"]), flush=True)
    for page in (128, 16):
        kc, vc, table, lens = sparsek.paged_kv_from_dense(k, v, cu_d, page, seed=30, extra_pages=3,
                                                          fill=float("nan"))
        run = lambda: sparsek.attention_paged(q, kc, vc, cu_d, lens, table, layout, length, length, causal=True)
        ms = timed(run, reps)
        diff = (run().float() - ref.float()).abs().max().item()
        rows = [{"impl": "sparsek_paged", "ms": ms, "tflops": tflops(blocks, ms), "vs_contiguous": base / ms,
                 "max_abs_diff_vs_contiguous": diff}]
        print(json.dumps(rows[-1]), flush=True)
        kc0, vc0 = torch.nan_to_num(kc), torch.nan_to_num(vc)
        peer("flashinfer_paged_window", lambda: flashinfer_paged(q, kc0, vc0, table, length, page, reps), ref,
             blocks, rows, ms)
        out["pages"].append({"page_size": page, "rows": rows})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--site", default=None, help="a site directory holding flashinfer (bench/README.md)")
    ap.add_argument("--case", choices=("varlen", "paged", "all"), default="all")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.site:
        site.addsitedir(args.site)
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    res = {"schema": "sparsek-varlen-peers/1", "commit": commit, "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "dtype": "bf16", "heads": H, "head_dim": D, "block": BLOCK}
    if args.case in ("varlen", "all"):
        res["varlen"] = case_varlen(args.reps, args.quick)
    if args.case in ("paged", "all"):
        res["paged"] = case_paged(args.reps, args.quick)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
