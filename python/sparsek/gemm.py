"""sparsek.bsr_gemm and BsrGemmPlan: C = alpha * A * B + beta * C with A
block-sparse (sk_bsr_gemm_*), over numpy arrays (CPU backend) and torch
tensors (CUDA tensors: CUDA backend on torch's current stream).

bsr_gemm takes its plan from the plan cache (plan_cache.py): the
descriptor, A's layout on the device, the workspace and sk_bsr_gemm_plan
are made once per (layout, problem, stream), and a call then only checks
its arrays and enqueues sk_bsr_gemm_run. Every argument is checked here
before the library is called (ValueError / TypeError); what the library
finds itself raises SparseKError.
"""

from __future__ import annotations

from ctypes import byref, c_size_t, sizeof

import numpy as np

from ._arrays import Arr, adapt, check_family, check_output, check_packed
from ._cvalues import float32
from ._lib import Backend, DType, F, Order, SkBsrGemmDesc, check
from .attention import _parse_backend
from .layout import Layout
from .layout_arrays import of_layout
from .plan_cache import cached_plan


def _matrix(a: Arr, name: str):
    """(order, leading dimension) of a 2-D matrix with one contiguous axis."""
    if len(a.shape) != 2:
        raise ValueError(f"{name} must be 2-D, got shape {a.shape}")
    r, c = a.shape
    s0, s1 = a.strides
    if (s1 == 1 or c == 1) and s0 >= c:
        return Order.ROW_MAJOR, s0 if r > 1 else c
    if (s0 == 1 or r == 1) and s1 >= r:
        return Order.COL_MAJOR, s1 if c > 1 else r
    raise ValueError(f"{name} (shape {a.shape}, element strides {a.strides}) must be row- or column-major with one contiguous axis")


_C_DTYPES_NUMPY = {"float16": np.float16, "float32": np.float32}


class _Args:
    """bsr_gemm's arguments after the checks: the adapted arrays and every
    descriptor field."""

    def __init__(self, a_values, b, layout, c, alpha, beta, c_dtype, backend):
        if not isinstance(layout, Layout):
            raise TypeError(f"layout must be a sparsek.Layout, got {type(layout).__name__}")
        aa, ab = adapt(a_values, "a_values"), adapt(b, "b")
        check_family((aa, ab))
        if aa.dtype != ab.dtype:
            raise TypeError(f"a_values ({aa.dtype_name}) and b ({ab.dtype_name}) must have the same dtype")
        if aa.device != ab.device:
            raise ValueError(f"a_values is on {aa.device} but b is on {ab.device}")
        self.backend = _parse_backend(backend, aa.device)
        if layout.batch != 1 or layout.heads != 1:
            raise ValueError(f"a layout for bsr_gemm must have batch = heads = 1 (got {layout.batch}, {layout.heads})")
        m, k = layout.rows, layout.cols
        want = (layout.nnz, layout.block_rows, layout.block_cols)
        if aa.shape != want:
            raise ValueError(f"a_values has shape {aa.shape}; this layout needs [nnz, block_rows, block_cols] = {want}")
        check_packed(aa, "a_values", "[nnz, block_rows, block_cols]")
        self.b_order, self.ldb = _matrix(ab, "b")
        if ab.shape[0] != k:
            raise ValueError(f"b has {ab.shape[0]} rows; A has k = {k} columns")
        n = ab.shape[1]
        if c is None:
            if aa.kind == "numpy":
                name = c_dtype or "float32"
                if name not in _C_DTYPES_NUMPY:
                    raise TypeError(f"c_dtype = {c_dtype!r} is not supported for numpy (float16, float32)")
                c = np.zeros((m, n), dtype=_C_DTYPES_NUMPY[name])
            else:
                import torch

                c = torch.zeros((m, n), dtype=c_dtype or torch.float32, device=b.device)
        ac = adapt(c, "c")
        check_family((aa, ac))
        if ac.device != aa.device:
            raise ValueError(f"c is on {ac.device} but a_values is on {aa.device}")
        if ac.shape != (m, n):
            raise ValueError(f"c has shape {ac.shape}; it must be [m, n] = {(m, n)}")
        c_order, self.ldc = _matrix(ac, "c")
        if c_order != Order.ROW_MAJOR:
            # Also a single row with a non-unit stride: the library writes it packed.
            raise ValueError(f"c (shape {ac.shape}, element strides {ac.strides}) must be row-major")
        check_output(ac, "c")
        if self.backend != Backend.CPU and aa.dtype == DType.F32:
            raise TypeError("float32 A and B are for the CPU backend only")
        self.alpha, self.beta = float32(alpha, "alpha"), float32(beta, "beta")
        self.aa, self.ab, self.ac, self.c = aa, ab, ac, c
        self.m, self.n, self.k = m, n, k

    def key(self) -> tuple:
        """What a plan depends on besides the layout and the stream."""
        return ("gemm", self.aa.kind, self.aa.device, self.aa.dtype, self.ac.dtype, self.m, self.n, self.k,
                self.b_order, self.ldb, self.ldc, self.alpha, self.beta, int(self.backend))


class BsrGemmPlan:
    """A planned BSR GEMM: descriptor, A's layout on the data's device,
    workspace and sk_bsr_gemm_plan, made once; run() then only checks its
    arrays against the plan and calls sk_bsr_gemm_run. Made by bsr_gemm
    through the plan cache; layout may be a Layout or a borrowed view
    (layout_arrays.BorrowedLayout)."""

    def __init__(self, args: _Args, layout, torch_device=None):
        desc = SkBsrGemmDesc()
        check(F.sk_bsr_gemm_desc_init(byref(desc), sizeof(desc)))
        desc.backend = int(args.backend)
        desc.ab_dtype = int(args.aa.dtype)
        desc.c_dtype = int(args.ac.dtype)
        desc.m, desc.n, desc.k = args.m, args.n, args.k
        desc.b_order = int(args.b_order)
        desc.ldb = args.ldb
        desc.ldc = args.ldc
        desc.alpha = args.alpha
        desc.beta = args.beta
        self.desc = desc
        self.key = args.key()
        self.nnz = layout.nnz
        self._torch_device = torch_device
        if torch_device is None:
            self.bsr = layout.view()
            self.workspace, self.workspace_size = None, 0
            return
        import torch

        with torch.cuda.device(torch_device):
            self.bsr = layout.device_view(torch_device)
            size = c_size_t()
            check(F.sk_bsr_gemm_workspace_size(byref(desc), byref(self.bsr), byref(size)))
            self.workspace_size = size.value
            self.workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device=torch_device)
        self.replan()

    def replan(self) -> None:
        """Enqueue sk_bsr_gemm_plan (on torch's current stream); nothing to
        do on the CPU backend."""
        if self._torch_device is None:
            return
        import torch

        with torch.cuda.device(self._torch_device):
            stream = torch.cuda.current_stream(self._torch_device).cuda_stream
            check(F.sk_bsr_gemm_plan(byref(self.desc), byref(self.bsr), self.workspace.data_ptr(),
                                     self.workspace_size, stream))

    def run(self, args: _Args):
        """Enqueue sk_bsr_gemm_run for arguments with this plan's key;
        returns C."""
        if args.key() != self.key:
            raise ValueError("these bsr_gemm arguments do not match the plan")
        a_ptr = args.aa.ptr if self.nnz else None
        if self._torch_device is None:
            check(F.sk_bsr_gemm_run(byref(self.desc), byref(self.bsr), a_ptr, args.ab.ptr, args.ac.ptr, None, 0, None))
            return args.c
        import torch

        with torch.cuda.device(self._torch_device):
            stream = torch.cuda.current_stream(self._torch_device).cuda_stream
            check(F.sk_bsr_gemm_run(byref(self.desc), byref(self.bsr), a_ptr, args.ab.ptr, args.ac.ptr,
                                    self.workspace.data_ptr(), self.workspace_size, stream))
        return args.c


def bsr_gemm(a_values, b, layout, *, c=None, alpha=1.0, beta=0.0, c_dtype=None, backend=None):
    """C = alpha * A * B + beta * C with A block-sparse (sk_bsr_gemm).

    layout: A's layout (rows = m, cols = k, batch = heads = 1).
    a_values: [nnz, block_rows, block_cols] contiguous, in col_indices order.
    b: [k, n], row- or column-major. c: [m, n] row-major (leading dimension
    from its strides), read when beta != 0; allocated (c_dtype, default
    float32) when None; a caller's c must be writable (check_output).
    alpha, beta: floats that keep their value in float32.
    numpy arrays -> CPU backend; torch CUDA tensors -> CUDA backend on the
    current stream. The plan (and A's layout on the device) is cached per
    layout, problem and stream (plan_cache.py). Returns c.
    """
    args = _Args(a_values, b, layout, c, alpha, beta, c_dtype, backend)
    device = args.aa.device
    arrays = of_layout(layout, device)
    torch_device = None if args.backend == Backend.CPU else b.device
    plan = cached_plan(arrays, args.key(), device, lambda: BsrGemmPlan(args, arrays.borrow(), torch_device))
    return plan.run(args)


__all__ = ["bsr_gemm", "BsrGemmPlan"]
