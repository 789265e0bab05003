/* Weights in the checkpoint's dtype (clmla_layer_config.weights_dtype, clmla_tensor.dtype): a layer
 * keeping its projections in f16, bf16 or fp8 (128 x 128 blocks with float32 scales) computes with
 * the values that type holds, decoded to float32, and otherwise as a float32 layer does. So each
 * layer is held, with the float32 tolerance (TOL_F32_CACHE), to the float64 reference (ref/) fed
 * the same weights rounded by the reference's own rounding (mla_ref_round_weight, written from the
 * formats' definitions), on
 *   convert   float32 weights converted at creation: weights_dtype F32 (the control), F16, BF16 and
 *             FP8, on small odd shapes (q_proj and a query LoRA with rkv 128; rkv 40, which an fp8
 *             cache could not take but fp8 weights can: their blocks are partial) and on V2-Lite's
 *             shape with 2 heads;
 *   as-given  tensors given in a dtype (clmla_tensor.dtype with codes the test encodes: bf16 as the
 *             top half of exactly-bf16 floats, f16, fp8 codes and block scales from the reference's
 *             quantiser, 1-D norms in bf16 / f16) under AS_GIVEN, a mix of dtypes (the stacked
 *             q_a_proj + kv_a_proj_with_mqa of two dtypes), and given dtypes converted to another;
 *   clblast   the query-LoRA shape with every product through CLBlast, as GPUs run prefill-sized ones
 *             (the per-head products decode kv_b_proj's slices in groups: one, several, one by one).
 * Every layer runs, on each attention path (absorbed, decompressed), one sequence alone and a batch
 * of three (prefills of 37, 21 and 5 tokens in one step, then 3 one-token decode steps, 16-token
 * cache blocks: every sequence ends mid-block), on a float32 cache.
 * So that a layer ignoring weights_dtype could not pass, the reference's output with each rounding
 * must differ from its float32 output by more than DTYPE_EFFECT_MIN (10 times the tolerance); and
 * clmla_layer_get_memory must count each projection's bytes in the dtype the layer keeps it in.
 * The 1-D weights (norms) are float32 on the device under every weights_dtype (include/clmla.h says
 * so for FP8; the test expects it of F16 and BF16 too): the reference rounds them only where they
 * are given in a 16-bit dtype. `test_weights PART...` runs the named parts. */
#include "check.h"
#include "clmla.h"
#include "gemm.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static clmla_context *ctx;

/* A rounding counts as visible when it moves the reference output by more than this. */
#define DTYPE_EFFECT_MIN (10.0 * TOL_F32_CACHE)

/* o_proj is scaled by this so that its values (at most about 2^-18) lie far below f16's smallest
   normal 2^-14, where f16 keeps fewer significant bits: with weights of ordinary size f16's rounding
   moves the output by only about 4e-4, 4 times the tolerance, too close to tell a layer that ignored
   F16 apart. The relative comparisons do not mind the output's scale; bf16 has float32's exponents
   and fp8 its block scales, so neither is affected. It also makes the device decode f16 subnormals. */
#define O_PROJ_SCALE 0x1p-16f

/* clmla_layer_get_memory may count up to this much more than the projection's own bytes (packing). */
#define MEMORY_SLACK 1.01

enum { BLOCK_TOKENS = 16, DECODE_STEPS = 3, MAX_SEQS = 3, FP8_BLOCK = MLA_REF_FP8_BLOCK };

/* Prefill lengths of the batch; the lone sequence is the first. 37 + 3, 21 + 3 and 5 + 3 tokens
   all end mid-block. */
static const int PREFILL[MAX_SEQS] = {37, 21, 5};

/* ---- the projections of a layer, by index ------------------------------------------------------ */

enum { P_Q_A, P_Q_B, P_Q, P_KV_A, P_KV_B, P_O, NUM_PROJ };

/* The float32 values of projection i (NULL when the shape has none) and its [rows, cols]. */
static float *proj_data(const tu_weights *w, int i, size_t *rows, size_t *cols)
{
    const clmla_layer_config *c = &w->config;
    const size_t D = (size_t)c->hidden_size, H = (size_t)c->num_heads, rq = (size_t)c->q_lora_rank;
    const size_t rkv = (size_t)c->kv_lora_rank, dn = (size_t)c->qk_nope_head_dim;
    const size_t dr = (size_t)c->qk_rope_head_dim, dv = (size_t)c->v_head_dim;
    switch (i) {
    case P_Q_A:
        *rows = rq, *cols = D;
        return w->q_a_proj;
    case P_Q_B:
        *rows = H * (dn + dr), *cols = rq;
        return w->q_b_proj;
    case P_Q:
        *rows = H * (dn + dr), *cols = D;
        return w->q_proj;
    case P_KV_A:
        *rows = rkv + dr, *cols = D;
        return w->kv_a_proj_with_mqa;
    case P_KV_B:
        *rows = H * (dn + dv), *cols = rkv;
        return w->kv_b_proj;
    default:
        *rows = D, *cols = H * dv;
        return w->o_proj;
    }
}

static clmla_tensor *proj_tensor(clmla_layer_weights *lw, int i)
{
    clmla_tensor *t[NUM_PROJ] = {&lw->q_a_proj, &lw->q_b_proj, &lw->q_proj,
                                 &lw->kv_a_proj_with_mqa, &lw->kv_b_proj, &lw->o_proj};
    return t[i];
}

/* The dtype a tensor given in `given` is kept in under `keep` (clmla_dtype numbering, which is also
   mla_ref_round_weight's). */
static int kept_dtype(int given, clmla_weights_dtype keep)
{
    static const int held[] = {[CLMLA_WEIGHTS_F32] = CLMLA_DTYPE_F32, [CLMLA_WEIGHTS_F16] = CLMLA_DTYPE_F16,
                               [CLMLA_WEIGHTS_BF16] = CLMLA_DTYPE_BF16, [CLMLA_WEIGHTS_FP8] = CLMLA_DTYPE_FP8_E4M3};
    return keep > CLMLA_WEIGHTS_AS_GIVEN && keep <= CLMLA_WEIGHTS_FP8 ? held[keep] : given;
}

/* ---- one way of giving a layer its weights ---------------------------------------------------- */

/* The dtype each projection and the norms are given in, and the weights_dtype of the layer. */
typedef struct weights_case {
    const char *name;
    int proj_dtype[NUM_PROJ]; /* clmla_dtype */
    int norm_dtype;           /* F32, F16 or BF16 */
    clmla_weights_dtype keep;
} weights_case;

/* A case's tensors for the layer (codes in their dtype) and the reference's float32 values of
   them (what the layer computes with). */
typedef struct given_weights {
    float *ref_proj[NUM_PROJ];  /* rounded to the given dtype, then to the kept one */
    float *ref_norm[2];         /* q_a_layernorm, kv_a_layernorm: rounded to the given dtype */
    void *codes[NUM_PROJ + 2];  /* the data handed to the layer, in its dtype (NULL: float32 values) */
    float *scale[NUM_PROJ];     /* FP8 block scales */
    clmla_layer_weights layer;  /* views for clmla_layer_create */
    mla_ref_weights ref;        /* views for the reference */
} given_weights;

static void given_free(given_weights *g)
{
    for (int i = 0; i < NUM_PROJ; i++) {
        free(g->ref_proj[i]);
        free(g->scale[i]);
    }
    for (int i = 0; i < NUM_PROJ + 2; i++)
        free(g->codes[i]);
    free(g->ref_norm[0]);
    free(g->ref_norm[1]);
    memset(g, 0, sizeof(*g));
}

/* Values already rounded to a 16-bit dtype, as codes: bf16 is the top half of the float32 (the
   bottom half is zero for such a value), f16 the reference's encoding. -1 when a value is not one
   of the dtype's (a bug in the rounding). */
static int encode_16(int dtype, const float *v, size_t n, uint16_t *codes)
{
    for (size_t i = 0; i < n; i++) {
        if (dtype == CLMLA_DTYPE_BF16) {
            uint32_t bits;
            memcpy(&bits, &v[i], sizeof(bits));
            if (bits & 0xFFFFu)
                return -1;
            codes[i] = (uint16_t)(bits >> 16);
        } else {
            const int c = mla_ref_encode_f16(v[i]);
            if (c < 0)
                return -1;
            codes[i] = (uint16_t)c;
        }
    }
    return 0;
}

/* A tensor of n values given in `dtype`: its codes in *codes (FP8: *scale too, from the values
   `orig` quantised by the reference), and `ref` (in: the float32 values, out: the values the
   dtype holds). Returns 0, or -1 (out of memory, or a rounding the codes cannot hold). */
static int give(int dtype, const float *orig, size_t rows, size_t cols, float *ref, void **codes, float **scale)
{
    const size_t n = rows * cols;
    if (dtype == CLMLA_DTYPE_F32)
        return 0;
    if (mla_ref_round_weight(dtype, ref, (int)rows, (int)cols) != 0)
        return -1;
    if (dtype == CLMLA_DTYPE_FP8_E4M3) {
        const size_t blocks = ((rows + FP8_BLOCK - 1) / FP8_BLOCK) * ((cols + FP8_BLOCK - 1) / FP8_BLOCK);
        *codes = malloc(n);
        *scale = malloc(blocks * sizeof(float));
        return *codes && *scale ? mla_ref_quantize_fp8(orig, (int)rows, (int)cols, *codes, *scale) : -1;
    }
    *codes = malloc(n * sizeof(uint16_t));
    return *codes ? encode_16(dtype, ref, n, *codes) : -1;
}

/* Builds a case's tensors from float32 weights. Returns 0, or -1 (nothing left allocated). */
static int given_make(given_weights *g, const tu_weights *w, const weights_case *k)
{
    memset(g, 0, sizeof(*g));
    g->layer = w->layer;
    const clmla_layer_config *c = &w->config;
    for (int i = 0; i < NUM_PROJ; i++) {
        size_t rows, cols;
        const float *orig = proj_data(w, i, &rows, &cols);
        if (!orig)
            continue;
        if (!(g->ref_proj[i] = malloc(rows * cols * sizeof(float))))
            goto fail;
        memcpy(g->ref_proj[i], orig, rows * cols * sizeof(float));
        if (give(k->proj_dtype[i], orig, rows, cols, g->ref_proj[i], &g->codes[i], &g->scale[i]) != 0)
            goto fail;
        clmla_tensor *t = proj_tensor(&g->layer, i);
        t->dtype = (clmla_dtype)k->proj_dtype[i];
        t->data = g->codes[i] ? g->codes[i] : orig;
        t->scale = g->scale[i];
        /* Then converted by the layer: the same rounding again, from the given dtype's values. */
        if (mla_ref_round_weight(kept_dtype(k->proj_dtype[i], k->keep), g->ref_proj[i], (int)rows, (int)cols) != 0)
            goto fail;
    }
    const float *norms[2] = {w->q_a_layernorm, w->kv_a_layernorm};
    clmla_tensor *norm_t[2] = {&g->layer.q_a_layernorm, &g->layer.kv_a_layernorm};
    const size_t norm_n[2] = {(size_t)c->q_lora_rank, (size_t)c->kv_lora_rank};
    for (int i = 0; i < 2; i++) {
        if (!norms[i])
            continue;
        if (!(g->ref_norm[i] = malloc(norm_n[i] * sizeof(float))))
            goto fail;
        memcpy(g->ref_norm[i], norms[i], norm_n[i] * sizeof(float));
        float *unused = NULL;
        if (give(k->norm_dtype, norms[i], norm_n[i], 1, g->ref_norm[i], &g->codes[NUM_PROJ + i], &unused) != 0)
            goto fail;
        norm_t[i]->dtype = (clmla_dtype)k->norm_dtype;
        norm_t[i]->data = g->codes[NUM_PROJ + i] ? g->codes[NUM_PROJ + i] : norms[i];
    }
    g->ref.q_a_proj = g->ref_proj[P_Q_A];
    g->ref.q_a_layernorm = g->ref_norm[0];
    g->ref.q_b_proj = g->ref_proj[P_Q_B];
    g->ref.q_proj = g->ref_proj[P_Q];
    g->ref.kv_a_proj_with_mqa = g->ref_proj[P_KV_A];
    g->ref.kv_a_layernorm = g->ref_norm[1];
    g->ref.kv_b_proj = g->ref_proj[P_KV_B];
    g->ref.o_proj = g->ref_proj[P_O];
    return 0;
fail:
    given_free(g);
    return -1;
}

/* ---- the sequences and the reference ----------------------------------------------------------- */

typedef struct seqs {
    int tokens[MAX_SEQS]; /* PREFILL[i] + DECODE_STEPS */
    float *x[MAX_SEQS];   /* [tokens, D] */
} seqs;

static int seqs_make(seqs *s, int D, uint64_t seed)
{
    memset(s, 0, sizeof(*s));
    for (int i = 0; i < MAX_SEQS; i++) {
        s->tokens[i] = PREFILL[i] + DECODE_STEPS;
        if (!(s->x[i] = tu_random_inputs(s->tokens[i], D, seed + (uint64_t)i)))
            return -1;
    }
    return 0;
}

static void seqs_free(seqs *s)
{
    for (int i = 0; i < MAX_SEQS; i++)
        free(s->x[i]);
    memset(s, 0, sizeof(*s));
}

typedef struct ref_outs {
    double *out[MAX_SEQS]; /* [tokens, D] */
} ref_outs;

static void ref_outs_free(ref_outs *r)
{
    for (int i = 0; i < MAX_SEQS; i++)
        free(r->out[i]);
    memset(r, 0, sizeof(*r));
}

/* The reference (decompressed math) for each sequence, fed as the layer is: its prefill, then one
   token a step (which changes nothing without LongRoPE, but is what the layer does). */
static int ref_outs_make(ref_outs *r, const mla_ref_config *cfg, const mla_ref_weights *w, const seqs *s)
{
    memset(r, 0, sizeof(*r));
    for (int i = 0; i < MAX_SEQS; i++) {
        int steps[1 + DECODE_STEPS] = {PREFILL[i]};
        for (int k = 1; k <= DECODE_STEPS; k++)
            steps[k] = 1;
        r->out[i] = malloc((size_t)s->tokens[i] * (size_t)cfg->hidden * sizeof(double));
        if (!r->out[i] || mla_ref_forward_ext(cfg, NULL, w, s->tokens[i], s->x[i], steps, 1 + DECODE_STEPS,
                                              MLA_REF_DECOMPRESSED, r->out[i], NULL, NULL, NULL, NULL, NULL,
                                              NULL) != 0) {
            ref_outs_free(r);
            return -1;
        }
    }
    return 0;
}

/* max|a - b| / max|b| over every sequence's output, both double. */
static double ref_effect(const ref_outs *a, const ref_outs *b, const seqs *s, int D)
{
    double d = 0.0, m = 0.0;
    for (int i = 0; i < MAX_SEQS; i++)
        for (size_t j = 0; j < (size_t)s->tokens[i] * (size_t)D; j++) {
            d = fmax(d, fabs(a->out[i][j] - b->out[i][j]));
            m = fmax(m, fabs(b->out[i][j]));
        }
    return m > 0.0 ? d / m : d;
}

/* ---- the library side ---------------------------------------------------------------------------- */

static const char *path_name(clmla_attention_path p)
{
    return p == CLMLA_PATH_ABSORBED ? "absorbed" : "decompressed";
}

/* Runs sequences 0 .. nseq-1 through a fresh float32 cache, all in each step: their prefills in one,
   then DECODE_STEPS steps of one token each, every step on `path`; then checks each sequence's
   output against want. Returns the largest error (INFINITY when a step failed). */
static double run_batch(clmla_layer *layer, const clmla_layer_config *c, const seqs *s, int nseq,
                        clmla_attention_path path, const ref_outs *want, const char *what)
{
    const size_t D = (size_t)c->hidden_size;
    clmla_cache_config cc = {1, c->kv_lora_rank, c->qk_rope_head_dim, BLOCK_TOKENS, 8, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    clmla_status st = clmla_cache_create(ctx, &cc, &cache);
    CHECK(st == CLMLA_SUCCESS, "%s: cache_create: %s: %s", what, clmla_status_string(st), clmla_last_error(ctx));
    if (st != CLMLA_SUCCESS)
        return INFINITY;
    int32_t ids[MAX_SEQS];
    float *out[MAX_SEQS] = {NULL}, *x = NULL, *y = NULL;
    int total = 0, ok = 1;
    for (int i = 0; i < nseq; i++) {
        st = clmla_cache_seq_add(cache, &ids[i]);
        CHECK_STATUS(st, CLMLA_SUCCESS, ctx);
        ok &= st == CLMLA_SUCCESS;
        out[i] = malloc((size_t)s->tokens[i] * D * sizeof(float));
        ok &= out[i] != NULL;
        total += PREFILL[i];
    }
    x = malloc((size_t)total * D * sizeof(float));
    y = malloc((size_t)total * D * sizeof(float));
    ok &= x && y;
    double err = INFINITY;
    for (int step = 0; ok && step <= DECODE_STEPS; step++) {
        /* Rows of x: each sequence's new tokens in turn. */
        clmla_batch_entry e[MAX_SEQS];
        size_t row = 0;
        for (int i = 0; i < nseq; i++) {
            const int first = step == 0 ? 0 : PREFILL[i] + step - 1, n = step == 0 ? PREFILL[i] : 1;
            e[i] = (clmla_batch_entry){ids[i], n};
            memcpy(x + row * D, s->x[i] + (size_t)first * D, (size_t)n * D * sizeof(float));
            row += (size_t)n;
        }
        clmla_forward_args a;
        memset(&a, 0, sizeof(a));
        a.entries = e;
        a.num_entries = nseq;
        a.path = path;
        st = clmla_layer_forward(layer, cache, &a, x, y);
        CHECK(st == CLMLA_SUCCESS, "%s: step %d: %s: %s", what, step, clmla_status_string(st), clmla_last_error(ctx));
        ok = st == CLMLA_SUCCESS;
        row = 0;
        for (int i = 0; ok && i < nseq; i++) {
            const int first = step == 0 ? 0 : PREFILL[i] + step - 1;
            memcpy(out[i] + (size_t)first * D, y + row * D, (size_t)e[i].num_tokens * D * sizeof(float));
            row += (size_t)e[i].num_tokens;
        }
    }
    if (ok) {
        err = 0.0;
        for (int i = 0; i < nseq; i++) {
            const size_t n = (size_t)s->tokens[i] * D;
            size_t worst = 0;
            const double e = mla_ref_max_rel_err(out[i], want->out[i], n, &worst);
            CHECK(e <= TOL_F32_CACHE, "%s: sequence %d (%d + %d tokens): max rel err %.3g > %.3g, worst at [%zu, %zu]: "
                  "got %.8g, want %.8g", what, i, PREFILL[i], DECODE_STEPS, e, TOL_F32_CACHE, worst / D, worst % D,
                  (double)out[i][worst], want->out[i][worst]);
            err = fmax(err, e);
        }
    }
    for (int i = 0; i < nseq; i++)
        free(out[i]);
    free(x);
    free(y);
    clmla_cache_destroy(cache);
    return err;
}

/* Bytes of a [rows, cols] projection kept in `dtype`: its codes, and an FP8 one's float32 scales. */
static size_t stored_bytes(int dtype, size_t rows, size_t cols)
{
    const size_t size = dtype == CLMLA_DTYPE_F32 ? 4 : dtype == CLMLA_DTYPE_FP8_E4M3 ? 1 : 2;
    size_t bytes = rows * cols * size;
    if (dtype == CLMLA_DTYPE_FP8_E4M3)
        bytes += 4 * ((rows + FP8_BLOCK - 1) / FP8_BLOCK) * ((cols + FP8_BLOCK - 1) / FP8_BLOCK);
    return bytes;
}

static void check_bytes(const char *what, const char *name, size_t got, size_t want, size_t extra)
{
    CHECK(got >= want && (double)got <= MEMORY_SLACK * (double)want + (double)extra,
          "%s: %s holds %zu bytes on the device; kept as the layer keeps it, %zu (+ up to 1%%%s)", what, name, got,
          want, extra ? " and the fp8 padding" : "");
}

/* clmla_layer_get_memory against each projection's bytes in the dtype it is kept in (kept[i]). The
   stacked q_proj or q_a_proj + kv_a_proj_with_mqa is checked as one: its split between the two is
   the layer's, and in fp8 the second part starts on a block boundary (up to 127 rows of padding). */
static void check_memory(clmla_layer *layer, const tu_weights *w, const int kept[NUM_PROJ], const char *what)
{
    clmla_layer_memory m;
    CHECK_STATUS(clmla_layer_get_memory(layer, &m), CLMLA_SUCCESS, ctx);
    size_t rows[NUM_PROJ], cols[NUM_PROJ], want[NUM_PROJ];
    for (int i = 0; i < NUM_PROJ; i++)
        want[i] = proj_data(w, i, &rows[i], &cols[i]) ? stored_bytes(kept[i], rows[i], cols[i]) : 0;
    const int q = w->config.q_lora_rank ? P_Q_A : P_Q;
    const size_t pad = kept[q] == CLMLA_DTYPE_FP8_E4M3 ? (FP8_BLOCK - rows[q] % FP8_BLOCK) % FP8_BLOCK * cols[q] : 0;
    check_bytes(what, "q_proj or q_a_proj + kv_a_proj_with_mqa", m.q_a_proj + m.q_proj + m.kv_a_proj_with_mqa,
                want[q] + want[P_KV_A], pad);
    CHECK((q == P_Q_A ? m.q_proj : m.q_a_proj) == 0, "%s: %zu bytes counted for the %s this shape has not", what,
          q == P_Q_A ? m.q_proj : m.q_a_proj, q == P_Q_A ? "q_proj" : "q_a_proj");
    check_bytes(what, "q_b_proj", m.q_b_proj, want[P_Q_B], 0);
    check_bytes(what, "kv_b_proj", m.kv_b_proj, want[P_KV_B], 0);
    check_bytes(what, "o_proj", m.o_proj, want[P_O], 0);
    const size_t norms = 4 * (size_t)(w->config.q_lora_rank + w->config.kv_lora_rank);
    check_bytes(what, "the norms (float32)", m.norms, norms, 0);
}

/* One layer for one case: the reference on the case's values (and how far they move it from the
   float32 weights' output), the layer's configuration and memory, and the four runs. */
static void run_case(const tu_weights *w, const mla_ref_config *rc, const seqs *s, const ref_outs *f32_ref,
                     const weights_case *k, const char *shape)
{
    char what[240];
    snprintf(what, sizeof(what), "%s, %s", shape, k->name);
    given_weights g;
    if (given_make(&g, w, k) != 0) {
        CHECK(0, "%s: out of host memory, or a rounding its dtype cannot hold", what);
        return;
    }
    ref_outs want;
    const int ref_ok = ref_outs_make(&want, rc, &g.ref, s) == 0;
    CHECK(ref_ok, "%s: the reference failed", what);
    int rounded = 0, kept[NUM_PROJ];
    for (int i = 0; i < NUM_PROJ; i++) {
        kept[i] = kept_dtype(k->proj_dtype[i], k->keep);
        rounded |= kept[i] != CLMLA_DTYPE_F32 || k->proj_dtype[i] != CLMLA_DTYPE_F32;
    }
    /* Under AS_GIVEN, a stacked pair of two dtypes is kept in float32 (host/mla/weight.h). */
    const int q = w->config.q_lora_rank ? P_Q_A : P_Q;
    if (k->keep == CLMLA_WEIGHTS_AS_GIVEN && kept[q] != kept[P_KV_A])
        kept[q] = kept[P_KV_A] = CLMLA_DTYPE_F32;
    rounded |= k->norm_dtype != CLMLA_DTYPE_F32;

    double effect = 0.0;
    if (ref_ok && rounded) {
        effect = ref_effect(&want, f32_ref, s, w->config.hidden_size);
        CHECK(effect > DTYPE_EFFECT_MIN, "%s: the rounded weights move the reference by only %.3g (need > %.3g)",
              what, effect, DTYPE_EFFECT_MIN);
    }

    clmla_layer_config c = w->config;
    c.weights_dtype = k->keep;
    clmla_layer *layer = NULL;
    clmla_status st = clmla_layer_create(ctx, &c, &g.layer, &layer);
    CHECK(st == CLMLA_SUCCESS, "%s: layer_create: %s: %s", what, clmla_status_string(st), clmla_last_error(ctx));
    if (layer) {
        clmla_layer_config got;
        memset(&got, 0, sizeof(got));
        CHECK_STATUS(clmla_layer_get_config(layer, &got), CLMLA_SUCCESS, ctx);
        CHECK(got.weights_dtype == k->keep, "%s: get_config says weights_dtype %d, created with %d", what,
              (int)got.weights_dtype, (int)k->keep);
        check_memory(layer, w, kept, what);
    }
    if (layer && ref_ok) {
        double e[4];
        int n = 0;
        char run[320];
        for (int nseq = 1; nseq <= MAX_SEQS; nseq += MAX_SEQS - 1)
            for (int p = 0; p < 2; p++) {
                const clmla_attention_path path = p ? CLMLA_PATH_DECOMPRESSED : CLMLA_PATH_ABSORBED;
                snprintf(run, sizeof(run), "%s: %s, %d sequence%s", what, path_name(path), nseq, nseq > 1 ? "s" : "");
                e[n++] = run_batch(layer, &c, s, nseq, path, &want, run);
            }
        printf("    %-34s batch 1 abs %.2e dec %.2e | batch 3 abs %.2e dec %.2e (tol %.0e) | rounding moves the "
               "reference by %.3g\n",
               k->name, e[0], e[1], e[2], e[3], TOL_F32_CACHE, effect);
    }
    clmla_layer_destroy(layer);
    ref_outs_free(&want);
    given_free(&g);
}

/* The cases on one shape: its weights (o_proj scaled by O_PROJ_SCALE), its sequences, the
   reference on the float32 weights, then each case. */
static void run_shape(const char *shape, const clmla_layer_config *config, const weights_case *cases, int ncases,
                      uint64_t seed)
{
    char desc[200];
    tu_config_describe(config, desc, sizeof(desc));
    printf("  %s: %s\n", shape, desc);
    CHECK_STATUS(clmla_layer_config_validate(config), CLMLA_SUCCESS, NULL);
    tu_weights w;
    if (tu_weights_make(&w, config, seed) != 0) {
        CHECK(0, "%s: out of host memory", shape);
        return;
    }
    size_t rows, cols;
    float *o = proj_data(&w, P_O, &rows, &cols);
    for (size_t i = 0; i < rows * cols; i++)
        o[i] *= O_PROJ_SCALE;
    seqs s;
    ref_outs f32_ref;
    memset(&f32_ref, 0, sizeof(f32_ref));
    const int ok = seqs_make(&s, config->hidden_size, seed + 100) == 0 &&
                   ref_outs_make(&f32_ref, &w.ref_config, &w.ref, &s) == 0;
    CHECK(ok, "%s: out of host memory, or the reference failed", shape);
    for (int i = 0; ok && i < ncases; i++)
        run_case(&w, &w.ref_config, &s, &f32_ref, &cases[i], shape);
    ref_outs_free(&f32_ref);
    seqs_free(&s);
    tu_weights_free(&w);
}

/* ---- parts ------------------------------------------------------------------------------------ */

#define ALL(d) {d, d, d, d, d, d}

/* float32 weights converted at creation, each weights_dtype. */
static const weights_case CONVERT[] = {
    {"f32 (control)", ALL(CLMLA_DTYPE_F32), CLMLA_DTYPE_F32, CLMLA_WEIGHTS_F32},
    {"f16", ALL(CLMLA_DTYPE_F32), CLMLA_DTYPE_F32, CLMLA_WEIGHTS_F16},
    {"bf16", ALL(CLMLA_DTYPE_F32), CLMLA_DTYPE_F32, CLMLA_WEIGHTS_BF16},
    {"fp8", ALL(CLMLA_DTYPE_F32), CLMLA_DTYPE_F32, CLMLA_WEIGHTS_FP8},
};
#define NUM_CONVERT ((int)(sizeof(CONVERT) / sizeof(CONVERT[0])))

/* The odd small shape: D 40, 3 heads, dn/dr/dv 16/8/12. */
static clmla_layer_config small_shape(int rq, int rkv)
{
    return tu_small_config(40, 3, rq, rkv, 16, 8, 12);
}

static void part_small_q_proj(void)
{
    const clmla_layer_config c = small_shape(0, 128);
    run_shape("small, q_proj", &c, CONVERT, NUM_CONVERT, 8100);
}

static void part_small_q_lora(void)
{
    const clmla_layer_config c = small_shape(24, 128);
    run_shape("small, query LoRA", &c, CONVERT, NUM_CONVERT, 8200);
}

/* rkv 40: kv_b_proj's columns are one partial fp8 block (an fp8 cache needs rkv % 128 == 0, fp8
   weights do not). */
static void part_small_rkv40(void)
{
    const weights_case cases[] = {CONVERT[0], CONVERT[2], CONVERT[3]};
    const clmla_layer_config c = small_shape(0, 40);
    run_shape("small, rkv 40", &c, cases, 3, 8300);
}

/* DeepSeek-V2-Lite's shape (D 2048, rkv 512, dn/dr/dv 128/64/128, YaRN) with 2 of its 16 heads:
   full 128 x 128 blocks, and q_proj's 384 rows stacked on kv_a_proj_with_mqa's 576. */
static void part_v2_lite(void)
{
    clmla_layer_config c;
    CHECK_STATUS(clmla_layer_config_preset(CLMLA_PRESET_DEEPSEEK_V2_LITE, &c), CLMLA_SUCCESS, NULL);
    c.num_heads = 2;
    run_shape("v2-lite, 2 heads", &c, CONVERT, NUM_CONVERT, 8400);
}

/* Tensors given in a dtype. DeepSeek-V3's checkpoints are the fp8 case: fp8 projections with their
   scales, bf16 norms. "mixed" gives the stacked q_a_proj (fp8) and kv_a_proj_with_mqa (f16) in two
   dtypes, which the layer keeps in float32, beside bf16 / fp8 / f16 others. The last two convert
   a given dtype to another: the layer rounds the given dtype's values. */
static const weights_case GIVEN[] = {
    {"bf16 given", ALL(CLMLA_DTYPE_BF16), CLMLA_DTYPE_BF16, CLMLA_WEIGHTS_AS_GIVEN},
    {"f16 given", ALL(CLMLA_DTYPE_F16), CLMLA_DTYPE_F16, CLMLA_WEIGHTS_AS_GIVEN},
    {"fp8 given, bf16 norms", ALL(CLMLA_DTYPE_FP8_E4M3), CLMLA_DTYPE_BF16, CLMLA_WEIGHTS_AS_GIVEN},
    {"mixed given",
     {CLMLA_DTYPE_FP8_E4M3, CLMLA_DTYPE_BF16, CLMLA_DTYPE_F32, CLMLA_DTYPE_F16, CLMLA_DTYPE_FP8_E4M3, CLMLA_DTYPE_F16},
     CLMLA_DTYPE_F32,
     CLMLA_WEIGHTS_AS_GIVEN},
    {"bf16 given, kept fp8", ALL(CLMLA_DTYPE_BF16), CLMLA_DTYPE_BF16, CLMLA_WEIGHTS_FP8},
    {"fp8 given, kept bf16", ALL(CLMLA_DTYPE_FP8_E4M3), CLMLA_DTYPE_F32, CLMLA_WEIGHTS_BF16},
};

static void part_as_given(void)
{
    const clmla_layer_config c = small_shape(24, 128);
    run_shape("small, query LoRA", &c, GIVEN, (int)(sizeof(GIVEN) / sizeof(GIVEN[0])), 8500);
}

/* The same on q_proj (rq 0), where q_proj and kv_a_proj_with_mqa are the stacked pair. */
static void part_as_given_q_proj(void)
{
    const weights_case cases[] = {GIVEN[2], GIVEN[3]};
    const clmla_layer_config c = small_shape(0, 128);
    run_shape("small, q_proj", &c, cases, 2, 8600);
}

/* The small query-LoRA shape again with every product through CLBlast, as GPUs run prefill-sized
   ones: the absorbed path's per-head products decode the heads' kv_b_proj rows to float32 in
   groups and multiply each group in one strided batch. Its 3 heads' slices (28 rows of 128 apart)
   in one group (the default 32 MiB), in groups of 2 and 1 (a 28672-byte piece), and one by one
   (a piece too small for two). */
static void part_clblast(void)
{
    static const size_t pieces[] = {0, 28672, 1};
    const clmla_layer_config c = small_shape(24, 128);
    for (int i = 0; i < 3; i++) {
        char what[64];
        snprintf(what, sizeof(what), "small, query LoRA, CLBlast, piece %zu", pieces[i]);
        CHECK_STATUS(clmla_gemm_force_clblast(ctx, 1), CLMLA_SUCCESS, ctx);
        CHECK_STATUS(clmla_gemm_set_weight_piece(ctx, pieces[i]), CLMLA_SUCCESS, ctx);
        run_shape(what, &c, CONVERT, NUM_CONVERT, 8700 + (uint64_t)i);
    }
    clmla_gemm_set_weight_piece(ctx, 0);
    clmla_gemm_force_clblast(ctx, 0);
}

static const tu_part parts[] = {
    {"small-q-proj", part_small_q_proj}, {"small-q-lora", part_small_q_lora},
    {"small-rkv40", part_small_rkv40},   {"v2-lite", part_v2_lite},
    {"as-given", part_as_given},         {"as-given-q-proj", part_as_given_q_proj},
    {"clblast", part_clblast},
};

int main(int argc, char **argv)
{
    return tu_parts_exit(
        tu_run_parts(argc, argv, parts, (int)(sizeof(parts) / sizeof(parts[0])), NULL, &ctx, &check_failed));
}
