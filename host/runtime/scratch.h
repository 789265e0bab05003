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
    SCRATCH_WEIGHT_F32,             /* a piece of a weight decoded to float32 for CLBlast (gemm.c) */
    SCRATCH_COUNT
} clmla_scratch_slot;

/* A buffer of at least `bytes` for the slot (grown by half again when too small). */
clmla_status clmla_scratch(clmla_context *ctx, clmla_scratch_slot slot, size_t bytes, cl_mem *buffer);
void clmla_scratch_release(clmla_context *ctx);

/* A read-only device copy of host data made at once (clCreateBuffer with COPY_HOST_PTR), so the
   host array may be reused immediately and no queue synchronisation is needed; release it after
   enqueuing the commands that read it (OpenCL keeps it alive until they finish). */
clmla_status clmla_upload(clmla_context *ctx, const void *data, size_t bytes, cl_mem *buffer);
#endif
