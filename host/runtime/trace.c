#include "trace.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Commands held before the trace is written out: enough for a few layer steps, so that the pause
   of writing them lands between timed calls only now and then. */
#define TRACE_RECORDS 1024

typedef struct trace_record {
    char kind[8];
    char what[88];
    char size[64];
    cl_event event;
} trace_record;

struct clmla_trace {
    FILE *file;
    int id;   /* the context's number in this process, the first column */
    size_t n; /* records pending */
    trace_record records[TRACE_RECORDS];
};

static atomic_int next_id;

void clmla_trace_open(clmla_context *ctx, const char *path)
{
    if (!path || !*path || ctx->trace)
        return;
    if (!ctx->profiling) {
        clmla_log(ctx, CLMLA_LOG_WARNING, "CLMLA_TRACE: the queue has no profiling; this context is not traced");
        return;
    }
    clmla_trace *t = calloc(1, sizeof(*t));
    FILE *f = t ? fopen(path, "a") : NULL;
    if (!f) {
        free(t);
        clmla_log(ctx, CLMLA_LOG_WARNING, "CLMLA_TRACE: cannot write %s; this context is not traced", path);
        return;
    }
    /* a line per write (O_APPEND): contexts of one process, or several processes, tracing into one
       file interleave whole lines */
    setvbuf(f, NULL, _IOLBF, 1024);
    if (ftell(f) == 0)
        fprintf(f, "# context\tkind\tname\twork size (global/local) or bytes\tqueued_ns\tsubmitted_ns\tstarted_ns\tended_ns\n");
    t->file = f;
    t->id = atomic_fetch_add(&next_id, 1);
    fprintf(f, "# context %d: %s (%s, driver %s)\n", t->id, ctx->info.name, ctx->info.platform_name,
            ctx->info.driver_version);
    fflush(f);
    ctx->trace = t;
}

/* Waits for the pending commands, writes them, releases their events. */
static void write_out(clmla_trace *t)
{
    for (size_t i = 0; i < t->n; i++) {
        trace_record *r = &t->records[i];
        cl_ulong at[4] = {0, 0, 0, 0};
        static const cl_profiling_info what[4] = {CL_PROFILING_COMMAND_QUEUED, CL_PROFILING_COMMAND_SUBMIT,
                                                  CL_PROFILING_COMMAND_START, CL_PROFILING_COMMAND_END};
        int ok = clWaitForEvents(1, &r->event) == CL_SUCCESS;
        for (int k = 0; ok && k < 4; k++)
            ok = clGetEventProfilingInfo(r->event, what[k], sizeof(at[k]), &at[k], NULL) == CL_SUCCESS;
        if (ok)
            fprintf(t->file, "%d\t%s\t%s\t%s\t%llu\t%llu\t%llu\t%llu\n", t->id, r->kind, r->what, r->size,
                    (unsigned long long)at[0], (unsigned long long)at[1], (unsigned long long)at[2],
                    (unsigned long long)at[3]);
        else
            fprintf(t->file, "# %s %s: no timestamps (the command failed or the runtime gave none)\n", r->kind, r->what);
        clReleaseEvent(r->event);
    }
    t->n = 0;
    fflush(t->file);
}

void clmla_trace_close(clmla_context *ctx)
{
    clmla_trace *t = ctx->trace;
    if (!t)
        return;
    write_out(t);
    fclose(t->file);
    free(t);
    ctx->trace = NULL;
}

cl_event *clmla_trace_event(const clmla_context *ctx, cl_event *caller, cl_event *local)
{
    if (caller || !ctx->trace)
        return caller;
    *local = NULL;
    return local;
}

void clmla_trace_kernel_name(cl_kernel kernel, char *name, size_t size)
{
    if (clGetKernelInfo(kernel, CL_KERNEL_FUNCTION_NAME, size, name, NULL) != CL_SUCCESS)
        snprintf(name, size, "?");
    name[size - 1] = '\0';
}

void clmla_trace_record(clmla_context *ctx, cl_int err, const char *kind, const char *what, cl_uint dims,
                        const size_t *size, const size_t *local, cl_event *used, int owned)
{
    clmla_trace *t = ctx->trace;
    if (!t || err != CL_SUCCESS || !used || !*used)
        return;
    if (!owned)
        clRetainEvent(*used);
    trace_record *r = &t->records[t->n++];
    snprintf(r->kind, sizeof(r->kind), "%s", kind);
    snprintf(r->what, sizeof(r->what), "%s", what);
    if (dims == 0)
        snprintf(r->size, sizeof(r->size), "%zu", size[0]);
    else {
        int n = snprintf(r->size, sizeof(r->size), "%zu,%zu,%zu", size[0], dims > 1 ? size[1] : (size_t)1,
                         dims > 2 ? size[2] : (size_t)1);
        if (strcmp(kind, "kernel") == 0 && n > 0 && (size_t)n < sizeof(r->size)) {
            if (local)
                snprintf(r->size + n, sizeof(r->size) - (size_t)n, "/%zu,%zu,%zu", local[0],
                         dims > 1 ? local[1] : (size_t)1, dims > 2 ? local[2] : (size_t)1);
            else
                snprintf(r->size + n, sizeof(r->size) - (size_t)n, "/-");
        }
    }
    r->event = *used;
    if (t->n == TRACE_RECORDS) {
        write_out(t);
        fprintf(t->file, "# the host waited here for the commands above (the trace's buffer was full)\n");
    }
}
