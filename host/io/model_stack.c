/* A model's MLA attentions over one cache (clmla_model, include/clmla.h): the attentions of a range
   of decoder layers in the model's order, each in a cache layer of its own, with what crosses
   layers: which attention takes which one's key selection (glm_moe_dsa's "shared" layers). The
   selection itself lives with the cache (host/mla/selection.c). */
#include "cache.h"
#include "config.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct clmla_model {
    clmla_context *ctx;
    int count;
    clmla_model_attention *info; /* [count] */
    clmla_layer **layers;        /* [count] */
    int owns_layers;             /* 0: the caller's (clmla_model_create_from_layers) */
    clmla_cache *cache;
};

void clmla_model_destroy(clmla_model *m)
{
    if (!m)
        return;
    clmla_cache_destroy(m->cache);
    for (int i = 0; m->owns_layers && m->layers && i < m->count; i++)
        clmla_layer_destroy(m->layers[i]);
    free(m->layers);
    free(m->info);
    free(m);
}

/* The attentions of layers [first, end) of the folder's description, in order, into m->info (layer
   and sublayer; m->count of them). A range that starts on a shared layer after its full layer is
   refused, naming both; one holding no MLA attention too. */
static clmla_status plan_attentions(clmla_context *ctx, const char *dir, const clmla_model_desc *d, int first, int end,
                                    int dense, clmla_model *m)
{
    const int per = d->attentions_per_layer > 0 ? d->attentions_per_layer : 1;
    m->info = calloc((size_t)(end - first) * (size_t)per, sizeof(*m->info));
    if (!m->info)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    for (int l = first; l < end; l++) {
        if (d->is_mla && !d->is_mla[l])
            continue;
        if (m->count == 0 && !dense && d->index_shared && d->index_shared[l]) {
            int full = l - 1;
            while (full >= 0 && d->index_shared[full])
                full--;
            if (full >= 0)
                return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                                  "layers %d to %d of %s: layer %d is a \"shared\" sparse-attention layer that "
                                  "attends to the selection of layer %d, which the range leaves out; start the range at "
                                  "layer %d",
                                  first, end - 1, dir, l, full, full);
        }
        for (int sub = 0; sub < per; sub++, m->count++) {
            m->info[m->count].layer = l;
            m->info[m->count].sublayer = sub;
        }
    }
    if (m->count == 0)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_CONFIG, "layers %d to %d of %s hold no MLA attention", first, end - 1,
                          dir);
    return CLMLA_SUCCESS;
}

/* Each attention's cache layer, kind and source from its layer's configuration: an indexer makes it
   INDEXED, index_shared SHARED (the nearest INDEXED one before it is its source; none: refused);
   then the cache, whose rows the layers must share (and the indexed ones their index keys), with
   index keys only where an attention has an indexer. */
static clmla_status describe_and_cache(clmla_context *ctx, const clmla_model_spec *spec, clmla_model *m)
{
    clmla_layer_config *c = calloc((size_t)m->count, sizeof(*c));
    unsigned char *indexed = calloc((size_t)m->count, 1);
    clmla_status st =
        c && indexed ? CLMLA_SUCCESS : clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    int last_indexed = -1, first_indexed = -1;
    for (int i = 0; st == CLMLA_SUCCESS && i < m->count; i++) {
        st = clmla_layer_get_config(m->layers[i], &c[i]);
        clmla_model_attention *a = &m->info[i];
        if (st == CLMLA_SUCCESS &&
            (c[i].kv_lora_rank != c[0].kv_lora_rank || c[i].qk_rope_head_dim != c[0].qk_rope_head_dim))
            st = clmla_fail(ctx, CLMLA_ERROR_SHAPE_MISMATCH,
                            "layer %d holds cache rows of kv_lora_rank %d + qk_rope_head_dim %d, layer %d of %d + %d: one "
                            "cache holds one row shape",
                            a->layer, c[i].kv_lora_rank, c[i].qk_rope_head_dim, m->info[0].layer, c[0].kv_lora_rank,
                            c[0].qk_rope_head_dim);
        if (st != CLMLA_SUCCESS)
            break;
        a->cache_layer = i;
        a->source = -1;
        a->kind = CLMLA_ATTENTION_DENSE;
        if (c[i].index_shared) {
            if (last_indexed < 0)
                st = clmla_fail(ctx, CLMLA_ERROR_INVALID_CONFIG,
                                "layer %d is a shared sparse-attention layer (index_shared), and no layer before it has "
                                "an indexer whose selection it could take",
                                a->layer);
            a->kind = CLMLA_ATTENTION_SHARED;
            a->source = last_indexed;
        } else if (c[i].index_n_heads > 0) {
            if (first_indexed >= 0 && c[i].index_head_dim != c[first_indexed].index_head_dim)
                st = clmla_fail(ctx, CLMLA_ERROR_SHAPE_MISMATCH,
                                "layer %d's indexer writes index keys of %d values, layer %d's of %d: one cache holds "
                                "one index-key shape",
                                a->layer, c[i].index_head_dim, m->info[first_indexed].layer,
                                c[first_indexed].index_head_dim);
            a->kind = CLMLA_ATTENTION_INDEXED;
            indexed[i] = 1;
            last_indexed = i;
            if (first_indexed < 0)
                first_indexed = i;
        }
    }
    if (st == CLMLA_SUCCESS) {
        clmla_cache_config cc = {.num_layers = m->count, .kv_lora_rank = c[0].kv_lora_rank,
                                 .rope_dim = c[0].qk_rope_head_dim, .block_tokens = spec->block_tokens,
                                 .num_blocks = spec->num_blocks, .dtype = spec->cache_dtype};
        if (first_indexed >= 0) {
            cc.index_head_dim = c[first_indexed].index_head_dim;
            cc.index_dtype = clmla_cache_index_dtype(cc.dtype, cc.index_head_dim);
        }
        st = clmla_cache_create_indexed(ctx, &cc, indexed, &m->cache);
    }
    free(c);
    free(indexed);
    return st;
}

/* The end of a model's creation so far at status st: its layers described and its cache made
   (describe_and_cache), then *out = m; or, where anything failed, m destroyed. */
static clmla_status finish_model(clmla_context *ctx, const clmla_model_spec *spec, clmla_model *m, clmla_status st,
                                 clmla_model **out)
{
    if (st == CLMLA_SUCCESS)
        st = describe_and_cache(ctx, spec, m);
    if (st != CLMLA_SUCCESS) {
        clmla_model_destroy(m);
        return st;
    }
    *out = m;
    return CLMLA_SUCCESS;
}

clmla_status clmla_model_create(clmla_context *ctx, const char *dir, const clmla_model_spec *spec, clmla_model **out)
{
    if (!out)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_model_create: NULL output pointer");
    *out = NULL;
    if (!ctx || !dir || !spec)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_model_create: NULL argument");
    clmla_model_desc d;
    char err[512];
    clmla_status st = clmla_model_folder_desc(dir, &d, err, sizeof(err));
    if (st != CLMLA_SUCCESS)
        return clmla_fail(ctx, st, "%s", err);
    const int first = spec->first_layer, n = spec->num_layers ? spec->num_layers : d.num_layers - first;
    if (first < 0 || first >= d.num_layers || n < 1 || (long long)first + n > d.num_layers) {
        clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                   "layers %d to %lld are out of range: %s has %d decoder layers (0 to %d)", first,
                   (long long)first + n - 1, dir, d.num_layers, d.num_layers - 1);
        clmla_model_desc_free(&d);
        return CLMLA_ERROR_INVALID_ARGUMENT;
    }
    clmla_model *m = calloc(1, sizeof(*m));
    if (!m) {
        clmla_model_desc_free(&d);
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    m->ctx = ctx;
    m->owns_layers = 1;
    st = plan_attentions(ctx, dir, &d, first, first + n, spec->dense, m);
    if (st == CLMLA_SUCCESS) {
        m->layers = calloc((size_t)m->count, sizeof(*m->layers));
        if (!m->layers)
            st = clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    for (int i = 0; st == CLMLA_SUCCESS && i < m->count; i++) {
        clmla_model_options mo = {.layer = m->info[i].layer, .sublayer = m->info[i].sublayer,
                                  .weights_dtype = spec->weights_dtype, .tp_rank = spec->tp_rank,
                                  .tp_size = spec->tp_size, .dense = spec->dense};
        st = clmla_layer_create_from_model_opts(ctx, dir, &mo, &m->layers[i]);
    }
    clmla_model_desc_free(&d);
    return finish_model(ctx, spec, m, st, out);
}

clmla_status clmla_model_create_from_layers(clmla_context *ctx, clmla_layer **layers, int count,
                                           const clmla_model_spec *spec, clmla_model **out)
{
    if (!out)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_model_create_from_layers: NULL output pointer");
    *out = NULL;
    if (!ctx || !layers || !spec || count < 1)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_model_create_from_layers: NULL argument or %d layers (at least 1)", count);
    for (int i = 0; i < count; i++)
        if (!layers[i])
            return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_model_create_from_layers: layer %d is NULL", i);
    clmla_model *m = calloc(1, sizeof(*m));
    if (m) {
        m->ctx = ctx;
        m->info = calloc((size_t)count, sizeof(*m->info));
        m->layers = calloc((size_t)count, sizeof(*m->layers));
    }
    clmla_status st = m && m->info && m->layers ? CLMLA_SUCCESS
                                                : clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    for (int i = 0; st == CLMLA_SUCCESS && i < count; i++) {
        m->info[i].layer = i;
        m->layers[i] = layers[i];
        m->count++;
    }
    return finish_model(ctx, spec, m, st, out);
}

clmla_status clmla_model_num_attentions(const clmla_model *m, int *count)
{
    if (!m || !count)
        return clmla_fail(m ? m->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_model_num_attentions: NULL argument");
    *count = m->count;
    return CLMLA_SUCCESS;
}

static clmla_status check_index(const clmla_model *m, const char *fn, int index)
{
    if (index < 0 || index >= m->count)
        return clmla_fail(m->ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: attention %d is out of range: the model holds %d (0 to %d)",
                          fn, index, m->count, m->count - 1);
    return CLMLA_SUCCESS;
}

clmla_status clmla_model_attention_info(const clmla_model *m, int index, clmla_model_attention *info)
{
    if (!m || !info)
        return clmla_fail(m ? m->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_model_attention_info: NULL argument");
    const clmla_status st = check_index(m, "clmla_model_attention_info", index);
    if (st == CLMLA_SUCCESS)
        *info = m->info[index];
    return st;
}

clmla_status clmla_model_cache(const clmla_model *m, clmla_cache **cache)
{
    if (!m || !cache)
        return clmla_fail(m ? m->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_model_cache: NULL argument");
    *cache = m->cache;
    return CLMLA_SUCCESS;
}

clmla_status clmla_model_layer(const clmla_model *m, int index, clmla_layer **layer)
{
    if (!m || !layer)
        return clmla_fail(m ? m->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_model_layer: NULL argument");
    const clmla_status st = check_index(m, "clmla_model_layer", index);
    if (st == CLMLA_SUCCESS)
        *layer = m->layers[index];
    return st;
}

/* A shared attention runs over its own source's selection: the cache's record must be that
   attention's (the layer then checks that it is of the same step). */
static clmla_status check_source(const clmla_model *m, int index)
{
    const clmla_model_attention *a = &m->info[index];
    if (a->kind != CLMLA_ATTENTION_SHARED)
        return CLMLA_SUCCESS;
    const cache_selection *s = &m->cache->selection;
    const clmla_model_attention *src = &m->info[a->source];
    if (s->valid && s->layer == src->cache_layer)
        return CLMLA_SUCCESS;
    if (!s->valid)
        return clmla_fail(m->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "attention %d (decoder layer %d) is a shared layer that takes the selection of attention %d "
                          "(decoder layer %d), which has not run a step since the cache last changed (run it first, "
                          "on the same entries)",
                          index, a->layer, a->source, src->layer);
    const clmla_model_attention *made = &m->info[s->layer];
    return clmla_fail(m->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                      "attention %d (decoder layer %d) is a shared layer that takes the selection of attention %d "
                      "(decoder layer %d), but the last selection made was attention %d's (decoder layer %d)",
                      index, a->layer, a->source, src->layer, s->layer, made->layer);
}

/* The arguments of a step through attention `index` of m, once m, index and the attention's source
   pass (fn: the caller, in messages). */
static clmla_status forward_args(clmla_model *m, const char *fn, int index, const clmla_batch_entry *entries,
                                 int num_entries, clmla_attention_path path, clmla_forward_args *args)
{
    if (!m)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "%s: NULL model", fn);
    clmla_status st = check_index(m, fn, index);
    if (st == CLMLA_SUCCESS)
        st = check_source(m, index);
    if (st == CLMLA_SUCCESS)
        *args = (clmla_forward_args){entries, num_entries, m->info[index].cache_layer, path};
    return st;
}

clmla_status clmla_model_forward(clmla_model *m, int index, const clmla_batch_entry *entries, int num_entries,
                                 clmla_attention_path path, const float *x, float *out)
{
    clmla_forward_args args;
    const clmla_status st = forward_args(m, "clmla_model_forward", index, entries, num_entries, path, &args);
    return st != CLMLA_SUCCESS ? st : clmla_layer_forward(m->layers[index], m->cache, &args, x, out);
}

clmla_status clmla_model_forward_cl(clmla_model *m, int index, const clmla_batch_entry *entries, int num_entries,
                                    clmla_attention_path path, cl_mem x, size_t x_offset, cl_mem out, size_t out_offset,
                                    cl_event *event)
{
    clmla_forward_args args;
    const clmla_status st = forward_args(m, "clmla_model_forward_cl", index, entries, num_entries, path, &args);
    return st != CLMLA_SUCCESS ? st
                               : clmla_layer_forward_cl(m->layers[index], m->cache, &args, x, x_offset, out, out_offset,
                                                        event);
}

clmla_status clmla_model_run(clmla_model *m, const clmla_batch_entry *entries, int num_entries,
                             clmla_attention_path path, float *x, float *out, clmla_model_between_fn between,
                             void *user)
{
    if (!m || !x || !out)
        return clmla_fail(m ? m->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_model_run: NULL argument");
    if (!between && m->count > 1)
        return clmla_fail(m->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_model_run: between is NULL, and the model holds %d attentions: each one's input is "
                          "made from the one before",
                          m->count);
    for (int i = 0; i < m->count; i++) {
        const clmla_status st = clmla_model_forward(m, i, entries, num_entries, path, x, out);
        if (st != CLMLA_SUCCESS)
            return st;
        if (i + 1 < m->count && between(user, i, out, x) != 0)
            return clmla_fail(m->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                              "clmla_model_run: the step stopped after attention %d (decoder layer %d): between "
                              "returned non-zero",
                              i, m->info[i].layer);
    }
    return CLMLA_SUCCESS;
}
