/* clmla_layer_forward against the float64 reference (ref/), with random fixed-seed weights:
 *   shapes    odd sizes (3/5/1/2/16 heads, kv_lora 40/72/3, rope 8/6/2, D 37/64/96/7/160), both rope
 *             pairings, YaRN on and off (amplitude != 1 too), q_lora absent and present, f32 and
 *             f16 caches, each path, and the two paths against each other;
 *   long      T = 250 (16-token blocks): one prefill == chunks of 7/13/23 (ending mid-block, with
 *             either path or both alternating) == prefill then token-by-token decode == reference;
 *   batch     sequences of different lengths in one call (decode entries of 1 token beside prefill
 *             chunks) == each sequence alone == reference;
 *   layers    two layers sharing one cache, each on its own cache layer;
 *   forward-cl clmla_layer_forward_cl on device buffers at offsets, chained by events;
 *   auto-path clmla_layer_auto_path's rule, and AUTO taking the path it names;
 *   absorbed-pieces  batch and long with the absorbed path's attention in pieces of 5 rows;
 *   decompressed-budget  AUTO keeping an entry absorbed where decompressing it would pass the
 *             scratch budget; a step that names the decompressed path refused past the device's
 *             largest buffer;
 *   group-kernels, untiled-prefill  shapes and long with the GPU attention kernels (the decompressed
 *             path's by attn_prefill_tiled, then by attn_prefill: the latent tuning's prefill_tiled);
 *   errors    wrong / missing weights, invalid configs, bad forward arguments and a full cache: the
 *             documented status, and no sequence changes length or contents;
 *   presets   v2-lite, v2, v3 and kimi-k2 at full size for 3 tokens (one preset in memory at a time).
 * The cache contents after every run (c^KV after RMSNorm, k^R after RoPE) are compared as well.
 * `test_layer PART...` runs the named parts ("all": every one); no argument runs every part but
 * the presets, which ctest runs as their own entry (test_layer_presets). */
#include "attention.h"
#include "clcall.h"
#include "check.h"
#include "hooks.h"
#include "gemm.h"
#include "internal.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static clmla_context *ctx;

static const char *path_name(clmla_attention_path p)
{
    return p == CLMLA_PATH_ABSORBED ? "absorbed" : p == CLMLA_PATH_DECOMPRESSED ? "decompressed" : "auto";
}

static const char *dtype_name(clmla_cache_dtype d)
{
    return d == CLMLA_CACHE_F16 ? "f16" : "f32";
}

/* tu_weights_make, failing the test (what: out of host memory) where it fails; 0 or -1. */
static int weights_or_fail(tu_weights *w, const clmla_layer_config *c, uint64_t seed, const char *what)
{
    if (tu_weights_make(w, c, seed) == 0)
        return 0;
    CHECK(0, "%s: out of host memory", what);
    return -1;
}

static clmla_layer *make_layer(const tu_weights *w, const char *what)
{
    clmla_layer *layer = NULL;
    clmla_status st = clmla_layer_create(ctx, &w->config, &w->layer, &layer);
    CHECK(st == CLMLA_SUCCESS && layer, "%s: layer_create: %s: %s", what, clmla_status_string(st),
          clmla_last_error(ctx));
    return st == CLMLA_SUCCESS ? layer : NULL;
}

static clmla_cache *make_cache(const clmla_layer_config *c, int layers, int bt, int num_blocks, clmla_cache_dtype dt)
{
    clmla_cache_config cc = {layers, c->kv_lora_rank, c->qk_rope_head_dim, bt, num_blocks, dt, 0, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    clmla_status st = clmla_cache_create(ctx, &cc, &cache);
    CHECK(st == CLMLA_SUCCESS && cache, "cache_create: %s: %s", clmla_status_string(st), clmla_last_error(ctx));
    return cache;
}

static int32_t add_seq(clmla_cache *cache)
{
    int32_t id = -1;
    CHECK_STATUS(clmla_cache_seq_add(cache, &id), CLMLA_SUCCESS, ctx);
    return id;
}

static clmla_status forward(clmla_layer *layer, clmla_cache *cache, int cache_layer, const clmla_batch_entry *entries,
                            int num_entries, clmla_attention_path path, const float *x, float *out)
{
    clmla_forward_args a = {.entries = entries, .num_entries = num_entries, .cache_layer = cache_layer, .path = path};
    return clmla_layer_forward(layer, cache, &a, x, out);
}

/* Tokens [start, start+n) of a sequence in the cache against the reference's c^KV and k^R. */
static void check_cache(clmla_cache *cache, int cache_layer, int32_t seq, int start, int n, const tu_ref_run *ref,
                        const clmla_layer_config *c, clmla_cache_dtype dt, const char *what)
{
    const int rkv = c->kv_lora_rank, dr = c->qk_rope_head_dim;
    int len = -1;
    CHECK_STATUS(clmla_cache_seq_length(cache, seq, cache_layer, &len), CLMLA_SUCCESS, ctx);
    CHECK(len >= start + n, "%s: cached length %d, expected at least %d", what, len, start + n);
    if (len < start + n)
        return;
    float *ckv = malloc(((size_t)n * rkv + 1) * sizeof(float)), *kr = malloc(((size_t)n * dr + 1) * sizeof(float));
    clmla_status st = clmla_cache_read(cache, cache_layer, seq, start, n, ckv, kr);
    CHECK(st == CLMLA_SUCCESS, "%s: cache_read: %s: %s", what, clmla_status_string(st), clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS) {
        CHECK_CLOSE(ckv, ref->ckv + (size_t)start * rkv, (size_t)n * rkv, rkv, TOL_FOR_DTYPE(dt),
                    "%s: cached c^KV [token, i]", what);
        CHECK_CLOSE(kr, ref->kr + (size_t)start * dr, (size_t)n * dr, dr, TOL_FOR_DTYPE(dt),
                    "%s: cached k^R [token, i]", what);
    }
    free(ckv);
    free(kr);
}

/* ---- one sequence through a schedule of chunks ------------------------------------------------ */

/* Runs tokens 0..T-1 of x through a fresh cache as chunks (sizes cycled from `chunks`; each chunk's
   path cycled from `paths`), checks every chunk's status, the final length and the cache against
   the reference, and returns out [T, D] (NULL when a forward failed). */
static float *run_schedule(clmla_layer *layer, const tu_weights *w, const tu_ref_run *ref, int T, const float *x,
                           clmla_cache_dtype dt, int bt, const int *chunks, int num_chunks,
                           const clmla_attention_path *paths, int num_paths, const char *what)
{
    const clmla_layer_config *c = &w->config;
    const int D = c->hidden_size;
    clmla_cache *cache = make_cache(c, 1, bt, (T + bt - 1) / bt + 1, dt);
    if (!cache)
        return NULL;
    int32_t seq = add_seq(cache);
    float *out = malloc((size_t)T * D * sizeof(float));
    for (size_t i = 0; i < (size_t)T * D; i++)
        out[i] = NAN;
    int done = 0, k = 0, ok = 1;
    while (done < T && ok) {
        int n = chunks[k % num_chunks];
        if (n > T - done)
            n = T - done;
        clmla_attention_path p = paths[k % num_paths];
        clmla_batch_entry e = {seq, n};
        clmla_status st = forward(layer, cache, 0, &e, 1, p, x + (size_t)done * D, out + (size_t)done * D);
        CHECK(st == CLMLA_SUCCESS, "%s: chunk %d (tokens %d..%d, %s): %s: %s", what, k, done, done + n - 1,
              path_name(p), clmla_status_string(st), clmla_last_error(ctx));
        ok = st == CLMLA_SUCCESS;
        done += n;
        k++;
    }
    if (ok) {
        int len = -1;
        clmla_cache_seq_length(cache, seq, 0, &len);
        CHECK(len == T, "%s: sequence length %d after %d tokens", what, len, T);
        CHECK_CLOSE(out, ref->out, (size_t)T * D, D, TOL_FOR_DTYPE(dt), "%s: out [token, i] vs reference", what);
        check_cache(cache, 0, seq, 0, T, ref, c, dt, what);
    }
    clmla_cache_destroy(cache);
    if (!ok) {
        free(out);
        return NULL;
    }
    return out;
}

/* Two library outputs of the same tokens agree. */
static void check_agree(const float *a, const float *b, size_t n, int cols, clmla_cache_dtype dt, const char *what)
{
    if (!a || !b)
        return;
    double *bd = tu_to_double(b, n);
    CHECK_CLOSE(a, bd, n, cols, TOL_AGREE_FOR_DTYPE(dt), "%s [token, i]", what);
    free(bd);
}

/* ---- shapes ------------------------------------------------------------------------------------ */

/* clmla_layer_get_memory: each checkpoint tensor's float32 bytes (packing may pad by at most 1%),
   and the total the sum of the parts. */
static void check_memory(const clmla_layer *layer, const clmla_layer_config *c, const char *desc)
{
    clmla_layer_memory m;
    CHECK_STATUS(clmla_layer_get_memory(layer, &m), CLMLA_SUCCESS, ctx);
    const size_t D = (size_t)c->hidden_size, H = (size_t)c->num_heads, rq = (size_t)c->q_lora_rank;
    const size_t rkv = (size_t)c->kv_lora_rank, dn = (size_t)c->qk_nope_head_dim, dr = (size_t)c->qk_rope_head_dim;
    const size_t dv = (size_t)c->v_head_dim, F = sizeof(float);
    const struct {
        const char *name;
        size_t got, want;
    } parts[] = {{"q_a_proj", m.q_a_proj, rq * D * F},
                 {"q_proj", m.q_proj, rq ? 0 : H * (dn + dr) * D * F},
                 {"kv_a_proj_with_mqa", m.kv_a_proj_with_mqa, (rkv + dr) * D * F},
                 {"q_b_proj", m.q_b_proj, H * (dn + dr) * rq * F},
                 {"kv_b_proj", m.kv_b_proj, H * (dn + dv) * rkv * F},
                 {"o_proj", m.o_proj, D * H * dv * F},
                 {"norms", m.norms, (rq + rkv) * F}};
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        CHECK(parts[i].got >= parts[i].want && (double)parts[i].got <= 1.01 * (double)parts[i].want,
              "%s: %s holds %zu bytes on the device, its float32 values are %zu", desc, parts[i].name, parts[i].got,
              parts[i].want);
    CHECK(m.total == m.q_a_proj + m.q_proj + m.kv_a_proj_with_mqa + m.q_b_proj + m.kv_b_proj + m.o_proj + m.norms +
                         m.biases + m.rope_table,
          "%s: total %zu is not the sum of the parts", desc, m.total);
    CHECK_STATUS(clmla_layer_get_memory(NULL, &m), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_layer_get_memory(layer, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
}

static void check_config_roundtrip(const clmla_layer *layer, const clmla_layer_config *want, const char *what)
{
    clmla_layer_config got;
    memset(&got, 0, sizeof(got));
    CHECK_STATUS(clmla_layer_get_config(layer, &got), CLMLA_SUCCESS, ctx);
    CHECK(got.hidden_size == want->hidden_size && got.num_heads == want->num_heads &&
              got.q_lora_rank == want->q_lora_rank && got.kv_lora_rank == want->kv_lora_rank &&
              got.qk_nope_head_dim == want->qk_nope_head_dim && got.qk_rope_head_dim == want->qk_rope_head_dim &&
              got.v_head_dim == want->v_head_dim && got.rope_pairing == want->rope_pairing &&
              got.yarn_factor == want->yarn_factor,
          "%s: get_config differs from the config given", what);
}

static clmla_layer_config shape_config(int which)
{
    clmla_layer_config c;
    switch (which) {
    case 0: /* no q_lora, half-split, YaRN off */
        c = tu_small_config(37, 3, 0, 40, 13, 8, 11);
        c.rope_pairing = CLMLA_ROPE_HALF_SPLIT;
        break;
    case 1: /* q_lora, half-split, YaRN as V2 */
        c = tu_small_config(64, 5, 24, 40, 16, 8, 24);
        c.rope_pairing = CLMLA_ROPE_HALF_SPLIT;
        c.yarn_factor = 40;
        c.yarn_mscale = 0.707;
        c.yarn_mscale_all_dim = 0.707;
        break;
    case 2: /* one head, rope 6, theta 5e4, YaRN as Kimi but mscale_all_dim 0.8 (amplitude != 1) */
        c = tu_small_config(96, 1, 33, 72, 24, 6, 17);
        c.rope_theta = 50000;
        c.yarn_factor = 32;
        c.yarn_beta_fast = 1;
        c.yarn_beta_slow = 1;
        c.yarn_mscale = 1.0;
        c.yarn_mscale_all_dim = 0.8;
        break;
    case 3: /* tiny everything, interleaved, YaRN off, a non-default eps */
        c = tu_small_config(7, 2, 5, 3, 1, 2, 1);
        c.rms_norm_eps = 1e-5;
        break;
    default: /* 16 heads, no q_lora, interleaved, YaRN with HF's default mscale_all_dim 0 */
        c = tu_small_config(160, 16, 0, 96, 32, 16, 32);
        c.yarn_factor = 40;
        c.yarn_original_max_position = 4096;
        c.yarn_mscale = 1.0;
        c.yarn_mscale_all_dim = 0.0;
        break;
    }
    return c;
}
enum { NUM_SHAPES = 5 };

static void test_shapes(void)
{
    static const clmla_attention_path all_paths[] = {CLMLA_PATH_ABSORBED, CLMLA_PATH_DECOMPRESSED, CLMLA_PATH_AUTO};
    const int T = 11, bt = 4; /* 11 tokens end mid-block */
    for (int s = 0; s < NUM_SHAPES; s++) {
        clmla_layer_config c = shape_config(s);
        char desc[200];
        tu_config_describe(&c, desc, sizeof(desc));
        tu_weights w;
        if (weights_or_fail(&w, &c, 1000 + (uint64_t)s, desc) != 0)
            continue;
        float *x = tu_random_inputs(T, c.hidden_size, 2000 + (uint64_t)s);
        tu_ref_run ref;
        CHECK(tu_ref_run_make(&ref, &w, T, x, MLA_REF_DECOMPRESSED) == 0, "%s: reference failed", desc);
        clmla_layer *layer = make_layer(&w, desc);
        if (layer && ref.out) {
            check_config_roundtrip(layer, &c, desc);
            check_memory(layer, &c, desc);
            /* Decode steps (1 token) take the absorbed path under AUTO (docs/MLA.md section 5). */
            int threshold = 0;
            CHECK_STATUS(clmla_layer_auto_threshold(layer, &threshold), CLMLA_SUCCESS, ctx);
            CHECK(threshold > 1, "%s: auto threshold %d", desc, threshold);
            for (int dt = 0; dt < 2; dt++) {
                float *outs[3] = {NULL, NULL, NULL};
                for (int p = 0; p < 3; p++) {
                    char what[300];
                    snprintf(what, sizeof(what), "%s, %s cache, %s prefill of %d", desc, dtype_name(dt),
                             path_name(all_paths[p]), T);
                    outs[p] = run_schedule(layer, &w, &ref, T, x, (clmla_cache_dtype)dt, bt, &T, 1, &all_paths[p], 1,
                                           what);
                }
                char what[300];
                snprintf(what, sizeof(what), "%s, %s cache: absorbed vs decompressed", desc, dtype_name(dt));
                check_agree(outs[0], outs[1], (size_t)T * c.hidden_size, c.hidden_size, (clmla_cache_dtype)dt, what);
                for (int p = 0; p < 3; p++)
                    free(outs[p]);
            }
            /* Prefill 7, then 4 single-token decode steps. */
            static const int chunks[] = {7, 1, 1, 1, 1};
            char what[300];
            snprintf(what, sizeof(what), "%s, f32 cache, prefill 7 + decode 4 (auto)", desc);
            free(run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F32, bt, chunks, 5, &all_paths[2], 1, what));
        }
        clmla_layer_destroy(layer);
        tu_ref_run_free(&ref);
        free(x);
        tu_weights_free(&w);
    }
}

/* ---- AUTO's choice ---------------------------------------------------------------------------- */

/* clmla_layer_auto_path: its refusals, the shape of its rule (for each prefix a number of tokens
   from which an entry goes decompressed, never 1; the layer's threshold after a long prefix; on CPU
   devices, and on others with attn_prefill_tiled, growing with the prefix from fewer tokens with
   none; on others with attn_prefill, falling from twice the threshold with none), and a forward
   step under AUTO taking the path it names: its output bit for bit that of the named path, run from
   the same cache contents (the two paths round differently, which the test checks first so that it
   can tell them apart). Each rule is run on any device (the layer made and run with the context's
   kind, and the latent tuning's prefill_tiled, set for it). */
typedef enum { RULE_CPU, RULE_OTHER, RULE_OTHER_TILED } auto_rule;

static void test_auto_path_kind(auto_rule rule)
{
    static const char *const rule_names[3] = {"CPU", "other, attn_prefill", "other, attn_prefill_tiled"};
    /* kv_lora_rank 64 against head dims 16 + 8 and 16: a threshold of 22 by the FLOPs, 57 on CPUs,
       696 on other devices with attn_prefill, 220 with attn_prefill_tiled (where with no prefix
       t (t + 1) / 2 >= 220 x 0.26 t from 114 tokens) */
    static const int expected_n[3] = {57, 696, 220}, expected_from0[3] = {16, 2 * 696 - 1, 114};
    const clmla_layer_config c = tu_small_config(48, 4, 16, 64, 16, 8, 16);
    const int D = c.hidden_size;
    tu_weights w;
    if (weights_or_fail(&w, &c, 4242, "auto path") != 0)
        return;
    clmla_layer *layer = make_layer(&w, "auto path");
    int n = 0;
    clmla_attention_path got = CLMLA_PATH_AUTO;
    if (layer) {
        CHECK_STATUS(clmla_layer_auto_threshold(layer, &n), CLMLA_SUCCESS, ctx);
        CHECK_STATUS(clmla_layer_auto_path(NULL, 0, 1, &got), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK_STATUS(clmla_layer_auto_path(layer, 0, 1, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK_STATUS(clmla_layer_auto_path(layer, -1, 4, &got), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(strstr(clmla_last_error(ctx), "prefix") != NULL, "auto path: the refusal does not name the prefix: %s",
              clmla_last_error(ctx));
        CHECK_STATUS(clmla_layer_auto_path(layer, 5, 0, &got), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(n == expected_n[rule], "auto path: threshold %d by the %s rule, expected %d", n, rule_names[rule],
              expected_n[rule]);
    }
    static const int prefixes[] = {0, 1, 5, 40, 300, 5000, 1 << 20};
    int from[7], previous = 0;
    /* The rule's shape apart from the scratch budget (test_decompressed_budget): decompressing the
       longest prefix takes 512 MiB of keys at this shape, past the budget of a device with less than
       4 GiB, which AUTO then keeps absorbed. The rule is a computation, so a larger device is
       pretended while it is asked. */
    const uint64_t real_alloc = ctx->info.max_alloc_bytes, real_mem = ctx->info.global_mem_bytes;
    ctx->info.global_mem_bytes = (uint64_t)64 << 30;
    ctx->info.max_alloc_bytes = (uint64_t)16 << 30;
    for (int i = 0; layer && i < 7; i++) {
        from[i] = -1;
        for (int t = 1; t <= 4 * n + 64; t++) {
            CHECK_STATUS(clmla_layer_auto_path(layer, prefixes[i], t, &got), CLMLA_SUCCESS, ctx);
            const int decompressed = got == CLMLA_PATH_DECOMPRESSED;
            CHECK(got == CLMLA_PATH_DECOMPRESSED || got == CLMLA_PATH_ABSORBED, "auto path: prefix %d, %d tokens: path %d",
                  prefixes[i], t, (int)got);
            if (decompressed && from[i] < 0)
                from[i] = t;
            CHECK(decompressed || from[i] < 0, "auto path: prefix %d: %d tokens absorbed, %d decompressed", prefixes[i], t,
                  from[i]);
        }
        if (rule != RULE_OTHER) {
            CHECK(from[i] > 1 && from[i] <= n, "auto path: prefix %d: decompressed from %d tokens (threshold %d)",
                  prefixes[i], from[i], n);
            CHECK(from[i] >= previous, "auto path: prefix %d: decompressed from %d tokens, a shorter prefix from %d",
                  prefixes[i], from[i], previous);
        } else {
            CHECK(from[i] >= n && from[i] <= 2 * n - 1, "auto path: prefix %d: decompressed from %d tokens (threshold %d)",
                  prefixes[i], from[i], n);
            CHECK(i == 0 || from[i] <= previous,
                  "auto path: prefix %d: decompressed from %d tokens, a shorter prefix from %d", prefixes[i], from[i],
                  previous);
        }
        previous = from[i];
    }
    ctx->info.max_alloc_bytes = real_alloc;
    ctx->info.global_mem_bytes = real_mem;
    if (layer) {
        /* after a long prefix: from n tokens (pairs >= n (p + c t), c < 1), or n + 1 (attn_prefill's
           rule: pairs >= (p + t) n) */
        CHECK(from[6] == n || (rule == RULE_OTHER && from[6] == n + 1),
              "auto path: after a long prefix decompressed from %d tokens, not the threshold %d", from[6], n);
        CHECK(from[0] == expected_from0[rule], "auto path, %s rule: threshold %d, with no prefix decompressed from %d tokens, expected %d",
              rule_names[rule], n, from[0], expected_from0[rule]);
    }

    /* (prefix, tokens): decompressed with no prefix, absorbed after a long one, and decompressed
       just past the boundary of a short one. */
    const int cases[3][2] = {{0, from[0] > 20 ? from[0] : 20}, {300, 20}, {40, from[3] > 0 ? from[3] : 20}};
    for (int k = 0; layer && k < 3; k++) {
        const int P = cases[k][0], T = cases[k][1], bt = 16;
        CHECK_STATUS(clmla_layer_auto_path(layer, P, T, &got), CLMLA_SUCCESS, ctx);
        char what[160];
        snprintf(what, sizeof(what), "auto path: %d tokens after %d (AUTO names %s)", T, P, path_name(got));
        float *x = tu_random_inputs(P + T, D, 77 + (uint64_t)k);
        float *prefix_out = malloc(((size_t)P + 1) * D * sizeof(float));
        float *outs[3];
        clmla_cache *cache = make_cache(&c, 1, bt, 3 * ((P + T + bt - 1) / bt + 1), CLMLA_CACHE_F32);
        static const clmla_attention_path paths[3] = {CLMLA_PATH_AUTO, CLMLA_PATH_ABSORBED, CLMLA_PATH_DECOMPRESSED};
        int ok = cache != NULL && x && prefix_out;
        for (int q = 0; q < 3; q++) {
            outs[q] = malloc((size_t)T * D * sizeof(float));
            ok = ok && outs[q];
        }
        for (int q = 0; ok && q < 3; q++) {
            const int32_t seq = add_seq(cache);
            for (int done = 0; ok && done < P; done += 100) { /* the same prefix in every sequence */
                const clmla_batch_entry e = {seq, P - done < 100 ? P - done : 100};
                ok = forward(layer, cache, 0, &e, 1, CLMLA_PATH_ABSORBED, x + (size_t)done * D,
                             prefix_out + (size_t)done * D) == CLMLA_SUCCESS;
            }
            const clmla_batch_entry e = {seq, T};
            ok = ok && forward(layer, cache, 0, &e, 1, paths[q], x + (size_t)P * D, outs[q]) == CLMLA_SUCCESS;
            CHECK(ok, "%s: %s step: %s", what, path_name(paths[q]), clmla_last_error(ctx));
        }
        if (ok) {
            const size_t bytes = (size_t)T * D * sizeof(float);
            CHECK(memcmp(outs[1], outs[2], bytes) != 0, "%s: the two paths gave the same bits; the test cannot tell them apart",
                  what);
            check_agree(outs[1], outs[2], (size_t)T * D, D, CLMLA_CACHE_F32, what);
            CHECK(memcmp(outs[0], outs[got == CLMLA_PATH_ABSORBED ? 1 : 2], bytes) == 0,
                  "%s: AUTO's output is not that path's", what);
            CHECK(memcmp(outs[0], outs[got == CLMLA_PATH_ABSORBED ? 2 : 1], bytes) != 0,
                  "%s: AUTO's output is the other path's", what);
        }
        for (int q = 0; q < 3; q++)
            free(outs[q]);
        clmla_cache_destroy(cache);
        free(prefix_out);
        free(x);
    }
    clmla_layer_destroy(layer);
    tu_weights_free(&w);
}

/* The decompressed path's scratch limits (docs/DESIGN.md, "Which path"), on a device pretending to
   have less memory. A key costs that path 800 bytes (its row gathered, 72 floats, and up-projected,
   4 heads of 16 + 16); the absorbed path holds 2048 a row, in pieces within the same budget.
   - An eighth of the memory 200000 bytes, the largest buffer as it is: AUTO keeps an entry
     absorbed where its decompressed scratch passes 200000 bytes (100 tokens after 200, 300 with no
     prefix: 240000), and decompressed where it fits (100 after 150: 200000); the CPU rule decides
     the rest (decompressed from 16 tokens with no prefix, after 57 past a long prefix).
   - The largest buffer 64 KiB (128 keys' up-projection): AUTO keeps 150 tokens absorbed; a step
     that names the decompressed path runs 100 keys and is refused at 150, naming the keys and the
     limit, with the sequence unchanged; AUTO's output for those 150 tokens is the absorbed path's,
     bit for bit. */
static void test_decompressed_budget(void)
{
    const clmla_layer_config c = tu_small_config(48, 4, 16, 64, 16, 8, 16);
    const int D = c.hidden_size, bt = 16;
    const clmla_device_kind real_kind = ctx->info.kind;
    const uint64_t real_alloc = ctx->info.max_alloc_bytes, real_mem = ctx->info.global_mem_bytes;
    tu_weights w;
    if (weights_or_fail(&w, &c, 4243, "decompressed budget") != 0)
        return;
    ctx->info.kind = CLMLA_DEVICE_KIND_CPU;
    clmla_layer *layer = make_layer(&w, "decompressed budget");
    clmla_cache *cache = make_cache(&c, 1, bt, 40, CLMLA_CACHE_F32);
    const int T = 150;
    float *x = tu_random_inputs(T, D, 4244);
    float *out[3] = {malloc((size_t)T * D * sizeof(float)), malloc((size_t)T * D * sizeof(float)),
                     malloc((size_t)T * D * sizeof(float))};
    if (layer && cache && x && out[0] && out[1] && out[2]) {
        clmla_attention_path got = CLMLA_PATH_AUTO;
        static const struct {
            int prefix, tokens;
            clmla_attention_path real, budget;
        } cases[] = {{100, 100, CLMLA_PATH_DECOMPRESSED, CLMLA_PATH_DECOMPRESSED},
                     {150, 100, CLMLA_PATH_DECOMPRESSED, CLMLA_PATH_DECOMPRESSED},
                     {200, 100, CLMLA_PATH_DECOMPRESSED, CLMLA_PATH_ABSORBED},
                     {5000, 100, CLMLA_PATH_DECOMPRESSED, CLMLA_PATH_ABSORBED},
                     {0, 300, CLMLA_PATH_DECOMPRESSED, CLMLA_PATH_ABSORBED},
                     {200, 8, CLMLA_PATH_ABSORBED, CLMLA_PATH_ABSORBED}};
        for (int budget = 0; budget < 2; budget++) {
            ctx->info.global_mem_bytes = budget ? 8 * 200000 : real_mem;
            for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                const clmla_attention_path want = budget ? cases[i].budget : cases[i].real;
                CHECK_STATUS(clmla_layer_auto_path(layer, cases[i].prefix, cases[i].tokens, &got), CLMLA_SUCCESS, ctx);
                CHECK(got == want, "decompressed budget: %d tokens after %d with %s: AUTO names %s, expected %s",
                      cases[i].tokens, cases[i].prefix, budget ? "a budget of 200000 bytes" : "the device's memory",
                      path_name(got), path_name(want));
            }
        }
        ctx->info.global_mem_bytes = real_mem;
        ctx->info.max_alloc_bytes = 64 * 1024;
        CHECK_STATUS(clmla_layer_auto_path(layer, 0, 128, &got), CLMLA_SUCCESS, ctx);
        CHECK(got == CLMLA_PATH_DECOMPRESSED, "decompressed budget: 128 keys within the largest buffer: AUTO names %s",
              path_name(got));
        CHECK_STATUS(clmla_layer_auto_path(layer, 0, T, &got), CLMLA_SUCCESS, ctx);
        CHECK(got == CLMLA_PATH_ABSORBED, "decompressed budget: %d keys past the largest buffer: AUTO names %s", T,
              path_name(got));
        /* named decompressed: 100 keys run, 150 are refused and change nothing */
        const int32_t s100 = add_seq(cache), s150 = add_seq(cache), s_auto = add_seq(cache), s_abs = add_seq(cache);
        const clmla_batch_entry e100 = {s100, 100}, e150 = {s150, T};
        CHECK_STATUS(forward(layer, cache, 0, &e100, 1, CLMLA_PATH_DECOMPRESSED, x, out[0]), CLMLA_SUCCESS, ctx);
        CHECK_STATUS(forward(layer, cache, 0, &e150, 1, CLMLA_PATH_DECOMPRESSED, x, out[0]), CLMLA_ERROR_UNSUPPORTED, ctx);
        const char *msg = clmla_last_error(ctx);
        CHECK(strstr(msg, "150 keys") && strstr(msg, "largest") && strstr(msg, "65536"),
              "decompressed budget: the refusal does not name the keys and the largest buffer: %s", msg);
        int len = -1;
        CHECK_STATUS(clmla_cache_seq_length(cache, s150, 0, &len), CLMLA_SUCCESS, ctx);
        CHECK(len == 0, "decompressed budget: the refused step left the sequence at %d tokens", len);
        const clmla_batch_entry ea = {s_auto, T}, eb = {s_abs, T};
        CHECK_STATUS(forward(layer, cache, 0, &ea, 1, CLMLA_PATH_AUTO, x, out[1]), CLMLA_SUCCESS, ctx);
        CHECK_STATUS(forward(layer, cache, 0, &eb, 1, CLMLA_PATH_ABSORBED, x, out[2]), CLMLA_SUCCESS, ctx);
        CHECK(memcmp(out[1], out[2], (size_t)T * D * sizeof(float)) == 0,
              "decompressed budget: AUTO's %d tokens are not the absorbed path's", T);
    }
    ctx->info.max_alloc_bytes = real_alloc;
    ctx->info.global_mem_bytes = real_mem;
    ctx->info.kind = real_kind;
    for (int i = 0; i < 3; i++)
        free(out[i]);
    free(x);
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    tu_weights_free(&w);
}

static void test_auto_path(void)
{
    const clmla_device_kind real = ctx->info.kind;
    for (int rule = RULE_CPU; rule <= RULE_OTHER_TILED; rule++) {
        ctx->info.kind = rule == RULE_CPU ? CLMLA_DEVICE_KIND_CPU : real == CLMLA_DEVICE_KIND_CPU ? CLMLA_DEVICE_KIND_GPU : real;
        clmla_latent_tuning t;
        clmla_latent_tuning_defaults(&t);
        t.prefill_tiled = rule == RULE_OTHER_TILED;
        CHECK_STATUS(clmla_context_set_latent_tuning(ctx, &t), CLMLA_SUCCESS, ctx);
        test_auto_path_kind((auto_rule)rule);
    }
    CHECK_STATUS(clmla_context_set_latent_tuning(ctx, NULL), CLMLA_SUCCESS, ctx);
    /* on CPUs the absorbed path's pairs count as faster where the tuning runs attn_latent_lanes (16
       heads or more): 16 heads, kv_lora_rank 64 against head dims 16 + 8 and 16, a threshold of 57
       with attn_latent_rows (absorbed pairs at 1.12 of the up-projection's rate), 153 with the lanes
       kernel (1.38) */
    ctx->info.kind = CLMLA_DEVICE_KIND_CPU;
    const clmla_layer_config c16 = tu_small_config(48, 16, 16, 64, 16, 8, 16);
    tu_weights w16;
    if (tu_weights_make(&w16, &c16, 4243) == 0) {
        for (int lanes = 0; lanes < 2; lanes++) {
            clmla_latent_tuning t;
            clmla_latent_tuning_defaults(&t);
            t.rows_lanes = lanes;
            CHECK_STATUS(clmla_context_set_latent_tuning(ctx, &t), CLMLA_SUCCESS, ctx);
            clmla_layer *layer = make_layer(&w16, "auto path, 16 heads");
            int n = 0;
            if (layer) {
                CHECK_STATUS(clmla_layer_auto_threshold(layer, &n), CLMLA_SUCCESS, ctx);
                CHECK(n == (lanes ? 153 : 57), "auto path, 16 heads, rows_lanes %d: threshold %d, expected %d", lanes, n,
                      lanes ? 153 : 57);
            }
            clmla_layer_destroy(layer);
        }
        tu_weights_free(&w16);
    } else
        CHECK(0, "auto path, 16 heads: out of host memory");
    CHECK_STATUS(clmla_context_set_latent_tuning(ctx, NULL), CLMLA_SUCCESS, ctx);
    ctx->info.kind = real;
}

/* ---- one long sequence, many ways ---------------------------------------------------------------- */

static void test_long(void)
{
    clmla_layer_config c = tu_small_config(48, 4, 16, 40, 16, 8, 16);
    c.yarn_factor = 40;
    c.yarn_mscale = 1.0;
    c.yarn_mscale_all_dim = 1.0;
    const int T = 250, bt = 16, D = c.hidden_size;
    char desc[200];
    tu_config_describe(&c, desc, sizeof(desc));
    tu_weights w;
    if (tu_weights_make(&w, &c, 3001) != 0)
        return;
    float *x = tu_random_inputs(T, D, 3002);
    tu_ref_run ref;
    CHECK(tu_ref_run_make(&ref, &w, T, x, MLA_REF_DECOMPRESSED) == 0, "reference failed");
    clmla_layer *layer = ref.out ? make_layer(&w, desc) : NULL;
    if (layer) {
        const clmla_attention_path ABS = CLMLA_PATH_ABSORBED, DEC = CLMLA_PATH_DECOMPRESSED, AUTO = CLMLA_PATH_AUTO;
        const clmla_attention_path alternate[] = {ABS, DEC};
        static const int mixed[] = {7, 13, 23};
        int decode_abs[201], decode_dec[31], decode_auto[151];
        decode_abs[0] = 50;
        for (int i = 1; i < 201; i++)
            decode_abs[i] = 1;
        decode_dec[0] = 120;
        for (int i = 1; i < 31; i++)
            decode_dec[i] = 1;
        decode_auto[0] = 100;
        for (int i = 1; i < 151; i++)
            decode_auto[i] = 1;
        clmla_attention_path decode_paths[201]; /* the prefill decompressed, the decode steps absorbed */
        decode_paths[0] = DEC;
        for (int i = 1; i < 201; i++)
            decode_paths[i] = ABS;

        float *prefill_abs = run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F32, bt, &T, 1, &ABS, 1,
                                          "T=250 f32: one absorbed prefill");
        float *prefill_dec = run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F32, bt, &T, 1, &DEC, 1,
                                          "T=250 f32: one decompressed prefill");
        check_agree(prefill_abs, prefill_dec, (size_t)T * D, D, CLMLA_CACHE_F32, "T=250: absorbed vs decompressed");
        float *chunk_abs = run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F32, bt, mixed, 3, &ABS, 1,
                                        "T=250 f32: absorbed chunks 7/13/23");
        check_agree(chunk_abs, prefill_abs, (size_t)T * D, D, CLMLA_CACHE_F32, "T=250: absorbed chunks vs prefill");
        float *chunk_dec = run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F32, bt, mixed, 3, &DEC, 1,
                                        "T=250 f32: decompressed chunks 7/13/23");
        check_agree(chunk_dec, prefill_dec, (size_t)T * D, D, CLMLA_CACHE_F32, "T=250: decompressed chunks vs prefill");
        float *chunk_alt = run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F32, bt, mixed, 3, alternate, 2,
                                        "T=250 f32: chunks 7/13/23, paths alternating");
        check_agree(chunk_alt, prefill_abs, (size_t)T * D, D, CLMLA_CACHE_F32, "T=250: alternating chunks vs prefill");
        float *decode = run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F32, bt, decode_abs, 201, decode_paths, 201,
                                     "T=250 f32: decompressed prefill 50 + 200 absorbed decode steps");
        check_agree(decode, prefill_abs, (size_t)T * D, D, CLMLA_CACHE_F32, "T=250: prefill+decode vs prefill");

        /* Decode on the decompressed path too (150 tokens: the first 150 rows of the reference). */
        const int T2 = 150;
        float *decode_d = run_schedule(layer, &w, &ref, T2, x, CLMLA_CACHE_F32, bt, decode_dec, 31, &DEC, 1,
                                       "T=150 f32: decompressed prefill 120 + 30 decompressed decode steps");
        check_agree(decode_d, prefill_abs, (size_t)T2 * D, D, CLMLA_CACHE_F32, "T=150: decompressed decode vs prefill");

        /* Half-precision cache. */
        float *f16_chunks = run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F16, bt, mixed, 3, alternate, 2,
                                         "T=250 f16: chunks 7/13/23, paths alternating");
        float *f16_decode = run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F16, bt, decode_auto, 151, &AUTO, 1,
                                         "T=250 f16: prefill 100 + 150 decode steps (auto)");
        check_agree(f16_decode, f16_chunks, (size_t)T * D, D, CLMLA_CACHE_F16, "T=250 f16: decode vs chunks");

        free(prefill_abs);
        free(prefill_dec);
        free(chunk_abs);
        free(chunk_dec);
        free(chunk_alt);
        free(decode);
        free(decode_d);
        free(f16_chunks);
        free(f16_decode);
    }
    clmla_layer_destroy(layer);
    tu_ref_run_free(&ref);
    free(x);
    tu_weights_free(&w);
}

/* ---- batches ------------------------------------------------------------------------------------- */

enum { BATCH_SEQS = 5, BATCH_STEPS = 5 };

/* tokens[step][seq]: 0 = the sequence is not in the step. Entry order within a step is `order`. */
static const int batch_tokens[BATCH_STEPS][BATCH_SEQS] = {
    {21, 0, 8, 1, 13}, /* prefill chunks, one exactly a block (bt 8), one of 1 token */
    {1, 17, 1, 5, 1},  /* decode entries beside a new prefill and a chunk */
    {1, 1, 1, 1, 1},   /* pure decode */
    {0, 1, 9, 0, 30},  /* some sequences sit out */
    {12, 0, 0, 1, 1},
};
static const int batch_order[BATCH_STEPS][BATCH_SEQS] = {
    {4, 0, 3, 2, 1}, {3, 0, 1, 4, 2}, {2, 4, 0, 1, 3}, {4, 2, 1, 0, 3}, {0, 3, 4, 1, 2}};

static void test_batch(void)
{
    clmla_layer_config c = shape_config(1);
    const int D = c.hidden_size, bt = 8;
    char desc[200];
    tu_config_describe(&c, desc, sizeof(desc));
    tu_weights w;
    if (tu_weights_make(&w, &c, 4001) != 0)
        return;
    int total[BATCH_SEQS] = {0};
    for (int st = 0; st < BATCH_STEPS; st++)
        for (int s = 0; s < BATCH_SEQS; s++)
            total[s] += batch_tokens[st][s];
    float *xs[BATCH_SEQS];
    tu_ref_run refs[BATCH_SEQS];
    int ok = 1;
    for (int s = 0; s < BATCH_SEQS; s++) {
        xs[s] = tu_random_inputs(total[s], D, 4100 + (uint64_t)s);
        ok &= tu_ref_run_make(&refs[s], &w, total[s], xs[s], MLA_REF_DECOMPRESSED) == 0;
    }
    CHECK(ok, "batch reference failed");
    clmla_layer *layer = ok ? make_layer(&w, desc) : NULL;

    static const clmla_attention_path paths[] = {CLMLA_PATH_ABSORBED, CLMLA_PATH_DECOMPRESSED, CLMLA_PATH_AUTO,
                                                 CLMLA_PATH_AUTO};
    for (int run = 0; run < 4 && layer; run++) {
        const clmla_attention_path path = paths[run];
        const clmla_cache_dtype dt = run == 3 ? CLMLA_CACHE_F16 : CLMLA_CACHE_F32;
        clmla_cache *batched = make_cache(&c, 1, bt, 40, dt), *alone = make_cache(&c, 1, bt, 40, dt);
        if (!batched || !alone) {
            clmla_cache_destroy(batched);
            clmla_cache_destroy(alone);
            break;
        }
        int32_t id_b[BATCH_SEQS], id_a[BATCH_SEQS];
        for (int s = 0; s < BATCH_SEQS; s++) {
            id_b[s] = add_seq(batched);
            id_a[s] = add_seq(alone);
        }
        int pos[BATCH_SEQS] = {0};
        for (int st = 0; st < BATCH_STEPS; st++) {
            clmla_batch_entry entries[BATCH_SEQS];
            int first_row[BATCH_SEQS], n_entries = 0, rows = 0;
            for (int k = 0; k < BATCH_SEQS; k++) {
                int s = batch_order[st][k];
                if (batch_tokens[st][s] == 0)
                    continue;
                entries[n_entries].seq_id = id_b[s];
                entries[n_entries].num_tokens = batch_tokens[st][s];
                first_row[s] = rows;
                rows += batch_tokens[st][s];
                n_entries++;
            }
            float *x = malloc((size_t)rows * D * sizeof(float)), *out = malloc((size_t)rows * D * sizeof(float));
            for (int s = 0; s < BATCH_SEQS; s++)
                if (batch_tokens[st][s])
                    memcpy(x + (size_t)first_row[s] * D, xs[s] + (size_t)pos[s] * D,
                           (size_t)batch_tokens[st][s] * D * sizeof(float));
            clmla_status status = forward(layer, batched, 0, entries, n_entries, path, x, out);
            CHECK(status == CLMLA_SUCCESS, "batch %s %s step %d (%d entries, %d rows): %s: %s", path_name(path),
                  dtype_name(dt), st, n_entries, rows, clmla_status_string(status), clmla_last_error(ctx));
            for (int k = 0; k < BATCH_SEQS && status == CLMLA_SUCCESS; k++) {
                int s = batch_order[st][k], n = batch_tokens[st][s];
                if (n == 0)
                    continue;
                /* The same tokens of this sequence on its own. */
                float *own = malloc((size_t)n * D * sizeof(float));
                clmla_batch_entry e = {id_a[s], n};
                clmla_status st2 = forward(layer, alone, 0, &e, 1, path, xs[s] + (size_t)pos[s] * D, own);
                CHECK(st2 == CLMLA_SUCCESS, "alone: %s", clmla_last_error(ctx));
                char what[200];
                snprintf(what, sizeof(what), "batch %s %s step %d seq %d (tokens %d..%d)", path_name(path),
                         dtype_name(dt), st, s, pos[s], pos[s] + n - 1);
                const float *got = out + (size_t)first_row[s] * D;
                CHECK_CLOSE(got, refs[s].out + (size_t)pos[s] * D, (size_t)n * D, D, TOL_FOR_DTYPE(dt),
                            "%s vs reference [token, i]", what);
                if (st2 == CLMLA_SUCCESS) {
                    strncat(what, " vs alone", sizeof(what) - strlen(what) - 1);
                    check_agree(got, own, (size_t)n * D, D, dt, what);
                }
                free(own);
            }
            for (int s = 0; s < BATCH_SEQS; s++)
                pos[s] += batch_tokens[st][s];
            free(x);
            free(out);
        }
        for (int s = 0; s < BATCH_SEQS; s++) {
            char what[120];
            snprintf(what, sizeof(what), "batch %s %s: cache of seq %d", path_name(path), dtype_name(dt), s);
            check_cache(batched, 0, id_b[s], 0, total[s], &refs[s], &c, dt, what);
        }
        clmla_cache_destroy(batched);
        clmla_cache_destroy(alone);
    }
    clmla_layer_destroy(layer);
    for (int s = 0; s < BATCH_SEQS; s++) {
        tu_ref_run_free(&refs[s]);
        free(xs[s]);
    }
    tu_weights_free(&w);
}

/* ---- two layers, one cache --------------------------------------------------------------------- */

static void test_two_layers(void)
{
    /* Same latent sizes (the cache's), different everything else. */
    clmla_layer_config c0 = shape_config(0), c1 = shape_config(1);
    c1.rope_pairing = c0.rope_pairing;
    tu_weights w0, w1;
    if (tu_weights_make(&w0, &c0, 5001) != 0)
        return;
    if (tu_weights_make(&w1, &c1, 5002) != 0) {
        tu_weights_free(&w0);
        return;
    }
    const int T = 12, bt = 4;
    float *x0 = tu_random_inputs(T, c0.hidden_size, 5003), *x1 = tu_random_inputs(T, c1.hidden_size, 5004);
    tu_ref_run r0, r1;
    int ok = tu_ref_run_make(&r0, &w0, T, x0, MLA_REF_DECOMPRESSED) == 0;
    ok &= tu_ref_run_make(&r1, &w1, T, x1, MLA_REF_DECOMPRESSED) == 0;
    clmla_layer *l0 = ok ? make_layer(&w0, "layer 0") : NULL, *l1 = ok ? make_layer(&w1, "layer 1") : NULL;
    clmla_cache *cache = make_cache(&c0, 2, bt, 4, CLMLA_CACHE_F32);
    if (l0 && l1 && cache) {
        int32_t seq = add_seq(cache);
        float *o0 = malloc((size_t)T * c0.hidden_size * sizeof(float));
        float *o1 = malloc((size_t)T * c1.hidden_size * sizeof(float));
        /* 9 tokens through layer 0, then layer 1, then 3 decode steps through both. */
        int done = 0;
        for (int step = 0; step < 4; step++) {
            int n = step == 0 ? 9 : 1;
            clmla_batch_entry e = {seq, n};
            CHECK_STATUS(forward(l0, cache, 0, &e, 1, CLMLA_PATH_AUTO, x0 + (size_t)done * c0.hidden_size,
                                 o0 + (size_t)done * c0.hidden_size),
                         CLMLA_SUCCESS, ctx);
            int len0 = -1, len1 = -1;
            clmla_cache_seq_length(cache, seq, 0, &len0);
            clmla_cache_seq_length(cache, seq, 1, &len1);
            CHECK(len0 == done + n && len1 == done, "after layer 0: lengths %d / %d, expected %d / %d", len0, len1,
                  done + n, done);
            CHECK_STATUS(forward(l1, cache, 1, &e, 1, CLMLA_PATH_AUTO, x1 + (size_t)done * c1.hidden_size,
                                 o1 + (size_t)done * c1.hidden_size),
                         CLMLA_SUCCESS, ctx);
            done += n;
        }
        CHECK_CLOSE(o0, r0.out, (size_t)T * c0.hidden_size, c0.hidden_size, TOL_F32_CACHE, "two layers: layer 0 out");
        CHECK_CLOSE(o1, r1.out, (size_t)T * c1.hidden_size, c1.hidden_size, TOL_F32_CACHE, "two layers: layer 1 out");
        check_cache(cache, 0, seq, 0, T, &r0, &c0, CLMLA_CACHE_F32, "two layers: cache layer 0");
        check_cache(cache, 1, seq, 0, T, &r1, &c1, CLMLA_CACHE_F32, "two layers: cache layer 1");
        clmla_cache_info info;
        clmla_cache_get_info(cache, &info);
        CHECK(info.blocks_used == 3, "two layers share blocks: %d used, expected 3", info.blocks_used);
        free(o0);
        free(o1);
    }
    clmla_cache_destroy(cache);
    clmla_layer_destroy(l0);
    clmla_layer_destroy(l1);
    if (ok) {
        tu_ref_run_free(&r0);
        tu_ref_run_free(&r1);
    }
    free(x0);
    free(x1);
    tu_weights_free(&w0);
    tu_weights_free(&w1);
}

/* ---- the device-buffer entry point ------------------------------------------------------------- */

/* clmla_layer_forward_cl with x and out at offsets inside larger buffers, chained by its event:
   rows outside [offset, offset + T*D) stay as they were, and out is the reference's. */
static void test_forward_cl(void)
{
    clmla_layer_config c = shape_config(2);
    const int D = c.hidden_size, T = 9;
    tu_weights w;
    if (tu_weights_make(&w, &c, 8001) != 0)
        return;
    float *x = tu_random_inputs(T, D, 8002);
    tu_ref_run ref;
    int ok = tu_ref_run_make(&ref, &w, T, x, MLA_REF_DECOMPRESSED) == 0;
    clmla_layer *layer = ok ? make_layer(&w, "forward_cl") : NULL;
    clmla_cache *cache = make_cache(&c, 1, 4, 4, CLMLA_CACHE_F32);
    if (layer && cache) {
        int32_t seq = add_seq(cache);
        const size_t x_off = 7, out_off = 3, n = (size_t)T * D, pad = 5;
        const float sentinel = -4242.0f;
        float *xh = malloc((x_off + n) * sizeof(float)), *oh = malloc((out_off + n + pad) * sizeof(float));
        memcpy(xh + x_off, x, n * sizeof(float));
        for (size_t i = 0; i < x_off; i++)
            xh[i] = NAN; /* not part of x */
        for (size_t i = 0; i < out_off + n + pad; i++)
            oh[i] = sentinel;
        cl_int err;
        cl_context cl = clmla_context_cl_context(ctx);
        cl_mem xb = clCreateBuffer(cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (x_off + n) * sizeof(float), xh, &err);
        cl_mem ob = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, (out_off + n + pad) * sizeof(float),
                                   oh, &err);
        /* 6 tokens, then 3 decode steps: offsets move with the rows. */
        int done = 0;
        for (int step = 0; step < 4; step++) {
            int k = step == 0 ? 6 : 1;
            clmla_batch_entry e = {seq, k};
            clmla_forward_args a = {&e, 1, 0, step == 0 ? CLMLA_PATH_DECOMPRESSED : CLMLA_PATH_ABSORBED};
            cl_event ev = NULL;
            clmla_status st = clmla_layer_forward_cl(layer, cache, &a, xb, x_off + (size_t)done * D, ob,
                                                     out_off + (size_t)done * D, &ev);
            CHECK(st == CLMLA_SUCCESS && ev, "forward_cl step %d: %s: %s", step, clmla_status_string(st),
                  clmla_last_error(ctx));
            if (ev) {
                CHECK(clWaitForEvents(1, &ev) == CL_SUCCESS, "wait for forward_cl");
                clReleaseEvent(ev);
            }
            done += k;
        }
        clEnqueueReadBuffer(clmla_context_queue(ctx), ob, CL_TRUE, 0, (out_off + n + pad) * sizeof(float), oh, 0, NULL,
                            NULL);
        const int outside = tu_count_outside(oh, out_off + n + pad, out_off, n, sentinel);
        CHECK(outside == 0, "forward_cl wrote %d values outside out", outside);
        CHECK_CLOSE(oh + out_off, ref.out, n, D, TOL_F32_CACHE, "forward_cl out [token, i] vs reference");
        check_cache(cache, 0, seq, 0, T, &ref, &c, CLMLA_CACHE_F32, "forward_cl");
        clmla_forward_args a = {NULL, 0, 0, CLMLA_PATH_AUTO};
        clmla_batch_entry e = {seq, 1};
        a.entries = &e;
        a.num_entries = 1;
        CHECK_STATUS(clmla_layer_forward_cl(layer, cache, &a, NULL, 0, ob, 0, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK_STATUS(clmla_layer_forward_cl(layer, cache, &a, xb, 0, NULL, 0, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        int len = -1;
        clmla_cache_seq_length(cache, seq, 0, &len);
        CHECK(len == T, "forward_cl: length %d after failed calls, expected %d", len, T);
        clReleaseMemObject(xb);
        clReleaseMemObject(ob);
        free(xh);
        free(oh);
    }
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    if (ok)
        tu_ref_run_free(&ref);
    free(x);
    tu_weights_free(&w);
}

/* ---- errors ---------------------------------------------------------------------------------------- */

/* The lengths and contents of some sequences, to show that a failed call changed nothing. */
typedef struct snapshot {
    int n;
    int32_t ids[4];
    int len[4];
    float *rows[4]; /* [len, rkv + dr]: c^KV then k^R */
    int blocks_used;
} snapshot;

static void snap_take(snapshot *s, clmla_cache *cache, const int32_t *ids, int n, int rkv, int dr)
{
    memset(s, 0, sizeof(*s));
    s->n = n;
    for (int i = 0; i < n; i++) {
        s->ids[i] = ids[i];
        clmla_cache_seq_length(cache, ids[i], 0, &s->len[i]);
        s->rows[i] = malloc(((size_t)s->len[i] * (rkv + dr) + 1) * sizeof(float));
        if (s->len[i] > 0)
            clmla_cache_read(cache, 0, ids[i], 0, s->len[i], s->rows[i], s->rows[i] + (size_t)s->len[i] * rkv);
    }
    clmla_cache_info info;
    clmla_cache_get_info(cache, &info);
    s->blocks_used = info.blocks_used;
}

static void snap_free(snapshot *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->rows[i]);
}

/* Compares the cache with a snapshot; `what` names the failed call. */
static void snap_same(const snapshot *before, clmla_cache *cache, int rkv, int dr, const char *what)
{
    snapshot now;
    snap_take(&now, cache, before->ids, before->n, rkv, dr);
    for (int i = 0; i < before->n; i++) {
        CHECK(now.len[i] == before->len[i], "after %s: seq %d length %d, was %d", what, (int)before->ids[i], now.len[i],
              before->len[i]);
        if (now.len[i] == before->len[i])
            CHECK(memcmp(now.rows[i], before->rows[i], (size_t)now.len[i] * (rkv + dr) * sizeof(float)) == 0,
                  "after %s: seq %d contents changed", what, (int)before->ids[i]);
    }
    CHECK(now.blocks_used == before->blocks_used, "after %s: %d blocks used, was %d", what, now.blocks_used,
          before->blocks_used);
    snap_free(&now);
}

/* layer_create with one thing wrong: the status, the words the message must hold, and no layer. */
static void expect_create_fails(const clmla_layer_config *c, const clmla_layer_weights *lw, clmla_status want,
                                const char *what, const char *const *words, int num_words)
{
    clmla_layer *layer = NULL;
    clmla_status st = clmla_layer_create(ctx, c, lw, &layer);
    CHECK(st == want, "%s: status %s, expected %s: %s", what, clmla_status_string(st), clmla_status_string(want),
          clmla_last_error(ctx));
    CHECK(layer == NULL, "%s: a layer was made anyway", what);
    const char *msg = clmla_last_error(ctx);
    for (int i = 0; i < num_words && st == want; i++)
        CHECK(strstr(msg, words[i]) != NULL, "%s: message lacks '%s': %s", what, words[i], msg);
    clmla_layer_destroy(layer);
}

static void test_create_errors(void)
{
    clmla_layer_config c = shape_config(1); /* with q_lora */
    clmla_layer_config c_noq = shape_config(0);
    tu_weights w, wn;
    if (tu_weights_make(&w, &c, 6001) != 0)
        return;
    if (tu_weights_make(&wn, &c_noq, 6002) != 0) {
        tu_weights_free(&w);
        return;
    }
    const int H = c.num_heads, dq = c.qk_nope_head_dim + c.qk_rope_head_dim;
    const int rows = H * (c.qk_nope_head_dim + c.v_head_dim), rkv = c.kv_lora_rank;
    char n1[32], n2[32], n3[32], n4[32];

    /* kv_b_proj with 5 extra rows: the name, the expected and the given shape. */
    clmla_layer_weights lw = w.layer;
    lw.kv_b_proj.shape[0] = rows + 5;
    snprintf(n1, sizeof(n1), "%d", rows);
    snprintf(n2, sizeof(n2), "%d", rows + 5);
    snprintf(n3, sizeof(n3), "%d", rkv);
    const char *kvb_words[] = {"kv_b_proj", n1, n2, n3};
    expect_create_fails(&c, &lw, CLMLA_ERROR_SHAPE_MISMATCH, "kv_b_proj [rows+5, rkv]", kvb_words, 4);

    /* q_b_proj transposed. */
    lw = w.layer;
    lw.q_b_proj = clmla_tensor_2d(w.q_b_proj, c.q_lora_rank, (int64_t)H * dq);
    snprintf(n1, sizeof(n1), "%d", H * dq);
    snprintf(n2, sizeof(n2), "%d", c.q_lora_rank);
    const char *qb_words[] = {"q_b_proj", n1, n2};
    expect_create_fails(&c, &lw, CLMLA_ERROR_SHAPE_MISMATCH, "q_b_proj transposed", qb_words, 3);

    /* kv_a_proj_with_mqa without its rope rows. */
    lw = w.layer;
    lw.kv_a_proj_with_mqa.shape[0] = rkv;
    snprintf(n1, sizeof(n1), "%d", rkv + c.qk_rope_head_dim);
    const char *kva_words[] = {"kv_a_proj_with_mqa", n1};
    expect_create_fails(&c, &lw, CLMLA_ERROR_SHAPE_MISMATCH, "kv_a_proj_with_mqa [rkv, D]", kva_words, 2);

    /* o_proj given as 1-D. */
    lw = w.layer;
    lw.o_proj = clmla_tensor_1d(w.o_proj, (int64_t)c.hidden_size * H * c.v_head_dim);
    const char *o_words[] = {"o_proj"};
    expect_create_fails(&c, &lw, CLMLA_ERROR_SHAPE_MISMATCH, "o_proj 1-D", o_words, 1);

    /* A norm weight one too long, and a norm weight given as 2-D. */
    lw = w.layer;
    lw.kv_a_layernorm.shape[0] = rkv + 1;
    snprintf(n4, sizeof(n4), "%d", rkv + 1);
    const char *norm_words[] = {"kv_a_layernorm", n3, n4};
    expect_create_fails(&c, &lw, CLMLA_ERROR_SHAPE_MISMATCH, "kv_a_layernorm [rkv+1]", norm_words, 3);
    lw = w.layer;
    lw.q_a_layernorm = clmla_tensor_2d(w.q_a_layernorm, 1, c.q_lora_rank);
    const char *qn_words[] = {"q_a_layernorm"};
    expect_create_fails(&c, &lw, CLMLA_ERROR_SHAPE_MISMATCH, "q_a_layernorm [1, rq]", qn_words, 1);

    /* Missing tensors, named. */
    lw = w.layer;
    lw.o_proj.data = NULL;
    expect_create_fails(&c, &lw, CLMLA_ERROR_MISSING_TENSOR, "o_proj missing", o_words, 1);
    lw = w.layer;
    lw.q_a_layernorm.data = NULL;
    expect_create_fails(&c, &lw, CLMLA_ERROR_MISSING_TENSOR, "q_a_layernorm missing", qn_words, 1);
    lw = w.layer;
    memset(&lw.kv_b_proj, 0, sizeof(lw.kv_b_proj));
    const char *kvb_name[] = {"kv_b_proj"};
    expect_create_fails(&c, &lw, CLMLA_ERROR_MISSING_TENSOR, "kv_b_proj zeroed", kvb_name, 1);
    lw = wn.layer;
    lw.q_proj.data = NULL;
    const char *q_words[] = {"q_proj"};
    expect_create_fails(&c_noq, &lw, CLMLA_ERROR_MISSING_TENSOR, "q_proj missing (rq 0)", q_words, 1);
    lw = w.layer;
    lw.q_b_proj.data = NULL;
    const char *qb_name[] = {"q_b_proj"};
    expect_create_fails(&c, &lw, CLMLA_ERROR_MISSING_TENSOR, "q_b_proj missing (rq > 0)", qb_name, 1);

    /* q_proj beside q_lora_rank > 0, and q_a_proj beside q_lora_rank 0: contradictory inputs. */
    lw = w.layer;
    lw.q_proj = wn.layer.q_proj;
    expect_create_fails(&c, &lw, CLMLA_ERROR_INVALID_ARGUMENT, "q_proj given with q_lora_rank > 0", q_words, 1);
    lw = wn.layer;
    lw.q_a_proj = w.layer.q_a_proj;
    const char *qa_words[] = {"q_a_proj"};
    expect_create_fails(&c_noq, &lw, CLMLA_ERROR_INVALID_ARGUMENT, "q_a_proj given with q_lora_rank 0", qa_words, 1);

    /* Invalid configurations. */
    clmla_layer_config bad = c;
    bad.qk_rope_head_dim = 7;
    expect_create_fails(&bad, &w.layer, CLMLA_ERROR_INVALID_CONFIG, "odd rope dim", NULL, 0);
    bad = c;
    bad.num_heads = 0;
    expect_create_fails(&bad, &w.layer, CLMLA_ERROR_INVALID_CONFIG, "zero heads", NULL, 0);
    bad = c;
    bad.hidden_size = 1 << 30;
    bad.num_heads = 1 << 30;
    expect_create_fails(&bad, &w.layer, CLMLA_ERROR_INVALID_CONFIG, "hidden 2^30 x heads 2^30", NULL, 0);

    /* NULL pointers. */
    clmla_layer *layer = NULL;
    CHECK_STATUS(clmla_layer_create(NULL, &c, &w.layer, &layer), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_layer_create(ctx, NULL, &w.layer, &layer), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_layer_create(ctx, &c, NULL, &layer), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_layer_create(ctx, &c, &w.layer, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(layer == NULL, "a layer was made with a NULL argument");
    clmla_layer_destroy(NULL);

    /* And the untouched weights do make a layer (so the failures above came from the one change). */
    layer = make_layer(&w, "valid weights");
    clmla_layer_destroy(layer);
    layer = make_layer(&wn, "valid weights, no q_lora");
    clmla_layer_config got;
    CHECK_STATUS(clmla_layer_get_config(NULL, &got), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    if (layer)
        CHECK_STATUS(clmla_layer_get_config(layer, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    clmla_layer_destroy(layer);
    tu_weights_free(&w);
    tu_weights_free(&wn);
}

static void test_forward_errors(void)
{
    clmla_layer_config c = shape_config(1);
    const int D = c.hidden_size, rkv = c.kv_lora_rank, dr = c.qk_rope_head_dim, bt = 4;
    tu_weights w;
    if (tu_weights_make(&w, &c, 7001) != 0)
        return;
    /* Two sequences: a gets 5 + 2 (+1 after the failures), b gets 3 (+1). */
    const int Ta = 8, Tb = 4;
    float *xa = tu_random_inputs(Ta, D, 7002), *xb = tu_random_inputs(Tb, D, 7003);
    tu_ref_run ra, rb;
    int ok = tu_ref_run_make(&ra, &w, Ta, xa, MLA_REF_DECOMPRESSED) == 0;
    ok &= tu_ref_run_make(&rb, &w, Tb, xb, MLA_REF_DECOMPRESSED) == 0;
    clmla_layer *layer = ok ? make_layer(&w, "forward errors") : NULL;
    clmla_cache *cache = make_cache(&c, 1, bt, 4, CLMLA_CACHE_F32); /* 16 tokens in all */
    if (layer && cache) {
        int32_t a = add_seq(cache), b = add_seq(cache), ids[2] = {a, b};
        float out[64 * 64], x[64 * 64] = {0};
        clmla_batch_entry first[2] = {{a, 5}, {b, 3}};
        memcpy(x, xa, (size_t)5 * D * sizeof(float));
        memcpy(x + 5 * D, xb, (size_t)3 * D * sizeof(float));
        CHECK_STATUS(forward(layer, cache, 0, first, 2, CLMLA_PATH_AUTO, x, out), CLMLA_SUCCESS, ctx);
        CHECK_CLOSE(out, ra.out, (size_t)5 * D, D, TOL_F32_CACHE, "errors setup: seq a");
        CHECK_CLOSE(out + 5 * D, rb.out, (size_t)3 * D, D, TOL_F32_CACHE, "errors setup: seq b");
        /* The next step would be: a 2 tokens, b 1 token. x holds those rows. */
        memcpy(x, xa + 5 * D, (size_t)2 * D * sizeof(float));
        memcpy(x + 2 * D, xb + 3 * D, (size_t)D * sizeof(float));

        snapshot before;
        snap_take(&before, cache, ids, 2, rkv, dr);
        CHECK(before.len[0] == 5 && before.len[1] == 3, "setup lengths %d %d", before.len[0], before.len[1]);
        struct {
            clmla_batch_entry e[3];
            int n;
            clmla_status want;
            const char *what;
        } bad[] = {
            {{{a, 2}, {99, 1}}, 2, CLMLA_ERROR_UNKNOWN_SEQUENCE, "an unknown sequence beside a good one"},
            {{{a, 2}, {-1, 1}}, 2, CLMLA_ERROR_UNKNOWN_SEQUENCE, "sequence -1"},
            {{{a, 2}, {b, 0}}, 2, CLMLA_ERROR_INVALID_ARGUMENT, "an entry of zero tokens"},
            {{{a, 2}, {b, -1}}, 2, CLMLA_ERROR_INVALID_ARGUMENT, "an entry of -1 tokens"},
            {{{a, 2}, {a, 1}}, 2, CLMLA_ERROR_INVALID_ARGUMENT, "the same sequence twice"},
            {{{b, 1}, {a, 1}, {b, 1}}, 3, CLMLA_ERROR_INVALID_ARGUMENT, "the same sequence twice, apart"},
            {{{a, 2}, {b, 1}}, 0, CLMLA_ERROR_INVALID_ARGUMENT, "zero entries"},
            {{{a, 2}, {b, 1}}, -1, CLMLA_ERROR_INVALID_ARGUMENT, "-1 entries"},
            /* a fits its 2 blocks, b needs 3 more blocks with 1 free: nothing at all may be appended. */
            {{{a, 2}, {b, 13}}, 2, CLMLA_ERROR_CACHE_FULL, "a full cache"},
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            clmla_status st = forward(layer, cache, 0, bad[i].e, bad[i].n, CLMLA_PATH_AUTO, x, out);
            CHECK(st == bad[i].want, "%s: status %s, expected %s: %s", bad[i].what, clmla_status_string(st),
                  clmla_status_string(bad[i].want), clmla_last_error(ctx));
            snap_same(&before, cache, rkv, dr, bad[i].what);
        }
        /* The full-cache case on each path (the decompressed path may allocate differently). */
        clmla_batch_entry full[2] = {{a, 2}, {b, 13}};
        for (int p = 1; p <= 2; p++) {
            CHECK_STATUS(forward(layer, cache, 0, full, 2, (clmla_attention_path)p, x, out), CLMLA_ERROR_CACHE_FULL,
                         ctx);
            snap_same(&before, cache, rkv, dr, "a full cache, explicit path");
        }

        clmla_batch_entry good[2] = {{a, 2}, {b, 1}};
        clmla_forward_args args = {good, 2, 0, CLMLA_PATH_AUTO};
        CHECK_STATUS(clmla_layer_forward(NULL, cache, &args, x, out), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
        snap_same(&before, cache, rkv, dr, "NULL layer");
        CHECK_STATUS(clmla_layer_forward(layer, NULL, &args, x, out), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK_STATUS(clmla_layer_forward(layer, cache, NULL, x, out), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK_STATUS(clmla_layer_forward(layer, cache, &args, NULL, out), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        snap_same(&before, cache, rkv, dr, "NULL x");
        CHECK_STATUS(clmla_layer_forward(layer, cache, &args, x, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        snap_same(&before, cache, rkv, dr, "NULL out");
        args.entries = NULL;
        CHECK_STATUS(clmla_layer_forward(layer, cache, &args, x, out), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        args.entries = good;
        args.cache_layer = 1;
        CHECK_STATUS(clmla_layer_forward(layer, cache, &args, x, out), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        args.cache_layer = -1;
        CHECK_STATUS(clmla_layer_forward(layer, cache, &args, x, out), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        args.cache_layer = 0;
        args.path = (clmla_attention_path)7;
        CHECK_STATUS(clmla_layer_forward(layer, cache, &args, x, out), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        args.path = CLMLA_PATH_AUTO;
        snap_same(&before, cache, rkv, dr, "bad cache layer / path");

        /* A cache whose rows are not this layer's (rkv + 1): their shape does not match. */
        clmla_cache_config other = {1, rkv + 1, dr, bt, 4, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
        clmla_cache *wrong = NULL;
        if (clmla_cache_create(ctx, &other, &wrong) == CLMLA_SUCCESS) {
            int32_t s = add_seq(wrong);
            clmla_batch_entry e = {s, 1};
            clmla_forward_args wa = {&e, 1, 0, CLMLA_PATH_AUTO};
            CHECK_STATUS(clmla_layer_forward(layer, wrong, &wa, x, out), CLMLA_ERROR_SHAPE_MISMATCH, ctx);
            int len = -1;
            clmla_cache_seq_length(wrong, s, 0, &len);
            CHECK(len == 0, "a mismatched cache got %d tokens", len);
            clmla_cache_destroy(wrong);
        }

        /* After all that, the next step is exactly the reference's. */
        CHECK_STATUS(clmla_layer_forward(layer, cache, &args, x, out), CLMLA_SUCCESS, ctx);
        CHECK_CLOSE(out, ra.out + 5 * D, (size_t)2 * D, D, TOL_F32_CACHE, "after the failures: seq a");
        CHECK_CLOSE(out + 2 * D, rb.out + 3 * D, (size_t)D, D, TOL_F32_CACHE, "after the failures: seq b");
        /* A decode step for a only; a's 8th token still fits its 2 blocks. */
        clmla_batch_entry last = {a, 1};
        CHECK_STATUS(forward(layer, cache, 0, &last, 1, CLMLA_PATH_ABSORBED, xa + 7 * D, out), CLMLA_SUCCESS, ctx);
        CHECK_CLOSE(out, ra.out + 7 * D, (size_t)D, D, TOL_F32_CACHE, "after the failures: seq a decode");
        check_cache(cache, 0, a, 0, Ta, &ra, &c, CLMLA_CACHE_F32, "after the failures: cache of a");
        check_cache(cache, 0, b, 0, Tb, &rb, &c, CLMLA_CACHE_F32, "after the failures: cache of b");
        snap_free(&before);
    }
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    if (ok) {
        tu_ref_run_free(&ra);
        tu_ref_run_free(&rb);
    }
    free(xa);
    free(xb);
    tu_weights_free(&w);
}

/* ---- presets at full size -------------------------------------------------------------------- */

static int presets_run; /* presets that fitted and ran */

static int presets_requested(int argc, char **argv)
{
    return argc == 2 && strcmp(argv[1], "presets") == 0;
}

static void test_presets(void)
{
    /* (MiniCPM3's LongRoPE and Mistral Small 4's query scale are checked on small shapes by
       test_layer_features and against transformers by test_parity_fixtures.) */
    static const clmla_preset presets[] = {CLMLA_PRESET_DEEPSEEK_V2_LITE, CLMLA_PRESET_DEEPSEEK_V2,
                                           CLMLA_PRESET_DEEPSEEK_V3,      CLMLA_PRESET_KIMI_K2,
                                           CLMLA_PRESET_GLM_4_7_FLASH,    CLMLA_PRESET_MOONLIGHT};
    const int T = 3;
    for (int i = 0; i < (int)(sizeof(presets) / sizeof(presets[0])); i++) {
        double t0 = tu_seconds();
        clmla_layer_config c;
        CHECK_STATUS(clmla_layer_config_preset(presets[i], &c), CLMLA_SUCCESS, NULL);
        const char *name = clmla_preset_name(presets[i]);
        const int D = c.hidden_size;
        /* The weights live on the device too: skip (and say so) where they cannot fit. */
        const double H = c.num_heads, dq = c.qk_nope_head_dim + c.qk_rope_head_dim;
        /* the largest buffer: o_proj, q_b_proj, or q_proj (q_a_proj) stacked with kv_a_proj */
        const double o_proj = (double)D * H * c.v_head_dim, q_b = c.q_lora_rank ? H * dq * c.q_lora_rank : 0;
        const double stacked = ((c.q_lora_rank ? c.q_lora_rank : H * dq) + c.kv_lora_rank + c.qk_rope_head_dim) * (double)D;
        const double largest = 4.0 * fmax(o_proj, fmax(q_b, stacked));
        const double all = 4.0 * ((double)c.q_lora_rank * D + H * dq * (c.q_lora_rank ? c.q_lora_rank : D) +
                                  (c.kv_lora_rank + c.qk_rope_head_dim) * (double)D +
                                  H * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank + D * H * c.v_head_dim);
        clmla_device_info info;
        clmla_context_device(ctx, &info);
        if ((double)info.max_alloc_bytes < largest || (double)info.global_mem_bytes < 1.5 * all) {
            printf("skipped: %s: the device has %.0f MB (%.0f MB per buffer), the weights need %.0f MB (%.0f MB)\n", name,
                   info.global_mem_bytes / 1048576.0, info.max_alloc_bytes / 1048576.0, all / 1048576.0,
                   largest / 1048576.0);
            continue;
        }
        tu_weights w;
        if (tu_weights_make(&w, &c, 9000 + (uint64_t)i) != 0) {
            printf("skipped: %s: not enough host memory for its weights\n", name);
            continue;
        }
        float *x = tu_random_inputs(T, D, 9100 + (uint64_t)i);
        tu_ref_run ref;
        presets_run++;
        CHECK(tu_ref_run_make(&ref, &w, T, x, MLA_REF_DECOMPRESSED) == 0, "%s: reference failed", name);
        double t1 = tu_seconds();
        clmla_layer *layer = ref.out ? make_layer(&w, name) : NULL;
        double t2 = tu_seconds();
        if (layer) {
            char what[160];
            /* Absorbed: prefill 2, decode 1. */
            static const int chunks[] = {2, 1};
            const clmla_attention_path ABS = CLMLA_PATH_ABSORBED, DEC = CLMLA_PATH_DECOMPRESSED;
            snprintf(what, sizeof(what), "%s full size, f32: absorbed prefill 2 + decode 1", name);
            float *abs = run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F32, 64, chunks, 2, &ABS, 1, what);
            snprintf(what, sizeof(what), "%s full size, f32: decompressed prefill 3", name);
            float *dec = run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F32, 64, &T, 1, &DEC, 1, what);
            snprintf(what, sizeof(what), "%s full size: absorbed vs decompressed", name);
            check_agree(abs, dec, (size_t)T * D, D, CLMLA_CACHE_F32, what);
            if (i == 0) {
                const clmla_attention_path AUTO = CLMLA_PATH_AUTO;
                snprintf(what, sizeof(what), "%s full size, f16: prefill 2 + decode 1 (auto)", name);
                free(run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F16, 64, chunks, 2, &AUTO, 1, what));
            }
            free(abs);
            free(dec);
        }
        clmla_layer_destroy(layer);
        printf("# %-8s weights + reference %.1f s, layer_create %.1f s, forwards %.1f s\n", name, t1 - t0, t2 - t1,
               tu_seconds() - t2);
        tu_ref_run_free(&ref);
        free(x);
        tu_weights_free(&w);
    }
}

/* ---- main ------------------------------------------------------------------------------------ */

/* The odd shapes again with every product through CLBlast: on CPUs clmla's own GEMM kernels take
   most products, while GPUs give CLBlast the large ones, so both paths stay tested here. */
static void test_shapes_clblast(void)
{
    clmla_gemm_force_clblast(ctx, 1);
    test_shapes();
    clmla_gemm_force_clblast(ctx, 0);
}

/* The odd shapes and the long sequences with the work-group attention kernels that GPUs run
   (attn_latent; the decompressed path's attention attn_prefill_tiled, the default, or attn_prefill,
   the latent tuning's prefill_tiled set either way whatever the device's entry says); on CPUs the
   row-walking kernels are the default. The layers are made after the tuning is set, so they build
   the kernel it names. */
static void group_kernels_with(int prefill_tiled)
{
    clmla_latent_tuning t;
    clmla_latent_tuning_defaults(&t);
    t.prefill_tiled = prefill_tiled;
    CHECK_STATUS(clmla_context_set_latent_tuning(ctx, &t), CLMLA_SUCCESS, ctx);
    clmla_attention_set_variant(ctx, CLMLA_LATENT_GROUP);
    test_shapes();
    test_long();
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    CHECK_STATUS(clmla_context_set_latent_tuning(ctx, NULL), CLMLA_SUCCESS, ctx);
}

/* The absorbed path's attention in pieces of 5 rows (a test hook; the library takes pieces of
   1 GiB of its scratch: 2048 rows at DeepSeek-V3's shape), so that pieces cut entries, prefill
   chunks and runs of decompressed rows: the batch part (batched against alone against float64, on
   every path) and the long part (chunks on either path), with the row kernels and the work-group
   kernels. */
static void test_absorbed_pieces(void)
{
    clmla_test_hooks_of(ctx)->absorbed_piece_rows = 5;
    test_batch();
    test_long();
    clmla_attention_set_variant(ctx, CLMLA_LATENT_GROUP);
    test_batch();
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    clmla_test_hooks_of(ctx)->absorbed_piece_rows = 0;
}

static void test_group_kernels(void)
{
    group_kernels_with(1);
}

static void test_untiled_prefill(void)
{
    group_kernels_with(0);
}

/* A layer builds at creation only the kernels its context runs (issue 24): RMSNorm, RoPE and one
   kernel of the decompressed path's attention, attn_prefill_rows on the row kernels, else
   attn_prefill_tiled or (prefill_tiled 0) attn_prefill; three kernel objects where four or five
   were made before. A layer used after the context's kernels changed (an internal test hook, no
   public call) refuses the decompressed step clearly and keeps the sequence as it was. */
static void test_built_kernels(void)
{
    clmla_layer_config c = shape_config(1);
    tu_weights w;
    if (weights_or_fail(&w, &c, 4747, "built kernels") != 0)
        return;
    static const struct {
        int variant, tiled;
        const char *what;
    } cases[] = {{CLMLA_LATENT_ROWS, 1, "row kernels"},
                 {CLMLA_LATENT_GROUP, 1, "work-group kernels, attn_prefill_tiled"},
                 {CLMLA_LATENT_GROUP, 0, "work-group kernels, attn_prefill"}};
    float *x = tu_random_inputs(20, c.hidden_size, 4748), *out = malloc((size_t)20 * c.hidden_size * sizeof(float));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]) && x && out; i++) {
        clmla_latent_tuning t;
        clmla_latent_tuning_defaults(&t);
        t.prefill_tiled = cases[i].tiled;
        CHECK_STATUS(clmla_context_set_latent_tuning(ctx, &t), CLMLA_SUCCESS, ctx);
        clmla_attention_set_variant(ctx, cases[i].variant);
        const long before = clmla_cl_counts_get(ctx).kernels;
        clmla_layer *layer = make_layer(&w, cases[i].what);
        const long made = clmla_cl_counts_get(ctx).kernels - before;
        CHECK(made == 3, "%s: the layer made %ld kernel objects, not 3 (RMSNorm, RoPE, one attention)", cases[i].what,
              made);
        clmla_cache *cache = make_cache(&c, 1, 8, 8, CLMLA_CACHE_F32);
        if (layer && cache) {
            const int32_t s = add_seq(cache);
            clmla_batch_entry e = {s, 20};
            CHECK_STATUS(forward(layer, cache, 0, &e, 1, CLMLA_PATH_DECOMPRESSED, x, out), CLMLA_SUCCESS, ctx);
            /* the other kernels now: a decompressed step is refused, the sequence kept */
            clmla_attention_set_variant(ctx, cases[i].variant == CLMLA_LATENT_ROWS ? CLMLA_LATENT_GROUP : CLMLA_LATENT_ROWS);
            e.num_tokens = 17;
            CHECK_STATUS(forward(layer, cache, 0, &e, 1, CLMLA_PATH_DECOMPRESSED, x, out), CLMLA_ERROR_INVALID_ARGUMENT,
                         ctx);
            CHECK(strstr(clmla_last_error(ctx), "built for other attention kernels") != NULL, "%s: message: %s",
                  cases[i].what, clmla_last_error(ctx));
            int len = -1;
            clmla_cache_seq_length(cache, s, 0, &len);
            CHECK(len == 20, "%s: a refused step left the sequence at %d tokens, not 20", cases[i].what, len);
        }
        clmla_cache_destroy(cache);
        clmla_layer_destroy(layer);
    }
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    CHECK_STATUS(clmla_context_set_latent_tuning(ctx, NULL), CLMLA_SUCCESS, ctx);
    free(x);
    free(out);
    tu_weights_free(&w);
}

/* The decompressed path's attention with tiles other than the defaults: attn_prefill_tiled (the
   latent tuning's prefill_queries, prefill_keys, prefill_chunk, prefill_item_keys) with the
   smallest legal ones (blocks of 4 queries, tiles of 8 keys, chunks of 4 float4s: dq 24 in two
   chunks), 16 keys in chunks longer than a query row, the largest block and tile, and 1 and 2 keys
   an item; attn_prefill_rows (prefill_rows_queries) with 4, 12 (the softmax 4 queries a vector) and
   24 queries an item. Then the fits on a device with less local memory or smaller work-groups (the
   context's figures lowered for one layer): 16 KiB takes the block of 64 queries down to 16 (15.3
   KiB), 4 KiB fits no block and attn_prefill runs with fewer keys staged, and 256 items take 64
   queries of 64 keys at 1 key an item (2048 items) down to 8. 45 tokens in chunks of 19 and 26, so
   that blocks and tiles end mid-chunk and the second chunk's tiles cross its prefix, against
   float64; three kernel objects per layer whichever runs. */
/* What setup said of attn_prefill_tiled: that no block fits, and the options of the last program of
   it built. */
typedef struct tiled_notes {
    int no_block;
    char options[256];
} tiled_notes;

static void note_tiled(void *user, clmla_log_level level, const char *message)
{
    (void)level;
    tiled_notes *n = user;
    const char *opts = strstr(message, "attn_prefill.cl [");
    if (strstr(message, "attn_prefill_tiled: no block of queries fits"))
        n->no_block = 1;
    else if (opts && strstr(message, "-D TILED"))
        snprintf(n->options, sizeof(n->options), "%s", opts);
}

static void test_prefill_tiles(void)
{
    /* queries, keys, chunk (attn_prefill_tiled) or queries an item (attn_prefill_rows), local memory,
       keys an item (attn_prefill_tiled; 0: the default), most items a work-group (0: the device's) */
    static const int tiles[][7] = {{4, 8, 16, 0, 0, 0, 0},     {8, 16, 128, 0, 0, 0, 0},  {64, 64, 32, 0, 0, 0, 0},
                                   {16, 32, 64, 0, 0, 1, 0},   {32, 16, 16, 0, 0, 2, 0},  {0, 0, 0, 4, 0, 0, 0},
                                   {0, 0, 0, 12, 0, 0, 0},     {0, 0, 0, 24, 0, 0, 0},    {64, 64, 32, 0, 16384, 0, 0},
                                   {32, 32, 64, 0, 4096, 0, 0}, {64, 64, 32, 0, 0, 1, 256}};
    const int T = 45, chunks[] = {19, 26};
    const clmla_attention_path path = CLMLA_PATH_DECOMPRESSED;
    clmla_layer_config c = shape_config(1); /* 5 heads, dq 24, dv 24 */
    tu_weights w;
    if (weights_or_fail(&w, &c, 4545, "prefill tiles") != 0)
        return;
    float *x = tu_random_inputs(T, c.hidden_size, 4546);
    tu_ref_run ref;
    CHECK(tu_ref_run_make(&ref, &w, T, x, MLA_REF_DECOMPRESSED) == 0, "prefill tiles: reference failed");
    for (size_t i = 0; i < sizeof(tiles) / sizeof(tiles[0]) && ref.out; i++) {
        clmla_latent_tuning t;
        clmla_latent_tuning_defaults(&t);
        char what[200];
        if (tiles[i][3]) {
            t.prefill_rows_queries = tiles[i][3];
            clmla_attention_set_variant(ctx, CLMLA_LATENT_ROWS);
            snprintf(what, sizeof(what), "attn_prefill_rows, %d queries an item: prefill 19 + 26", tiles[i][3]);
        } else {
            t.prefill_queries = tiles[i][0];
            t.prefill_keys = tiles[i][1];
            t.prefill_chunk = tiles[i][2];
            if (tiles[i][5])
                t.prefill_item_keys = tiles[i][5];
            clmla_attention_set_variant(ctx, CLMLA_LATENT_GROUP);
            snprintf(what, sizeof(what), "attn_prefill_tiled, %d queries x %d keys, chunks of %d, keys an item %d, "
                     "%d bytes of local memory, at most %d items: prefill 19 + 26", tiles[i][0], tiles[i][1],
                     tiles[i][2], t.prefill_item_keys, tiles[i][4] ? tiles[i][4] : (int)ctx->info.local_mem_bytes,
                     tiles[i][6] ? tiles[i][6] : (int)ctx->info.max_work_group_size);
        }
        CHECK_STATUS(clmla_context_set_latent_tuning(ctx, &t), CLMLA_SUCCESS, ctx);
        const size_t local = ctx->info.local_mem_bytes, items = ctx->info.max_work_group_size;
        const clmla_log_fn log = ctx->log;
        void *const log_user = ctx->log_user;
        const clmla_log_level log_level = ctx->log_level;
        tiled_notes notes = {0, ""};
        if (tiles[i][4])
            ctx->info.local_mem_bytes = (size_t)tiles[i][4];
        if (tiles[i][6])
            ctx->info.max_work_group_size = (size_t)tiles[i][6];
        ctx->log = note_tiled;
        ctx->log_user = &notes;
        ctx->log_level = CLMLA_LOG_INFO;
        const long before = clmla_cl_counts_get(ctx).kernels;
        clmla_layer *layer = make_layer(&w, what);
        const long made = clmla_cl_counts_get(ctx).kernels - before;
        ctx->info.local_mem_bytes = local;
        ctx->info.max_work_group_size = items;
        ctx->log = log;
        ctx->log_user = log_user;
        ctx->log_level = log_level;
        CHECK(made == 3, "%s: the layer made %ld kernel objects, not 3", what, made);
        CHECK(notes.no_block == (tiles[i][4] == 4096), "%s: %s", what,
              notes.no_block ? "no block fitted" : "a block fitted where none does");
        if (tiles[i][6]) /* 8 queries / 2 x 64 keys / 1 key an item: the largest block of 256 items */
            CHECK(strstr(notes.options, "-D BQ=8 ") && strstr(notes.options, "-D KPI=1"), "%s: built %s", what,
                  notes.options[0] ? notes.options : "nothing");
        if (layer)
            free(run_schedule(layer, &w, &ref, T, x, CLMLA_CACHE_F32, 8, chunks, 2, &path, 1, what));
        clmla_layer_destroy(layer);
    }
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    CHECK_STATUS(clmla_context_set_latent_tuning(ctx, NULL), CLMLA_SUCCESS, ctx);
    tu_ref_run_free(&ref);
    free(x);
    tu_weights_free(&w);
}

/* A sparse-attention model's limit (dense_max_keys = index_topk): a step that would give a query
   more keys fails with CLMLA_ERROR_UNSUPPORTED and leaves the sequence as it was; up to the limit
   the layer runs. */
static void test_dense_limit(void)
{
    clmla_layer_config c = tu_small_config(40, 3, 16, 24, 8, 6, 8);
    c.dense_max_keys = 5;
    tu_weights w;
    if (weights_or_fail(&w, &c, 77, "dense limit") != 0)
        return;
    clmla_layer *layer = make_layer(&w, "dense limit");
    clmla_cache *cache = make_cache(&c, 1, 4, 8, CLMLA_CACHE_F32);
    float *x = tu_random_inputs(6, 40, 78), *out = malloc(6 * 40 * sizeof(float));
    if (layer && cache && x && out) {
        const int32_t s = add_seq(cache);
        clmla_batch_entry e = {s, 4};
        CHECK_STATUS(forward(layer, cache, 0, &e, 1, CLMLA_PATH_AUTO, x, out), CLMLA_SUCCESS, ctx);
        e.num_tokens = 2; /* the last token would see 6 keys */
        CHECK_STATUS(forward(layer, cache, 0, &e, 1, CLMLA_PATH_ABSORBED, x + 4 * 40, out), CLMLA_ERROR_UNSUPPORTED, ctx);
        CHECK(strstr(clmla_last_error(ctx), "index_topk = 5") != NULL, "dense limit message: %s", clmla_last_error(ctx));
        int len = -1;
        clmla_cache_seq_length(cache, s, 0, &len);
        CHECK(len == 4, "a refused step left the sequence at %d tokens, not 4", len);
        e.num_tokens = 1; /* exactly 5 keys */
        CHECK_STATUS(forward(layer, cache, 0, &e, 1, CLMLA_PATH_ABSORBED, x + 4 * 40, out), CLMLA_SUCCESS, ctx);
    }
    free(x);
    free(out);
    clmla_cache_destroy(cache);
    clmla_layer_destroy(layer);
    tu_weights_free(&w);
}

/* LongRoPE's short/long choice and the per-position query scale are per sequence: a batch that
   mixes a sequence past original_max_position_embeddings with one before it gives each the output
   it gets alone. */
static void test_per_sequence_rope(void)
{
    enum { D = 40, L = 6 };
    clmla_layer_config c = tu_small_config(D, 3, 16, 24, 8, 6, 8);
    c.rope_type = CLMLA_ROPE_TYPE_LONGROPE;
    c.rope_pairing = CLMLA_ROPE_HALF_SPLIT;
    c.yarn_factor = 4;
    c.yarn_original_max_position = L;
    for (int i = 0; i < 3; i++) {
        c.longrope_short_factor[i] = 1.0 + 0.5 * i;
        c.longrope_long_factor[i] = 3.0 + 2.0 * i;
    }
    c.query_scale_beta = 0.3;
    c.query_scale_interval = 3;
    tu_weights w;
    if (weights_or_fail(&w, &c, 91, "per-sequence rope") != 0)
        return;
    clmla_layer *layer = make_layer(&w, "per-sequence rope");
    float *x = tu_random_inputs(12, D, 92), *alone = malloc(12 * D * sizeof(float)), *both = malloc(12 * D * sizeof(float));
    for (int path = CLMLA_PATH_ABSORBED; layer && x && alone && both && path <= CLMLA_PATH_DECOMPRESSED; path++) {
        /* a: 6 tokens, then 2 more (positions 6, 7: past L, long factors); b: 3 tokens (short). */
        clmla_cache *one = make_cache(&c, 1, 4, 16, CLMLA_CACHE_F32), *two = make_cache(&c, 1, 4, 16, CLMLA_CACHE_F32);
        if (!one || !two) {
            clmla_cache_destroy(one);
            clmla_cache_destroy(two);
            break;
        }
        const int32_t a1 = add_seq(one), b1 = add_seq(one), a2 = add_seq(two), b2 = add_seq(two);
        clmla_batch_entry e = {a1, 6};
        CHECK_STATUS(forward(layer, one, 0, &e, 1, CLMLA_PATH_AUTO, x, alone), CLMLA_SUCCESS, ctx);
        e.num_tokens = 2;
        CHECK_STATUS(forward(layer, one, 0, &e, 1, (clmla_attention_path)path, x + 6 * D, alone + 6 * D), CLMLA_SUCCESS, ctx);
        e.seq_id = b1;
        e.num_tokens = 3;
        CHECK_STATUS(forward(layer, one, 0, &e, 1, (clmla_attention_path)path, x + 8 * D, alone + 8 * D), CLMLA_SUCCESS, ctx);
        e.seq_id = a2;
        e.num_tokens = 6;
        CHECK_STATUS(forward(layer, two, 0, &e, 1, CLMLA_PATH_AUTO, x, both), CLMLA_SUCCESS, ctx);
        clmla_batch_entry batch[2] = {{a2, 2}, {b2, 3}};
        CHECK_STATUS(forward(layer, two, 0, batch, 2, (clmla_attention_path)path, x + 6 * D, both + 6 * D), CLMLA_SUCCESS, ctx);
        double worst = 0, scale = 0;
        for (int i = 6 * D; i < 11 * D; i++) {
            worst = fmax(worst, fabs((double)alone[i] - both[i]));
            scale = fmax(scale, fabs((double)alone[i]));
        }
        CHECK(worst <= 1e-5 * scale, "per-sequence rope (%s path): batched differs from alone by %g (max %g)",
              path == CLMLA_PATH_ABSORBED ? "absorbed" : "decompressed", worst, scale);
        /* ... and the long factors did matter: the short ones give another output for a's step. */
        clmla_layer_config s = c;
        for (int i = 0; i < 3; i++)
            s.longrope_long_factor[i] = s.longrope_short_factor[i];
        clmla_layer_weights lw = w.layer;
        clmla_layer *short_only = NULL;
        CHECK_STATUS(clmla_layer_create(ctx, &s, &lw, &short_only), CLMLA_SUCCESS, ctx);
        clmla_cache *three = make_cache(&c, 1, 4, 16, CLMLA_CACHE_F32);
        if (short_only && three) {
            const int32_t a3 = add_seq(three);
            float *other = malloc(8 * D * sizeof(float));
            e.seq_id = a3;
            e.num_tokens = 6;
            CHECK_STATUS(forward(short_only, three, 0, &e, 1, CLMLA_PATH_AUTO, x, other), CLMLA_SUCCESS, ctx);
            e.num_tokens = 2;
            CHECK_STATUS(forward(short_only, three, 0, &e, 1, (clmla_attention_path)path, x + 6 * D, other + 6 * D),
                         CLMLA_SUCCESS, ctx);
            double diff = 0;
            for (int i = 6 * D; i < 8 * D; i++)
                diff = fmax(diff, fabs((double)alone[i] - other[i]));
            CHECK(diff > 1e-3 * scale, "per-sequence rope: positions past L should use the long factors (diff %g)", diff);
            free(other);
        }
        clmla_cache_destroy(three);
        clmla_layer_destroy(short_only);
        clmla_cache_destroy(one);
        clmla_cache_destroy(two);
    }
    free(x);
    free(alone);
    free(both);
    clmla_layer_destroy(layer);
    tu_weights_free(&w);
}

static const tu_part parts[] = {
    {"dense-limit", test_dense_limit}, {"per-sequence-rope", test_per_sequence_rope},
    {"errors", test_create_errors}, {"auto-path", test_auto_path}, {"decompressed-budget", test_decompressed_budget},
    {"absorbed-pieces", test_absorbed_pieces},
    {"shapes-clblast", test_shapes_clblast}, {"group-kernels", test_group_kernels}, {"untiled-prefill", test_untiled_prefill},
    {"prefill-tiles", test_prefill_tiles},  {"built-kernels", test_built_kernels}, {"forward-errors", test_forward_errors}, {"shapes", test_shapes},
    {"long", test_long},            {"batch", test_batch},                   {"layers", test_two_layers},
    {"forward-cl", test_forward_cl}, {"presets", test_presets},
};

int main(int argc, char **argv)
{
    const tu_parts_options options = {.on_request = "presets"};
    const tu_parts_result ran =
        tu_run_parts(argc, argv, parts, (int)(sizeof(parts) / sizeof(parts[0])), &options, &ctx, &check_failed);
    if (ran != TU_PARTS_RAN)
        return tu_parts_exit(ran);
    /* `test_layer presets` with no preset that fits this device has tested nothing. */
    if (presets_requested(argc, argv) && presets_run == 0 && check_failed == 0) {
        printf("skipped: no preset fits this device\n");
        return 77;
    }
    return check_summary();
}
