"""Decode attention against its peers on the dense equivalent, same run,
same GPU (issue 31, rows 1 and 3 of its speed table).

    PYTHONPATH=python SPARSEK_LIBRARY=$PWD/build/libsparsek.so \
        python3 bench/decode_peers.py --out decode_peers.json [--commit HASH] [--quick]

Cases: B x context in (1, 128K), (8, 128K), (32, 32K), (128, 4K), GQA 32/8
and 32/4, D 128, bf16, q_len 1 and 4. Implementations:
  sparsek   sparsek.decode on a paged cache (pages of 64, every page,
            layout None), through the Python call (workspace from torch)
  cudnn     torch SDPA, cuDNN backend, on contiguous K/V [B, Hkv, ctx, D]
            (enable_gqa), q [B, Hq, q_len, D], causal bottom-right for q_len > 1
  flash     torch SDPA, flash backend, the same tensors
Times: CUDA events around each call, 3 warm-ups, median of `reps` calls.
KV bytes = B x ctx x Hkv x D x 2 x 2; TB/s = bytes / median. Each peer's O
is compared with sparsek's (max |diff|), recorded per row; a backend that
refuses the case is recorded as null.
"""

import argparse
import json
import statistics
import subprocess

import torch
import torch.nn.functional as F

import sparsek

PAGE = 64


def timed(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def sdpa(backend, q, k, v, mask):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    with sdpa_kernel([which]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def run_case(batch, ctx, hkv, q_len, reps):
    hq, d = 32, 128
    g = torch.Generator(device="cuda").manual_seed(31)
    q = torch.randn(batch, q_len, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(batch, ctx, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(batch, ctx, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    pages = ctx // PAGE
    kc = k.reshape(batch * pages, PAGE, hkv, d)
    vc = v.reshape(batch * pages, PAGE, hkv, d)
    table = torch.arange(batch * pages, device="cuda", dtype=torch.int32).reshape(batch, pages)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    row = {"batch": batch, "context": ctx, "heads_q": hq, "heads_kv": hkv, "q_len": q_len,
           "head_dim": d, "dtype": "bf16", "kv_bytes": batch * ctx * hkv * d * 2 * 2}

    def ours():
        return sparsek.decode(q, kc, vc, table, lens, causal=True, max_seqlen_k=ctx)

    o_ref = ours()
    row["sparsek_us"] = timed(ours, reps)
    # SDPA layout [B, H, S, D]; bottom-right causal for q_len > 1 as a boolean mask.
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    mask = None
    if q_len > 1:
        mask = torch.ones(q_len, ctx, dtype=torch.bool, device="cuda").tril(ctx - q_len)
    for name in ("cudnn", "flash"):
        try:
            fn = (lambda n=name: sdpa(n, qt, kt, vt, mask))  # noqa: E731
            o = fn().transpose(1, 2)
            row[f"{name}_us"] = timed(fn, reps)
            row[f"{name}_max_diff"] = (o.float() - o_ref.float()).abs().max().item()
        except RuntimeError as e:  # the backend refuses the case (e.g. a mask for flash)
            row[f"{name}_us"] = None
            row[f"{name}_error"] = str(e).splitlines()[0][:200]
    for name in ("sparsek", "cudnn", "flash"):
        us = row.get(f"{name}_us")
        row[f"{name}_tb_per_s"] = None if us is None else row["kv_bytes"] / (us * 1e-6) / 1e12
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    rows = []
    for batch, ctx in ((1, 131072), (8, 131072), (32, 32768), (128, 4096)):
        for hkv in (8, 4):
            for q_len in (1, 4):
                row = run_case(batch, ctx // 16 if args.quick else ctx, hkv, q_len, args.reps)
                row.update(commit=commit, gpu=torch.cuda.get_device_name())
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
