/*
 * device.c - device queries and build information, forwarded to the CUDA
 * backend (or its no-CUDA stand-in).
 */
#include <pthread.h>
#include <stdio.h>

#include "core/internal.h"
#include "cuda/backend.h"

sk_status sk_device_count(int32_t *count) {
    SK_ENTER("sk_device_count");
    SK_CHECK_NOT_NULL(count);
    return sk_cuda_device_count(count);
}

sk_status sk_device_get_info(int32_t device, sk_device_info *info) {
    SK_ENTER("sk_device_get_info");
    SK_CHECK_NOT_NULL(info);
    return sk_cuda_device_get_info(device, info);
}

static char build_text[256];
static pthread_once_t build_text_once = PTHREAD_ONCE_INIT;

static void make_build_text(void) {
#if defined(__clang__)
    snprintf(build_text, sizeof build_text, "SparseK %d.%d.%d, clang %s, %s", SK_VERSION_MAJOR,
             SK_VERSION_MINOR, SK_VERSION_PATCH, __clang_version__, sk_cuda_build_info());
#elif defined(__GNUC__)
    snprintf(build_text, sizeof build_text, "SparseK %d.%d.%d, gcc %d.%d, %s", SK_VERSION_MAJOR,
             SK_VERSION_MINOR, SK_VERSION_PATCH, __GNUC__, __GNUC_MINOR__, sk_cuda_build_info());
#else
    snprintf(build_text, sizeof build_text, "SparseK %d.%d.%d, %s", SK_VERSION_MAJOR,
             SK_VERSION_MINOR, SK_VERSION_PATCH, sk_cuda_build_info());
#endif
}

const char *sk_build_info(void) {
    pthread_once(&build_text_once, make_build_text);
    return build_text;
}
