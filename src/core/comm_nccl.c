/*
 * comm_nccl.c - the NCCL transport of sk_comm_t (sk_comm_create_nccl).
 *
 * Compiled with NCCL only when the build found nccl.h (the Makefile sets
 * SK_HAVE_NCCL); the library is not linked against NCCL: libnccl.so.2 (the
 * CUDA toolkit's, or the nvidia-nccl wheel's that torch loads) is opened
 * at sk_comm_create_nccl, so a build with NCCL support still loads on a
 * machine without it. Without SK_HAVE_NCCL, or when the library cannot be
 * opened, sk_comm_create_nccl answers SK_STATUS_NOT_SUPPORTED.
 *
 * Sends and receives are bytes (ncclUint8) between ncclGroupStart and
 * ncclGroupEnd, enqueued on the stream the run gives (the handle's side
 * stream, made here on the current device, which must be the comm's):
 * graph capture works as far as NCCL allows it.
 */
#include "core/comm.h"
#include "core/internal.h"
#include "cuda/backend.h"

#ifndef SK_HAVE_NCCL

sk_status sk_comm_create_nccl(void *nccl_comm, sk_comm_t *out) {
    SK_ENTER("sk_comm_create_nccl");
    SK_CHECK_NOT_NULL(nccl_comm);
    SK_CHECK_NOT_NULL(out);
    return sk_error(SK_STATUS_NOT_SUPPORTED,
                    "this library was built without NCCL (no nccl.h under /usr/include, the "
                    "CUDA toolkit or a pip nvidia-nccl wheel at build time)");
}

#else

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

typedef ncclResult_t (*nccl_send_fn)(const void *, size_t, ncclDataType_t, int, ncclComm_t,
                                     cudaStream_t);
typedef ncclResult_t (*nccl_recv_fn)(void *, size_t, ncclDataType_t, int, ncclComm_t,
                                     cudaStream_t);
typedef ncclResult_t (*nccl_group_fn)(void);
typedef ncclResult_t (*nccl_query_fn)(const ncclComm_t, int *);
typedef const char *(*nccl_error_fn)(ncclResult_t);

/* The entry points, resolved once per handle (dlopen counts references). */
typedef struct nccl_api {
    void *lib;
    nccl_send_fn send;
    nccl_recv_fn recv;
    nccl_group_fn group_start, group_end;
    nccl_query_fn count, user_rank;
    nccl_error_fn error_string;
    ncclComm_t comm;
} nccl_api;

static sk_status nccl_check(const nccl_api *a, ncclResult_t r, const char *call) {
    if (r == ncclSuccess) return SK_STATUS_SUCCESS;
    return sk_error(SK_STATUS_EXECUTION_FAILED, "%s failed: %s (ncclResult_t %d)", call,
                    a->error_string ? a->error_string(r) : "?", (int)r);
}

static sk_status nccl_group_start(sk_comm_t c) {
    const nccl_api *a = c->impl;
    return nccl_check(a, a->group_start(), "ncclGroupStart");
}
static sk_status nccl_send(sk_comm_t c, const void *buf, size_t bytes, int32_t peer,
                           struct CUstream_st *stream) {
    const nccl_api *a = c->impl;
    SK_TRY(nccl_check(a, a->send(buf, bytes, ncclUint8, peer, a->comm, stream), "ncclSend"));
    c->bytes_sent += (int64_t)bytes;
    return SK_STATUS_SUCCESS;
}
static sk_status nccl_recv(sk_comm_t c, void *buf, size_t bytes, int32_t peer,
                           struct CUstream_st *stream) {
    const nccl_api *a = c->impl;
    return nccl_check(a, a->recv(buf, bytes, ncclUint8, peer, a->comm, stream), "ncclRecv");
}
static sk_status nccl_group_end(sk_comm_t c, struct CUstream_st *stream) {
    (void)stream;
    const nccl_api *a = c->impl;
    return nccl_check(a, a->group_end(), "ncclGroupEnd");
}
static void nccl_destroy(sk_comm_t c) {
    nccl_api *a = c->impl;
    dlclose(a->lib);
    free(a);
}

static const sk_comm_ops nccl_ops = {"nccl",    1,         nccl_group_start, nccl_send,
                                     nccl_recv, nccl_group_end, nccl_destroy};

/* dlsym into a function pointer without the object-to-function cast ISO C
 * does not define (POSIX guarantees the representation). */
static int resolve(void *lib, const char *name, void *fn, size_t fn_size) {
    void *sym = dlsym(lib, name);
    if (sym == NULL) return 0;
    memcpy(fn, &sym, fn_size);
    return 1;
}

sk_status sk_comm_create_nccl(void *nccl_comm, sk_comm_t *out) {
    SK_ENTER("sk_comm_create_nccl");
    SK_CHECK_NOT_NULL(nccl_comm);
    SK_CHECK_NOT_NULL(out);
    nccl_api *a = calloc(1, sizeof *a);
    if (a == NULL) return sk_error(SK_STATUS_ALLOC_FAILED, "the NCCL communicator record");
    a->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (a->lib == NULL) {
        free(a);
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "libnccl.so.2 could not be opened (install NCCL or the nvidia-nccl "
                        "wheel, or put it on LD_LIBRARY_PATH)");
    }
    const int ok = resolve(a->lib, "ncclSend", &a->send, sizeof a->send) &&
                   resolve(a->lib, "ncclRecv", &a->recv, sizeof a->recv) &&
                   resolve(a->lib, "ncclGroupStart", &a->group_start, sizeof a->group_start) &&
                   resolve(a->lib, "ncclGroupEnd", &a->group_end, sizeof a->group_end) &&
                   resolve(a->lib, "ncclCommCount", &a->count, sizeof a->count) &&
                   resolve(a->lib, "ncclCommUserRank", &a->user_rank, sizeof a->user_rank) &&
                   resolve(a->lib, "ncclGetErrorString", &a->error_string,
                           sizeof a->error_string);
    if (!ok) {
        dlclose(a->lib);
        free(a);
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "libnccl.so.2 lacks ncclSend / ncclRecv (NCCL 2.7 or later needed)");
    }
    a->comm = (ncclComm_t)nccl_comm;
    int rank = 0, ranks = 0;
    sk_status st = nccl_check(a, a->count(a->comm, &ranks), "ncclCommCount");
    if (st == SK_STATUS_SUCCESS) st = nccl_check(a, a->user_rank(a->comm, &rank), "ncclCommUserRank");
    sk_comm_t c = st == SK_STATUS_SUCCESS ? sk_comm_alloc(&nccl_ops, rank, ranks, a) : NULL;
    if (c == NULL) {
        dlclose(a->lib);
        free(a);
        return st != SK_STATUS_SUCCESS
                   ? st
                   : sk_error(SK_STATUS_ALLOC_FAILED, "the NCCL communicator handle");
    }
    /* The side stream of the overlap, on the comm's device (current). */
    st = sk_cuda_cp_streams_create(&c->streams);
    if (st != SK_STATUS_SUCCESS) {
        sk_comm_destroy(c);
        return st;
    }
    *out = c;
    return SK_STATUS_SUCCESS;
}

#endif /* SK_HAVE_NCCL */
