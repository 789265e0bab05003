/* Phase "decode": the attention of one new token per sequence over `ctx` cached tokens, for a
 * batch of sequences; no projections (what FlashMLA measures).
 *
 *   absorbed      clmla_attention_latent over the library's paged latent cache: q~ [B, H, rkv]
 *                 and q^R [B, H, dr] against rows [c^KV ; k^R] -> o-bar [B, H, rkv]
 *   sparse        clmla_attention_latent_sparse over the same cache (same rows, same queries):
 *                 each query token attends to topk random distinct positions of its context, in
 *                 random order (every position, then -1 padding, when topk >= its context)
 *   indexer       DeepSeek Sparse Attention's selection alone, clmla_index_select: per query token the
 *                 scores sum_h w_h ReLU(q_h . k_s) of every index key of its context (the cache's
 *                 index-key cache: f32 beside an f32 latent cache, else bf16, random) and their top
 *                 --topk; H_I x d_I from the shape's config, else DeepSeek-V3.2's 64 x 128. Its time
 *                 beside the sparse row's is the cost of a sparse decode step
 *   decompressed  per sequence: k^C, v^C = c^KV W^UKV^T (CLBlast SGEMM, [ctx, H*(dn+dv)]), then
 *                 the bench's MHA kernel with k = [k^C_h ; k^R] -> o [B, H, dv]
 *   mha           the baseline MLA replaces: the bench's MHA kernel over a full per-head cache
 *                 K [B, H, ctx, dq], V [B, H, ctx, dv] -> o [B, H, dv]
 * The MHA kernel (bench/kernels/mha_decode.cl) is mha_decode on GPUs and mha_decode_rows on CPU
 * devices, as the library picks its latent attention kernel. Inputs are random (uniform), made on
 * the device. */
#include "bench.h"

#include <clblast_c.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Keys below which a split costs more in its combine than it gains. */
#define MIN_SPLIT_TOKENS 256

typedef struct decode_state {
    bench_device *dev;
    const bench_shape *s;
    int batch, ctx, f16;   /* f16: the bench's own buffers (mha, decompressed) hold half */
    int q_len;             /* absorbed: new tokens per sequence, the last q_len of its ctx (causal) */
    clmla_cache_dtype dtype; /* the library's cache (absorbed) */
    /* absorbed and sparse */
    int topk;              /* sparse: entries per query token; 0 = absorbed */
    int index_heads, index_dim; /* indexer: H_I, d_I (0: not the indexer path) */
    clmla_index_select_args select;
    cl_mem index_q, index_w;
    int32_t *indices;      /* sparse: [T, topk] on the host, for the check */
    cl_mem indices_buf;
    clmla_cache *cache;
    int32_t *seq_ids;      /* [B] */
    clmla_latent_attention_args args;
    cl_mem q_latent, q_rope, block_table, token_seq, token_ctx;
    /* mha and decompressed */
    cl_mem q;              /* [B, H, dq] */
    cl_mem k, v;           /* mha: [B, H, ctx, dq], [B, H, ctx, dv] */
    cl_mem latent;         /* decompressed: [B, ctx, rkv + dr], cache dtype */
    cl_mem latent_f32;     /* decompressed with f16: one sequence as float32, [ctx, rkv + dr] */
    cl_mem w_kvb;          /* kv_b_proj [H*(dn+dv), rkv] */
    cl_mem kv_up;          /* [ctx, H*(dn+dv)]: one sequence's k^C and v^C */
    cl_mem part_out, part_lse, out;
    cl_kernel attn, combine, convert;
    /* paged (clmla_paged_attention over the cache's rows as a caller's memory): 1 device buffers,
       2 host memory used in place (aligned), 3 host memory copied (8 bytes past an alignment) */
    int paged;
    clmla_paged *paged_obj;
    clmla_paged_attention_args paged_args;
    cl_mem paged_q, paged_lens;
    void *host_block;      /* host copies: the cache (and q, table, lengths, out after it) */
    int rows;              /* mha_decode_rows (CPU devices): one work-item per split and head */
    int nt, splits, split_tokens, decompressed;
} decode_state;

static void state_free(decode_state *st)
{
    clmla_paged_destroy(st->paged_obj);
    bench_release(&st->paged_q);
    bench_release(&st->paged_lens);
    free(st->host_block);
    clmla_cache_destroy(st->cache);
    free(st->seq_ids);
    free(st->indices);
    bench_release(&st->indices_buf);
    cl_mem *bufs[] = {&st->q_latent, &st->q_rope, &st->block_table, &st->token_seq, &st->token_ctx, &st->q, &st->k,
                      &st->v, &st->latent, &st->latent_f32, &st->w_kvb, &st->kv_up, &st->part_out, &st->part_lse,
                      &st->out, &st->index_q, &st->index_w};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        bench_release(bufs[i]);
    if (st->attn)
        clReleaseKernel(st->attn);
    if (st->combine)
        clReleaseKernel(st->combine);
    if (st->convert)
        clReleaseKernel(st->convert);
}

static cl_mem upload_ints(bench_device *dev, const int32_t *v, size_t n, const char *what)
{
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(dev->cl_ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof(int32_t), (void *)v, &err);
    if (!m)
        fprintf(stderr, "clmla-bench: uploading %s failed: %s\n", what, clmla_status_string(err));
    return m;
}

/* ---- absorbed and sparse: the library --------------------------------------------------------- */

/* sparse: each token's index list, topk random distinct positions of its lens[t] keys in random
   order (a partial Fisher-Yates shuffle), or all of them then -1 when topk >= lens[t]. */
static int sparse_indices(decode_state *st, const int32_t *lens, int T, unsigned seed)
{
    const int topk = st->topk;
    st->indices = malloc((size_t)T * topk * sizeof(int32_t));
    int32_t *perm = malloc(((size_t)st->ctx + 1) * sizeof(int32_t));
    if (!st->indices || !perm) {
        free(perm);
        return 1;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 17u);
    for (int t = 0; t < T; t++) {
        const int n = lens[t], take = topk < n ? topk : n;
        for (int i = 0; i < n; i++)
            perm[i] = i;
        int32_t *list = st->indices + (size_t)t * topk;
        for (int i = 0; i < take; i++) {
            x ^= x << 13; /* xorshift64 */
            x ^= x >> 7;
            x ^= x << 17;
            const int j = i + (int)(x % (uint64_t)(n - i));
            const int32_t v = perm[j];
            perm[j] = perm[i];
            perm[i] = v;
            list[i] = v;
        }
        for (int i = take; i < topk; i++)
            list[i] = -1;
    }
    free(perm);
    st->indices_buf = upload_ints(st->dev, st->indices, (size_t)T * topk, "sparse indices");
    return st->indices_buf == NULL;
}

static int absorbed_setup(decode_state *st, int block_tokens, unsigned seed)
{
    bench_device *dev = st->dev;
    const bench_shape *s = st->s;
    const int blocks_per_seq = (st->ctx + block_tokens - 1) / block_tokens;
    const clmla_cache_dtype keys = st->dtype == CLMLA_CACHE_F32 ? CLMLA_CACHE_F32 : CLMLA_CACHE_BF16;
    clmla_cache_config cc = {1, s->rkv, s->dr, block_tokens, st->batch * blocks_per_seq,
                             st->dtype, st->index_dim, keys};
    if (clmla_cache_create(dev->ctx, &cc, &st->cache) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla-bench: %s\n", clmla_last_error(dev->ctx));
        return 1;
    }
    /* Cache rows come from a random float32 staging buffer, refilled for every chunk. */
    const int chunk = st->ctx < 8192 ? st->ctx : 8192;
    cl_mem staging = bench_buffer(dev, (size_t)chunk * s->row * sizeof(float), "cache staging rows");
    int32_t *table = calloc((size_t)st->batch * blocks_per_seq, sizeof(int32_t));
    const int T = st->batch * st->q_len; /* query tokens: q_len per sequence */
    int32_t *seqs = malloc((size_t)T * sizeof(int32_t)), *lens = malloc((size_t)T * sizeof(int32_t));
    st->seq_ids = malloc((size_t)st->batch * sizeof(int32_t));
    int rc = !staging || !table || !seqs || !lens || !st->seq_ids;
    for (int b = 0; !rc && b < st->batch; b++) {
        int32_t id = -1;
        rc = clmla_cache_seq_add(st->cache, &id) != CLMLA_SUCCESS ||
             clmla_cache_seq_reserve(st->cache, id, st->ctx) != CLMLA_SUCCESS;
        st->seq_ids[b] = id;
        for (int t = 0; !rc && t < st->ctx; t += chunk) {
            const int n = st->ctx - t < chunk ? st->ctx - t : chunk;
            rc = bench_fill(dev, staging, (size_t)n * s->row, 0, seed + 7919u * (unsigned)(b * 4096 + t / chunk), 1.0f) ||
                 clmla_cache_append_cl(st->cache, 0, id, n, staging, 0, s->row, staging, (size_t)s->rkv, s->row, NULL) !=
                     CLMLA_SUCCESS;
        }
        int owned = 0;
        if (!rc)
            rc = clmla_cache_seq_blocks(st->cache, id, table + (size_t)b * blocks_per_seq, blocks_per_seq, &owned) !=
                 CLMLA_SUCCESS;
        for (int i = 0; i < st->q_len; i++) { /* token i of q_len sees the keys up to itself */
            seqs[b * st->q_len + i] = b;
            lens[b * st->q_len + i] = st->ctx - st->q_len + 1 + i;
        }
    }
    if (rc && st->cache && *clmla_last_error(dev->ctx))
        fprintf(stderr, "clmla-bench: %s\n", clmla_last_error(dev->ctx));
    if (!rc) {
        st->block_table = upload_ints(dev, table, (size_t)st->batch * blocks_per_seq, "block table");
        st->token_seq = upload_ints(dev, seqs, (size_t)T, "token sequences");
        st->token_ctx = upload_ints(dev, lens, (size_t)T, "context lengths");
        const size_t nq = (size_t)T * s->H;
        st->q_latent = bench_buffer(dev, nq * s->rkv * sizeof(float), "q latent");
        st->q_rope = bench_buffer(dev, nq * s->dr * sizeof(float), "q rope");
        st->out = bench_buffer(dev, nq * s->rkv * sizeof(float), "latent output");
        rc = !st->block_table || !st->token_seq || !st->token_ctx || !st->q_latent || !st->q_rope || !st->out ||
             bench_fill(dev, st->q_latent, nq * s->rkv, 0, seed + 1, 1.0f) ||
             bench_fill(dev, st->q_rope, nq * s->dr, 0, seed + 2, 1.0f);
    }
    if (!rc && st->topk > 0 && !st->index_dim)
        rc = sparse_indices(st, lens, T, seed);
    if (!rc && st->index_dim) { /* random index keys (bf16: random half bits), queries and gates */
        cl_mem kb = NULL;
        const size_t nk = (size_t)st->batch * blocks_per_seq * block_tokens * st->index_dim;
        const size_t nq = (size_t)T * st->index_heads;
        rc = clmla_cache_index_buffer(st->cache, 0, &kb) != CLMLA_SUCCESS ||
             bench_fill(dev, kb, nk, keys == CLMLA_CACHE_BF16, seed + 3, 1.0f);
        st->index_q = rc ? NULL : bench_buffer(dev, nq * st->index_dim * sizeof(float), "indexer queries");
        st->index_w = rc ? NULL : bench_buffer(dev, nq * sizeof(float), "indexer gates");
        st->indices_buf = rc ? NULL : bench_buffer(dev, (size_t)T * st->topk * sizeof(int32_t), "selected positions");
        rc = rc || !st->index_q || !st->index_w || !st->indices_buf ||
             bench_fill(dev, st->index_q, nq * st->index_dim, 0, seed + 4, 1.0f) ||
             bench_fill(dev, st->index_w, nq, 0, seed + 5, 1.0f);
    }
    rc = rc || clFinish(dev->queue) != CL_SUCCESS;
    bench_release(&staging);
    free(table);
    free(seqs);
    free(lens);
    if (rc)
        return 1;
    /* query_len: a sequence's new tokens together (folded where the kernel can) */
    st->args = (clmla_latent_attention_args){
        .num_tokens = st->batch * st->q_len, .num_heads = s->H, .softmax_scale = s->scale, .q_latent = st->q_latent,
        .q_rope = st->q_rope, .block_table = st->block_table, .max_blocks_per_seq = blocks_per_seq,
        .token_seq = st->token_seq, .token_ctx_len = st->token_ctx, .max_ctx_len = st->ctx, .query_len = st->q_len,
        .out = st->out};
    st->select = (clmla_index_select_args){
        .num_tokens = st->args.num_tokens, .num_heads = st->index_heads, .top_k = st->topk, .q = st->index_q,
        .weights = st->index_w, .block_table = st->block_table, .max_blocks_per_seq = blocks_per_seq,
        .token_seq = st->token_seq, .token_ctx_len = st->token_ctx, .max_ctx_len = st->ctx,
        .indices = st->indices_buf};
    return 0;
}

/* The paged path's call over the cache absorbed_setup filled: its layer buffer as the caller's
   cache, q as FlashMLA gives it ([T, H, rkv + dr]), the sequences' lengths, causal over q_len new
   tokens; the host forms copy all of it into one host block (the cache first, at an alignment of
   the device's base address alignment, or 8 bytes past it). */
static int paged_setup(decode_state *st, int block_tokens, unsigned seed)
{
    bench_device *dev = st->dev;
    const bench_shape *s = st->s;
    const clmla_paged_config pc = {.kv_lora_rank = s->rkv, .rope_dim = s->dr, .block_size = block_tokens,
                                   .dtype = st->dtype};
    clmla_paged_info info;
    cl_mem rows = NULL;
    if (clmla_paged_create(dev->ctx, &pc, &st->paged_obj) != CLMLA_SUCCESS ||
        clmla_paged_get_info(st->paged_obj, &info) != CLMLA_SUCCESS ||
        clmla_cache_layer_buffer(st->cache, 0, &rows) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla-bench: %s\n", clmla_last_error(dev->ctx));
        return 1;
    }
    const int T = st->batch * st->q_len, blocks = st->args.max_blocks_per_seq * st->batch;
    const size_t nq = (size_t)T * s->H * s->row;
    int32_t *lens = malloc((size_t)st->batch * sizeof(int32_t));
    for (int b = 0; lens && b < st->batch; b++)
        lens[b] = st->ctx;
    st->paged_q = bench_buffer(dev, nq * sizeof(float), "paged q");
    st->paged_lens = lens ? upload_ints(dev, lens, (size_t)st->batch, "sequence lengths") : NULL;
    if (!lens || !st->paged_q || !st->paged_lens || bench_fill(dev, st->paged_q, nq, 0, seed + 6, 1.0f)) {
        free(lens);
        return 1;
    }
    clmla_paged_attention_args *a = &st->paged_args;
    *a = (clmla_paged_attention_args){
        .batch = st->batch, .seqlen_q = st->q_len, .num_heads = s->H, .softmax_scale = s->scale, .causal = 1,
        .num_blocks = blocks, .max_blocks = st->args.max_blocks_per_seq, .max_seqlen = st->ctx, .q.mem = st->paged_q,
        .kv_cache.mem = rows, .block_table.mem = st->block_table, .cache_seqlens.mem = st->paged_lens,
        .out.mem = st->out};
    if (st->paged == 1) {
        free(lens);
        return 0;
    }
    /* host memory: the cache, then q, the table, the lengths and out, each at an aligned offset */
    const size_t al = info.host_alignment > 64 ? info.host_alignment : 64;
    const size_t cache_bytes = (size_t)blocks * info.block_bytes, up = al - 1;
    const size_t q_at = (cache_bytes + 8 + up) / al * al, t_at = (q_at + nq * 4 + up) / al * al;
    const size_t l_at = (t_at + (size_t)blocks * 4 + up) / al * al, o_at = (l_at + (size_t)st->batch * 4 + up) / al * al;
    const size_t total = o_at + (size_t)T * s->H * s->rkv * 4;
    char *h = st->host_block = aligned_alloc(al, (total + up) / al * al);
    const size_t shift = st->paged == 3 ? 8 : 0;
    int rc = !h || clEnqueueReadBuffer(dev->queue, rows, CL_TRUE, 0, cache_bytes, h + shift, 0, NULL, NULL) != CL_SUCCESS ||
             clEnqueueReadBuffer(dev->queue, st->paged_q, CL_TRUE, 0, nq * 4, h + q_at, 0, NULL, NULL) != CL_SUCCESS ||
             clEnqueueReadBuffer(dev->queue, st->block_table, CL_TRUE, 0, (size_t)blocks * 4, h + t_at, 0, NULL, NULL) !=
                 CL_SUCCESS;
    if (!rc)
        memcpy(h + l_at, lens, (size_t)st->batch * 4);
    free(lens);
    const clmla_buffer cache = {NULL, h + shift, 0, cache_bytes}, q = {NULL, h + q_at, 0, nq * 4};
    const clmla_buffer table = {NULL, h + t_at, 0, (size_t)blocks * 4}, ln = {NULL, h + l_at, 0, (size_t)st->batch * 4};
    const clmla_buffer out = {NULL, h + o_at, 0, (size_t)T * s->H * s->rkv * 4};
    a->kv_cache = cache;
    a->q = q;
    a->block_table = table;
    a->cache_seqlens = ln;
    a->out = out;
    return rc;
}

static int absorbed_enqueue(void *user, cl_event *last)
{
    decode_state *st = user;
    if (st->paged) {
        /* host memory: the call returns when done, copies included; the wall clock times it */
        const clmla_status status = clmla_paged_attention(st->paged_obj, &st->paged_args, st->paged == 1 ? last : NULL);
        if (status != CLMLA_SUCCESS) {
            fprintf(stderr, "clmla-bench: %s\n", clmla_last_error(st->dev->ctx));
            return 1;
        }
        return 0;
    }
    const clmla_status status = st->index_dim ? clmla_index_select(st->cache, 0, &st->select, last)
                                : st->topk > 0 ? clmla_attention_latent_sparse(st->cache, 0, &st->args, st->indices_buf, 0,
                                                                             st->topk, last)
                                             : clmla_attention_latent(st->cache, 0, &st->args, last);
    if (status != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla-bench: %s\n", clmla_last_error(st->dev->ctx));
        return 1;
    }
    return 0;
}

/* ---- mha and decompressed: the bench's kernel ------------------------------------------------- */

static int attn_kernels(decode_state *st, int kv_f16, int groups)
{
    bench_device *dev = st->dev;
    const bench_shape *s = st->s;
    /* As the library chooses its latent attention kernel: the row-walking one on CPUs. */
    st->rows = dev->info.kind == CLMLA_DEVICE_KIND_CPU;
    int nt = st->rows ? 1 : 64;
    while (nt > 1 && (size_t)nt > dev->info.max_work_group_size)
        nt /= 2;
    for (;;) {
        char options[160];
        snprintf(options, sizeof(options), "-D DN=%d -D DR=%d -D DV=%d -D NT=%d%s", s->dn, s->dr, s->dv, nt,
                 kv_f16 ? " -D KV_F16" : "");
        st->attn = bench_kernel(dev, "mha_decode", options, st->rows ? "mha_decode_rows" : "mha_decode");
        st->combine = st->attn ? bench_kernel(dev, "mha_decode", options, "mha_combine") : NULL;
        if (!st->attn || !st->combine)
            return 1;
        size_t limit = 0;
        clGetKernelWorkGroupInfo(st->attn, dev->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit), &limit, NULL);
        if (limit >= (size_t)nt || nt == 1)
            break;
        clReleaseKernel(st->attn);
        clReleaseKernel(st->combine);
        st->attn = st->combine = NULL;
        nt /= 2;
    }
    st->nt = nt;
    /* As the library sizes its split: a few work-groups per compute unit. */
    const int target = 4 * (int)(dev->info.compute_units ? dev->info.compute_units : 1);
    st->splits = 1;
    if (groups < target && st->ctx > MIN_SPLIT_TOKENS) {
        const int want = (target + groups - 1) / groups, most = (st->ctx + MIN_SPLIT_TOKENS - 1) / MIN_SPLIT_TOKENS;
        st->splits = want < most ? want : most;
    }
    st->split_tokens = (st->ctx + st->splits - 1) / st->splits;
    st->splits = (st->ctx + st->split_tokens - 1) / st->split_tokens;
    const size_t rows = (size_t)st->batch * s->H;
    st->out = bench_buffer(dev, rows * s->dv * sizeof(float), "attention output");
    st->part_lse = bench_buffer(dev, rows * st->splits * sizeof(float), "split log-sum-exp");
    if (st->splits > 1)
        st->part_out = bench_buffer(dev, rows * st->splits * s->dv * sizeof(float), "split outputs");
    return !st->out || !st->part_lse || (st->splits > 1 && !st->part_out);
}

typedef struct operand {
    cl_mem buffer;
    int offset, seq, head, token; /* elements */
} operand;

static int set_attn_args(decode_state *st, operand kn, operand kr, operand v, int b0)
{
    cl_kernel k = st->attn;
    cl_mem part_out = st->splits > 1 ? st->part_out : st->out;
    int i = 0;
    cl_int err = clSetKernelArg(k, i++, sizeof(cl_mem), &st->q);
    const operand *ops[] = {&kn, &kr, &v};
    for (int o = 0; o < 3; o++) {
        err |= clSetKernelArg(k, i++, sizeof(cl_mem), &ops[o]->buffer);
        err |= clSetKernelArg(k, i++, sizeof(int), &ops[o]->offset);
        err |= clSetKernelArg(k, i++, sizeof(int), &ops[o]->seq);
        err |= clSetKernelArg(k, i++, sizeof(int), &ops[o]->head);
        err |= clSetKernelArg(k, i++, sizeof(int), &ops[o]->token);
    }
    err |= clSetKernelArg(k, i++, sizeof(int), &st->ctx);
    err |= clSetKernelArg(k, i++, sizeof(int), &st->split_tokens);
    err |= clSetKernelArg(k, i++, sizeof(float), &st->s->scale);
    err |= clSetKernelArg(k, i++, sizeof(int), &b0);
    err |= clSetKernelArg(k, i++, sizeof(cl_mem), &part_out);
    err |= clSetKernelArg(k, i++, sizeof(cl_mem), &st->part_lse);
    if (err != CL_SUCCESS)
        fprintf(stderr, "clmla-bench: clSetKernelArg(mha_decode) failed\n");
    return err != CL_SUCCESS;
}

static int enqueue_attn(decode_state *st, int sequences, cl_event *last)
{
    /* mha_decode: NT items per (split, head, sequence); mha_decode_rows: one (nt = 1) */
    const size_t global[3] = {(size_t)st->nt * st->splits, (size_t)st->s->H, (size_t)sequences};
    const size_t local[3] = {(size_t)st->nt, 1, 1};
    cl_int err = clEnqueueNDRangeKernel(st->dev->queue, st->attn, 3, NULL, global, local, 0, NULL, last);
    if (err != CL_SUCCESS)
        fprintf(stderr, "clmla-bench: enqueue mha_decode failed (%s)\n", clmla_status_string(err));
    return err != CL_SUCCESS;
}

static int enqueue_combine(decode_state *st, cl_event *last)
{
    cl_kernel c = st->combine;
    cl_int err = clSetKernelArg(c, 0, sizeof(cl_mem), &st->part_out);
    err |= clSetKernelArg(c, 1, sizeof(cl_mem), &st->part_lse);
    err |= clSetKernelArg(c, 2, sizeof(int), &st->splits);
    err |= clSetKernelArg(c, 3, sizeof(cl_mem), &st->out);
    const size_t global[3] = {(size_t)st->s->dv, (size_t)st->s->H, (size_t)st->batch};
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(st->dev->queue, c, 3, NULL, global, NULL, 0, NULL, last);
    if (err != CL_SUCCESS)
        fprintf(stderr, "clmla-bench: enqueue mha_combine failed (%s)\n", clmla_status_string(err));
    return err != CL_SUCCESS;
}

static int mha_setup(decode_state *st, unsigned seed)
{
    bench_device *dev = st->dev;
    const bench_shape *s = st->s;
    const size_t elem = st->f16 ? 2 : 4;
    const size_t nk = (size_t)st->batch * s->H * st->ctx * s->dq, nv = (size_t)st->batch * s->H * st->ctx * s->dv;
    st->q = bench_buffer(dev, (size_t)st->batch * s->H * s->dq * sizeof(float), "queries");
    st->k = bench_buffer(dev, nk * elem, "MHA key cache");
    st->v = st->k ? bench_buffer(dev, nv * elem, "MHA value cache") : NULL;
    if (!st->q || !st->k || !st->v || bench_fill(dev, st->q, (size_t)st->batch * s->H * s->dq, 0, seed + 3, 1.0f) ||
        bench_fill(dev, st->k, nk, st->f16, seed + 4, 1.0f) || bench_fill(dev, st->v, nv, st->f16, seed + 5, 1.0f) ||
        attn_kernels(st, st->f16, st->batch * s->H))
        return 1;
    const int ctx = st->ctx;
    operand kn = {st->k, 0, s->H * ctx * s->dq, ctx * s->dq, s->dq};
    operand kr = {st->k, s->dn, s->H * ctx * s->dq, ctx * s->dq, s->dq};
    operand v = {st->v, 0, s->H * ctx * s->dv, ctx * s->dv, s->dv};
    return set_attn_args(st, kn, kr, v, 0) || clFinish(dev->queue) != CL_SUCCESS;
}

static int mha_enqueue(void *user, cl_event *last)
{
    decode_state *st = user;
    if (st->splits == 1)
        return enqueue_attn(st, st->batch, last);
    return enqueue_attn(st, st->batch, NULL) || enqueue_combine(st, last);
}

static int decompressed_setup(decode_state *st, unsigned seed)
{
    bench_device *dev = st->dev;
    const bench_shape *s = st->s;
    const size_t elem = st->f16 ? 2 : 4, n_latent = (size_t)st->batch * st->ctx * s->row;
    const size_t n_w = (size_t)s->H * (s->dn + s->dv) * s->rkv;
    st->decompressed = 1;
    st->q = bench_buffer(dev, (size_t)st->batch * s->H * s->dq * sizeof(float), "queries");
    st->latent = bench_buffer(dev, n_latent * elem, "latent cache");
    st->w_kvb = bench_buffer(dev, n_w * sizeof(float), "kv_b_proj");
    st->kv_up = bench_buffer(dev, (size_t)st->ctx * s->H * (s->dn + s->dv) * sizeof(float), "up-projected k, v");
    if (st->f16)
        st->latent_f32 = bench_buffer(dev, (size_t)st->ctx * s->row * sizeof(float), "latent rows as float32");
    if (!st->q || !st->latent || !st->w_kvb || !st->kv_up || (st->f16 && !st->latent_f32) ||
        bench_fill(dev, st->q, (size_t)st->batch * s->H * s->dq, 0, seed + 3, 1.0f) ||
        bench_fill(dev, st->latent, n_latent, st->f16, seed + 6, 1.0f) ||
        bench_fill(dev, st->w_kvb, n_w, 0, seed + 7, 1.0f / sqrtf((float)s->rkv)) || attn_kernels(st, 0, s->H))
        return 1;
    if (st->f16 && !(st->convert = bench_kernel(dev, "mha_decode", "", "half_to_float")))
        return 1;
    return clFinish(dev->queue) != CL_SUCCESS;
}

static int decompressed_enqueue(void *user, cl_event *last)
{
    decode_state *st = user;
    const bench_shape *s = st->s;
    const int ctx = st->ctx, up = s->H * (s->dn + s->dv);
    for (int b = 0; b < st->batch; b++) {
        const int last_launch = b == st->batch - 1 && st->splits == 1;
        cl_mem src = st->latent;
        int src_offset = b * ctx * s->row;
        if (st->f16) {
            const int n = ctx * s->row;
            cl_int err = clSetKernelArg(st->convert, 0, sizeof(cl_mem), &st->latent);
            err |= clSetKernelArg(st->convert, 1, sizeof(int), &src_offset);
            err |= clSetKernelArg(st->convert, 2, sizeof(cl_mem), &st->latent_f32);
            err |= clSetKernelArg(st->convert, 3, sizeof(int), &n);
            size_t global = (size_t)n < ((size_t)1 << 20) ? (size_t)n : ((size_t)1 << 20);
            if (err == CL_SUCCESS)
                err = clEnqueueNDRangeKernel(st->dev->queue, st->convert, 1, NULL, &global, NULL, 0, NULL, NULL);
            if (err != CL_SUCCESS) {
                fprintf(stderr, "clmla-bench: half_to_float failed (%s)\n", clmla_status_string(err));
                return 1;
            }
            src = st->latent_f32;
            src_offset = 0;
        }
        /* [k^C v^C] = c^KV W_kvb^T: [ctx, rkv] (row stride rkv+dr) x [rkv, H*(dn+dv)] */
        CLBlastStatusCode bs = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, (size_t)ctx,
                                            (size_t)up, (size_t)s->rkv, 1.0f, src, (size_t)src_offset, (size_t)s->row,
                                            st->w_kvb, 0, (size_t)s->rkv, 0.0f, st->kv_up, 0, (size_t)up,
                                            &st->dev->queue, NULL);
        if (bs != CLBlastSuccess) {
            fprintf(stderr, "clmla-bench: CLBlastSgemm (up-projection) failed: %s\n", clmla_status_string(bs));
            return 1;
        }
        operand kn = {st->kv_up, 0, 0, s->dn + s->dv, up};
        operand kr = {src, src_offset + s->rkv, 0, 0, s->row};
        operand v = {st->kv_up, s->dn, 0, s->dn + s->dv, up};
        if (set_attn_args(st, kn, kr, v, b) || enqueue_attn(st, 1, last_launch ? last : NULL))
            return 1;
    }
    return st->splits > 1 ? enqueue_combine(st, last) : 0;
}

/* ---- the float64 host check ----------------------------------------------------------------- */

static float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    float f;
    if (exponent == 0)
        f = ldexpf((float)mantissa, -24);
    else if (exponent == 31)
        f = mantissa ? NAN : INFINITY;
    else
        f = ldexpf((float)(mantissa | 0x400), (int)exponent - 25);
    return sign ? -f : f;
}

/* A device buffer of n values (float32, or f16 when half) as float32 on the host. */
static float *read_floats(bench_device *dev, cl_mem m, size_t n, int half)
{
    float *out = malloc(n * sizeof(float));
    uint16_t *raw = half ? malloc(n * sizeof(uint16_t)) : NULL;
    if (!out || (half && !raw) ||
        clEnqueueReadBuffer(dev->queue, m, CL_TRUE, 0, n * (half ? 2 : 4), half ? (void *)raw : (void *)out, 0, NULL,
                            NULL) != CL_SUCCESS) {
        free(out);
        free(raw);
        return NULL;
    }
    for (size_t i = 0; half && i < n; i++)
        out[i] = half_to_float(raw[i]);
    free(raw);
    return out;
}

/* softmax_j(scale * q . k_j) weighted sum of v_j, in float64: k_j = key + j*key_stride (dk
   values), v_j = value + j*value_stride (dv values). */
static void host_attention(const double *q, int dk, const float *key, size_t key_stride, const float *value,
                           size_t value_stride, int dv, int n, double scale, double *out)
{
    double *scores = malloc((size_t)n * sizeof(double));
    if (!scores)
        return;
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) {
        double dot = 0;
        for (int i = 0; i < dk; i++)
            dot += q[i] * key[(size_t)j * key_stride + i];
        scores[j] = scale * dot;
        if (scores[j] > m)
            m = scores[j];
    }
    for (int d = 0; d < dv; d++)
        out[d] = 0;
    for (int j = 0; j < n; j++) {
        const double w = exp(scores[j] - m);
        sum += w;
        for (int d = 0; d < dv; d++)
            out[d] += w * value[(size_t)j * value_stride + d];
    }
    for (int d = 0; d < dv; d++)
        out[d] /= sum;
    free(scores);
}

/* max |device - host| / max |host| over the whole output. */
static double check_decode(decode_state *st, int absorbed)
{
    bench_device *dev = st->dev;
    const bench_shape *s = st->s;
    const int B = st->batch, H = s->H, ctx = st->ctx, out_dim = absorbed ? s->rkv : s->dv;
    const int dk = absorbed ? s->row : s->dq, QL = absorbed ? st->q_len : 1, T = B * QL;
    float *got = read_floats(dev, st->out, (size_t)T * H * out_dim, 0);
    float *q = NULL, *q_rope = NULL, *k = NULL, *v = NULL, *latent = NULL, *w = NULL;
    float *keys = malloc((size_t)ctx * dk * sizeof(float)), *values = malloc((size_t)ctx * out_dim * sizeof(float));
    double *qd = malloc((size_t)dk * sizeof(double)), *ref = malloc((size_t)out_dim * sizeof(double));
    /* sparse: the keys and values a token's list names, gathered (duplicates as listed) */
    const int topk = st->topk;
    float *sel_keys = topk ? malloc((size_t)topk * dk * sizeof(float)) : NULL;
    float *sel_values = topk ? malloc((size_t)topk * out_dim * sizeof(float)) : NULL;
    double err = -1, worst = 0, largest = 0;
    if (!got || !keys || !values || !qd || !ref || (topk && (!sel_keys || !sel_values)))
        goto done;
    if (absorbed) {
        q = read_floats(dev, st->q_latent, (size_t)T * H * s->rkv, 0);
        q_rope = read_floats(dev, st->q_rope, (size_t)T * H * s->dr, 0);
        if (!q || !q_rope)
            goto done;
    } else {
        q = read_floats(dev, st->q, (size_t)B * H * s->dq, 0);
        if (!q)
            goto done;
        if (st->decompressed) {
            latent = read_floats(dev, st->latent, (size_t)B * ctx * s->row, st->f16);
            w = read_floats(dev, st->w_kvb, (size_t)H * (s->dn + s->dv) * s->rkv, 0);
            if (!latent || !w)
                goto done;
        } else {
            k = read_floats(dev, st->k, (size_t)B * H * ctx * s->dq, st->f16);
            v = read_floats(dev, st->v, (size_t)B * H * ctx * s->dv, st->f16);
            if (!k || !v)
                goto done;
        }
    }
    for (int b = 0; b < B; b++) {
        if (absorbed) {
            /* keys are the cache rows [c^KV ; k^R]; values their first rkv values */
            float *c = malloc((size_t)ctx * s->rkv * sizeof(float)), *kr = malloc((size_t)ctx * s->dr * sizeof(float));
            const int ok = c && kr && clmla_cache_read(st->cache, 0, st->seq_ids[b], 0, ctx, c, kr) == CLMLA_SUCCESS;
            for (int j = 0; ok && j < ctx; j++) {
                memcpy(keys + (size_t)j * dk, c + (size_t)j * s->rkv, (size_t)s->rkv * sizeof(float));
                memcpy(keys + (size_t)j * dk + s->rkv, kr + (size_t)j * s->dr, (size_t)s->dr * sizeof(float));
                memcpy(values + (size_t)j * out_dim, c + (size_t)j * s->rkv, (size_t)s->rkv * sizeof(float));
            }
            free(c);
            free(kr);
            if (!ok)
                goto done;
        }
        for (int th = 0; th < QL * H; th++) {
            const int t = b * QL + th / H, h = th % H;
            int n_keys = ctx - QL + 1 + th / H;
            const float *key = keys, *value = values;
            size_t key_stride = (size_t)dk, value_stride = (size_t)out_dim;
            if (topk) {
                const int32_t *list = st->indices + (size_t)t * topk;
                int n = 0;
                for (int i = 0; i < topk; i++)
                    if (list[i] >= 0 && list[i] < n_keys) {
                        memcpy(sel_keys + (size_t)n * dk, keys + (size_t)list[i] * dk, (size_t)dk * sizeof(float));
                        memcpy(sel_values + (size_t)n * out_dim, values + (size_t)list[i] * out_dim,
                               (size_t)out_dim * sizeof(float));
                        n++;
                    }
                key = sel_keys;
                value = sel_values;
                n_keys = n;
            }
            if (absorbed) {
                for (int i = 0; i < s->rkv; i++)
                    qd[i] = q[((size_t)t * H + h) * s->rkv + i];
                for (int i = 0; i < s->dr; i++)
                    qd[s->rkv + i] = q_rope[((size_t)t * H + h) * s->dr + i];
            } else {
                for (int i = 0; i < s->dq; i++)
                    qd[i] = q[((size_t)b * H + h) * s->dq + i];
            }
            if (!absorbed && st->decompressed) {
                /* k = [W^UK_h c ; k^R], v = W^UV_h c for every key of sequence b */
                const float *wk = w + (size_t)h * (s->dn + s->dv) * s->rkv, *wv = wk + (size_t)s->dn * s->rkv;
                for (int j = 0; j < ctx; j++) {
                    const float *row = latent + ((size_t)b * ctx + j) * s->row;
                    for (int i = 0; i < s->dn; i++) {
                        double acc = 0;
                        for (int r = 0; r < s->rkv; r++)
                            acc += (double)wk[(size_t)i * s->rkv + r] * row[r];
                        keys[(size_t)j * dk + i] = (float)acc;
                    }
                    for (int i = 0; i < s->dr; i++)
                        keys[(size_t)j * dk + s->dn + i] = row[s->rkv + i];
                    for (int i = 0; i < s->dv; i++) {
                        double acc = 0;
                        for (int r = 0; r < s->rkv; r++)
                            acc += (double)wv[(size_t)i * s->rkv + r] * row[r];
                        values[(size_t)j * out_dim + i] = (float)acc;
                    }
                }
            } else if (!absorbed) {
                key = k + ((size_t)b * H + h) * ctx * s->dq;
                value = v + ((size_t)b * H + h) * ctx * s->dv;
            }
            host_attention(qd, dk, key, key_stride, value, value_stride, out_dim, n_keys, s->scale, ref);
            for (int d = 0; d < out_dim; d++) {
                const double diff = fabs(got[((size_t)t * H + h) * out_dim + d] - ref[d]);
                if (diff > worst)
                    worst = diff;
                if (fabs(ref[d]) > largest)
                    largest = fabs(ref[d]);
            }
        }
    }
    err = largest > 0 ? worst / largest : worst;
done:
    free(got);
    free(q);
    free(q_rope);
    free(k);
    free(v);
    free(latent);
    free(w);
    free(keys);
    free(values);
    free(qd);
    free(ref);
    free(sel_keys);
    free(sel_values);
    return err;
}

/* indexer: every token's selection against float64 scores of the keys the cache holds: the worst
   amount by which an unselected visible position outscores a selected one, relative to the largest
   score (0 when the selection is exact; ties may go either way within rounding), or 1 for a
   malformed list (a position twice or out of range, wrong padding). -1 when a read fails. */
static double check_indexer(decode_state *st)
{
    bench_device *dev = st->dev;
    const int QL = st->q_len, T = st->batch * QL, HI = st->index_heads, dI = st->index_dim, K = st->topk;
    float *q = read_floats(dev, st->index_q, (size_t)T * HI * dI, 0), *w = read_floats(dev, st->index_w, (size_t)T * HI, 0);
    float *keys = malloc((size_t)st->ctx * dI * sizeof(float));
    double *score = malloc((size_t)st->ctx * sizeof(double));
    int32_t *got = malloc((size_t)T * K * sizeof(int32_t));
    char *mark = malloc((size_t)st->ctx);
    double err = -1;
    if (q && w && keys && score && got && mark &&
        clEnqueueReadBuffer(dev->queue, st->indices_buf, CL_TRUE, 0, (size_t)T * K * sizeof(int32_t), got, 0, NULL,
                            NULL) == CL_SUCCESS) {
        err = 0;
        for (int b = 0; b < st->batch && err >= 0; b++) {
            if (clmla_cache_read_index(st->cache, 0, st->seq_ids[b], 0, st->ctx, keys) != CLMLA_SUCCESS) {
                err = -1;
                break;
            }
            for (int i = 0; i < QL; i++) {
                const int t = b * QL + i, n = st->ctx - QL + 1 + i, take = K < n ? K : n;
                double top = 0;
                for (int p = 0; p < n; p++) {
                    double sum = 0;
                    for (int h = 0; h < HI; h++) {
                        double d = 0;
                        for (int j = 0; j < dI; j++)
                            d += (double)q[((size_t)t * HI + h) * dI + j] * keys[(size_t)p * dI + j];
                        sum += (double)w[(size_t)t * HI + h] * (d > 0 ? d : 0);
                    }
                    score[p] = sum;
                    top = fabs(sum) > top ? fabs(sum) : top;
                }
                memset(mark, 0, (size_t)(n > 0 ? n : 0));
                double low = INFINITY, high = -INFINITY;
                for (int e = 0; e < K; e++) {
                    const int32_t p = got[(size_t)t * K + e];
                    if (e >= take ? p != -1 : (p < 0 || p >= n || mark[p]))
                        return free(q), free(w), free(keys), free(score), free(got), free(mark), 1.0;
                    if (e < take) {
                        mark[p] = 1;
                        low = score[p] < low ? score[p] : low;
                    }
                }
                for (int p = 0; p < n; p++)
                    if (!mark[p])
                        high = score[p] > high ? score[p] : high;
                if (take < n && high > low && top > 0)
                    err = (high - low) / top > err ? (high - low) / top : err;
            }
        }
    }
    free(q), free(w), free(keys), free(score), free(got), free(mark);
    return err;
}

/* ---- the phase ------------------------------------------------------------------------------- */

static int too_big(const bench_case *c, bench_row *row, double total, double largest, double elements)
{
    const bench_device *dev = c->dev;
    if (total > (double)dev->memory_budget)
        snprintf(row->note, sizeof(row->note), "needs %.0f MiB, more than the %.0f MiB budget (--max-mem)",
                 total / 1048576.0, dev->memory_budget / 1048576.0);
    else if (largest > (double)dev->info.max_alloc_bytes)
        snprintf(row->note, sizeof(row->note), "one buffer of %.0f MiB, more than the device's largest allocation (%.0f MiB)",
                 largest / 1048576.0, dev->info.max_alloc_bytes / 1048576.0);
    else if (elements >= (double)INT_MAX)
        snprintf(row->note, sizeof(row->note), "a buffer of 2^31 elements or more (int indexing)");
    else
        return 0;
    return 1;
}

int bench_decode(const bench_case *c, bench_row *row)
{
    const bench_shape *s = c->shape;
    const int B = c->batch, ctx = c->ctx, f16 = c->dtype == CLMLA_CACHE_F16;
    const size_t elem = c->dtype == CLMLA_CACHE_F32 ? 4 : 2;
    const int mha = strcmp(c->path, "mha") == 0, decompressed = strcmp(c->path, "decompressed") == 0;
    const int sparse = strcmp(c->path, "sparse") == 0, indexer = strcmp(c->path, "indexer") == 0;
    const int paged = strcmp(c->path, "paged") == 0 ? 1 : strcmp(c->path, "paged-host") == 0 ? 2
                      : strcmp(c->path, "paged-copy") == 0 ? 3 : 0;
    /* absorbed: the library's latent attention, dense or (sparse) over index lists; the indexer
       and the paged calls set up the same cache and tables */
    const int absorbed = strcmp(c->path, "absorbed") == 0 || strcmp(c->path, "auto") == 0 || sparse || indexer || paged;
    const int HI = s->config.index_n_heads > 0 ? s->config.index_n_heads : 64;
    const int dI = s->config.index_n_heads > 0 ? s->config.index_head_dim : 128;
    if (!absorbed && (c->dtype == CLMLA_CACHE_BF16 || c->dtype == CLMLA_CACHE_FP8)) {
        snprintf(row->note, sizeof(row->note), "%s: the bench's own %s kernels read f32 or f16 only",
                 c->dtype == CLMLA_CACHE_FP8 ? "fp8" : "bf16", c->path);
        return -1;
    }
    const int QL = c->q_len > 0 ? c->q_len : 1;
    if (!absorbed && QL > 1) {
        snprintf(row->note, sizeof(row->note), "q-len %d: the absorbed path only", QL);
        return -1;
    }
    if (QL > ctx) {
        snprintf(row->note, sizeof(row->note), "q-len %d is more than the context %d", QL, ctx);
        return -1;
    }
    row->q_len = QL;
    snprintf(row->path, sizeof(row->path), "%s",
             sparse ? "sparse" : indexer ? "indexer" : paged ? c->path : absorbed ? "absorbed" : c->path);
    row->topk = sparse || indexer ? c->topk : 0;
    row->tokens = (double)B * QL;
    row->cache_bytes = mha ? bench_mha_cache_bytes(s, B, ctx, elem) : bench_mla_cache_bytes(s, B, ctx, c->dtype);
    row->mha_cache_bytes = bench_mha_cache_bytes(s, B, ctx, elem);
    const double nq = (double)B * QL * s->H;
    if (absorbed) {
        /* token i of QL sees ctx - QL + 1 + i keys; the cache counts once per sequence, as a kernel
           that reads each row once for all of a sequence's tokens would */
        row->flops = (double)B * ((double)QL * ctx - (double)QL * (QL - 1) / 2) * bench_pair_flops(s, 1);
        row->bytes = row->cache_bytes + nq * s->row * 4 + nq * s->rkv * 4;
        if (sparse) {
            /* each token reads the rows its list names, min(topk, its keys), and its list; the
               cache column is the rows the longest list reads per sequence */
            double pairs = 0;
            for (int i = 0; i < QL; i++)
                pairs += c->topk < ctx - QL + 1 + i ? c->topk : ctx - QL + 1 + i;
            const int most = c->topk < ctx ? c->topk : ctx;
            row->cache_bytes = bench_mla_cache_bytes(s, B, most, c->dtype);
            row->flops = (double)B * pairs * bench_pair_flops(s, 1);
            row->bytes = bench_mla_cache_bytes(s, 1, 1, c->dtype) * B * pairs + nq * s->row * 4 + nq * s->rkv * 4 +
                         (double)B * QL * c->topk * 4;
        }
        if (indexer) {
            /* per sequence the keys once (f32, or bf16 beside a 16-bit or fp8 latent cache); per query
               token and visible key 2 H_I d_I + 2 H_I FLOPs and a score written and read back */
            const double kb = c->dtype == CLMLA_CACHE_F32 ? 4 : 2;
            double pairs = 0;
            for (int i = 0; i < QL; i++)
                pairs += ctx - QL + 1 + i;
            row->cache_bytes = (double)B * ctx * dI * kb;
            row->flops = (double)B * pairs * (2.0 * HI * dI + 2.0 * HI);
            row->bytes = row->cache_bytes + (double)B * pairs * 8 + (double)B * QL * (HI * dI + HI + c->topk) * 4;
            snprintf(row->note, sizeof(row->note), "H_I %d x d_I %d, %s keys", HI, dI, kb == 4 ? "f32" : "bf16");
        }
        const double blocks = bench_mla_cache_bytes(s, B, (ctx + c->block_tokens - 1) / c->block_tokens * c->block_tokens, c->dtype);
        if (too_big(c, row, blocks + 8192.0 * s->row * 4, blocks, blocks / elem))
            return -1;
    } else if (mha) {
        row->flops = (double)B * ctx * bench_pair_flops(s, 0);
        row->bytes = row->cache_bytes + nq * s->dq * 4 + nq * s->dv * 4;
        const double k = (double)B * s->H * ctx * s->dq * elem;
        if (too_big(c, row, row->cache_bytes, k, k / elem))
            return -1;
    } else if (decompressed) {
        /* the only decode path with a weight: W^UKV, float32 in the bench's own CLBlast product */
        snprintf(row->weights_dtype, sizeof(row->weights_dtype), "f32");
        row->weight_bytes = (double)s->H * (s->dn + s->dv) * s->rkv * 4;
        row->flops = (double)B * ctx * (bench_upproject_flops(s) + bench_pair_flops(s, 0));
        row->bytes = row->cache_bytes + row->weight_bytes + nq * s->dq * 4 + nq * s->dv * 4;
        const double up = (double)ctx * s->H * (s->dn + s->dv) * 4;
        const double largest = row->cache_bytes > up ? row->cache_bytes : up;
        if (too_big(c, row, row->cache_bytes + up + (f16 ? (double)ctx * s->row * 4 : 0), largest, largest / 4))
            return -1;
    } else {
        snprintf(row->note, sizeof(row->note), "unknown path '%s'", c->path);
        return 1;
    }

    decode_state st = {.dev = c->dev, .s = s, .batch = B, .ctx = ctx, .f16 = f16, .dtype = c->dtype, .q_len = QL,
                       .topk = sparse || indexer ? c->topk : 0, .index_heads = indexer ? HI : 0,
                       .index_dim = indexer ? dI : 0, .paged = paged};
    int rc = absorbed ? absorbed_setup(&st, c->block_tokens, c->seed)
                      : mha ? mha_setup(&st, c->seed) : decompressed_setup(&st, c->seed);
    if (!rc && paged)
        rc = paged_setup(&st, c->block_tokens, c->seed);
    bench_op op = {absorbed ? absorbed_enqueue : mha ? mha_enqueue : decompressed_enqueue, NULL, &st, 0};
    if (!rc)
        rc = bench_time(c->dev, &op, c->timing, &row->t);
    row->check_error = -1;
    /* The host check is O(B*H*ctx*rkv*(dn+dv)) for the decompressed path: small shapes only. */
    const double check_work = (double)B * QL * s->H * (sparse && c->topk < ctx ? c->topk : ctx) *
                              (decompressed ? (double)s->rkv * (s->dn + s->dv) : s->row);
    if (!rc && c->check && indexer && (double)B * QL * ctx * HI * dI <= 4e9)
        row->check_error = check_indexer(&st);
    else if (!rc && c->check && !indexer && !paged && check_work <= 4e9) /* paged: tests/test_paged.c checks it */
        row->check_error = check_decode(&st, absorbed);
    if (row->check_error > 1e-4) { /* the test suite's bound (tests/tolerance.h) */
        fprintf(stderr, "clmla-bench: decode %s batch %d ctx %d: relative error %.3g against float64\n",
                decompressed ? "decompressed" : "absorbed", B, ctx, row->check_error);
        rc = 1;
    }
    state_free(&st);
    return rc ? 1 : 0;
}
