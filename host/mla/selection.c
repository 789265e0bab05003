/* The selection record of a cache: the keys the last full sparse-attention layer selected in its
   last step, for the "shared" layers of glm_moe_dsa (indexer_types) that attend to them in the
   same step (selection.h; docs/DESIGN.md, "Shared layers"). A full layer marks the record stale
   when its step begins and records it once the step is enqueued; a shared layer runs only over a
   record of the same entries at the same positions. */
#include "selection.h"

#include "clcall.h"

#include <stdlib.h>
#include <string.h>

clmla_status clmla_selection_buffer(cache_selection *s, clmla_context *ctx, size_t bytes, cl_mem *buffer)
{
    if (bytes == 0)
        bytes = sizeof(cl_int);
    if (!s->indices || s->indices_bytes < bytes) {
        s->valid = 0;
        clmla_release_mem(s->indices);
        s->indices = NULL;
        s->indices_bytes = 0;
        const size_t grown = bytes + bytes / 2;
        cl_int err = CL_SUCCESS;
        cl_mem m = clmla_cl_buffer(ctx, CL_MEM_READ_WRITE, grown, NULL, &err);
        if (!m)
            return clmla_fail_cl(ctx, err, "clCreateBuffer(the step's key selection)");
        s->indices = m;
        s->indices_bytes = grown;
    }
    *buffer = s->indices;
    return CLMLA_SUCCESS;
}

void clmla_selection_clear(cache_selection *s)
{
    s->valid = 0;
}

void clmla_selection_forget(cache_selection *s, int32_t seq_id)
{
    for (int i = 0; s->valid && i < s->count; i++)
        if (s->seq[i] == seq_id)
            s->valid = 0;
}

clmla_status clmla_selection_keep(cache_selection *s, clmla_context *ctx, int layer, int topk, int sparse, int T,
                                  const clmla_batch_entry *entries, int count, const int *start)
{
    s->valid = 0;
    if (count > s->capacity) {
        const int grown = count + count / 2;
        int32_t *seq = clmla_host_realloc(ctx, s->seq, (size_t)grown * sizeof(int32_t));
        if (seq)
            s->seq = seq;
        int *info = seq ? clmla_host_realloc(ctx, s->tokens, (size_t)grown * 2 * sizeof(int)) : NULL;
        if (!info)
            return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY,
                              "out of host memory for the selection record of a step of %d entries", count);
        s->tokens = info;
        s->start = info + grown;
        s->capacity = grown;
    }
    for (int e = 0; e < count; e++) {
        s->seq[e] = entries[e].seq_id;
        s->tokens[e] = entries[e].num_tokens;
        s->start[e] = start[e];
    }
    s->count = count;
    s->layer = layer;
    s->topk = topk;
    s->sparse = sparse;
    s->T = T;
    s->valid = 1;
    return CLMLA_SUCCESS;
}

clmla_status clmla_selection_check(const cache_selection *s, clmla_context *ctx, int layer, int topk, int count)
{
    if (!s->valid)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "cache layer %d is a shared sparse-attention layer (no indexer of its own): it attends to the "
                          "keys its full layer selected in the same step, and no full layer has run a step on this cache "
                          "since it was created or since its last step failed or one of its sequences was truncated or "
                          "freed; run the full layer first",
                          layer);
    if (s->topk != topk)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_CONFIG,
                          "the shared layer in cache layer %d has index_topk %d, the full layer in cache layer %d whose "
                          "selection it would take selected index_topk %d",
                          layer, topk, s->layer, s->topk);
    if (s->count != count)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "the shared layer in cache layer %d is given a step of %d entries, the full layer in cache "
                          "layer %d last ran a step of %d: a shared layer runs the same step as its full layer",
                          layer, count, s->layer, s->count);
    return CLMLA_SUCCESS;
}

clmla_status clmla_selection_check_entry(const cache_selection *s, clmla_context *ctx, int layer, int e,
                                         const clmla_batch_entry *entry, int length)
{
    if (entry->seq_id == s->seq[e] && entry->num_tokens == s->tokens[e] && length == s->start[e])
        return CLMLA_SUCCESS;
    return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                      "entry %d of the shared layer's step in cache layer %d is sequence %d, %d tokens from position "
                      "%d; the full layer in cache layer %d ran sequence %d, %d tokens from position %d: a shared "
                      "layer runs the same tokens as its full layer, in the same step",
                      e, layer, (int)entry->seq_id, entry->num_tokens, length, s->layer, (int)s->seq[e], s->tokens[e],
                      s->start[e]);
}

void clmla_selection_release(cache_selection *s)
{
    clmla_release_mem(s->indices);
    free(s->seq);
    free(s->tokens);
    memset(s, 0, sizeof(*s));
}
