"""The binding itself: loading, every symbol declared, struct layouts equal to
the C compiler's, errors, version and devices."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess

import pytest

import sparsek
from sparsek import _lib

from conftest import REPO

HEADER = os.path.join(REPO, "include", "sparsek.h")


def header_functions():
    text = open(HEADER).read()
    return set(re.findall(r"SK_API\s+[\w\s\*]*?\b(sk_\w+)\s*\(", text))


@pytest.mark.skipif(not os.path.exists(HEADER), reason="no source tree")
def test_every_header_function_is_declared():
    declared = set(_lib.SIGNATURES)
    assert header_functions() == declared


def test_every_declared_function_is_exported():
    assert _lib.MISSING == [], f"{_lib.LIBRARY_PATH} lacks {_lib.MISSING}"
    for name in _lib.SIGNATURES:
        fn = getattr(_lib.LIB, name)
        assert fn.argtypes is not None, name


def test_desc_init_accepts_our_struct_sizes():
    d = _lib.SkAttentionDesc()
    _lib.check(_lib.F.sk_attention_desc_init(ctypes.byref(d), ctypes.sizeof(d)))
    assert d.struct_size == ctypes.sizeof(d)
    assert d.backend == sparsek.Backend.CUDA and d.dtype == sparsek.DType.F16
    g = _lib.SkBsrGemmDesc()
    _lib.check(_lib.F.sk_bsr_gemm_desc_init(ctypes.byref(g), ctypes.sizeof(g)))
    assert g.struct_size == ctypes.sizeof(g)
    assert g.alpha == 1.0 and g.beta == 0.0 and g.c_dtype == sparsek.DType.F32
    assert g.b_order == sparsek.Order.ROW_MAJOR


def test_desc_init_rejects_a_wrong_size():
    d = _lib.SkAttentionDesc()
    with pytest.raises(sparsek.SparseKError) as e:
        # - 4: sizeof - 8 is the size before v_layout, which older callers pass
        _lib.check(_lib.F.sk_attention_desc_init(ctypes.byref(d), ctypes.sizeof(d) - 4))
    assert e.value.status_name == "SK_STATUS_BAD_PARAM_STRUCT_SIZE"
    assert e.value.status == sparsek.Status.BAD_PARAM_STRUCT_SIZE
    assert e.value.category == 1
    assert "struct_size" in e.value.message and "struct_size" in str(e.value)


def test_grid_struct_round_trips_through_the_library():
    # sk_grid_blocks reads every grid field: a misplaced field would show.
    g = sparsek.make_grid(1000, 300, block=(128, 64), batch=3, heads=5)
    assert sparsek.grid_blocks(g) == (8, 5, 15)


def _c_layouts():
    """sizeof and offsetof of every mirrored struct, from the C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or not os.path.exists(HEADER):
        pytest.skip("no C compiler or no header")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "sparsek.h"', "int main(void) {"]
    for cname, cls in _lib.STRUCTS.items():
        lines.append(f'printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for field, _ in cls._fields_:
            lines.append(f'printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    lines.append("return 0; }")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "abi.c")
        exe = os.path.join(tmp, "abi")
        open(src, "w").write("\n".join(lines))
        subprocess.run([cc, "-std=c99", "-I", os.path.dirname(HEADER), src, "-o", exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    table = {}
    for line in out.splitlines():
        cname, field, value = line.split()
        table[(cname, field)] = int(value)
    return table


def test_struct_layouts_match_the_header():
    table = _c_layouts()
    for cname, cls in _lib.STRUCTS.items():
        assert ctypes.sizeof(cls) == table[(cname, "sizeof")], cname
        for field, _ in cls._fields_:
            assert getattr(cls, field).offset == table[(cname, field)], f"{cname}.{field}"


def test_status_names_match_the_enum():
    for s in sparsek.Status:
        assert sparsek.status_name(s) == f"SK_STATUS_{s.name}"
    assert sparsek.status_name(12345) == "SK_STATUS_UNKNOWN"
    for s in sparsek.Status:
        assert _lib.F.sk_status_get_category(int(s)) == int(s) // 1000


def test_error_carries_status_name_and_message():
    with pytest.raises(sparsek.SparseKError) as e:
        sparsek.grid_blocks(sparsek.make_grid(100, block=96))
    err = e.value
    assert err.status == 1008 and err.status_name == "SK_STATUS_BAD_PARAM_VALUE"
    assert "block_rows = 96" in err.message
    assert "SK_STATUS_BAD_PARAM_VALUE" in str(err) and err.message in str(err)
    # The text is cleared by the next successful call.
    sparsek.grid_blocks(sparsek.make_grid(100))
    assert _lib.F.sk_last_error() == b""


def test_version_build_info_devices():
    v = sparsek.version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", v)
    assert sparsek.version_int() == 100 * 100 * int(v.split(".")[0]) + 100 * int(v.split(".")[1]) + int(v.split(".")[2])
    assert v == sparsek.__version__
    assert "SparseK" in sparsek.build_info()
    devs = sparsek.devices()
    assert isinstance(devs, list)
    for d in devs:
        assert d.name and d.sm_count > 0 and d.memory_bytes > 0


def test_library_path_is_reported():
    assert os.path.exists(sparsek.LIBRARY_PATH)


def test_missing_library_is_a_clear_import_error(tmp_path):
    env = dict(os.environ, SPARSEK_LIBRARY=str(tmp_path / "nope.so"))
    env["PYTHONPATH"] = os.path.join(REPO, "python")
    import sys

    r = subprocess.run([sys.executable, "-c", "import sparsek"], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "cannot load libsparsek.so" in r.stderr and "nope.so" in r.stderr
