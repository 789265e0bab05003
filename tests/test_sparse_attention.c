/* clmla_attention_latent_sparse (DeepSeek Sparse Attention's entry point for engines that run
   their own indexer): absorbed queries over the positions each token's index list names, through
   the block tables of real sequences of a paged cache filled with clmla_cache_append_cl in chunks
   that start and end mid-block (so the tables are scattered). Compared with
   mla_ref_sparse_latent_attention in float64 over the cache's own values (clmla_cache_read: the
   rounded values as float32), so every dtype is held to float32's tolerance.
   Lists: random distinct subsets in random order (-1 padded), every position shuffled among
   padding and out-of-range entries (topk > ctx: then the dense clmla_attention_latent and the dense
   reference give the same), half the entries no key, duplicates, none valid (out 0, lse -inf),
   topk 1; for 1, 3, 16 and 20 heads, batch 1 (split lists, attn_combine) and several tokens of
   different sequences; f32, f16, bf16 and fp8 caches of 512 + 64, rkv 40 / dr 8 in 5-token
   blocks, fp8 with rkv 128. Each case runs with both kernels (attn_latent_rows, attn_latent).
   Then the refusals (NULL indices, topk out of 1..65536, a short indices buffer): a status, a
   message naming the value, nothing enqueued; and the kernels kept per cache (a second call
   creates nothing). */
#include "attention.h"
#include "check.h"
#include "clcall.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static clmla_context *ctx;

enum { MAX_SEQS = 4 };

/* A cache holding a few sequences of random rows, with their values read back. */
typedef struct pool {
    char name[64];
    clmla_cache *cache;
    int rkv, dr, bt;
    clmla_cache_dtype dtype;
    int nseq;
    int32_t id[MAX_SEQS];
    int len[MAX_SEQS];
    double *ckv[MAX_SEQS], *kr[MAX_SEQS]; /* [len, rkv], [len, dr]: the cache's values */
    int max_blocks;
    int32_t *table;                       /* [nseq, max_blocks] */
    cl_mem table_buf;
    uint64_t key; /* a hash of the values above and the lengths (ref_memo) */
} pool;


/* The float64 references of each case, kept across run_all's repetitions (one per kernel variant
   and lanes set, which change only the device's side): a case's references depend on its pool's
   values and its seed, tokens, heads and top-k alone, all in the key. */
typedef struct ref_memo {
    uint64_t pool_key, case_key;
    double *want, *lse, *dense_want, *dense_lse; /* [T, H, rkv], [T, H], the same dense (or NULL) */
    int valid[16];
} ref_memo;
enum { REF_MEMO_SIZE = 96 };
static ref_memo ref_memo_table[REF_MEMO_SIZE];
static int ref_memo_count;

static double *copy_doubles(const double *a, size_t n)
{
    double *b = a ? malloc(n * sizeof(double)) : NULL;
    if (b)
        memcpy(b, a, n * sizeof(double));
    return b;
}

static cl_mem make_buffer(size_t bytes, const void *host)
{
    return tu_buffer(ctx, bytes, host);
}

static void pool_free(pool *p)
{
    clmla_cache_destroy(p->cache);
    for (int s = 0; s < MAX_SEQS; s++) {
        free(p->ckv[s]);
        free(p->kr[s]);
    }
    free(p->table);
    if (p->table_buf)
        clReleaseMemObject(p->table_buf);
    memset(p, 0, sizeof(*p));
}

static int pool_make(pool *p, int rkv, int dr, int bt, clmla_cache_dtype dtype, int nseq, const int *lens, uint64_t seed)
{
    static const char *const dtype_names[] = {"f32", "f16", "bf16", "fp8"};
    memset(p, 0, sizeof(*p));
    const int failed_before = check_failed;
    snprintf(p->name, sizeof(p->name), "rkv%d dr%d bt%d %s", rkv, dr, bt, dtype_names[dtype]);
    p->rkv = rkv;
    p->dr = dr;
    p->bt = bt;
    p->dtype = dtype;
    p->nseq = nseq;
    int blocks = 2, total = 0;
    for (int s = 0; s < nseq; s++) {
        p->len[s] = lens[s];
        total += lens[s];
        blocks += (lens[s] + bt - 1) / bt;
    }
    clmla_cache_config cfg = {1, rkv, dr, bt, blocks, dtype, 0, CLMLA_CACHE_F32};
    CHECK_STATUS(clmla_cache_create(ctx, &cfg, &p->cache), CLMLA_SUCCESS, ctx);
    if (!p->cache)
        return -1;
    tu_rng rng = tu_rng_seed(seed);
    float *ckv = malloc((size_t)total * rkv * sizeof(float)), *kr = malloc((size_t)total * dr * sizeof(float));
    tu_cache_fill_random(ctx, p->cache, p->id, p->len, nseq, rkv, dr, bt, ckv, kr, &rng, failed_before);
    free(ckv);
    free(kr);

    /* the values as the cache holds them, and the block tables (rows padded with other valid ids) */
    p->max_blocks = tu_max_blocks(p->len, nseq, bt);
    p->table = malloc((size_t)nseq * p->max_blocks * sizeof(int32_t));
    for (int s = 0; s < nseq && check_failed == failed_before; s++)
        tu_cache_seq_snapshot(ctx, p->cache, p->id[s], p->len[s], rkv, dr, &p->ckv[s], &p->kr[s],
                              p->table + (size_t)s * p->max_blocks, p->max_blocks, blocks);
    p->table_buf = make_buffer((size_t)nseq * p->max_blocks * sizeof(int32_t), p->table);
    p->key = tu_hash_bytes(TU_HASH_START, p->len, sizeof(p->len));
    const int shape[2] = {rkv, dr};
    p->key = tu_hash_bytes(p->key, shape, sizeof(shape));
    for (int s = 0; s < nseq && check_failed == failed_before; s++) {
        p->key = tu_hash_bytes(p->key, p->ckv[s], (size_t)p->len[s] * rkv * sizeof(double));
        p->key = tu_hash_bytes(p->key, p->kr[s], (size_t)p->len[s] * dr * sizeof(double));
    }
    return check_failed == failed_before ? 0 : -1;
}

/* How a token's index list is made. */
enum {
    ALL,    /* every position in [0, ctx) once, shuffled among topk - ctx entries that name no key */
    SUBSET, /* min(topk, ctx) distinct positions in random order, then -1 */
    HOLES,  /* about half the entries distinct positions, the others no key, shuffled together */
    NONE,   /* no entry names a key */
    DUPS    /* positions drawn with replacement (duplicates), a few -1 */
};

typedef struct tok {
    int seq, ctx, kind;
} tok;

/* An entry that names no key for a context of ctx: -1 mostly, else out of range either way. */
static int32_t no_key(int ctx_len, tu_rng *rng)
{
    switch (tu_rng_below(rng, 6)) {
    case 0:
        return ctx_len;
    case 1:
        return ctx_len + 1 + tu_rng_below(rng, 1000);
    case 2:
        return INT_MAX;
    case 3:
        return -2 - tu_rng_below(rng, 1000);
    default:
        return -1;
    }
}

static void make_list(const tok *k, int topk, int32_t *list, tu_rng *rng)
{
    const int n = k->ctx;
    int *perm = malloc(((size_t)(n > topk ? n : topk) + 1) * sizeof(int));
    switch (k->kind) {
    case ALL:
    case SUBSET:
    case HOLES: {
        tu_shuffle_ints(perm, n, rng);
        const int take = k->kind == HOLES ? (topk / 2 < n ? topk / 2 : n) : topk < n ? topk : n;
        CHECK(k->kind != ALL || topk >= n, "list ALL needs topk %d >= ctx %d", topk, n);
        for (int i = 0; i < topk; i++)
            list[i] = i < take ? perm[i] : k->kind == SUBSET ? -1 : no_key(n, rng);
        if (k->kind != SUBSET) { /* the keys among the others */
            int *order = malloc((size_t)topk * sizeof(int)), *copy = malloc((size_t)topk * sizeof(int));
            tu_shuffle_ints(order, topk, rng);
            for (int i = 0; i < topk; i++)
                copy[i] = list[i];
            for (int i = 0; i < topk; i++)
                list[i] = copy[order[i]];
            free(order);
            free(copy);
        }
        break;
    }
    case NONE:
        for (int i = 0; i < topk; i++)
            list[i] = no_key(n, rng);
        break;
    default: /* DUPS */
        for (int i = 0; i < topk; i++)
            list[i] = tu_rng_below(rng, 8) == 0 || n == 0 ? -1 : tu_rng_below(rng, n);
        break;
    }
    free(perm);
}

/* One call: T tokens of the given sequences, contexts and lists, H heads. With dense (every list
   ALL) the dense call on the same arguments and the dense reference must agree with it too. */
static void run_case(const pool *p, int H, int topk, const tok *toks, int T, int dense, uint64_t seed)
{
    const int rkv = p->rkv, dr = p->dr;
    char what[200];
    snprintf(what, sizeof(what), "%s H=%d T=%d topk=%d", p->name, H, T, topk);
    tu_rng rng = tu_rng_seed(seed);

    /* queries: scores tau*(q~.c + q^R.k) with a standard deviation of about 2 */
    const float tau = 1.0f / sqrtf(192.0f);
    const float amp = (float)sqrt(3.0 * 4.0 / ((double)tau * tau * (rkv + dr)));
    const size_t nq = (size_t)T * H * rkv, nr = (size_t)T * H * dr, nl = (size_t)T * topk;
    float *ql = malloc(nq * sizeof(float)), *qr = malloc(nr * sizeof(float));
    tu_fill_uniform(ql, nq, 0.0f, amp, &rng);
    tu_fill_uniform(qr, nr, 0.0f, amp, &rng);
    int32_t *list = malloc(nl * sizeof(int32_t));
    int32_t seq_of[16], ctx_len[16];
    int max_ctx = 0;
    for (int t = 0; t < T; t++) {
        make_list(&toks[t], topk, list + (size_t)t * topk, &rng);
        seq_of[t] = toks[t].seq;
        ctx_len[t] = toks[t].ctx;
        CHECK(toks[t].ctx <= p->len[toks[t].seq], "%s: token %d: ctx %d past its sequence", what, t, toks[t].ctx);
        max_ctx = toks[t].ctx > max_ctx ? toks[t].ctx : max_ctx;
    }

    /* the reference, token by token */
    double *want = malloc(nq * sizeof(double)), *want_lse = malloc((size_t)T * H * sizeof(double));
    double *dense_want = malloc(nq * sizeof(double)), *dense_lse = malloc((size_t)T * H * sizeof(double));
    double *qt_d = tu_to_double(ql, nq), *qr_d = tu_to_double(qr, nr);
    int valid[16];
    const int shape[4] = {H, topk, T, dense};
    uint64_t case_key = tu_hash_bytes(TU_HASH_START, &seed, sizeof(seed));
    case_key = tu_hash_bytes(case_key, shape, sizeof(shape));
    case_key = tu_hash_bytes(case_key, toks, (size_t)T * sizeof(tok));
    const ref_memo *known = NULL;
    for (int i = 0; i < ref_memo_count && !known; i++)
        if (ref_memo_table[i].pool_key == p->key && ref_memo_table[i].case_key == case_key)
            known = &ref_memo_table[i];
    if (known) {
        memcpy(want, known->want, nq * sizeof(double));
        memcpy(want_lse, known->lse, (size_t)T * H * sizeof(double));
        if (dense) {
            memcpy(dense_want, known->dense_want, nq * sizeof(double));
            memcpy(dense_lse, known->dense_lse, (size_t)T * H * sizeof(double));
        }
        memcpy(valid, known->valid, sizeof(valid));
    }
    for (int t = 0; !known && t < T; t++) {
        const int s = toks[t].seq;
        valid[t] = mla_ref_sparse_latent_attention(H, rkv, dr, (double)tau, toks[t].ctx, list + (size_t)t * topk, topk,
                                                   qt_d + (size_t)t * H * rkv, qr_d + (size_t)t * H * dr, p->ckv[s],
                                                   p->kr[s], want + (size_t)t * H * rkv, want_lse + (size_t)t * H);
        if (dense)
            mla_ref_latent_attention(H, rkv, dr, (double)tau, toks[t].ctx, qt_d + (size_t)t * H * rkv,
                                     qr_d + (size_t)t * H * dr, p->ckv[s], p->kr[s], dense_want + (size_t)t * H * rkv,
                                     dense_lse + (size_t)t * H);
    }
    if (!known && ref_memo_count < REF_MEMO_SIZE) {
        ref_memo *m = &ref_memo_table[ref_memo_count];
        m->want = copy_doubles(want, nq);
        m->lse = copy_doubles(want_lse, (size_t)T * H);
        m->dense_want = dense ? copy_doubles(dense_want, nq) : NULL;
        m->dense_lse = dense ? copy_doubles(dense_lse, (size_t)T * H) : NULL;
        if (m->want && m->lse && (!dense || (m->dense_want && m->dense_lse))) {
            m->pool_key = p->key, m->case_key = case_key;
            memcpy(m->valid, valid, sizeof(valid));
            ref_memo_count++;
        } else {
            free(m->want), free(m->lse), free(m->dense_want), free(m->dense_lse);
            memset(m, 0, sizeof(*m));
        }
    }

    /* device buffers at non-zero offsets; out and lse start as sentinels */
    const size_t q_off = 3, r_off = 1, idx_off = 7, out_off = 5, lse_off = 2, tail = 4;
    const float sentinel = 7777.0f;
    float *ql_host = calloc(q_off + nq, sizeof(float)), *qr_host = calloc(r_off + nr, sizeof(float));
    int32_t *idx_host = malloc((idx_off + nl) * sizeof(int32_t));
    memcpy(ql_host + q_off, ql, nq * sizeof(float));
    memcpy(qr_host + r_off, qr, nr * sizeof(float));
    for (size_t i = 0; i < idx_off; i++)
        idx_host[i] = 0; /* a valid position: reading before the offset would change the result */
    memcpy(idx_host + idx_off, list, nl * sizeof(int32_t));
    const size_t out_n = out_off + nq + tail, lse_n = lse_off + (size_t)T * H + tail;
    float *out = malloc(out_n * sizeof(float)), *lse = malloc(lse_n * sizeof(float));
    for (size_t i = 0; i < out_n; i++)
        out[i] = sentinel;
    for (size_t i = 0; i < lse_n; i++)
        lse[i] = sentinel;
    cl_mem ql_buf = make_buffer((q_off + nq) * sizeof(float), ql_host);
    cl_mem qr_buf = make_buffer((r_off + nr) * sizeof(float), qr_host);
    cl_mem idx_buf = make_buffer((idx_off + nl) * sizeof(int32_t), idx_host);
    cl_mem seq_buf = make_buffer((size_t)T * sizeof(int32_t), seq_of);
    cl_mem len_buf = make_buffer((size_t)T * sizeof(int32_t), ctx_len);
    cl_mem out_buf = make_buffer(out_n * sizeof(float), out);
    cl_mem lse_buf = make_buffer(lse_n * sizeof(float), lse);

    clmla_latent_attention_args a = {.num_tokens = T, .num_heads = H, .softmax_scale = tau, .q_latent = ql_buf,
                                     .q_latent_offset = q_off, .q_rope = qr_buf, .q_rope_offset = r_off,
                                     .block_table = p->table_buf, .max_blocks_per_seq = p->max_blocks,
                                     .token_seq = seq_buf, .token_ctx_len = len_buf, .max_ctx_len = max_ctx,
                                     .out = out_buf, .out_offset = out_off, .lse = lse_buf, .lse_offset = lse_off};
    cl_event ev = NULL;
    const double t0 = tu_seconds();
    clmla_status st = clmla_attention_latent_sparse(p->cache, 0, &a, idx_buf, idx_off, topk, &ev);
    CHECK(st == CLMLA_SUCCESS, "%s: attention_latent_sparse: %s: %s", what, clmla_status_string(st),
          clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS) {
        CHECK(ev != NULL, "%s: no event returned", what);
        if (ev) {
            CHECK(clWaitForEvents(1, &ev) == CL_SUCCESS, "%s: wait", what);
            clReleaseEvent(ev);
        }
        const double t1 = tu_seconds();
        cl_command_queue q = clmla_context_queue(ctx);
        clEnqueueReadBuffer(q, out_buf, CL_TRUE, 0, out_n * sizeof(float), out, 0, NULL, NULL);
        clEnqueueReadBuffer(q, lse_buf, CL_TRUE, 0, lse_n * sizeof(float), lse, 0, NULL, NULL);

        const int outside = tu_count_outside(out, out_n, out_off, nq, sentinel) +
                            tu_count_outside(lse, lse_n, lse_off, (size_t)T * H, sentinel);
        CHECK(outside == 0, "%s: %d values written outside out/lse", what, outside);

        /* the reference reads the cache's rounded values: float32's tolerance for every dtype */
        const double tol = TOL_F32_CACHE;
        float *lse_got = malloc((size_t)T * H * sizeof(float));
        double *lse_want = malloc((size_t)T * H * sizeof(double));
        size_t n_lse = 0;
        for (int t = 0; t < T; t++) {
            const float *got = out + out_off + (size_t)t * H * rkv, *got_lse = lse + lse_off + (size_t)t * H;
            if (valid[t] == 0) {
                int nonzero = 0, not_inf = 0;
                for (size_t i = 0; i < (size_t)H * rkv; i++)
                    nonzero += got[i] != 0.0f;
                for (int h = 0; h < H; h++)
                    not_inf += !(isinf(got_lse[h]) && got_lse[h] < 0);
                CHECK(nonzero == 0 && not_inf == 0,
                      "%s token %d without a valid index: %d outputs not 0, %d lse not -inf (%g)", what, t, nonzero,
                      not_inf, (double)got_lse[0]);
                continue;
            }
            CHECK_CLOSE(got, want + (size_t)t * H * rkv, (size_t)H * rkv, rkv, tol,
                        "%s token %d (seq %d, ctx %d, %d keys listed) out [head, i]", what, t, toks[t].seq, toks[t].ctx,
                        valid[t]);
            for (int h = 0; h < H; h++) {
                lse_got[n_lse] = got_lse[h];
                lse_want[n_lse++] = want_lse[(size_t)t * H + h];
            }
        }
        if (n_lse)
            CHECK_CLOSE(lse_got, lse_want, n_lse, H, tol, "%s lse [token with keys, head]", what);
        printf("# %-48s %s: %.3f s\n", what, dense ? "every position" : "", t1 - t0);

        if (dense) {
            /* every position listed: the dense reference, and the dense call on the same args */
            CHECK_CLOSE(out + out_off, dense_want, nq, rkv, tol, "%s: sparse vs the dense reference [token*head, i]",
                        what);
            for (int i = 0; i < T * H; i++)
                lse_got[i] = lse[lse_off + (size_t)i];
            CHECK_CLOSE(lse_got, dense_lse, (size_t)T * H, H, tol, "%s: sparse lse vs the dense reference", what);
            float *dense_out = malloc(nq * sizeof(float)), *dense_l = malloc((size_t)T * H * sizeof(float));
            st = clmla_attention_latent(p->cache, 0, &a, NULL);
            CHECK(st == CLMLA_SUCCESS, "%s: dense call: %s: %s", what, clmla_status_string(st), clmla_last_error(ctx));
            clEnqueueReadBuffer(q, out_buf, CL_TRUE, out_off * sizeof(float), nq * sizeof(float), dense_out, 0, NULL, NULL);
            clEnqueueReadBuffer(q, lse_buf, CL_TRUE, lse_off * sizeof(float), (size_t)T * H * sizeof(float), dense_l, 0,
                                NULL, NULL);
            double *sparse_out = tu_to_double(out + out_off, nq), *sparse_l = tu_to_double(lse_got, (size_t)T * H);
            CHECK_CLOSE(dense_out, sparse_out, nq, rkv, TOL_AGREE_F32, "%s: dense call vs sparse call [token*head, i]",
                        what);
            CHECK_CLOSE(dense_l, sparse_l, (size_t)T * H, H, TOL_AGREE_F32, "%s: dense lse vs sparse lse", what);
            free(dense_out);
            free(dense_l);
            free(sparse_out);
            free(sparse_l);
        }
        free(lse_got);
        free(lse_want);
    }
    RELEASE_MEMS(ql_buf, qr_buf, idx_buf, seq_buf, len_buf, out_buf, lse_buf);
    free(ql);
    free(qr);
    free(list);
    free(want);
    free(want_lse);
    free(dense_want);
    free(dense_lse);
    free(qt_d);
    free(qr_d);
    free(ql_host);
    free(qr_host);
    free(idx_host);
    free(out);
    free(lse);
}

/* Set while the cases must run attn_latent_mma (group_mma 1): deepseek_cases then checks that its
   16-head slot holds it. */
static int want_mma;

/* DeepSeek's row (512 + 64) in 64-token blocks: sequences of 3000 (ends mid-block), 700, 37, 1. */
static void deepseek_cases(clmla_cache_dtype dtype, uint64_t seed)
{
    static const int lens[] = {3000, 700, 37, 1};
    pool p;
    if (pool_make(&p, 512, 64, 64, dtype, 4, lens, seed) != 0) {
        pool_free(&p);
        return;
    }
    /* several tokens of different sequences, V3.2's topk */
    const tok batch[] = {{0, 3000, SUBSET}, {1, 700, ALL}, {2, 37, HOLES}, {3, 1, ALL}, {0, 2999, NONE}, {1, 650, DUPS}};
    run_case(&p, 16, 2048, batch, 6, 0, seed + 1);
    /* batch 1 decode: the list is split across work-groups and combined */
    const tok one[] = {{0, 3000, SUBSET}};
    run_case(&p, 16, 2048, one, 1, 0, seed + 2);
    /* topk 1, 20 heads (a partial second head group) */
    const tok single[] = {{0, 3000, SUBSET}, {2, 37, SUBSET}, {3, 1, SUBSET}, {1, 700, NONE}};
    run_case(&p, 20, 1, single, 4, 0, seed + 3);
    /* 36 heads: a group of 32 and one of 4 where the CPU kernel takes two vectors of heads */
    run_case(&p, 36, 2048, batch, 6, 0, seed + 6);
    /* topk > ctx, every position: the dense call and reference; batch 1 and a batch */
    const tok all1[] = {{0, 3000, ALL}};
    run_case(&p, 20, 3100, all1, 1, 1, seed + 4);
    const tok all3[] = {{1, 700, ALL}, {2, 37, ALL}, {0, 513, ALL}};
    run_case(&p, 3, 800, all3, 3, 1, seed + 5);
    if (want_mma) {
        char name[64];
        tu_kernel_name(clmla_latent_kernel_built(p.cache, 0, 16, 1, 0, 0, 1), name, sizeof(name));
        CHECK(strcmp(name, "attn_latent_mma") == 0, "%s: group_mma 1 ran %s, not attn_latent_mma", p.name,
              name[0] ? name : "no sparse kernel");
    }
    pool_free(&p);
}

/* Odd sizes: 5-token blocks, rkv 40 / dr 8 (rkv 128 for fp8: a whole scale tile); 1, 3, 16, 20 heads. */
static void odd_cases(int rkv, clmla_cache_dtype dtype, uint64_t seed)
{
    static const int lens[] = {333, 61, 7, 2};
    pool p;
    if (pool_make(&p, rkv, 8, 5, dtype, 4, lens, seed) != 0) {
        pool_free(&p);
        return;
    }
    const tok a[] = {{0, 333, SUBSET}, {1, 61, ALL}, {2, 7, ALL}, {3, 2, HOLES}};
    run_case(&p, 1, 64, a, 4, 0, seed + 1);
    const tok b[] = {{0, 333, ALL}, {1, 61, ALL}};
    run_case(&p, 3, 400, b, 2, 1, seed + 2);
    const tok c[] = {{0, 331, HOLES}, {2, 7, DUPS}, {3, 2, NONE}, {1, 60, SUBSET}, {0, 1, SUBSET}};
    run_case(&p, 20, 17, c, 5, 0, seed + 3);
    const tok d[] = {{0, 333, SUBSET}};
    run_case(&p, 16, 300, d, 1, 0, seed + 4);
    const tok e[] = {{0, 333, DUPS}};
    run_case(&p, 16, 1000, e, 1, 0, seed + 5);
    pool_free(&p);
}

/* Refusals: a status, a message naming the value, and nothing enqueued (out keeps its sentinels). */
static void test_refusals(void)
{
    static const int lens[] = {40};
    pool p;
    if (pool_make(&p, 16, 4, 8, CLMLA_CACHE_F32, 1, lens, 99) != 0) {
        pool_free(&p);
        return;
    }
    enum { T = 2, H = 2, TOPK = 5 };
    float q[T * H * 16] = {0}, sentinel[T * H * 16];
    for (int i = 0; i < T * H * 16; i++)
        sentinel[i] = 55.0f;
    int32_t seq_of[T] = {0, 0}, ctx_len[T] = {40, 3}, list[T * TOPK] = {0, 5, 39, -1, 7, 1, 2, 0, 0, 40};
    cl_mem ql = make_buffer(sizeof(q), q), qr = make_buffer(sizeof(q), q), sq = make_buffer(sizeof(seq_of), seq_of);
    cl_mem ln = make_buffer(sizeof(ctx_len), ctx_len), out = make_buffer(sizeof(sentinel), sentinel);
    cl_mem idx = make_buffer(sizeof(list), list);
    const clmla_latent_attention_args good = {T, H, 0.1f, ql, 0, qr, 0, p.table_buf, p.max_blocks, sq, ln, 40,
                                              out, 0, NULL, 0, 0};
    static const int bad_topk[] = {0, -1, -65536, CLMLA_SPARSE_MAX_TOPK + 1, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof(bad_topk) / sizeof(bad_topk[0]); i++) {
        CHECK_STATUS(clmla_attention_latent_sparse(p.cache, 0, &good, idx, 0, bad_topk[i], NULL),
                     CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        char named[40];
        snprintf(named, sizeof(named), "topk %d", bad_topk[i]);
        CHECK(strstr(clmla_last_error(ctx), named) != NULL, "topk %d: the message '%s' does not name it", bad_topk[i],
              clmla_last_error(ctx));
    }
    CHECK_STATUS(clmla_attention_latent_sparse(p.cache, 0, &good, NULL, 0, TOPK, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
                 ctx);
    CHECK(strstr(clmla_last_error(ctx), "indices is NULL") != NULL, "NULL indices: the message '%s'",
          clmla_last_error(ctx));
    /* a buffer too short for offset + T*topk entries */
    CHECK_STATUS(clmla_attention_latent_sparse(p.cache, 0, &good, idx, 1, TOPK, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
                 ctx);
    CHECK_STATUS(clmla_attention_latent_sparse(p.cache, 0, &good, idx, 0, TOPK + 1, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
                 ctx);
    CHECK(strstr(clmla_last_error(ctx), "topk 6") != NULL, "short indices: the message '%s'", clmla_last_error(ctx));
    /* the dense call's own checks hold too */
    CHECK_STATUS(clmla_attention_latent_sparse(NULL, 0, &good, idx, 0, TOPK, NULL), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_attention_latent_sparse(p.cache, 0, NULL, idx, 0, TOPK, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_attention_latent_sparse(p.cache, 1, &good, idx, 0, TOPK, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    clmla_latent_attention_args a = good;
    a.num_heads = 0;
    CHECK_STATUS(clmla_attention_latent_sparse(p.cache, 0, &a, idx, 0, TOPK, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.out = NULL;
    CHECK_STATUS(clmla_attention_latent_sparse(p.cache, 0, &a, idx, 0, TOPK, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    clFinish(clmla_context_queue(ctx));
    float back[T * H * 16];
    clEnqueueReadBuffer(clmla_context_queue(ctx), out, CL_TRUE, 0, sizeof(back), back, 0, NULL, NULL);
    int touched = 0;
    for (int i = 0; i < T * H * 16; i++)
        touched += back[i] != 55.0f;
    CHECK(touched == 0, "refused calls wrote %d output values", touched);
    CHECK(!clmla_latent_kernel_built(p.cache, 1, 2, 1, 0, 0, 1) && !clmla_latent_kernel_built(p.cache, 0, 2, 1, 0, 0, 1),
          "a refused call built a sparse kernel");

    /* the good call works, builds its kernel once, and a second call creates nothing */
    CHECK_STATUS(clmla_attention_latent_sparse(p.cache, 0, &good, idx, 0, TOPK, NULL), CLMLA_SUCCESS, ctx);
    clFinish(clmla_context_queue(ctx));
    const clmla_cl_counts before = clmla_cl_counts_get(ctx);
    CHECK_STATUS(clmla_attention_latent_sparse(p.cache, 0, &good, idx, 0, TOPK, NULL), CLMLA_SUCCESS, ctx);
    clFinish(clmla_context_queue(ctx));
    const clmla_cl_counts after = clmla_cl_counts_get(ctx);
    CHECK(after.kernels == before.kernels && after.programs == before.programs && after.buffers == before.buffers,
          "a second sparse call created %ld kernels, %ld programs, %ld buffers", after.kernels - before.kernels,
          after.programs - before.programs, after.buffers - before.buffers);
    const int rows = clmla_attention_variant(ctx) == CLMLA_LATENT_ROWS;
    CHECK(clmla_latent_kernel_built(p.cache, rows, 2, 1, 0, 0, 1) != NULL &&
              clmla_latent_kernel_built(p.cache, rows, 2, 0, 0, 0, 1) == NULL,
          "the sparse kernel is not kept in its own entry");
    cl_mem bufs[] = {ql, qr, sq, ln, out, idx};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        clReleaseMemObject(bufs[i]);
    pool_free(&p);
}

static void run_cases(void)
{
    deepseek_cases(CLMLA_CACHE_F32, 1000);
    deepseek_cases(CLMLA_CACHE_F16, 2000);
    deepseek_cases(CLMLA_CACHE_BF16, 3000);
    deepseek_cases(CLMLA_CACHE_FP8, 4000);
    odd_cases(40, CLMLA_CACHE_F32, 5000);
    odd_cases(40, CLMLA_CACHE_F16, 6000);
    odd_cases(40, CLMLA_CACHE_BF16, 7000);
    odd_cases(128, CLMLA_CACHE_FP8, 8000);
}

static void run_all(void)
{
    run_cases();
    test_refusals();
}

int main(void)
{
    if (tu_context_or_skip(&ctx) != 0)
        return 77;
    static const struct {
        int variant;
        const char *name;
    } variants[] = {{CLMLA_LATENT_ROWS, "attn_latent_rows"}, {CLMLA_LATENT_GROUP, "attn_latent"}};
    /* (the row kernel with the defaults' parameters, so that attn_latent_rows runs where the device's
       entry picks attn_latent_lanes: that one has its own runs below) */
    clmla_latent_tuning rows_defaults;
    clmla_latent_tuning_defaults(&rows_defaults);
    for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
        const int failed_before = check_failed;
        clmla_attention_set_variant(ctx, variants[v].variant);
        clmla_context_set_latent_tuning(ctx, variants[v].variant == CLMLA_LATENT_ROWS ? &rows_defaults : NULL);
        run_all();
        clmla_context_set_latent_tuning(ctx, NULL);
        printf("kernel %s -D SPARSE: %s\n", variants[v].name,
               check_failed == failed_before ? "all cases pass" : "FAILURES above");
    }
    /* the CPU kernel with the heads in the lanes of a vector (the latent tuning's rows_lanes: one
       vector of 16, or two), at 8 and 12 keys a tile; the refusals, which name the default
       kernel's slot, are not run again */
    static const int lane_cfg[][2] = {{1, 8}, {1, 12}, {2, 8}, {2, 12}};
    /* (CLMLA_TEST_SWEEPS=short, ci/sanitize.sh: the first only; the others change build options) */
    const size_t num_lane_cfg = tu_sweeps_short() ? 1 : sizeof(lane_cfg) / sizeof(lane_cfg[0]);
    for (size_t i = 0; i < num_lane_cfg; i++) {
        const int failed_before = check_failed;
        clmla_latent_tuning t;
        clmla_latent_tuning_defaults(&t);
        t.rows_lanes = lane_cfg[i][0];
        t.rows_keys = lane_cfg[i][1];
        clmla_context_set_latent_tuning(ctx, &t);
        clmla_attention_set_variant(ctx, CLMLA_LATENT_ROWS);
        run_cases();
        clmla_context_set_latent_tuning(ctx, NULL);
        printf("kernel attn_latent_lanes -D SPARSE, rows_lanes %d, %d keys a tile: %s\n", lane_cfg[i][0],
               lane_cfg[i][1], check_failed == failed_before ? "all cases pass" : "FAILURES above");
    }
    if (num_lane_cfg == 1)
        printf("CLMLA_TEST_SWEEPS=short: not run: lanes sets 2-4\n");
    /* attn_latent_mma (group_mma 1) over DeepSeek's rows in every dtype:
       on a CPU device its products are computed by the work-items in mma.sync's fragment layouts */
    if (clmla_latent_mma_device(ctx)) {
        const int failed_before = check_failed;
        clmla_latent_tuning t;
        clmla_latent_tuning_defaults(&t);
        t.group_mma = 1;
        clmla_context_set_latent_tuning(ctx, &t);
        clmla_attention_set_variant(ctx, CLMLA_LATENT_GROUP);
        want_mma = 1;
        deepseek_cases(CLMLA_CACHE_F32, 9000);
        deepseek_cases(CLMLA_CACHE_F16, 9050);
        deepseek_cases(CLMLA_CACHE_BF16, 9100);
        deepseek_cases(CLMLA_CACHE_FP8, 9200);
        want_mma = 0;
        clmla_context_set_latent_tuning(ctx, NULL);
        printf("kernel attn_latent_mma -D SPARSE: %s\n", check_failed == failed_before ? "all cases pass" : "FAILURES above");
    }
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    for (int i = 0; i < ref_memo_count; i++)
        free(ref_memo_table[i].want), free(ref_memo_table[i].lse), free(ref_memo_table[i].dense_want),
            free(ref_memo_table[i].dense_lse);
    clmla_context_destroy(ctx);
    return check_summary();
}
