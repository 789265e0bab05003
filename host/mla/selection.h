/* The selection record a cache keeps: the keys the last full sparse-attention layer (one with an
   indexer) selected in its last step on the cache, which glm_moe_dsa's "shared" layers attend to
   in the same step (host/mla/selection.c; docs/DESIGN.md, "Shared layers"). */
#ifndef CLMLA_SELECTION_H
#define CLMLA_SELECTION_H
#include "internal.h"

typedef struct cache_selection {
    int valid;            /* 0 until a full layer's step completes, and again after a change that
                             makes it stale (a failed step, a truncate or free of one of its
                             sequences) */
    int layer;            /* the cache layer of the full layer that made it */
    int topk;             /* its index_topk */
    int sparse;           /* 0: no query saw more than topk keys, so every query attended to all */
    int T;                /* tokens of the step */
    int count, capacity;  /* entries of the step; allocated length of the arrays */
    int32_t *seq;         /* [count] */
    int *tokens, *start;  /* [count] each entry's new tokens and the position of the first */
    cl_mem indices;       /* [T, topk] int32 positions, -1 padded (sparse steps) */
    size_t indices_bytes; /* allocated */
} cache_selection;

/* The record's index buffer with room for `bytes`, grown when smaller (its contents are then
   lost, and the record marked stale). */
clmla_status clmla_selection_buffer(cache_selection *s, clmla_context *ctx, size_t bytes, cl_mem *buffer);
/* Marks the record stale. */
void clmla_selection_clear(cache_selection *s);
/* Marks the record stale when seq_id is one of its entries (the sequence was truncated or freed). */
void clmla_selection_forget(cache_selection *s, int32_t seq_id);
/* Records the step a full layer in cache layer `layer` has just enqueued: its entries, the position
   of each entry's first new token (start), and whether it selected (its indices are then in the
   record's buffer). On failure the record is stale. */
clmla_status clmla_selection_keep(cache_selection *s, clmla_context *ctx, int layer, int topk, int sparse, int T,
                                  const clmla_batch_entry *entries, int count, const int *start);
/* Whether a shared layer with index_topk `topk` may run a step of `count` entries in cache layer
   `layer` over the record: it is valid, of the same index_topk and entry count. Otherwise an error
   naming what differs. */
clmla_status clmla_selection_check(const cache_selection *s, clmla_context *ctx, int layer, int topk, int count);
/* Whether entry e of that step is the record's entry e: the same sequence and token count, and
   the sequence holds `length` tokens in `layer` now, the position the full layer's step began at. */
clmla_status clmla_selection_check_entry(const cache_selection *s, clmla_context *ctx, int layer, int e,
                                         const clmla_batch_entry *entry, int length);
/* Frees the record's memory. */
void clmla_selection_release(cache_selection *s);

#endif
