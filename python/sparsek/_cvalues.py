"""Python numbers -> C values, checked before ctypes converts them.

ctypes truncates silently: 2**32 given for an int32_t arrives as 0, and
2**64 + 128 for an int64_t as 128; a float32 field takes 1e39 as inf and
1e-50 as 0. Every integer and float the binding hands the library goes
through one of the helpers here, which raise instead:

- int32, int64, uint64, size_t: an integer in the C type's range. The
  value must be an int (or an integer numpy scalar / 0-d array: anything
  with __index__). A bool is refused, as a count or size given as True is
  a mistake; a float is refused even when integral (4.0), as the binding
  never guesses how to round. TypeError for the type, ValueError (naming
  the argument and the range) for the range.
- float32: a real number whose float32 value keeps its meaning: a finite
  value that would become inf is refused, and with nonzero=True one that
  would become 0 (a scale of 0 means "the default" to the library).

CheckedStructure (the base of every mirrored struct in _lib) and
checked_function (every declared function) apply the same checks to each
field assignment and each integer argument, naming the C field or
argument: a last line of defence for values that did not pass a named
check first.
"""

from __future__ import annotations

import math
import operator
from ctypes import Array, Structure, c_float, c_int8, c_int16, c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint32, c_uint64, sizeof

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1
SIZE_MAX = 2 ** (8 * sizeof(c_size_t)) - 1
FLOAT32_MAX = 3.4028234663852886e38


def as_int(value, name: str) -> int:
    """value as a Python int: an int or anything with __index__, not a bool."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got a bool ({value})")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def _ranged(value, name: str, ctype: str, lo: int, hi: int) -> int:
    v = as_int(value, name)
    if not lo <= v <= hi:
        raise ValueError(f"{name} = {v} is outside {ctype} [{lo}, {hi}]")
    return v


def int32(value, name: str) -> int:
    """value for an int32_t (or a C int / enum)."""
    return _ranged(value, name, "int32", INT32_MIN, INT32_MAX)


def int64(value, name: str) -> int:
    """value for an int64_t."""
    return _ranged(value, name, "int64", INT64_MIN, INT64_MAX)


def uint64(value, name: str) -> int:
    """value for a uint64_t."""
    return _ranged(value, name, "uint64", 0, UINT64_MAX)


def size_t(value, name: str) -> int:
    """value for a size_t."""
    return _ranged(value, name, "size_t", 0, SIZE_MAX)


def float32(value, name: str, *, nonzero: bool = False) -> float:
    """value for a C float: a real number (not a bool or a string) whose
    float32 rounding stays finite when it is finite, and (nonzero) stays
    non-zero when it is non-zero. inf and NaN given as such pass: their
    meaning is the library's to judge."""
    if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    v = float(value)
    rounded = c_float(v).value
    if math.isfinite(v) and not math.isfinite(rounded):
        raise ValueError(f"{name} = {v!r} is outside float32's range (|{name}| <= {FLOAT32_MAX!r})")
    if nonzero and v != 0.0 and rounded == 0.0:
        raise ValueError(f"{name} = {v!r} rounds to 0 in float32")
    return v


# ctypes integer type -> (its name, lo, hi). c_int is c_int32 and c_size_t
# is c_uint64 here (LP64), so each C type of the header has an entry.
_INT_TYPES = {
    c_int8: ("int8", -(2**7), 2**7 - 1),
    c_int16: ("int16", -(2**15), 2**15 - 1),
    c_int32: ("int32", INT32_MIN, INT32_MAX),
    c_int64: ("int64", INT64_MIN, INT64_MAX),
    c_uint8: ("uint8", 0, 2**8 - 1),
    c_uint16: ("uint16", 0, 2**16 - 1),
    c_uint32: ("uint32", 0, 2**32 - 1),
    c_uint64: ("uint64", 0, UINT64_MAX),
    c_size_t: ("size_t", 0, SIZE_MAX),
}


def check_c_value(ctype, value, name: str):
    """value checked for a field or argument of ctypes type ctype (integer,
    float, or an array of them); other types pass unchanged."""
    rng = _INT_TYPES.get(ctype)
    if rng is not None:
        return _ranged(value, name, *rng)
    if ctype is c_float:
        return float32(value, name)
    if isinstance(ctype, type) and issubclass(ctype, Array) and (ctype._type_ in _INT_TYPES or ctype._type_ is c_float):
        if isinstance(value, Array):
            return value
        items = list(value)
        if len(items) != ctype._length_:
            raise ValueError(f"{name} takes {ctype._length_} values, got {len(items)}")
        return tuple(check_c_value(ctype._type_, x, f"{name}[{i}]") for i, x in enumerate(items))
    return value


class CheckedStructure(Structure):
    """A ctypes Structure whose numeric fields are range-checked when set
    (the constructor's positional values included). Subclasses name their
    C struct in _c_name_."""

    _c_name_ = "struct"

    def __setattr__(self, name, value):
        ctype = _field_types(type(self)).get(name)
        if ctype is not None:
            value = check_c_value(ctype, value, f"{type(self)._c_name_}.{name}")
        super().__setattr__(name, value)


def _field_types(cls) -> dict:
    table = cls.__dict__.get("_sk_field_types")
    if table is None:
        table = dict(cls._fields_)
        cls._sk_field_types = table
    return table


def checked_function(name: str, fn, argtypes):
    """fn with each integer / float argument range-checked against its
    declared C type (a ctypes object passes as it is)."""
    checks = [(i, t) for i, t in enumerate(argtypes) if t in _INT_TYPES or t is c_float]
    if not checks:
        return fn

    def call(*args):
        args = list(args)
        for i, ctype in checks:
            if i < len(args) and not isinstance(args[i], ctype):
                args[i] = check_c_value(ctype, args[i], f"{name} argument {i + 1}")
        return fn(*args)

    call.__name__ = name
    call.__wrapped__ = fn
    return call
