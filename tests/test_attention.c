/* clmla_attention_latent alone (the FlashMLA-style entry point): absorbed queries over a paged
   cache filled with clmla_cache_append_cl, through block tables of our own making whose block ids
   are shuffled (never contiguous), for context lengths 0 (output 0, lse -inf), 1, ending mid-block,
   exactly a block, and long (3000, so a split-KV combine runs), for 1, 3, 5, 16 and 128 heads,
   f32 and f16 caches and odd sizes (rkv 40, dr 8, 5-token blocks). Compared with
   mla_ref_latent_attention in float64. Each case runs with both kernels, then the work-group kernel
   again as if the device had 32 KiB of local memory (where 16 heads of a 576-value row must fall
   back to groups of 8). */
#include "attention.h"
#include "check.h"
#include "hooks.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "kernel_tuning.h"
#include "mla_ref.h"
#include "program.h"
#include "test_util.h"
#include "tolerance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static clmla_context *ctx;

/* A cache whose every block is full of known random rows. */
typedef struct pool {
    const char *name;
    clmla_cache *cache;
    int rkv, dr, bt, num_blocks;
    clmla_cache_dtype dtype;
    float *block_ckv; /* [num_blocks, bt, rkv] the rows appended, by block id */
    float *block_kr;  /* [num_blocks, bt, dr] */
    uint64_t key;     /* its seed and shape, and a hash of the rows above (ref_memo) */
} pool;

/* The float64 reference of each case, kept across run_all's repetitions (one per kernel variant
   and tuning set, which change only the device's side): a case's reference depends on its pool's
   rows, its seed and its shape alone, all in the key. */
typedef struct ref_memo {
    uint64_t pool_key, seed; /* seed: the case's seed, lengths and sequences, hashed */
    int heads, tokens;
    double *want, *lse; /* [T, H, rkv], [T, H] */
} ref_memo;
enum { REF_MEMO_SIZE = 64 };
static ref_memo ref_memo_table[REF_MEMO_SIZE];
static int ref_memo_count;

static const ref_memo *ref_memo_find(uint64_t pool_key, uint64_t seed, int heads, int tokens)
{
    for (int i = 0; i < ref_memo_count; i++) {
        const ref_memo *m = &ref_memo_table[i];
        if (m->pool_key == pool_key && m->seed == seed && m->heads == heads && m->tokens == tokens)
            return m;
    }
    return NULL;
}


static cl_mem make_buffer(size_t bytes, const void *host)
{
    return tu_buffer(ctx, bytes, host);
}

/* Fills the pool through three sequences appended in turn (so each one's blocks are scattered),
   in chunks that start and end mid-block, then records which rows landed in which block. */
/* Set while only the caches whose values are decoded (f16, bf16, fp8) are wanted: f32 pools are
   then not made; only_dtypes, where not 0, the cache dtypes wanted (bit 1 << dtype). */
static int decoded_only;
static unsigned only_dtypes;
/* Whether run_all makes MiniCPM3's rkv 256 pools (bf16, fp8), made for attn_latent_mma: in the runs
   of the default parameters and of group_mma only, since each further run compiles their programs
   again (from an empty PoCL cache, minutes on 2 cores). */
static int rkv256_pools = 1;

static int pool_make(pool *p, const char *name, int rkv, int dr, int bt, int num_blocks, clmla_cache_dtype dtype,
                     uint64_t seed)
{
    memset(p, 0, sizeof(*p));
    if ((decoded_only && dtype == CLMLA_CACHE_F32) || (only_dtypes && !(only_dtypes & 1u << dtype)))
        return -1;
    const int failed_before = check_failed;
    p->name = name;
    p->rkv = rkv;
    p->dr = dr;
    p->bt = bt;
    p->num_blocks = num_blocks;
    p->dtype = dtype;
    clmla_cache_config cfg = {1, rkv, dr, bt, num_blocks, dtype, 0, CLMLA_CACHE_F32};
    clmla_status st = clmla_cache_create(ctx, &cfg, &p->cache);
    CHECK(st == CLMLA_SUCCESS, "%s: cache_create: %s: %s", name, clmla_status_string(st), clmla_last_error(ctx));
    if (st != CLMLA_SUCCESS)
        return -1;

    enum { SEQS = 3 };
    const int per_seq = num_blocks / SEQS * bt, extra_last = num_blocks % SEQS * bt;
    const int total = num_blocks * bt;
    tu_rng rng = tu_rng_seed(seed);
    /* All rows, unit variance: c^KV after RMSNorm has rms ~1. */
    float *ckv = malloc((size_t)total * rkv * sizeof(float)), *kr = malloc((size_t)total * dr * sizeof(float));
    tu_fill_uniform(ckv, (size_t)total * rkv, 0.0f, 1.7320508f, &rng);
    tu_fill_uniform(kr, (size_t)total * dr, 0.0f, 1.7320508f, &rng);
    /* fp8: each block of 128 values of a row at its own magnitude, so that its scale differs from
       its neighbours' (scales are powers of two: a kernel reading the wrong block's would pass) */
    static const float block_gain[4] = {1.0f, 2.5f, 0.3f, 5.0f};
    if (dtype == CLMLA_CACHE_FP8)
        for (size_t i = 0; i < (size_t)total * rkv; i++)
            ckv[i] *= block_gain[i % (size_t)rkv / 128 % 4];
    cl_mem ckv_buf = make_buffer((size_t)total * rkv * sizeof(float), ckv);
    cl_mem kr_buf = make_buffer((size_t)total * dr * sizeof(float), kr);
    /* The host copy holds what the cache holds: each float rounded to the dtype (the reference's
       rounding, ref/; exact, since both round the same float32), so the attention is checked at
       float32's tolerance whatever the dtype. */
    double *rc = malloc((size_t)rkv * sizeof(double)), *rr = malloc(((size_t)dr + 1) * sizeof(double));
    for (int t = 0; t < total; t++) {
        for (int i = 0; i < rkv; i++)
            rc[i] = ckv[(size_t)t * rkv + i];
        for (int i = 0; i < dr; i++)
            rr[i] = kr[(size_t)t * dr + i];
        mla_ref_round_cache_row((mla_ref_cache_type)dtype, rc, rkv, rr, dr); /* the same numbering */
        for (int i = 0; i < rkv; i++)
            ckv[(size_t)t * rkv + i] = (float)rc[i];
        for (int i = 0; i < dr; i++)
            kr[(size_t)t * dr + i] = (float)rr[i];
    }
    free(rc);
    free(rr);

    int32_t ids[SEQS];
    int len[SEQS] = {0}, want_len[SEQS], start[SEQS];
    for (int s = 0; s < SEQS; s++) {
        CHECK_STATUS(clmla_cache_seq_add(p->cache, &ids[s]), CLMLA_SUCCESS, ctx);
        want_len[s] = per_seq + (s == SEQS - 1 ? extra_last : 0);
        start[s] = s * per_seq; /* sequence s holds rows start[s] .. of ckv/kr */
    }
    /* Round robin, chunks of 1 .. 2*bt tokens. */
    int done = 0;
    while (!done && check_failed == failed_before) {
        done = 1;
        for (int s = 0; s < SEQS; s++) {
            if (len[s] >= want_len[s])
                continue;
            done = 0;
            int n = 1 + tu_rng_below(&rng, 2 * bt);
            if (n > want_len[s] - len[s])
                n = want_len[s] - len[s];
            size_t row = (size_t)(start[s] + len[s]);
            st = clmla_cache_append_cl(p->cache, 0, ids[s], n, ckv_buf, row * rkv, rkv, kr_buf, row * dr, dr, NULL);
            CHECK(st == CLMLA_SUCCESS, "%s: append %d rows: %s: %s", name, n, clmla_status_string(st),
                  clmla_last_error(ctx));
            len[s] += n;
        }
    }
    clFinish(clmla_context_queue(ctx));
    clReleaseMemObject(ckv_buf);
    clReleaseMemObject(kr_buf);

    p->block_ckv = malloc((size_t)total * rkv * sizeof(float));
    p->block_kr = malloc((size_t)total * dr * sizeof(float));
    int32_t *blocks = malloc((size_t)num_blocks * sizeof(int32_t));
    int seen = 0;
    for (int s = 0; s < SEQS && check_failed == failed_before; s++) {
        int nb = 0;
        CHECK_STATUS(clmla_cache_seq_blocks(p->cache, ids[s], blocks, num_blocks, &nb), CLMLA_SUCCESS, ctx);
        CHECK(nb == want_len[s] / bt, "%s: sequence %d owns %d blocks, expected %d", name, s, nb, want_len[s] / bt);
        for (int k = 0; k < nb && k < want_len[s] / bt; k++) {
            int b = blocks[k];
            CHECK(b >= 0 && b < num_blocks, "%s: block id %d", name, b);
            if (b < 0 || b >= num_blocks)
                continue;
            size_t row = (size_t)start[s] + (size_t)k * bt;
            memcpy(p->block_ckv + (size_t)b * bt * rkv, ckv + row * rkv, (size_t)bt * rkv * sizeof(float));
            memcpy(p->block_kr + (size_t)b * bt * dr, kr + row * dr, (size_t)bt * dr * sizeof(float));
            seen++;
        }
    }
    CHECK(seen == num_blocks, "%s: %d of %d blocks filled", name, seen, num_blocks);
    const int shape[5] = {rkv, dr, bt, num_blocks, (int)dtype};
    p->key = tu_hash_bytes(TU_HASH_START, &seed, sizeof(seed));
    p->key = tu_hash_bytes(p->key, shape, sizeof(shape));
    p->key = tu_hash_bytes(p->key, p->block_ckv, (size_t)total * rkv * sizeof(float));
    p->key = tu_hash_bytes(p->key, p->block_kr, (size_t)total * dr * sizeof(float));
    free(blocks);
    free(ckv);
    free(kr);
    return check_failed == failed_before ? 0 : -1;
}

static void pool_free(pool *p)
{
    clmla_cache_destroy(p->cache);
    free(p->block_ckv);
    free(p->block_kr);
    memset(p, 0, sizeof(*p));
}

/* One call of clmla_attention_latent: T tokens, each attending to the first ctx_len[t] keys of
   virtual sequence seq_of[t]; sequence s walks a shuffled list of distinct blocks. */
typedef struct attn_case {
    int heads;
    int tokens;
    const int *ctx_len; /* [T] */
    const int *seq_of;  /* [T] row of the block table */
    int max_ctx_len;    /* passed to the call (0: the true maximum) */
    int no_lse;         /* also run with lse == NULL and compare */
    int query_len;      /* passed to the call: tokens per sequence (multi-token decode; 0: none) */
} attn_case;

/* Set while the work-group kernel runs as if the device had 32 KiB of local memory. */
static int small_local_mem;

static void run_case(const pool *p, const attn_case *c, uint64_t seed)
{
    const int H = c->heads, T = c->tokens, rkv = p->rkv, dr = p->dr, bt = p->bt;
    char what[160];
    snprintf(what, sizeof(what), "%s H=%d T=%d", p->name, H, T);
    tu_rng rng = tu_rng_seed(seed);

    /* Block table: one row per virtual sequence, distinct blocks in shuffled order. Entries past a
       sequence's last needed block hold other valid blocks, so reading too far is wrong, not a crash. */
    int num_seqs = 0, max_ctx = 0;
    for (int t = 0; t < T; t++) {
        if (c->seq_of[t] + 1 > num_seqs)
            num_seqs = c->seq_of[t] + 1;
        if (c->ctx_len[t] > max_ctx)
            max_ctx = c->ctx_len[t];
    }
    const int max_blocks = (max_ctx + bt - 1) / bt + 1;
    CHECK(max_blocks <= p->num_blocks, "%s: pool too small for %d blocks", what, max_blocks);
    if (max_blocks > p->num_blocks)
        return;
    int32_t *table = malloc((size_t)num_seqs * max_blocks * sizeof(int32_t));
    int *perm = malloc((size_t)p->num_blocks * sizeof(int));
    for (int s = 0; s < num_seqs; s++) {
        tu_shuffle_ints(perm, p->num_blocks, &rng);
        for (int k = 0; k < max_blocks; k++)
            table[s * max_blocks + k] = perm[k];
    }
    int contiguous = 1;
    for (int k = 1; k < max_blocks; k++)
        contiguous &= table[k] == table[k - 1] + 1;
    CHECK(max_blocks < 3 || !contiguous, "%s: the shuffled table came out contiguous", what);

    /* Queries: scores tau*(q~.c + q^R.k) with a standard deviation of about 2. */
    const float tau = 1.0f / sqrtf(192.0f);
    const double v = 4.0 / ((double)tau * tau * (rkv + dr));
    const float amp = (float)sqrt(3.0 * v);
    const size_t nq = (size_t)T * H * rkv, nr = (size_t)T * H * dr;
    float *ql = malloc(nq * sizeof(float)), *qr = malloc((nr + 1) * sizeof(float));
    tu_fill_uniform(ql, nq, 0.0f, amp, &rng);
    tu_fill_uniform(qr, nr, 0.0f, amp, &rng);

    /* The reference, token by token (or as an earlier repetition of this case computed it). */
    double *want = malloc(nq * sizeof(double)), *want_lse = malloc((size_t)T * H * sizeof(double));
    double *qt_d = malloc((size_t)H * rkv * sizeof(double)), *qr_d = malloc(((size_t)H * dr + 1) * sizeof(double));
    double *keys_c = malloc(((size_t)max_ctx * rkv + 1) * sizeof(double));
    double *keys_r = malloc(((size_t)max_ctx * dr + 1) * sizeof(double));
    uint64_t case_key = tu_hash_bytes(TU_HASH_START, &seed, sizeof(seed));
    case_key = tu_hash_bytes(case_key, c->ctx_len, (size_t)T * sizeof(int));
    case_key = tu_hash_bytes(case_key, c->seq_of, (size_t)T * sizeof(int));
    const ref_memo *known = ref_memo_find(p->key, case_key, H, T);
    if (known) {
        memcpy(want, known->want, nq * sizeof(double));
        memcpy(want_lse, known->lse, (size_t)T * H * sizeof(double));
    }
    for (int t = 0; !known && t < T; t++) {
        const int n = c->ctx_len[t];
        const int32_t *row = table + (size_t)c->seq_of[t] * max_blocks;
        for (int j = 0; j < n; j++) {
            size_t src = (size_t)row[j / bt] * bt + (size_t)(j % bt);
            for (int i = 0; i < rkv; i++)
                keys_c[(size_t)j * rkv + i] = p->block_ckv[src * rkv + i];
            for (int i = 0; i < dr; i++)
                keys_r[(size_t)j * dr + i] = p->block_kr[src * dr + i];
        }
        for (size_t i = 0; i < (size_t)H * rkv; i++)
            qt_d[i] = ql[(size_t)t * H * rkv + i];
        for (size_t i = 0; i < (size_t)H * dr; i++)
            qr_d[i] = qr[(size_t)t * H * dr + i];
        mla_ref_latent_attention(H, rkv, dr, (double)tau, n, qt_d, qr_d, keys_c, keys_r, want + (size_t)t * H * rkv,
                                 want_lse + (size_t)t * H);
    }
    if (!known && ref_memo_count < REF_MEMO_SIZE) {
        ref_memo *m = &ref_memo_table[ref_memo_count];
        m->want = malloc(nq * sizeof(double));
        m->lse = malloc((size_t)T * H * sizeof(double));
        if (m->want && m->lse) {
            memcpy(m->want, want, nq * sizeof(double));
            memcpy(m->lse, want_lse, (size_t)T * H * sizeof(double));
            m->pool_key = p->key, m->seed = case_key, m->heads = H, m->tokens = T;
            ref_memo_count++;
        } else {
            free(m->want), free(m->lse);
            m->want = m->lse = NULL;
        }
    }

    /* Device buffers, every one at a non-zero offset; out and lse start as sentinels. */
    const size_t q_off = 3, r_off = 1, out_off = 5, lse_off = 2, tail = 4;
    const float sentinel = 7777.0f;
    float *ql_host = calloc(q_off + nq, sizeof(float)), *qr_host = calloc(r_off + nr + 1, sizeof(float));
    memcpy(ql_host + q_off, ql, nq * sizeof(float));
    memcpy(qr_host + r_off, qr, nr * sizeof(float));
    size_t out_n = out_off + nq + tail, lse_n = lse_off + (size_t)T * H + tail;
    float *out = malloc(out_n * sizeof(float)), *lse = malloc(lse_n * sizeof(float));
    for (size_t i = 0; i < out_n; i++)
        out[i] = sentinel;
    for (size_t i = 0; i < lse_n; i++)
        lse[i] = sentinel;
    int32_t *seq_of = malloc((size_t)T * sizeof(int32_t)), *ctx_len = malloc((size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++) {
        seq_of[t] = c->seq_of[t];
        ctx_len[t] = c->ctx_len[t];
    }
    cl_mem ql_buf = make_buffer((q_off + nq) * sizeof(float), ql_host);
    cl_mem qr_buf = make_buffer((r_off + nr + 1) * sizeof(float), qr_host);
    cl_mem table_buf = make_buffer((size_t)num_seqs * max_blocks * sizeof(int32_t), table);
    cl_mem seq_buf = make_buffer((size_t)T * sizeof(int32_t), seq_of);
    cl_mem len_buf = make_buffer((size_t)T * sizeof(int32_t), ctx_len);
    cl_mem out_buf = make_buffer(out_n * sizeof(float), out);
    cl_mem lse_buf = make_buffer(lse_n * sizeof(float), lse);

    clmla_latent_attention_args a = {.num_tokens = T, .num_heads = H, .softmax_scale = tau, .q_latent = ql_buf,
                                     .q_latent_offset = q_off, .q_rope = qr_buf, .q_rope_offset = r_off,
                                     .block_table = table_buf, .max_blocks_per_seq = max_blocks, .token_seq = seq_buf,
                                     .token_ctx_len = len_buf, .max_ctx_len = c->max_ctx_len ? c->max_ctx_len : max_ctx,
                                     .out = out_buf, .out_offset = out_off, .lse = lse_buf, .lse_offset = lse_off,
                                     .query_len = c->query_len};
    cl_event ev = NULL;
    double t0 = tu_seconds();
    clmla_status st = clmla_attention_latent(p->cache, 0, &a, &ev);
    CHECK(st == CLMLA_SUCCESS, "%s: attention_latent: %s: %s", what, clmla_status_string(st), clmla_last_error(ctx));
    /* 16 heads' queries of a 576-value row take 36 KiB: there the work-group kernel must fall back
       to 8 heads; rows of 288 (18 KiB of queries, with 64 items) and 48 leave room for 16 */
    if (st == CLMLA_SUCCESS && small_local_mem && H >= 16) {
        const int want16 = rkv + dr <= 288;
        CHECK(want16 ? clmla_latent_kernel_built(p->cache, 0, 16, 0, 0, 0, 1) != NULL
                     : !clmla_latent_kernel_built(p->cache, 0, 16, 0, 0, 0, 1) &&
                           clmla_latent_kernel_built(p->cache, 0, 8, 0, 0, 0, 1),
              "%s: with %llu bytes of local memory the work-group kernel should take %d heads", what,
              (unsigned long long)ctx->info.local_mem_bytes, want16 ? 16 : 8);
    }
    /* the work-group kernel folded the tokens of each sequence where its heads leave room: the
       kernel of the expected fold (the smallest power of two >= query_len, at most group_heads / H,
       16 / H by default) was built */
    clmla_latent_tuning tn;
    clmla_latent_tuning_for(ctx, H, &tn);
    const int gh = tn.group_heads;
    if (st == CLMLA_SUCCESS && clmla_attention_variant(ctx) == CLMLA_LATENT_GROUP && c->query_len > 1 && 2 * H <= gh) {
        int fold = 1, level = -1;
        while (fold < c->query_len && 2 * fold * H <= gh)
            fold *= 2, level++;
        CHECK(small_local_mem || clmla_latent_kernel_built(p->cache, 0, H * fold, 0, 0, 0, fold) != NULL,
              "%s, query_len %d: no attn_latent kernel folding %d tokens of %d heads", what, c->query_len, fold, H);
        int any = 0;
        for (int f = 2; f <= 16; f *= 2)
            any |= clmla_latent_kernel_built(p->cache, 0, H * f, 0, 0, 0, f) != NULL;
        /* with 32 KiB of local memory 16 heads' queries of 576 values do not fit: 8 (2 x 4 heads) do */
        CHECK(any || (small_local_mem && 2 * H > 8), "%s, query_len %d: no folded attn_latent kernel", what,
              c->query_len);
    }
    /* the CPU kernel with two vectors (rows_lanes 2) took two tokens of 16 to 31 heads together */
    if (st == CLMLA_SUCCESS && clmla_attention_variant(ctx) == CLMLA_LATENT_ROWS && c->query_len > 1 && H >= 16 &&
        H < 32) {
        clmla_latent_tuning tn;
        clmla_latent_tuning_for(ctx, H, &tn);
        CHECK(tn.rows_lanes != 2 || clmla_latent_kernel_built(p->cache, 1, 16, 0, 0, 2, 2) != NULL,
              "%s, query_len %d: no attn_latent_lanes kernel taking two tokens of %d heads", what, c->query_len, H);
    }
    if (st == CLMLA_SUCCESS) {
        CHECK(ev != NULL, "%s: no event returned", what);
        if (ev) {
            CHECK(clWaitForEvents(1, &ev) == CL_SUCCESS, "%s: wait", what);
            clReleaseEvent(ev);
        }
        double t1 = tu_seconds();
        cl_command_queue q = clmla_context_queue(ctx);
        clEnqueueReadBuffer(q, out_buf, CL_TRUE, 0, out_n * sizeof(float), out, 0, NULL, NULL);
        clEnqueueReadBuffer(q, lse_buf, CL_TRUE, 0, lse_n * sizeof(float), lse, 0, NULL, NULL);

        /* Nothing outside [offset, offset + size) is written. */
        const int outside = tu_count_outside(out, out_n, out_off, nq, sentinel) +
                            tu_count_outside(lse, lse_n, lse_off, (size_t)T * H, sentinel);
        CHECK(outside == 0, "%s: %d values written outside out/lse", what, outside);

        const double tol = TOL_F32_CACHE; /* the reference reads the cache's rounded values */
        double *lse_want = malloc((size_t)T * H * sizeof(double));
        float *lse_got = malloc((size_t)T * H * sizeof(float));
        size_t n_lse = 0;
        for (int t = 0; t < T; t++) {
            const float *got = out + out_off + (size_t)t * H * rkv;
            const float *got_lse = lse + lse_off + (size_t)t * H;
            if (c->ctx_len[t] == 0) {
                int nonzero = 0, not_inf = 0;
                for (size_t i = 0; i < (size_t)H * rkv; i++)
                    nonzero += got[i] != 0.0f;
                for (int h = 0; h < H; h++)
                    not_inf += !(isinf(got_lse[h]) && got_lse[h] < 0);
                CHECK(nonzero == 0 && not_inf == 0, "%s token %d with no keys: %d outputs not 0, %d lse not -inf (%g)",
                      what, t, nonzero, not_inf, (double)got_lse[0]);
                continue;
            }
            CHECK_CLOSE(got, want + (size_t)t * H * rkv, (size_t)H * rkv, rkv, tol,
                        "%s token %d (ctx %d, table row %d) out [head, i]", what, t, c->ctx_len[t], c->seq_of[t]);
            for (int h = 0; h < H; h++) {
                lse_got[n_lse] = got_lse[h];
                lse_want[n_lse++] = want_lse[(size_t)t * H + h];
            }
        }
        CHECK_CLOSE(lse_got, lse_want, n_lse, H, tol, "%s lse [token with keys, head]", what);
        free(lse_want);
        free(lse_got);
        printf("# %-40s max ctx %4d: %.3f s\n", what, max_ctx, t1 - t0);

        /* Without lse: the same output. */
        if (c->no_lse) {
            double *first = tu_to_double(out + out_off, nq);
            float *again = malloc(nq * sizeof(float));
            a.lse = NULL;
            a.lse_offset = 0;
            st = clmla_attention_latent(p->cache, 0, &a, NULL);
            CHECK(st == CLMLA_SUCCESS, "%s without lse: %s: %s", what, clmla_status_string(st), clmla_last_error(ctx));
            clEnqueueReadBuffer(q, out_buf, CL_TRUE, out_off * sizeof(float), nq * sizeof(float), again, 0, NULL, NULL);
            CHECK_CLOSE(again, first, nq, rkv, TOL_AGREE_FOR_DTYPE(p->dtype), "%s without lse vs with", what);
            free(first);
            free(again);
        }
    }
    clReleaseMemObject(ql_buf);
    clReleaseMemObject(qr_buf);
    clReleaseMemObject(table_buf);
    clReleaseMemObject(seq_buf);
    clReleaseMemObject(len_buf);
    clReleaseMemObject(out_buf);
    clReleaseMemObject(lse_buf);
    free(table);
    free(perm);
    free(ql);
    free(qr);
    free(want);
    free(want_lse);
    free(qt_d);
    free(qr_d);
    free(keys_c);
    free(keys_r);
    free(ql_host);
    free(qr_host);
    free(out);
    free(lse);
    free(seq_of);
    free(ctx_len);
}

/* Bad arguments: the status, and the output buffer untouched. */
static void test_bad_arguments(const pool *p)
{
    const int T = 2, H = 2;
    float zeros[2 * 2 * 64] = {0};
    int32_t table[2] = {0, 1}, seq_of[2] = {0, 0}, ctx_len[2] = {3, 1};
    cl_mem ql = make_buffer(sizeof(float) * T * H * p->rkv, NULL);
    cl_mem qr = make_buffer(sizeof(zeros), zeros);
    cl_mem tb = make_buffer(sizeof(table), table);
    cl_mem sq = make_buffer(sizeof(seq_of), seq_of);
    cl_mem ln = make_buffer(sizeof(ctx_len), ctx_len);
    cl_mem out = make_buffer(sizeof(float) * T * H * p->rkv, NULL);
    clmla_latent_attention_args good = {T, H, 0.1f, ql, 0, qr, 0, tb, 2, sq, ln, 3, out, 0, NULL, 0, 0};
    clmla_latent_attention_args a;

    CHECK_STATUS(clmla_attention_latent(NULL, 0, &good, NULL), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, NULL, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_attention_latent(p->cache, 1, &good, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_attention_latent(p->cache, -1, &good, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.num_heads = 0;
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.num_tokens = -1;
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.q_latent = NULL;
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.q_rope = NULL;
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.out = NULL;
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.block_table = NULL;
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.token_seq = NULL;
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.token_ctx_len = NULL;
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.max_ctx_len = -1;
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    a = good;
    a.max_blocks_per_seq = -1;
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    /* query_len: negative, or not dividing the tokens (2 here) */
    for (int q = -1; q <= 3; q += 4) {
        a = good;
        a.query_len = q;
        CHECK_STATUS(clmla_attention_latent(p->cache, 0, &a, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(strstr(clmla_last_error(ctx), "query_len") != NULL, "query_len %d: the message names it: %s", q,
              clmla_last_error(ctx));
    }
    /* And the good call works (so the statuses above came from the arguments). */
    CHECK_STATUS(clmla_attention_latent(p->cache, 0, &good, NULL), CLMLA_SUCCESS, ctx);
    clFinish(clmla_context_queue(ctx));
    clReleaseMemObject(ql);
    clReleaseMemObject(qr);
    clReleaseMemObject(tb);
    clReleaseMemObject(sq);
    clReleaseMemObject(ln);
    clReleaseMemObject(out);
}

static void run_all(void)
{
    pool p;
    /* DeepSeek's cache row (512 + 64), 64-token blocks, f32. */
    if (pool_make(&p, "rkv512 dr64 bt64 f32", 512, 64, 64, 64, CLMLA_CACHE_F32, 1) == 0) {
        static const int len1[] = {1, 37, 64, 3000, 0, 200, 65};
        static const int seq1[] = {0, 1, 2, 3, 4, 0, 1};
        attn_case c1 = {1, 7, len1, seq1, 0, 0, 0};
        run_case(&p, &c1, 101);
        /* A prefill-like run of one sequence (consecutive lengths) beside other sequences. */
        static const int len3[] = {100, 101, 102, 103, 104, 1, 0, 3000, 129};
        static const int seq3[] = {2, 2, 2, 2, 2, 0, 1, 1, 3};
        attn_case c3 = {3, 9, len3, seq3, 0, 0, 0};
        run_case(&p, &c3, 103);
        static const int len16[] = {3000, 1, 129, 0, 2999, 63};
        static const int seq16[] = {0, 1, 0, 2, 3, 4};
        attn_case c16 = {16, 6, len16, seq16, 0, 1, 0};
        run_case(&p, &c16, 116);
        /* 128 heads, and a max_ctx_len that is only an upper bound (the table's 48 blocks * 64). */
        static const int len128[] = {3000, 65, 1, 0};
        static const int seq128[] = {0, 1, 2, 3};
        attn_case c128 = {128, 4, len128, seq128, 48 * 64, 0, 0};
        run_case(&p, &c128, 128);
        /* One decode token: a single work-group's worth of heads, so the keys are split on any
           device (the split count grows as the grid shrinks) and the combine step runs. */
        static const int len_one[] = {3000};
        static const int seq_one[] = {0};
        attn_case one16 = {16, 1, len_one, seq_one, 0, 0, 0};
        run_case(&p, &one16, 117);
        attn_case one3 = {3, 1, len_one, seq_one, 0, 0, 0};
        run_case(&p, &one3, 104);
        /* Multi-token decode (query_len): the work-group kernel takes a sequence's tokens together
           where it has fewer heads than a group holds. 4 heads x 4 tokens per group, three
           sequences, lengths ending mid-tile and starting at 1 key. */
        static const int len_q4[] = {2997, 2998, 2999, 3000, 1, 2, 3, 4, 126, 127, 128, 129};
        static const int seq_q4[] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2};
        attn_case q4 = {4, 12, len_q4, seq_q4, 0, 0, 4};
        run_case(&p, &q4, 140);
        /* 3 heads, 3 tokens per sequence in groups of 4 token places (the run ends inside a group),
           a token without keys and lengths in no order */
        static const int len_q3[] = {0, 1, 2, 3000, 2999, 3000};
        static const int seq_q3[] = {0, 0, 0, 1, 1, 1};
        attn_case q3 = {3, 6, len_q3, seq_q3, 0, 1, 3};
        run_case(&p, &q3, 141);
        /* one sequence of 4 tokens with 4 heads, split over its 3000 keys and merged */
        static const int len_q1[] = {2997, 2998, 2999, 3000};
        static const int seq_q1[] = {3, 3, 3, 3};
        attn_case q1 = {4, 4, len_q1, seq_q1, 0, 0, 4};
        run_case(&p, &q1, 142);
        /* 8 heads x 2 tokens, 2 heads x 5 tokens (groups of 8 token places), 1 head x 16 tokens, and
           16 heads, which leave no room to fold */
        static const int len_q2[] = {1000, 1001, 65, 66};
        static const int seq_q2[] = {1, 1, 0, 0};
        attn_case q2 = {8, 4, len_q2, seq_q2, 0, 0, 2};
        run_case(&p, &q2, 143);
        static const int len_q5[] = {60, 61, 62, 63, 64, 296, 297, 298, 299, 300};
        static const int seq_q5[] = {4, 4, 4, 4, 4, 2, 2, 2, 2, 2};
        attn_case q5 = {2, 10, len_q5, seq_q5, 0, 0, 5};
        run_case(&p, &q5, 145);
        static const int len_q16[] = {385, 386, 387, 388, 389, 390, 391, 392, 393, 394, 395, 396, 397, 398, 399, 400};
        static const int seq_q16[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
        attn_case q16 = {1, 16, len_q16, seq_q16, 0, 0, 16};
        run_case(&p, &q16, 146);
        attn_case h16 = {16, 4, len_q1, seq_q1, 0, 0, 4};
        run_case(&p, &h16, 147);
        /* 16 heads x 3 tokens per sequence (rows_lanes 2 puts two tokens in a work-item: a pair and a
           token alone), one run causal, one with a token without keys and lengths in no order */
        static const int len_h3[] = {2998, 2999, 3000, 130, 0, 129};
        static const int seq_h3[] = {2, 2, 2, 4, 4, 4};
        attn_case h3 = {16, 6, len_h3, seq_h3, 0, 1, 3};
        run_case(&p, &h3, 148);
        test_bad_arguments(&p);
        pool_free(&p);
    }

    /* The same rows in half precision. */
    if (pool_make(&p, "rkv512 dr64 bt64 f16", 512, 64, 64, 64, CLMLA_CACHE_F16, 2) == 0) {
        static const int len16[] = {3000, 37, 1, 0, 640};
        static const int seq16[] = {0, 1, 2, 3, 0};
        attn_case c16 = {16, 5, len16, seq16, 0, 1, 0};
        run_case(&p, &c16, 216);
        static const int len128[] = {2000, 1, 64};
        static const int seq128[] = {0, 1, 2};
        attn_case c128 = {128, 3, len128, seq128, 0, 0, 0};
        run_case(&p, &c128, 228);
        static const int len_one[] = {2500};
        static const int seq_one[] = {0};
        attn_case one = {16, 1, len_one, seq_one, 0, 0, 0};
        run_case(&p, &one, 217);
        pool_free(&p);
    }

    /* The same rows in bfloat16. */
    if (pool_make(&p, "rkv512 dr64 bt64 bf16", 512, 64, 64, 64, CLMLA_CACHE_BF16, 5) == 0) {
        static const int len16[] = {3000, 37, 1, 0, 640};
        static const int seq16[] = {0, 1, 2, 3, 0};
        attn_case c16 = {16, 5, len16, seq16, 0, 1, 0};
        run_case(&p, &c16, 516);
        static const int len_one[] = {2500};
        static const int seq_one[] = {0};
        attn_case one = {16, 1, len_one, seq_one, 0, 0, 0};
        run_case(&p, &one, 517);
        /* multi-token decode over a decoded cache: 4 heads x 4 tokens folded, and 2 heads x 5 */
        static const int len_q4[] = {2997, 2998, 2999, 3000, 126, 127, 128, 129};
        static const int seq_q4[] = {0, 0, 0, 0, 2, 2, 2, 2};
        attn_case q4 = {4, 8, len_q4, seq_q4, 0, 0, 4};
        run_case(&p, &q4, 540);
        static const int len_q5[] = {60, 61, 62, 63, 64, 296, 297, 298, 299, 300};
        static const int seq_q5[] = {4, 4, 4, 4, 4, 2, 2, 2, 2, 2};
        attn_case q5 = {2, 10, len_q5, seq_q5, 0, 0, 5};
        run_case(&p, &q5, 545);
        pool_free(&p);
    }

    /* The same rows in fp8 (FlashMLA's layout: 656 bytes a row). */
    if (pool_make(&p, "rkv512 dr64 bt64 fp8", 512, 64, 64, 64, CLMLA_CACHE_FP8, 7) == 0) {
        static const int len16[] = {3000, 37, 1, 0, 640};
        static const int seq16[] = {0, 1, 2, 3, 0};
        attn_case c16 = {16, 5, len16, seq16, 0, 1, 0};
        run_case(&p, &c16, 716);
        static const int len_one[] = {2500};
        static const int seq_one[] = {0};
        attn_case one = {16, 1, len_one, seq_one, 0, 0, 0};
        run_case(&p, &one, 717);
        /* multi-token decode over fp8: 8 heads x 2 tokens folded */
        static const int len_q2[] = {1000, 1001, 65, 66};
        static const int seq_q2[] = {1, 1, 0, 0};
        attn_case q2 = {8, 4, len_q2, seq_q2, 0, 0, 2};
        run_case(&p, &q2, 743);
        pool_free(&p);
    }
    /* fp8 with one scale a row, odd heads and 5-token blocks. */
    if (pool_make(&p, "rkv128 dr8 bt5 fp8", 128, 8, 5, 640, CLMLA_CACHE_FP8, 8) == 0) {
        static const int len3[] = {3000, 12, 1, 0, 5, 2048};
        static const int seq3[] = {0, 1, 2, 3, 4, 1};
        attn_case c3 = {3, 6, len3, seq3, 0, 0, 0};
        run_case(&p, &c3, 803);
        static const int len17[] = {1999, 6};
        static const int seq17[] = {2, 0};
        attn_case c17 = {17, 2, len17, seq17, 0, 0, 0};
        run_case(&p, &c17, 817);
        pool_free(&p);
    }

    /* Odd sizes: rkv 40, dr 8 (not a multiple of any tile), 16-token blocks. */
    if (pool_make(&p, "rkv40 dr8 bt16 f32", 40, 8, 16, 200, CLMLA_CACHE_F32, 3) == 0) {
        static const int len3[] = {3000, 17, 1, 0, 255, 16, 31};
        static const int seq3[] = {0, 1, 2, 3, 4, 1, 0};
        attn_case c3 = {3, 7, len3, seq3, 0, 1, 0};
        run_case(&p, &c3, 303);
        static const int len5[] = {5, 6, 7, 1000};
        static const int seq5[] = {0, 0, 0, 1};
        attn_case c5 = {5, 4, len5, seq5, 0, 0, 0};
        run_case(&p, &c5, 305);
        static const int len1[] = {1, 2, 3000};
        static const int seq1[] = {0, 0, 1};
        attn_case c1 = {1, 3, len1, seq1, 0, 0, 0};
        run_case(&p, &c1, 301);
        pool_free(&p);
    }

    /* A latent rank that is not whole vectors of 8 (rkv 44, dr 6: a row of 50) with 20 heads (a
       full group of 16 and one of 4), 16 and 36 (32 and 4), 7-token blocks, f32 and bf16. */
    if (pool_make(&p, "rkv44 dr6 bt7 f32", 44, 6, 7, 500, CLMLA_CACHE_F32, 9) == 0) {
        static const int len20[] = {1500, 9, 1, 0, 700};
        static const int seq20[] = {0, 1, 2, 3, 4};
        attn_case c20 = {20, 5, len20, seq20, 0, 1, 0};
        run_case(&p, &c20, 4420);
        static const int len16[] = {2047, 2};
        static const int seq16[] = {1, 0};
        attn_case c16 = {16, 2, len16, seq16, 0, 0, 0};
        run_case(&p, &c16, 4416);
        attn_case c36 = {36, 5, len20, seq20, 0, 0, 0};
        run_case(&p, &c36, 4436);
        pool_free(&p);
    }
    if (pool_make(&p, "rkv44 dr6 bt7 bf16", 44, 6, 7, 500, CLMLA_CACHE_BF16, 10) == 0) {
        static const int len20[] = {1500, 9, 1, 0, 700};
        static const int seq20[] = {0, 1, 2, 3, 4};
        attn_case c20 = {20, 5, len20, seq20, 0, 0, 0};
        run_case(&p, &c20, 4421);
        /* 20 heads x 2 tokens per sequence over a decoded cache: a second group of 4 heads */
        static const int len_q2[] = {700, 701, 8, 9};
        static const int seq_q2[] = {4, 4, 1, 1};
        attn_case q2 = {20, 4, len_q2, seq_q2, 0, 0, 2};
        run_case(&p, &q2, 4422);
        pool_free(&p);
    }

    /* 5-token blocks in half precision, and in bfloat16. */
    if (pool_make(&p, "rkv40 dr8 bt5 bf16", 40, 8, 5, 640, CLMLA_CACHE_BF16, 6) == 0) {
        static const int len3[] = {3000, 12, 1, 0, 5, 2048};
        static const int seq3[] = {0, 1, 2, 3, 4, 1};
        attn_case c3 = {3, 6, len3, seq3, 0, 0, 0};
        run_case(&p, &c3, 603);
        pool_free(&p);
    }
    if (pool_make(&p, "rkv40 dr8 bt5 f16", 40, 8, 5, 640, CLMLA_CACHE_F16, 4) == 0) {
        static const int len3[] = {3000, 12, 1, 0, 5, 2048};
        static const int seq3[] = {0, 1, 2, 3, 4, 1};
        attn_case c3 = {3, 6, len3, seq3, 0, 0, 0};
        run_case(&p, &c3, 403);
        static const int len16[] = {333, 1};
        static const int seq16[] = {0, 1};
        attn_case c16 = {16, 2, len16, seq16, 0, 0, 0};
        run_case(&p, &c16, 416);
        pool_free(&p);
    }
    /* MiniCPM3's row (256 + 32) in bfloat16 with 16-token blocks: 3 heads (a group of 16 rows with
       13 empty), 40 (groups of 16, 16 and 8) and 128, lengths ending inside a tile (of 32 or 64 keys) */
    if (rkv256_pools && pool_make(&p, "rkv256 dr32 bt16 bf16", 256, 32, 16, 240, CLMLA_CACHE_BF16, 11) == 0) {
        static const int len3[] = {1200, 33, 1, 0, 31, 1000};
        static const int seq3[] = {0, 1, 2, 0, 1, 2};
        attn_case c3 = {3, 6, len3, seq3, 0, 1, 0};
        run_case(&p, &c3, 1103);
        static const int len40[] = {1279, 65};
        static const int seq40[] = {0, 1};
        attn_case c40 = {40, 2, len40, seq40, 0, 0, 0};
        run_case(&p, &c40, 1140);
        static const int len128[] = {97, 1};
        static const int seq128[] = {2, 0};
        attn_case c128 = {128, 2, len128, seq128, 0, 0, 0};
        run_case(&p, &c128, 1128);
        pool_free(&p);
    }
    /* The same row in fp8: 328 bytes (8-byte aligned, not 16), two scales a row */
    if (rkv256_pools && pool_make(&p, "rkv256 dr32 bt16 fp8", 256, 32, 16, 240, CLMLA_CACHE_FP8, 12) == 0) {
        static const int len3[] = {1200, 33, 1, 0, 31, 1000};
        static const int seq3[] = {0, 1, 2, 0, 1, 2};
        attn_case c3 = {3, 6, len3, seq3, 0, 0, 0};
        run_case(&p, &c3, 1203);
        static const int len40[] = {1279, 65};
        static const int seq40[] = {0, 1};
        attn_case c40 = {40, 2, len40, seq40, 0, 0, 0};
        run_case(&p, &c40, 1240);
        pool_free(&p);
    }
}

/* attn_latent_mma (group_mma 1) is the kernel that runs where it applies, attn_latent where not:
   the bf16, fp8 and f32 rows of rkv 512 and 256 take it, for one token a group (16 heads) and for
   4 tokens of 4 heads folded into a group's 16 rows (multi-token decode), and so do f16 rows of rkv
   512; bf16 rows of rkv 40 and fp8 rows of rkv 128 do not */
static void test_mma_chosen(void)
{
    clmla_latent_tuning t;
    clmla_latent_tuning_defaults(&t);
    t.group_mma = 1;
    clmla_context_set_latent_tuning(ctx, &t);
    clmla_attention_set_variant(ctx, CLMLA_LATENT_GROUP);
    static const struct {
        int rkv, dr, bt;
        clmla_cache_dtype dtype;
        const char *want;
    } cfg[] = {{512, 64, 64, CLMLA_CACHE_BF16, "attn_latent_mma"},
               {256, 32, 16, CLMLA_CACHE_BF16, "attn_latent_mma"},
               {512, 64, 64, CLMLA_CACHE_F32, "attn_latent_mma"},
               {256, 32, 16, CLMLA_CACHE_F32, "attn_latent_mma"},
               {512, 64, 64, CLMLA_CACHE_FP8, "attn_latent_mma"},
               {256, 32, 16, CLMLA_CACHE_FP8, "attn_latent_mma"},
               {128, 8, 5, CLMLA_CACHE_FP8, "attn_latent"},
               {512, 64, 64, CLMLA_CACHE_F16, "attn_latent_mma"},
               {40, 8, 5, CLMLA_CACHE_BF16, "attn_latent"}};
    for (size_t i = 0; i < sizeof(cfg) / sizeof(cfg[0]); i++) {
        pool p;
        if (pool_make(&p, "kernel choice", cfg[i].rkv, cfg[i].dr, cfg[i].bt, 24, cfg[i].dtype, 12 + i) != 0)
            continue;
        static const int len[] = {100};
        static const int seq[] = {0};
        const attn_case c = {16, 1, len, seq, 0, 0, 0};
        run_case(&p, &c, 1200 + i);
        char name[64];
        tu_kernel_name(clmla_latent_kernel_built(p.cache, 0, 16, 0, 0, 0, 1), name, sizeof(name)); /* attn_latent or mma */
        CHECK(strcmp(name, cfg[i].want) == 0, "group_mma 1, rkv %d dr %d dtype %d: ran %s, not %s", cfg[i].rkv,
              cfg[i].dr, (int)cfg[i].dtype, name[0] ? name : "no attn_latent kernel", cfg[i].want);
        static const int len4[] = {97, 98, 99, 100};
        static const int seq4[] = {0, 0, 0, 0};
        const attn_case c4 = {4, 4, len4, seq4, 0, 0, 4};
        run_case(&p, &c4, 1300 + i);
        tu_kernel_name(clmla_latent_kernel_built(p.cache, 0, 16, 0, 0, 0, 4), name, sizeof(name)); /* fold 4 of 4 heads */
        CHECK(strcmp(name, cfg[i].want) == 0, "group_mma 1, rkv %d dr %d dtype %d, 4 tokens of 4 heads: ran %s, not %s",
              cfg[i].rkv, cfg[i].dr, (int)cfg[i].dtype, name[0] ? name : "no folded attn_latent kernel", cfg[i].want);
        pool_free(&p);
    }
    clmla_context_set_latent_tuning(ctx, NULL);
}

/* Every case (decoded caches only: the f16, bf16 and fp8 ones) on attn_latent with these
   parameters forced, whatever the device's entry sets; one line saying how they went. */
static void run_all_tuned(const clmla_latent_tuning *t, int decoded, const char *label)
{
    const int failed_before = check_failed;
    clmla_context_set_latent_tuning(ctx, t);
    clmla_attention_set_variant(ctx, CLMLA_LATENT_GROUP);
    decoded_only = decoded;
    run_all();
    decoded_only = 0;
    clmla_context_set_latent_tuning(ctx, NULL);
    printf("kernel attn_latent, %s: %s\n", label, check_failed == failed_before ? "all cases pass" : "FAILURES above");
}

/* Every kernel but attn_latent_mma over every case, with each variant and parameter set. */
static void run_base(void)
{
    /* Every case with each kernel variant: attn_latent_rows is what CPUs run and attn_latent what
       GPUs run, and both must hold on any device. */
    static const struct {
        int variant;
        const char *name;
    } variants[] = {{CLMLA_LATENT_ROWS, "attn_latent_rows"}, {CLMLA_LATENT_GROUP, "attn_latent"}};
    /* (the row kernel with the defaults' parameters, so that attn_latent_rows runs where the device's
       entry picks attn_latent_lanes: that one has its own runs below) */
    clmla_latent_tuning rows_defaults;
    clmla_latent_tuning_defaults(&rows_defaults);
    for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
        int failed_before = check_failed;
        clmla_attention_set_variant(ctx, variants[v].variant);
        clmla_context_set_latent_tuning(ctx, variants[v].variant == CLMLA_LATENT_ROWS ? &rows_defaults : NULL);
        run_all();
        clmla_context_set_latent_tuning(ctx, NULL);
        printf("kernel %s: %s\n", variants[v].name, check_failed == failed_before ? "all cases pass" : "FAILURES above");
    }
    rkv256_pools = 0;
    /* CLMLA_TEST_SWEEPS=short (ci/sanitize.sh): of the parameter sets below, only the first lanes
       set, the small local memory (the host's fallback to 8 heads a group) and the fine splits (the
       most partial results, the most combine work); each of the others changes build options only */
    const int sweeps_short = tu_sweeps_short();
    /* attn_latent_lanes, the CPU kernel with 16 heads in the lanes of a vector (rows_lanes 1), on
       every case, f32 caches included (those of fewer than 16 heads run attn_latent_rows again), and
       with two vectors of heads (rows_lanes 2: the cases of 32 heads or more, 128 and 36):
       partial groups of heads, odd sizes, at 8 keys a tile and at 12 (not a power of two) */
    static const int lane_cfg[][2] = {{1, 8}, {1, 12}, {2, 8}, {2, 12}}; /* rows_lanes, rows_keys */
    for (size_t i = 0; i < (sweeps_short ? 1 : sizeof(lane_cfg) / sizeof(lane_cfg[0])); i++) {
        const int failed_before = check_failed;
        clmla_latent_tuning t;
        clmla_latent_tuning_defaults(&t);
        t.rows_lanes = lane_cfg[i][0];
        t.rows_keys = lane_cfg[i][1];
        clmla_context_set_latent_tuning(ctx, &t);
        clmla_attention_set_variant(ctx, CLMLA_LATENT_ROWS);
        run_all();
        clmla_context_set_latent_tuning(ctx, NULL);
        printf("kernel attn_latent_lanes, rows_lanes %d, %d keys a tile: %s\n", lane_cfg[i][0], lane_cfg[i][1],
               check_failed == failed_before ? "all cases pass" : "FAILURES above");
    }
    /* attn_latent on a device with 32 KiB of local memory, the least OpenCL allows a GPU: 16 heads'
       queries alone take 36 KiB there, so groups of 16 heads must fall back to 8. */
    if (ctx->info.local_mem_bytes > 32768) {
        const int failed_before = check_failed;
        const uint64_t real = ctx->info.local_mem_bytes;
        ctx->info.local_mem_bytes = 32768;
        small_local_mem = 1;
        clmla_attention_set_variant(ctx, CLMLA_LATENT_GROUP);
        run_all();
        small_local_mem = 0;
        ctx->info.local_mem_bytes = real;
        printf("kernel attn_latent with 32 KiB of local memory: %s\n",
               check_failed == failed_before ? "all cases pass" : "FAILURES above");
    }
    /* attn_latent with each count of heads per item in its score step for the decoded caches (the
       latent tuning's group_decode_heads: 4 with group_keys keys an item, 8 with half as many, 16
       with a quarter), whatever the device's entry sets; f32 caches, which it leaves as they are,
       are not run again. */
    static const int decode_heads[] = {4, 8, 16};
    for (size_t i = 0; i < (sweeps_short ? 0 : sizeof(decode_heads) / sizeof(decode_heads[0])); i++) {
        clmla_latent_tuning t;
        clmla_latent_tuning_defaults(&t);
        t.group_decode_heads = decode_heads[i];
        char label[64];
        snprintf(label, sizeof(label), "group_decode_heads %d", decode_heads[i]);
        run_all_tuned(&t, 1, label);
    }
    /* attn_latent over the fp8 caches with the decoder GPUs get, the shift (CPUs get the one through
       half precision: host/runtime/program.h), where the device has float denormals; the caches are
       made anew, so their kernels are built with it */
    if (!sweeps_short && clmla_device_denormals(ctx) && clmla_fp8_decoder(ctx) != CLMLA_FP8_DECODER_SHIFT) {
        clmla_latent_tuning d;
        clmla_latent_tuning_defaults(&d);
        clmla_test_hooks_of(ctx)->fp8_decoder = CLMLA_FP8_DECODER_SHIFT;
        only_dtypes = 1u << CLMLA_CACHE_FP8;
        run_all_tuned(&d, 1, "fp8 caches through the shift decoder");
        only_dtypes = 0;
        clmla_test_hooks_of(ctx)->fp8_decoder = CLMLA_FP8_DECODER_AUTO;
    }
    /* attn_latent with a sequence's keys split as finely as the tuning allows (group_min_split_keys
       16: splits shorter than a tile of the score step, many partial results to combine) */
    clmla_latent_tuning t;
    clmla_latent_tuning_defaults(&t);
    t.group_min_split_keys = 16;
    run_all_tuned(&t, 0, "group_min_split_keys 16");
    /* the compiled-not-run built-in entries of issue 58 (host/mla/tuning_data/attn_latent.json), which no AMD or
       Intel GPU has run: 8 heads of 256 items with group_keys 2 (AMD CDNA, Arc A770: KPT 2 over f32
       caches, 1 over the decoded ones), and 8 heads of 512 items with group_keys 1, 4 heads an item
       over the decoded caches and IGC's 256-GRF mode (Max 1550; the mode is an Intel build option,
       not given elsewhere: this run checks that it is left out) */
    for (int keys = 2; keys >= 1; keys--) {
        clmla_latent_tuning_defaults(&t);
        t.group_heads = 8;
        t.group_max_items = keys == 2 ? 256 : 512;
        t.group_keys = keys;
        t.group_decode_heads = keys == 2 ? 8 : 4;
        t.group_large_grf = keys == 1;
        char label[128];
        snprintf(label, sizeof(label), "group_heads 8, group_max_items %d, group_keys %d, group_decode_heads %d%s",
                 t.group_max_items, keys, t.group_decode_heads, t.group_large_grf ? ", group_large_grf 1" : "");
        run_all_tuned(&t, 0, label);
    }
    if (sweeps_short) {
        printf("CLMLA_TEST_SWEEPS=short: not run: lanes sets 2-4, group_decode_heads 4/8/16, the fp8 shift decoder, "
               "group_row_slices, group_aligned 0/2\n");
        return;
    }
    /* attn_latent with each key's dot products shared by 4 items and splits of 16 keys
       (group_row_slices: tiles of a quarter the keys, many splits to combine), over the f32 caches
       (4 heads an item) and the fp8 ones (8, values decoded): tests/test_kernels.c runs the kernel
       so directly with 2 and 4 items a key, over f16 rows and odd row lengths, with sparse lists
       (each program costs PoCL seconds to build, so not every cache here) */
    clmla_latent_tuning_defaults(&t);
    only_dtypes = 1u << CLMLA_CACHE_F32 | 1u << CLMLA_CACHE_FP8;
    t.group_row_slices = 4;
    t.group_min_split_keys = 16;
    run_all_tuned(&t, 0, "group_row_slices 4, group_min_split_keys 16");
    only_dtypes = 0;
    /* attn_latent reading the decoded caches' rows through vloadN (group_aligned 0), and by whole
       vectors with f16 rows as ushort4s converted in registers (2); the defaults (1) read whole
       vectors where the rows allow it: the rkv 512 rows of every dtype and rkv 40's f16 and bf16
       rows take them, the fp8 rows of rkv 128 (148 bytes) keep vloadN */
    for (int aligned = 0; aligned <= 2; aligned += 2) {
        clmla_latent_tuning_defaults(&t);
        t.group_aligned = aligned;
        run_all_tuned(&t, 1, aligned ? "group_aligned 2" : "group_aligned 0");
    }
}

/* attn_latent_mma (group_mma 1) over every cache (f32, f16, bf16, fp8): on a CPU device its products
   are computed by the work-items in mma.sync's fragment layouts (cl/attn_latent_mma.cl); rows it
   does not take run attn_latent again; on an NVIDIA GPU of compute capability 8.0 or later, on its
   tensor cores. Other devices do not run it (nothing to check). */
static int run_mma(void)
{
    if (!clmla_latent_mma_device(ctx)) {
        printf("attn_latent_mma: not run (the device has no mma.sync and is not a CPU)\n");
        return 0;
    }
    clmla_latent_tuning t;
    clmla_latent_tuning_defaults(&t);
    t.group_mma = 1;
    only_dtypes = 1u << CLMLA_CACHE_BF16 | 1u << CLMLA_CACHE_FP8 | 1u << CLMLA_CACHE_F32 | 1u << CLMLA_CACHE_F16;
    rkv256_pools = 1;
    run_all_tuned(&t, 0, "group_mma 1");
    only_dtypes = 0;
    test_mma_chosen();
    return 1;
}

/* No argument: both parts; "base" or "mma": one (ctest runs them as entries of their own, which
   build their programs in parallel). */
int main(int argc, char **argv)
{
    const char *part = argc > 1 ? argv[1] : "";
    if (argc > 2 || (part[0] && strcmp(part, "base") != 0 && strcmp(part, "mma") != 0)) {
        printf("usage: test_attention [base | mma]\n");
        return 2;
    }
    if (tu_context_or_skip(&ctx) != 0)
        return 77;

    int ran = 0;
    if (strcmp(part, "mma") != 0) {
        run_base();
        ran = 1;
    }
    if (strcmp(part, "base") != 0)
        ran |= run_mma();
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    for (int i = 0; i < ref_memo_count; i++)
        free(ref_memo_table[i].want), free(ref_memo_table[i].lse);

    clmla_context_destroy(ctx);
    return ran ? check_summary() : 77;
}
