"""numpy arrays and torch tensors as the library sees them, and the checks
every entry point makes on them before any C call.

- adapt(): a numpy array, or a strided torch tensor on the CPU or a CUDA
  device, of a supported dtype -> Arr (pointer, shape, element strides,
  dtype, device). Pointer alignment is the library's check.
- packed(): any array-like as a packed, aligned numpy array of a dtype,
  for the arrays the binding converts itself (scores, masks, flex lists):
  a misaligned numpy array is copied, never handed on as it is.
- check_output(): an array the library will write. Refused (ValueError,
  naming it): a numpy array with writeable=False (a read-only memmap
  among them); a torch CPU tensor whose memory is not mapped writable
  (torch.from_numpy of a read-only memmap: writing would crash; torch
  itself has no read-only flag, so an ordinary array made read-only with
  writeable=False and then shared with torch.from_numpy cannot be told
  apart, and torch already warned when the tensor was made). Inference
  tensors are plain memory and are accepted. An output whose elements
  overlap each other (expand(), broadcast_to()) or an input is refused by
  the library's own checks (SparseKError), which see the pointers and
  strides it is given, host or device.
- check_packed(): the strides of a packed array, on every axis longer than
  1, for the arrays the C API takes without strides (whatever their size).
- outer_strides(): the three outer strides of a [B, S, H, D] array.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._lib import DType


class Arr(NamedTuple):
    """What the checks and the library need from one array."""

    kind: str  # "numpy" or "torch"
    ptr: int
    shape: tuple
    strides: tuple  # in elements
    dtype: DType
    dtype_name: str
    device: str  # "cpu" or "cuda:N"
    itemsize: int
    obj: object


_NUMPY_DTYPES = {np.dtype(np.float16): DType.F16, np.dtype(np.float32): DType.F32}


def is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _numpy_dtype(dt: np.dtype):
    if dt in _NUMPY_DTYPES:
        return _NUMPY_DTYPES[dt]
    if dt.name == "bfloat16":  # ml_dtypes.bfloat16, when installed
        return DType.BF16
    return None


def _torch_dtype(dt):
    import torch

    return {torch.float16: DType.F16, torch.bfloat16: DType.BF16, torch.float32: DType.F32}.get(dt)


def adapt(x, name: str) -> Arr:
    if isinstance(x, np.ndarray):
        dt = _numpy_dtype(x.dtype)
        if dt is None:
            raise TypeError(f"{name}.dtype = {x.dtype} is not supported (float16, float32, or ml_dtypes bfloat16)")
        isz = x.dtype.itemsize
        for s in x.strides:
            if s % isz:
                raise ValueError(f"{name} has byte strides {x.strides} that are not multiples of its {isz}-byte elements")
        return Arr(
            "numpy", x.ctypes.data, tuple(x.shape), tuple(s // isz for s in x.strides), dt, str(x.dtype), "cpu", isz, x
        )
    if is_torch(x):
        import torch

        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")
        if x.layout != torch.strided:
            raise TypeError(f"{name} has layout {x.layout}; only dense (strided) tensors are supported")
        dt = _torch_dtype(x.dtype)
        if dt is None:
            raise TypeError(f"{name}.dtype = {x.dtype} is not supported (float16, bfloat16, float32 on the CPU)")
        dev = x.device
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is on {dev}; only CPU and CUDA tensors are supported")
        device = "cpu" if dev.type == "cpu" else f"cuda:{dev.index if dev.index is not None else 0}"
        name_dt = str(x.dtype).replace("torch.", "")
        return Arr("torch", x.data_ptr(), tuple(x.shape), tuple(x.stride()), dt, name_dt, device, x.element_size(), x)
    raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def packed(a, dtype) -> np.ndarray:
    """a as a C-contiguous, aligned array of dtype: a itself when it is one
    (np.ascontiguousarray alone keeps a misaligned array as it is)."""
    return np.require(a, dtype=dtype, requirements=["C_CONTIGUOUS", "ALIGNED"])


def check_family(arrs) -> None:
    kinds = {a.kind for a in arrs}
    if len(kinds) > 1:
        raise TypeError("q, k, v (and out) must all be numpy arrays or all torch tensors")


def check_packed(a: Arr, name: str, what: str) -> None:
    """a's element strides are a packed array's on every axis longer than 1
    (an axis of one element is never stepped over, so its stride is free)."""
    expect = 1
    for n, s in zip(reversed(a.shape), reversed(a.strides)):
        if n > 1 and s != expect:
            raise ValueError(f"{name} must be contiguous {what} (its element strides are {a.strides})")
        expect *= n


def _span_bytes(a: Arr) -> int:
    if 0 in a.shape:
        return 0
    return (sum((n - 1) * abs(s) for n, s in zip(a.shape, a.strides)) + 1) * a.itemsize


def _host_writable(ptr: int, nbytes: int) -> bool:
    """[ptr, ptr + nbytes) lies in writable mappings of this process (Linux's
    /proc/self/maps, sorted by address); True where that cannot be read."""
    if nbytes == 0:
        return True
    try:
        maps = open("/proc/self/maps")
    except OSError:
        return True
    pos, end = ptr, ptr + nbytes
    with maps:
        for line in maps:
            lo_hi, perms = line.split(None, 2)[:2]
            lo, hi = (int(x, 16) for x in lo_hi.split("-"))
            if hi <= pos:
                continue
            if lo > pos or perms[1] != "w":
                return False
            pos = hi
            if pos >= end:
                return True
    return False


def check_output(a: Arr, name: str) -> None:
    """a may be written by the library (see the module text)."""
    if a.kind == "numpy":
        if not a.obj.flags.writeable:
            raise ValueError(f"{name} is read-only (writeable=False, e.g. a read-only memmap); give a writable array")
    elif a.device == "cpu" and not _host_writable(a.ptr, _span_bytes(a)):
        raise ValueError(
            f"{name}'s memory is not writable (e.g. torch.from_numpy of a read-only memmap); give a writable tensor"
        )


def outer_strides(a: Arr, name: str) -> tuple:
    """The three outer element strides for the library, after the checks
    that the library's conventions need from a 4-D [B, S, H, D] array."""
    b, s, h, d = a.shape
    if min(a.strides) < 0:
        raise ValueError(f"{name} has negative strides {a.strides}; make it contiguous first")
    if d > 1 and a.strides[3] != 1:
        raise ValueError(f"{name}'s last dimension (head_dim) must be contiguous; its strides are {a.strides}")
    st = list(a.strides[:3])
    # A size-1 dimension's stride is never used; give it the packed value so
    # alignment checks do not trip on arbitrary view strides.
    packed = (s * h * d, h * d, d)
    for i in range(3):
        if a.shape[i] == 1:
            st[i] = packed[i]
    if st == [0, 0, 0] and (b, s, h) != (1, 1, 1):
        # All-zero strides mean "packed" to the library.
        raise ValueError(f"{name} has all-zero outer strides (a broadcast view); materialise it first")
    return tuple(st)
