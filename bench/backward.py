"""The backward half of bench/run.py (`run.py --backward`): SparseK's
attention backward against FlexAttention's backward on the same BlockMask
and cuDNN SDPA's dense backward, in one process, on the same inputs.

For each case the forward runs once per rotated input copy (SparseK: the
planned forward with its LSE; peers: under autograd, graph kept), then only
the backward is timed: SparseK's planned `sk_attention_backward_run`
(AttentionBackwardPlan.run), a peer's `torch.autograd.grad(o, (q, k, v),
do, retain_graph=True)`. Gradients of copy 0 are compared with SparseK's
before any timing. FLOPs: 2.5 x the forward FLOPs of the selected blocks
(the issue's count); a dense peer's own work likewise (2.5 x its forward).

The cases are issue 29's speed rows (`backward_cases`).
"""

from __future__ import annotations

import gc
import math
import time
import traceback
from dataclasses import asdict

BWD_FACTOR = 2.5


class NotApplicable(Exception):
    """A peer does not apply to a case (recorded as skipped, not as an error)."""


def backward_cases(case_type, quick: bool, tiny: bool):
    """Issue 29's rows: seed 25 % and dense (fp16 D128), causal dense at 8K,
    causal window 2048 at 64K (D128) and 32K (D64), bf16."""
    C = case_type
    if tiny:
        B, H, S = 1, 2, 512
    elif quick:
        B, H, S = 2, 4, 1024
    else:
        B, H, S = 16, 96, 4096
    cb = -(-S // 128)
    ls = (1024, 512) if tiny else (4096, 2048) if quick else (65536, 32768)
    lw = 256 if tiny else 512 if quick else 2048
    lh = 2 if tiny else 4 if quick else 32
    cs, cbh = (512, 1) if tiny else (2048, 2) if quick else (8192, 2)
    return [
        C("bwd_seed_topk25", "backward", B, H, H, S, 128, "float16", "random", False, k=max(1, cb // 4),
          note="random 25 % of key blocks per query block, per (b, h)", seed=104),
        C("bwd_seed_dense", "backward", B, H, H, S, 128, "float16", "random", False, k=cb,
          note="every block selected (dense layout)", dense_peers=True, seed=101),
        C(f"bwd_causal_s{cs // 1024}k", "backward", cbh, lh, lh, cs, 128, "bfloat16", "window", True, window=cs,
          note="causal dense layout (window = S)", dense_peers=True),
        C(f"bwd_long_s{ls[0] // 1024}k", "backward", 1, lh, lh, ls[0], 128, "bfloat16", "window", True, window=lw,
          note=f"causal window {lw}"),
        C(f"bwd_long64_s{ls[1] // 1024}k", "backward", 1, lh, lh, ls[1], 64, "bfloat16", "window", True, window=lw,
          note=f"causal window {lw}, D = 64"),
    ]


def _grads_diff(a, b):
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def run_backward_case(case, args, timer, ctx_global, build_layout):
    import torch

    import sparsek

    rec = {"name": case.name, "group": case.group, "case": asdict(case), "systems": {}, "mode": "backward"}
    dev = torch.device(args.device)
    dt = getattr(torch, case.dtype)
    layout = build_layout(case)
    selected = layout.selected_blocks(case.B, case.H)
    fwd_flops = 4.0 * case.D * layout.block_rows * layout.block_cols * selected
    flops = BWD_FACTOR * fwd_flops
    rec.update({"shape": {"B": case.B, "H": case.H, "Hkv": case.Hkv, "S": case.S, "D": case.D},
                "dtype": case.dtype, "block": [layout.block_rows, layout.block_cols], "layout": repr(layout),
                "density": layout.density, "selected_blocks": selected, "actual_flops": flops,
                "flops_rule": "2.5 x forward FLOPs of the selected blocks"})
    print(f"[{case.name}] backward B{case.B} H{case.H} S{case.S} D{case.D} {case.dtype} density={layout.density:.4f}",
          flush=True)
    elem = torch.finfo(dt).bits // 8
    set_bytes = 8 * case.B * case.S * case.H * case.D * elem  # q k v o do dq dk dv
    n_rot = max(1, min(args.max_copies, math.ceil(args.rotate_mb * 2**20 / set_bytes)))
    gen = torch.Generator(device=dev).manual_seed(4321 + case.S + case.H)

    def rnd(h):
        return torch.randn(case.B, case.S, h, case.D, generator=gen, device=dev, dtype=torch.float32).to(dt)

    q0, k0, v0, do0 = rnd(case.H), rnd(case.Hkv), rnd(case.Hkv), rnd(case.H)
    qs = [q0] + [q0.clone() for _ in range(n_rot - 1)]
    ks = [k0] + [k0.clone() for _ in range(n_rot - 1)]
    vs = [v0] + [v0.clone() for _ in range(n_rot - 1)]
    dos = [do0] + [do0.clone() for _ in range(n_rot - 1)]
    rec["rotation_copies"] = n_rot

    def finish(name, meas, f, extra):
        t = meas["time_ms"] * 1e-3
        out = dict(meas, status="ok", flops=f, tflops_actual=f / t / 1e12)
        out.update(extra)
        rec["systems"][name] = out
        print(f"    {name:<13} {meas['time_ms']:9.3f} ms  {out['tflops_actual']:7.1f} TFLOPS", flush=True)

    ref = None
    variants = [("sparsek", None, True)]
    if args.device == "cuda" and "sparsek_sm80" in args.peers:
        variants.append(("sparsek_sm80", "cuda_sm80", True))
    if args.device == "cuda" and "sparsek_nondet" in args.peers:
        variants.append(("sparsek_nondet", None, False))  # fp32 atomic dQ (fused Hopper pass)
    if args.device == "cuda" and "sparsek_sm80_nondet" in args.peers:
        variants.append(("sparsek_sm80_nondet", "cuda_sm80", False))  # the portable fused pass
    for name, backend, deterministic in variants:
        try:
            fplan = sparsek.plan_attention(q0, k0, v0, layout, causal=case.causal, backend=backend)
            fwd = [fplan.run(qs[i], ks[i], vs[i], return_lse=True) for i in range(n_rot)]
            bplan = sparsek.plan_attention_backward(q0, k0, v0, layout, causal=case.causal, backend=backend,
                                                    deterministic=deterministic)
            grads = [(torch.empty_like(qs[i]), torch.empty_like(ks[i]), torch.empty_like(vs[i])) for i in range(n_rot)]
            for g in grads[0]:
                g.fill_(float("nan"))

            def fn(i, bplan=bplan, fwd=fwd, grads=grads):
                dq, dk, dv = grads[i]
                return bplan.run(qs[i], ks[i], vs[i], fwd[i][0], dos[i], fwd[i][1], dq=dq, dk=dk, dv=dv)

            g0 = [g.clone() for g in fn(0)]
            if args.device == "cuda":
                torch.cuda.synchronize()
            extra = {"nan_in_grads": any(bool(torch.isnan(g).any().item()) for g in g0),
                     "workspace_bytes": bplan.workspace_size}
            if ref is None:
                ref = g0
            else:
                extra["max_abs_diff_vs_sparsek"] = _grads_diff(g0, ref)
            finish(name, timer.measure(fn, n_rot), flops, extra)
            del fplan, fwd, bplan, grads
        except Exception as e:
            rec["systems"][name] = {"status": "error", "error": f"{type(e).__name__}: {e}",
                                    "traceback": traceback.format_exc(limit=4)}
            print(f"    {name:<13} ERROR {type(e).__name__}: {e}", flush=True)

    for name in args.peers:
        if name not in ("flex", "sdpa_cudnn"):
            continue
        try:
            if args.device != "cuda":
                raise NotApplicable("needs CUDA")
            qt = [x.transpose(1, 2).detach().requires_grad_() for x in qs]
            kt = [x.transpose(1, 2).detach().requires_grad_() for x in ks]
            vt = [x.transpose(1, 2).detach().requires_grad_() for x in vs]
            dot = [x.transpose(1, 2) for x in dos]
            gqa = case.H != case.Hkv
            if name == "flex":
                from torch.nn.attention.flex_attention import flex_attention

                if "flex_fn" not in ctx_global:
                    ctx_global["flex_fn"] = torch.compile(flex_attention, dynamic=False)
                bm = layout.to_block_mask(causal=case.causal, split_full=True, device=dev, num_heads=case.H)
                outs = [ctx_global["flex_fn"](qt[i], kt[i], vt[i], block_mask=bm, enable_gqa=gqa) for i in range(n_rot)]
                f = flops
                computes = "same layout (BlockMask with full-block lists)"
            else:
                if not case.dense_peers:
                    raise NotApplicable("dense baseline only on the dense and causal-dense cases")
                import torch.nn.functional as Fn
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    outs = [Fn.scaled_dot_product_attention(qt[i], kt[i], vt[i], is_causal=case.causal, enable_gqa=gqa)
                            for i in range(n_rot)]
                dense = 4.0 * case.B * case.H * case.S * case.S * case.D
                f = BWD_FACTOR * (dense * (case.S + 1) / (2 * case.S) if case.causal else dense)
                computes = "causal dense" if case.causal else "dense"

            def fn(i, outs=outs):
                return torch.autograd.grad(outs[i], (qt[i], kt[i], vt[i]), dot[i], retain_graph=True)

            g = [x.transpose(1, 2) for x in fn(0)]
            if args.device == "cuda":
                torch.cuda.synchronize()
            extra = {"computes": computes}
            if ref is not None:
                extra["max_abs_diff_vs_sparsek"] = _grads_diff(g, ref)
            del g
            finish(name, timer.measure(fn, n_rot), f, extra)
            del outs, qt, kt, vt
        except NotApplicable as e:
            rec["systems"][name] = {"status": "skipped", "reason": str(e)}
            print(f"    {name:<13} skipped: {e}", flush=True)
        except Exception as e:
            rec["systems"][name] = {"status": "error", "error": f"{type(e).__name__}: {str(e)[:1500]}",
                                    "traceback": traceback.format_exc(limit=6)[-3000:]}
            print(f"    {name:<13} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
        finally:
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    del qs, ks, vs, dos, ref
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return rec
