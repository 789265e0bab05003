/* Latent attention over the paged cache: work-group shape from device queries, split-KV sizing,
   and the public FlashMLA-style entry point. */
#include "attention.h"
#include "clcall.h"
#include "program.h"
#include "scratch.h"
#include "kernel_tuning.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* Keys below which a split is not worth its combine traffic. */
#define MIN_SPLIT_TOKENS 256
/* Upper bound on the partial-result workspace. */
#define MAX_SPLIT_WORKSPACE_BYTES ((size_t)256 << 20)

/* The families of the cache's latent kernel store (cache->latent_kernels): attn_latent (or
   attn_latent_mma in its entry) and the row-walking kernels. */
enum { LATENT_GROUP = 1, LATENT_ROWS = 2 };

/* The second key of a latent kernel's entry: its form's build switches. */
static int form_key(int rows, int sparse, int mask, int lanes, int fold)
{
    return rows ? sparse | mask << 1 | lanes << 2 | (fold > 1) << 4 : sparse | mask << 1 | fold << 2;
}

cl_kernel clmla_latent_kernel_built(const clmla_cache *cache, int rows, int hg, int sparse, int mask, int lanes, int fold)
{
    const clmla_stored_kernel *e = clmla_kernel_store_find(&cache->latent_kernels, rows ? LATENT_ROWS : LATENT_GROUP,
                                                           hg, form_key(rows, sparse, mask, lanes, fold));
    return e ? e->kernel : NULL;
}

/* The kernels' parameters (heads per group or item, keys per item or tile, work-group size, groups
   per compute unit) come from clmla_latent_tuning_for (kernel_tuning.h: a forced set, the user's kernel
   tuning file, the built-in table, else the defaults, which are the values below).
   Keys per work-item in attn_latent's score step: 4 (cl/attn_latent.cl).
   Work-groups wanted per compute unit when splitting: attn_latent 8, so that a batch's splits
   fill the device in whole waves; attn_latent_rows (CPUs) 4. The runs behind both are in
   docs/perf-log.md. */

/* attn_latent pads a group of hg heads to whole quads, a power of two (HGP in cl/attn_latent.cl). */
static int padded_heads(int hg)
{
    return hg <= 4 ? 4 : hg <= 8 ? 8 : 16;
}

/* Local memory of attn_latent with nt work-items (cl/attn_latent.cl); arg: {heads per group, row, KPT,
   heads per item in the score step (HPI)}. */
static size_t latent_local_bytes(int nt, const void *arg)
{
    const int hg = ((const int *)arg)[0], row = ((const int *)arg)[1], kpt = ((const int *)arg)[2];
    const size_t hgp = (size_t)padded_heads(hg), hpi = (size_t)((const int *)arg)[3];
    const size_t tk = (hpi < hgp ? hpi : hgp) * (size_t)kpt * nt / hgp;
    return (hgp * (((size_t)row + 3) / 4) * 4 + tk * hgp + (size_t)nt + hgp) * sizeof(float) + tk * sizeof(int);
}

/* Whether attn_latent may read the cache's rows with whole-vector loads (group_aligned,
   CACHE_ALIGNED in cl/prelude.cl): its score step loads 4 values at a time, so for a cache that
   stores other than float, every such load must be aligned to 4 of its units: rows a multiple of 8
   bytes (buffers start aligned far beyond that) and, for fp8, the k^R part of a row (bf16) at a
   multiple of 8 bytes. f32 rows are read as float4s already where a row is whole float4s. */
static int cache_aligned(const clmla_cache *cache)
{
    if (cache->config.dtype == CLMLA_CACHE_F32 || cache->row_bytes % 8)
        return 0;
    /* an fp8 row ends with its dr bf16 values of k^R */
    return cache->config.dtype != CLMLA_CACHE_FP8 || (cache->row_bytes - 2 * (size_t)cache->config.rope_dim) % 8 == 0;
}

/* An Intel GPU, whose compiler (IGC) takes -cl-intel-256-GRF-per-thread (clmla_latent_tuning.
   group_large_grf). */
static int intel_gpu(const clmla_context *ctx)
{
    return ctx->info.kind == CLMLA_DEVICE_KIND_GPU && strstr(ctx->info.vendor, "Intel") != NULL;
}

/* Local memory of attn_latent_mma (cl/attn_latent_mma.cl), arg: {rkv, dr, 1 with CLMLA_PTX_MMA,
   the cache's dtype, 1 with SPARSE}: the queries (bf16, f16 and fp8: their two terms as pairs, f16
   with each row's power of two), the scores (bf16 and f16: then the weights' two terms apart; fp8
   and f32: the weights in their place), fp8's scales of the tile's rows, maxima and sums, alpha
   and sums, slots (SPARSE: and whether each entry is a key); and, where the products are computed
   by the items (no CLMLA_PTX_MMA), their exchange. */
static size_t mma_local_bytes(int nt, const void *arg)
{
    const int *a = arg;
    const size_t row = (size_t)a[0] + (size_t)a[1], exchange = a[2] ? 0 : (size_t)nt * 6;
    const size_t scores = a[3] == CLMLA_CACHE_BF16 || a[3] == CLMLA_CACHE_F16 ? 16 * 65 + 2 * 16 * 40
                          : a[3] == CLMLA_CACHE_FP8 ? 16 * 68 + 64 * ((size_t)a[0] / 128)
                                                    : 16 * 68;
    const size_t row_scales = a[3] == CLMLA_CACHE_F16 ? 32 : 0; /* f16: the query rows' powers of two */
    return (16 * row + scores + 8 * 16 + 32 + (a[4] ? 128 : 64) + row_scales + exchange) * 4;
}

/* Appends to options the build options of a call's form, shared by attn_latent and
   attn_latent_mma: -D SPARSE (selected keys), or -D HT -D FOLD for hg rows made of hg / fold heads
   of fold tokens. */
static void form_options(char *options, size_t size, int sparse, int hg, int fold)
{
    const size_t used = strlen(options);
    if (sparse)
        snprintf(options + used, size - used, " -D SPARSE");
    else if (fold > 1)
        snprintf(options + used, size - used, " -D HT=%d -D FOLD=%d", hg / fold, fold);
}

int clmla_latent_mma_device(const clmla_context *ctx)
{
    /* mma.sync.m16n8k16 with bf16 operands: NVIDIA GPUs of compute capability 8.0 and later
       (CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV of cl_nv_device_attribute_query) */
    cl_uint major = 0;
    if (ctx->info.kind == CLMLA_DEVICE_KIND_GPU && strstr(ctx->info.vendor, "NVIDIA") &&
        clGetDeviceInfo(ctx->device, 0x4000 /* CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV */, sizeof(major), &major, NULL) ==
            CL_SUCCESS &&
        major >= 8)
        return 2;
    return ctx->info.kind == CLMLA_DEVICE_KIND_CPU;
}

/* attn_latent_mma for `hg` rows (heads, or with fold > 1 hg / fold heads of fold tokens) in
   attn_latent's slot for the call (the parameters in force do not change over a context's life):
   where group_mma asks for it and the call fits it (a cache of its shapes, any dtype; dense, sparse
   or folded) on a device with the instruction, or on a CPU device, which computes the products
   itself; *kernel NULL otherwise, or where 128 items or the local memory do not fit or the build
   fails (logged), and attn_latent runs, in the same slot: it is not tried again, and a filled slot
   is returned as it is, whichever kernel it holds. */
static clmla_status mma_kernel(clmla_cache *cache, int hg, const clmla_latent_tuning *tn, int sparse, int fold,
                               cl_kernel *slot, int *slot_threads, cl_kernel *kernel, int *threads)
{
    const int rkv = cache->config.kv_lora_rank, row = rkv + cache->config.rope_dim;
    *kernel = NULL;
    const clmla_cache_dtype dtype = cache->config.dtype;
    if (!tn->group_mma || hg > 16 || rkv % 256 || row % 32)
        return CLMLA_SUCCESS;
    if (!*slot) { /* once: the step path only reads the slot */
        const int runs = clmla_latent_mma_device(cache->ctx), ptx = runs == 2;
        if (!runs)
            return CLMLA_SUCCESS;
        char options[256];
        snprintf(options, sizeof(options), "%s -D HG=%d%s", cache->options, hg, ptx ? " -D CLMLA_PTX_MMA" : "");
        form_options(options, sizeof(options), sparse, hg, fold);
        const int shape[5] = {rkv, cache->config.rope_dim, ptx, (int)dtype, sparse};
        const clmla_kernel_fit fit = {"attn_latent_mma", "attn_latent_mma", options, "MMA_NT", 128, 128,
                                      mma_local_bytes, shape};
        clmla_status st = clmla_kernel_create_fitted(cache->ctx, &fit, slot, slot_threads);
        if (st == CLMLA_ERROR_BUILD_FAILED) { /* a compiler without the inline PTX: attn_latent, once */
            clmla_log(cache->ctx, CLMLA_LOG_WARNING, "group_mma 1: attn_latent_mma did not build (%s); attn_latent runs",
                      clmla_last_error(cache->ctx));
            return CLMLA_SUCCESS;
        }
        if (st != CLMLA_SUCCESS)
            return st;
    }
    *kernel = *slot;
    *threads = *slot_threads;
    return CLMLA_SUCCESS;
}

/* The attn_latent kernel for `hg` heads per work-group: NT is the largest power of two <= the
   tuning's group_max_items (128 by default), and >= the heads padded to 4, 8 or 16, that the
   device's work-group limit, the kernel's own limit and local memory allow. NULL kernel (and
   success) where none fits: the caller takes fewer heads.
   The kernels are kept in the cache's store by heads and form only (cache->latent_kernels): valid
   because the parameters that apply to a context do not change
   over its life (the tuning table is read once per process; a forced set is made before a cache's
   first call, include/clmla_tuning.h). */
static clmla_status group_kernel(clmla_cache *cache, int hg, const clmla_latent_tuning *tn, int sparse, int fold,
                                 int mask, cl_kernel *kernel, int *threads)
{
    /* the sparse kernels (-D SPARSE, clmla_attention_latent_sparse), the masked ones (-D MASK,
       never folded, never attn_latent_mma) and the folded ones (hg / fold heads of fold tokens)
       are entries of their own */
    clmla_stored_kernel *e =
        clmla_kernel_store_entry(&cache->latent_kernels, LATENT_GROUP, hg, form_key(0, sparse, mask, 0, fold));
    if (!e)
        return clmla_fail(cache->ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "attention: no memory for a kernel entry");
    cl_kernel *slot = &e->kernel;
    int *slot_threads = &e->threads;
    if (!mask) {
        clmla_status mst = mma_kernel(cache, hg, tn, sparse, fold, slot, slot_threads, kernel, threads);
        if (mst != CLMLA_SUCCESS || *kernel)
            return mst;
    }
    if (!*slot) {
        /* heads per item in the score step: group_decode_heads where the cache's values are decoded,
           with as many scores per item as group_keys keys by 4 heads (fewer keys for more heads) */
        const int hpi = cache->config.dtype != CLMLA_CACHE_F32 ? tn->group_decode_heads : 4;
        const int kpt = tn->group_keys * 4 / hpi > 1 ? tn->group_keys * 4 / hpi : 1;
        const int shape[4] = {hg, cache->config.kv_lora_rank + cache->config.rope_dim, kpt, hpi};
        char options[320];
        snprintf(options, sizeof(options), "%s -D HG=%d -D KPT=%d", cache->options, hg, kpt);
        if (hpi != 4) /* only when set: the default's options, and its cached programs, as before */
            snprintf(options + strlen(options), sizeof(options) - strlen(options), " -D HPI=%d", hpi);
        form_options(options, sizeof(options), sparse, hg, fold);
        if (mask)
            strncat(options, " -D MASK", sizeof(options) - strlen(options) - 1);
        if (tn->group_query_layout) /* only when set: layout 0's options, and its cached programs, stay as they were */
            strncat(options, " -D QLAYOUT=1", sizeof(options) - strlen(options) - 1);
        if (tn->group_row_slices > 1)
            snprintf(options + strlen(options), sizeof(options) - strlen(options), " -D RS=%d", tn->group_row_slices);
        if (tn->group_aligned && cache_aligned(cache))
            strncat(options, " -D CACHE_ALIGNED", sizeof(options) - strlen(options) - 1);
        if (tn->group_aligned == 2 && cache_aligned(cache) && cache->config.dtype == CLMLA_CACHE_F16)
            strncat(options, " -D CACHE_HALF_BITS", sizeof(options) - strlen(options) - 1);
        if (tn->group_large_grf && intel_gpu(cache->ctx))
            strncat(options, " -cl-intel-256-GRF-per-thread", sizeof(options) - strlen(options) - 1);
        const clmla_kernel_fit fit = {"attn_latent", "attn_latent", options, "NT", tn->group_max_items, padded_heads(hg),
                                      latent_local_bytes, shape};
        clmla_status st = clmla_kernel_create_fitted(cache->ctx, &fit, slot, slot_threads);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    *kernel = *slot;
    *threads = *slot_threads;
    return CLMLA_SUCCESS;
}

/* attn_latent_rows for `hg` (even, <= 16) heads per work-item, or with `lanes` (1 or 2) attn_latent_lanes
   with that many vectors of 16 heads (hg 16 or 32), or with fold 2 two vectors of the 16 heads of
   two tokens. */
static clmla_status rows_kernel(clmla_cache *cache, int hg, int ktc, int sparse, int lanes, int fold, int mask,
                               cl_kernel *kernel)
{
    clmla_stored_kernel *e =
        clmla_kernel_store_entry(&cache->latent_kernels, LATENT_ROWS, hg, form_key(1, sparse, mask, lanes, fold));
    if (!e)
        return clmla_fail(cache->ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "attention: no memory for a kernel entry");
    cl_kernel *slot = &e->kernel;
    if (!*slot) {
        char options[256];
        /* Where they were measured, PoCL on CPUs: software prefetch (clang's __builtin_prefetch,
           which other CPU runtimes may not lower: oclgrind rejects it) and the combined horizontal
           sums (which crash oclgrind's uninitialised-value checker). */
        const int pocl = clmla_device_prefetches(&cache->ctx->info);
        snprintf(options, sizeof(options), "%s -D HGC=%d -D KTC=%d%s", cache->options, hg, ktc,
                 pocl ? " -D CLMLA_PREFETCH -D CLMLA_HSUM8" : "");
        if (sparse)
            strncat(options, " -D SPARSE", sizeof(options) - strlen(options) - 1);
        if (mask)
            strncat(options, " -D MASK", sizeof(options) - strlen(options) - 1);
        if (lanes)
            snprintf(options + strlen(options), sizeof(options) - strlen(options), " -D ROWS_LANES -D LHV=%d", lanes);
        if (fold > 1)
            strncat(options, " -D LFOLD", sizeof(options) - strlen(options) - 1);
        clmla_status st = clmla_kernel_create(cache->ctx, "attn_latent", options,
                                              lanes ? "attn_latent_lanes" : "attn_latent_rows", slot);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    *kernel = *slot;
    return CLMLA_SUCCESS;
}

void clmla_attention_set_variant(clmla_context *ctx, int variant)
{
    ctx->latent_variant = variant;
}

int clmla_attention_variant(const clmla_context *ctx)
{
    if (ctx->latent_variant != CLMLA_LATENT_AUTO)
        return ctx->latent_variant;
    return ctx->info.kind == CLMLA_DEVICE_KIND_CPU ? CLMLA_LATENT_ROWS : CLMLA_LATENT_GROUP;
}

/* Query tokens of one sequence per attn_latent work-group (FOLD) for groups of up to max_run
   tokens: the smallest power of two >= max_run within the largest that keeps num_heads * FOLD
   heads in a group (group_heads) and within group_fold; 1 (no folding) where a group holds no
   more than one token's heads. Powers of two only, so that clmla_layer_warmup's steps of 2, 4, 8
   and 16 tokens build every kernel a step can ask for. */
static int fold_for(int num_heads, int max_run, const clmla_latent_tuning *tn)
{
    int cap = tn->group_heads / num_heads;
    if (tn->group_fold < cap)
        cap = tn->group_fold;
    int fold = 1;
    while (fold < max_run && 2 * fold <= cap)
        fold *= 2;
    return fold;
}

int clmla_latent_lanes_vectors(const clmla_latent_tuning *tn, int num_heads)
{
    /* attn_latent_lanes fills 16 lanes with heads (rows_lanes 2: two vectors of them): with fewer
       heads the row kernel, which computes no empty lanes, runs instead */
    return tn->rows_lanes == 2 && num_heads >= 32 ? 2 : tn->rows_lanes && num_heads >= 16;
}

/* Which kernel, its work-group size, its heads per group and query tokens per group: the
   row-walking kernel on CPUs, the work-group kernel elsewhere, unless a test forced one. */
static clmla_status pick_kernel(clmla_cache *cache, int num_heads, const clmla_latent_tuning *tn, int sparse,
                                int mask, int max_run, cl_kernel *kernel, int *threads, int *heads_per_group,
                                int *fold, int *rows)
{
    *rows = clmla_attention_variant(cache->ctx) == CLMLA_LATENT_ROWS;
    *fold = 1;
    if (*rows) {
        /* a masked call runs attn_latent_rows (the lanes kernels take no mask) */
        const int lanes = mask ? 0 : clmla_latent_lanes_vectors(tn, num_heads);
        *threads = 1;
        /* rows_lanes 2 with 16 to 31 heads: the second vector takes a sequence's next token */
        if (tn->rows_lanes == 2 && lanes == 1 && max_run >= 2 && !sparse) {
            *heads_per_group = 16;
            *fold = 2;
            return rows_kernel(cache, 16, tn->rows_keys, 0, 2, 2, 0, kernel);
        }
        const int most = lanes ? 16 * lanes : tn->rows_heads;
        int hg = num_heads < most ? num_heads + (num_heads & 1) : most;
        *heads_per_group = hg;
        return rows_kernel(cache, hg, tn->rows_keys, sparse, lanes, 1, mask, kernel);
    }
    /* a sequence's tokens folded into the heads, halving them where local memory does not fit
       (not with a mask, whose rows are per token) */
    for (int f = sparse || mask ? 1 : fold_for(num_heads, max_run, tn); f > 1; f /= 2) {
        clmla_status st = group_kernel(cache, num_heads * f, tn, 0, f, 0, kernel, threads);
        if (st != CLMLA_SUCCESS || *kernel) {
            *heads_per_group = num_heads; /* of each token */
            *fold = f;
            return st;
        }
    }
    /* up to group_heads (16) heads per work-group (each cache row read once per group), fewer where
       a device's local memory or work-group size does not take them */
    const int most = tn->group_heads;
    for (int hg = num_heads < most ? num_heads : most;; hg = hg > 8 ? 8 : hg > 4 ? 4 : hg - 1) {
        clmla_status st = group_kernel(cache, hg, tn, sparse, 1, mask, kernel, threads);
        if (st != CLMLA_SUCCESS || *kernel) {
            *heads_per_group = hg;
            return st;
        }
        if (hg == 1)
            return clmla_fail(cache->ctx, CLMLA_ERROR_UNSUPPORTED,
                              "attn_latent: no work-group size fits this device's local memory (%llu bytes)",
                              (unsigned long long)cache->ctx->info.local_mem_bytes);
    }
}

clmla_status clmla_latent_attention_enqueue(clmla_cache *cache, int layer, const latent_launch *p, cl_event *event)
{
    clmla_context *ctx = cache->ctx;
    const int rkv = cache->config.kv_lora_rank;
    cl_kernel k = NULL;
    int threads = 0, heads_per_group = 0, fold = 1, rows = 0;
    clmla_latent_tuning tn;
    clmla_latent_tuning_for(ctx, p->num_heads, &tn);
    const int sparse = p->indices != NULL;
    clmla_status st = pick_kernel(cache, p->num_heads, &tn, sparse, p->mask != NULL, p->max_run, &k, &threads,
                                  &heads_per_group, &fold, &rows);
    if (st != CLMLA_SUCCESS)
        return st;
    const int head_groups = (p->num_heads + heads_per_group - 1) / heads_per_group;
    /* the keys each token walks, to be split: its context, or its index list */
    const int keys = sparse ? p->topk : p->max_ctx_len;

    /* Enough work-groups to give every compute unit a few, splitting long contexts (folded: about
       one working group per fold tokens, the others stop at once). */
    const long long groups = ((long long)p->num_tokens + fold - 1) / fold * head_groups;
    const long long per_cu = rows ? tn.rows_groups_per_cu : tn.group_groups_per_cu;
    const int min_split = rows ? MIN_SPLIT_TOKENS : tn.group_min_split_keys; /* attn_latent: the tuning's (128) */
    const long long target = per_cu * (ctx->info.compute_units ? ctx->info.compute_units : 1);
    int splits = 1;
    if (groups < target && keys > min_split) {
        long long want = (target + groups - 1) / groups;
        long long most = (keys + min_split - 1) / min_split;
        splits = (int)(want < most ? want : most);
    }
    const size_t per_split = (size_t)p->num_tokens * p->num_heads * (rkv + 1) * sizeof(float);
    while (splits > 1 && per_split * splits > MAX_SPLIT_WORKSPACE_BYTES)
        splits--;
    int split_tokens = keys > 0 ? (keys + splits - 1) / splits : 1;
    if (splits > 1)
        splits = (keys + split_tokens - 1) / split_tokens;

    cl_mem out = p->out, lse = p->lse;
    size_t out_offset = p->out_offset, lse_offset = p->lse_offset;
    if (splits > 1) {
        st = clmla_scratch(ctx, SCRATCH_SPLIT_OUT, (size_t)p->num_tokens * splits * p->num_heads * rkv * sizeof(float), &out);
        if (st == CLMLA_SUCCESS)
            st = clmla_scratch(ctx, SCRATCH_SPLIT_LSE, (size_t)p->num_tokens * splits * p->num_heads * sizeof(float), &lse);
        out_offset = lse_offset = 0;
    } else if (!lse) {
        st = clmla_scratch(ctx, SCRATCH_LSE, (size_t)p->num_tokens * p->num_heads * sizeof(float), &lse);
        lse_offset = 0;
    }
    if (st != CLMLA_SUCCESS)
        return st;

    const int ql_off = (int)p->q_latent_offset, qr_off = (int)p->q_rope_offset;
    const int out_off = (int)out_offset, lse_off = (int)lse_offset;
    CLMLA_SET_ARGS(ctx, k, 0, CLMLA_ARG(p->q_latent), CLMLA_ARG(ql_off), CLMLA_ARG(p->q_latent_token_stride),
                   CLMLA_ARG(p->q_latent_head_stride), CLMLA_ARG(p->q_rope), CLMLA_ARG(qr_off),
                   CLMLA_ARG(p->q_rope_token_stride), CLMLA_ARG(p->q_rope_head_stride));
    cl_mem kv_rows = p->kv ? p->kv : cache->layers[layer];
    CLMLA_SET_ARGS(ctx, k, 8, CLMLA_ARG(kv_rows), CLMLA_ARG(p->block_table), CLMLA_ARG(p->max_blocks_per_seq),
                   CLMLA_ARG(cache->config.block_tokens), CLMLA_ARG(p->token_seq), CLMLA_ARG(p->token_ctx_len),
                   CLMLA_ARG(p->num_heads), CLMLA_ARG(splits), CLMLA_ARG(split_tokens), CLMLA_ARG(p->scale),
                   CLMLA_ARG(out), CLMLA_ARG(out_off), CLMLA_ARG(lse), CLMLA_ARG(lse_off));
    int next = 22; /* the last argument's index: after the variant's own */
    if (sparse) {
        const int idx_off = (int)p->indices_offset;
        CLMLA_SET_ARGS(ctx, k, 22, CLMLA_ARG(p->indices), CLMLA_ARG(idx_off), CLMLA_ARG(p->topk));
        next = 25;
    } else if (p->mask) {
        const int mask_off = (int)p->mask_offset;
        CLMLA_SET_ARGS(ctx, k, 22, CLMLA_ARG(p->mask), CLMLA_ARG(mask_off), CLMLA_ARG(p->mask_stride));
        next = 25;
    } else if (fold > 1) {
        const int query_len = p->query_len > 1 ? p->query_len : 1;
        CLMLA_SET_ARG(ctx, k, 22, p->token_first);
        CLMLA_SET_ARG(ctx, k, 23, query_len);
        next = 24;
    }
    const cl_ulong kv_offset = p->kv_offset;
    CLMLA_SET_ARG(ctx, k, next, kv_offset);
    /* attn_latent_lanes with two tokens an item takes (head group, token, split): its idle items
       alternate with working ones, where PoCL hands each thread a contiguous range of the grid */
    const int token_dim1 = rows && fold > 1;
    const size_t global[3] = {(size_t)threads * head_groups, token_dim1 ? (size_t)p->num_tokens : (size_t)splits,
                              token_dim1 ? (size_t)splits : (size_t)p->num_tokens};
    const size_t local[3] = {(size_t)threads, 1, 1};
    cl_int err = clmla_cl_enqueue(ctx, k, 3, global, local, splits > 1 ? NULL : event);
    if (err != CL_SUCCESS)
        return clmla_fail_cl(ctx, err, rows ? "enqueue attn_latent_rows" : "enqueue attn_latent");
    if (splits == 1)
        return CLMLA_SUCCESS;

    /* The merge in the same shape as the attention: rows after attn_latent_rows (CPUs). */
    cl_kernel c = rows ? cache->combine_rows_kernel : cache->combine_kernel;
    cl_mem final_lse = p->lse;
    size_t final_lse_offset = p->lse_offset;
    if (!final_lse) {
        st = clmla_scratch(ctx, SCRATCH_LSE, (size_t)p->num_tokens * p->num_heads * sizeof(float), &final_lse);
        if (st != CLMLA_SUCCESS)
            return st;
        final_lse_offset = 0;
    }
    const int fo = (int)p->out_offset, fl = (int)final_lse_offset;
    CLMLA_SET_ARGS(ctx, c, 0, CLMLA_ARG(out), CLMLA_ARG(lse), CLMLA_ARG(splits), CLMLA_ARG(p->num_heads),
                   CLMLA_ARG(p->out), CLMLA_ARG(fo), CLMLA_ARG(final_lse), CLMLA_ARG(fl));
    if (rows) {
        const size_t rglobal[2] = {(size_t)p->num_heads, (size_t)p->num_tokens}, rlocal[2] = {1, 1};
        err = clmla_cl_enqueue(ctx, c, 2, rglobal, rlocal, event);
    } else {
        const size_t cglobal[3] = {(size_t)rkv, (size_t)p->num_heads, (size_t)p->num_tokens};
        err = clmla_cl_enqueue_rows(ctx, c, 3, cglobal, event);
    }
    if (err != CL_SUCCESS)
        return clmla_fail_cl(ctx, err, rows ? "enqueue attn_combine_rows" : "enqueue attn_combine");
    return CLMLA_SUCCESS;
}

/* The checks and the launch description shared by clmla_attention_latent and its sparse form;
   `fn` names the caller in the messages. */
static clmla_status latent_args(clmla_cache *cache, int layer, const clmla_latent_attention_args *a, const char *fn,
                                latent_launch *p)
{
    if (!cache || !a)
        return clmla_fail(cache ? cache->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    clmla_context *ctx = cache->ctx;
    if (layer < 0 || layer >= cache->config.num_layers)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "layer %d is not in 0..%d", layer, cache->config.num_layers - 1);
    if (a->num_tokens < 1 || a->num_heads < 1 || a->max_blocks_per_seq < 1 || a->max_ctx_len < 0 ||
        (long long)a->max_ctx_len > (long long)a->max_blocks_per_seq * cache->config.block_tokens)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: num_tokens %d and num_heads %d must be >= 1, max_blocks_per_seq %d >= 1, "
                          "and max_ctx_len %d within max_blocks_per_seq * block_tokens",
                          fn, a->num_tokens, a->num_heads, a->max_blocks_per_seq, a->max_ctx_len);
    if (!a->q_latent || !a->q_rope || !a->block_table || !a->token_seq || !a->token_ctx_len || !a->out)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: a required buffer is NULL", fn);
    if (a->query_len < 0 || (a->query_len > 1 && a->num_tokens % a->query_len))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: query_len %d must be >= 0 and divide num_tokens %d (query_len tokens per sequence)", fn,
                          a->query_len, a->num_tokens);
    const int rkv = cache->config.kv_lora_rank, dr = cache->config.rope_dim;
    const long long elems = (long long)a->num_tokens * a->num_heads * rkv;
    if (elems + (long long)a->q_latent_offset > INT_MAX || elems + (long long)a->out_offset > INT_MAX ||
        (long long)a->num_tokens * a->num_heads * dr + (long long)a->q_rope_offset > INT_MAX)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: buffers past 2^31 elements", fn);
    memset(p, 0, sizeof(*p));
    p->num_tokens = a->num_tokens;
    p->num_heads = a->num_heads;
    p->scale = a->softmax_scale;
    p->q_latent = a->q_latent;
    p->q_latent_offset = a->q_latent_offset;
    p->q_latent_token_stride = a->num_heads * rkv;
    p->q_latent_head_stride = rkv;
    p->q_rope = a->q_rope;
    p->q_rope_offset = a->q_rope_offset;
    p->q_rope_token_stride = a->num_heads * dr;
    p->q_rope_head_stride = dr;
    p->block_table = a->block_table;
    p->max_blocks_per_seq = a->max_blocks_per_seq;
    p->token_seq = a->token_seq;
    p->token_ctx_len = a->token_ctx_len;
    p->max_ctx_len = a->max_ctx_len;
    p->out = a->out;
    p->out_offset = a->out_offset;
    p->lse = a->lse;
    p->lse_offset = a->lse_offset;
    p->query_len = a->query_len;
    p->max_run = a->query_len > 1 ? a->query_len : 1;
    return CLMLA_SUCCESS;
}

clmla_status clmla_attention_latent(clmla_cache *cache, int layer, const clmla_latent_attention_args *a, cl_event *event)
{
    latent_launch p;
    clmla_status st = latent_args(cache, layer, a, "clmla_attention_latent", &p);
    if (st != CLMLA_SUCCESS)
        return st;
    return clmla_latent_attention_enqueue(cache, layer, &p, event);
}

clmla_status clmla_attention_latent_sparse(clmla_cache *cache, int layer, const clmla_latent_attention_args *a,
                                           cl_mem indices, size_t indices_offset, int topk, cl_event *event)
{
    static const char fn[] = "clmla_attention_latent_sparse";
    latent_launch p;
    clmla_status st = latent_args(cache, layer, a, fn, &p);
    if (st != CLMLA_SUCCESS)
        return st;
    clmla_context *ctx = cache->ctx;
    if (topk < 1 || topk > CLMLA_SPARSE_MAX_TOPK)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: topk %d is not in 1..%d", fn, topk, CLMLA_SPARSE_MAX_TOPK);
    if (!indices)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: indices is NULL (topk %d)", fn, topk);
    const long long entries = (long long)a->num_tokens * topk;
    if (entries + (long long)indices_offset > INT_MAX)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: indices_offset %zu + num_tokens %d * topk %d is past 2^31 elements", fn, indices_offset,
                          a->num_tokens, topk);
    /* the kernels read every entry: a buffer too small for them is refused, not read past */
    size_t bytes = 0;
    if (clGetMemObjectInfo(indices, CL_MEM_SIZE, sizeof(bytes), &bytes, NULL) != CL_SUCCESS)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: indices is not a valid buffer", fn);
    if ((unsigned long long)bytes < (unsigned long long)(entries + (long long)indices_offset) * sizeof(int32_t))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: indices holds %zu bytes, fewer than (indices_offset %zu + num_tokens %d * topk %d) int32",
                          fn, bytes, indices_offset, a->num_tokens, topk);
    p.indices = indices;
    p.indices_offset = indices_offset;
    p.topk = topk;
    return clmla_latent_attention_enqueue(cache, layer, &p, event);
}
