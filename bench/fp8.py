"""The FP8 half of bench/run.py (`run.py --fp8`): SparseK's FP8 (e4m3)
forward against its bf16 forward and the FP8 peers, in one process, on the
same bf16 inputs (issue 32's speed rows).

Per case the bf16 inputs are drawn once (run.py's make_inputs, rotated
copies), then
  - `sparsek_bf16`: the bf16 SparseK kernel on the case's layout (planned
    once, only the run timed): the 1.5x denominator and the reference O;
  - the inputs are quantized once per copy with sparsek.quantize_e4m3
    (per (b, h) descales; V both as rows and as V^T, layout="vt"); the
    quantizer is timed on its own (`quantize`) and never inside a run;
  - `sparsek_fp8` (V^T) and `sparsek_fp8_rows` (rows V): plan_attention_fp8
    once, O in bf16, only the run timed;
  - peers (each skipped or failed with its reason, the run goes on):
    `flashinfer_fp8`, flashinfer's BlockSparseAttentionWrapper on
    float8_e4m3fn q/k/v (its fa3 backend; descales as its per-head
    scale_q/k/v, one call per batch entry) for layouts shared by every
    (b, h); per-(b, h) layouts are folded into one call, each (b, h) a
    sequence of its own with one head, which takes one scale per tensor:
    those inputs are quantized per tensor by torch (recorded as
    `quantization`); `flashinfer_fp8_dense`, flashinfer's FP8 dense prefill
    (single_prefill_with_kv_cache, fa3, causal as the case) per batch entry:
    this GPU's FP8 dense rate; `sdpa_cudnn_fp8`, torch SDPA on float8 inputs
    under the cuDNN backend (probed: the exception is the skip reason);
    `sdpa_cudnn`, the bf16 dense reference (run.py's peer).
Every FP8 output is compared with sparsek_bf16's O (max |diff|, RMSE:
max_abs_diff_vs_sparsek, rmse_vs_sparsek). FLOPs: the selected blocks only,
as the bf16 mode; dense peers their own work.
"""

from __future__ import annotations

import gc
import traceback

FP8_MODE_PEERS = ("flashinfer_fp8", "flashinfer_fp8_dense", "sdpa_cudnn_fp8", "sdpa_cudnn")


def fp8_cases(case_type, quick: bool, tiny: bool):
    """Issue 32's rows: the seed shape (B16 H96 S4096 D128) at random 25 %
    per (b, h), and B1 H32 D128 causal window 2048 at 16K, 64K, 128K; bf16
    inputs. quick / tiny: the same patterns at small shapes."""
    C = case_type
    B, H, S = (1, 2, 512) if tiny else (2, 4, 1024) if quick else (16, 96, 4096)
    seqs = (512, 1024) if tiny else (2048, 4096) if quick else (16384, 65536, 131072)
    lw = 256 if tiny else 512 if quick else 2048
    lh = 2 if tiny else 4 if quick else 32
    cases = [C("fp8_seed_topk25", "fp8", B, H, H, S, 128, "bfloat16", "random", False, k=max(1, -(-S // 128) // 4),
               note="random 25 % of key blocks per query block, per (b, h)", dense_peers=True, seed=104)]
    for s in seqs:
        cases.append(C(f"fp8_long_s{s // 1024}k" if s >= 1024 else f"fp8_long_s{s}", "fp8", 1, lh, lh, s, 128, "bfloat16", "window", True, window=lw,
                       note=f"causal window {lw}", dense_peers=True))
    return cases


def _cuda_only(inp, R):
    if inp.device != "cuda":
        raise R.Skip("needs CUDA")


def _import_flashinfer(R):
    try:
        import flashinfer
    except Exception as e:
        raise R.Skip(f"flashinfer not importable: {type(e).__name__}: {e}")
    return flashinfer


def _per_tensor_e4m3(x):
    """x quantized with one scale for the whole tensor (amax / 448), as a
    peer that takes one scale per sequence needs: (codes, descale [1])."""
    import torch

    ds = (x.float().abs().amax() / 448.0).clamp_min(1e-30).reshape(1)
    return (x.float() / ds).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), ds


def fold_bsr(lay, batch: int, heads: int):
    """The layout as one BSR over batch x heads sequences of one head each:
    sequence f = b * heads + h holds (b, h)'s slice, its key blocks offset by
    f x col_blocks. Returns (row_offsets, col_indices), int32."""
    import numpy as np

    rb, cb = lay.row_blocks, lay.col_blocks
    ro_all, ci_all = lay.row_offsets, lay.col_indices
    counts, cols = [], []
    for b in range(batch):
        for h in range(heads):
            sl = (b if lay.batch > 1 else 0) * lay.heads + (h if lay.heads > 1 else 0)
            r = ro_all[sl * rb:(sl + 1) * rb + 1]
            counts.append(np.diff(r))
            cols.append(ci_all[r[0]:r[-1]] + (b * heads + h) * cb)
    ro = np.concatenate([[0], np.cumsum(np.concatenate(counts))]).astype(np.int32)
    return ro, np.concatenate(cols).astype(np.int32)


def _flashinfer_fp8(R):
    def make(case, inp, ctx):
        import torch

        _cuda_only(inp, R)
        flashinfer = _import_flashinfer(R)
        f8, lay = ctx["fp8"], inp.layout
        dev = inp.q[0].device
        R_, C_ = lay.block_rows, lay.block_cols
        if case.S % R_ or case.S % C_:
            raise R.Skip(f"S = {case.S} is not a multiple of the blocks: flashinfer's BSR needs whole key blocks")
        ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
        w = flashinfer.sparse.BlockSparseAttentionWrapper(ws)
        e4m3 = torch.float8_e4m3fn
        extra = {"flashinfer_version": getattr(flashinfer, "__version__", "?")}
        if lay.heads == 1 and lay.batch == 1:
            # One BSR for every (b, h); the descales are flashinfer's per-head
            # scale_q/k/v, one batch entry per call.
            ro = torch.from_numpy(lay.row_offsets).to(dev)
            ci = torch.from_numpy(lay.col_indices).to(dev)
            w.plan(ro, ci, case.S, case.S, R_, C_, case.H, case.Hkv, case.D, causal=case.causal,
                   q_data_type=e4m3, kv_data_type=e4m3, o_data_type=torch.bfloat16)
            qs, ks, vs = f8["q"], f8["k"], f8["v"]
            sq, sk, sv = f8["qd"], f8["kd"], f8["vd"]
            extra["quantization"] = "sparsek.quantize_e4m3 (per (b, h), the same codes as SparseK)"

            def fn(i):
                return [w.run(qs[i][b], ks[i][b], vs[i][b], scale_q=sq[b], scale_k=sk[b], scale_v=sv[b])
                        for b in range(case.B)]

            def output(outs):
                return torch.stack(outs)

        else:
            # A pattern per (b, h): fold each (b, h) into a sequence of its own
            # (one head, key blocks offset by its slice), one call for all.
            if case.H != case.Hkv:
                raise R.Skip("the per-(b, h) fold needs Hq == Hkv")
            ro, ci = (torch.from_numpy(a).to(dev) for a in fold_bsr(lay, case.B, case.H))
            n = case.B * case.H * case.S
            w.plan(ro, ci, n, n, R_, C_, 1, 1, case.D, causal=case.causal,
                   q_data_type=e4m3, kv_data_type=e4m3, o_data_type=torch.bfloat16)

            def fold(xs):  # [B, S, H, D] bf16 -> per-tensor e4m3 [(B H S), 1, D]
                res = [_per_tensor_e4m3(x.permute(0, 2, 1, 3).reshape(n, 1, case.D)) for x in xs]
                return [r[0] for r in res], res[0][1]

            (qs, sq), (ks, sk), (vs, sv) = fold(inp.q), fold(inp.k), fold(inp.v)
            ctx["_keep"] = (qs, ks, vs)
            extra["quantization"] = "per tensor (torch cast, amax / 448): the fold takes one scale per tensor"
            extra["wrapper"] = "BlockSparseAttentionWrapper, each (b, h) folded into a sequence of one head"

            def fn(i):
                return w.run(qs[i], ks[i], vs[i], scale_q=sq, scale_k=sk, scale_v=sv)

            def output(o):
                return o.reshape(case.B, case.H, case.S, case.D).transpose(1, 2)

        extra["backend"] = getattr(w, "_backend", "?")
        return {"fn": fn, "output": output, "flops": ctx["sparse_flops"], "computes": "same layout",
                "comparable": True, "extra": extra}

    return make


def _flashinfer_fp8_dense(R):
    def make(case, inp, ctx):
        import torch

        _cuda_only(inp, R)
        flashinfer = _import_flashinfer(R)
        if not case.dense_peers:
            raise R.Skip("dense baseline timed on another case")
        f8 = ctx["fp8"]
        qs, ks, vs = f8["q"], f8["k"], f8["v"]

        def fn(i):
            return [flashinfer.single_prefill_with_kv_cache(
                qs[i][b], ks[i][b], vs[i][b], scale_q=f8["qd"][b], scale_k=f8["kd"][b], scale_v=f8["vd"][b],
                o_dtype=torch.bfloat16, causal=case.causal, backend="fa3") for b in range(case.B)]

        return {"fn": fn, "output": torch.stack, "flops": ctx["dense_flops"],
                "computes": "causal dense" if case.causal else "dense", "comparable": inp.layout.density == 1.0,
                "extra": {"flashinfer_version": getattr(flashinfer, "__version__", "?"), "backend": "fa3"}}

    return make


def _sdpa_cudnn_fp8(R):
    def make(case, inp, ctx):
        import torch
        import torch.nn.functional as Fn
        from torch.nn.attention import SDPBackend, sdpa_kernel

        _cuda_only(inp, R)
        if not case.dense_peers:
            raise R.Skip("dense baseline timed on another case")
        f8 = ctx["fp8"]
        qs, ks, vs = ([x.transpose(1, 2) for x in f8[n]] for n in ("q", "k", "v"))

        def fn(i):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return Fn.scaled_dot_product_attention(qs[i], ks[i], vs[i], is_causal=case.causal)

        try:  # torch's SDPA has no descale arguments: a probe of the dtype alone
            fn(0)
            torch.cuda.synchronize()
        except Exception as e:
            raise R.Skip(f"torch {torch.__version__}: cuDNN SDPA does not take float8_e4m3fn inputs: "
                         f"{type(e).__name__}: {str(e)[:400]}")
        return {"fn": fn, "output": lambda o: o.transpose(1, 2), "flops": ctx["dense_flops"],
                "computes": ("causal dense" if case.causal else "dense") + " (descales not applied: SDPA takes none)",
                "comparable": False, "extra": {}}

    return make


def _quantized(inp, R, timer, rec):
    """e4m3 copies of every rotated input (sparsek.quantize_e4m3: Q, K, V
    rows, V^T), the descales of copy 0 (copies are equal, so are their
    descales), and the quantizer's times (one tensor per call)."""
    import sparsek

    f8 = {}
    for name, xs, lay in (("q", inp.q, "rows"), ("k", inp.k, "rows"), ("v", inp.v, "rows"), ("vt", inp.v, "vt")):
        pairs = [sparsek.quantize_e4m3(x, layout=lay) for x in xs]
        f8[name] = [p[0] for p in pairs]
        f8["vtd" if name == "vt" else name + "d"] = pairs[0][1]
    times = {}
    for name, xs, lay in (("q", inp.q, "rows"), ("v_rows", inp.v, "rows"), ("v_vt", inp.v, "vt")):
        m = timer.measure(lambda i, xs=xs, lay=lay: sparsek.quantize_e4m3(xs[i], layout=lay), inp.n_rot)
        times[f"{name}_ms"] = m["time_ms"]
    rec["quantize"] = times
    print("    quantize    " + "  ".join(f"{k} {v:.3f}" for k, v in times.items()), flush=True)
    return f8


def run_fp8_case(case, args, timer, R) -> dict:
    """One case of --fp8 (see the module text). R: run.py's namespace
    (build_layout, case_record, make_inputs, rates, compare, run_peer,
    reference_check, PEER_MAKERS, Skip). The case's tensors are freed when
    _fp8_case returns, before the next case."""
    rec = _fp8_case(case, args, timer, R)
    gc.collect()
    if args.device == "cuda":
        import torch

        torch.cuda.empty_cache()
    return rec


def _fp8_case(case, args, timer, R) -> dict:
    import torch

    import sparsek

    layout = R.build_layout(case)
    rec, sparse_flops, dense_equiv = R.case_record(case, layout)
    rec["mode"] = "fp8"
    inp = R.make_inputs(case, args, layout)
    rec["rotation_copies"] = inp.n_rot
    cuda = args.device == "cuda"
    dense = 4.0 * case.B * case.H * case.S * case.S * case.D
    ctx = {"sparse_flops": sparse_flops, "dense_flops": dense * (case.S + 1) / (2 * case.S) if case.causal else dense}

    def finish(name, meas, flops, extra):
        out = R.rates(case, meas, flops, dense_equiv)
        out.update(extra)
        rec["systems"][name] = out
        print(f"    {name:<20} {meas['time_ms']:9.3f} ms  {out['tflops_actual']:7.1f} TFLOPS actual"
              + (f"  max|d| {extra['max_abs_diff_vs_sparsek']:.4f} rmse {extra['rmse_vs_sparsek']:.5f}"
                 if extra.get("rmse_vs_sparsek") is not None else ""), flush=True)

    def fail(name, e):
        rec["systems"][name] = {"status": "error", "error": f"{type(e).__name__}: {str(e)[:1500]}",
                                "traceback": traceback.format_exc(limit=6)[-3000:]}
        print(f"    {name:<20} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)

    # --- SparseK bf16: the reference O and the 1.5x denominator -------------
    ref = None
    try:
        plan = sparsek.plan_attention(inp.q[0], inp.k[0], inp.v[0], layout, causal=case.causal)
        outs = [torch.empty_like(x) for x in inp.q]
        outs[0].fill_(float("nan"))

        def bf16_fn(i, plan=plan, outs=outs):
            return plan.run(inp.q[i], inp.k[i], inp.v[i], out=outs[i])

        bf16_fn(0)
        if cuda:
            torch.cuda.synchronize()
        ref = outs[0].clone()
        extra = {"nan_in_output": bool(torch.isnan(ref).any().item()),
                 "reference_check": R.reference_check(case, inp, ref)}
        finish("sparsek_bf16", timer.measure(bf16_fn, inp.n_rot), sparse_flops, extra)
        del plan, outs
    except Exception as e:
        fail("sparsek_bf16", e)

    # --- quantize once (not timed with the attention), then SparseK FP8 ------
    try:
        f8 = _quantized(inp, R, timer, rec)
    except Exception as e:
        fail("quantize", e)
        return rec
    ctx["fp8"] = f8
    for name, vname, vl in (("sparsek_fp8", "vt", "vt"), ("sparsek_fp8_rows", "v", "rows")):
        if name not in args.peers:
            continue
        try:
            p8 = sparsek.plan_attention_fp8(f8["q"][0], f8["k"][0], f8[vname][0], layout, q_descale=f8["qd"],
                                            k_descale=f8["kd"], v_descale=f8[vname + "d"], causal=case.causal,
                                            out_dtype="bfloat16", v_layout=vl)

            def fp8_fn(i, p8=p8, vs=f8[vname]):
                return p8.run(f8["q"][i], f8["k"][i], vs[i])

            o = fp8_fn(0)
            if cuda:
                torch.cuda.synchronize()
            extra = {"v_layout": vl, "workspace_bytes": p8.workspace_size}
            extra.update(R.compare(o, ref) if ref is not None else {"nan_in_output": bool(torch.isnan(o).any().item())})
            del o
            finish(name, timer.measure(fp8_fn, inp.n_rot), sparse_flops, extra)
            del p8
        except Exception as e:
            fail(name, e)

    # --- peers ---------------------------------------------------------------
    makers = {"flashinfer_fp8": _flashinfer_fp8(R), "flashinfer_fp8_dense": _flashinfer_fp8_dense(R),
              "sdpa_cudnn_fp8": _sdpa_cudnn_fp8(R), "sdpa_cudnn": R.PEER_MAKERS["sdpa_cudnn"]}
    for name in FP8_MODE_PEERS:
        if name in args.peers:
            R.run_peer(name, makers[name], case, inp, ctx, args, timer, ref, rec, finish)
    sy = rec["systems"]
    for name in ("sparsek_fp8", "sparsek_fp8_rows"):  # the ">= 1.5x the bf16 kernel"
        if sy.get(name, {}).get("status") == sy.get("sparsek_bf16", {}).get("status") == "ok":
            rec[f"{name}_over_bf16"] = sy["sparsek_bf16"]["time_ms"] / sy[name]["time_ms"]
            print(f"    {name} / sparsek_bf16: {rec[f'{name}_over_bf16']:.3f}x (target 1.5x)", flush=True)
    return rec


__all__ = ["fold_bsr", "fp8_cases", "run_fp8_case", "FP8_MODE_PEERS"]
