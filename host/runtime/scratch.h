/* Device scratch buffers owned by a context and shared by every layer on it: activations of the
   step in flight. They only grow. Commands on the context's in-order queue use them one step after
   another, so reuse across steps is safe; a context is not to be used from two threads at once. */
#ifndef CLMLA_SCRATCH_H
#define CLMLA_SCRATCH_H
#include "internal.h"

typedef enum clmla_scratch_slot {
    SCRATCH_X, SCRATCH_OUT,         /* host-pointer forward: input and output */
    SCRATCH_QKV,                    /* fused q (or c^Q) and kv_a output [T, qa_rows + rkv + dr] */
    SCRATCH_Q,                      /* q [T, H*dq] */
    SCRATCH_Q_ABSORBED,             /* q~ [T, H, rkv] */
    SCRATCH_LATENT_OUT,             /* o-bar [T, H, rkv] */
    SCRATCH_LSE,                    /* [T, H] */
    SCRATCH_SPLIT_OUT, SCRATCH_SPLIT_LSE, /* split-KV partials */
    SCRATCH_HEADS_OUT,              /* o [T, H*dv] */
    SCRATCH_GATHER,                 /* a sequence's cache rows as float32 [L, rkv+dr] */
    SCRATCH_KV_UP,                  /* up-projected keys and values [L, H*(dn+dv)] */
    SCRATCH_PIECE_SEQ, SCRATCH_PIECE_CTX, /* a piece of the step's token tables (layer_step.c's absorbed pieces) */
    SCRATCH_WEIGHT_F32,             /* a piece of a weight decoded to float32 for CLBlast (gemm.c) */
    SCRATCH_CLBLAST_TEMP,           /* CLBlast's Xgemm temporary buffer (padded copies of A, B, C) */
    /* the lightning indexer's (sparse-attention layers): W_k x [T, d_I], its queries [T, H_I, d_I],
       head weights [T, H_I] and the scores of a chunk of tokens [rows, ctx] (the selection [T, K] is
       the cache's, cache_selection) */
    SCRATCH_INDEX_K, SCRATCH_INDEX_Q, SCRATCH_INDEX_W, SCRATCH_INDEX_SCORES,
    SCRATCH_PAGED_SEQ, SCRATCH_PAGED_CTX, /* clmla_paged_attention's token tables [T] (host/mla/paged.c) */
    SCRATCH_COUNT
} clmla_scratch_slot;

/* A buffer of at least `bytes` for the slot (grown by half again when too small, to at most the
   device's largest buffer). */
clmla_status clmla_scratch(clmla_context *ctx, clmla_scratch_slot slot, size_t bytes, cl_mem *buffer);
/* The host-pointer forward's scratch: *x_buf (SCRATCH_X) holding the x_bytes at x, written
   (blocking), and *out_buf (SCRATCH_OUT) of out_bytes; `what` names the write in its refusal. */
clmla_status clmla_scratch_in_out(clmla_context *ctx, const void *x, size_t x_bytes, size_t out_bytes, const char *what,
                                  cl_mem *x_buf, cl_mem *out_buf);
/* The same, grown to at most `cap` bytes (or `bytes` where that is more): for a slot whose size has
   a budget, so that the growth does not keep more than it. */
clmla_status clmla_scratch_capped(clmla_context *ctx, clmla_scratch_slot slot, size_t bytes, size_t cap,
                                  cl_mem *buffer);
void clmla_scratch_release(clmla_context *ctx);

/* Tables the host writes for the device at every step (block tables, positions, cache slots), kept
   between steps (docs/DESIGN.md, "Step buffers"): one host block and one read-only device buffer
   holding every table at a fixed offset (a multiple of the device's base address alignment), and a
   sub-buffer per table for the kernels. A table's capacity grows by half again when a step needs
   more; the block, the buffer and the sub-buffers are then made anew, and kept. A step's tables go
   to the device in as few non-blocking writes as the gaps between them allow (each write command
   costs about as much as copying tens of KiB), so the host block may be
   rewritten, or grown, only once the last write from it has completed. */
#define CLMLA_STAGED_PARTS 8
typedef struct clmla_staged {
    int parts;
    void *host;                                   /* [bytes] */
    size_t host_bytes;                            /* allocated */
    cl_mem device;                                /* [bytes] */
    size_t bytes;
    size_t offset[CLMLA_STAGED_PARTS];            /* of each table, in both */
    size_t capacity[CLMLA_STAGED_PARTS];          /* bytes; 0: a table not in use */
    cl_mem part[CLMLA_STAGED_PARTS];              /* the tables' sub-buffers (device itself for one table) */
} clmla_staged;

/* Room for at least need[i] bytes in table i of `parts` (need[i] 0: a table not in use); contents
   are not kept when it grows. The caller has waited for any write still reading the host block. On
   failure the tables are as they were. */
clmla_status clmla_staged_reserve(clmla_context *ctx, clmla_staged *s, int parts, const size_t *need);
/* Table i in the host block. */
void *clmla_staged_host(const clmla_staged *s, int i);
/* Writes the first used[i] bytes of every table to the device (non-blocking), *event the
   completion of the last write. On failure the writes already enqueued are finished first, so that
   the host block may be reused. */
clmla_status clmla_staged_write(clmla_context *ctx, clmla_staged *s, const size_t *used, cl_event *event);
void clmla_staged_release(clmla_staged *s);

/* A read-only device copy of host data made at once (clCreateBuffer with COPY_HOST_PTR), so the
   host array may be reused immediately and no queue synchronisation is needed; release it after
   enqueuing the commands that read it (OpenCL keeps it alive until they finish). */
clmla_status clmla_upload(clmla_context *ctx, const void *data, size_t bytes, cl_mem *buffer);
#endif
