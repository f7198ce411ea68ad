#!/usr/bin/env python3
"""Prepare the peers that the GPU machine lacks (flashinfer, FA4) for travel.

The GPU machine has torch, Triton and cuDNN but no flashinfer and no
flash-attn-4 (flash_attn.cute), and it cannot reach a package registry: such
packages travel as files in `carry` folders, at most 64 MiB a call in all.
FA4's CUTLASS DSL alone is a 92 MB wheel (one 193 MB shared library), so the
wheels are unpacked here and repacked as xz tarballs, in two stages:

  .carry/stage1/fa4_mlir.tar.xz   the CUTLASS DSL's 193 MB MLIR library alone (~50 MB)
  .carry/stage2/peers.tar.xz      everything else: flash-attn-4, the rest of
                                  nvidia-cutlass-dsl (cu13), quack-kernels,
                                  torch-c-dlpack-ext, flashinfer-python, apache-tvm-ffi

On the GPU machine each stage is unpacked into /tmp/site (kept while the
machine stays warm, 30 s after a call), and `bench/run.py --site /tmp/site`
makes them importable (a site directory: the CUTLASS DSL needs its .pth
file processed): stage 1 in one call, stage 2 and the benchmark in the next.
bench/README.md has the exact calls.

    python3 bench/prepare_peers.py            # download (pip) if needed, then pack
    python3 bench/prepare_peers.py --no-download

Run it from the repository root; `.whl/` and `.carry/` are git-ignored.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT = 64 * 2**20  # bytes a call may carry, working tree included

# name==version for the GPU machine's Python 3.12, x86-64. Packages the
# machine already has (torch, einops, numpy, requests, tqdm, nvidia-ml-py,
# cuda-bindings, protobuf, typing-extensions, ninja, ...) are not carried.
PACKAGES = [
    # FA4 (flash_attn.cute) and its CUTLASS DSL
    "flash-attn-4==4.0.0b36",
    "nvidia-cutlass-dsl==4.8.1",
    "nvidia-cutlass-dsl-libs-base==4.8.1",
    "nvidia-cutlass-dsl-libs-core==4.8.1",
    "nvidia-cutlass-dsl-libs-cu13==4.8.1",
    "quack-kernels==0.6.5",
    "torch-c-dlpack-ext==0.1.5",
    # flashinfer
    "flashinfer-python==0.7.2.post1",
    # both
    "apache-tvm-ffi==0.1.15.post2",
]

# Stage 1 holds the one file too big to travel with the rest (the CUTLASS
# DSL's MLIR library, 193 MB, ~50 MB as xz); stage 2 everything else.
STAGE1_GLOBS = ["nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.*.so"]
ARCHIVES = {"stage1": "fa4_mlir.tar.xz", "stage2": "peers.tar.xz"}

PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def wheel_file(whl_dir: Path, spec: str):
    name, version = spec.split("==")
    stem = name.replace("-", "_").lower()
    hits = [p for p in whl_dir.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version.lower()}-")]
    return hits[0] if hits else None


def download(whl_dir: Path, spec: str) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-d", str(whl_dir), spec]
    for p in PLATFORMS:
        cmd[4:4] = ["--platform", p]
    subprocess.run(cmd, check=True)
    path = wheel_file(whl_dir, spec)
    if path is None:
        raise SystemExit(f"pip download of {spec} left no wheel in {whl_dir}")
    return path


def unpack_wheel(whl: Path, site: Path) -> None:
    """What `pip install --target` does for these wheels: unzip, and move
    <name>.data/{purelib,platlib} contents to the top."""
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
    for data in site.glob("*.data"):
        for sub in ("purelib", "platlib"):
            src = data / sub
            if src.is_dir():
                for item in src.iterdir():
                    dest = site / item.name
                    if dest.exists():
                        shutil.copytree(item, dest, dirs_exist_ok=True) if item.is_dir() else shutil.copy2(item, dest)
                    else:
                        shutil.move(str(item), str(dest))
        shutil.rmtree(data)


def pack(site: Path, archive: Path) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive, "wb") as out:
        tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-9", "-T0"], stdin=tar.stdout, stdout=out, check=True)
        tar.wait()
        if tar.returncode:
            raise SystemExit("tar failed")


def tree_bytes() -> int:
    """Bytes of the working tree that travels (tracked + untracked, not ignored)."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
                         capture_output=True, check=True).stdout
    total = 0
    for name in out.split(b"\0"):
        p = REPO / name.decode()
        if name and p.is_file():
            total += p.stat().st_size
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--whl-dir", default=str(REPO / ".whl"))
    ap.add_argument("--carry-dir", default=str(REPO / ".carry"))
    ap.add_argument("--no-download", action="store_true")
    args = ap.parse_args(argv)
    whl_dir = Path(args.whl_dir)
    whl_dir.mkdir(parents=True, exist_ok=True)
    tree = tree_bytes()
    print(f"working tree that travels: {tree / 2**20:.1f} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        sites = {"stage1": Path(tmp) / "stage1", "stage2": Path(tmp) / "stage2"}
        for site in sites.values():
            site.mkdir()
        for spec in PACKAGES:
            whl = wheel_file(whl_dir, spec)
            if whl is None:
                if args.no_download:
                    raise SystemExit(f"{spec}: no wheel in {whl_dir}")
                whl = download(whl_dir, spec)
            print(f"  {whl.name} ({whl.stat().st_size / 2**20:.1f} MiB wheel)")
            unpack_wheel(whl, sites["stage2"])
        for pattern in STAGE1_GLOBS:
            for f in sites["stage2"].glob(pattern):
                rel = f.relative_to(sites["stage2"])
                (sites["stage1"] / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(f), str(sites["stage1"] / rel))
        for stage, site in sites.items():
            archive = Path(args.carry_dir) / stage / ARCHIVES[stage]
            archive.parent.mkdir(parents=True, exist_ok=True)
            for old in glob.glob(str(archive.parent / "*")):
                os.remove(old)
            pack(site, archive)
            size = archive.stat().st_size
            total = size + tree
            verdict = "fits" if total <= LIMIT else "DOES NOT FIT"
            print(f"{archive.relative_to(REPO)}: {size / 2**20:.1f} MiB; with the tree {total / 2**20:.1f} MiB "
                  f"of {LIMIT / 2**20:.0f} MiB: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
