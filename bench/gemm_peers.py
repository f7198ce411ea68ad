"""BSR sparse x dense GEMM against its peers, same run, same GPU (issue 6).

    PYTHONPATH=python SPARSEK_LIBRARY=$PWD/build/libsparsek.so \
        python3 bench/gemm_peers.py --out results.json [--commit HASH] [--quick]

Shape: M = N = K = 8192, fp16, 128 x 128 blocks, exactly `per_row` random
column blocks in every block row (4, 8, 16, 32, 64 of 64: 6.25 % .. 100 %),
B dense row-major, C fp16. Implementations:
  sparsek        sk_bsr_gemm_run alone (planned once), through ctypes
  sparsek_call   sparsek.bsr_gemm (the Python convenience call: plan + run,
                 workspace from torch's allocator, every call)
  cusparse       torch BSR tensor @ B (torch dispatches BSR x dense to cuSPARSE)
  triton         torch.sparse._triton_ops.bsr_dense_mm (torch's Triton kernel)
  cublas         torch.matmul on A stored dense (zeros included): cuBLAS
TFLOPS count the selected blocks only (2 * nnz * 128 * 128 * N) for every
implementation, the dense one included. Times: CUDA events around each
call, 3 warm-ups, median of `reps` calls. Every implementation's C is
compared with cuBLAS's (max |diff| relative to max |C|; C starts as NaN),
recorded per row.
"""

import argparse
import ctypes
import datetime
import json
import statistics
import subprocess
import sys

import torch


def make_problem(m, n, k, block, per_row, seed, device):
    g = torch.Generator().manual_seed(seed)
    rb, cb = m // block, k // block
    cols = torch.stack([torch.randperm(cb, generator=g)[:per_row].sort().values for _ in range(rb)])
    crow = torch.arange(0, rb * per_row + 1, per_row, dtype=torch.int32)
    col = cols.reshape(-1).to(torch.int32)
    vals = (torch.rand(rb * per_row, block, block, generator=g) * 2 - 1).half()
    b = (torch.rand(k, n, generator=g) * 2 - 1).half()
    return crow.to(device), col.to(device), vals.to(device), b.to(device)


def time_call(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times), min(times)


def sparsek_runner(crow, col, vals, b, c, m, n, k, block):
    """sk_bsr_gemm_run on preallocated buffers, planned once."""
    from sparsek import _lib

    F = _lib.F
    desc = _lib.SkBsrGemmDesc()
    _lib.check(F.sk_bsr_gemm_desc_init(ctypes.byref(desc), ctypes.sizeof(desc)))
    desc.backend = int(_lib.Backend.CUDA)
    desc.ab_dtype = int(_lib.DType.F16)
    desc.c_dtype = int(_lib.DType.F16)
    desc.m, desc.n, desc.k = m, n, k
    desc.b_order = int(_lib.Order.ROW_MAJOR)
    bsr = _lib.SkBsr()
    bsr.grid.rows, bsr.grid.cols = m, k
    bsr.grid.block_rows = bsr.grid.block_cols = block
    bsr.grid.batch = bsr.grid.heads = 1
    bsr.nnz = col.numel()
    bsr.row_offsets = ctypes.cast(crow.data_ptr(), ctypes.POINTER(ctypes.c_int32))
    bsr.col_indices = ctypes.cast(col.data_ptr(), ctypes.POINTER(ctypes.c_int32))
    size = ctypes.c_size_t()
    _lib.check(F.sk_bsr_gemm_workspace_size(ctypes.byref(desc), ctypes.byref(bsr), ctypes.byref(size)))
    ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=b.device)
    stream = torch.cuda.current_stream().cuda_stream
    _lib.check(F.sk_bsr_gemm_plan(ctypes.byref(desc), ctypes.byref(bsr), ws.data_ptr(), size.value, stream))

    def run():
        _lib.check(
            F.sk_bsr_gemm_run(ctypes.byref(desc), ctypes.byref(bsr), vals.data_ptr(), b.data_ptr(), c.data_ptr(),
                              ws.data_ptr(), size.value, stream)
        )

    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="M = N = K = 2048 (a smoke test)")
    ap.add_argument("--per-row", default="4,8,16,32,64")
    args = ap.parse_args()

    import sparsek
    from sparsek.layout import Layout

    dev = torch.device("cuda")
    size = 2048 if args.quick else 8192
    m = n = k = size
    block = 128
    impls = ["sparsek", "sparsek_call", "cusparse", "triton", "cublas"]
    rows = []
    for per_row in [int(x) for x in args.per_row.split(",")]:
        per_row = min(per_row, k // block)
        crow, col, vals, b = make_problem(m, n, k, block, per_row, seed=6000 + per_row, device=dev)
        nnz = col.numel()
        flop = 2.0 * nnz * block * block * n
        a_bsr = torch.sparse_bsr_tensor(crow, col, vals, size=(m, k))
        a_dense = a_bsr.to_dense()
        c_ref = torch.matmul(a_dense, b)
        ref_scale = c_ref.abs().max().item()
        layout = Layout.from_bsr(crow.cpu().numpy(), col.cpu().numpy(), m, k, block=block)
        for impl in impls:
            rec = dict(per_row=per_row, col_blocks=k // block, density=per_row / (k // block), m=m, n=n, k=k,
                       block=block, dtype="float16", impl=impl)
            try:
                # NaN first, so a call that writes nothing cannot match cuBLAS.
                c = torch.full((m, n), float("nan"), dtype=torch.float16, device=dev)
                if impl == "sparsek":
                    fn = sparsek_runner(crow, col, vals, b, c, m, n, k, block)
                elif impl == "sparsek_call":
                    def fn(c=c):
                        sparsek.bsr_gemm(vals, b, layout, c=c)
                elif impl == "cusparse":
                    def fn(c=c):
                        c.copy_(a_bsr @ b)
                elif impl == "triton":
                    from torch.sparse._triton_ops import bsr_dense_mm

                    def fn(c=c):
                        bsr_dense_mm(a_bsr, b, out=c)
                else:
                    def fn(c=c):
                        torch.matmul(a_dense, b, out=c)
                fn()
                torch.cuda.synchronize()
                err = (c.float() - c_ref.float()).abs().max().item() / max(ref_scale, 1e-30)
                med, best = time_call(fn, args.reps)
                rec.update(median_ms=round(med, 4), min_ms=round(best, 4), tflops=round(flop / (med * 1e9), 1),
                           tflops_best=round(flop / (best * 1e9), 1), max_rel_diff_vs_cublas=err)
            except Exception as e:  # a peer that does not run is recorded, not fatal
                rec.update(error=f"{type(e).__name__}: {e}"[:300])
            rows.append(rec)
            print(json.dumps(rec), flush=True)
        del a_dense, a_bsr, c_ref
        torch.cuda.empty_cache()

    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                commit=args.commit, date=datetime.date.today().isoformat(),
                smi=subprocess.run(["nvidia-smi", "--query-gpu=name,power.limit,clocks.max.sm,driver_version",
                                    "--format=csv,noheader"], capture_output=True, text=True).stdout.strip())
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, cases=rows), f, indent=1)
    by = {}
    for r in rows:
        by.setdefault(r["per_row"], {})[r["impl"]] = r.get("tflops")
    print("per_row " + " ".join(f"{i:>12s}" for i in impls))
    for p, d in by.items():
        print(f"{p:7d} " + " ".join(f"{(d.get(i) or 0):12.1f}" for i in impls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
