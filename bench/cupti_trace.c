/*
 * cupti_trace.c - a CUPTI injection library (a measuring tool, not part of
 * the library): loaded by the CUDA driver into any CUDA program through
 * CUDA_INJECTION64_PATH, it records every CUDA runtime call (start, end)
 * and every kernel (start, end on the device) on one clock, and writes them
 * as CSV when the program exits. It is how docs/perf/topk_log.md step 14 saw
 * where the host spends the time before a call's first kernel; the lent
 * machines have no Nsight Systems.
 *
 *   cc -O2 -shared -fPIC -I/usr/local/cuda/include -o build/libsk_cupti_trace.so \
 *      bench/cupti_trace.c -L/usr/local/cuda/lib64 -lcupti
 *   CUDA_INJECTION64_PATH=$PWD/build/libsk_cupti_trace.so SK_TRACE_OUT=trace.csv \
 *      build/topk_speed ...
 *
 * Rows: kind (api | kernel), name, start_ns, end_ns, correlation id, and
 * for kernels the device and stream ids (multi-GPU timelines). The
 * recording itself costs the host about a microsecond per runtime call.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cupti.h>

enum { BUF_BYTES = 8 << 20, BUF_ALIGN = 8 };

static FILE *trace_out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = (uint8_t *)aligned_alloc(BUF_ALIGN, BUF_BYTES);
    *size = *buffer != NULL ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (trace_out == NULL) continue;
        if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
            const char *name = "?";
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
            fprintf(trace_out, "api,%s,%llu,%llu,%u,,\n", name, (unsigned long long)a->start,
                    (unsigned long long)a->end, a->correlationId);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
            char name[64];
            snprintf(name, sizeof name, "%s", k->name);
            for (char *c = name; *c; ++c)
                if (*c == ',') *c = ';';
            fprintf(trace_out, "kernel,%s,%llu,%llu,%u,%u,%u\n", name, (unsigned long long)k->start,
                    (unsigned long long)k->end, k->correlationId, k->deviceId, k->streamId);
        }
    }
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(1);
    if (trace_out != NULL) fclose(trace_out);
    trace_out = NULL;
}

/* Called by the CUDA driver when CUDA_INJECTION64_PATH names this file. */
__attribute__((visibility("default"))) int InitializeInjection(void);

int InitializeInjection(void) {
    const char *path = getenv("SK_TRACE_OUT");
    trace_out = fopen(path != NULL ? path : "cupti_trace.csv", "w");
    if (trace_out == NULL) return 0;
    fprintf(trace_out, "kind,name,start_ns,end_ns,correlation,device,stream\n");
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "cupti_trace: could not enable the activity records\n");
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
