/* Attention over a caller's paged cache (clmla_paged_*: the engines' calls, FlashMLA's and vLLM's
   conventions). A clmla_cache is filled with random rows in round-robin chunks (so its block tables
   are scattered), and the same rows are written into a buffer the test owns with clmla_paged_write
   and the cache's slots (vLLM's slot_mapping), with -1 entries among them. Then:
   - write: the caller's buffer equals the cache's own buffer byte for byte in every slot written,
     and is untouched elsewhere; a host cache written in place equals it too;
   - dense: clmla_paged_attention (q [B, s_q, H, rkv + dr] as FlashMLA gives it, causal or not,
     s_q 1..4) equals clmla_attention_latent over the cache bit for bit, and the float64 reference
     (mla_ref_latent_attention over the values as the cache holds them);
   - sparse: index lists of positions (through the table) and of slots (FlashMLA's) with -1 padding,
     out-of-range entries and duplicates, against clmla_attention_latent_sparse bit for bit and the
     float64 sparse reference;
   - host: the same calls on host memory (aligned: used in place; misaligned: copied) give the same
     bits;
   - bad tables on the device: an out-of-range block id or length reads nothing (out 0, lse -inf
     for that sequence alone) and sets the status; a bad slot writes nothing;
   - refusals: every bad argument is refused with a message naming it, before anything is
     enqueued (no counted OpenCL call), with the caller's memory unchanged.
   Layouts: f32, f16, bf16 and fp8 rows of 512 + 64 (FlashMLA's 576 and 656-byte rows) and of
   128 + 16, blocks of 1, 5, 16, 64 and 256 tokens, both attention kernels (rows, group). */
#include "attention.h"
#include "check.h"
#include "clcall.h"
#include "clmla.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static clmla_context *ctx;

enum { MAX_SEQS = 4, PAD = 0xA5 };

typedef struct fixture {
    char name[96];
    int rkv, dr, bs;
    clmla_cache_dtype dtype;
    clmla_cache *cache;
    clmla_paged *paged;
    size_t row_bytes;
    int num_blocks, nseq, total;
    int32_t id[MAX_SEQS];
    int len[MAX_SEQS], start[MAX_SEQS];
    float *ckv, *kr;                      /* [total, rkv], [total, dr]: the rows written, sequence after sequence */
    double *hold_ckv[MAX_SEQS], *hold_kr[MAX_SEQS]; /* the values as the cache holds them */
    int max_blocks;
    int32_t *table;                       /* [nseq, max_blocks] */
    int32_t *slots;                       /* [total]: each token's slot */
    cl_mem caller;                        /* the test's own cache buffer, [num_blocks, bs, row] */
    size_t cache_bytes;
} fixture;

static cl_mem make_buffer(size_t bytes, const void *host)
{
    return tu_buffer(ctx, bytes, host);
}

static void *read_buffer(cl_mem m, size_t bytes)
{
    void *h = malloc(bytes);
    tu_read_buffer(ctx, m, bytes, h);
    return h;
}

static clmla_buffer dev(cl_mem m)
{
    clmla_buffer b = {m, NULL, 0, 0};
    return b;
}

static clmla_buffer host(void *p, size_t bytes)
{
    clmla_buffer b = {NULL, p, 0, bytes};
    return b;
}

static void fixture_free(fixture *f)
{
    clmla_paged_destroy(f->paged);
    clmla_cache_destroy(f->cache);
    for (int s = 0; s < MAX_SEQS; s++) {
        free(f->hold_ckv[s]);
        free(f->hold_kr[s]);
    }
    free(f->ckv);
    free(f->kr);
    free(f->table);
    free(f->slots);
    if (f->caller)
        clReleaseMemObject(f->caller);
    memset(f, 0, sizeof(*f));
}

static const char *dtype_name(clmla_cache_dtype d)
{
    return clmla_dtype_name((clmla_dtype)d);
}

/* Writes every token of the fixture into the caller's buffer through clmla_paged_write with the
   cache's slots, in two calls whose slot lists hold -1 for the other call's tokens. */
static void write_caller(fixture *f, clmla_buffer kv)
{
    const size_t T = (size_t)f->total;
    int32_t *part = malloc(T * sizeof(int32_t));
    for (int half = 0; half < 2; half++) {
        for (size_t t = 0; t < T; t++)
            part[t] = (int)(t % 2) == half ? f->slots[t] : -1;
        clmla_paged_write_args w = {0};
        w.num_tokens = f->total;
        w.kv_c = host(f->ckv, T * f->rkv * 4);
        w.k_pe = host(f->kr, T * f->dr * 4);
        w.slot_mapping = host(part, T * 4);
        w.kv_cache = kv;
        w.num_blocks = f->num_blocks;
        CHECK_STATUS(clmla_paged_write(f->paged, &w, NULL), CLMLA_SUCCESS, ctx);
    }
    clFinish(clmla_context_queue(ctx));
    free(part);
}

/* The cache filled in scattered chunks, the values it holds, its tables, and the caller's buffer
   written with the same rows. Returns 0 when everything worked. */
static int fixture_make_index(fixture *f, int rkv, int dr, int bs, clmla_cache_dtype dtype, int nseq, const int *lens,
                              uint64_t seed, int index_dim, clmla_cache_dtype index_dtype)
{
    memset(f, 0, sizeof(*f));
    const int failed_before = check_failed;
    snprintf(f->name, sizeof(f->name), "rkv %d dr %d block %d %s", rkv, dr, bs, dtype_name(dtype));
    f->rkv = rkv;
    f->dr = dr;
    f->bs = bs;
    f->dtype = dtype;
    f->nseq = nseq;
    int blocks = 3;
    for (int s = 0; s < nseq; s++) {
        f->len[s] = lens[s];
        f->start[s] = f->total;
        f->total += lens[s];
        blocks += (lens[s] + bs - 1) / bs;
    }
    f->num_blocks = blocks;
    clmla_cache_config cfg = {1, rkv, dr, bs, blocks, dtype, index_dim, index_dtype};
    CHECK_STATUS(clmla_cache_create(ctx, &cfg, &f->cache), CLMLA_SUCCESS, ctx);
    clmla_paged_config pc = {.kv_lora_rank = rkv, .rope_dim = dr, .block_size = bs, .dtype = dtype,
                             .index_head_dim = index_dim, .index_dtype = index_dtype};
    CHECK_STATUS(clmla_paged_create(ctx, &pc, &f->paged), CLMLA_SUCCESS, ctx);
    if (!f->cache || !f->paged)
        return -1;
    clmla_paged_info info;
    CHECK_STATUS(clmla_paged_get_info(f->paged, &info), CLMLA_SUCCESS, ctx);
    f->row_bytes = info.row_bytes;
    f->cache_bytes = (size_t)blocks * info.block_bytes;
    CHECK(info.block_bytes == (size_t)bs * info.row_bytes, "%s: block_bytes %zu", f->name, info.block_bytes);
    const size_t want_row = dtype == CLMLA_CACHE_F32   ? (size_t)(rkv + dr) * 4
                            : dtype == CLMLA_CACHE_FP8 ? (size_t)rkv + (size_t)rkv / 32 + 2 * (size_t)dr
                                                       : (size_t)(rkv + dr) * 2;
    CHECK(info.row_bytes == want_row, "%s: row_bytes %zu, expected %zu", f->name, info.row_bytes, want_row);

    tu_rng rng = tu_rng_seed(seed);
    f->ckv = malloc((size_t)f->total * rkv * sizeof(float));
    f->kr = malloc((size_t)f->total * dr * sizeof(float));
    tu_cache_fill_random(ctx, f->cache, f->id, f->len, nseq, rkv, dr, bs, f->ckv, f->kr, &rng, failed_before);

    f->max_blocks = tu_max_blocks(f->len, nseq, bs);
    f->table = malloc((size_t)nseq * f->max_blocks * sizeof(int32_t));
    f->slots = malloc((size_t)f->total * sizeof(int32_t));
    for (int s = 0; s < nseq && check_failed == failed_before; s++) {
        const int n = f->len[s];
        int32_t *row = f->table + (size_t)s * f->max_blocks;
        tu_cache_seq_snapshot(ctx, f->cache, f->id[s], n, rkv, dr, &f->hold_ckv[s], &f->hold_kr[s], row, f->max_blocks,
                              blocks);
        for (int j = 0; j < n; j++)
            f->slots[f->start[s] + j] = row[j / bs] * bs + j % bs;
    }
    /* the caller's buffer, every byte PAD, then the rows */
    unsigned char *pad = malloc(f->cache_bytes);
    memset(pad, PAD, f->cache_bytes);
    f->caller = make_buffer(f->cache_bytes, pad);
    free(pad);
    if (check_failed == failed_before)
        write_caller(f, dev(f->caller));
    return check_failed == failed_before ? 0 : -1;
}

static int fixture_make(fixture *f, int rkv, int dr, int bs, clmla_cache_dtype dtype, int nseq, const int *lens,
                        uint64_t seed)
{
    return fixture_make_index(f, rkv, dr, bs, dtype, nseq, lens, seed, 0, CLMLA_CACHE_F32);
}

/* Slot s of the cache's own buffer against the caller's, and unwritten slots still PAD. */
static void check_rows_equal(const fixture *f, const unsigned char *caller, const char *what)
{
    cl_mem own = NULL;
    CHECK_STATUS(clmla_cache_layer_buffer(f->cache, 0, &own), CLMLA_SUCCESS, ctx);
    unsigned char *mine = read_buffer(own, f->cache_bytes);
    const int slots = f->num_blocks * f->bs;
    char *used = calloc((size_t)slots, 1);
    for (int t = 0; t < f->total; t++)
        used[f->slots[t]] = 1;
    int differ = 0, touched = 0;
    for (int s = 0; s < slots; s++) {
        const unsigned char *a = caller + (size_t)s * f->row_bytes, *b = mine + (size_t)s * f->row_bytes;
        if (used[s])
            differ += memcmp(a, b, f->row_bytes) != 0;
        else
            for (size_t i = 0; i < f->row_bytes; i++)
                touched += a[i] != PAD;
    }
    CHECK(differ == 0, "%s %s: %d written rows differ from the cache's own", f->name, what, differ);
    CHECK(touched == 0, "%s %s: %d bytes of unwritten rows changed", f->name, what, touched);
    free(used);
    free(mine);
}

/* ---- a call's inputs and the two ways of running it ------------------------------------------ */

typedef struct call {
    int batch, sq, heads, causal, topk, kind;
    float scale;
    float *q;          /* [B, sq, H, rkv + dr] */
    int32_t *seqlens;  /* [B] */
    int32_t *indices;  /* [B, sq, topk]: positions (kind POSITIONS) or slots */
    int32_t *positions;/* the same lists as positions (for the clmla_cache call and the reference) */
    float *out, *lse;  /* results */
} call;

static void call_free(call *c)
{
    FREE_ALL(c->q, c->seqlens, c->indices, c->positions, c->out, c->lse);
    memset(c, 0, sizeof(*c));
}

/* Query (b, i)'s keys in the dense rule. */
static int query_ctx(const call *c, int b, int i)
{
    const int ctx_len = c->causal ? c->seqlens[b] - c->sq + 1 + i : c->seqlens[b];
    return ctx_len < 0 ? 0 : ctx_len;
}

static void call_make(call *c, const fixture *f, int heads, int sq, int causal, int topk, int kind, uint64_t seed)
{
    memset(c, 0, sizeof(*c));
    c->batch = f->nseq;
    c->sq = sq;
    c->heads = heads;
    c->causal = causal;
    c->topk = topk;
    c->kind = kind;
    c->scale = 0.0f; /* FlashMLA's default, (rkv + dr)^-1/2 */
    const size_t T = (size_t)c->batch * sq, row = (size_t)(f->rkv + f->dr);
    tu_rng rng = tu_rng_seed(seed);
    c->q = malloc(T * heads * row * sizeof(float));
    tu_fill_uniform(c->q, T * heads * row, 0.0f, 1.0f, &rng);
    c->seqlens = malloc((size_t)c->batch * sizeof(int32_t));
    for (int b = 0; b < c->batch; b++)
        c->seqlens[b] = f->len[b];
    c->out = malloc(T * heads * f->rkv * sizeof(float));
    c->lse = malloc(T * heads * sizeof(float));
    if (!topk)
        return;
    c->indices = malloc(T * topk * sizeof(int32_t));
    c->positions = malloc(T * topk * sizeof(int32_t));
    const int slots = f->num_blocks * f->bs;
    for (size_t t = 0; t < T; t++) {
        const int b = (int)(t / sq), n = f->len[b];
        for (int e = 0; e < topk; e++) {
            int32_t pos;
            switch (tu_rng_below(&rng, 8)) {
            case 0:
                pos = -1;
                break;
            case 1:
                pos = n + tu_rng_below(&rng, 3); /* past the sequence */
                break;
            case 2:
                pos = (int32_t)(t % 3) - 3; /* negative, not -1 */
                break;
            default:
                pos = n ? tu_rng_below(&rng, n) : -1; /* duplicates come by chance */
            }
            c->positions[t * topk + e] = pos;
            if (kind == CLMLA_PAGED_INDICES_POSITIONS) {
                c->indices[t * topk + e] = pos;
            } else if (pos >= 0 && pos < n) {
                c->indices[t * topk + e] = f->table[(size_t)b * f->max_blocks + pos / f->bs] * f->bs + pos % f->bs;
            } else {
                /* no key either way: -1, a slot past the cache or another negative value */
                const int r = tu_rng_below(&rng, 3);
                c->indices[t * topk + e] = r == 0 ? -1 : r == 1 ? slots + tu_rng_below(&rng, 5) : -7;
                c->positions[t * topk + e] = -1;
            }
        }
    }
}

static clmla_paged_attention_args call_args(const call *c, const fixture *f, clmla_buffer q, clmla_buffer kv,
                                            clmla_buffer table, clmla_buffer lens, clmla_buffer idx, clmla_buffer out,
                                            clmla_buffer lse)
{
    clmla_paged_attention_args a = {0};
    a.batch = c->batch;
    a.seqlen_q = c->sq;
    a.num_heads = c->heads;
    a.softmax_scale = c->scale;
    a.causal = c->causal;
    a.q = q;
    a.kv_cache = kv;
    a.num_blocks = f->num_blocks;
    a.block_table = table;
    a.max_blocks = f->max_blocks;
    a.cache_seqlens = lens;
    a.indices = idx;
    a.topk = c->topk;
    a.indices_kind = (clmla_paged_indices)c->kind;
    a.out = out;
    a.lse = lse;
    return a;
}

/* The call on host memory: q, tables, results and (given) the cache. */
static clmla_status run_host(call *c, const fixture *f, clmla_buffer kv)
{
    const size_t T = (size_t)c->batch * c->sq;
    clmla_buffer none = {0};
    clmla_paged_attention_args a =
        call_args(c, f, host(c->q, T * c->heads * (f->rkv + f->dr) * 4), kv,
                  host(f->table, (size_t)c->batch * f->max_blocks * 4), host(c->seqlens, (size_t)c->batch * 4),
                  c->topk ? host(c->indices, T * c->topk * 4) : none, host(c->out, T * c->heads * f->rkv * 4),
                  host(c->lse, T * c->heads * 4));
    return clmla_paged_attention(f->paged, &a, NULL);
}

/* The call on device buffers (the caller's cache), then read back. */
static void run_device(call *c, const fixture *f)
{
    const size_t T = (size_t)c->batch * c->sq;
    cl_mem q = make_buffer(T * c->heads * (f->rkv + f->dr) * 4, c->q);
    cl_mem table = make_buffer((size_t)c->batch * f->max_blocks * 4, f->table);
    cl_mem lens = make_buffer((size_t)c->batch * 4, c->seqlens);
    cl_mem idx = c->topk ? make_buffer(T * c->topk * 4, c->indices) : NULL;
    cl_mem out = make_buffer(T * c->heads * f->rkv * 4, NULL), lse = make_buffer(T * c->heads * 4, NULL);
    clmla_paged_attention_args a = call_args(c, f, dev(q), dev(f->caller), dev(table), dev(lens), dev(idx), dev(out),
                                             dev(lse));
    int longest = 0;
    for (int b = 0; b < c->batch; b++)
        longest = c->seqlens[b] > longest ? c->seqlens[b] : longest;
    /* the split the cache's own call makes from its max_ctx_len (0, the table's length, where a
       length is past it) */
    a.max_seqlen = longest <= f->max_blocks * f->bs ? longest : 0;
    cl_event ev = NULL;
    CHECK_STATUS(clmla_paged_attention(f->paged, &a, &ev), CLMLA_SUCCESS, ctx);
    CHECK(ev != NULL, "%s: no event", f->name);
    if (ev) {
        clWaitForEvents(1, &ev);
        clReleaseEvent(ev);
    }
    clEnqueueReadBuffer(clmla_context_queue(ctx), out, CL_TRUE, 0, T * c->heads * f->rkv * 4, c->out, 0, NULL, NULL);
    clEnqueueReadBuffer(clmla_context_queue(ctx), lse, CL_TRUE, 0, T * c->heads * 4, c->lse, 0, NULL, NULL);
    clReleaseMemObject(q);
    clReleaseMemObject(table);
    clReleaseMemObject(lens);
    if (idx)
        clReleaseMemObject(idx);
    clReleaseMemObject(out);
    clReleaseMemObject(lse);
}

/* The same attention through clmla_attention_latent(_sparse) over the cache itself. */
static void run_own(const call *c, const fixture *f, float *out, float *lse)
{
    const int rkv = f->rkv, dr = f->dr, H = c->heads;
    const size_t T = (size_t)c->batch * c->sq;
    float *ql = malloc(T * H * rkv * 4), *qr = malloc(T * H * dr * 4);
    int32_t *seq = malloc(T * 4), *ctxl = malloc(T * 4);
    for (size_t t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            const float *src = c->q + (t * H + h) * (size_t)(rkv + dr);
            memcpy(ql + (t * H + h) * rkv, src, (size_t)rkv * 4);
            memcpy(qr + (t * H + h) * dr, src + rkv, (size_t)dr * 4);
        }
        seq[t] = (int32_t)(t / c->sq);
        ctxl[t] = c->topk ? c->seqlens[t / c->sq] : query_ctx(c, (int)(t / c->sq), (int)(t % c->sq));
    }
    cl_mem bql = make_buffer(T * H * rkv * 4, ql), bqr = make_buffer(T * H * dr * 4, qr);
    cl_mem table = make_buffer((size_t)c->batch * f->max_blocks * 4, f->table);
    cl_mem bseq = make_buffer(T * 4, seq), bctx = make_buffer(T * 4, ctxl);
    cl_mem bout = make_buffer(T * H * rkv * 4, NULL), blse = make_buffer(T * H * 4, NULL);
    cl_mem idx = c->topk ? make_buffer(T * c->topk * 4, c->positions) : NULL;
    int longest = 0;
    for (int b = 0; b < c->batch; b++)
        longest = c->seqlens[b] > longest ? c->seqlens[b] : longest;
    clmla_latent_attention_args a = {0};
    a.num_tokens = (int)T;
    a.num_heads = H;
    a.softmax_scale = (float)(1.0 / sqrt((double)(rkv + dr)));
    a.q_latent = bql;
    a.q_rope = bqr;
    a.block_table = table;
    a.max_blocks_per_seq = f->max_blocks;
    a.token_seq = bseq;
    a.token_ctx_len = bctx;
    a.max_ctx_len = longest;
    a.out = bout;
    a.lse = blse;
    a.query_len = c->sq > 1 ? c->sq : 0;
    if (c->topk)
        CHECK_STATUS(clmla_attention_latent_sparse(f->cache, 0, &a, idx, 0, c->topk, NULL), CLMLA_SUCCESS, ctx);
    else
        CHECK_STATUS(clmla_attention_latent(f->cache, 0, &a, NULL), CLMLA_SUCCESS, ctx);
    clEnqueueReadBuffer(clmla_context_queue(ctx), bout, CL_TRUE, 0, T * H * rkv * 4, out, 0, NULL, NULL);
    clEnqueueReadBuffer(clmla_context_queue(ctx), blse, CL_TRUE, 0, T * H * 4, lse, 0, NULL, NULL);
    RELEASE_MEMS(bql, bqr, table, bseq, bctx, bout, blse, idx);
    FREE_ALL(ql, qr, seq, ctxl);
}

/* The bounds on a case's worst output and lse errors from float64, and on its count of values
   that are not 0 / -inf where the queries are empty (empty_what says which ones). */
static void check_worst(const fixture *f, const char *what, double worst, double worst_lse, int empty_bad,
                        const char *empty_what)
{
    CHECK(worst <= TOL_F32_CACHE, "%s %s: out %.3g from float64", f->name, what, worst);
    CHECK(worst_lse <= 1e-4, "%s %s: lse %.3g from float64", f->name, what, worst_lse);
    CHECK(empty_bad == 0, "%s %s: %d values of %s are not 0 / -inf", f->name, what, empty_bad, empty_what);
}

/* Every query against the float64 reference over the values the cache holds. */
static void check_reference(const call *c, const fixture *f, const char *what)
{
    const int rkv = f->rkv, dr = f->dr, H = c->heads;
    const size_t T = (size_t)c->batch * c->sq;
    const double scale = 1.0 / sqrt((double)(rkv + dr));
    double *qt = malloc((size_t)H * rkv * 8), *qrp = malloc((size_t)H * dr * 8);
    double *want = malloc((size_t)H * rkv * 8), *want_lse = malloc((size_t)H * 8);
    double worst = 0.0, worst_lse = 0.0;
    int empty_bad = 0;
    for (size_t t = 0; t < T; t++) {
        const int b = (int)(t / c->sq), i = (int)(t % c->sq);
        for (int h = 0; h < H; h++)
            for (int d = 0; d < rkv + dr; d++) {
                const double v = c->q[(t * H + h) * (size_t)(rkv + dr) + d];
                if (d < rkv)
                    qt[(size_t)h * rkv + d] = v;
                else
                    qrp[(size_t)h * dr + d - rkv] = v;
            }
        int keys;
        if (c->topk)
            keys = mla_ref_sparse_latent_attention(H, rkv, dr, scale, f->len[b], c->positions + t * c->topk, c->topk, qt,
                                                   qrp, f->hold_ckv[b], f->hold_kr[b], want, want_lse);
        else {
            keys = query_ctx(c, b, i);
            mla_ref_latent_attention(H, rkv, dr, scale, keys, qt, qrp, f->hold_ckv[b], f->hold_kr[b], want, want_lse);
        }
        const float *got = c->out + t * H * rkv, *got_lse = c->lse + t * H;
        if (!keys) {
            for (int h = 0; h < H; h++)
                empty_bad += !(isinf(got_lse[h]) && got_lse[h] < 0);
            for (int k = 0; k < H * rkv; k++)
                empty_bad += got[k] != 0.0f;
            continue;
        }
        const double e = mla_ref_max_rel_err(got, want, (size_t)H * rkv, NULL);
        worst = e > worst ? e : worst;
        for (int h = 0; h < H; h++) {
            const double d = fabs(got_lse[h] - want_lse[h]);
            worst_lse = d > worst_lse || isnan(d) ? d : worst_lse;
        }
    }
    check_worst(f, what, worst, worst_lse, empty_bad, "queries without keys");
    free(qt);
    free(qrp);
    free(want);
    free(want_lse);
}

static void check_same_bits(const call *c, const fixture *f, const float *out, const float *lse, const char *what)
{
    const size_t T = (size_t)c->batch * c->sq;
    CHECK(memcmp(c->out, out, T * c->heads * f->rkv * 4) == 0, "%s %s: out differs from clmla_cache's call", f->name,
          what);
    CHECK(memcmp(c->lse, lse, T * c->heads * 4) == 0, "%s %s: lse differs from clmla_cache's call", f->name, what);
}

/* One call in every form: device buffers against the cache's own call and the reference. */
static void case_run(const fixture *f, int heads, int sq, int causal, int topk, int kind, uint64_t seed)
{
    call c;
    call_make(&c, f, heads, sq, causal, topk, kind, seed);
    char what[96];
    snprintf(what, sizeof(what), "H %d s_q %d causal %d topk %d %s", heads, sq, causal, topk,
             topk ? (kind ? "positions" : "slots") : "dense");
    const size_t T = (size_t)c.batch * sq;
    float *own = malloc(T * heads * f->rkv * 4), *own_lse = malloc(T * heads * 4);
    run_own(&c, f, own, own_lse);
    run_device(&c, f);
    check_same_bits(&c, f, own, own_lse, what);
    check_reference(&c, f, what);
    free(own);
    free(own_lse);
    call_free(&c);
}

static const int LENS_A[] = {37, 1, 70, 5};

static void run_layouts(int variant)
{
    clmla_attention_set_variant(ctx, variant);
    static const struct {
        int rkv, dr, bs;
        clmla_cache_dtype dtype;
    } layouts[] = {
        {512, 64, 64, CLMLA_CACHE_F32}, {512, 64, 16, CLMLA_CACHE_BF16}, {512, 64, 64, CLMLA_CACHE_FP8},
        {128, 16, 1, CLMLA_CACHE_F16},  {128, 16, 5, CLMLA_CACHE_FP8},   {128, 16, 256, CLMLA_CACHE_BF16},
        {128, 16, 16, CLMLA_CACHE_F32},
    };
    for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); l++) {
        if (variant == CLMLA_LATENT_GROUP && layouts[l].rkv == 512 && layouts[l].dtype != CLMLA_CACHE_FP8)
            continue; /* the group kernel at 512 + 64: its fp8 form is enough here */
        fixture f;
        if (fixture_make(&f, layouts[l].rkv, layouts[l].dr, layouts[l].bs, layouts[l].dtype, 4, LENS_A, 11 + l) == 0) {
            unsigned char *caller = read_buffer(f.caller, f.cache_bytes);
            check_rows_equal(&f, caller, "written on the device");
            free(caller);
            const int heads = l % 2 ? 16 : 3;
            for (int sq = 1; sq <= 4; sq++)
                case_run(&f, heads, sq, sq > 1 && sq != 3, 0, 0, 100 + sq);
            case_run(&f, heads, 1, 0, 24, CLMLA_PAGED_INDICES_SLOTS, 200);
            case_run(&f, heads, 2, 0, 9, CLMLA_PAGED_INDICES_POSITIONS, 201);
        }
        fixture_free(&f);
    }
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
}

static void part_rows(void)
{
    run_layouts(CLMLA_LATENT_ROWS);
}

static void part_group(void)
{
    run_layouts(CLMLA_LATENT_GROUP);
}

/* Calls of 1, 4, 8, 12 and 80 query tokens (one sequence or four, s_q 1 to 20) over one layout, in a
   context of its own that traces (CLMLA_TRACE): paged_tokens, and every other kernel of the calls
   and of the cache's own, runs in one work-group shape the library gives, whatever the tokens. */
static void part_shapes(void)
{
    char path[64];
    clmla_context *outer = ctx, *traced = tu_traced_context("test_paged_shapes", path, sizeof(path));
    CHECK(traced != NULL, "no context that traces");
    if (!traced)
        return;
    ctx = traced;
    static const int one[] = {37};
    fixture f;
    if (fixture_make(&f, 128, 16, 16, CLMLA_CACHE_F16, 1, one, 31) == 0)
        case_run(&f, 16, 1, 0, 0, 0, 300);
    fixture_free(&f);
    if (fixture_make(&f, 128, 16, 16, CLMLA_CACHE_F16, 4, LENS_A, 32) == 0) {
        static const int sqs[] = {1, 2, 3, 20};
        for (size_t i = 0; i < sizeof(sqs) / sizeof(sqs[0]); i++)
            case_run(&f, 16, sqs[i], 0, 0, 0, 301 + i);
    }
    fixture_free(&f);
    ctx = outer;
    const int bad = tu_traced_context_shapes(traced, path);
    CHECK(bad == 0, "%d kernel(s) ran in more than one work-group shape or in the driver's", bad);
}

/* ---- host memory -------------------------------------------------------------------------- */

static void part_host(void)
{
    fixture f;
    if (fixture_make(&f, 512, 64, 16, CLMLA_CACHE_FP8, 3, LENS_A, 5) == 0) {
        clmla_paged_info before, after;
        clmla_paged_get_info(f.paged, &before);
        /* the cache in host memory: aligned (in place where the device shares memory), then 8 bytes
           past an aligned address (copied) */
        const size_t align = before.host_alignment > 64 ? before.host_alignment : 64;
        unsigned char *aligned = aligned_alloc(align, (f.cache_bytes + 8 + align - 1) / align * align);
        cl_int err = clEnqueueReadBuffer(clmla_context_queue(ctx), f.caller, CL_TRUE, 0, f.cache_bytes, aligned, 0, NULL,
                                         NULL);
        CHECK(err == CL_SUCCESS, "read: %d", err);
        unsigned char *shifted = malloc(f.cache_bytes + 8);
        memcpy(shifted + 8, aligned, f.cache_bytes);
        for (int form = 0; form < 3; form++) {
            call c;
            call_make(&c, &f, 16, 2, 1, form == 2 ? 12 : 0, CLMLA_PAGED_INDICES_SLOTS, 300 + form);
            const size_t T = (size_t)c.batch * c.sq;
            float *own = malloc(T * 16 * f.rkv * 4), *own_lse = malloc(T * 16 * 4);
            if (form == 2)
                c.causal = 0;
            run_own(&c, &f, own, own_lse);
            clmla_buffer kv = form == 1 ? host(shifted + 8, f.cache_bytes) : host(aligned, f.cache_bytes);
            CHECK_STATUS(run_host(&c, &f, kv), CLMLA_SUCCESS, ctx);
            check_same_bits(&c, &f, own, own_lse, form == 1 ? "host, cache copied" : "host, cache in place");
            check_reference(&c, &f, "host");
            free(own);
            free(own_lse);
            call_free(&c);
        }
        clmla_paged_get_info(f.paged, &after);
        if (before.host_unified) {
            CHECK(after.host_wrapped > before.host_wrapped, "nothing was used in place on a device that shares memory");
            CHECK(after.host_copied_bytes - before.host_copied_bytes >= f.cache_bytes,
                  "the misaligned cache was not counted as copied (%llu bytes)",
                  (unsigned long long)(after.host_copied_bytes - before.host_copied_bytes));
        }
        /* the cache 48 bytes into memory whose start is aligned, given as that start and offset 48:
           used in place where the device shares memory, the kernels skipping the offset; then the
           same in a device buffer at offset 48 (no sub-buffer). The 48 bytes before are all ones,
           NaN in every cache dtype, so a read of them shows in the results. */
        unsigned char *lead = aligned_alloc(align, (f.cache_bytes + 48 + align - 1) / align * align);
        memset(lead, 0xff, 48);
        memcpy(lead + 48, aligned, f.cache_bytes);
        cl_mem lead_dev = make_buffer(f.cache_bytes + 48, lead);
        for (int form = 0; form < 2; form++) {
            call c;
            call_make(&c, &f, 16, 2, 1, 0, CLMLA_PAGED_INDICES_SLOTS, 310 + form);
            const size_t T = (size_t)c.batch * c.sq;
            float *own = malloc(T * 16 * f.rkv * 4), *own_lse = malloc(T * 16 * 4);
            run_own(&c, &f, own, own_lse);
            clmla_buffer kv = form == 0 ? host(lead, f.cache_bytes) : dev(lead_dev);
            kv.offset = 48;
            /* the copies of the call with the aligned cache (the other arguments'), then this one's */
            clmla_paged_info b0, b1, b2;
            clmla_paged_get_info(f.paged, &b0);
            CHECK_STATUS(run_host(&c, &f, host(aligned, f.cache_bytes)), CLMLA_SUCCESS, ctx);
            clmla_paged_get_info(f.paged, &b1);
            CHECK_STATUS(run_host(&c, &f, kv), CLMLA_SUCCESS, ctx);
            clmla_paged_get_info(f.paged, &b2);
            check_same_bits(&c, &f, own, own_lse, form == 0 ? "host cache at offset 48" : "device cache at offset 48");
            if (form == 0 && b0.host_unified)
                CHECK(b2.host_copied_bytes - b1.host_copied_bytes == b1.host_copied_bytes - b0.host_copied_bytes,
                      "the cache at offset 48 from an aligned start was copied (%llu bytes copied, %llu with it aligned)",
                      (unsigned long long)(b2.host_copied_bytes - b1.host_copied_bytes),
                      (unsigned long long)(b1.host_copied_bytes - b0.host_copied_bytes));
            free(own);
            free(own_lse);
            call_free(&c);
        }
        clReleaseMemObject(lead_dev);
        free(lead);
        /* a host cache written in place: the same bytes as the device buffer */
        memset(aligned, PAD, f.cache_bytes);
        write_caller(&f, host(aligned, f.cache_bytes));
        check_rows_equal(&f, aligned, "written in host memory");
        memset(shifted + 8, PAD, f.cache_bytes);
        write_caller(&f, host(shifted + 8, f.cache_bytes));
        check_rows_equal(&f, shifted + 8, "written in copied host memory");
        free(aligned);
        free(shifted);
    }
    fixture_free(&f);
}

/* ---- bad tables on the device -------------------------------------------------------------- */

static void part_bad_tables(void)
{
    fixture f;
    if (fixture_make(&f, 128, 16, 16, CLMLA_CACHE_BF16, 4, LENS_A, 9) == 0) {
        uint32_t flags = 99;
        CHECK_STATUS(clmla_paged_status(f.paged, 1, &flags), CLMLA_SUCCESS, ctx);
        CHECK(flags == 0, "status %u after good calls", flags);
        call good;
        call_make(&good, &f, 4, 1, 0, 0, 0, 400);
        run_device(&good, &f);
        const size_t per_seq = (size_t)4 * f.rkv;
        static const struct {
            int seq, entry, value, length;
            uint32_t flag;
            const char *what;
        } bad[] = {
            {2, 1, -1, 0, CLMLA_PAGED_BAD_BLOCK, "block id -1"},
            {0, 2, 0, 0, CLMLA_PAGED_BAD_BLOCK, "block id num_blocks"},
            {2, 0, 0, -3, CLMLA_PAGED_BAD_LENGTH, "length -3"},
            {3, 0, 0, INT_MAX, CLMLA_PAGED_BAD_LENGTH, "length past the table"},
            {1, 1, -5, 0, 0, "a bad id past the blocks the sequence reads"},
        };
        for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
            call c;
            call_make(&c, &f, 4, 1, 0, 0, 0, 400);
            int32_t saved = f.table[(size_t)bad[k].seq * f.max_blocks + bad[k].entry];
            if (bad[k].length)
                c.seqlens[bad[k].seq] = bad[k].length;
            else
                f.table[(size_t)bad[k].seq * f.max_blocks + bad[k].entry] = bad[k].value ? bad[k].value : f.num_blocks;
            run_device(&c, &f);
            f.table[(size_t)bad[k].seq * f.max_blocks + bad[k].entry] = saved;
            CHECK_STATUS(clmla_paged_status(f.paged, 1, &flags), CLMLA_SUCCESS, ctx);
            CHECK(flags == bad[k].flag, "%s: status %u, expected %u", bad[k].what, flags, bad[k].flag);
            for (int s = 0; s < f.nseq; s++) {
                const int hit = bad[k].flag && s == bad[k].seq;
                int zero = 1, same = memcmp(c.out + s * per_seq, good.out + s * per_seq, per_seq * 4) == 0;
                for (size_t i = 0; i < per_seq; i++)
                    zero &= c.out[s * per_seq + i] == 0.0f;
                for (int h = 0; h < 4; h++)
                    zero &= isinf(c.lse[s * 4 + h]) && c.lse[s * 4 + h] < 0;
                CHECK(hit ? zero : same, "%s: sequence %d %s", bad[k].what, s,
                      hit ? "read keys" : "differs from the good call");
            }
            CHECK_STATUS(clmla_paged_status(f.paged, 0, &flags), CLMLA_SUCCESS, ctx);
            CHECK(flags == 0, "%s: status %u after the reset", bad[k].what, flags);
            call_free(&c);
        }
        call_free(&good);

        /* slots on the device: out-of-range ones are not written, the others are */
        unsigned char *before = read_buffer(f.caller, f.cache_bytes);
        const int T = 4, slots_n = f.num_blocks * f.bs;
        int32_t slots[4] = {slots_n, 3, -2, 7};
        float kvc[4 * 128], kpe[4 * 16];
        tu_rng rng = tu_rng_seed(77);
        tu_fill_uniform(kvc, sizeof(kvc) / 4, 0.0f, 1.0f, &rng);
        tu_fill_uniform(kpe, sizeof(kpe) / 4, 0.0f, 1.0f, &rng);
        cl_mem bslots = make_buffer(sizeof(slots), slots);
        clmla_paged_write_args w = {.num_tokens = T, .kv_c = host(kvc, sizeof(kvc)), .k_pe = host(kpe, sizeof(kpe)),
                                    .slot_mapping = dev(bslots), .kv_cache = dev(f.caller), .num_blocks = f.num_blocks};
        CHECK_STATUS(clmla_paged_write(f.paged, &w, NULL), CLMLA_SUCCESS, ctx);
        CHECK_STATUS(clmla_paged_status(f.paged, 1, &flags), CLMLA_SUCCESS, ctx);
        CHECK(flags == CLMLA_PAGED_BAD_SLOT, "bad slots: status %u", flags);
        unsigned char *now = read_buffer(f.caller, f.cache_bytes);
        int changed_elsewhere = 0;
        for (int s = 0; s < slots_n; s++)
            if (s != 3 && s != 7)
                changed_elsewhere += memcmp(now + (size_t)s * f.row_bytes, before + (size_t)s * f.row_bytes,
                                            f.row_bytes) != 0;
        CHECK(changed_elsewhere == 0, "bad slots: %d other rows changed", changed_elsewhere);
        CHECK(memcmp(now + 3 * f.row_bytes, before + 3 * f.row_bytes, f.row_bytes) != 0, "slot 3 was not written");
        /* its bf16 values: token 1's c^KV rounded */
        const uint16_t *r = (const uint16_t *)(now + 7 * f.row_bytes);
        uint32_t bits;
        memcpy(&bits, &kvc[3 * 128], 4);
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
        CHECK(r[0] == bits, "slot 7's first value %04x, expected %04x", r[0], bits);
        clReleaseMemObject(bslots);
        free(before);
        free(now);
    }
    fixture_free(&f);
}


/* ---- the indexer's selection ----------------------------------------------------------------- */

/* Random index keys: the same bytes in the cache's own index-key buffer and in a buffer of the
   test's; clmla_paged_index_select over the test's against clmla_index_select over the cache's,
   bit for bit, and (f32 keys) against float64 scores: each list holds min(top_k, visible) distinct
   positions in ascending order, then -1, and no position left out scores above one taken. */
static void index_case(int bs, clmla_cache_dtype kd, int sq, int causal, int top_k, uint64_t seed)
{
    enum { DI = 32, HI = 4 };
    fixture f;
    if (fixture_make_index(&f, 128, 16, bs, CLMLA_CACHE_F32, 4, LENS_A, seed, DI, kd) != 0) {
        fixture_free(&f);
        return;
    }
    char what[96];
    snprintf(what, sizeof(what), "index keys %s block %d s_q %d causal %d top_k %d", dtype_name(kd), bs, sq, causal,
             top_k);
    clmla_paged_info info;
    clmla_paged_get_info(f.paged, &info);
    const size_t key_bytes = (size_t)f.num_blocks * info.index_block_bytes;
    CHECK(info.index_block_bytes > 0, "%s: no index block bytes", what);
    tu_rng rng = tu_rng_seed(seed + 1);
    unsigned char *keys = malloc(key_bytes);
    float *keyf = NULL;
    if (kd == CLMLA_CACHE_F32) {
        keyf = (float *)keys;
        tu_fill_uniform(keyf, key_bytes / 4, 0.0f, 1.0f, &rng);
    } else if (kd == CLMLA_CACHE_FP8) { /* codes, then a power-of-two scale per key, per block */
        for (size_t i = 0; i < key_bytes; i++)
            keys[i] = (unsigned char)(tu_rng_next(&rng) & 0x7E); /* no NaN codes */
        for (int b = 0; b < f.num_blocks; b++)
            for (int r = 0; r < bs; r++) {
                const float scale = ldexpf(1.0f, -(int)(tu_rng_next(&rng) % 8));
                memcpy(keys + (size_t)b * info.index_block_bytes + (size_t)bs * DI + 4 * (size_t)r, &scale, 4);
            }
    } else { /* f16 or bf16 halves of small values */
        for (size_t i = 0; i < key_bytes / 2; i++) {
            const uint16_t v = kd == CLMLA_CACHE_BF16 ? (uint16_t)(0x3C00 + (tu_rng_next(&rng) & 0x01FF) + 0x8000 * (tu_rng_next(&rng) & 1))
                                                      : (uint16_t)(0x3000 + (tu_rng_next(&rng) & 0x07FF) + 0x8000 * (tu_rng_next(&rng) & 1));
            memcpy(keys + 2 * i, &v, 2);
        }
    }
    cl_mem own_keys = NULL;
    CHECK_STATUS(clmla_cache_index_buffer(f.cache, 0, &own_keys), CLMLA_SUCCESS, ctx);
    clEnqueueWriteBuffer(clmla_context_queue(ctx), own_keys, CL_TRUE, 0, key_bytes, keys, 0, NULL, NULL);
    cl_mem caller_keys = make_buffer(key_bytes, keys);

    const size_t T = (size_t)f.nseq * sq;
    float *q = malloc(T * HI * DI * 4), *w = malloc(T * HI * 4);
    tu_fill_uniform(q, T * HI * DI, 0.0f, 1.0f, &rng);
    tu_fill_uniform(w, T * HI, 0.5f, 0.5f, &rng);
    int32_t *lens = malloc((size_t)f.nseq * 4), *seq = malloc(T * 4), *ctxl = malloc(T * 4);
    int longest = 0;
    for (int b = 0; b < f.nseq; b++) {
        lens[b] = f.len[b];
        longest = lens[b] > longest ? lens[b] : longest;
    }
    for (size_t t = 0; t < T; t++) {
        const int b = (int)(t / sq), i = (int)(t % sq), c = causal ? lens[b] - sq + 1 + i : lens[b];
        seq[t] = b;
        ctxl[t] = c < 0 ? 0 : c;
    }
    int32_t *got = malloc(T * top_k * 4), *own = malloc(T * top_k * 4);
    clmla_paged_index_args a = {0};
    a.batch = f.nseq;
    a.seqlen_q = sq;
    a.num_heads = HI;
    a.top_k = top_k;
    a.causal = causal;
    a.q = host(q, T * HI * DI * 4);
    a.weights = host(w, T * HI * 4);
    a.index_cache = dev(caller_keys);
    a.num_blocks = f.num_blocks;
    a.block_table = host(f.table, (size_t)f.nseq * f.max_blocks * 4);
    a.max_blocks = f.max_blocks;
    a.cache_seqlens = host(lens, (size_t)f.nseq * 4);
    a.indices = host(got, T * top_k * 4);
    CHECK_STATUS(clmla_paged_index_select(f.paged, &a, NULL), CLMLA_SUCCESS, ctx);

    cl_mem bq = make_buffer(T * HI * DI * 4, q), bw = make_buffer(T * HI * 4, w);
    cl_mem btable = make_buffer((size_t)f.nseq * f.max_blocks * 4, f.table);
    cl_mem bseq = make_buffer(T * 4, seq), bctx = make_buffer(T * 4, ctxl), bidx = make_buffer(T * top_k * 4, NULL);
    clmla_index_select_args sa = {0};
    sa.num_tokens = (int)T;
    sa.num_heads = HI;
    sa.top_k = top_k;
    sa.q = bq;
    sa.weights = bw;
    sa.block_table = btable;
    sa.max_blocks_per_seq = f.max_blocks;
    sa.token_seq = bseq;
    sa.token_ctx_len = bctx;
    sa.max_ctx_len = longest;
    sa.indices = bidx;
    CHECK_STATUS(clmla_index_select(f.cache, 0, &sa, NULL), CLMLA_SUCCESS, ctx);
    clEnqueueReadBuffer(clmla_context_queue(ctx), bidx, CL_TRUE, 0, T * top_k * 4, own, 0, NULL, NULL);
    CHECK(memcmp(got, own, T * top_k * 4) == 0, "%s: the lists differ from clmla_index_select's", what);

    if (keyf) {
        int bad = 0;
        double *score = malloc(((size_t)longest + 1) * sizeof(double));
        for (size_t t = 0; t < T && !bad; t++) {
            const int b = (int)(t / sq), n = ctxl[t];
            double top = 0.0;
            for (int s = 0; s < n; s++) {
                const int slot = f.table[(size_t)b * f.max_blocks + s / bs] * bs + s % bs;
                double sum = 0.0;
                for (int h = 0; h < HI; h++) {
                    double dot = 0.0;
                    for (int d = 0; d < DI; d++)
                        dot += (double)q[(t * HI + h) * DI + d] * keyf[(size_t)slot * DI + d];
                    sum += w[t * HI + h] * (dot > 0.0 ? dot : 0.0);
                }
                score[s] = sum;
                top = fabs(sum) > top ? fabs(sum) : top;
            }
            const int32_t *l = got + t * top_k;
            const int want_n = top_k < n ? top_k : n;
            char *taken = calloc((size_t)n + 1, 1);
            double lowest_taken = INFINITY, highest_left = -INFINITY;
            for (int e = 0; e < top_k; e++) {
                if (e < want_n) {
                    bad += l[e] < 0 || l[e] >= n || (e && l[e] <= l[e - 1]);
                    if (l[e] >= 0 && l[e] < n) {
                        taken[l[e]] = 1;
                        lowest_taken = score[l[e]] < lowest_taken ? score[l[e]] : lowest_taken;
                    }
                } else {
                    bad += l[e] != -1;
                }
            }
            for (int s = 0; s < n; s++)
                if (!taken[s])
                    highest_left = score[s] > highest_left ? score[s] : highest_left;
            bad += highest_left > lowest_taken + 1e-5 * top;
            free(taken);
        }
        CHECK(bad == 0, "%s: the lists are not the float64 top-k", what);
        free(score);
    }
    cl_mem all[] = {bq, bw, btable, bseq, bctx, bidx, caller_keys};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        clReleaseMemObject(all[i]);
    free(keys);
    free(q);
    free(w);
    free(lens);
    free(seq);
    free(ctxl);
    free(got);
    free(own);
    fixture_free(&f);
}

static void part_index(void)
{
    index_case(16, CLMLA_CACHE_F32, 1, 0, 8, 601);
    index_case(5, CLMLA_CACHE_F32, 3, 1, 20, 602);
    index_case(64, CLMLA_CACHE_BF16, 2, 1, 16, 603);
    index_case(1, CLMLA_CACHE_FP8, 1, 0, 4, 604);
    index_case(16, CLMLA_CACHE_F16, 4, 1, 100, 605);
}

/* ---- an additive mask ---------------------------------------------------------------------------- */

/* Half bits of the mask values the test uses: 0, +-1/4, +-1/2, +-3/4, +-1 (exact in half), -inf. */
static const uint16_t MASK_BITS[] = {0x0000, 0x3400, 0x3800, 0x3A00, 0x3C00, 0xB400, 0xB800, 0xBA00, 0xBC00, 0xFC00};
static const double MASK_VALUES[] = {0.0, 0.25, 0.5, 0.75, 1.0, -0.25, -0.5, -0.75, -1.0, -INFINITY};

/* A masked dense call (causal or not) against float64 softmax(scale q.k + mask) over the values the
   cache holds: random mask values with about a fifth -inf, every key of one query -inf (out 0, lse
   -inf), one query's keys all 0 (on the row kernels, the unmasked call's bits). On the variant
   part_mask set. */
static void mask_case(const fixture *f, int heads, int sq, int causal, uint64_t seed, int variant)
{
    call c;
    call_make(&c, f, heads, sq, causal, 0, 0, seed);
    const size_t T = (size_t)c.batch * sq;
    const int stride = f->max_blocks * f->bs + 3;
    uint16_t *mask = malloc(T * stride * 2);
    signed char *which = malloc(T * stride);
    tu_rng rng = tu_rng_seed(seed + 9);
    for (size_t i = 0; i < T * (size_t)stride; i++) {
        const int r = tu_rng_below(&rng, 45);
        which[i] = (signed char)(r < 9 ? 9 : r % 9); /* a fifth -inf */
        mask[i] = MASK_BITS[which[i]];
    }
    for (int j = 0; j < stride; j++) { /* token 1: every key masked; token 0: none */
        which[(size_t)1 * stride + j] = 9;
        mask[(size_t)1 * stride + j] = MASK_BITS[9];
        which[j] = 0;
        mask[j] = MASK_BITS[0];
    }
    clmla_buffer none = {0};
    clmla_paged_attention_args a =
        call_args(&c, f, host(c.q, T * heads * (f->rkv + f->dr) * 4), dev(f->caller),
                  host(f->table, (size_t)c.batch * f->max_blocks * 4), host(c.seqlens, (size_t)c.batch * 4), none,
                  host(c.out, T * heads * f->rkv * 4), host(c.lse, T * heads * 4));
    a.mask = host(mask, T * stride * 2);
    a.mask_stride = stride;
    char what[96];
    snprintf(what, sizeof(what), "mask (%s kernels): H %d s_q %d causal %d",
             variant == CLMLA_LATENT_ROWS ? "row" : "group", heads, sq, causal);
    CHECK_STATUS(clmla_paged_attention(f->paged, &a, NULL), CLMLA_SUCCESS, ctx);

    const int rkv = f->rkv, dr = f->dr;
    const double scale = 1.0 / sqrt((double)(rkv + dr));
    double worst = 0.0, worst_lse = 0.0;
    int empty_bad = 0;
    double *s = malloc(((size_t)f->max_blocks * f->bs + 1) * sizeof(double)), *o = malloc((size_t)rkv * sizeof(double));
    for (size_t t = 0; t < T; t++) {
        const int b = (int)(t / sq), n = query_ctx(&c, b, (int)(t % sq));
        for (int h = 0; h < heads; h++) {
            const float *q = c.q + (t * heads + h) * (size_t)(rkv + dr);
            double m = -INFINITY;
            for (int j = 0; j < n; j++) {
                double dot = 0.0;
                for (int d = 0; d < rkv; d++)
                    dot += (double)q[d] * f->hold_ckv[b][(size_t)j * rkv + d];
                for (int d = 0; d < dr; d++)
                    dot += (double)q[rkv + d] * f->hold_kr[b][(size_t)j * dr + d];
                s[j] = scale * dot + MASK_VALUES[which[t * stride + j]];
                m = s[j] > m ? s[j] : m;
            }
            const float *got = c.out + (t * heads + h) * (size_t)rkv;
            const float got_lse = c.lse[t * heads + h];
            if (m == -INFINITY) { /* no key */
                empty_bad += !(isinf(got_lse) && got_lse < 0);
                for (int d = 0; d < rkv; d++)
                    empty_bad += got[d] != 0.0f;
                continue;
            }
            double sum = 0.0;
            for (int d = 0; d < rkv; d++)
                o[d] = 0.0;
            for (int j = 0; j < n; j++) {
                const double w = exp(s[j] - m);
                sum += w;
                for (int d = 0; d < rkv; d++)
                    o[d] += w * f->hold_ckv[b][(size_t)j * rkv + d];
            }
            double top = 0.0, err = 0.0;
            for (int d = 0; d < rkv; d++) {
                top = fabs(o[d] / sum) > top ? fabs(o[d] / sum) : top;
                err = fabs(got[d] - o[d] / sum) > err ? fabs(got[d] - o[d] / sum) : err;
            }
            worst = err / top > worst ? err / top : worst;
            const double le = fabs(got_lse - (m + log(sum)));
            worst_lse = le > worst_lse || isnan(le) ? le : worst_lse;
        }
    }
    check_worst(f, what, worst, worst_lse, empty_bad, "fully masked queries");
    free(s);
    free(o);

    /* token 0's mask is all 0: the same bits as its unmasked call, where that runs
       attn_latent_rows too (the row kernels under 16 heads: with more, the latent tuning may choose
       attn_latent_lanes, which takes no mask; the work-group kernels take attn_latent_mma unmasked
       where the tuning's group_mma asks). Elsewhere the two calls may run different kernels, so the
       unmasked one is not made. */
    if (variant == CLMLA_LATENT_ROWS && heads < 16) {
        float *plain = malloc(T * heads * rkv * 4), *plain_lse = malloc(T * heads * 4);
        clmla_paged_attention_args u = a;
        u.mask = none;
        u.out = host(plain, T * heads * rkv * 4);
        u.lse = host(plain_lse, T * heads * 4);
        CHECK_STATUS(clmla_paged_attention(f->paged, &u, NULL), CLMLA_SUCCESS, ctx);
        CHECK(memcmp(plain, c.out, (size_t)heads * rkv * 4) == 0, "%s %s: a mask of zeros changed token 0's output",
              f->name, what);
        free(plain);
        free(plain_lse);
    }
    free(mask);
    free(which);
    call_free(&c);
}

/* The row-walking kernels (CPU devices) and the work-group ones (GPUs; unfolded, never
   attn_latent_mma, with a mask). */
static void part_mask(void)
{
    const int variants[2] = {CLMLA_LATENT_ROWS, CLMLA_LATENT_GROUP};
    for (int v = 0; v < 2; v++) {
        clmla_attention_set_variant(ctx, variants[v]);
        fixture f;
        if (fixture_make(&f, 128, 16, 16, CLMLA_CACHE_F16, 4, LENS_A, 31) == 0) {
            mask_case(&f, 3, 1, 0, 700, variants[v]);
            mask_case(&f, 16, 3, 1, 701, variants[v]);
            mask_case(&f, 5, 2, 0, 702, variants[v]);
        }
        fixture_free(&f);
        if (fixture_make(&f, 512, 64, 64, CLMLA_CACHE_F32, 4, LENS_A, 32) == 0)
            mask_case(&f, 16, 1, 0, 703, variants[v]);
        fixture_free(&f);
        if (fixture_make(&f, 512, 64, 64, CLMLA_CACHE_BF16, 4, LENS_A, 33) == 0)
            mask_case(&f, 20, 2, 1, 704, variants[v]);
        fixture_free(&f);
    }
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
}

/* ---- refusals --------------------------------------------------------------------------------- */

/* st is the wanted refusal, its message names `name`, nothing was enqueued or allocated since
   `count`, and the caller's out is still the sentinel. */
static void refused(clmla_status st, clmla_status want, const char *name, long count, const float *out, size_t n,
                    const char *what)
{
    CHECK_STATUS(st, want, ctx);
    CHECK(strstr(clmla_last_error(ctx), name) != NULL, "%s: the message '%s' does not name %s", what,
          clmla_last_error(ctx), name);
    CHECK(clmla_fault_count(ctx) == count, "%s: %ld OpenCL calls made by a refused call", what,
          clmla_fault_count(ctx) - count);
    int touched = 0;
    for (size_t i = 0; out && i < n; i++)
        touched += out[i] != -7.0f;
    CHECK(touched == 0, "%s: %d values of out written", what, touched);
}

static void part_refusals(void)
{
    fixture f;
    if (fixture_make(&f, 128, 16, 16, CLMLA_CACHE_F16, 2, LENS_A, 21) != 0) {
        fixture_free(&f);
        return;
    }
    call c;
    call_make(&c, &f, 2, 1, 0, 0, 0, 500);
    const size_t T = (size_t)c.batch, outn = T * 2 * f.rkv;
    for (size_t i = 0; i < outn; i++)
        c.out[i] = -7.0f;
    unsigned char *cache_before = read_buffer(f.caller, f.cache_bytes);
    clmla_buffer none = {0};
    const size_t qb = T * 2 * (f.rkv + f.dr) * 4;
#define BASE() call_args(&c, &f, host(c.q, qb), dev(f.caller), host(f.table, T * f.max_blocks * 4), \
                         host(c.seqlens, T * 4), none, host(c.out, outn * 4), host(c.lse, T * 2 * 4))
    long n0 = clmla_fault_count(ctx);
    clmla_paged_attention_args a;

    a = BASE();
    a.q.bytes -= 4;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "q holds", n0, c.out, outn, "short q");
    a = BASE();
    a.out.bytes = 8;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "out holds", n0, c.out, outn,
            "short out");
    a = BASE();
    a.num_blocks = f.num_blocks + 1;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "kv_cache holds", n0, c.out, outn,
            "cache shorter than num_blocks");
    a = BASE();
    a.kv_cache.offset = 4;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
            "kv_cache's offset 4 is not a multiple of 16 bytes", n0, c.out, outn,
            "misaligned cache offset");
    a = BASE();
    a.q.offset = 2;
    a.q.bytes -= 2;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "q's offset 2", n0, c.out, outn,
            "misaligned q");
    a = BASE();
    const int32_t kept = f.table[1];
    f.table[1] = f.num_blocks; /* sequence 0's second block: it reads 3 */
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "block_table[0][1]", n0, c.out, outn,
            "block id past num_blocks (host)");
    f.table[1] = -1;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "block_table[0][1] = -1", n0, c.out,
            outn, "block id -1 (host)");
    f.table[1] = kept;
    a = BASE();
    c.seqlens[1] = f.max_blocks * f.bs + 1;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "cache_seqlens[1]", n0, c.out, outn,
            "length past the table (host)");
    c.seqlens[1] = f.len[1];
    a = BASE();
    a.causal = 2;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "causal", n0, c.out, outn, "causal 2");
    a = BASE();
    a.topk = 4;
    a.causal = 1;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "causal 1 with topk 4", n0, c.out,
            outn, "causal sparse");
    a = BASE();
    a.topk = 4;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "indices is missing", n0, c.out, outn,
            "sparse without indices");
    a = BASE();
    a.topk = CLMLA_SPARSE_MAX_TOPK + 1;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "topk", n0, c.out, outn, "topk");
    a = BASE();
    a.num_heads = 0;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "num_heads 0", n0, c.out, outn,
            "no heads");
    a = BASE();
    a.softmax_scale = NAN;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "softmax_scale", n0, c.out, outn,
            "NaN scale");
    a = BASE();
    a.max_seqlen = f.max_blocks * f.bs + 1;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "max_seqlen", n0, c.out, outn,
            "max_seqlen");
    a = BASE();
    a.block_table = none;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "block_table is missing", n0, c.out,
            outn, "no table");
    {
        uint16_t zeros[64] = {0};
        a = BASE();
        a.mask = host(zeros, sizeof(zeros));
        a.mask_stride = f.max_blocks * f.bs - 1;
        refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "mask_stride", n0, c.out, outn,
                "mask stride below the table");
        a.mask_stride = f.max_blocks * f.bs;
        refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "mask holds", n0, c.out, outn,
                "short mask");
        a.topk = 4;
        a.indices = host(c.seqlens, 4 * 4 * T);
        refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "a mask with topk 4", n0,
                c.out, outn, "mask with a sparse call");
    }
    a = BASE();
    a.indices_kind = (clmla_paged_indices)7;
    refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "indices_kind 7", n0, c.out, outn,
            "indices kind");
    {
        cl_mem table = make_buffer((size_t)(T + 1) * f.max_blocks * 4, NULL);
        n0 = clmla_fault_count(ctx);
        a = BASE();
        a.block_table = dev(table);
        a.block_table.offset = 4;
        refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "block_table's offset 4", n0,
                c.out, outn, "table offset inside a row");
        a.block_table.offset = (size_t)2 * f.max_blocks * 4;
        refused(clmla_paged_attention(f.paged, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "block_table holds", n0, c.out,
                outn, "table past the buffer");
        clReleaseMemObject(table);
    }
#undef BASE
    /* writes */
    float kvc[3 * 128], kpe[3 * 16];
    int32_t slots[3] = {0, 5, -1};
    memset(kvc, 0, sizeof(kvc));
    memset(kpe, 0, sizeof(kpe));
    n0 = clmla_fault_count(ctx);
    clmla_paged_write_args w = {.num_tokens = 3, .kv_c = host(kvc, sizeof(kvc)), .k_pe = host(kpe, sizeof(kpe)),
                                .slot_mapping = host(slots, sizeof(slots)), .kv_cache = dev(f.caller),
                                .num_blocks = f.num_blocks};
    w.slot_mapping.bytes = 8;
    refused(clmla_paged_write(f.paged, &w, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "slot_mapping holds", n0, NULL, 0,
            "short slot_mapping");
    w.slot_mapping.bytes = sizeof(slots);
    slots[1] = f.num_blocks * f.bs;
    refused(clmla_paged_write(f.paged, &w, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "slot_mapping[1]", n0, NULL, 0,
            "slot past the cache (host)");
    slots[1] = -2;
    refused(clmla_paged_write(f.paged, &w, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "slot_mapping[1] = -2", n0, NULL, 0,
            "slot -2 (host)");
    slots[1] = 5;
    w.kv_c_stride = 100;
    refused(clmla_paged_write(f.paged, &w, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "kv_c_stride 100", n0, NULL, 0,
            "stride below the rank");
    w.kv_c_stride = 0;
    w.k_pe.bytes = sizeof(kpe) - 4;
    refused(clmla_paged_write(f.paged, &w, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "k_pe holds", n0, NULL, 0, "short k_pe");
    w.k_pe.bytes = sizeof(kpe);
    w.num_blocks = f.num_blocks * 2;
    refused(clmla_paged_write(f.paged, &w, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "kv_cache holds", n0, NULL, 0,
            "cache shorter than num_blocks (write)");
    unsigned char *cache_after = read_buffer(f.caller, f.cache_bytes);
    CHECK(memcmp(cache_before, cache_after, f.cache_bytes) == 0, "a refused call changed the caller's cache");
    free(cache_before);
    free(cache_after);
    /* the indexer's selection on a layout without index keys, and a bad top_k */
    {
        clmla_paged_index_args ia = {0};
        ia.batch = 2;
        ia.num_heads = 4;
        ia.top_k = 8;
        ia.num_blocks = f.num_blocks;
        ia.max_blocks = f.max_blocks;
        refused(clmla_paged_index_select(f.paged, &ia, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "index_head_dim 0", n0, NULL,
                0, "no index keys");
        ia.top_k = 0;
        refused(clmla_paged_index_select(f.paged, &ia, NULL), CLMLA_ERROR_INVALID_ARGUMENT, "index_head_dim 0", n0, NULL,
                0, "no index keys, top_k 0");
    }
    /* creation */
    clmla_paged *p = NULL;
    clmla_paged_config bad = {.kv_lora_rank = 100, .rope_dim = 16, .block_size = 16, .dtype = CLMLA_CACHE_FP8};
    CHECK_STATUS(clmla_paged_create(ctx, &bad, &p), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(p == NULL && strstr(clmla_last_error(ctx), "kv_lora_rank is 100"), "fp8 rank 100: %s", clmla_last_error(ctx));
    clmla_paged_config zero_bs = {.kv_lora_rank = 128, .rope_dim = 16, .block_size = 0, .dtype = CLMLA_CACHE_F32};
    CHECK_STATUS(clmla_paged_create(ctx, &zero_bs, &p), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(strstr(clmla_last_error(ctx), "block_size 0"), "block_size 0: %s", clmla_last_error(ctx));
    call_free(&c);
    fixture_free(&f);
}

static const tu_part parts[] = {
    {"rows", part_rows},         {"group", part_group},       {"shapes", part_shapes},     {"host", part_host},
    {"bad_tables", part_bad_tables}, {"index", part_index}, {"mask", part_mask}, {"refusals", part_refusals},
};

int main(int argc, char **argv)
{
    return tu_parts_exit(
        tu_run_parts(argc, argv, parts, (int)(sizeof(parts) / sizeof(parts[0])), NULL, &ctx, &check_failed));
}
