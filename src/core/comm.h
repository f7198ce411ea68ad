/*
 * comm.h - the communicator behind sk_comm_t: a transport vtable of byte
 * sends and receives grouped as NCCL groups them, and its two
 * implementations (comm.c: the simulated in-process one; comm_nccl.c:
 * NCCL, when the build found nccl.h).
 *
 * A run posts, between group_start and group_end, one send and one receive
 * per peer it exchanges with; group_end returns when they are complete
 * (simulated) or enqueued on the stream (NCCL). Buffers are host memory
 * for the simulated transport, device memory for NCCL (ops->device_memory).
 */
#ifndef SK_CORE_COMM_H
#define SK_CORE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "sparsek.h"

typedef struct sk_comm_ops {
    const char *name;  /* "simulated", "nccl": for messages */
    int device_memory; /* != 0: buffers must be device memory */
    sk_status (*group_start)(sk_comm_t comm);
    sk_status (*send)(sk_comm_t comm, const void *buf, size_t bytes, int32_t peer,
                      struct CUstream_st *stream);
    sk_status (*recv)(sk_comm_t comm, void *buf, size_t bytes, int32_t peer,
                      struct CUstream_st *stream);
    sk_status (*group_end)(sk_comm_t comm, struct CUstream_st *stream);
    void (*destroy)(sk_comm_t comm); /* frees impl (not the handle) */
} sk_comm_ops;

struct sk_comm_s {
    const sk_comm_ops *ops;
    int32_t rank, ranks;
    int64_t bytes_sent; /* every send's bytes, added when posted */
    void *impl;
    void *streams; /* device communicators: sk_cuda_cp_streams_create's record */
};

/* A zeroed handle (NULL when out of memory). */
sk_comm_t sk_comm_alloc(const sk_comm_ops *ops, int32_t rank, int32_t ranks, void *impl);

#endif /* SK_CORE_COMM_H */
