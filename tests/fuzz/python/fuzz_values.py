"""fuzz_values.py - hostile argument values for fuzz_binding.py, drawn from
an atheris FuzzedDataProvider.

- hostile_int(): mostly small ints, else C type boundaries and one past
  them (int32, int64, uint64, 2**32 + 3, 2**64 + 128, negatives), else
  something that is not an int (bool, float, numpy scalar, string, None).
- hostile_float(): scales / alpha / beta: ordinary, signed, subnormal in
  float32, rounding to 0 or inf in float32, inf, NaN, and non-numbers.
- array(): a numpy array of a given logical shape and dtype, laid out in
  one of many ways: packed, Fortran order, a reversed axis, a strided
  slice, transposed memory, a stride-0 broadcast, read-only, misaligned,
  or deliberately wrong (dtype, shape, ndim, empty, not an array).

Arrays only ever have the small shapes the harness asks for: hostile
sizes go into integer arguments, never into an allocation here.
"""

from __future__ import annotations

import numpy as np

BOUNDARY_INTS = [
    0, 1, 2, 3, 63, 64, 65, 127, 128, 129,
    2**31 - 1, 2**31, 2**32, 2**32 + 3, 2**63 - 1, 2**63, 2**64, 2**64 + 128,
    -1, -2, -(2**31), -(2**31) - 1, -(2**63), -(2**63) - 1,
]
NOT_INTS = [True, False, 4.0, 2.5, float("nan"), "3", None, b"1", [1], np.float32(1.0), np.bool_(True)]
INT_LIKE = [np.int64(2), np.int32(-1), np.uint64(2**64 - 1), np.array(3), np.int8(64)]
FLOATS = [
    1.0, 0.5, -1.0, 0.125, 30.0, 1e-3, 1e-40, 1e-50, 1e39, 3.4e38, -1e39, 0.0, -0.0,
    float("inf"), float("-inf"), float("nan"), np.float32(0.25), np.float64(2.0), 7,
]
NOT_FLOATS = [True, "1.0", None, b"x", [1.0], 1j]


def hostile_int(fdp, lo: int = 0, hi: int = 8):
    """An integer argument: small in [lo, hi] most of the time."""
    r = fdp.ConsumeIntInRange(0, 31)
    if r < 20:
        return fdp.ConsumeIntInRange(lo, hi)
    if r < 27:
        return fdp.PickValueInList(BOUNDARY_INTS)
    if r < 29:
        return fdp.PickValueInList(INT_LIKE)
    return fdp.PickValueInList(NOT_INTS)


def hostile_float(fdp, default=1.0, allow_none=False):
    """A float argument (scale, alpha, beta)."""
    r = fdp.ConsumeIntInRange(0, 15)
    if r < 6:
        return default
    if r < 8 and allow_none:
        return None
    if r < 14:
        return fdp.PickValueInList(FLOATS)
    return fdp.PickValueInList(NOT_FLOATS)


DTYPES = [np.float32, np.float16]
WRONG_DTYPES = [np.float64, np.int32, np.uint8, np.dtype(">f4"), np.complex64, object]

# Layout kinds, in the order array() draws them; the first one is packed.
KINDS = [
    "packed", "fortran", "reversed", "sliced", "transposed", "broadcast",
    "readonly", "misaligned", "wrong_dtype", "wrong_shape", "wrong_ndim", "empty", "not_array",
]
VALID_KINDS = set(KINDS[:8])


def values(rng, shape, dtype, amp):
    return (rng.standard_normal(shape) * amp).astype(dtype)


def array(fdp, rng, shape, dtype, amp=1.0, weird=True):
    """(array, kind): an array of logical shape `shape` (or, for the wrong
    kinds, not quite). Without `weird`, packed or one of the valid layouts."""
    shape = tuple(shape)
    n = len(KINDS) if weird else len(VALID_KINDS)
    r = fdp.ConsumeIntInRange(0, 2 * n - 1)
    kind = KINDS[r - n] if r >= n else "packed"  # packed half the time
    a = values(rng, shape, dtype, amp)
    nd = len(shape)
    if kind == "fortran":
        a = np.asfortranarray(a)
    elif kind == "reversed" and nd:
        axis = fdp.ConsumeIntInRange(0, nd - 1)
        a = np.flip(np.flip(a, axis).copy(), axis)  # same values, a negative stride
    elif kind == "sliced" and nd:
        axis = fdp.ConsumeIntInRange(0, nd - 1)
        big = np.repeat(a, 2, axis=axis)
        a = big[tuple(slice(None, None, 2) if i == axis else slice(None) for i in range(nd))]
    elif kind == "transposed" and nd >= 2:
        i, j = fdp.ConsumeIntInRange(0, nd - 1), fdp.ConsumeIntInRange(0, nd - 1)
        a = np.swapaxes(np.swapaxes(a, i, j).copy(), i, j)
    elif kind == "broadcast" and nd:
        axis = fdp.ConsumeIntInRange(0, nd - 1)
        one = a[tuple(slice(0, 1) if i == axis else slice(None) for i in range(nd))]
        a = np.broadcast_to(one, shape)  # read-only, stride 0
    elif kind == "readonly":
        a.flags.writeable = False
    elif kind == "misaligned":
        raw = bytearray(a.nbytes + 1)
        m = np.frombuffer(raw, dtype=a.dtype, count=a.size, offset=1).reshape(shape)
        m[...] = a
        a = m
    elif kind == "wrong_dtype":
        dt = fdp.PickValueInList(WRONG_DTYPES + [np.float16 if dtype == np.float32 else np.float32])
        a = np.zeros(shape, dt) if dt is object else a.astype(dt)
    elif kind == "wrong_shape" and nd:
        axis = fdp.ConsumeIntInRange(0, nd - 1)
        grow = list(shape)
        grow[axis] = max(0, grow[axis] + fdp.PickValueInList([-1, 1, 64]))
        a = values(rng, tuple(grow), dtype, amp)
    elif kind == "wrong_ndim":
        a = a.reshape((1,) + shape) if fdp.ConsumeBool() or nd < 2 else a.reshape(shape[:-2] + (shape[-2] * shape[-1],))
    elif kind == "empty" and nd:
        a = np.zeros(shape[:-1] + (0,), dtype)
    elif kind == "not_array":
        a = fdp.PickValueInList([a.tolist(), None, 3, "q", memoryview(a.tobytes())])
    else:  # a layout this shape cannot have (0-d, one axis)
        kind = "packed"
    return a, kind
