/*
 * comm.c - communicator handles (sk_comm_destroy, sk_comm_info) and the
 * simulated in-process transport (sk_comm_create_simulated).
 *
 * The simulation is a rendezvous through shared memory: a send publishes
 * its buffer in the mailbox of its (src, dst) pair; the receiver's
 * group_end waits for each mailbox it receives from, copies the bytes out
 * and marks it consumed; the sender's group_end waits until all its
 * mailboxes are consumed and empties them. Every rank posts all its sends
 * before it waits, so R ranks on R threads cannot deadlock, and a sender
 * never returns while a receiver may still read its buffer. Nothing is
 * allocated per message. A wait gives up after SK_SIM_TIMEOUT_S seconds
 * (a peer that failed or was never run), withdrawing its own sends.
 *
 * The device flavour (sk_comm_create_simulated_cuda) moves device memory
 * the same way: a group's first send waits for the rank's stream (its
 * packed sends are complete) before it posts, a receiver copies on its
 * stream and waits for the copy before marking the mail consumed. It synchronises, so it is for
 * tests of the CUDA run on one GPU, not for graphs or speed.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/comm.h"
#include "core/internal.h"
#include "cuda/backend.h"

#define SK_SIM_TIMEOUT_S 60
#define SK_SIM_MAX_RANKS 4096

sk_comm_t sk_comm_alloc(const sk_comm_ops *ops, int32_t rank, int32_t ranks, void *impl) {
    sk_comm_t c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    c->ops = ops;
    c->rank = rank;
    c->ranks = ranks;
    c->impl = impl;
    return c;
}

void sk_comm_destroy(sk_comm_t comm) {
    if (comm == NULL) return;
    comm->ops->destroy(comm);
    sk_cuda_cp_streams_destroy(comm->streams);
    free(comm);
}

sk_status sk_comm_info(sk_comm_t comm, int32_t *rank, int32_t *ranks, int64_t *bytes_sent) {
    SK_ENTER("sk_comm_info");
    SK_CHECK_NOT_NULL(comm);
    if (rank != NULL) *rank = comm->rank;
    if (ranks != NULL) *ranks = comm->ranks;
    if (bytes_sent != NULL) *bytes_sent = comm->bytes_sent;
    return SK_STATUS_SUCCESS;
}

/* ---- the simulated transport ------------------------------------------ */

enum { MAIL_EMPTY, MAIL_POSTED, MAIL_CONSUMED };

typedef struct sim_mail {
    const void *buf;
    size_t bytes;
    int state;
} sim_mail;

typedef struct sim_shared {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int32_t ranks;
    int32_t refs;   /* handles alive */
    sim_mail *mail; /* [src * ranks + dst] */
} sim_shared;

/* One rank's handle: its posted receives of the current group. */
typedef struct sim_rank {
    sim_shared *shared;
    int stream_done;    /* device: the stream was synchronised in this group */
    void **recv_buf;    /* [ranks] */
    size_t *recv_bytes; /* [ranks] */
    uint8_t *recv_on;   /* [ranks] */
    uint8_t *send_on;   /* [ranks] */
} sim_rank;

static sk_status sim_group_start(sk_comm_t c) {
    sim_rank *s = c->impl;
    memset(s->recv_on, 0, (size_t)c->ranks);
    memset(s->send_on, 0, (size_t)c->ranks);
    s->stream_done = 0;
    return SK_STATUS_SUCCESS;
}

static sk_status sim_send(sk_comm_t c, const void *buf, size_t bytes, int32_t peer,
                          struct CUstream_st *stream) {
    sim_rank *s = c->impl;
    sim_shared *sh = s->shared;
    /* Device: what the stream wrote into the send buffers (the packing)
     * is complete before a peer may read them. */
    if (c->ops->device_memory && !s->stream_done) {
        SK_TRY(sk_cuda_stream_sync(stream));
        s->stream_done = 1;
    }
    pthread_mutex_lock(&sh->lock);
    sim_mail *m = &sh->mail[(int64_t)c->rank * c->ranks + peer];
    const int busy = m->state != MAIL_EMPTY;
    if (!busy) {
        m->buf = buf;
        m->bytes = bytes;
        m->state = MAIL_POSTED;
        pthread_cond_broadcast(&sh->changed);
    }
    pthread_mutex_unlock(&sh->lock);
    if (busy)
        return sk_error(SK_STATUS_INTERNAL_ERROR,
                        "simulated communicator: rank %d posted two sends to rank %d in one group",
                        (int)c->rank, (int)peer);
    s->send_on[peer] = 1;
    c->bytes_sent += (int64_t)bytes;
    return SK_STATUS_SUCCESS;
}

static sk_status sim_recv(sk_comm_t c, void *buf, size_t bytes, int32_t peer,
                          struct CUstream_st *stream) {
    (void)stream;
    sim_rank *s = c->impl;
    s->recv_buf[peer] = buf;
    s->recv_bytes[peer] = bytes;
    s->recv_on[peer] = 1;
    return SK_STATUS_SUCCESS;
}

/* Wait (lock held) until *state == want or the deadline; returns whether it is. */
static int sim_wait(sim_shared *sh, const int *state, int want, const struct timespec *deadline) {
    while (*state != want)
        if (pthread_cond_timedwait(&sh->changed, &sh->lock, deadline) == ETIMEDOUT)
            return *state == want;
    return 1;
}

static sk_status sim_group_end(sk_comm_t c, struct CUstream_st *stream) {
    sim_rank *s = c->impl;
    sim_shared *sh = s->shared;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += SK_SIM_TIMEOUT_S;
    const int device = c->ops->device_memory;
    sk_status st = SK_STATUS_SUCCESS;
    pthread_mutex_lock(&sh->lock);
    for (int32_t p = 0; p < c->ranks && st == SK_STATUS_SUCCESS; ++p) {
        if (!s->recv_on[p]) continue;
        sim_mail *m = &sh->mail[(int64_t)p * c->ranks + c->rank];
        if (!sim_wait(sh, &m->state, MAIL_POSTED, &deadline)) {
            st = sk_error(SK_STATUS_EXECUTION_FAILED,
                          "simulated communicator: rank %d waited %d s for rank %d's send (is "
                          "every rank's run called, each from its own thread?)",
                          (int)c->rank, SK_SIM_TIMEOUT_S, (int)p);
            break;
        }
        if (m->bytes != s->recv_bytes[p])
            st = sk_error(SK_STATUS_INTERNAL_ERROR,
                          "simulated communicator: rank %d sent %zu bytes, rank %d expects %zu",
                          (int)p, m->bytes, (int)c->rank, s->recv_bytes[p]);
        else if (m->bytes > 0 && !device)
            memcpy(s->recv_buf[p], m->buf, m->bytes);
        else if (m->bytes > 0) {
            st = sk_cuda_copy_async(s->recv_buf[p], m->buf, m->bytes, stream);
            if (st == SK_STATUS_SUCCESS) st = sk_cuda_stream_sync(stream);
        }
        m->state = MAIL_CONSUMED;
        pthread_cond_broadcast(&sh->changed);
    }
    for (int32_t p = 0; p < c->ranks; ++p) {
        if (!s->send_on[p]) continue;
        sim_mail *m = &sh->mail[(int64_t)c->rank * c->ranks + p];
        if (st == SK_STATUS_SUCCESS && !sim_wait(sh, &m->state, MAIL_CONSUMED, &deadline))
            st = sk_error(SK_STATUS_EXECUTION_FAILED,
                          "simulated communicator: rank %d waited %d s for rank %d to receive",
                          (int)c->rank, SK_SIM_TIMEOUT_S, (int)p);
        m->state = MAIL_EMPTY; /* consumed, or withdrawn on failure */
        m->buf = NULL;
    }
    pthread_mutex_unlock(&sh->lock);
    return st;
}

static void sim_rank_free(sim_rank *s) {
    free(s->recv_buf);
    free(s->recv_bytes);
    free(s->recv_on);
    free(s->send_on);
    free(s);
}

static void sim_shared_free(sim_shared *sh) {
    pthread_mutex_destroy(&sh->lock);
    pthread_cond_destroy(&sh->changed);
    free(sh->mail);
    free(sh);
}

static void sim_destroy(sk_comm_t c) {
    sim_rank *s = c->impl;
    sim_shared *sh = s->shared;
    pthread_mutex_lock(&sh->lock);
    const int last = --sh->refs == 0;
    pthread_mutex_unlock(&sh->lock);
    if (last) sim_shared_free(sh);
    sim_rank_free(s);
}

static const sk_comm_ops sim_ops = {"simulated",   0,          sim_group_start, sim_send, sim_recv,
                                    sim_group_end, sim_destroy};
static const sk_comm_ops sim_device_ops = {
    "simulated device", 1, sim_group_start, sim_send, sim_recv, sim_group_end, sim_destroy};

static sim_rank *sim_rank_alloc(sim_shared *sh, int32_t ranks) {
    sim_rank *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    s->shared = sh;
    s->recv_buf = calloc((size_t)ranks, sizeof(void *));
    s->recv_bytes = calloc((size_t)ranks, sizeof(size_t));
    s->recv_on = calloc((size_t)ranks, 1);
    s->send_on = calloc((size_t)ranks, 1);
    if (!s->recv_buf || !s->recv_bytes || !s->recv_on || !s->send_on) {
        sim_rank_free(s);
        return NULL;
    }
    return s;
}

/* R handles of one simulated communicator with these ops. */
static sk_status sim_create(int32_t ranks, sk_comm_t *comms, const sk_comm_ops *ops) {
    SK_CHECK_NOT_NULL(comms);
    if (ranks < 1 || ranks > SK_SIM_MAX_RANKS)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "ranks = %d must be in [1, %d]", (int)ranks,
                        SK_SIM_MAX_RANKS);
    sim_shared *sh = calloc(1, sizeof *sh);
    sk_comm_t *made = calloc((size_t)ranks, sizeof *made);
    if (sh != NULL) sh->mail = calloc((size_t)ranks * (size_t)ranks, sizeof(sim_mail));
    if (sh == NULL || made == NULL || sh->mail == NULL) {
        if (sh != NULL) free(sh->mail);
        free(sh);
        free(made);
        return sk_error(SK_STATUS_ALLOC_FAILED, "the simulated communicator of %d ranks",
                        (int)ranks);
    }
    pthread_mutex_init(&sh->lock, NULL);
    pthread_cond_init(&sh->changed, NULL);
    sh->ranks = ranks;
    int32_t r = 0;
    for (; r < ranks; ++r) {
        sim_rank *s = sim_rank_alloc(sh, ranks);
        made[r] = s != NULL ? sk_comm_alloc(ops, r, ranks, s) : NULL;
        if (made[r] == NULL) {
            if (s != NULL) sim_rank_free(s);
            break;
        }
        sh->refs++;
    }
    if (r < ranks) { /* the last handle destroyed frees the shared state */
        for (int32_t i = 0; i < r; ++i) sk_comm_destroy(made[i]);
        if (r == 0) sim_shared_free(sh);
        free(made);
        return sk_error(SK_STATUS_ALLOC_FAILED, "the simulated communicator of %d ranks",
                        (int)ranks);
    }
    memcpy(comms, made, (size_t)ranks * sizeof *made);
    free(made);
    return SK_STATUS_SUCCESS;
}

sk_status sk_comm_create_simulated(int32_t ranks, sk_comm_t *comms) {
    SK_ENTER("sk_comm_create_simulated");
    return sim_create(ranks, comms, &sim_ops);
}

sk_status sk_comm_create_simulated_cuda(int32_t ranks, sk_comm_t *comms) {
    SK_ENTER("sk_comm_create_simulated_cuda");
    SK_CHECK_NOT_NULL(comms);
    /* Made aside, so that comms is written only on success. */
    sk_comm_t *made = calloc(ranks > 0 ? (size_t)ranks : 1, sizeof *made);
    if (made == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "the simulated communicator of %d ranks",
                        (int)ranks);
    sk_status st = sim_create(ranks, made, &sim_device_ops);
    for (int32_t r = 0; st == SK_STATUS_SUCCESS && r < ranks; ++r)
        st = sk_cuda_cp_streams_create(&made[r]->streams);
    if (st == SK_STATUS_SUCCESS)
        memcpy(comms, made, (size_t)ranks * sizeof *made);
    else if (made[0] != NULL) /* sim_create succeeded: undo it */
        for (int32_t r = 0; r < ranks; ++r) sk_comm_destroy(made[r]);
    free(made);
    return st;
}
