/* Tensor-parallel shards of an attention layer (clmla_layer_config.tp_rank / tp_size, docs/MODELS.md
 * "Tensor-parallel shards"): shard r of n holds its H/n heads' rows of q_b_proj (q_proj) and
 * kv_b_proj and their columns of o_proj, and its output is a partial sum: the sum over the ranks
 * must equal the whole layer's output, o_proj's bias added by rank 0 alone.
 *
 * Parts:
 *   one per case   random weights on small odd shapes (6 heads in 2 and 3 shards, 4 heads in 4 and 2;
 *                  q_proj and a query LoRA; every bias the shape allows), given as f32, bf16 or fp8
 *                  codes with 128 x 128 block scales. fp8 shapes whose shard boundaries lie on the
 *                  scale grid (64-wide heads: 256 rows of q_b_proj and kv_b_proj, 128 columns of
 *                  o_proj per shard of 2) must keep fp8 (clmla_layer_get_memory), those whose
 *                  boundaries do not must be held in float32 with a warning through the context's
 *                  log. Each shard count runs twice: every rank given the whole tensors, and every
 *                  rank given tensors already sliced for it. Each rank has a cache of its own and
 *                  runs, on both attention paths, a prefill of 7 tokens and 4 one-token decode steps;
 *                  the summed outputs are compared with the whole layer's (same weights, same
 *                  steps) and with the float64 reference (ref/) fed the weights as their dtype
 *                  holds them;
 *   errors         tp_size not dividing the heads (the message names both numbers), tp_rank out of
 *                  range, negative tp_size, a tensor of neither the whole nor the shard's shape
 *                  (the message names it), a missing one: refused with nothing created on the
 *                  device; clmla_layer_get_config gives the configuration as given and
 *                  clmla_layer_get_memory counts the shard's bytes;
 *   model          model folders (tests/checkpoint_writer.c: f32 in two safetensors shards, fp8 on
 *                  and off the scale grid) loaded with clmla_model_options.tp_rank / tp_size: the
 *                  shards' sum against the whole layer from the same folder and the reference;
 *   cli            `clmla run --tp-rank R --tp-size N`: the ranks' Y.npy summed against a whole run.
 * `test_tp PART...` runs the named parts. */
#include "check.h"
#include "checkpoint_writer.h"
#include "clcall.h"
#include "clmla.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CLMLA_CLI_PATH
#error "CLMLA_CLI_PATH must name the clmla executable"
#endif

static clmla_context *ctx;

/* A context whose warnings are counted (the fp8 fallback is announced through the log). */
static clmla_context *logged;
static int warnings, grid_warnings;

static void count_warning(void *user, clmla_log_level level, const char *message)
{
    (void)user;
    if (level != CLMLA_LOG_WARNING)
        return;
    warnings++;
    if (strstr(message, "scale blocks"))
        grid_warnings++;
}

static clmla_context *logged_context(void)
{
    if (!logged) {
        clmla_context_options o;
        memset(&o, 0, sizeof(o));
        o.log = count_warning;
        o.log_level = CLMLA_LOG_WARNING;
        const clmla_status st = clmla_context_create_opts(&o, &logged);
        CHECK_STATUS(st, CLMLA_SUCCESS, NULL);
    }
    return logged;
}

/* Tokens of every schedule: a prefill of PREFILL, then one-token decode steps. */
enum { T = 11, PREFILL = 7, BLOCK_TOKENS = 4, FP8_BLOCK = 128 };

/* ---- the projections of a layer, by index ------------------------------------------------------ */

enum { P_Q_A, P_Q_B, P_Q, P_KV_A, P_KV_B, P_O, NUM_PROJ };

static float *proj_values(tu_weights *w, int p)
{
    float *v[NUM_PROJ] = {w->q_a_proj, w->q_b_proj, w->q_proj, w->kv_a_proj_with_mqa, w->kv_b_proj, w->o_proj};
    return v[p];
}

static clmla_tensor *proj_tensor(clmla_layer_weights *l, int p)
{
    clmla_tensor *t[NUM_PROJ] = {&l->q_a_proj,           &l->q_b_proj,  &l->q_proj,
                                 &l->kv_a_proj_with_mqa, &l->kv_b_proj, &l->o_proj};
    return t[p];
}

/* The rows and columns of projection p of the whole layer. */
static void proj_shape(const clmla_layer_config *c, int p, int64_t *rows, int64_t *cols)
{
    const int64_t D = c->hidden_size, H = c->num_heads, rq = c->q_lora_rank, rkv = c->kv_lora_rank;
    const int64_t dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    const int64_t shapes[NUM_PROJ][2] = {{rq, D}, {H * (dn + dr), rq}, {H * (dn + dr), D}, {rkv + dr, D},
                                         {H * (dn + dv), rkv}, {D, H * dv}};
    *rows = shapes[p][0];
    *cols = shapes[p][1];
}

/* The block of projection p that shard `rank` of `n` keeps: r0, rows, c0, cols (the whole tensor for
   the projections that are not sharded). */
static void shard_block(const clmla_layer_config *c, int p, int rank, int n, int64_t block[4])
{
    int64_t rows, cols;
    proj_shape(c, p, &rows, &cols);
    block[0] = 0, block[1] = rows, block[2] = 0, block[3] = cols;
    if (n <= 1)
        return;
    const int64_t hs = c->num_heads / n, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    if (p == P_Q_B || p == P_Q)
        block[0] = rank * hs * (dn + dr), block[1] = hs * (dn + dr);
    else if (p == P_KV_B)
        block[0] = rank * hs * (dn + dv), block[1] = hs * (dn + dv);
    else if (p == P_O)
        block[2] = rank * hs * dv, block[3] = hs * dv;
}

static int on_grid(int64_t start, int64_t end, int64_t extent)
{
    return start % FP8_BLOCK == 0 && (end % FP8_BLOCK == 0 || end == extent);
}

/* 1 when every shard's block of projection p lies on the fp8 scale grid (the rule of
   docs/MODELS.md): then an fp8 projection stays fp8 in every shard. */
static int block_on_grid(const clmla_layer_config *c, int p, int n)
{
    int64_t rows, cols, b[4];
    proj_shape(c, p, &rows, &cols);
    int ok = 1;
    for (int r = 0; r < (n > 1 ? n : 1); r++) {
        shard_block(c, p, r, n, b);
        ok = ok && on_grid(b[0], b[0] + b[1], rows) && on_grid(b[2], b[2] + b[3], cols);
    }
    return ok;
}

/* ---- a case's weights -------------------------------------------------------------------------- */

typedef struct case_def {
    const char *name;
    int D, H, rq, rkv, dn, dr, dv;
    clmla_dtype dtype; /* every projection given in it (weights_dtype AS_GIVEN) */
    int biases;        /* 1: o_proj's and kv_a_proj_with_mqa's biases, and q_a_proj's with rq > 0 */
    int tps[2];        /* shard counts (0: none) */
} case_def;

static const case_def cases[] = {
    {"f32-q-proj-bias", 37, 6, 0, 40, 13, 8, 11, CLMLA_DTYPE_F32, 1, {2, 3}},
    {"bf16-lora-bias", 29, 6, 24, 32, 9, 6, 7, CLMLA_DTYPE_BF16, 1, {3, 2}},
    {"f32-lora-4-heads", 31, 4, 20, 36, 10, 4, 12, CLMLA_DTYPE_F32, 1, {4, 2}},
    /* shard boundaries at 64 (or 96) rows: off the grid, every shard holds float32 */
    {"fp8-off-grid", 33, 6, 0, 40, 13, 8, 11, CLMLA_DTYPE_FP8_E4M3, 0, {2, 3}},
    /* 2 shards: 256 rows of q_b_proj and kv_b_proj, 128 columns of o_proj each, all on the grid; 4
       shards: rows on the grid, o_proj's 64 columns not (o_proj alone in float32) */
    {"fp8-grid-lora-bias", 40, 4, 48, 36, 64, 64, 64, CLMLA_DTYPE_FP8_E4M3, 1, {2, 4}},
    {"fp8-grid-q-proj", 40, 4, 0, 36, 64, 64, 64, CLMLA_DTYPE_FP8_E4M3, 0, {2, 0}},
};
#define NUM_CASES ((int)(sizeof(cases) / sizeof(cases[0])))

typedef struct case_weights {
    clmla_layer_config config;
    tu_weights w;              /* float32 values, rounded in place to what the case's dtype holds */
    float *bias[3];            /* q_a_proj, kv_a_proj_with_mqa, o_proj; NULL when absent */
    void *codes[NUM_PROJ];     /* each projection's BF16 or FP8 codes (NULL for F32) */
    float *scales[NUM_PROJ];   /* FP8's block scales */
    clmla_layer_weights layer; /* the whole tensors */
    mla_ref_features f;        /* the biases, for the reference */
} case_weights;

static void case_weights_free(case_weights *cw)
{
    tu_weights_free(&cw->w);
    for (int i = 0; i < 3; i++)
        free(cw->bias[i]);
    for (int p = 0; p < NUM_PROJ; p++) {
        free(cw->codes[p]);
        free(cw->scales[p]);
    }
    memset(cw, 0, sizeof(*cw));
}

/* Projection p of t's float32 values given as `dtype`: BF16 as the top halves of bf16-exact floats,
   FP8 as the reference's quantiser's codes and scales; the values become those the dtype holds. */
static int encode_projection(case_weights *cw, int p, clmla_dtype dtype)
{
    float *v = proj_values(&cw->w, p);
    clmla_tensor *t = proj_tensor(&cw->layer, p);
    if (!v || dtype == CLMLA_DTYPE_F32)
        return 0;
    int64_t rows, cols;
    proj_shape(&cw->config, p, &rows, &cols);
    const size_t n = (size_t)(rows * cols);
    if (dtype == CLMLA_DTYPE_BF16) {
        if (mla_ref_round_weight(MLA_REF_WEIGHT_BF16, v, (int)rows, (int)cols) != 0 || !(cw->codes[p] = malloc(n * 2)))
            return -1;
        uint16_t *codes = cw->codes[p];
        for (size_t i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &v[i], 4);
            codes[i] = (uint16_t)(bits >> 16);
        }
    } else {
        const size_t blocks = (size_t)((rows + FP8_BLOCK - 1) / FP8_BLOCK * ((cols + FP8_BLOCK - 1) / FP8_BLOCK));
        cw->codes[p] = malloc(n);
        cw->scales[p] = malloc(blocks * sizeof(float));
        if (!cw->codes[p] || !cw->scales[p] ||
            mla_ref_quantize_fp8(v, (int)rows, (int)cols, cw->codes[p], cw->scales[p]) != 0 ||
            mla_ref_round_weight(MLA_REF_WEIGHT_FP8, v, (int)rows, (int)cols) != 0)
            return -1;
        t->scale = cw->scales[p];
    }
    t->data = cw->codes[p];
    t->dtype = dtype;
    return 0;
}

static int case_weights_make(case_weights *cw, const case_def *k, uint64_t seed)
{
    memset(cw, 0, sizeof(*cw));
    cw->config = tu_small_config(k->D, k->H, k->rq, k->rkv, k->dn, k->dr, k->dv);
    if (tu_weights_make(&cw->w, &cw->config, seed) != 0)
        return -1;
    cw->layer = cw->w.layer;
    for (int p = 0; p < NUM_PROJ; p++)
        if (encode_projection(cw, p, k->dtype) != 0) {
            case_weights_free(cw);
            return -1;
        }
    if (k->biases) {
        const int sizes[3] = {k->rq, k->rkv + k->dr, k->D};
        tu_rng rng = tu_rng_seed(seed ^ 0xb1a5);
        for (int i = 0; i < 3; i++) {
            if (sizes[i] == 0)
                continue;
            if (!(cw->bias[i] = malloc((size_t)sizes[i] * sizeof(float)))) {
                case_weights_free(cw);
                return -1;
            }
            tu_fill_uniform(cw->bias[i], (size_t)sizes[i], 0.0f, 0.5f, &rng);
        }
        clmla_tensor *b[3] = {&cw->layer.q_a_proj_bias, &cw->layer.kv_a_proj_with_mqa_bias, &cw->layer.o_proj_bias};
        for (int i = 0; i < 3; i++)
            if (cw->bias[i])
                *b[i] = clmla_tensor_1d(cw->bias[i], sizes[i]);
        cw->f.q_a_proj_bias = cw->bias[0];
        cw->f.kv_a_proj_with_mqa_bias = cw->bias[1];
        cw->f.o_proj_bias = cw->bias[2];
    }
    return 0;
}

/* A tensor of the test's own making: the block a caller slicing a checkpoint for a shard would pass. */
typedef struct owned_tensor {
    clmla_tensor t;
    void *data;
    float *scale;
} owned_tensor;

static void owned_free(owned_tensor *o)
{
    free(o->data);
    free(o->scale);
    memset(o, 0, sizeof(*o));
}

/* Block b of tensor t (values: its float32 values, [rows, cols]) copied in t's dtype; an FP8 block off
   its scale grid as float32 values, since its scales cannot follow it. */
static int slice_tensor(const clmla_tensor *t, const float *values, const int64_t b[4], owned_tensor *o)
{
    memset(o, 0, sizeof(*o));
    const int64_t rows = t->shape[0], cols = t->shape[1];
    int fp8 = t->dtype == CLMLA_DTYPE_FP8_E4M3;
    const int keep = !fp8 || (on_grid(b[0], b[0] + b[1], rows) && on_grid(b[2], b[2] + b[3], cols));
    const clmla_dtype dtype = keep ? t->dtype : CLMLA_DTYPE_F32;
    const size_t eb = dtype == CLMLA_DTYPE_F32 ? 4 : dtype == CLMLA_DTYPE_FP8_E4M3 ? 1 : 2;
    if (!(o->data = malloc((size_t)(b[1] * b[3]) * eb)))
        return -1;
    for (int64_t i = 0; i < b[1]; i++) {
        const size_t from = (size_t)((b[0] + i) * cols + b[2]);
        char *to = (char *)o->data + (size_t)(i * b[3]) * eb;
        if (keep)
            memcpy(to, (const char *)t->data + from * eb, (size_t)b[3] * eb);
        else
            memcpy(to, values + from, (size_t)b[3] * sizeof(float));
    }
    o->t = *t;
    o->t.data = o->data;
    o->t.shape[0] = b[1];
    o->t.shape[1] = b[3];
    o->t.dtype = dtype;
    o->t.scale = NULL;
    if (keep && fp8) {
        const int64_t bk = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
        const int64_t sr = (b[1] + FP8_BLOCK - 1) / FP8_BLOCK, sc = (b[3] + FP8_BLOCK - 1) / FP8_BLOCK;
        if (!(o->scale = malloc((size_t)(sr * sc) * sizeof(float)))) {
            owned_free(o);
            return -1;
        }
        for (int64_t i = 0; i < sr; i++)
            memcpy(o->scale + i * sc, t->scale + (b[0] / FP8_BLOCK + i) * bk + b[2] / FP8_BLOCK,
                   (size_t)sc * sizeof(float));
        o->t.scale = o->scale;
    }
    return 0;
}

/* ---- running a layer ------------------------------------------------------------------------------ */

/* A prefill of PREFILL tokens, then one-token decode steps, through a cache of the layer's own:
   out [T, D]. Returns 0, or -1 after a failed CHECK. */
static int run_steps(clmla_context *c, clmla_layer *layer, const float *x, clmla_attention_path path, float *out)
{
    clmla_layer_config lc;
    CHECK_STATUS(clmla_layer_get_config(layer, &lc), CLMLA_SUCCESS, c);
    clmla_cache_config cc = {.num_layers = 1, .kv_lora_rank = lc.kv_lora_rank, .rope_dim = lc.qk_rope_head_dim,
                             .block_tokens = BLOCK_TOKENS, .num_blocks = (T + BLOCK_TOKENS - 1) / BLOCK_TOKENS};
    clmla_cache *cache = NULL;
    int32_t seq = -1;
    clmla_status st = clmla_cache_create(c, &cc, &cache);
    if (st == CLMLA_SUCCESS)
        st = clmla_cache_seq_add(cache, &seq);
    const int D = lc.hidden_size;
    for (int t = 0; st == CLMLA_SUCCESS && t < T;) {
        const clmla_batch_entry e = {seq, t == 0 ? PREFILL : 1};
        const clmla_forward_args a = {&e, 1, 0, path};
        st = clmla_layer_forward(layer, cache, &a, x + (size_t)t * D, out + (size_t)t * D);
        t += e.num_tokens;
    }
    CHECK_STATUS(st, CLMLA_SUCCESS, c);
    clmla_cache_destroy(cache);
    return st == CLMLA_SUCCESS ? 0 : -1;
}

static const clmla_attention_path paths[2] = {CLMLA_PATH_ABSORBED, CLMLA_PATH_DECOMPRESSED};
static const char *const path_names[2] = {"absorbed", "decompressed"};

/* Runs `layer` on both paths into out[path] and adds that into sum[path] (when sum is given). */
static int run_both(clmla_context *c, clmla_layer *layer, const float *x, size_t n, float *out[2], float *sum[2])
{
    for (int p = 0; p < 2; p++) {
        if (run_steps(c, layer, x, paths[p], out[p]) != 0)
            return -1;
        for (size_t i = 0; sum && i < n; i++)
            sum[p][i] += out[p][i];
    }
    return 0;
}

/* A case's outputs of n values on each path: the whole layer's, one run's, the reference's and the
   shards' sum (zeroed). 1 when all eight were allocated; outputs_free frees them either way. */
static int outputs_make(size_t n, float *whole[2], float *out[2], double *ref[2], float *sum[2])
{
    int ok = 1;
    for (int p = 0; p < 2; p++) {
        whole[p] = malloc(n * sizeof(float));
        out[p] = malloc(n * sizeof(float));
        ref[p] = malloc(n * sizeof(double));
        sum[p] = calloc(n, sizeof(float));
        ok = ok && whole[p] && out[p] && ref[p] && sum[p];
    }
    return ok;
}

static void outputs_free(float *whole[2], float *out[2], double *ref[2], float *sum[2])
{
    for (int p = 0; p < 2; p++) {
        free(whole[p]);
        free(out[p]);
        free(ref[p]);
        free(sum[p]);
    }
}

/* Compares the shards' sums with the whole layer's output and the reference on both paths. */
static void compare_sums(const char *what, float *sum[2], float *whole[2], double *ref[2], size_t n, int D)
{
    for (int p = 0; p < 2; p++) {
        double *w = tu_to_double(whole[p], n);
        CHECK(w != NULL, "out of memory");
        if (w)
            CHECK_CLOSE(sum[p], w, n, D, TOL_AGREE_F32, "%s, %s: sum of the shards against the whole layer", what,
                        path_names[p]);
        free(w);
        if (ref)
            CHECK_CLOSE(sum[p], ref[p], n, D, TOL_F32_CACHE, "%s, %s: sum of the shards against the reference", what,
                        path_names[p]);
    }
}

/* ---- the cases ---------------------------------------------------------------------------------- */

/* The bytes a shard keeps of projection p ([rows, cols] elements) say which dtype it is held in:
   under 2 bytes an element for fp8, 4 or more for float32. */
static void check_held(const char *what, const char *name, size_t bytes, int64_t elements, int want_fp8)
{
    const double per = (double)bytes / (double)elements;
    CHECK(want_fp8 ? per < 2.0 : per >= 4.0, "%s: %s holds %.2f bytes per element, expected %s", what, name, per,
          want_fp8 ? "fp8 (about 1)" : "float32 (4)");
}

static void run_case(const case_def *k)
{
    clmla_context *c = logged_context();
    if (!c)
        return;
    case_weights cw;
    CHECK(case_weights_make(&cw, k, 0x7e57 + (uint64_t)(k - cases)) == 0, "%s: out of memory", k->name);
    const int D = k->D;
    const size_t n = (size_t)T * (size_t)D;
    float *x = tu_random_inputs(T, D, 0x1234 + (uint64_t)(k - cases));
    float *whole[2], *out[2], *sum[2];
    double *ref[2];
    clmla_layer *layer = NULL;
    int ok = outputs_make(n, whole, out, ref, sum) && x && cw.w.o_proj;
    CHECK(ok, "%s: out of memory", k->name);
    /* the reference, fed the weights as their dtype holds them */
    for (int p = 0; ok && p < 2; p++) {
        const int rc = mla_ref_forward_ext(&cw.w.ref_config, &cw.f, &cw.w.ref, T, x, NULL, 0,
                                           paths[p] == CLMLA_PATH_ABSORBED ? MLA_REF_ABSORBED : MLA_REF_DECOMPRESSED,
                                           ref[p], NULL, NULL, NULL, NULL, NULL, NULL);
        CHECK(rc == 0, "%s: the reference failed", k->name);
        ok = rc == 0;
    }
    /* the whole layer */
    if (ok) {
        clmla_status st = clmla_layer_create(c, &cw.config, &cw.layer, &layer);
        CHECK_STATUS(st, CLMLA_SUCCESS, c);
        ok = st == CLMLA_SUCCESS && run_both(c, layer, x, n, whole, NULL) == 0;
        clmla_layer_destroy(layer);
        layer = NULL;
        for (int p = 0; ok && p < 2; p++)
            CHECK_CLOSE(whole[p], ref[p], n, D, TOL_F32_CACHE, "%s, %s: the whole layer against the reference", k->name,
                        path_names[p]);
    }
    for (int ti = 0; ok && ti < 2; ti++) {
        const int tp = k->tps[ti];
        if (tp < 2)
            continue;
        for (int sliced = 0; ok && sliced < 2; sliced++) {
            char what[160];
            snprintf(what, sizeof(what), "%s, %d shards, %s tensors", k->name, tp, sliced ? "pre-sliced" : "whole");
            for (int p = 0; p < 2; p++)
                memset(sum[p], 0, n * sizeof(float));
            const int grid_before = grid_warnings;
            int off_grid = 0; /* an fp8 projection some shard cannot keep in fp8 */
            size_t biases0 = 0;
            for (int r = 0; ok && r < tp; r++) {
                clmla_layer_config lc = cw.config;
                lc.tp_rank = r;
                lc.tp_size = tp;
                clmla_layer_weights lw = cw.layer;
                owned_tensor slices[NUM_PROJ];
                memset(slices, 0, sizeof(slices));
                for (int p = 0; p < NUM_PROJ; p++) {
                    clmla_tensor *t = proj_tensor(&lw, p);
                    int64_t b[4];
                    shard_block(&cw.config, p, r, tp, b);
                    if (k->dtype == CLMLA_DTYPE_FP8_E4M3 && t->data && !block_on_grid(&cw.config, p, tp))
                        off_grid = 1;
                    if (!sliced || !t->data || (p != P_Q_B && p != P_Q && p != P_KV_B && p != P_O))
                        continue;
                    if (slice_tensor(t, proj_values(&cw.w, p), b, &slices[p]) != 0) {
                        CHECK(0, "%s: out of memory", what);
                        ok = 0;
                    }
                    *t = slices[p].t;
                }
                clmla_status st = ok ? clmla_layer_create(c, &lc, &lw, &layer) : CLMLA_ERROR_OUT_OF_HOST_MEMORY;
                CHECK(st == CLMLA_SUCCESS, "%s, rank %d: %s: %s", what, r, clmla_status_string(st),
                      clmla_last_error(c));
                for (int p = 0; p < NUM_PROJ; p++)
                    owned_free(&slices[p]);
                ok = st == CLMLA_SUCCESS && run_both(c, layer, x, n, out, sum) == 0;
                if (ok) {
                    clmla_layer_config got;
                    clmla_layer_get_config(layer, &got);
                    CHECK(got.num_heads == k->H && got.tp_rank == r && got.tp_size == tp,
                          "%s, rank %d: clmla_layer_get_config gives %d heads, rank %d of %d", what, r, got.num_heads,
                          got.tp_rank, got.tp_size);
                    clmla_layer_memory m;
                    clmla_layer_get_memory(layer, &m);
                    /* o_proj's bias ([D] floats) is rank 0's alone */
                    if (r == 0)
                        biases0 = m.biases;
                    else if (k->biases)
                        CHECK(m.biases + (size_t)D * sizeof(float) == biases0,
                              "%s, rank %d: %zu bytes of biases, rank 0 %zu (o_proj's belongs to rank 0 only)", what, r,
                              m.biases, biases0);
                    /* fp8 kept where every shard's boundaries lie on the scale grid, else float32 */
                    if (k->dtype == CLMLA_DTYPE_FP8_E4M3) {
                        const int64_t hs = k->H / tp;
                        check_held(what, "kv_b_proj", m.kv_b_proj, hs * (k->dn + k->dv) * k->rkv,
                                   block_on_grid(&cw.config, P_KV_B, tp));
                        check_held(what, "o_proj", m.o_proj, (int64_t)D * hs * k->dv,
                                   block_on_grid(&cw.config, P_O, tp));
                        if (k->rq)
                            check_held(what, "q_b_proj", m.q_b_proj, hs * (k->dn + k->dr) * k->rq,
                                       block_on_grid(&cw.config, P_Q_B, tp));
                    }
                }
                clmla_layer_destroy(layer);
                layer = NULL;
            }
            if (!ok)
                break;
            compare_sums(what, sum, whole, ref, n, D);
            /* whole fp8 tensors off the grid are held in float32 with a warning; pre-sliced ones came
               as float32 already */
            const int want_warning = off_grid && !sliced;
            CHECK((grid_warnings > grid_before) == want_warning, "%s: %d warnings about the scale grid, expected %s",
                  what, grid_warnings - grid_before, want_warning ? "some" : "none");
            printf("  %-52s ok (%d grid warnings)\n", what, grid_warnings - grid_before);
        }
    }
    outputs_free(whole, out, ref, sum);
    free(x);
    case_weights_free(&cw);
}

static void part_case0(void) { run_case(&cases[0]); }
static void part_case1(void) { run_case(&cases[1]); }
static void part_case2(void) { run_case(&cases[2]); }
static void part_case3(void) { run_case(&cases[3]); }
static void part_case4(void) { run_case(&cases[4]); }
static void part_case5(void) { run_case(&cases[5]); }

/* ---- refusals ------------------------------------------------------------------------------------- */

/* clmla_layer_create must fail with `want`, a message containing both needles (the second may be
   NULL), *layer NULL and nothing created on the device. */
static void expect_refused(const char *what, const clmla_layer_config *c, const clmla_layer_weights *w,
                           clmla_status want, const char *needle, const char *needle2)
{
    const clmla_cl_counts before = clmla_cl_counts_get(ctx);
    clmla_layer *layer = (clmla_layer *)&layer; /* not NULL: the call must clear it */
    const clmla_status st = clmla_layer_create(ctx, c, w, &layer);
    const char *msg = clmla_last_error(ctx);
    CHECK(st == want, "%s: %s, expected %s: %s", what, clmla_status_string(st), clmla_status_string(want), msg);
    CHECK(layer == NULL, "%s: *layer not NULL after a failure", what);
    CHECK(strstr(msg, needle) && (!needle2 || strstr(msg, needle2)), "%s: message lacks \"%s\"%s%s: %s", what, needle,
          needle2 ? " or " : "", needle2 ? needle2 : "", msg);
    const clmla_cl_counts after = clmla_cl_counts_get(ctx);
    CHECK(after.buffers == before.buffers && after.kernels == before.kernels && after.programs == before.programs,
          "%s: the failed call created %ld buffers, %ld kernels, %ld programs", what, after.buffers - before.buffers,
          after.kernels - before.kernels, after.programs - before.programs);
    if (st == CLMLA_SUCCESS && layer)
        clmla_layer_destroy(layer);
}

static void part_errors(void)
{
    const case_def k = {"errors", 37, 6, 20, 40, 13, 8, 11, CLMLA_DTYPE_F32, 1, {2, 0}};
    case_weights cw;
    if (case_weights_make(&cw, &k, 99) != 0) {
        CHECK(0, "out of memory");
        return;
    }
    clmla_layer_config c = cw.config;

    /* tp_size must divide the heads; the message names both numbers */
    c.tp_size = 4;
    CHECK_STATUS(clmla_layer_config_validate(&c), CLMLA_ERROR_INVALID_CONFIG, NULL);
    CHECK(strstr(clmla_last_error(NULL), "tp_size 4") && strstr(clmla_last_error(NULL), "num_heads 6"),
          "validate: %s", clmla_last_error(NULL));
    expect_refused("tp_size 4 of 6 heads", &c, &cw.layer, CLMLA_ERROR_INVALID_CONFIG, "tp_size 4", "num_heads 6");
    c.tp_size = 5;
    expect_refused("tp_size 5 of 6 heads", &c, &cw.layer, CLMLA_ERROR_INVALID_CONFIG, "tp_size 5", "num_heads 6");
    /* tp_rank in [0, tp_size) */
    const int bad[][2] = {{3, 3}, {-1, 2}, {1, 0}, {1, 1}, {0, -2}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char what[64];
        c.tp_rank = bad[i][0];
        c.tp_size = bad[i][1];
        snprintf(what, sizeof(what), "tp_rank %d, tp_size %d", bad[i][0], bad[i][1]);
        CHECK_STATUS(clmla_layer_config_validate(&c), CLMLA_ERROR_INVALID_CONFIG, NULL);
        char needle[32];
        snprintf(needle, sizeof(needle), bad[i][1] < 0 ? "tp_size %d" : "tp_rank %d", bad[i][bad[i][1] < 0 ? 1 : 0]);
        expect_refused(what, &c, &cw.layer, CLMLA_ERROR_INVALID_CONFIG, needle, NULL);
    }
    /* accepted: tp_size 0 and 1 are the whole layer, and every divisor */
    const int good[][2] = {{0, 0}, {0, 1}, {1, 2}, {2, 3}, {5, 6}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        c.tp_rank = good[i][0];
        c.tp_size = good[i][1];
        CHECK_STATUS(clmla_layer_config_validate(&c), CLMLA_SUCCESS, NULL);
    }

    /* a tensor of neither the whole nor the shard's shape names itself; rank 1 of 2 (3 heads) */
    c.tp_rank = 1;
    c.tp_size = 2;
    const int64_t hs = 3, dq = k.dn + k.dr;
    clmla_layer_weights w = cw.layer;
    w.kv_b_proj.shape[0] = hs * (k.dn + k.dv) - 1; /* views smaller than the data: nothing is read past it */
    expect_refused("kv_b_proj of 3 heads less a row", &c, &w, CLMLA_ERROR_SHAPE_MISMATCH, "kv_b_proj", "[72, 40]");
    w = cw.layer;
    w.o_proj.shape[1] = hs * k.dv + 1;
    expect_refused("o_proj of 3 heads and a column", &c, &w, CLMLA_ERROR_SHAPE_MISMATCH, "o_proj", "[37, 33]");
    w = cw.layer;
    w.q_b_proj.shape[0] = hs * dq;
    w.q_b_proj.shape[1] = k.rq - 1;
    expect_refused("q_b_proj with a column short", &c, &w, CLMLA_ERROR_SHAPE_MISMATCH, "q_b_proj", NULL);
    w = cw.layer;
    w.o_proj.data = NULL;
    expect_refused("no o_proj", &c, &w, CLMLA_ERROR_MISSING_TENSOR, "o_proj", NULL);
    /* the replicated tensors stay whole in a shard */
    w = cw.layer;
    w.kv_a_proj_with_mqa.shape[0] = (k.rkv + k.dr) / 2;
    expect_refused("half of kv_a_proj_with_mqa", &c, &w, CLMLA_ERROR_SHAPE_MISMATCH, "kv_a_proj_with_mqa", NULL);

    /* accepted: the configuration as given comes back; the shard's memory is its share */
    clmla_layer *whole = NULL, *shard = NULL;
    clmla_layer_config wc = cw.config;
    CHECK_STATUS(clmla_layer_create(ctx, &wc, &cw.layer, &whole), CLMLA_SUCCESS, ctx);
    CHECK_STATUS(clmla_layer_create(ctx, &c, &cw.layer, &shard), CLMLA_SUCCESS, ctx);
    if (whole && shard) {
        clmla_layer_config got;
        CHECK_STATUS(clmla_layer_get_config(shard, &got), CLMLA_SUCCESS, ctx);
        CHECK(got.num_heads == 6 && got.tp_rank == 1 && got.tp_size == 2, "get_config: %d heads, rank %d of %d",
              got.num_heads, got.tp_rank, got.tp_size);
        clmla_layer_memory mw, ms;
        clmla_layer_get_memory(whole, &mw);
        clmla_layer_get_memory(shard, &ms);
        CHECK(ms.kv_b_proj * 2 == mw.kv_b_proj, "kv_b_proj: shard %zu bytes, whole %zu", ms.kv_b_proj, mw.kv_b_proj);
        CHECK(ms.q_b_proj < mw.q_b_proj && ms.o_proj < mw.o_proj && ms.q_a_proj == mw.q_a_proj &&
                  ms.kv_a_proj_with_mqa == mw.kv_a_proj_with_mqa && ms.norms == mw.norms,
              "shard memory: q_b %zu / %zu, o %zu / %zu, q_a %zu / %zu", ms.q_b_proj, mw.q_b_proj, ms.o_proj, mw.o_proj,
              ms.q_a_proj, mw.q_a_proj);
        CHECK(ms.biases + (size_t)k.D * 4 == mw.biases, "rank 1 keeps no o_proj bias: %zu bytes, whole %zu", ms.biases,
              mw.biases);
        CHECK(ms.total < mw.total, "shard total %zu, whole %zu", ms.total, mw.total);
    }
    clmla_layer_destroy(whole);
    clmla_layer_destroy(shard);
    case_weights_free(&cw);
}

/* ---- model folders ---------------------------------------------------------------------------------- */

/* Writes a model, loads it whole and as `tp` shards, and compares the shards' sum with the whole layer
   and the reference. want_fp8: -1 any, else whether the shards' kv_b_proj must stay fp8. */
static void model_case(const char *what, const clmla_layer_config *config, const char *dtype, int shards, int tp,
                       int want_fp8)
{
    clmla_context *c = logged_context();
    char dir[512];
    if (!c || ckpt_make_temp_dir(dir, sizeof(dir), "tp") != 0) {
        CHECK(0, "%s: no context or temporary folder", what);
        return;
    }
    ckpt_model m = {.config = *config, .dtype = dtype, .shards = shards, .seed = 11};
    ckpt_weights lw;
    memset(&lw, 0, sizeof(lw));
    if (ckpt_write_model(dir, &m, &lw) != 0) {
        CHECK(0, "%s: writing the model failed", what);
        ckpt_remove_dir(dir);
        return;
    }
    const int D = config->hidden_size;
    const size_t n = (size_t)T * (size_t)D;
    float *x = tu_random_inputs(T, D, 77);
    float *whole[2], *out[2], *sum[2];
    double *ref[2];
    int ok = outputs_make(n, whole, out, ref, sum) && x;
    CHECK(ok, "%s: out of memory", what);
    const mla_ref_config rc = ckpt_ref_config(config);
    const mla_ref_weights rw = ckpt_ref_weights(&lw);
    for (int p = 0; ok && p < 2; p++)
        ok = mla_ref_forward(&rc, &rw, T, x, p == 0 ? MLA_REF_ABSORBED : MLA_REF_DECOMPRESSED, ref[p], NULL, NULL, NULL,
                             NULL, NULL, NULL) == 0;
    clmla_model_options o;
    memset(&o, 0, sizeof(o));
    clmla_layer *layer = NULL;
    if (ok) {
        const clmla_status st = clmla_layer_create_from_model_opts(c, dir, &o, &layer);
        CHECK_STATUS(st, CLMLA_SUCCESS, c);
        ok = st == CLMLA_SUCCESS && run_both(c, layer, x, n, whole, NULL) == 0;
        clmla_layer_destroy(layer);
        layer = NULL;
    }
    const int grid_before = grid_warnings;
    for (int r = 0; ok && r < tp; r++) {
        o.tp_rank = r;
        o.tp_size = tp;
        const clmla_status st = clmla_layer_create_from_model_opts(c, dir, &o, &layer);
        CHECK_STATUS(st, CLMLA_SUCCESS, c);
        ok = st == CLMLA_SUCCESS && run_both(c, layer, x, n, out, sum) == 0;
        if (ok && want_fp8 >= 0) {
            clmla_layer_memory mem;
            clmla_layer_get_memory(layer, &mem);
            const int64_t hs = config->num_heads / tp;
            check_held(what, "kv_b_proj", mem.kv_b_proj,
                       hs * (config->qk_nope_head_dim + config->v_head_dim) * config->kv_lora_rank, want_fp8);
        }
        clmla_layer_destroy(layer);
        layer = NULL;
    }
    if (ok) {
        compare_sums(what, sum, whole, ref, n, D);
        if (want_fp8 >= 0)
            CHECK((grid_warnings > grid_before) == !want_fp8, "%s: %d warnings about the scale grid", what,
                  grid_warnings - grid_before);
        printf("  %-52s ok (%d grid warnings)\n", what, grid_warnings - grid_before);
    }
    /* tp_size must divide the heads: refused before anything is read */
    o.tp_rank = 0;
    o.tp_size = config->num_heads + 1;
    clmla_layer *bad = NULL;
    CHECK_STATUS(clmla_layer_create_from_model_opts(c, dir, &o, &bad), CLMLA_ERROR_INVALID_CONFIG, c);
    char needle[64];
    snprintf(needle, sizeof(needle), "tp_size %d does not divide num_heads %d", config->num_heads + 1,
             config->num_heads);
    CHECK(bad == NULL && strstr(clmla_last_error(c), needle), "%s: %s", what, clmla_last_error(c));
    outputs_free(whole, out, ref, sum);
    free(x);
    tu_weights_free(&lw);
    ckpt_remove_dir(dir);
}

static void part_model(void)
{
    clmla_layer_config c = ckpt_tiny_config(1, 1);
    c.num_heads = 4;
    model_case("model f32, lora, yarn, 2 files, 2 shards", &c, "F32", 2, 2, -1);
    model_case("model f32, lora, yarn, 2 files, 4 shards", &c, "F32", 2, 4, -1);
    clmla_layer_config q = ckpt_tiny_config(0, 0);
    model_case("model bf16, q_proj, 2 shards", &q, "BF16", 0, 2, -1);
    model_case("model fp8 off the grid, 2 shards", &q, "F8_E4M3", 0, 2, 0);
    clmla_layer_config g = ckpt_tiny_config(1, 0);
    g.num_heads = 4;
    g.qk_nope_head_dim = g.qk_rope_head_dim = g.v_head_dim = 64;
    model_case("model fp8 on the grid, 2 shards", &g, "F8_E4M3", 0, 2, 1);
}

/* ---- clmla run --tp-rank --tp-size ---------------------------------------------------------------- */

static int run_cli(const char *args, const char *log)
{
    return ckpt_run_cli(CLMLA_CLI_PATH, args, log);
}

static const char *read_text(const char *path)
{
    return ckpt_read_text(path);
}

static void part_cli(void)
{
    char dir[512], model[700], x_path[700], y_path[700], log[700], args[3000];
    if (ckpt_make_temp_dir(dir, sizeof(dir), "tp-cli") != 0) {
        CHECK(0, "no temporary folder");
        return;
    }
    clmla_layer_config c = ckpt_tiny_config(1, 0);
    c.num_heads = 4;
    ckpt_model m;
    memset(&m, 0, sizeof(m));
    m.config = c;
    m.dtype = "F32";
    m.seed = 5;
    ckpt_path(model, sizeof(model), dir, "model");
    ckpt_path(x_path, sizeof(x_path), dir, "x.npy");
    ckpt_path(log, sizeof(log), dir, "log.txt");
    const int D = c.hidden_size;
    const size_t n = (size_t)T * (size_t)D;
    float *x = tu_random_inputs(T, D, 3);
    float *sum = calloc(n, sizeof(float));
    const int64_t shape[2] = {T, D};
    ckpt_weights lw;
    memset(&lw, 0, sizeof(lw));
    int ok = x && sum && ckpt_write_model(model, &m, &lw) == 0 &&
             clmla_npy_write_f32(x_path, x, 2, shape) == CLMLA_SUCCESS;
    CHECK(ok, "writing the model or X.npy failed");
    float *y_whole = NULL;
    for (int r = -1; ok && r < 2; r++) { /* -1: the whole layer */
        char extra[64] = "";
        if (r >= 0)
            snprintf(extra, sizeof(extra), "--tp-rank %d --tp-size 2", r);
        snprintf(y_path, sizeof(y_path), "%s/y%d.npy", dir, r + 1);
        snprintf(args, sizeof(args), "--model '%s' --input '%s' --output '%s' --prefill 5 --path absorbed %s", model,
                 x_path, y_path, extra);
        const int rc = run_cli(args, log);
        CHECK(rc == 0, "clmla run %s exited with %d:\n%s", extra, rc, read_text(log));
        if (r >= 0)
            CHECK(strstr(read_text(log), "tensor-parallel shard"), "clmla run %s: %s", extra, read_text(log));
        float *y = NULL;
        int64_t ys[2] = {0, 0};
        int ndim = 0;
        ok = rc == 0 && clmla_npy_read_f32(y_path, &y, ys, &ndim) == CLMLA_SUCCESS && ndim == 2 && ys[0] == T &&
             ys[1] == D;
        CHECK(ok, "Y.npy of %s: %s", extra, clmla_last_error(NULL));
        for (size_t i = 0; ok && r >= 0 && i < n; i++)
            sum[i] += y[i];
        if (r < 0)
            y_whole = y;
        else
            clmla_free(y);
    }
    if (ok) {
        double *w = tu_to_double(y_whole, n);
        if (w)
            CHECK_CLOSE(sum, w, n, D, TOL_AGREE_F32, "clmla run: rank 0 + rank 1 of 2 against the whole layer");
        free(w);
        printf("  clmla run --tp-rank 0/1 --tp-size 2: summed outputs ok\n");
    }
    clmla_free(y_whole);
    /* refusals: a tp_size that does not divide the heads (the library's message), a rank out of range */
    snprintf(args, sizeof(args), "--model '%s' --input '%s' --output '%s/y.npy' --tp-size 3", model, x_path, dir);
    int rc = run_cli(args, log);
    CHECK(rc == 1 && strstr(read_text(log), "tp_size 3 does not divide num_heads 4"), "--tp-size 3: exit %d:\n%s", rc,
          read_text(log));
    snprintf(args, sizeof(args), "--model '%s' --input '%s' --output '%s/y.npy' --tp-rank 2 --tp-size 2", model, x_path,
             dir);
    rc = run_cli(args, log);
    CHECK(rc == 2 && strstr(read_text(log), "--tp-rank"), "--tp-rank 2 --tp-size 2: exit %d:\n%s", rc, read_text(log));
    tu_weights_free(&lw);
    free(x);
    free(sum);
    ckpt_remove_dir(dir);
}

int main(int argc, char **argv)
{
    static const tu_part parts[] = {
        {"f32-q-proj-bias", part_case0}, {"bf16-lora-bias", part_case1}, {"f32-lora-4-heads", part_case2},
        {"fp8-off-grid", part_case3},    {"fp8-grid-lora-bias", part_case4}, {"fp8-grid-q-proj", part_case5},
        {"errors", part_errors},         {"model", part_model},          {"cli", part_cli},
    };
    _Static_assert(NUM_CASES == 6, "one part per case");
    const tu_parts_result ran =
        tu_run_parts(argc, argv, parts, (int)(sizeof(parts) / sizeof(parts[0])), NULL, &ctx, &check_failed);
    clmla_context_destroy(logged);
    return tu_parts_exit(ran);
}
