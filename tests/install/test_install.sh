#!/bin/sh
# The install as a C user meets it: `make install` into a fresh prefix, then
# use_sparsek.c (CPU attention checked against a naive one) built with
# nothing but what the prefix provides and run:
#   pkg-config --cflags --libs sparsek           libsparsek.so
#   pkg-config --static --cflags --libs sparsek  libsparsek.a
#   CMake find_package(sparsek)                  sparsek::sparsek, sparsek::sparsek_static
# plus the installed files, the versions (header, sparsek.pc, CMake, Python
# package), a DESTDIR install, the CLI, and libsparsek.so needing no CUDA
# library. pkg-config, cmake and readelf must be installed: a missing one is
# a failure that names it.
#
# Usage: sh tests/install/test_install.sh [make] [work dir]
#   (from the repository root; `make test-install` runs it.)
# Prints one line per check and a closing "N passed, M failed"; exits
# non-zero when any check failed.

MAKE_CMD=${1:-make}
WORK=${2:-build/test-install}
CC=${CC:-cc}
SRC=tests/install/use_sparsek.c
pass=0
fail=0

ok() {
    pass=$((pass + 1))
    echo "PASS $1"
}

bad() { # name, reason[, log file]
    fail=$((fail + 1))
    echo "FAIL $1: $2"
    [ -n "$3" ] && [ -f "$3" ] && sed 's/^/    /' "$3" | tail -20
}

finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    exit
}

# have tool hint: fails a check naming the tool when it is not on PATH.
have() {
    command -v "$1" >/dev/null 2>&1 && return 0
    bad "$1" "$1 is not installed, and this test needs it ($2)"
    return 1
}

# needed_libs binary: its DT_NEEDED entries, one a line.
needed_libs() {
    readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
}

# run_program name binary [env assignments...]: the program must exit 0 and
# print this install's version.
run_program() {
    name=$1
    bin=$2
    shift 2
    if ! env "$@" "$bin" >"$WORK/$name.out" 2>&1; then
        bad "$name" "$bin failed" "$WORK/$name.out"
    elif ! grep -q "^sparsek $version\$" "$WORK/$name.out"; then
        bad "$name" "it did not report version $version" "$WORK/$name.out"
    else
        ok "$name ($(tail -1 "$WORK/$name.out"))"
    fi
}

rm -rf "$WORK"
mkdir -p "$WORK" || exit 1
WORK=$(cd "$WORK" && pwd)
PREFIX=$WORK/prefix
LIBDIR=$PREFIX/lib
# MAJOR.MINOR.PATCH of SK_VERSION_* (defined in that order).
version=$(sed -n 's/^#define SK_VERSION_[A-Z]*  *\([0-9][0-9]*\)$/\1/p' include/sparsek.h \
    | paste -sd. -)

have_pkg_config=0
have_cmake=0
have pkg-config "apt-get install pkg-config" && have_pkg_config=1
have cmake "apt-get install cmake" && have_cmake=1
have readelf "binutils" || finish

# --- install ----------------------------------------------------------------
if ! $MAKE_CMD --no-print-directory install PREFIX="$PREFIX" >"$WORK/install.log" 2>&1; then
    bad install "make install PREFIX=$PREFIX failed" "$WORK/install.log"
    finish
fi
missing=""
for f in include/sparsek.h lib/libsparsek.so lib/libsparsek.a bin/sparsek \
    lib/pkgconfig/sparsek.pc lib/cmake/sparsek/sparsekConfig.cmake \
    lib/cmake/sparsek/sparsekConfigVersion.cmake; do
    [ -f "$PREFIX/$f" ] || missing="$missing $f"
done
if [ -n "$missing" ]; then
    bad install "missing under $PREFIX:$missing"
else
    ok "install: header, libsparsek.so and .a, CLI, sparsek.pc, CMake package"
fi

stage=$WORK/stage
if ! $MAKE_CMD --no-print-directory install PREFIX=/opt/sparsek DESTDIR="$stage" \
    >"$WORK/destdir.log" 2>&1; then
    bad destdir "make install DESTDIR=$stage failed" "$WORK/destdir.log"
elif ! grep -q '^prefix=/opt/sparsek$' "$stage/opt/sparsek/lib/pkgconfig/sparsek.pc" \
    || [ ! -f "$stage/opt/sparsek/lib/libsparsek.so" ]; then
    bad destdir "files not under DESTDIR, or sparsek.pc's prefix is not /opt/sparsek"
else
    ok "destdir: files under DESTDIR, sparsek.pc names the final prefix"
fi

if needed_libs "$LIBDIR/libsparsek.so" | grep -i cuda >"$WORK/needed.out"; then
    bad shared-deps "libsparsek.so needs a CUDA library (cudart should be static)" \
        "$WORK/needed.out"
else
    ok "shared-deps: libsparsek.so needs $(needed_libs "$LIBDIR/libsparsek.so" | paste -sd' ' -)"
fi

if "$PREFIX/bin/sparsek" info >"$WORK/cli.out" 2>&1 \
    && grep -q "^sparsek $version" "$WORK/cli.out"; then
    ok "cli: bin/sparsek info"
else
    bad cli "bin/sparsek info failed or did not print version $version" "$WORK/cli.out"
fi

py_version=$(sed -n 's/^version = "\(.*\)"/\1/p' python/pyproject.toml)
if [ "$py_version" != "$version" ]; then
    bad version "include/sparsek.h says $version, python/pyproject.toml $py_version"
else
    ok "version: $version in include/sparsek.h and python/pyproject.toml"
fi

# --- pkg-config -------------------------------------------------------------
# Each build adds -lm for the program itself (exp and log in its naive
# attention); everything else comes from pkg-config.
STRICT="-std=c99 -Wall -Wextra -Wpedantic -Werror"
if [ "$have_pkg_config" -eq 1 ]; then
    export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
    pc_version=$(pkg-config --modversion sparsek 2>"$WORK/pc.err")
    if [ "$pc_version" != "$version" ]; then
        bad pkg-config "pkg-config --modversion sparsek: '$pc_version', not $version" "$WORK/pc.err"
    else
        ok "pkg-config: sparsek $pc_version"
    fi

    cflags_libs=$(pkg-config --cflags --libs sparsek)
    bin=$WORK/use_sparsek_pc
    # shellcheck disable=SC2086 # the flags are words
    if ! $CC $STRICT -o "$bin" "$SRC" $cflags_libs -lm >"$WORK/pc_build.log" 2>&1; then
        bad pkg-config-shared "build failed: $CC ... $cflags_libs -lm" "$WORK/pc_build.log"
    elif ! needed_libs "$bin" | grep -qx libsparsek.so; then
        bad pkg-config-shared "the program does not load libsparsek.so"
    else
        run_program pkg-config-shared "$bin" \
            LD_LIBRARY_PATH="$(pkg-config --variable=libdir sparsek)"
    fi

    # -lsparsek would take the .so beside the .a: name the archive (GNU ld's -l:).
    static_flags=$(pkg-config --static --cflags --libs sparsek \
        | sed 's/-lsparsek\b/-l:libsparsek.a/')
    bin=$WORK/use_sparsek_pc_static
    # shellcheck disable=SC2086
    if ! $CC $STRICT -o "$bin" "$SRC" $static_flags -lm >"$WORK/pc_static_build.log" 2>&1; then
        bad pkg-config-static "build failed: $CC ... $static_flags -lm" "$WORK/pc_static_build.log"
    elif needed_libs "$bin" | grep -q libsparsek; then
        bad pkg-config-static "the program loads libsparsek.so instead of linking libsparsek.a"
    else
        run_program pkg-config-static "$bin" LD_LIBRARY_PATH=
    fi
fi

# --- CMake ------------------------------------------------------------------
if [ "$have_cmake" -eq 1 ]; then
    cm=$WORK/cmake
    if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL cmake -S tests/install -B "$cm" \
        -DCMAKE_PREFIX_PATH="$PREFIX" -DSPARSEK_VERSION="$version" -DCMAKE_C_COMPILER="$CC" \
        >"$WORK/cmake_configure.log" 2>&1; then
        bad cmake "find_package(sparsek $version EXACT) failed" "$WORK/cmake_configure.log"
    elif ! grep -qx "sparsek_DIR:PATH=$LIBDIR/cmake/sparsek" "$cm/CMakeCache.txt"; then
        bad cmake "find_package found another sparsek: $(grep sparsek_DIR "$cm/CMakeCache.txt")"
    elif ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL cmake --build "$cm" \
        >"$WORK/cmake_build.log" 2>&1; then
        bad cmake "build failed" "$WORK/cmake_build.log"
    else
        ok "cmake: find_package(sparsek $version EXACT), both targets built"
        if needed_libs "$cm/use_sparsek_cmake" | grep -qx libsparsek.so; then
            # CMake's build tree has an rpath to the imported library's directory.
            run_program cmake-shared "$cm/use_sparsek_cmake" LD_LIBRARY_PATH=
        else
            bad cmake-shared "sparsek::sparsek did not link libsparsek.so"
        fi
        if needed_libs "$cm/use_sparsek_cmake_static" | grep -q libsparsek; then
            bad cmake-static "sparsek::sparsek_static linked libsparsek.so"
        else
            run_program cmake-static "$cm/use_sparsek_cmake_static" LD_LIBRARY_PATH=
        fi
    fi
fi

finish
