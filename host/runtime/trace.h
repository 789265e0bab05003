/* CLMLA_TRACE: a record of every command the library puts on a context's queue (its own kernels,
 * CLBlast's routines, buffer transfers) with the device's timestamps, written to a file as
 * tab-separated lines, so that a step's time can be split by kernel and the idle gaps between
 * commands seen (tools/trace_summary.py adds them up; README.md, "Environment variables").
 *
 * Off unless CLMLA_TRACE names a file when the context is created; then every recorded command gets
 * an event (the library's own when its caller passed none), kept until the trace is written out:
 * when TRACE_RECORDS commands are pending (the host then waits for them, a pause in the queue that
 * the file marks) and when the context is destroyed. Tracing needs a profiling queue (every
 * context the library creates has one; a caller's queue without profiling is not traced, with a
 * warning). Each line: context number, kind (kernel, clblast, write, read), name, work size or
 * bytes (a kernel's as global/local, "-" for a local size left to the driver), then queued,
 * submitted, started and ended in device nanoseconds. */
#ifndef CLMLA_TRACE_H
#define CLMLA_TRACE_H
#include "internal.h"

typedef struct clmla_trace clmla_trace;

/* Starts tracing ctx into `path` (appended to; a header line first when the file is empty). A
   failure (no profiling, an unwritable path) is logged as a warning and leaves tracing off. */
void clmla_trace_open(clmla_context *ctx, const char *path);
/* Writes out what is pending and stops tracing (context destruction). */
void clmla_trace_close(clmla_context *ctx);

/* The event pointer a command should be enqueued with: the caller's, or with tracing on and none
   given, *local (then the trace owns the event). */
cl_event *clmla_trace_event(const clmla_context *ctx, cl_event *caller, cl_event *local);
/* Records a command enqueued with `used` (clmla_trace_event's result; nothing when tracing is off
   or the enqueue failed, err != CL_SUCCESS). `owned`: the event is the trace's own, released when
   written; otherwise it is retained here and the caller keeps its reference. `what` names the
   command; `size` is its work size (kernels, up to 3 dimensions) or bytes (transfers, dims 0);
   `local` a kernel's work-group size (NULL: the driver's choice; not read for kind other than
   "kernel"). */
void clmla_trace_record(clmla_context *ctx, cl_int err, const char *kind, const char *what, cl_uint dims,
                        const size_t *size, const size_t *local, cl_event *used, int owned);
/* A kernel's name for clmla_trace_record. */
void clmla_trace_kernel_name(cl_kernel kernel, char *name, size_t size);
#endif
