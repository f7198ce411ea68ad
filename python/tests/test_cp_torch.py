"""sparsek.cp_attention over torch.distributed (gloo, CPU tensors): R = 2, 3
and 4 ranks (groups of one spawn of 4 processes), each running its shard; the gathered O / LSE against the
single-process sparsek.attention on the global tensors, the bytes each rank
handed to torch.distributed against the plan and against the units the
layout needs (counted here from the layout on its own), NaN-poisoned
outputs, inputs that must not be read (NaN beside strided views), and bad
inputs refused before any communication; the same with balanced chunk
boundaries (sparsek.cp_balance). One spawn keeps it short; it
also runs sparsek.cp_attention_backward and cp_attention's autograd at
R = 2 and 3 (cp_torch_backward_checks.py).

Tolerance (as tests/cpu/test_cp.c and test_context_parallel.py): the
passes run in fp32 (the CPU backend's own type) with the reference's
arithmetic, and the merge adds a few fp32 roundings of terms bounded by
vmax (exp of an argument rounded to u|la - m| costs u|la - m| e^-|la - m| <=
0.4u relative); so |got - ref| <= 2u_dtype|ref| + 2^-24 (4|ref| + 8 vmax
(2 + |LSE|)) + 2^-24, u_dtype the output's unit roundoff (one rounding of
the dtype), and LSE within 2^-20 relative / absolute.
"""

from __future__ import annotations

import datetime
import os

import numpy as np
import pytest

import sparsek
from conftest import HAVE_TORCH

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

if HAVE_TORCH:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

B, S, HQ, HKV, D, BLOCK = 2, 64 * 13 + 17, 4, 2, 16, 64
SEED = 3303

# (name, mask causal, sharding, dtype, exchange, strided inputs, balanced
# chunk boundaries)
def _cases(ranks):
    out = []
    layouts = ("window", "sinks_window", "random", "causal")
    for i, name in enumerate(layouts):
        for j, sharding in enumerate(("contiguous", "zigzag")):
            # Non-causal random rows select the tail block from other ranks.
            causal = name != "window" and (name, sharding) != ("random", "contiguous")
            dtype = {3: "float16", 4: "bfloat16"}.get(ranks, "float32") if (i + j) % 3 == 0 else "float32"
            exchange = "p2p" if (i + j + ranks) % 2 else "all_to_all"
            out.append((name, causal, sharding, dtype, exchange, (i + j) % 2 == 1, False))
    # The same run with sk_cp_balance's boundaries (CpPlan(chunk_starts=...)).
    for i, (name, causal, sharding) in enumerate((("sinks_window", True, "zigzag"),
                                                  ("random", True, "contiguous"),
                                                  ("causal", True, "zigzag"),
                                                  ("window", False, "contiguous"))):
        dtype = "bfloat16" if i == 2 and ranks > 2 else "float32"
        out.append((name, causal, sharding, dtype, ("all_to_all", "p2p")[i % 2], i == 1, True))
    return out


def _layout(name):
    if name == "window":
        return sparsek.Layout.window(S, left=150, right=70, block=BLOCK)
    if name == "sinks_window":
        return sparsek.Layout.sinks_window(S, sink_tokens=64, window_tokens=200, block=BLOCK, heads=HKV)
    if name == "random":
        return sparsek.Layout.random(S, k=3, seed=7, block=BLOCK, batch=B, heads=HQ)
    return sparsek.Layout.causal(S, block=BLOCK)


def _global_qkv(case_index, dtype):
    g = torch.Generator().manual_seed(SEED + case_index)
    dt = getattr(torch, dtype)
    q = torch.randn(B, S, HQ, D, generator=g).to(dt)
    k = torch.randn(B, S, HKV, D, generator=g).to(dt)
    v = torch.randn(B, S, HKV, D, generator=g).to(dt)
    return q, k, v


def _rows(plan, rank):
    return torch.cat([torch.arange(s, s + n) for s, n in plan.shard(rank)])


def _plan(layout, ranks, causal, sharding, dtype, balanced=False):
    """The plan; balanced: with sk_cp_balance's chunk starts, a remote block
    costing 4 local ones so that these short sequences move too."""
    starts = None
    if balanced:
        starts = sparsek.cp_balance(layout, ranks, batch=B, heads_q=HQ, heads_kv=HKV, head_dim=D,
                                    dtype=getattr(torch, dtype), causal=causal, sharding=sharding,
                                    cost=(1.0, 4.0, 0.0))
        C = ranks * (2 if sharding == "zigzag" else 1)
        # With causal the later rows cost more: the boundaries move.
        assert not causal or starts != [c * (-(-S // BLOCK)) // C for c in range(C + 1)], starts
    return sparsek.CpPlan(layout, ranks, batch=B, heads_q=HQ, heads_kv=HKV, head_dim=D,
                          dtype=getattr(torch, dtype), causal=causal, sharding=sharding,
                          chunk_starts=starts)


class _CommLog:
    """Counts the bytes handed to torch.distributed (what cp_attention
    sends), or refuses any communication (forbid)."""

    def __init__(self):
        self.sent = 0
        self.forbid = False
        self._a2a, self._p2p = dist.all_to_all_single, dist.batch_isend_irecv
        dist.all_to_all_single = self.all_to_all_single
        dist.batch_isend_irecv = self.batch_isend_irecv

    def all_to_all_single(self, output, input, *args, **kwargs):
        assert not self.forbid, "communication before the checks"
        self.sent += input.numel() * input.element_size()
        return self._a2a(output, input, *args, **kwargs)

    def batch_isend_irecv(self, ops):
        assert not self.forbid, "communication before the checks"
        self.sent += sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        return self._p2p(ops)


def _expect(exc, fragment, fn):
    try:
        fn()
    except exc as e:
        assert fragment in str(e), f"message {e!r} does not name {fragment!r}"
        return
    raise AssertionError(f"no {exc.__name__} ({fragment})")


def _bad_inputs(rank, ranks, log, group):
    """Each bad call raises naming the argument, and nothing is sent."""
    log.forbid = True
    sent = log.sent
    plan = _plan(_layout("window"), ranks, False, "contiguous", "float32")
    q, k, v = (x[:, _rows(plan, rank)] for x in _global_qkv(0, "float32"))
    def cp(*args, **kwargs):
        return sparsek.cp_attention(*args, group=group, **kwargs)
    _expect(ValueError, "q has shape", lambda: cp(q[:, 1:], k, v, plan))
    _expect(ValueError, "k has shape", lambda: cp(q, k[:, :, :1], v, plan))
    _expect(TypeError, "q.dtype", lambda: cp(q.half(), k.half(), v.half(), plan))
    _expect(TypeError, "v.dtype", lambda: cp(q, k, v.double(), plan))
    other = 1 - rank  # the peer's shard: a plan / rank mismatch (shards differ: the tail)
    qo, ko, vo = (x[:, _rows(plan, other)] for x in _global_qkv(0, "float32"))
    _expect(ValueError, f"rank {rank}'s shard", lambda: cp(qo, ko, vo, plan))
    plan3 = _plan(_layout("window"), ranks + 1, False, "contiguous", "float32")
    _expect(ValueError, f"group has {ranks} ranks", lambda: cp(q, k, v, plan3))
    _expect(TypeError, "plan", lambda: cp(q, k, v, plan.layout))
    _expect(ValueError, "out", lambda: cp(q, k, v, plan, out=torch.empty(1)))
    _expect(ValueError, "lse", lambda: cp(q, k, v, plan, lse=torch.empty(B, HQ, 1)))
    _expect(ValueError, "exchange", lambda: cp(q, k, v, plan, exchange="ring"))
    _expect(ValueError, "exchange = 'library' runs CUDA", lambda: cp(q, k, v, plan, exchange="library"))
    qq = q.clone()
    _expect(ValueError, "out shares its storage with q", lambda: cp(qq, k, v, plan, out=qq))
    kk = k.clone()
    lse_in_k = kk.view(-1)[:B * HQ * q.shape[1]].view(B, HQ, -1)
    _expect(ValueError, "lse shares its storage with k", lambda: cp(q, kk, v, plan, lse=lse_in_k))
    # A corrupt plan (a unit's block out of range): the library's check.
    bad = _plan(_layout("window"), ranks, False, "contiguous", "float32")
    blob = bad.blob()
    units_at = int(blob.header["units"]) // 4
    bad._buf.view(np.int32)[units_at] = 1 << 30
    _expect(sparsek.SparseKError, "plan is corrupt", lambda: cp(q, k, v, bad))
    assert log.sent == sent
    log.forbid = False


# One spawn of 4 processes serves R = 4 (the default group), R = 2 (group
# [0, 1]) and R = 3 (group [1, 2, 3]: group ranks differ from global ones).
WORLD = 4
GROUPS = {4: list(range(WORLD)), 2: [0, 1], 3: [1, 2, 3]}
BACKWARD_RANKS = (2, 3)  # cp_attention_backward (cp_torch_backward_checks.py)


def _worker(rank, world, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    groups = {R: None if R == world else dist.new_group(members) for R, members in GROUPS.items()}
    log = _CommLog()
    try:
        for ranks in (4, 2, 3):
            if rank in GROUPS[ranks]:
                _run_group(dist.get_rank(groups[ranks]) if groups[ranks] else rank, ranks, groups[ranks],
                           log, out_dir)
    finally:
        dist.destroy_process_group()


def _run_group(rank, ranks, group, log, out_dir):
    if ranks == 2:
        _bad_inputs(rank, ranks, log, group)
    for ci, (name, causal, sharding, dtype, exchange, strided, balanced) in enumerate(_cases(ranks)):
        plan = _plan(_layout(name), ranks, causal, sharding, dtype, balanced)
        if balanced:
            plan.check(rank)  # the library's whole-plan check against this rank's descriptor
        rows = _rows(plan, rank)
        q, k, v = (x[:, rows] for x in _global_qkv(ci, dtype))
        if strided:  # views beside NaN: what must not be read
            def beside_nan(x):
                big = torch.full(x.shape[:2] + (2 * x.shape[2], x.shape[3]), float("nan"), dtype=x.dtype)
                big[:, :, 1::2] = x
                return big[:, :, 1::2]
            q, k, v = beside_nan(q), beside_nan(k), beside_nan(v)
        o = torch.full((B, len(rows), HQ, D), float("nan"), dtype=q.dtype)
        lse = torch.full((B, HQ, len(rows)), float("nan"))
        stats = {}
        before = log.sent
        got_o, got_lse = sparsek.cp_attention(q, k, v, plan, group, out=o, lse=lse, exchange=exchange,
                                              stats=stats)
        assert got_o is o and got_lse is lse
        stats["counted"] = log.sent - before
        torch.save({"o": o, "lse": lse, "stats": stats}, os.path.join(out_dir, f"{ranks}_{ci}_{rank}.pt"))
    # Without out= / lse=: allocated.
    plan = _plan(_layout("causal"), ranks, True, "zigzag", "float32")
    q, k, v = (x[:, _rows(plan, rank)] for x in _global_qkv(99, "float32"))
    o, lse = sparsek.cp_attention(q, k, v, plan, group)
    torch.save({"o": o, "lse": lse}, os.path.join(out_dir, f"{ranks}_alloc_{rank}.pt"))
    if ranks in BACKWARD_RANKS:  # the backward, in the same spawn
        import cp_torch_backward_checks

        cp_torch_backward_checks.run_rank(rank, ranks, group, log, out_dir)


def _needed_bytes(layout, plan, ranks, causal, esize):
    """Per receiver, the bytes of the remote units its rows select, from
    the layout on its own (not the plan): unit (block, batch, KV head)."""
    nb = -(-S // BLOCK)
    owner = np.empty(nb, dtype=int)
    for r in range(ranks):
        for s, n in plan.shard(r):
            owner[s // BLOCK:(s + n + BLOCK - 1) // BLOCK] = r
    g = layout.grid
    ro, ci = layout.row_offsets.reshape(-1), layout.col_indices
    need = [set() for _ in range(ranks)]
    for sl in range(g.batch * g.heads):
        lb, lh = divmod(sl, g.heads)
        batches = range(B) if g.batch == 1 else [lb]
        heads = range(HKV) if g.heads == 1 else [lh if g.heads == HKV else lh // (HQ // HKV)]
        for i in range(nb):
            for j in ci[ro[sl * nb + i]:ro[sl * nb + i + 1]]:
                if (causal and j > i) or owner[j] == owner[i]:
                    continue
                need[owner[i]].update((int(j), b, h) for b in batches for h in heads)
    return [sum(2 * min(BLOCK, S - j * BLOCK) * D * esize for j, _, _ in units) for units in need]


def _check_case(ci, case, ranks, out_dir):
    name, causal, sharding, dtype, exchange, _, balanced = case
    layout = _layout(name)
    plan = _plan(layout, ranks, causal, sharding, dtype, balanced)
    q, k, v = _global_qkv(ci, dtype)
    ref, ref_lse = sparsek.attention(q.float(), k.float(), v.float(), layout, causal=causal, return_lse=True)
    o = torch.full((B, S, HQ, D), float("nan"), dtype=torch.float64)
    lse = torch.full((B, HQ, S), float("nan"))
    needed = _needed_bytes(layout, plan, ranks, causal, q.element_size())
    for r in range(ranks):
        got = torch.load(os.path.join(out_dir, f"{ranks}_{ci}_{r}.pt"))
        rows = _rows(plan, r)
        o[:, rows] = got["o"].double()
        lse[:, :, rows] = got["lse"]
        st = got["stats"]
        where = f"case {case} rank {r}"
        assert st["sent_bytes"] == st["counted"] == plan.send_bytes(r), (where, st)
        assert st["recv_bytes"] == plan.recv_bytes(r) == needed[r], (where, st, needed)
    assert sum(needed) > 0
    u = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
    ref64 = ref.double()
    finite = torch.isfinite(ref_lse)
    lmag = torch.where(finite, ref_lse.abs(), 0.0).transpose(1, 2).unsqueeze(-1).double()
    vmax = v.double().abs().max()
    tol = 2 * u * ref64.abs() + 2.0**-24 * (4 * ref64.abs() + 8 * vmax * (2 + lmag)) + 2.0**-24
    err = (o - ref64).abs()
    assert (err <= tol).all(), f"case {case}: max excess {(err - tol).max().item():.3g}"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), case
    assert torch.allclose(lse[finite], ref_lse[finite], rtol=2.0**-20, atol=2.0**-20), case


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every group's results, from one spawn of WORLD processes."""
    out = tmp_path_factory.mktemp("cp")
    # One OpenMP thread per rank process: WORLD processes on few cores.
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        mp.spawn(_worker, args=(WORLD, str(out / "pg"), str(out)), nprocs=WORLD)
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    return str(out)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_cp_attention_over_gloo_matches_the_single_process_forward(ranks, results):
    cases = _cases(ranks)
    for ci, case in enumerate(cases):
        _check_case(ci, case, ranks, results)
    assert {c[2] for c in cases} == {"contiguous", "zigzag"} and {c[4] for c in cases} == {"all_to_all", "p2p"}
    assert {c[6] for c in cases} == {False, True}
    # The allocated outputs (no out=): the causal zigzag case.
    layout = _layout("causal")
    plan = _plan(layout, ranks, True, "zigzag", "float32")
    q, k, v = _global_qkv(99, "float32")
    ref, ref_lse = sparsek.attention(q, k, v, layout, causal=True, return_lse=True)
    for r in range(ranks):
        got = torch.load(os.path.join(results, f"{ranks}_alloc_{r}.pt"))
        rows = _rows(plan, r)
        assert torch.allclose(got["o"], ref[:, rows], rtol=1e-5, atol=1e-5)
        assert torch.allclose(got["lse"], ref_lse[:, :, rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ranks", BACKWARD_RANKS)
def test_cp_attention_backward_over_gloo_matches_the_single_process_backward(ranks, results):
    # Gradients, bytes, repeat, autograd and the C run's bits
    # (cp_torch_backward_checks.py); the reduction case: dO zero on rank
    # 0's rows, and its dK / dV still come back from the other ranks.
    import cp_torch_backward_checks as checks

    cases = checks.cases(ranks)
    for ci, case in enumerate(cases):
        checks.check_case(ci, case, ranks, results)
    assert {c[3] for c in cases} == {"float32", "bfloat16"} and {c[2] for c in cases} == {"contiguous", "zigzag"}
    assert {c[4] for c in cases} == {"all_to_all", "p2p"} and checks.ZERO_DO in {c[5] for c in cases}
    assert checks.BALANCED in {c[5] for c in cases}


def test_bench_layout_is_the_issues():
    # bench/cp_torch.py's layout, row by row against its definition: the
    # sink blocks, the window's blocks up to the diagonal, and min(topk,
    # candidates) distinct blocks between them, different per head.
    from conftest import import_bench

    bench = import_bench("cp_torch")
    seq, block, sinks, window, topk, heads = 60 * 128 - 5, 128, 200, 1024, 5, 3
    layout = bench.issue_layout(seq, block, sinks, window, topk, heads, seed=1)
    ro, ci = layout.row_offsets.reshape(-1), layout.col_indices
    sb, wb, nb = 2, 8, 60
    rows = []
    for h in range(heads):
        for i in range(nb):
            cols = ci[ro[h * nb + i]:ro[h * nb + i + 1]]
            lo = max(0, i - wb)
            want_fixed = set(range(min(sb, lo))) | set(range(lo, i + 1))
            rand = [int(j) for j in cols if j not in want_fixed]
            assert want_fixed <= set(int(j) for j in cols)
            assert len(rand) == min(topk, max(0, lo - sb)) and all(sb <= j < lo for j in rand)
            assert list(cols) == sorted(set(int(j) for j in cols))
            rows.append(tuple(rand))
    assert len(set(rows[-nb:] + rows[:nb])) > nb  # heads draw their own picks


# ---------------------------------------------------------------------------
# 2 GPUs, NCCL (the GPU machine: nvidia-h100-x2)
# ---------------------------------------------------------------------------

GPU_S, GPU_BLOCK, GPU_D = 128 * 9 + 40, 128, 64
GPU_CASES = [  # (layout, causal, sharding, dtype, exchange)
    ("sinks_window", True, "zigzag", "bfloat16", "all_to_all"),
    ("random", False, "contiguous", "float16", "p2p"),
    ("causal", True, "zigzag", "bfloat16", "p2p"),
    # The library's own run (sk_cp_forward) over torch's NCCL communicator.
    ("sinks_window", True, "zigzag", "bfloat16", "library"),
    ("random", False, "contiguous", "float16", "library"),
]


def _gpu_layout(name):
    if name == "sinks_window":
        return sparsek.Layout.sinks_window(GPU_S, sink_tokens=128, window_tokens=300, block=GPU_BLOCK, heads=HKV)
    if name == "random":
        return sparsek.Layout.random(GPU_S, k=3, seed=11, block=GPU_BLOCK, batch=B, heads=HKV)
    return sparsek.Layout.causal(GPU_S, block=GPU_BLOCK)


def _gpu_qkv(ci, dtype, device):
    g = torch.Generator().manual_seed(SEED + 50 + ci)
    dt = getattr(torch, dtype)
    return tuple(torch.randn(B, GPU_S, h, GPU_D, generator=g).to(dt).to(device) for h in (HQ, HKV, HKV))


def _gpu_plan(ci, ranks):
    name, causal, sharding, dtype, _ = GPU_CASES[ci]
    return sparsek.CpPlan(_gpu_layout(name), ranks, batch=B, heads_q=HQ, heads_kv=HKV, head_dim=GPU_D,
                          dtype=getattr(torch, dtype), causal=causal, sharding=sharding)


def _gpu_worker(rank, world, init_file, out_dir):
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            device_id=device, timeout=datetime.timedelta(seconds=120))
    try:
        dist.barrier()
        for ci, (_, _, _, dtype, exchange) in enumerate(GPU_CASES):
            plan = _gpu_plan(ci, world)
            rows = _rows(plan, rank).to(device)
            q, k, v = (x[:, rows] for x in _gpu_qkv(ci, dtype, device))
            o = torch.full(q.shape, float("nan"), dtype=q.dtype, device=device)
            lse = torch.full((B, HQ, len(rows)), float("nan"), device=device)
            stats = {}
            sparsek.cp_attention(q, k, v, plan, out=o, lse=lse, exchange=exchange, stats=stats)
            torch.save({"o": o.cpu(), "lse": lse.cpu(), "stats": stats}, os.path.join(out_dir, f"gpu_{ci}_{rank}.pt"))
        import cp_torch_backward_checks  # the backward (cp_attention_backward)

        cp_torch_backward_checks.gpu_run_rank(rank, world, device, out_dir)
    finally:
        dist.destroy_process_group()


def _two_gpus() -> bool:
    from conftest import HAVE_CUDA

    return HAVE_CUDA and torch.cuda.device_count() >= 2


@pytest.mark.skipif(not HAVE_TORCH or not _two_gpus(), reason="needs 2 CUDA devices and a CUDA build")
def test_cp_attention_over_nccl_matches_one_gpu(tmp_path):
    # Bound (docs/perf/context_parallel.md): both sides round P before P V
    # (u vmax each), the sharded side rounds its two partials (u vmax) and
    # O once more: |O - O_ref| <= 2u|O_ref| + 4u vmax.
    ranks = 2
    mp.spawn(_gpu_worker, args=(ranks, str(tmp_path / "pg"), str(tmp_path)), nprocs=ranks)
    for ci, (name, causal, sharding, dtype, exchange) in enumerate(GPU_CASES):
        plan = _gpu_plan(ci, ranks)
        q, k, v = _gpu_qkv(ci, dtype, "cuda:0")
        ref, ref_lse = sparsek.attention(q, k, v, _gpu_layout(name), causal=causal, return_lse=True)
        ref, ref_lse = ref.double().cpu(), ref_lse.cpu()
        o = torch.full(ref.shape, float("nan"), dtype=torch.float64)
        lse = torch.full(ref_lse.shape, float("nan"))
        for r in range(ranks):
            got = torch.load(os.path.join(tmp_path, f"gpu_{ci}_{r}.pt"))
            rows = _rows(plan, r)
            o[:, rows] = got["o"].double()
            lse[:, :, rows] = got["lse"]
            assert got["stats"]["sent_bytes"] == plan.send_bytes(r)
            assert got["stats"]["recv_bytes"] == plan.recv_bytes(r)
        u = {"float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
        tol = 2 * u * ref.abs() + 4 * u * v.double().abs().max().cpu()
        err = (o - ref).abs()
        assert (err <= tol).all(), f"{GPU_CASES[ci]}: max excess {(err - tol).max().item():.3g}"
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
        assert ((lse - ref_lse).abs()[fin] <= 2.0**-12 + 2.0**-16 * ref_lse.abs()[fin]).all()
    import cp_torch_backward_checks

    cp_torch_backward_checks.gpu_check(ranks, str(tmp_path))
