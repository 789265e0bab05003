/* Model folders: config.json parsing, safetensors (single and sharded, F32/F16/BF16/F8_E4M3 with
   block scales), the layer they make checked against the float64 reference on the weights as the
   checkpoint holds them, weights kept in their stored dtype (device memory, and the same output as
   a float32 layer of the dequantised values), .npy files, and a message that names the file and
   the problem for every kind of bad input. */
#include "check.h"
#include "checkpoint_writer.h"
#include "clmla.h"
#include "config.h"
#include "dtype.h"
#include "mla_ref.h"
#include "npy.h"
#include "safetensors.h"
#include "tolerance.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static clmla_context *ctx;
static char root[512];

#define CHECK_CONTAINS(text, needle) CHECK(strstr((text), (needle)) != NULL, "message \"%s\" lacks \"%s\"", (text), (needle))

static const char *subdir(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", root, name);
    return buf;
}

/* ---- good models ------------------------------------------------------------------------------ */

/* Runs T tokens through the layer into out [T, D]: a prefill of `prefill` tokens then single-token
   decode, on one path, in a cache of its own. */
static clmla_status run_steps(clmla_layer *layer, const clmla_layer_config *c, clmla_attention_path path, int T,
                              int prefill, const float *x, float *out)
{
    clmla_cache_config cc = {1, c->kv_lora_rank, c->qk_rope_head_dim, 4, (T + 3) / 4, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    int32_t seq = -1;
    clmla_status st = clmla_cache_create(ctx, &cc, &cache);
    if (st == CLMLA_SUCCESS)
        st = clmla_cache_seq_add(cache, &seq);
    if (st == CLMLA_SUCCESS) {
        clmla_batch_entry entry = {seq, prefill};
        clmla_forward_args args = {&entry, 1, 0, path};
        st = clmla_layer_forward(layer, cache, &args, x, out);
        for (int t = prefill; st == CLMLA_SUCCESS && t < T; t++) {
            entry.num_tokens = 1;
            st = clmla_layer_forward(layer, cache, &args, x + (size_t)t * c->hidden_size, out + (size_t)t * c->hidden_size);
        }
    }
    CHECK_STATUS(st, CLMLA_SUCCESS, ctx);
    clmla_cache_destroy(cache);
    return st;
}

/* The same, returning the worst relative error against ref. */
static double run_against(clmla_layer *layer, const clmla_layer_config *c, clmla_attention_path path, int T,
                          int prefill, const float *x, const double *ref)
{
    float *out = malloc((size_t)T * c->hidden_size * sizeof(float));
    double err = INFINITY;
    if (out && run_steps(layer, c, path, T, prefill, x, out) == CLMLA_SUCCESS)
        err = mla_ref_max_rel_err(out, ref, (size_t)T * c->hidden_size, NULL);
    free(out);
    return err;
}

/* Loads layer `layer` of dir and checks the configuration it reports and its output on both paths
   against the reference computed from the dequantised weights w. */
static void check_loaded(const char *what, const char *dir, int layer, const clmla_layer_config *c, const ckpt_weights *w)
{
    clmla_layer *L = NULL;
    clmla_status st = clmla_layer_create_from_model(ctx, dir, layer, &L);
    CHECK(st == CLMLA_SUCCESS, "%s: load: %s", what, clmla_last_error(ctx));
    if (st != CLMLA_SUCCESS)
        return;
    clmla_layer_config got;
    clmla_layer_get_config(L, &got);
    CHECK(got.hidden_size == c->hidden_size && got.q_lora_rank == c->q_lora_rank && got.kv_lora_rank == c->kv_lora_rank &&
              got.rope_pairing == c->rope_pairing && got.yarn_factor == c->yarn_factor &&
              got.yarn_mscale_all_dim == c->yarn_mscale_all_dim,
          "%s: the loaded configuration differs from the written one", what);

    const int T = 7;
    const mla_ref_config rc = ckpt_ref_config(c);
    const mla_ref_weights rw = ckpt_ref_weights(w);
    float *x = malloc((size_t)T * c->hidden_size * sizeof(float));
    double *ref = malloc((size_t)T * c->hidden_size * sizeof(double));
    uint64_t rng = 99;
    if (x && ref) {
        ckpt_fill_random(x, (size_t)T * c->hidden_size, 1.0f, 0, &rng);
        CHECK(mla_ref_forward(&rc, &rw, T, x, MLA_REF_ABSORBED, ref, NULL, NULL, NULL, NULL, NULL, NULL) == 0,
              "%s: reference failed", what);
        const double absorbed = run_against(L, c, CLMLA_PATH_ABSORBED, T, 4, x, ref);
        const double decompressed = run_against(L, c, CLMLA_PATH_DECOMPRESSED, T, 5, x, ref);
        CHECK(absorbed <= TOL_F32_CACHE, "%s: absorbed path error %.3g against the reference", what, absorbed);
        CHECK(decompressed <= TOL_F32_CACHE, "%s: decompressed path error %.3g against the reference", what, decompressed);
        printf("  %-44s absorbed %.2e, decompressed %.2e\n", what, absorbed, decompressed);
    }
    free(x);
    free(ref);
    clmla_layer_destroy(L);
}

static void test_good_models(void)
{
    static const struct {
        const char *name;
        const char *dtype;
        int shards, q_lora, yarn, layers, layer, half_split, extras;
    } cases[] = {
        {"f32 single, q_proj, plain RoPE", "F32", 0, 0, 0, 1, 0, 0, 0},
        {"f32 single, q_lora, yarn, extras", "F32", 0, 1, 1, 1, 0, 0, 1},
        {"f16 single, q_proj, yarn", "F16", 0, 0, 1, 1, 0, 0, 0},
        {"bf16 sharded x3, q_proj, yarn (V2-Lite-like)", "BF16", 3, 0, 1, 1, 0, 0, 1},
        {"bf16 single, q_lora, layer 1 of 2", "BF16", 0, 1, 1, 2, 1, 0, 0},
        {"f8_e4m3 single, q_lora, yarn (V3-like)", "F8_E4M3", 0, 1, 1, 1, 0, 0, 0},
        {"f8_e4m3 sharded x4, q_lora, layer 2 of 3", "F8_E4M3", 4, 1, 1, 3, 2, 0, 1},
        {"f8_e4m3 sharded x2, q_proj, plain RoPE", "F8_E4M3", 2, 0, 0, 1, 0, 0, 0},
        {"f16 sharded x2, half-split pairs", "F16", 2, 1, 0, 1, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char dir[600], name[32];
        snprintf(name, sizeof(name), "good%zu", i);
        subdir(dir, sizeof(dir), name);
        ckpt_model m;
        memset(&m, 0, sizeof(m));
        m.config = ckpt_tiny_config(cases[i].q_lora, cases[i].yarn);
        if (cases[i].half_split) {
            m.config.rope_pairing = CLMLA_ROPE_HALF_SPLIT;
            m.write_interleave = 1;
        }
        m.num_layers = cases[i].layers;
        m.dtype = cases[i].dtype;
        m.shards = cases[i].shards;
        m.extras = cases[i].extras;
        m.rope_type_key = (int)(i % 2);
        m.seed = (unsigned)i + 1;
        ckpt_weights w[3];
        memset(w, 0, sizeof(w));
        if (ckpt_write_model(dir, &m, w) != 0) {
            CHECK(0, "%s: could not write the model", cases[i].name);
            continue;
        }
        check_loaded(cases[i].name, dir, cases[i].layer, &m.config, &w[cases[i].layer]);
        for (int l = 0; l < cases[i].layers; l++)
            tu_weights_free(&w[l]);
    }
}

/* ---- weights kept as stored ------------------------------------------------------------------- */

/* Element i of a checkpoint tensor from the format's definitions, not the library's decoders:
   little-endian F32, F16 and F8_E4M3 codes through the reference's decoders, BF16 as bits << 16. */
static float stored_element(const clmla_st_file *f, const clmla_st_tensor *t, uint64_t i)
{
    const uint8_t *p = f->data + t->begin;
    uint32_t bits;
    float v;
    if (strcmp(t->dtype_name, "F32") == 0) {
        const uint8_t *q = p + 4 * i;
        bits = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    } else if (strcmp(t->dtype_name, "BF16") == 0) {
        bits = ((uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8) << 16;
    } else if (strcmp(t->dtype_name, "F16") == 0) {
        return (float)mla_ref_decode_f16((unsigned)(p[2 * i] | p[2 * i + 1] << 8));
    } else if (strcmp(t->dtype_name, "F8_E4M3") == 0) {
        return (float)mla_ref_decode_e4m3(p[i]);
    } else {
        return NAN;
    }
    memcpy(&v, &bits, sizeof(v));
    return v;
}

/* The float32 values of tensor `name` of a single-file checkpoint: W[i, j] = e4m3(q[i, j]) * S[i/128, j/128]
   (a float32 product) for F8_E4M3, the element itself otherwise. NULL when absent. */
static float *dequantised(const clmla_st_file *f, const char *name)
{
    const clmla_st_tensor *t = clmla_st_find(f, name);
    if (!t)
        return NULL;
    char scale_name[300];
    snprintf(scale_name, sizeof(scale_name), "%s_scale_inv", name);
    const clmla_st_tensor *s = clmla_st_find(f, scale_name);
    const uint64_t n = clmla_st_numel(t);
    const int64_t cols = t->ndim == 2 ? t->shape[1] : 1, blocks_per_row = (cols + 127) / 128;
    float *w = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (uint64_t e = 0; w && e < n; e++) {
        w[e] = stored_element(f, t, e);
        if (strcmp(t->dtype_name, "F8_E4M3") == 0) {
            const int64_t i = (int64_t)e / cols, j = (int64_t)e % cols;
            w[e] = s ? w[e] * stored_element(f, s, (uint64_t)((i / 128) * blocks_per_row + j / 128)) : NAN;
        }
    }
    return w;
}

/* Device bytes of a [rows, cols] weight kept as stored: the elements, and for F8_E4M3 4 bytes per
   128 x 128 block scale. */
static size_t stored_bytes(const char *dtype, int64_t rows, int64_t cols)
{
    const size_t n = (size_t)(rows * cols);
    if (strcmp(dtype, "F8_E4M3") == 0)
        return n + 4 * clmla_fp8_blocks((size_t)rows) * clmla_fp8_blocks((size_t)cols);
    return n * (strcmp(dtype, "F32") == 0 ? 4 : 2);
}

/* A layer's buffer for one weight: at least the bytes stored, at most 1% more (panel packing). */
static void check_bytes(const char *what, const char *weight, size_t got, size_t want)
{
    CHECK(got >= want && (double)got <= 1.01 * (double)want, "%s: %s holds %zu bytes on the device, the checkpoint %zu",
          what, weight, got, want);
}

/* Every dimension odd where the configuration allows (dr must be even), several past one 128-wide
   scale block and none a multiple of one. */
static clmla_layer_config odd_config(int q_lora)
{
    clmla_layer_config c = ckpt_tiny_config(q_lora, 1);
    c.hidden_size = 163;
    c.num_heads = 3;
    c.q_lora_rank = q_lora ? 137 : 0;
    c.kv_lora_rank = 131;
    c.qk_nope_head_dim = 13;
    c.qk_rope_head_dim = 6;
    c.v_head_dim = 11;
    return c;
}

/* Runs both layers over the same tokens on both paths; the worst relative difference from b. */
static double compare_layers(clmla_layer *a, clmla_layer *b, const clmla_layer_config *c)
{
    enum { T = 6 };
    const size_t n = (size_t)T * c->hidden_size;
    float *x = malloc(n * sizeof(float)), *ya = malloc(n * sizeof(float)), *yb = malloc(n * sizeof(float));
    double *yb64 = malloc(n * sizeof(double));
    double worst = INFINITY;
    uint64_t rng = 2024;
    if (x && ya && yb && yb64) {
        ckpt_fill_random(x, n, 1.0f, 0, &rng);
        worst = 0;
        const clmla_attention_path paths[2] = {CLMLA_PATH_ABSORBED, CLMLA_PATH_DECOMPRESSED};
        for (int p = 0; p < 2; p++) {
            if (run_steps(a, c, paths[p], T, 4, x, ya) != CLMLA_SUCCESS ||
                run_steps(b, c, paths[p], T, 4, x, yb) != CLMLA_SUCCESS) {
                worst = INFINITY;
                break;
            }
            for (size_t i = 0; i < n; i++)
                yb64[i] = yb[i];
            worst = fmax(worst, mla_ref_max_rel_err(ya, yb64, n, NULL));
        }
    }
    free(x);
    free(ya);
    free(yb);
    free(yb64);
    return worst;
}

/* A model folder's 2-D weights reach the layer in their stored dtype: the device holds the stored
   bytes of kv_b_proj and o_proj (FP8: codes and float32 block scales), and the output is that of a
   float32 layer made from the dequantised values, on odd shapes; with weights_dtype the loader
   converts instead. */
static void test_stored_dtypes(void)
{
    static const struct {
        const char *name, *dtype, *scale_dtype;
        int q_lora;
    } cases[] = {
        {"bf16, q_lora", "BF16", NULL, 1},
        {"f16, q_proj", "F16", NULL, 0},
        {"f8_e4m3, F32 scales, q_lora", "F8_E4M3", "F32", 1},
        {"f8_e4m3, BF16 scales, q_proj", "F8_E4M3", "BF16", 0},
    };
    static const char *const names[] = {"q_a_proj", "q_a_layernorm", "q_b_proj", "q_proj",
                                        "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"};
    enum { NW = sizeof(names) / sizeof(names[0]) };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const char *what = cases[k].name;
        char dir[600], sub[32], path[1200];
        snprintf(sub, sizeof(sub), "stored%zu", k);
        subdir(dir, sizeof(dir), sub);
        ckpt_model m = {.config = odd_config(cases[k].q_lora), .dtype = cases[k].dtype,
                        .scale_dtype = cases[k].scale_dtype, .seed = 40 + (unsigned)k};
        ckpt_weights w;
        memset(&w, 0, sizeof(w));
        if (ckpt_write_model(dir, &m, &w) != 0) {
            CHECK(0, "%s: could not write the model", what);
            continue;
        }
        const clmla_layer_config *c = &m.config;
        const int64_t D = c->hidden_size, H = c->num_heads, rkv = c->kv_lora_rank;
        const int64_t dn = c->qk_nope_head_dim, dv = c->v_head_dim;

        /* The float32 layer of the dequantised values, computed here from the file. */
        clmla_st_file f;
        char err[1024] = "";
        float *values[NW] = {NULL};
        clmla_layer *F = NULL, *L = NULL;
        clmla_layer_config fc;
        ckpt_path(path, sizeof(path), dir, "model.safetensors");
        if (clmla_st_open(path, &f, err, sizeof(err)) == CLMLA_SUCCESS) {
            for (int i = 0; i < NW; i++) {
                char name[200];
                snprintf(name, sizeof(name), "model.layers.0.self_attn.%s.weight", names[i]);
                values[i] = dequantised(&f, name);
            }
            clmla_st_close(&f);
        } else {
            CHECK(0, "%s: %s", what, err);
        }
        /* The writer's own view of the same values: the two dequantisations agree bit for bit. */
        const float *written[NW] = {w.q_a_proj, w.q_a_layernorm, w.q_b_proj, w.q_proj,
                                    w.kv_a_proj_with_mqa, w.kv_a_layernorm, w.kv_b_proj, w.o_proj};
        const int64_t rq = c->q_lora_rank, dr = c->qk_rope_head_dim, dq = dn + dr;
        const int64_t sizes[NW] = {rq * D,         rq,  H * dq * rq,          H * dq * D,
                                   (rkv + dr) * D, rkv, H * (dn + dv) * rkv, D * H * dv};
        for (int i = 0; i < NW; i++)
            CHECK(!written[i] == !values[i] &&
                      (!written[i] || memcmp(written[i], values[i], (size_t)sizes[i] * sizeof(float)) == 0),
                  "%s: %s dequantised here differs from the writer's values", what, names[i]);

        CHECK_STATUS(clmla_model_read_config(dir, &fc, NULL), CLMLA_SUCCESS, NULL);
        fc.weights_dtype = CLMLA_WEIGHTS_AS_GIVEN;
        clmla_layer_weights fw;
        memset(&fw, 0, sizeof(fw));
        if (rq) {
            fw.q_a_proj = clmla_tensor_2d(values[0], rq, D);
            fw.q_a_layernorm = clmla_tensor_1d(values[1], rq);
            fw.q_b_proj = clmla_tensor_2d(values[2], H * dq, rq);
        } else {
            fw.q_proj = clmla_tensor_2d(values[3], H * dq, D);
        }
        fw.kv_a_proj_with_mqa = clmla_tensor_2d(values[4], rkv + dr, D);
        fw.kv_a_layernorm = clmla_tensor_1d(values[5], rkv);
        fw.kv_b_proj = clmla_tensor_2d(values[6], H * (dn + dv), rkv);
        fw.o_proj = clmla_tensor_2d(values[7], D, H * dv);
        CHECK_STATUS(clmla_layer_create(ctx, &fc, &fw, &F), CLMLA_SUCCESS, ctx);

        /* The model folder, as stored. */
        clmla_status st = clmla_layer_create_from_model(ctx, dir, 0, &L);
        CHECK(st == CLMLA_SUCCESS, "%s: load: %s", what, clmla_last_error(ctx));
        clmla_layer_memory mem;
        if (L && clmla_layer_get_memory(L, &mem) == CLMLA_SUCCESS) {
            check_bytes(what, "kv_b_proj", mem.kv_b_proj, stored_bytes(m.dtype, H * (dn + dv), rkv));
            check_bytes(what, "o_proj", mem.o_proj, stored_bytes(m.dtype, D, H * dv));
        }
        if (L && F) {
            const double diff = compare_layers(L, F, c);
            CHECK(diff <= TOL_AGREE_F32, "%s: output differs from the float32 layer of the same values by %.3g", what,
                  diff);
            printf("  stored %-36s against float32: %.2e\n", what, diff);
        }
        clmla_layer_destroy(L);
        L = NULL;

        /* Converted at load: F32 for the 16-bit case, whose values float32 holds exactly. */
        if (strcmp(m.dtype, "BF16") == 0) {
            clmla_model_options o;
            memset(&o, 0, sizeof(o));
            o.weights_dtype = CLMLA_WEIGHTS_F32;
            st = clmla_layer_create_from_model_opts(ctx, dir, &o, &L);
            CHECK(st == CLMLA_SUCCESS, "%s as f32: load: %s", what, clmla_last_error(ctx));
            if (L && clmla_layer_get_memory(L, &mem) == CLMLA_SUCCESS) {
                check_bytes("converted to f32", "kv_b_proj", mem.kv_b_proj, stored_bytes("F32", H * (dn + dv), rkv));
                check_bytes("converted to f32", "o_proj", mem.o_proj, stored_bytes("F32", D, H * dv));
            }
            if (L && F) {
                const double diff = compare_layers(L, F, c);
                CHECK(diff <= TOL_AGREE_F32, "%s as f32: output differs from the float32 layer by %.3g", what, diff);
            }
            clmla_layer_destroy(L);
        }
        clmla_layer_destroy(F);
        for (int i = 0; i < NW; i++)
            free(values[i]);
        tu_weights_free(&w);
    }
}

/* The decoders the loader uses (dtype.h) against the test's own, and the F8 dequantisation itself,
   bit for bit: a weight that is exactly representable in every 128x128 block comes back exact;
   the same tensor copied out as stored (codes, and its scales as float32). */
static void test_conversions(void)
{
    CHECK(clmla_e4m3_to_float(0x00) == 0.0f && !signbit(clmla_e4m3_to_float(0x00)), "fp8 +0");
    CHECK(clmla_e4m3_to_float(0x80) == 0.0f && signbit(clmla_e4m3_to_float(0x80)), "fp8 -0");
    CHECK(clmla_e4m3_to_float(0x01) == ldexpf(1, -9), "fp8 smallest subnormal: %g", clmla_e4m3_to_float(0x01));
    CHECK(clmla_e4m3_to_float(0x07) == 7 * ldexpf(1, -9), "fp8 largest subnormal");
    CHECK(clmla_e4m3_to_float(0x08) == ldexpf(1, -6), "fp8 smallest normal");
    CHECK(clmla_e4m3_to_float(0x38) == 1.0f, "fp8 1.0");
    CHECK(clmla_e4m3_to_float(0x7E) == 448.0f, "fp8 448");
    CHECK(clmla_e4m3_to_float(0xFE) == -448.0f, "fp8 -448");
    CHECK(isnan(clmla_e4m3_to_float(0x7F)) && isnan(clmla_e4m3_to_float(0xFF)), "fp8 NaN");
    int exact = 1;
    for (int b = 0; b < 256; b++)
        if (b != 0x7F && b != 0xFF && (double)clmla_e4m3_to_float((uint8_t)b) != ckpt_value_f8_e4m3((uint8_t)b))
            exact = 0;
    CHECK(exact, "every fp8 value matches the test's own decoder");
    exact = 1;
    for (int b = 0; b < 65536; b++) {
        const double want_h = ckpt_value_f16((uint16_t)b), want_b = ckpt_value_bf16((uint16_t)b);
        const float got_h = clmla_f16_to_float((uint16_t)b), got_b = clmla_bf16_to_float((uint16_t)b);
        if (!(isnan(want_h) ? isnan(got_h) : (double)got_h == want_h) ||
            !(isnan(want_b) ? isnan(got_b) : (double)got_b == want_b))
            exact = 0;
    }
    CHECK(exact, "every f16 and bf16 value matches the test's own decoder");
    CHECK(clmla_f16_to_float(0x0001) == ldexpf(1, -24) && clmla_f16_to_float(0x7BFF) == 65504.0f &&
              isinf(clmla_f16_to_float(0xFC00)) && clmla_f16_to_float(0xFC00) < 0,
          "f16 subnormal, max, -inf");

    /* Block scales: element (i, j) uses S[i/128, j/128]. */
    enum { R = 130, C = 260 };
    static uint8_t q[R * C];
    float scales[2 * 3] = {0.5f, 2.0f, 4.0f, 8.0f, 0.25f, 16.0f};
    for (int i = 0; i < R * C; i++)
        q[i] = (uint8_t)(0x38 + (i % 5)); /* 1.0, 1.125, ... */
    /* The same scales stored BF16 (each exactly representable), a BF16 tensor, a 1-D F8 one. */
    const uint16_t scales_bf16[2 * 3] = {0x3F00, 0x4000, 0x4080, 0x4100, 0x3E80, 0x4180};
    const uint16_t halves[5] = {0x3F80, 0xC000, 0x0001, 0x7F7F, 0x8000};
    const uint8_t codes_1d[4] = {0x38, 0x39, 0x3A, 0x3B};
    ckpt_tensor ts[5] = {{"w", "F8_E4M3", 2, {R, C}, q, sizeof(q)},
                         {"w_scale_inv", "F32", 2, {2, 3}, scales, sizeof(scales)},
                         {"v_scale_inv", "BF16", 2, {2, 3}, scales_bf16, sizeof(scales_bf16)},
                         {"h", "BF16", 1, {5, 0}, halves, sizeof(halves)},
                         {"n", "F8_E4M3", 1, {4, 0}, codes_1d, sizeof(codes_1d)}};
    char path[600];
    subdir(path, sizeof(path), "blocks.safetensors");
    clmla_st_file f;
    char err[1024];
    if (ckpt_write_safetensors(path, ts, 5) == 0 && clmla_st_open(path, &f, err, sizeof(err)) == CLMLA_SUCCESS) {
        float *out = malloc(sizeof(float) * R * C);
        const clmla_st_tensor *t = clmla_st_find(&f, "w"), *s = clmla_st_find(&f, "w_scale_inv");
        const clmla_st_tensor *s16 = clmla_st_find(&f, "v_scale_inv"), *h = clmla_st_find(&f, "h");
        CHECK(t && s && out && clmla_st_to_f32(&f, t, &f, s, out, err, sizeof(err)) == CLMLA_SUCCESS, "dequantise: %s", err);
        int bad = 0;
        for (int i = 0; out && t && s && i < R; i++)
            for (int j = 0; j < C; j++)
                if (out[i * C + j] != (float)ckpt_value_f8_e4m3(q[i * C + j]) * scales[(i / 128) * 3 + j / 128])
                    bad++;
        CHECK(bad == 0, "%d elements differ from fp8(q) * S[i/128, j/128]", bad);

        /* As stored: the codes byte for byte, the scales (F32 or BF16) as float32. */
        uint8_t *codes = malloc(R * C);
        float got_scales[6] = {0};
        clmla_dtype dtype = CLMLA_DTYPE_F32;
        CHECK(t && clmla_st_stored_dtype(&f, t, &dtype, err, sizeof(err)) == CLMLA_SUCCESS &&
                  dtype == CLMLA_DTYPE_FP8_E4M3,
              "F8_E4M3 is kept as FP8_E4M3: %s", err);
        CHECK(codes && t && clmla_st_copy_raw(&f, t, codes, err, sizeof(err)) == CLMLA_SUCCESS &&
                  memcmp(codes, q, R * C) == 0,
              "the codes copied as stored: %s", err);
        CHECK(t && clmla_st_scales_f32(&f, t, &f, s, got_scales, err, sizeof(err)) == CLMLA_SUCCESS &&
                  memcmp(got_scales, scales, sizeof(scales)) == 0,
              "F32 scales: %s", err);
        memset(got_scales, 0, sizeof(got_scales));
        CHECK(t && clmla_st_scales_f32(&f, t, &f, s16, got_scales, err, sizeof(err)) == CLMLA_SUCCESS &&
                  memcmp(got_scales, scales, sizeof(scales)) == 0,
              "BF16 scales, as float32: %s", err);
        CHECK(t && clmla_st_scales_f32(&f, t, &f, NULL, got_scales, err, sizeof(err)) == CLMLA_ERROR_MISSING_TENSOR,
              "no scales");
        CHECK_CONTAINS(err, "'w_scale_inv' are missing");
        uint16_t got_halves[5] = {0};
        CHECK(h && clmla_st_stored_dtype(&f, h, &dtype, err, sizeof(err)) == CLMLA_SUCCESS && dtype == CLMLA_DTYPE_BF16,
              "BF16 is kept as BF16: %s", err);
        CHECK(h && clmla_st_copy_raw(&f, h, got_halves, err, sizeof(err)) == CLMLA_SUCCESS &&
                  memcmp(got_halves, halves, sizeof(halves)) == 0,
              "BF16 elements copied as stored: %s", err);
        /* F8_E4M3 is a 2-D weight's dtype only. */
        CHECK(clmla_st_to_f32(&f, clmla_st_find(&f, "n"), NULL, NULL, out, err, sizeof(err)) == CLMLA_ERROR_UNSUPPORTED,
              "a 1-D F8_E4M3 tensor is refused");
        CHECK_CONTAINS(err, "tensor 'n' is F8_E4M3 with 1 dimensions");
        free(codes);
        free(out);
        clmla_st_close(&f);
    } else {
        CHECK(0, "block test file: %s", err);
    }
}

/* ---- config.json ------------------------------------------------------------------------------ */

/* Excerpts of the published config.json files, the attention-related keys as written there. */
static const char v2_lite_json[] =
    "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"model_type\": \"deepseek_v2\", \"hidden_size\": 2048,\n"
    " \"num_attention_heads\": 16, \"num_hidden_layers\": 27, \"q_lora_rank\": null, \"kv_lora_rank\": 512,\n"
    " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"rms_norm_eps\": 1e-06,\n"
    " \"rope_theta\": 10000, \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 0.707,\n"
    " \"mscale_all_dim\": 0.707, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}}\n";
static const char v3_json[] =
    "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 7168, \"num_attention_heads\": 128, \"num_hidden_layers\": 61,\n"
    " \"q_lora_rank\": 1536, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,\n"
    " \"v_head_dim\": 128, \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000, \"rope_scaling\": {\"beta_fast\": 32,\n"
    " \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,\n"
    " \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},\n"
    " \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": \"fp8\",\n"
    " \"weight_block_size\": [128, 128]}}";
static const char kimi_json[] =
    "{\"model_type\": \"kimi_k2\", \"hidden_size\": 7168, \"num_attention_heads\": 64, \"num_hidden_layers\": 61,\n"
    " \"q_lora_rank\": 1536, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,\n"
    " \"v_head_dim\": 128, \"rms_norm_eps\": 1e-06, \"rope_theta\": 50000.0, \"rope_scaling\": {\"beta_fast\": 1.0,\n"
    " \"beta_slow\": 1.0, \"factor\": 32.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,\n"
    " \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}}";

static int same_config(const clmla_layer_config *a, const clmla_layer_config *b)
{
    return a->hidden_size == b->hidden_size && a->num_heads == b->num_heads && a->q_lora_rank == b->q_lora_rank &&
           a->kv_lora_rank == b->kv_lora_rank && a->qk_nope_head_dim == b->qk_nope_head_dim &&
           a->qk_rope_head_dim == b->qk_rope_head_dim && a->v_head_dim == b->v_head_dim &&
           a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta && a->rope_pairing == b->rope_pairing &&
           a->yarn_factor == b->yarn_factor && a->yarn_original_max_position == b->yarn_original_max_position &&
           a->yarn_beta_fast == b->yarn_beta_fast && a->yarn_beta_slow == b->yarn_beta_slow &&
           a->yarn_mscale == b->yarn_mscale && a->yarn_mscale_all_dim == b->yarn_mscale_all_dim;
}

/* Parses text and expects failure with a message containing needle (and the file name). */
static void config_fails(const char *text, clmla_status want, const char *needle)
{
    clmla_layer_config c;
    int layers = 0;
    char err[1024] = "";
    const clmla_status st = clmla_config_parse(text, strlen(text), "dir/config.json", &c, &layers, err, sizeof(err));
    CHECK(st == want, "config %.60s...: status %s, expected %s (%s)", text, clmla_status_string(st),
          clmla_status_string(want), err);
    CHECK_CONTAINS(err, "dir/config.json");
    CHECK_CONTAINS(err, needle);
}

static void test_config(void)
{
    static const struct {
        const char *json;
        clmla_preset preset;
        int layers;
    } published[] = {
        {v2_lite_json, CLMLA_PRESET_DEEPSEEK_V2_LITE, 27},
        {v3_json, CLMLA_PRESET_DEEPSEEK_V3, 61},
        {kimi_json, CLMLA_PRESET_KIMI_K2, 61},
    };
    for (size_t i = 0; i < sizeof(published) / sizeof(published[0]); i++) {
        clmla_layer_config got, want;
        int layers = 0;
        char err[1024] = "";
        clmla_layer_config_preset(published[i].preset, &want);
        const clmla_status st = clmla_config_parse(published[i].json, strlen(published[i].json), "config.json", &got,
                                                   &layers, err, sizeof(err));
        CHECK(st == CLMLA_SUCCESS, "%s: %s", clmla_preset_name(published[i].preset), err);
        CHECK(st != CLMLA_SUCCESS || same_config(&got, &want), "%s: parsed config differs from the preset",
              clmla_preset_name(published[i].preset));
        CHECK(layers == published[i].layers, "%s: %d layers", clmla_preset_name(published[i].preset), layers);
    }

    /* Pairing: rope_interleave decides where the family reads it (default true); minicpm3 is
       always half-split, deepseek_v2 always interleaved (tests/test_model_config.c has the rest). */
    char text[4096];
    clmla_layer_config c;
    int layers;
    char err[1024];
    snprintf(text, sizeof(text), "%.*s, \"rope_interleave\": false}", (int)strlen(v3_json) - 1, v3_json);
    CHECK(clmla_config_parse(text, strlen(text), "c", &c, &layers, err, sizeof(err)) == CLMLA_SUCCESS &&
              c.rope_pairing == CLMLA_ROPE_HALF_SPLIT,
          "rope_interleave false gives half-split pairs: %s", err);
    snprintf(text, sizeof(text), "%.*s, \"rope_interleave\": true}", (int)strlen(v3_json) - 1, v3_json);
    CHECK(clmla_config_parse(text, strlen(text), "c", &c, &layers, err, sizeof(err)) == CLMLA_SUCCESS &&
              c.rope_pairing == CLMLA_ROPE_INTERLEAVED,
          "rope_interleave true gives interleaved pairs: %s", err);
    const char *minimal = "{\"model_type\": \"%s\", \"hidden_size\": 64, \"num_attention_heads\": 2, \"num_hidden_layers\": 1,"
                          " \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8%s}";
    snprintf(text, sizeof(text), minimal, "llama", ", \"rope_interleave\": false");
    config_fails(text, CLMLA_ERROR_INVALID_CONFIG, "model_type 'llama' is not an MLA family");
    snprintf(text, sizeof(text), minimal, "minicpm3", ", \"rope_interleave\": true");
    CHECK(clmla_config_parse(text, strlen(text), "c", &c, &layers, err, sizeof(err)) == CLMLA_SUCCESS &&
              c.rope_pairing == CLMLA_ROPE_HALF_SPLIT && c.q_lora_rank == 0 && c.yarn_factor == 0 && c.rope_theta == 10000.0,
          "minimal half-split config with defaults: %s", err);
    snprintf(text, sizeof(text), minimal, "deepseek_v2", ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}");
    CHECK(clmla_config_parse(text, strlen(text), "c", &c, &layers, err, sizeof(err)) == CLMLA_SUCCESS &&
              c.yarn_factor == 4 && c.yarn_original_max_position == 4096 && c.yarn_beta_fast == 32 &&
              c.yarn_beta_slow == 1 && c.yarn_mscale == 1 && c.yarn_mscale_all_dim == 0,
          "rope_type yarn with the default fields: %s", err);
    snprintf(text, sizeof(text), minimal, "deepseek_v2", ", \"rope_scaling\": {\"rope_type\": \"default\"}");
    CHECK(clmla_config_parse(text, strlen(text), "c", &c, &layers, err, sizeof(err)) == CLMLA_SUCCESS && c.yarn_factor == 0,
          "rope_type default is plain RoPE: %s", err);

    /* Refusals, by name. */
    snprintf(text, sizeof(text), minimal, "deepseek_v2", ", \"rope_scaling\": {\"type\": \"longrope\", \"factor\": 4}");
    config_fails(text, CLMLA_ERROR_INVALID_CONFIG, "'longrope': DeepSeek's published modeling code accepts only");
    snprintf(text, sizeof(text), minimal, "deepseek_v2", ", \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2}");
    config_fails(text, CLMLA_ERROR_INVALID_CONFIG, "'dynamic'");
    snprintf(text, sizeof(text), minimal, "deepseek_v2", ", \"rope_scaling\": {\"type\": \"yarn\"}");
    config_fails(text, CLMLA_ERROR_INVALID_FILE, "rope_scaling.factor");
    snprintf(text, sizeof(text), minimal, "deepseek_v2", ", \"rope_scaling\": {\"factor\": 2}");
    CHECK(clmla_config_parse(text, strlen(text), "c", &c, &layers, err, sizeof(err)) == CLMLA_SUCCESS &&
              c.rope_type == CLMLA_ROPE_TYPE_DEFAULT,
          "rope_scaling without a type is the default type, as transformers reads it: %s", err);
    snprintf(text, sizeof(text), minimal, "deepseek_v2", ", \"rope_scaling\": \"yarn\"");
    config_fails(text, CLMLA_ERROR_INVALID_FILE, "rope_scaling");
    snprintf(text, sizeof(text), minimal, "deepseek_v3", ", \"rope_interleave\": 1");
    config_fails(text, CLMLA_ERROR_INVALID_FILE, "rope_interleave");
    config_fails("{\"model_type\": \"deepseek_v2\", \"hidden_size\": 64}", CLMLA_ERROR_INVALID_FILE,
                 "\"num_attention_heads\" is missing");
    snprintf(text, sizeof(text), minimal, "deepseek_v2", ", \"q_lora_rank\": \"big\"");
    config_fails(text, CLMLA_ERROR_INVALID_FILE, "\"q_lora_rank\" is not an integer");
    snprintf(text, sizeof(text), minimal, "deepseek_v2", ", \"q_lora_rank\": 1.5");
    config_fails(text, CLMLA_ERROR_INVALID_FILE, "\"q_lora_rank\" is not an integer");
    config_fails("{\"model_type\": \"deepseek_v2\", \"hidden_size\": 64, \"num_attention_heads\": 2, \"num_hidden_layers\": 1,"
                 " \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 5, \"v_head_dim\": 8}",
                 CLMLA_ERROR_INVALID_CONFIG, "must be even");
    config_fails("{\"hidden_size\": 64,", CLMLA_ERROR_INVALID_FILE, "not valid JSON");
    config_fails("[1, 2]", CLMLA_ERROR_INVALID_FILE, "not an object");
    config_fails("{} x", CLMLA_ERROR_INVALID_FILE, "data after");
    config_fails("", CLMLA_ERROR_INVALID_FILE, "not valid JSON");
}

/* ---- bad safetensors, in memory --------------------------------------------------------------- */

/* Builds [u64 length][header][data] in buf and parses it; expects failure mentioning needle. */
static void header_fails(const char *header, size_t data_bytes, const char *needle)
{
    const size_t hlen = strlen(header), size = 8 + hlen + data_bytes;
    uint8_t *buf = calloc(1, size);
    if (!buf)
        return;
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, header, hlen);
    clmla_st_file f;
    char err[1024] = "";
    const clmla_status st = clmla_st_parse(buf, size, "mem.safetensors", &f, err, sizeof(err));
    CHECK(st == CLMLA_ERROR_INVALID_FILE, "header %s: status %s (%s)", header, clmla_status_string(st), err);
    CHECK_CONTAINS(err, "mem.safetensors: ");
    CHECK_CONTAINS(err, needle);
    if (st == CLMLA_SUCCESS)
        clmla_st_close(&f);
    free(buf);
}

static void test_parser(void)
{
    /* Well-formed: metadata ignored, padding accepted, lookups by name. */
    const char *good = "{\"__metadata__\": {\"format\": \"pt\"}, \"b\": {\"dtype\": \"F16\", \"shape\": [2], "
                       "\"data_offsets\": [16, 20]}, \"a\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]},"
                       " \"e\": {\"dtype\": \"I64\", \"shape\": [0], \"data_offsets\": [20, 20]}}    ";
    uint8_t buf[512];
    memset(buf, 0, sizeof(buf));
    const size_t hlen = strlen(good);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, good, hlen);
    clmla_st_file f;
    char err[1024] = "";
    clmla_status st = clmla_st_parse(buf, 8 + hlen + 20, "good", &f, err, sizeof(err));
    CHECK(st == CLMLA_SUCCESS, "good header: %s", err);
    if (st == CLMLA_SUCCESS) {
        const clmla_st_tensor *a = clmla_st_find(&f, "a"), *b = clmla_st_find(&f, "b");
        CHECK(f.num_tensors == 3 && a && b && !clmla_st_find(&f, "__metadata__") && !clmla_st_find(&f, "c"),
              "lookups in the good header");
        CHECK(a && a->dtype == CLMLA_ST_F32 && a->ndim == 2 && a->shape[1] == 2 && a->begin == 0 && a->end == 16,
              "tensor a as written");
        clmla_st_close(&f);
    }

    const char *tensor_a = "\"a\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]}";
    char h[1024];
    snprintf(h, sizeof(h), "{%s}", tensor_a);
    header_fails(h, 8, "out of bounds");
    header_fails("{\"a\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}}", 12, "needs 16");
    header_fails("{\"a\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8, "BF16 x [3] needs 6");
    snprintf(h, sizeof(h), "{%s, \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", tensor_a);
    header_fails(h, 16, "overlap");
    snprintf(h, sizeof(h), "{%s, \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [20, 28]}}", tensor_a);
    header_fails(h, 28, "gap of 4 bytes");
    snprintf(h, sizeof(h), "{%s}", tensor_a);
    header_fails(h, 24, "cover 16 bytes");
    snprintf(h, sizeof(h), "{%s, %s}", tensor_a, tensor_a);
    header_fails(h, 16, "appears twice");
    header_fails("{\"a\": {\"dtype\": \"F32\", \"shape\": [2, -2], \"data_offsets\": [0, 16]}}", 16, "not a non-negative integer");
    header_fails("{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296], \"data_offsets\": [0, 16]}}", 16,
                 "overflows");
    header_fails("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [16, 0]}}", 16, "end before they begin");
    header_fails("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0]}}", 16, "data_offsets");
    header_fails("{\"a\": {\"shape\": [4], \"data_offsets\": [0, 16]}}", 16, "no \"dtype\"");
    header_fails("{\"a\": 3}", 0, "not an object");
    header_fails("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], ", 16, "not valid JSON");
    header_fails("[]", 0, "not an object");
    header_fails("{} {}", 0, "data after its JSON");
    header_fails("", 0, "not valid JSON");

    /* Lengths that do not fit. */
    uint8_t small[16] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F, '{', '}'};
    st = clmla_st_parse(small, 10, "len.safetensors", &f, err, sizeof(err));
    CHECK(st == CLMLA_ERROR_INVALID_FILE, "huge header length");
    CHECK_CONTAINS(err, "len.safetensors: header length 9223372036854775807 is past the end of the file");
    st = clmla_st_parse(small, 5, "short.safetensors", &f, err, sizeof(err));
    CHECK(st == CLMLA_ERROR_INVALID_FILE, "5-byte file");
    CHECK_CONTAINS(err, "short.safetensors: the file is 5 bytes long");
}

/* ---- bad model folders -------------------------------------------------------------------------- */

/* A tiny model written into root/name with the changes the caller makes to m. */
static int write_model(const char *name, ckpt_model *m, char *dir, size_t size)
{
    subdir(dir, size, name);
    return ckpt_write_model(dir, m, NULL);
}

static ckpt_model base_model(const char *dtype, int shards, int q_lora)
{
    ckpt_model m = {.config = ckpt_tiny_config(q_lora, 1), .dtype = dtype, .shards = shards, .num_layers = 2,
                    .seed = 7};
    return m;
}

/* Loading layer `layer` of dir fails with `want` and a message containing every needle. */
static void load_fails(const char *dir, int layer, clmla_status want, const char *n1, const char *n2, const char *n3)
{
    clmla_layer *L = NULL;
    const clmla_status st = clmla_layer_create_from_model(ctx, dir, layer, &L);
    const char *msg = clmla_last_error(ctx);
    CHECK(st == want && L == NULL, "%s layer %d: status %s, expected %s: %s", dir, layer, clmla_status_string(st),
          clmla_status_string(want), msg);
    if (n1)
        CHECK_CONTAINS(msg, n1);
    if (n2)
        CHECK_CONTAINS(msg, n2);
    if (n3)
        CHECK_CONTAINS(msg, n3);
    clmla_layer_destroy(L);
}

static void test_bad_models(void)
{
    char dir[600], path[1200], file[1300];
    ckpt_model m;

    /* A missing tensor is named, with the file or index that lacks it. */
    m = base_model("BF16", 0, 1);
    m.omit = "kv_b_proj.weight";
    if (write_model("missing_single", &m, dir, sizeof(dir)) == 0)
        load_fails(dir, 0, CLMLA_ERROR_MISSING_TENSOR, "model.safetensors: tensor model.layers.0.self_attn.kv_b_proj.weight is missing",
                   dir, NULL);
    m = base_model("BF16", 3, 1);
    m.omit = "q_a_layernorm.weight";
    if (write_model("missing_sharded", &m, dir, sizeof(dir)) == 0)
        load_fails(dir, 1, CLMLA_ERROR_MISSING_TENSOR, "model.safetensors.index.json: tensor model.layers.1.self_attn.q_a_layernorm.weight is missing",
                   NULL, NULL);
    /* q_lora_rank set but the checkpoint has q_proj only. */
    m = base_model("F32", 0, 0);
    if (write_model("q_form", &m, dir, sizeof(dir)) == 0) {
        ckpt_path(path, sizeof(path), dir, "config.json");
        clmla_layer_config c = ckpt_tiny_config(1, 1);
        char *json = ckpt_config_json(&c, 2, NULL, 0, 0);
        if (json && ckpt_write_text(path, json) == 0)
            load_fails(dir, 0, CLMLA_ERROR_MISSING_TENSOR, "model.layers.0.self_attn.q_a_proj.weight is missing", NULL, NULL);
        free(json);
    }

    /* F8 weights without their scales, or with scales of the wrong shape. */
    m = base_model("F8_E4M3", 2, 1);
    m.omit = "o_proj.weight_scale_inv";
    if (write_model("no_scales", &m, dir, sizeof(dir)) == 0)
        load_fails(dir, 0, CLMLA_ERROR_MISSING_TENSOR, "model.layers.0.self_attn.o_proj.weight is F8_E4M3",
                   "model.layers.0.self_attn.o_proj.weight_scale_inv are missing", NULL);
    /* ... in a model folder: the layer is not made, the message names the scales and both shapes
       (o_proj [160, 32] has 2 x 1 blocks; the file says 1 x 2), or the scales' dtype. */
    m = base_model("F8_E4M3", 3, 1);
    m.reshape = "o_proj.weight_scale_inv";
    m.reshape_to[0] = 1;
    m.reshape_to[1] = 2;
    if (write_model("scale_shape", &m, dir, sizeof(dir)) == 0)
        load_fails(dir, 0, CLMLA_ERROR_SHAPE_MISMATCH,
                   "block scales 'model.layers.0.self_attn.o_proj.weight_scale_inv' have shape [1, 2]",
                   "'model.layers.0.self_attn.o_proj.weight' [160, 32] need [2, 1]", NULL);
    m = base_model("F8_E4M3", 0, 0);
    m.scale_dtype = "BF16";
    m.reshape = "kv_b_proj.weight_scale_inv";
    m.reshape_to[0] = 2;
    m.reshape_to[1] = 1;
    if (write_model("scale_shape_bf16", &m, dir, sizeof(dir)) == 0)
        load_fails(dir, 0, CLMLA_ERROR_SHAPE_MISMATCH, "model.safetensors: block scales", "have shape [2, 1]",
                   "[64, 144] need [1, 2]");
    m = base_model("F8_E4M3", 0, 1);
    m.retype = "kv_b_proj.weight_scale_inv";
    m.retype_as = "I32";
    if (write_model("scale_dtype", &m, dir, sizeof(dir)) == 0)
        load_fails(dir, 0, CLMLA_ERROR_UNSUPPORTED,
                   "block scales 'model.layers.0.self_attn.kv_b_proj.weight_scale_inv'",
                   "have dtype I32; F32, F16 or BF16 expected", NULL);
    {
        uint8_t q[4 * 200];
        float s[2] = {1, 1};
        memset(q, 0x38, sizeof(q));
        ckpt_tensor ts[2] = {{"w", "F8_E4M3", 2, {4, 200}, q, sizeof(q)}, {"w_scale_inv", "F32", 2, {2, 1}, s, sizeof(s)}};
        clmla_st_file f;
        char err[1024] = "";
        subdir(path, sizeof(path), "scales.safetensors");
        if (ckpt_write_safetensors(path, ts, 2) == 0 && clmla_st_open(path, &f, err, sizeof(err)) == CLMLA_SUCCESS) {
            float out[4 * 200];
            const clmla_status st = clmla_st_to_f32(&f, clmla_st_find(&f, "w"), &f, clmla_st_find(&f, "w_scale_inv"), out,
                                                    err, sizeof(err));
            CHECK(st == CLMLA_ERROR_SHAPE_MISMATCH, "wrong scale shape: %s", err);
            CHECK_CONTAINS(err, "scales.safetensors: block scales 'w_scale_inv' have shape [2, 1]");
            CHECK_CONTAINS(err, "need [1, 2]");
            clmla_st_close(&f);
        } else {
            CHECK(0, "scales file: %s", err);
        }
    }

    /* A shape that disagrees with config.json: both shapes in the message. */
    m = base_model("F16", 0, 1);
    clmla_layer_config other = m.config;
    other.kv_lora_rank = 128;
    m.tensor_config = &other;
    if (write_model("shape", &m, dir, sizeof(dir)) == 0)
        load_fails(dir, 0, CLMLA_ERROR_SHAPE_MISMATCH, "model.safetensors: tensor model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                   "has shape [136, 160], but config.json implies [152, 160]", NULL);

    /* An unsupported dtype on a needed tensor (an ignored one may have any). */
    m = base_model("F32", 0, 0);
    m.retype = "kv_a_proj_with_mqa.weight";
    m.retype_as = "I32";
    if (write_model("dtype", &m, dir, sizeof(dir)) == 0)
        load_fails(dir, 0, CLMLA_ERROR_UNSUPPORTED, "kv_a_proj_with_mqa.weight' has dtype I32", "model.safetensors", NULL);
    m = base_model("F8_E4M3", 0, 1);
    m.retype = "q_a_layernorm.weight";
    m.retype_as = "U16";
    if (write_model("dtype_norm", &m, dir, sizeof(dir)) == 0)
        load_fails(dir, 0, CLMLA_ERROR_UNSUPPORTED, "q_a_layernorm.weight' has dtype U16", NULL, NULL);
    m = base_model("F8_E4M3", 0, 0);
    m.retype = "q_proj.weight";
    m.retype_as = "F8_E5M2";
    if (write_model("dtype_e5m2", &m, dir, sizeof(dir)) == 0)
        load_fails(dir, 0, CLMLA_ERROR_UNSUPPORTED, "has dtype F8_E5M2", NULL, NULL);

    /* Layer index out of range. */
    m = base_model("F32", 0, 0);
    if (write_model("range", &m, dir, sizeof(dir)) == 0) {
        load_fails(dir, 2, CLMLA_ERROR_INVALID_ARGUMENT, "layer 2 is out of range", "config.json has 2 decoder layers",
                   NULL);
        load_fails(dir, -1, CLMLA_ERROR_INVALID_ARGUMENT, "layer -1 is out of range", NULL, NULL);
        /* ... and a config that promises a layer the weights lack. */
        ckpt_path(path, sizeof(path), dir, "config.json");
        char *json = ckpt_config_json(&m.config, 3, NULL, 0, 0);
        if (json && ckpt_write_text(path, json) == 0)
            load_fails(dir, 2, CLMLA_ERROR_MISSING_TENSOR, "tensor model.layers.2.self_attn.q_proj.weight is missing", NULL,
                       NULL);
        free(json);
    }

    /* A shard named in the index that is missing; a tensor the index misplaces. */
    m = base_model("BF16", 3, 1);
    if (write_model("shard", &m, dir, sizeof(dir)) == 0) {
        unlink(ckpt_path(path, sizeof(path), dir, "model-00002-of-00003.safetensors"));
        load_fails(dir, 0, CLMLA_ERROR_IO, "model.safetensors.index.json names shard 'model-00002-of-00003.safetensors'",
                   "is missing", NULL);
    }
    m = base_model("BF16", 2, 0);
    if (write_model("misplaced", &m, dir, sizeof(dir)) == 0) {
        ckpt_path(path, sizeof(path), dir, "model.safetensors.index.json");
        ckpt_write_text(path, "{\"metadata\": {}, \"weight_map\": {"
                              "\"model.layers.0.self_attn.q_proj.weight\": \"model-00001-of-00002.safetensors\","
                              "\"model.layers.0.self_attn.kv_a_proj_with_mqa.weight\": \"model-00001-of-00002.safetensors\"}}");
        load_fails(dir, 0, CLMLA_ERROR_MISSING_TENSOR, "model-00001-of-00002.safetensors: tensor", "is missing",
                   "model.safetensors.index.json places it");
        ckpt_write_text(path, "{\"weight_map\": {\"model.layers.0.self_attn.q_proj.weight\": \"../model-00001-of-00002.safetensors\"}}");
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, "model.safetensors.index.json: weight_map places", "not a plain file name",
                   NULL);
        /* A tensor lives in one shard: the index cannot place it in two (with two dtypes). */
        ckpt_write_text(path, "{\"weight_map\": {"
                              "\"model.layers.0.self_attn.q_proj.weight\": \"model-00001-of-00002.safetensors\", "
                              "\"model.layers.0.self_attn.q_proj.weight\": \"model-00002-of-00002.safetensors\"}}");
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, "model.safetensors.index.json: weight_map names tensor",
                   "'model.layers.0.self_attn.q_proj.weight' twice", NULL);
        ckpt_write_text(path, "{\"weight_map\": {\"x\": 3}}");
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, "model.safetensors.index.json: weight_map entry 'x' is not", NULL, NULL);
        ckpt_write_text(path, "{\"weight_map\": [");
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, "model.safetensors.index.json: not valid JSON", NULL, NULL);
        ckpt_write_text(path, "{\"metadata\": {}}");
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, "no \"weight_map\"", NULL, NULL);
        unlink(path);
        load_fails(dir, 0, CLMLA_ERROR_IO, "neither model.safetensors nor model.safetensors.index.json", NULL, NULL);
    }

    /* Corrupt files on disk: header length past the end, bad JSON, bad offsets, truncation. */
    m = base_model("F32", 0, 0);
    if (write_model("corrupt", &m, dir, sizeof(dir)) == 0) {
        ckpt_path(file, sizeof(file), dir, "model.safetensors");
        const uint8_t past[12] = {0x00, 0x10, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
        ckpt_write_bytes(file, past, sizeof(past));
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, file, "header length 4096 is past the end of the file", NULL);
        ckpt_write_safetensors_raw(file, "{\"a\": {\"dtype\": \"F32\" \"shape\": [1]}}", "abcd", 4);
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, file, "is not valid JSON", NULL);
        ckpt_write_safetensors_raw(file, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", "abcd", 4);
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, file, "'a': data_offsets [0, 8] are out of bounds", NULL);
        ckpt_write_safetensors_raw(file,
                                   "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                                   " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                                   "abcdefgh", 8);
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, file, "overlap", NULL);
        ckpt_write_safetensors_raw(file, "{\"a\": {\"dtype\": \"F16\", \"shape\": [3], \"data_offsets\": [0, 8]}}", "abcdefgh", 8);
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, file, "F16 x [3] needs 6", NULL);
        ckpt_write_bytes(file, "", 0);
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, file, "0 bytes long", NULL);
    }
    m = base_model("BF16", 0, 1);
    if (write_model("truncated", &m, dir, sizeof(dir)) == 0) {
        ckpt_path(file, sizeof(file), dir, "model.safetensors");
        FILE *f = fopen(file, "rb");
        uint8_t *bytes = malloc(1 << 20);
        const size_t n = f && bytes ? fread(bytes, 1, 1 << 20, f) : 0;
        if (f)
            fclose(f);
        if (n > 100) {
            ckpt_write_bytes(file, bytes, n - 100);
            load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, file, "out of bounds", NULL);
        }
        free(bytes);
    }

    /* config.json problems. */
    m = base_model("F32", 0, 0);
    if (write_model("noconfig", &m, dir, sizeof(dir)) == 0) {
        unlink(ckpt_path(path, sizeof(path), dir, "config.json"));
        load_fails(dir, 0, CLMLA_ERROR_IO, "config.json: cannot open", dir, NULL);
        clmla_layer_config c;
        CHECK(clmla_model_read_config(dir, &c, NULL) == CLMLA_ERROR_IO, "clmla_model_read_config without config.json");
        CHECK_CONTAINS(clmla_last_error(NULL), "config.json: cannot open");
        ckpt_write_text(path, "{\"model_type\": \"deepseek_v3\", \"rope_scaling\": {\"type\": \"longrope\"}, "
                              "\"hidden_size\": 160, \"num_attention_heads\": 2, \"kv_lora_rank\": 144, "
                              "\"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, "
                              "\"num_hidden_layers\": 1}");
        load_fails(dir, 0, CLMLA_ERROR_INVALID_CONFIG, "config.json: \"rope_scaling.type\" 'longrope'", NULL, NULL);
        ckpt_write_text(path, "{\"hidden_size\": ");
        load_fails(dir, 0, CLMLA_ERROR_INVALID_FILE, "config.json: not valid JSON", NULL, NULL);
    }
    load_fails("/nonexistent/clmla/model", 0, CLMLA_ERROR_IO, "/nonexistent/clmla/model/config.json", NULL, NULL);

    /* Arguments. */
    clmla_layer *L = (clmla_layer *)&m;
    CHECK_STATUS(clmla_layer_create_from_model(ctx, NULL, 0, &L), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(L == NULL, "output cleared on failure");
    CHECK_STATUS(clmla_layer_create_from_model(ctx, dir, 0, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(clmla_layer_create_from_model(NULL, dir, 0, &L) == CLMLA_ERROR_INVALID_ARGUMENT, "NULL context");
}

/* ---- .npy ----------------------------------------------------------------------------------------- */

/* A .npy image with this header dict (padded as numpy pads) and `data_bytes` bytes of data. */
static size_t make_npy(uint8_t *buf, size_t size, int major, const char *dict, size_t data_bytes)
{
    const size_t prefix = major == 1 ? 10 : 12;
    size_t len = strlen(dict) + 1;
    while ((prefix + len) % 64)
        len++;
    if (prefix + len + data_bytes > size)
        return 0;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (uint8_t)major;
    buf[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++)
        buf[8 + i] = (uint8_t)(len >> (8 * i));
    memset(buf + prefix, ' ', len);
    memcpy(buf + prefix, dict, strlen(dict));
    buf[prefix + len - 1] = '\n';
    memset(buf + prefix + len, 0, data_bytes);
    return prefix + len + data_bytes;
}

static void npy_file_fails(const char *name, const uint8_t *bytes, size_t size, clmla_status want, const char *needle)
{
    char path[700];
    subdir(path, sizeof(path), name);
    ckpt_write_bytes(path, bytes, size);
    float *data = (float *)path;
    int64_t shape[2];
    int ndim = 7;
    const clmla_status st = clmla_npy_read_f32(path, &data, shape, &ndim);
    CHECK(st == want && data == NULL, "%s: status %s, expected %s: %s", name, clmla_status_string(st),
          clmla_status_string(want), clmla_last_error(NULL));
    CHECK_CONTAINS(clmla_last_error(NULL), path);
    CHECK_CONTAINS(clmla_last_error(NULL), needle);
}

static void test_npy(void)
{
    char path[700];
    /* Round trip through the writer, 2-D and 1-D. */
    const float values[6] = {1.0f, -2.5f, 3.25f, 1e-30f, -0.0f, 65504.0f};
    const int64_t shape23[2] = {2, 3}, shape6[2] = {6, 0};
    subdir(path, sizeof(path), "a.npy");
    CHECK_STATUS(clmla_npy_write_f32(path, values, 2, shape23), CLMLA_SUCCESS, NULL);
    float *data = NULL;
    int64_t shape[2] = {0, 0};
    int ndim = 0;
    CHECK_STATUS(clmla_npy_read_f32(path, &data, shape, &ndim), CLMLA_SUCCESS, NULL);
    CHECK(data && ndim == 2 && shape[0] == 2 && shape[1] == 3 && memcmp(data, values, sizeof(values)) == 0,
          "2-D round trip");
    clmla_free(data);
    data = NULL;
    subdir(path, sizeof(path), "b.npy");
    CHECK_STATUS(clmla_npy_write_f32(path, values, 1, shape6), CLMLA_SUCCESS, NULL);
    CHECK_STATUS(clmla_npy_read_f32(path, &data, shape, &ndim), CLMLA_SUCCESS, NULL);
    CHECK(data && ndim == 1 && shape[0] == 6 && memcmp(data, values, sizeof(values)) == 0, "1-D round trip");
    clmla_free(data);
    data = NULL;
    /* The writer's header is what numpy writes: 64-byte aligned data, version 1.0. */
    FILE *f = fopen(path, "rb");
    uint8_t head[256];
    const size_t got = f ? fread(head, 1, sizeof(head), f) : 0;
    if (f)
        fclose(f);
    CHECK(got == 128 + 24 && head[6] == 1 && head[8] + 10 == 128 &&
              memcmp(head + 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", 57) == 0 && head[127] == '\n',
          "the writer's header layout");

    /* float16 input, version 2.0, an odd header spelling numpy also accepts. */
    uint8_t buf[512];
    size_t n = make_npy(buf, sizeof(buf), 2, "{\"shape\": (2, 2) , 'fortran_order':False,'descr':'<f2'}", 8);
    const uint16_t halves[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
    for (int i = 0; i < 4; i++) {
        buf[n - 8 + 2 * i] = (uint8_t)halves[i];
        buf[n - 8 + 2 * i + 1] = (uint8_t)(halves[i] >> 8);
    }
    subdir(path, sizeof(path), "h.npy");
    ckpt_write_bytes(path, buf, n);
    CHECK_STATUS(clmla_npy_read_f32(path, &data, shape, &ndim), CLMLA_SUCCESS, NULL);
    CHECK(data && ndim == 2 && shape[0] == 2 && shape[1] == 2 && data[0] == 1.0f && data[1] == -2.0f &&
              data[2] == ldexpf(1, -24) && data[3] == 65504.0f,
          "float16 values");
    clmla_free(data);

    /* float64 (numpy's default), rounded to float32 */
    n = make_npy(buf, sizeof(buf), 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }", 40);
    const double doubles[5] = {1.0, -2.5, 0.1, 65504.0, 1e-45};
    for (int i = 0; i < 5; i++) {
        uint64_t bits;
        memcpy(&bits, &doubles[i], sizeof(bits));
        for (int b = 0; b < 8; b++)
            buf[n - 40 + 8 * i + b] = (uint8_t)(bits >> (8 * b));
    }
    subdir(path, sizeof(path), "d.npy");
    ckpt_write_bytes(path, buf, n);
    CHECK_STATUS(clmla_npy_read_f32(path, &data, shape, &ndim), CLMLA_SUCCESS, NULL);
    CHECK(data && ndim == 1 && shape[0] == 5 && data[0] == 1.0f && data[1] == -2.5f && data[2] == 0.1f &&
              data[3] == 65504.0f && data[4] == (float)1e-45,
          "float64 values rounded to float32");
    clmla_free(data);

    const char *c_order = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    /* Refusals: a version 1 file with the header dict and data_bytes of data, cut bytes short. */
    const struct {
        const char *name, *dict;
        size_t data_bytes, cut;
        clmla_status want;
        const char *needle;
    } refusals[] = {
        {"fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24, 0, CLMLA_ERROR_UNSUPPORTED, "Fortran order"},
        {"big.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24, 0, CLMLA_ERROR_UNSUPPORTED, "dtype '>f4' is big-endian"},
        {"i8.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }", 48, 0, CLMLA_ERROR_UNSUPPORTED, "dtype '<i8' is not supported"},
        {"bigf8.npy", "{'descr': '>f8', 'fortran_order': False, 'shape': (2, 3), }", 48, 0, CLMLA_ERROR_UNSUPPORTED, "dtype '>f8' is big-endian"},
        {"struct.npy", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, 0, CLMLA_ERROR_UNSUPPORTED, "structured"},
        {"3d.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3), }", 24, 0, CLMLA_ERROR_UNSUPPORTED, "3 dimensions"},
        {"scalar.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, 0, CLMLA_ERROR_UNSUPPORTED, "0 dimensions"},
        {"truncated.npy", c_order, 24, 1, CLMLA_ERROR_INVALID_FILE, "truncated: 23 bytes of data, but shape (2, 3)"},
        {"trailing.npy", c_order, 28, 0, CLMLA_ERROR_INVALID_FILE, "trailing bytes"},
        {"key.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", 24, 0, CLMLA_ERROR_INVALID_FILE, "unexpected or repeated key 'x'"},
        {"nokey.npy", "{'descr': '<f4', 'shape': (2, 3)}", 24, 0, CLMLA_ERROR_INVALID_FILE, "lacks 'fortran_order'"},
        {"negative.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", 24, 0, CLMLA_ERROR_INVALID_FILE, "'shape' is not a tuple"},
        {"garbage.npy", "garbage", 24, 0, CLMLA_ERROR_INVALID_FILE, "not a dict"},
        {"after.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } x", 24, 0, CLMLA_ERROR_INVALID_FILE, "data after the header dict"},
    };
    for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
        n = make_npy(buf, sizeof(buf), 1, refusals[i].dict, refusals[i].data_bytes);
        npy_file_fails(refusals[i].name, buf, n - refusals[i].cut, refusals[i].want, refusals[i].needle);
    }
    n = make_npy(buf, sizeof(buf), 1, c_order, 24);
    buf[8] = 0xFF;
    buf[9] = 0x7F;
    npy_file_fails("hlen.npy", buf, n, CLMLA_ERROR_INVALID_FILE, "header length 32767 is past the end");
    buf[6] = 9;
    npy_file_fails("version.npy", buf, n, CLMLA_ERROR_UNSUPPORTED, "version 9.0");
    npy_file_fails("magic.npy", (const uint8_t *)"PK\x03\x04 not a numpy file", 21, CLMLA_ERROR_INVALID_FILE, "not a .npy file");
    subdir(path, sizeof(path), "absent.npy");
    CHECK(clmla_npy_read_f32(path, &data, shape, &ndim) == CLMLA_ERROR_IO, "missing file");
    CHECK_CONTAINS(clmla_last_error(NULL), "absent.npy: cannot open");
    CHECK(clmla_npy_write_f32("/nonexistent/dir/y.npy", values, 2, shape23) == CLMLA_ERROR_IO, "unwritable path");
    CHECK_CONTAINS(clmla_last_error(NULL), "/nonexistent/dir/y.npy: cannot create");
}

int main(void)
{
    if (ckpt_make_temp_dir(root, sizeof(root), "checkpoint") != 0)
        return 1;
    printf("test_checkpoint: files under %s\n", root);
    test_config();
    test_parser();
    test_npy();
    test_conversions();
    if (clmla_context_create(NULL, &ctx) != CLMLA_SUCCESS) {
        printf("skipped: no OpenCL device: %s\n", clmla_last_error(NULL));
        ckpt_remove_dir(root);
        return 77;
    }
    test_good_models();
    test_stored_dtypes();
    test_bad_models();
    clmla_context_destroy(ctx);
    ckpt_remove_dir(root);
    return check_summary();
}
