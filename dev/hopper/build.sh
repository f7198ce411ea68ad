#!/bin/sh
# Builds the Hopper dev harness into build/dev_hopper/ (git-ignored), from the
# kernel source directly, so it works while the rest of the CUDA backend is
# still in flux. Run from the repository root.
#
# Variants: the library source compiled with other knob values (or an older
# copy from dev/hopper/versions), each wrapped in its own namespace so that
# one binary can check and time them side by side. Variant 0 is the library.
set -e
OUT=build/dev_hopper
mkdir -p $OUT/gen
NVFLAGS="-O3 -std=c++17 -Iinclude -Isrc -I. -gencode=arch=compute_90a,code=sm_90a -lineinfo"
nvcc $NVFLAGS --Werror all-warnings -Xptxas -v,--warn-on-spills -c src/cuda/attention/fwd_sm90.cu \
    -o $OUT/fwd_sm90.o 2> $OUT/ptxas.log || { cat $OUT/ptxas.log; exit 1; }
grep -i -E "warning|error|C75" $OUT/ptxas.log || true

# name | source | defines
VARIANTS="${SK90_VARIANTS:-lib|src/cuda/attention/fwd_sm90.cu|
step8|dev/hopper/versions/attention_sm90_step8.cu|}"
objs=""
list=""
i=0
echo "$VARIANTS" | while IFS='|' read name src defs; do
  f=$OUT/gen/variant_$name.cu
  cat > $f <<EOT
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "cuda/attention/kernels.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/ptx.cuh"
#define sk_attention_sm90_supports sk90_supports_impl
#define sk_attention_sm90_launch sk90_launch_impl
namespace sk90_$name {
#include "$src"
}
sk_status sk90_variant_launch_$name(const sk_attention_problem *p, const sk_attention_schedule *s,
                                    cudaStream_t stream) {
    return sk90_$name::sk90_launch_impl(p, s, stream);
}
EOT
  echo "  variant $name: $defs"
  nvcc $NVFLAGS $defs -Xptxas --warn-on-spills -c $f -o $OUT/gen/variant_$name.o 2> $OUT/gen/variant_$name.log || { cat $OUT/gen/variant_$name.log; exit 1; }
  grep -i -E "spill|C75" $OUT/gen/variant_$name.log | grep -v " 0 bytes spill" || true
done
# the variant table for the harness
{
  echo "$VARIANTS" | while IFS='|' read name src defs; do
    echo "sk_status sk90_variant_launch_$name(const sk_attention_problem *, const sk_attention_schedule *, cudaStream_t);"
  done
  echo "static const Variant kVariants[] = {"
  echo "$VARIANTS" | while IFS='|' read name src defs; do
    echo "    {\"$name\", sk90_variant_launch_$name},"
  done
  echo "};"
} > $OUT/gen/variants.inc
gcc -O2 -std=c99 -Iinclude -Isrc -c src/core/error.c -o $OUT/error.o
nvcc $NVFLAGS -DSK_VARIANTS_INC="\"$OUT/gen/variants.inc\"" -o $OUT/harness dev/hopper/harness.cu \
    $OUT/gen/variant_*.o $OUT/fwd_sm90.o $OUT/error.o
echo built $OUT/harness
