"""The backward half of test_cp_torch.py (run inside its one gloo spawn):
sparsek.cp_attention_backward and the autograd of sparsek.cp_attention on
each rank, then, in the test process, the gathered gradients against
sparsek.attention_backward on the global tensors, the bytes sent, and
bitwise agreements (a repeat; autograd against the direct call; the C
library's simulated run sk_cp_backward for float32).

Inputs: O and LSE of the GLOBAL forward (sparsek.attention in fp32, O
rounded to the dtype), dO seeded. Tolerance (docs/perf/context_parallel.md
section 6, as tests/cpu/test_cp_backward.c): |got - ref| <= 2u|ref| +
2^-24 * 4 (R + 2) amax + 2^-24, u the dtype's unit roundoff, amax the
tensor's largest |ref|: one rounding of the dtype plus fp32 noise of at
most R + 2 shares.
"""

from __future__ import annotations

import os

import numpy as np
import torch

import sparsek
import test_cp_torch as base

BSEED = 3311
ZERO_DO = "zero_do_rank0"
BALANCED = "balanced"


def cases(ranks):
    """(layout, causal, sharding, dtype, exchange, variant): every layout
    contiguous and zigzag, float32 and bfloat16, both exchanges; variant
    strided (inputs beside NaN) / out (NaN-poisoned dq, dk, dv given) /
    None; and the reduction case (dO zero on rank 0's rows)."""
    out = []
    for i, name in enumerate(("window", "sinks_window", "random", "causal")):
        for j, sharding in enumerate(("contiguous", "zigzag")):
            causal = name != "window" and (name, sharding) != ("random", "contiguous")
            dtype = "bfloat16" if (i + j) % 2 == 0 else "float32"
            exchange = "p2p" if (i + j + ranks) % 2 else "all_to_all"
            variant = ("strided", "out", None)[(i + 2 * j) % 3]
            out.append((name, causal, sharding, dtype, exchange, variant))
    out.append(("sinks_window", True, "contiguous", "float32", "all_to_all", ZERO_DO))
    # With sk_cp_balance's chunk boundaries (test_cp_torch._plan).
    out.append(("causal", True, "zigzag", "float32", "all_to_all", BALANCED))
    out.append(("sinks_window", True, "contiguous", "float32", "p2p", BALANCED))
    return out


def global_inputs(ci, ranks, case):
    """Global q, k, v, do (the dtype) and the global forward's o (rounded
    to the dtype) and lse."""
    name, causal, _, dtype, _, variant = case
    q, k, v = base._global_qkv(100 + ci, dtype)
    g = torch.Generator().manual_seed(BSEED + 10 * ranks + ci)
    do = torch.randn(q.shape, generator=g).to(q.dtype)
    if variant == ZERO_DO:
        plan = base._plan(base._layout(name), ranks, causal, case[2], dtype)
        do[:, base._rows(plan, 0)] = 0
    o, lse = sparsek.attention(q.float(), k.float(), v.float(), base._layout(name), causal=causal,
                               return_lse=True)
    return q, k, v, do, o.to(q.dtype), lse


def _beside_nan(x):
    big = torch.full(x.shape[:2] + (2 * x.shape[2], x.shape[3]), float("nan"), dtype=x.dtype)
    big[:, :, 1::2] = x
    return big[:, :, 1::2]


def run_rank(rank, ranks, group, log, out_dir):
    """This rank's backward of every case, saved for check_case."""
    if ranks == 2:
        bad_inputs(rank, ranks, log, group)
    for ci, case in enumerate(cases(ranks)):
        name, causal, sharding, dtype, exchange, variant = case
        plan = base._plan(base._layout(name), ranks, causal, sharding, dtype, variant == BALANCED)
        rows = base._rows(plan, rank)
        q, k, v, do, o, lse = (x[:, rows] if x.dim() == 4 else x[:, :, rows].contiguous()
                               for x in global_inputs(ci, ranks, case))
        if variant == "strided":
            q, k, v, do, o = (_beside_nan(x) for x in (q, k, v, do, o))
        given = {}
        if variant == "out":
            given = {n: torch.full(x.shape, float("nan"), dtype=x.dtype) for n, x in (("dq", q), ("dk", k), ("dv", v))}
        stats = {}
        before = log.sent
        got = sparsek.cp_attention_backward(q, k, v, o, lse, do, plan, group, exchange=exchange, stats=stats,
                                            **given)
        stats["counted"] = log.sent - before
        if given:
            assert all(g is given[n] for g, n in zip(got, ("dq", "dk", "dv")))
        again = sparsek.cp_attention_backward(q, k, v, o, lse, do, plan, group, exchange=exchange)
        repeat = all(torch.equal(a, b) for a, b in zip(got, again))
        # Autograd: cp_attention's own o / lse, then the direct call on them.
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
        ao, alse = sparsek.cp_attention(*leaves, plan, group, exchange=exchange)
        assert ao.requires_grad and not alse.requires_grad
        (ao.float() * do.float()).sum().backward()
        direct = sparsek.cp_attention_backward(q, k, v, ao.detach(), alse, do, plan, group, exchange=exchange)
        autograd_equal = all(torch.equal(x.grad, d) for x, d in zip(leaves, direct))
        torch.save({"grads": got, "stats": stats, "repeat": repeat, "autograd": [x.grad for x in leaves],
                    "autograd_equal": autograd_equal}, os.path.join(out_dir, f"bwd_{ranks}_{ci}_{rank}.pt"))
    # No grad needed: cp_attention stays the no_grad forward (out= allowed).
    plan = base._plan(base._layout("causal"), ranks, True, "zigzag", "float32")
    q, k, v = (x[:, base._rows(plan, rank)] for x in base._global_qkv(5, "float32"))
    o, _ = sparsek.cp_attention(q, k, v, plan, group, out=torch.empty(q.shape))
    assert not o.requires_grad
    with torch.no_grad():
        o, _ = sparsek.cp_attention(q.requires_grad_(True), k, v, plan, group)
    assert not o.requires_grad


def bad_inputs(rank, ranks, log, group):
    """Each bad call raises naming the argument, and nothing is sent."""
    log.forbid = True
    sent = log.sent
    case = ("window", False, "contiguous", "float32", "all_to_all", None)
    plan = base._plan(base._layout("window"), ranks, False, "contiguous", "float32")
    rows = base._rows(plan, rank)
    q, k, v, do, o, lse = (x[:, rows] if x.dim() == 4 else x[:, :, rows].contiguous()
                           for x in global_inputs(0, ranks, case))

    def bwd(*args, **kwargs):
        return sparsek.cp_attention_backward(*args, group=group, **kwargs)

    expect = base._expect
    expect(ValueError, "q has shape", lambda: bwd(q[:, 1:], k, v, o, lse, do, plan))
    expect(TypeError, "k.dtype", lambda: bwd(q, k.double(), v, o, lse, do, plan))
    expect(ValueError, "o is", lambda: bwd(q, k, v, o[:, 1:], lse, do, plan))
    expect(ValueError, "do is", lambda: bwd(q, k, v, o, lse, do.half(), plan))
    expect(TypeError, "do must be a torch.Tensor", lambda: bwd(q, k, v, o, lse, do.numpy(), plan))
    expect(ValueError, "lse is", lambda: bwd(q, k, v, o, lse.half(), do, plan))
    expect(ValueError, "lse is", lambda: bwd(q, k, v, o, lse[:, :, 1:], do, plan))
    wide = torch.zeros(o.shape[:3] + (2 * o.shape[3],), dtype=o.dtype)
    wide[..., ::2] = o
    expect(ValueError, "o: the last dimension", lambda: bwd(q, k, v, wide[..., ::2], lse, do, plan))
    expect(ValueError, "exchange", lambda: bwd(q, k, v, o, lse, do, plan, exchange="library"))
    expect(TypeError, "plan", lambda: bwd(q, k, v, o, lse, do, plan.layout))
    plan3 = base._plan(base._layout("window"), ranks + 1, False, "contiguous", "float32")
    expect(ValueError, f"group has {ranks} ranks", lambda: bwd(q, k, v, o, lse, do, plan3))
    expect(ValueError, "dk is", lambda: bwd(q, k, v, o, lse, do, plan, dk=torch.empty(1)))
    qq = q.clone()
    expect(ValueError, "dq shares its storage with q", lambda: bwd(qq, k, v, o, lse, do, plan, dq=qq))
    expect(ValueError, "dv shares its storage with o", lambda: bwd(q, k, v, o, lse, do, plan,
                                                                   dv=o.view(-1)[:v.numel()].view(v.shape)))
    leaf = q.clone().requires_grad_(True)
    expect(ValueError, "out: outputs cannot be given",
           lambda: sparsek.cp_attention(leaf, k, v, plan, group, out=torch.empty(q.shape)))
    assert log.sent == sent
    log.forbid = False


def check_case(ci, case, ranks, out_dir):
    name, causal, sharding, dtype, exchange, variant = case
    layout = base._layout(name)
    plan = base._plan(layout, ranks, causal, sharding, dtype, variant == BALANCED)
    q, k, v, do, o, lse = global_inputs(ci, ranks, case)
    f = [x.float() for x in (q, k, v, o, do)]
    ref = sparsek.attention_backward(*f[:3], f[3], f[4], lse, layout, causal=causal)
    got = [torch.full(x.shape, float("nan"), dtype=torch.float64) for x in ref]
    esize = q.element_size()
    where = f"ranks {ranks} case {case}"
    for r in range(ranks):
        saved = torch.load(os.path.join(out_dir, f"bwd_{ranks}_{ci}_{r}.pt"))
        rows = base._rows(plan, r)
        for g, part in zip(got, saved["grads"]):
            assert part.dtype == q.dtype, where
            g[:, rows] = part.double()
        st = saved["stats"]
        back = plan.recv_bytes(r) * 4 // esize  # the reverse of r's incoming pairs, fp32
        assert st["kv_sent_bytes"] == plan.send_bytes(r), (where, r, st)
        assert st["grad_sent_bytes"] == back, (where, r, st)
        assert st["grad_recv_bytes"] == plan.send_bytes(r) * 4 // esize, (where, r, st)
        assert st["sent_bytes"] == st["counted"] == plan.send_bytes(r) + back, (where, r, st)
        assert saved["repeat"], f"{where}: a repeat is not bitwise equal (rank {r})"
        assert saved["autograd_equal"], f"{where}: autograd differs from the direct call (rank {r})"
        # Autograd ran on the sharded forward's own O / LSE, which differ
        # from the global ones by a rounding of the dtype entering through
        # Dl = dO . O: a looser bound here (4 tol + 8u amax, not derived);
        # the exact check is autograd_equal (bitwise against the direct
        # call on those same O / LSE).
        for a, w in zip(saved["autograd"], ref):
            w64, a64 = w.double(), a.double()
            err = (a64 - w64[:, rows]).abs()
            assert torch.isfinite(a64).all() and (err <= 4 * _tol(w64, dtype, ranks)[:, rows]
                                                  + 8 * _u(dtype) * w64.abs().max()).all(), where
        if variant == ZERO_DO and r == 0:
            assert (saved["grads"][0] == 0).all(), where  # no dO, no dQ
            assert (saved["grads"][1] != 0).any() and (saved["grads"][2] != 0).any(), where
    assert sum(plan.send_bytes(r) for r in range(ranks)) > 0, where
    for g, w, n in zip(got, ref, ("dq", "dk", "dv")):
        w64 = w.double()
        err = (g - w64).abs()
        assert torch.isfinite(g).all(), (where, n)
        assert (err <= _tol(w64, dtype, ranks)).all(), f"{where} {n}: max excess {(err - _tol(w64, dtype, ranks)).max():.3g}"
    if dtype == "float32":  # the C library's own CPU run, same order: bitwise
        sim = sparsek.cp_attention_backward_simulated(*(x.numpy() for x in (q, k, v, o)), lse.numpy(), do.numpy(),
                                                      layout, ranks, causal=causal, sharding=sharding,
                                                      chunk_starts=plan.chunk_starts)
        for g, s, n in zip(got, sim[:3], ("dq", "dk", "dv")):
            assert np.array_equal(g.float().numpy(), s), f"{where} {n}: not the C run's bits"
    return got


def _u(dtype):
    return {"float32": 2.0**-24, "bfloat16": 2.0**-8}[dtype]


def _tol(ref64, dtype, ranks):
    amax = ref64.abs().max()
    return 2 * _u(dtype) * ref64.abs() + 2.0**-24 * 4 * (ranks + 2) * amax + 2.0**-24


# ---------------------------------------------------------------------------
# 2 GPUs, NCCL (inside test_cp_torch.py's NCCL spawn; not run on the CPU)
# ---------------------------------------------------------------------------

# (GPU_CASES index, exchange of the backward): sinks + window zigzag bf16,
# random contiguous f16, causal zigzag bf16; and the library forward's
# autograd (its backward goes over all_to_all).
GPU_BWD = [(0, "all_to_all"), (1, "p2p"), (2, "p2p"), (3, "all_to_all")]


def _gpu_global(ci, device):
    name, causal, _, dtype, _ = base.GPU_CASES[ci]
    q, k, v = base._gpu_qkv(ci, dtype, device)
    g = torch.Generator().manual_seed(BSEED + 500 + ci)
    do = torch.randn(q.shape, generator=g).to(q.dtype).to(device)
    o, lse = sparsek.attention(q, k, v, base._gpu_layout(name), causal=causal, return_lse=True)
    return q, k, v, do, o, lse


def gpu_run_rank(rank, world, device, out_dir):
    """The backward of GPU_BWD's cases on this rank: the direct call on the
    one-GPU forward's O / LSE rows, and cp_attention's autograd (bitwise
    against the direct call on its own O / LSE)."""
    for ci, exchange in GPU_BWD:
        plan = base._gpu_plan(ci, world)
        rows = base._rows(plan, rank).to(device)
        q, k, v, do, o, lse = (x[:, rows] if x.dim() == 4 else x[:, :, rows].contiguous()
                               for x in _gpu_global(ci, device))
        stats = {}
        grads = sparsek.cp_attention_backward(q, k, v, o, lse, do, plan, exchange=exchange, stats=stats)
        again = sparsek.cp_attention_backward(q, k, v, o, lse, do, plan, exchange=exchange)
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
        ao, alse = sparsek.cp_attention(*leaves, plan, exchange=base.GPU_CASES[ci][4])
        (ao.float() * do.float()).sum().backward()
        direct = sparsek.cp_attention_backward(q, k, v, ao.detach(), alse, do, plan, exchange=exchange)
        torch.save({"grads": [g.cpu() for g in grads], "stats": stats,
                    "repeat": all(torch.equal(a, b) for a, b in zip(grads, again)),
                    "autograd_equal": all(torch.equal(x.grad, d) for x, d in zip(leaves, direct))},
                   os.path.join(out_dir, f"gpu_bwd_{ci}_{rank}.pt"))


def gpu_check(ranks, out_dir, device="cuda:0"):
    """Against the one-GPU backward. Bound: every pass's kernel writes its
    partial dQ / dK / dV in the dtype (u of at most R + 2 partials of size
    <= amax) before the fp32 sums, and the result is rounded once more:
    |got - ref| <= 2u|ref| + 2 (R + 2) u amax."""
    for ci, _ in GPU_BWD:
        name, causal, _, dtype, _ = base.GPU_CASES[ci]
        plan = base._gpu_plan(ci, ranks)
        q, k, v, do, o, lse = _gpu_global(ci, device)
        ref = sparsek.attention_backward(q, k, v, o, do, lse, base._gpu_layout(name), causal=causal)
        got = [torch.full(x.shape, float("nan"), dtype=torch.float64) for x in ref]
        esize = q.element_size()
        for r in range(ranks):
            saved = torch.load(os.path.join(out_dir, f"gpu_bwd_{ci}_{r}.pt"))
            rows = base._rows(plan, r)
            for g, part in zip(got, saved["grads"]):
                g[:, rows] = part.double()
            st = saved["stats"]
            assert st["sent_bytes"] == plan.send_bytes(r) + plan.recv_bytes(r) * 4 // esize, (ci, r, st)
            assert saved["repeat"] and saved["autograd_equal"], (ci, r)
        u = {"float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
        for g, w, n in zip(got, ref, ("dq", "dk", "dv")):
            w64 = w.double().cpu()
            tol = 2 * u * w64.abs() + 2 * (ranks + 2) * u * w64.abs().max()
            err = (g - w64).abs()
            assert torch.isfinite(g).all() and (err <= tol).all(), \
                f"{base.GPU_CASES[ci]} {n}: max excess {(err - tol).max().item():.3g}"
