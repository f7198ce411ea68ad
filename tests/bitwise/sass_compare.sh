#!/bin/bash
# sass_compare.sh BEFORE AFTER - proves that a structure-only change left the
# device code alone: the two libraries (or objects) must hold the same
# kernels, instruction for instruction, with the same resource usage.
#
#   tests/bitwise/sass_compare.sh /tmp/sk_before/build/libsparsek.a build/libsparsek.a
#
# For each input, `cuobjdump -sass` is split into functions (the
# "Function : <mangled name>" lines) per ELF architecture (sm_80, sm_90a);
# address columns (/*0000*/) and encoding comments (/* 0x... */) are dropped,
# since moving a kernel to another object may move it, not change it. Each
# function's instructions are hashed, and the multisets of
# (arch, name, hash) must be equal. The same is done with
# `cuobjdump -res-usage` (registers, stack, shared, local, constant bytes).
# Objects are not matched by file: kernels may move between files.
#
# Prints one line per architecture and a verdict; exit 0 when identical,
# 1 when anything differs (each differing function is named), 2 on a usage
# or tool error. cuobjdump (and the nvdisasm it runs) come from PATH, else
# from $CUDA_HOME/bin; CUOBJDUMP=... overrides. A toolkit without them (the
# CPU machine's nvcc-only install) gets both from PyPI:
#   pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm   (a venv; then put
#   its site-packages/nvidia/cu13/bin on PATH)
set -u
if [ $# -ne 2 ]; then
    echo "usage: $0 BEFORE.a|.o AFTER.a|.o" >&2
    exit 2
fi
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump ||
    echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")}
for f in "$1" "$2"; do
    [ -f "$f" ] || { echo "$0: no such file: $f" >&2; exit 2; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# One line per function: "<arch> <name>\t<md5 of its normalised SASS>".
sass_digests() {
    "$CUOBJDUMP" -sass "$1" > "$TMP/raw" 2> "$TMP/err" || { cat "$TMP/err" >&2; return 1; }
    grep -q "Function :" "$TMP/raw" || { echo "$0: no device code in $1" >&2; return 1; }
    awk '
        function flush() {
            if (name == "") return
            cmd = "md5sum | sed \"s/ .*//; s/^/" arch " " name "\t/\""
            printf "%s", body | cmd
            close(cmd)
            name = ""
            body = ""
        }
        /^arch = / { flush(); arch = $3; next }
        /Function : / { flush(); name = $3; next }
        /^member |^Fatbin |^=+$|^code version|^host = |^compile_size|^identifier/ { flush(); next }
        name != "" {
            line = $0
            gsub(/\/\*[0-9a-f]+\*\//, "", line)        # address column
            gsub(/\/\* 0x[0-9a-f]+ \*\//, "", line)    # encoding
            gsub(/[ \t]+/, " ", line)
            sub(/^ /, "", line)
            sub(/ $/, "", line)
            if (line != "") body = body line "\n"
        }
        END { flush() }
    ' "$TMP/raw" | sort
}

# One line per function: "<arch> <name>\t<its resource usage>".
usage_lines() {
    "$CUOBJDUMP" -res-usage "$1" 2> "$TMP/err" | awk '
        /^arch = / { arch = $3; next }
        /^ *Function / { name = $2; sub(/:$/, "", name); next }
        name != "" && /REG:/ { $1 = $1; print arch " " name "\t" $0; name = "" }
    ' | sort
}

# compare KIND BEFORE_LINES AFTER_LINES: names missing, added or changed.
compare() {
    local kind=$1 before=$2 after=$3 bad=0
    cut -f1 "$before" | sort -u > "$TMP/names_before"
    cut -f1 "$after" | sort -u > "$TMP/names_after"
    comm -23 "$TMP/names_before" "$TMP/names_after" | sed "s/^/  $kind only before: /"
    comm -13 "$TMP/names_before" "$TMP/names_after" | sed "s/^/  $kind only after:  /"
    comm -3 "$before" "$after" | sed 's/^\t//' | cut -f1 | sort -u |
        comm -12 - "$TMP/names_before" | comm -12 - "$TMP/names_after" |
        sed "s/^/  $kind differs:     /" > "$TMP/changed"
    cat "$TMP/changed"
    if ! cmp -s "$before" "$after"; then bad=1; fi
    return $bad
}

sass_digests "$1" > "$TMP/sass_before" || exit 2
sass_digests "$2" > "$TMP/sass_after" || exit 2
usage_lines "$1" > "$TMP/use_before"
usage_lines "$2" > "$TMP/use_after"

status=0
for arch in $(cut -d' ' -f1 "$TMP/sass_before" "$TMP/sass_after" | sort -u); do
    nb=$(grep -c "^$arch " "$TMP/sass_before")
    na=$(grep -c "^$arch " "$TMP/sass_after")
    same=$(comm -12 <(grep "^$arch " "$TMP/sass_before") <(grep "^$arch " "$TMP/sass_after") |
        wc -l)
    echo "$arch: $nb functions before, $na after, $same identical instruction for instruction"
done
compare SASS "$TMP/sass_before" "$TMP/sass_after" || status=1
compare usage "$TMP/use_before" "$TMP/use_after" || status=1
if [ $status -eq 0 ]; then
    echo "identical: same kernels, same SASS, same registers / shared / local / stack"
else
    echo "DIFFERENT (see above)"
fi
exit $status
