/* Cache stress: thousands of random operations on one paged cache shared by many sequences, each
 * predicted by a host model of the cache before it is made:
 *   add        a new sequence (ids are never one that is live);
 *   free       its blocks go back to the pool;
 *   reserve    blocks for a number of tokens (CLMLA_ERROR_CACHE_FULL when the pool lacks them);
 *   step       clmla_layer_forward over 1..4 sequences of one cache layer, decode (1 token) or
 *              prefill chunks (2..20 tokens), on a random path (auto / absorbed / decompressed);
 *              CLMLA_ERROR_CACHE_FULL exactly when the model says the pool cannot take it;
 *   raw        clmla_cache_append_cl of random rows into either layer of a "raw" sequence;
 *   bad        a step with an unknown sequence, a repeated one or an empty entry (refused);
 * and every 40 operations the model is compared with everything observable: pool counts,
 * sequence count, each sequence's length per layer and block count, block ids in range and owned
 * by one sequence only, raw sequences' contents read back (bitwise in f32, to half precision in
 * f16), one layer sequence's cached c^KV / k^R against the float64 reference. A sampled quarter of
 * the steps have their outputs compared with the reference over the sequence's whole history.
 * The pool is small (96 blocks of 4 tokens) so that it runs full often.
 * `test_stress [OPS_F32 [OPS_F16]]`, default 6000 and 3000. */
#include "check.h"
#include "clmla.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_SEQS = 24, LAYERS = 2, BT = 4, NUM_BLOCKS = 96, CAPACITY = NUM_BLOCKS * BT, MAX_CHUNK = 20, MAX_BATCH = 4 };

static clmla_context *ctx;

typedef enum { SEQ_LAYER, SEQ_RAW } seq_kind;

typedef struct seq_model {
    int live;
    int32_t id;
    seq_kind kind;
    int home;            /* the cache layer a layer sequence's steps use */
    int len[LAYERS];
    int owned;           /* blocks the cache must own for it */
    float *x;            /* layer: [CAPACITY, D] every hidden state given */
    float *rows[LAYERS]; /* raw: [CAPACITY, rkv + dr] every row appended */
} seq_model;

typedef struct stress {
    const char *name;
    clmla_cache_dtype dtype;
    tu_weights w;
    clmla_layer *layer;
    clmla_cache *cache;
    seq_model seqs[MAX_SEQS];
    int used;
    tu_rng rng;
    int D, rkv, dr, row;
    float *x, *out; /* [MAX_BATCH * MAX_CHUNK, D] */
    /* counts for the summary */
    long ops, steps, steps_full, steps_checked, raws, raws_full, adds, frees, reserves, reserves_full, bad, verifies;
    long tokens;
} stress;

static int blocks_for(int tokens)
{
    return (tokens + BT - 1) / BT;
}

static int max_len(const seq_model *q)
{
    int m = 0;
    for (int l = 0; l < LAYERS; l++)
        if (q->len[l] > m)
            m = q->len[l];
    return m;
}

static seq_model *pick(stress *s, int kind) /* kind -1: any */
{
    int cand[MAX_SEQS], n = 0;
    for (int i = 0; i < MAX_SEQS; i++)
        if (s->seqs[i].live && (kind < 0 || (int)s->seqs[i].kind == kind))
            cand[n++] = i;
    return n ? &s->seqs[cand[tu_rng_below(&s->rng, n)]] : NULL;
}

/* ---- operations ---------------------------------------------------------------------------------- */

static void op_add(stress *s)
{
    int slot = -1;
    for (int i = 0; i < MAX_SEQS && slot < 0; i++)
        if (!s->seqs[i].live)
            slot = i;
    if (slot < 0)
        return;
    int32_t id = -1;
    CHECK_STATUS(clmla_cache_seq_add(s->cache, &id), CLMLA_SUCCESS, ctx);
    if (id < 0)
        return;
    for (int i = 0; i < MAX_SEQS; i++)
        CHECK(!s->seqs[i].live || s->seqs[i].id != id, "%s: seq_add returned id %d, which is live", s->name, (int)id);
    seq_model *q = &s->seqs[slot];
    q->live = 1;
    q->id = id;
    q->kind = tu_rng_below(&s->rng, 3) == 0 ? SEQ_RAW : SEQ_LAYER;
    q->home = tu_rng_below(&s->rng, LAYERS);
    memset(q->len, 0, sizeof(q->len));
    q->owned = 0;
    s->adds++;
}

static void op_free(stress *s)
{
    seq_model *q = pick(s, -1);
    if (!q)
        return;
    CHECK_STATUS(clmla_cache_seq_free(s->cache, q->id), CLMLA_SUCCESS, ctx);
    int len = -1;
    CHECK_STATUS(clmla_cache_seq_length(s->cache, q->id, 0, &len), CLMLA_ERROR_UNKNOWN_SEQUENCE, ctx);
    s->used -= q->owned;
    q->live = 0;
    s->frees++;
}

static void op_reserve(stress *s)
{
    seq_model *q = pick(s, -1);
    if (!q)
        return;
    const int tokens = max_len(q) + tu_rng_below(&s->rng, 24);
    const int want = blocks_for(tokens), more = want > q->owned ? want - q->owned : 0;
    const int full = more > NUM_BLOCKS - s->used;
    clmla_status st = clmla_cache_seq_reserve(s->cache, q->id, tokens);
    CHECK(st == (full ? CLMLA_ERROR_CACHE_FULL : CLMLA_SUCCESS), "%s: reserve %d tokens (owns %d, %d free): %s: %s",
          s->name, tokens, q->owned, NUM_BLOCKS - s->used, clmla_status_string(st), clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS) {
        s->used += more;
        q->owned += more;
    }
    s->reserves++;
    s->reserves_full += full;
}

/* Random rows; in f16, values exactly representable in half, so contents compare bitwise too. */
static void random_rows(stress *s, float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(tu_rng_below(&s->rng, 4001) - 2000) / 512.0f;
}

static void op_raw(stress *s)
{
    seq_model *q = pick(s, SEQ_RAW);
    if (!q)
        return;
    const int layer = tu_rng_below(&s->rng, LAYERS), n = 1 + tu_rng_below(&s->rng, 12);
    const int new_len = q->len[layer] + n;
    const int want = blocks_for(new_len), more = want > q->owned ? want - q->owned : 0;
    const int full = new_len > CAPACITY || more > NUM_BLOCKS - s->used;
    float rows[12 * 64];
    random_rows(s, rows, (size_t)n * s->row);
    cl_int err;
    cl_mem buf = clCreateBuffer(clmla_context_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                (size_t)n * s->row * sizeof(float), rows, &err);
    clmla_status st = clmla_cache_append_cl(s->cache, layer, q->id, n, buf, 0, s->row, buf, (size_t)s->rkv, s->row, NULL);
    clReleaseMemObject(buf);
    CHECK(st == (full ? CLMLA_ERROR_CACHE_FULL : CLMLA_SUCCESS), "%s: raw append of %d rows to seq %d layer %d: %s: %s",
          s->name, n, (int)q->id, layer, clmla_status_string(st), clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS) {
        if (!q->rows[layer])
            q->rows[layer] = malloc((size_t)CAPACITY * s->row * sizeof(float));
        memcpy(q->rows[layer] + (size_t)q->len[layer] * s->row, rows, (size_t)n * s->row * sizeof(float));
        q->len[layer] = new_len;
        s->used += more;
        q->owned += more;
        s->tokens += n;
    }
    s->raws++;
    s->raws_full += full;
}

/* Compares tokens [first, first+n) of a layer sequence's outputs with the reference. */
static void check_outputs(stress *s, const seq_model *q, int first, int n, const float *out, clmla_attention_path path)
{
    const int T = first + n;
    tu_ref_run ref;
    if (tu_ref_run_make(&ref, &s->w, T, q->x, MLA_REF_DECOMPRESSED) != 0) {
        CHECK(0, "reference failed");
        return;
    }
    CHECK_CLOSE(out, ref.out + (size_t)first * s->D, (size_t)n * s->D, s->D, TOL_FOR_DTYPE(s->dtype),
                "%s op %ld: seq %d tokens %d..%d (path %d) vs reference", s->name, s->ops, (int)q->id, first, T - 1,
                (int)path);
    tu_ref_run_free(&ref);
}

static void op_step(stress *s)
{
    const int layer = tu_rng_below(&s->rng, LAYERS);
    seq_model *cand[MAX_SEQS];
    int nc = 0;
    for (int i = 0; i < MAX_SEQS; i++)
        if (s->seqs[i].live && s->seqs[i].kind == SEQ_LAYER && s->seqs[i].home == layer)
            cand[nc++] = &s->seqs[i];
    if (nc == 0)
        return;
    /* Distinct sequences in random order. */
    for (int i = nc - 1; i > 0; i--) {
        int j = tu_rng_below(&s->rng, i + 1);
        seq_model *t = cand[i];
        cand[i] = cand[j];
        cand[j] = t;
    }
    const int n = 1 + tu_rng_below(&s->rng, nc < MAX_BATCH ? nc : MAX_BATCH);
    clmla_batch_entry e[MAX_BATCH];
    int need = 0, full = 0, rows = 0;
    for (int i = 0; i < n; i++) {
        const int tokens = tu_rng_below(&s->rng, 5) < 3 ? 1 : 2 + tu_rng_below(&s->rng, MAX_CHUNK - 1);
        e[i].seq_id = cand[i]->id;
        e[i].num_tokens = tokens;
        const int new_len = cand[i]->len[layer] + tokens;
        full |= new_len > CAPACITY;
        const int want = blocks_for(new_len);
        need += want > cand[i]->owned ? want - cand[i]->owned : 0;
        float *fresh = tu_random_inputs(tokens, s->D, tu_rng_next(&s->rng));
        memcpy(s->x + (size_t)rows * s->D, fresh, (size_t)tokens * s->D * sizeof(float));
        free(fresh);
        rows += tokens;
    }
    full |= need > NUM_BLOCKS - s->used;
    const clmla_attention_path path = (clmla_attention_path)tu_rng_below(&s->rng, 3);
    clmla_forward_args a = {e, n, layer, path};
    clmla_status st = clmla_layer_forward(s->layer, s->cache, &a, s->x, s->out);
    CHECK(st == (full ? CLMLA_ERROR_CACHE_FULL : CLMLA_SUCCESS), "%s op %ld: step of %d entries (%d tokens, %d blocks "
          "needed, %d free): %s: %s", s->name, s->ops, n, rows, need, NUM_BLOCKS - s->used, clmla_status_string(st),
          clmla_last_error(ctx));
    s->steps++;
    s->steps_full += full;
    if (st != CLMLA_SUCCESS)
        return;
    const int check = tu_rng_below(&s->rng, 4) == 0;
    rows = 0;
    for (int i = 0; i < n; i++) {
        seq_model *q = cand[i];
        const int tokens = e[i].num_tokens, first = q->len[layer];
        memcpy(q->x + (size_t)first * s->D, s->x + (size_t)rows * s->D, (size_t)tokens * s->D * sizeof(float));
        q->len[layer] += tokens;
        const int want = blocks_for(q->len[layer]);
        if (want > q->owned) {
            s->used += want - q->owned;
            q->owned = want;
        }
        if (check)
            check_outputs(s, q, first, tokens, s->out + (size_t)rows * s->D, path);
        rows += tokens;
        s->tokens += tokens;
    }
    s->steps_checked += check;
}

static void op_bad(stress *s)
{
    seq_model *q = pick(s, SEQ_LAYER);
    if (!q)
        return;
    clmla_batch_entry e[2] = {{q->id, 1}, {q->id, 1}};
    clmla_status want = CLMLA_ERROR_INVALID_ARGUMENT;
    switch (tu_rng_below(&s->rng, 3)) {
    case 0: /* a sequence id that is not live */
        e[1].seq_id = 1000 + tu_rng_below(&s->rng, 1000);
        want = CLMLA_ERROR_UNKNOWN_SEQUENCE;
        break;
    case 1: /* the same sequence twice */
        break;
    default: /* an empty entry */
        e[1].num_tokens = 0;
        e[1].seq_id = q->id;
        e[0].num_tokens = 0;
        break;
    }
    clmla_forward_args a = {e, 2, q->home, CLMLA_PATH_AUTO};
    CHECK_STATUS(clmla_layer_forward(s->layer, s->cache, &a, s->x, s->out), want, ctx);
    s->bad++;
}

/* ---- the whole model against the cache ------------------------------------------------------------ */

static void verify(stress *s)
{
    clmla_cache_info info;
    CHECK_STATUS(clmla_cache_get_info(s->cache, &info), CLMLA_SUCCESS, ctx);
    int live = 0;
    for (int i = 0; i < MAX_SEQS; i++)
        live += s->seqs[i].live;
    CHECK(info.blocks_used == s->used && info.blocks_free == NUM_BLOCKS - s->used && info.sequences == live,
          "%s op %ld: pool used %d free %d sequences %d, model %d / %d / %d", s->name, s->ops, info.blocks_used,
          info.blocks_free, info.sequences, s->used, NUM_BLOCKS - s->used, live);
    char owner[NUM_BLOCKS];
    memset(owner, 0, sizeof(owner));
    int counted = 0;
    seq_model *layer_seqs[MAX_SEQS];
    int num_layer_seqs = 0;
    for (int i = 0; i < MAX_SEQS; i++) {
        seq_model *q = &s->seqs[i];
        if (!q->live)
            continue;
        for (int l = 0; l < LAYERS; l++) {
            int len = -1;
            CHECK_STATUS(clmla_cache_seq_length(s->cache, q->id, l, &len), CLMLA_SUCCESS, ctx);
            CHECK(len == q->len[l], "%s op %ld: seq %d layer %d length %d, model %d", s->name, s->ops, (int)q->id, l, len,
                  q->len[l]);
        }
        int32_t blocks[NUM_BLOCKS];
        int nb = -1;
        CHECK_STATUS(clmla_cache_seq_blocks(s->cache, q->id, blocks, NUM_BLOCKS, &nb), CLMLA_SUCCESS, ctx);
        CHECK(nb == q->owned, "%s op %ld: seq %d owns %d blocks, model %d", s->name, s->ops, (int)q->id, nb, q->owned);
        for (int b = 0; b < nb && b < NUM_BLOCKS; b++) {
            const int id = blocks[b];
            CHECK(id >= 0 && id < NUM_BLOCKS, "%s: block id %d", s->name, id);
            if (id < 0 || id >= NUM_BLOCKS)
                continue;
            CHECK(!owner[id], "%s op %ld: block %d owned twice (seq %d)", s->name, s->ops, id, (int)q->id);
            owner[id] = 1;
            counted++;
        }
        if (q->kind == SEQ_RAW) {
            for (int l = 0; l < LAYERS; l++) {
                const int len = q->len[l];
                if (len == 0)
                    continue;
                float *got = malloc((size_t)len * s->row * sizeof(float));
                CHECK_STATUS(clmla_cache_read(s->cache, l, q->id, 0, len, got, got + (size_t)len * s->rkv), CLMLA_SUCCESS,
                             ctx);
                int bad = 0;
                for (int t = 0; t < len; t++)
                    for (int d = 0; d < s->row; d++) {
                        const float g = d < s->rkv ? got[(size_t)t * s->rkv + d]
                                                   : got[(size_t)len * s->rkv + (size_t)t * s->dr + d - s->rkv];
                        bad += g != q->rows[l][(size_t)t * s->row + d];
                    }
                CHECK(bad == 0, "%s op %ld: raw seq %d layer %d: %d of %d values differ", s->name, s->ops, (int)q->id, l,
                      bad, len * s->row);
                free(got);
            }
        } else if (q->len[q->home] > 0) {
            layer_seqs[num_layer_seqs++] = q;
        }
    }
    CHECK(counted == s->used, "%s op %ld: %d blocks owned in all, model %d", s->name, s->ops, counted, s->used);
    /* One layer sequence's cache against the reference's c^KV and k^R. */
    if (num_layer_seqs > 0) {
        const seq_model *q = layer_seqs[tu_rng_below(&s->rng, num_layer_seqs)];
        const int len = q->len[q->home];
        tu_ref_run ref;
        if (tu_ref_run_make(&ref, &s->w, len, q->x, MLA_REF_DECOMPRESSED) == 0) {
            float *ckv = malloc((size_t)len * s->rkv * sizeof(float)), *kr = malloc((size_t)len * s->dr * sizeof(float));
            CHECK_STATUS(clmla_cache_read(s->cache, q->home, q->id, 0, len, ckv, kr), CLMLA_SUCCESS, ctx);
            CHECK_CLOSE(ckv, ref.ckv, (size_t)len * s->rkv, s->rkv, TOL_FOR_DTYPE(s->dtype),
                        "%s op %ld: seq %d cached c^KV", s->name, s->ops, (int)q->id);
            CHECK_CLOSE(kr, ref.kr, (size_t)len * s->dr, s->dr, TOL_FOR_DTYPE(s->dtype), "%s op %ld: seq %d cached k^R",
                        s->name, s->ops, (int)q->id);
            free(ckv);
            free(kr);
            tu_ref_run_free(&ref);
        }
    }
    s->verifies++;
}

/* ---- a run ----------------------------------------------------------------------------------------- */

static void run(const char *name, clmla_cache_dtype dtype, long ops, uint64_t seed)
{
    double t0 = tu_seconds();
    stress s;
    memset(&s, 0, sizeof(s));
    s.name = name;
    s.dtype = dtype;
    s.rng = tu_rng_seed(seed);
    /* Two heads, no q_lora, AUTO threshold rkv(dn+dv)/(2rkv+dr-dq-dv) = 12 tokens: chunks of
       2..20 tokens take either path under AUTO. */
    clmla_layer_config c = tu_small_config(32, 2, 0, 24, 8, 4, 8);
    if (tu_weights_make(&s.w, &c, seed + 1) != 0)
        return;
    s.D = c.hidden_size;
    s.rkv = c.kv_lora_rank;
    s.dr = c.qk_rope_head_dim;
    s.row = s.rkv + s.dr;
    CHECK_STATUS(clmla_layer_create(ctx, &c, &s.w.layer, &s.layer), CLMLA_SUCCESS, ctx);
    clmla_cache_config cc = {LAYERS, s.rkv, s.dr, BT, NUM_BLOCKS, dtype, 0, CLMLA_CACHE_F32};
    CHECK_STATUS(clmla_cache_create(ctx, &cc, &s.cache), CLMLA_SUCCESS, ctx);
    s.x = malloc((size_t)MAX_BATCH * MAX_CHUNK * s.D * sizeof(float));
    s.out = malloc((size_t)MAX_BATCH * MAX_CHUNK * s.D * sizeof(float));
    for (int i = 0; i < MAX_SEQS; i++)
        s.seqs[i].x = malloc((size_t)CAPACITY * s.D * sizeof(float));
    const int failed_before = check_failed;
    for (s.ops = 0; s.layer && s.cache && s.ops < ops && check_failed - failed_before < 20; s.ops++) {
        /* More frees while the pool is nearly full: it runs full often, but not all the time. */
        int r = tu_rng_below(&s.rng, 100);
        if (s.used > NUM_BLOCKS * 7 / 8 && r < 4)
            r = 72 + r;
        if (r < 45)
            op_step(&s);
        else if (r < 60)
            op_raw(&s);
        else if (r < 72)
            op_add(&s);
        else if (r < 82)
            op_free(&s);
        else if (r < 90)
            op_reserve(&s);
        else if (r < 93)
            op_bad(&s);
        if (s.ops % 40 == 39)
            verify(&s);
    }
    if (s.layer && s.cache)
        verify(&s);
    printf("# %s: %ld ops in %.1f s: %ld steps (%ld refused as full, %ld checked against the reference), %ld raw "
           "appends (%ld full), %ld adds, %ld frees, %ld reserves (%ld full), %ld bad steps, %ld full verifications, "
           "%ld tokens appended\n",
           name, s.ops, tu_seconds() - t0, s.steps, s.steps_full, s.steps_checked, s.raws, s.raws_full, s.adds, s.frees,
           s.reserves, s.reserves_full, s.bad, s.verifies, s.tokens);
    CHECK(s.steps_full > 0 && s.raws_full > 0, "%s: the pool never ran full; the run tested less than it should",
          name);
    clmla_cache_destroy(s.cache);
    clmla_layer_destroy(s.layer);
    for (int i = 0; i < MAX_SEQS; i++) {
        free(s.seqs[i].x);
        for (int l = 0; l < LAYERS; l++)
            free(s.seqs[i].rows[l]);
    }
    free(s.x);
    free(s.out);
    tu_weights_free(&s.w);
}

int main(int argc, char **argv)
{
    const long ops_f32 = argc > 1 ? atol(argv[1]) : 6000, ops_f16 = argc > 2 ? atol(argv[2]) : 3000;
    if (tu_context_or_skip(&ctx) != 0)
        return 77;
    run("f32 cache", CLMLA_CACHE_F32, ops_f32, 101);
    run("f16 cache", CLMLA_CACHE_F16, ops_f16, 202);
    clmla_context_destroy(ctx);
    return check_summary();
}
