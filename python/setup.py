"""Build hook of the sparsek package: put libsparsek.so inside the package.

`pip install ./python` (from a source checkout) runs `make -C <repo> -j<cpus>
lib` and copies <repo>/build/libsparsek.so into the installed package, where
sparsek finds it (python/sparsek/_lib.py). make's output comes through as it
runs, with a line every 15 s while a CUDA compile is quiet; pip shows it
with -v (without, each line turns its spinner). Environment:
  SPARSEK_LIBRARY=/path/libsparsek.so   use that library, build nothing
  SPARSEK_MAKE_ARGS="NVCC= -j8"         extra make arguments (NVCC= : no CUDA)
  SPARSEK_BUILD_DIR=/tmp/skbuild        make's build directory (default <repo>/build)
  SPARSEK_NO_BUILD=1                    copy the built library as it is
Editable installs (pip install -e ./python) copy nothing: the package then
finds <repo>/build/libsparsek.so itself (run `make lib` first).
"""

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def find_library() -> Path:
    env = os.environ.get("SPARSEK_LIBRARY")
    if env:
        path = Path(env)
        if not path.is_file():
            raise SystemExit(f"SPARSEK_LIBRARY={env} does not exist")
        return path
    if not (REPO / "Makefile").is_file() or not (REPO / "include" / "sparsek.h").is_file():
        raise SystemExit(
            "sparsek: no SparseK source tree above python/ and no SPARSEK_LIBRARY: "
            "build the library first and set SPARSEK_LIBRARY=/path/to/libsparsek.so"
        )
    build_dir = Path(os.environ.get("SPARSEK_BUILD_DIR", REPO / "build")).resolve()
    if not os.environ.get("SPARSEK_NO_BUILD"):
        # Later make arguments win, so SPARSEK_MAKE_ARGS may set its own -j.
        cmd = ["make", "-C", str(REPO), f"-j{os.cpu_count() or 1}", f"BUILD={build_dir}", "lib"]
        cmd += shlex.split(os.environ.get("SPARSEK_MAKE_ARGS", ""))
        run_make(cmd)
    path = build_dir / "libsparsek.so"
    if not path.is_file():
        raise SystemExit(f"sparsek: {path} was not built")
    return path


def run_make(cmd: list) -> None:
    """Run make, saying what it does before, during and after: a CUDA
    compile can print nothing for a minute, and a build that says nothing
    looks stalled (each line also turns pip's spinner)."""
    print("sparsek: building libsparsek.so: " + shlex.join(cmd), flush=True)
    print("sparsek: with nvcc, a first build takes a minute or more; make's output follows",
          flush=True)
    start = time.monotonic()
    with subprocess.Popen(cmd) as proc:
        while True:
            try:
                status = proc.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                print(f"sparsek: make still running ({time.monotonic() - start:.0f} s)", flush=True)
    if status != 0:
        raise SystemExit(f"sparsek: make failed (exit status {status}): {shlex.join(cmd)}")
    print(f"sparsek: make done in {time.monotonic() - start:.0f} s", flush=True)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        lib = find_library()
        dest = Path(self.build_lib) / "sparsek" / "libsparsek.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest)
        print(f"sparsek: packaged {lib} as {dest}", flush=True)


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
