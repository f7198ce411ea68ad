/*
 * topk.c - `sparsek run --pattern topk`: sk_attention_topk selects the
 * layout from the workload's own Q and K and runs the attention on it, timed
 * as one call; the attention alone on the selected layout is timed too (the
 * selection's cost is the difference); then one more call is checked on the
 * layout it selected, copied back to the host.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void setup_topk(const workload *w, topk_state *tk) {
    memset(tk, 0, sizeof *tk);
    sk_topk_desc *d = &tk->desc;
    check_sk(sk_topk_desc_init(d, sizeof *d), "sk_topk_desc_init");
    d->backend = w->backend;
    d->dtype = w->dtype;
    d->batch = w->batch;
    d->seq_q = w->seq_q;
    d->seq_k = w->seq_k;
    d->heads_q = w->heads_q;
    d->heads_kv = w->heads_kv;
    d->head_dim = w->dim;
    d->block_q = w->block_q;
    d->block_k = w->block_k;
    d->k = w->k_per_row;
    d->sink_blocks = w->sink_blocks;
    d->local_blocks = w->local_blocks;
    d->mask = w->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    d->per_kv_head = w->per_kv_head;
    sk_grid grid;
    check_sk(sk_topk_layout_capacity(d, &grid, &tk->capacity), "sk_topk_layout_capacity");
    int32_t rb, cb, slices;
    check_sk(sk_grid_blocks(&grid, &rb, &cb, &slices), "sk_grid_blocks");
    tk->offsets_len = (int64_t)slices * rb + 1;
    tk->out.grid = grid;
    tk->out.nnz = tk->capacity;
    const size_t off_bytes = (size_t)tk->offsets_len * sizeof(int32_t);
    const size_t idx_bytes = (size_t)(tk->capacity > 0 ? tk->capacity : 1) * sizeof(int32_t);
    if (!w->on_gpu) {
        tk->out.row_offsets = xmalloc(off_bytes, "the topk layout");
        tk->out.col_indices = xmalloc(idx_bytes, "the topk layout");
        return;
    }
#ifndef SK_NO_CUDA
    check_cuda(cudaMalloc((void **)&tk->out.row_offsets, off_bytes), "cudaMalloc");
    check_cuda(cudaMalloc((void **)&tk->out.col_indices, idx_bytes), "cudaMalloc");
#endif
}

static void free_topk(const workload *w, topk_state *tk) {
    if (!w->on_gpu) {
        free(tk->out.row_offsets);
        free(tk->out.col_indices);
        return;
    }
#ifndef SK_NO_CUDA
    cudaFree(tk->out.row_offsets);
    cudaFree(tk->out.col_indices);
#endif
}

/* The selected layout copied into new host arrays (the caller frees them),
 * nnz = its real count row_offsets[last], validated. The selection's
 * stream work has finished (run_timed waits for its last event). */
static void fetch_topk_layout(const workload *w, const topk_state *tk, sk_bsr *host) {
    *host = tk->out;
    const size_t off_bytes = (size_t)tk->offsets_len * sizeof(int32_t);
    host->row_offsets = xmalloc(off_bytes, "the selected layout");
    if (!w->on_gpu) {
        memcpy(host->row_offsets, tk->out.row_offsets, off_bytes);
    } else {
#ifndef SK_NO_CUDA
        check_cuda(
            cudaMemcpy(host->row_offsets, tk->out.row_offsets, off_bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy (the selected layout)");
#endif
    }
    const int32_t nnz = host->row_offsets[tk->offsets_len - 1];
    if (nnz < 0 || nnz > tk->capacity)
        fail("the selected layout's count %d is outside [0, %d]", (int)nnz, (int)tk->capacity);
    host->nnz = nnz;
    host->col_indices =
        xmalloc((size_t)(nnz > 0 ? nnz : 1) * sizeof(int32_t), "the selected layout");
    if (nnz > 0) {
        if (!w->on_gpu) {
            memcpy(host->col_indices, tk->out.col_indices, (size_t)nnz * sizeof(int32_t));
        } else {
#ifndef SK_NO_CUDA
            check_cuda(cudaMemcpy(host->col_indices, tk->out.col_indices,
                                  (size_t)nnz * sizeof(int32_t), cudaMemcpyDeviceToHost),
                       "cudaMemcpy (the selected layout)");
#endif
        }
    }
    check_sk(sk_layout_validate(host), "sk_layout_validate (the selected layout)");
}

static int same_layout(const sk_bsr *a, const sk_bsr *b, int64_t offsets_len) {
    return a->nnz == b->nnz &&
           memcmp(a->row_offsets, b->row_offsets, (size_t)offsets_len * sizeof(int32_t)) == 0 &&
           memcmp(a->col_indices, b->col_indices, (size_t)a->nnz * sizeof(int32_t)) == 0;
}

/* The attention's selected blocks at most: each row's k, sink and local
 * blocks (fewer near the diagonal with the causal mask, or in short rows). */
static int64_t blocks_bound(const workload *w) {
    int64_t per_row = (int64_t)w->k_per_row + w->sink_blocks + w->local_blocks;
    if (per_row > w->col_blocks) per_row = w->col_blocks;
    return w->batch * w->heads_q * w->row_blocks * per_row;
}

int cmd_run_topk(const run_opts *opts, workload *w) {
    progress_expect(expected_seconds(w, blocks_bound(w)));
    tensors t;
    setup_tensors(w, NULL, &t);
    topk_state tk;
    setup_topk(w, &tk);
    run_stats s;
    memset(&s, 0, sizeof s);
    s.topk = 1;
    s.layout_capacity = tk.capacity;
    s.time = run_timed(w, &t, &tk, "sk_attention_topk");

    sk_bsr sel;
    fetch_topk_layout(w, &tk, &sel);
    t.layout = tk.out; /* the backend's arrays, with the real count */
    t.layout.nnz = sel.nnz;
    s.attention_ms = run_timed(w, &t, NULL, "sk_attention_run on the selected layout").median_ms;
    s.selection_ms = s.time.median_ms - s.attention_ms;
    s.layout_nnz = sel.nnz;
    fill_stats(w, &sel, &s);

    check_result c;
    if (w->check_heads > 0) {
        poison_outputs(w, &t);
        workload once = *w;
        once.iters = 1;
        once.warmup = 0;
        (void)run_timed(&once, &t, &tk, "sk_attention_topk for the check");
        sk_bsr again;
        fetch_topk_layout(w, &tk, &again);
        if (!same_layout(&sel, &again, tk.offsets_len))
            fail("two sk_attention_topk calls on the same Q and K selected different layouts");
        free(again.row_offsets);
        free(again.col_indices);
    }
    check_heads(w, &sel, &t, &c);
    report_run(w, &s, &c, opts->json);
    t.layout.row_offsets = NULL; /* tk's arrays: freed by free_topk */
    t.layout.col_indices = NULL;
    free_tensors(&t);
    free_topk(w, &tk);
    free(sel.row_offsets);
    free(sel.col_indices);
    return c.passed ? 0 : 1;
}
