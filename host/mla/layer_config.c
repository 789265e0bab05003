/* Layer configurations: the published presets and validation. */
#include "internal.h"
#include "layer_config.h"
#include "rope.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* MiniCPM3-4B's LongRoPE factors (its config.json gives the same list as short and long). */
#define MINICPM3_FACTORS                                                                                              \
    {1.0591234137867171, 1.1241891283591912, 1.2596935748670968, 1.5380380402321725, 2.093982484148734,               \
     3.1446935121267696, 4.937952647693647,  7.524541999994549,  10.475458000005451, 13.062047352306353,              \
     14.85530648787323,  15.906017515851266, 16.461961959767827, 16.740306425132907, 16.87581087164081,               \
     16.940876586213285}

static const struct {
    const char *name;
    clmla_layer_config config;
} presets[] = {
    /* docs/MLA.md section 7. D, H, rq, rkv, dn, dr, dv, eps, theta, pairing, YaRN s, L, beta fast/slow, mscale, mscale_all_dim */
    [CLMLA_PRESET_DEEPSEEK_V2_LITE] = {"v2-lite", {2048, 16, 0, 512, 128, 64, 128, 1e-6, 10000.0, CLMLA_ROPE_INTERLEAVED, 40.0, 4096, 32.0, 1.0, 0.707, 0.707, .rope_type = CLMLA_ROPE_TYPE_AUTO}},
    [CLMLA_PRESET_DEEPSEEK_V2] = {"v2", {5120, 128, 1536, 512, 128, 64, 128, 1e-6, 10000.0, CLMLA_ROPE_INTERLEAVED, 40.0, 4096, 32.0, 1.0, 0.707, 0.707, .rope_type = CLMLA_ROPE_TYPE_AUTO}},
    [CLMLA_PRESET_DEEPSEEK_V3] = {"v3", {7168, 128, 1536, 512, 128, 64, 128, 1e-6, 10000.0, CLMLA_ROPE_INTERLEAVED, 40.0, 4096, 32.0, 1.0, 1.0, 1.0, .rope_type = CLMLA_ROPE_TYPE_AUTO}},
    [CLMLA_PRESET_KIMI_K2] = {"kimi-k2", {7168, 64, 1536, 512, 128, 64, 128, 1e-6, 50000.0, CLMLA_ROPE_INTERLEAVED, 32.0, 4096, 1.0, 1.0, 1.0, 1.0, .rope_type = CLMLA_ROPE_TYPE_AUTO}},
    /* docs/MODELS.md gives the sources of these four. */
    [CLMLA_PRESET_GLM_4_7_FLASH] = {"glm-4.7-flash", {2048, 20, 768, 512, 192, 64, 256, 1e-6, 1e6, CLMLA_ROPE_INTERLEAVED, 0, 0, 0, 0, 0, 0,
                                                      .rope_type = CLMLA_ROPE_TYPE_DEFAULT}},
    [CLMLA_PRESET_MINICPM3_4B] = {"minicpm3-4b", {2560, 40, 768, 256, 64, 32, 64, 1e-6, 1e4, CLMLA_ROPE_HALF_SPLIT, 1.0, 32768, 0, 0, 0, 0,
                                                  .rope_type = CLMLA_ROPE_TYPE_LONGROPE,
                                                  .longrope_short_factor = MINICPM3_FACTORS,
                                                  .longrope_long_factor = MINICPM3_FACTORS}},
    [CLMLA_PRESET_MISTRAL_SMALL_4] = {"mistral-small-4", {4096, 32, 1024, 256, 64, 64, 128, 1e-6, 1e4, CLMLA_ROPE_INTERLEAVED, 128.0, 8192, 32.0, 1.0, 1.0, 1.0,
                                                          .rope_type = CLMLA_ROPE_TYPE_YARN, .query_scale_beta = 0.1,
                                                          .query_scale_interval = 8192}},
    [CLMLA_PRESET_MOONLIGHT] = {"moonlight", {2048, 16, 0, 512, 128, 64, 128, 1e-6, 50000.0, CLMLA_ROPE_INTERLEAVED, 0, 0, 0, 0, 0, 0,
                                              .rope_type = CLMLA_ROPE_TYPE_DEFAULT}},
};
#define NUM_PRESETS ((int)(sizeof(presets) / sizeof(presets[0])))

/* Every 0-means-default field filled in (clmla.h says what 0 stands for), rope_type AUTO made
   explicit: what the layer, the RoPE tables and validation work from. */
clmla_layer_config clmla_config_resolved(const clmla_layer_config *c)
{
    clmla_layer_config r = *c;
    if (r.rms_norm_eps == 0)
        r.rms_norm_eps = 1e-6;
    if (r.rope_theta == 0)
        r.rope_theta = 10000.0;
    if (r.yarn_original_max_position == 0)
        r.yarn_original_max_position = 4096;
    if (r.yarn_beta_fast == 0)
        r.yarn_beta_fast = 32.0;
    if (r.yarn_beta_slow == 0)
        r.yarn_beta_slow = 1.0;
    if (r.rope_type == CLMLA_ROPE_TYPE_AUTO)
        r.rope_type = r.yarn_factor > 1.0 ? CLMLA_ROPE_TYPE_YARN : CLMLA_ROPE_TYPE_DEFAULT;
    if (r.query_scale_interval == 0)
        r.query_scale_interval = r.yarn_original_max_position;
    if (r.q_latent_scale == 0)
        r.q_latent_scale = 1.0;
    if (r.kv_latent_scale == 0)
        r.kv_latent_scale = 1.0;
    if (r.index_n_heads > 0 && r.index_norm_eps == 0)
        r.index_norm_eps = 1e-6;
    return r;
}

clmla_status clmla_layer_config_preset(clmla_preset preset, clmla_layer_config *config)
{
    if (!config || (int)preset < 0 || (int)preset >= NUM_PRESETS)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "unknown preset %d", (int)preset);
    *config = presets[preset].config;
    return CLMLA_SUCCESS;
}

const char *clmla_preset_name(clmla_preset preset)
{
    return ((int)preset >= 0 && (int)preset < NUM_PRESETS) ? presets[preset].name : NULL;
}

clmla_status clmla_preset_from_name(const char *name, clmla_preset *preset)
{
    if (name && preset)
        for (int i = 0; i < NUM_PRESETS; i++) {
            const char *a = presets[i].name, *b = name;
            while (*a && *b && tolower((unsigned char)*a) == tolower((unsigned char)*b))
                a++, b++;
            if (!*a && !*b) {
                *preset = (clmla_preset)i;
                return CLMLA_SUCCESS;
            }
        }
    return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "unknown preset '%s' (known: v2-lite, v2, v3, kimi-k2, glm-4.7-flash, minicpm3-4b, "
                      "mistral-small-4, moonlight)",
                      name ? name : "(null)");
}

/* Largest element count clmla accepts for one tensor or activation row set: int-indexed kernels. */
#define MAX_ELEMENTS ((int64_t)1 << 31)

#define INVALID(...) clmla_fail(NULL, CLMLA_ERROR_INVALID_CONFIG, "invalid layer configuration: " __VA_ARGS__)

clmla_status clmla_layer_config_validate(const clmla_layer_config *config)
{
    if (!config)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_config_validate: NULL configuration");
    const clmla_layer_config c = clmla_config_resolved(config);
    const struct {
        const char *name;
        int value;
        int min;
    } dims[] = {
        {"hidden_size", c.hidden_size, 1}, {"num_heads", c.num_heads, 1}, {"q_lora_rank", c.q_lora_rank, 0},
        {"kv_lora_rank", c.kv_lora_rank, 1}, {"qk_nope_head_dim", c.qk_nope_head_dim, 1},
        {"qk_rope_head_dim", c.qk_rope_head_dim, 2}, {"v_head_dim", c.v_head_dim, 1},
    };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        if (dims[i].value < dims[i].min)
            return INVALID("%s is %d, it must be at least %d", dims[i].name, dims[i].value, dims[i].min);
    if (c.qk_rope_head_dim % 2)
        return INVALID("qk_rope_head_dim is %d, it must be even (RoPE rotates pairs)", c.qk_rope_head_dim);
    if (c.qk_rope_head_dim > 1024)
        return INVALID("qk_rope_head_dim is %d, at most 1024 is supported", c.qk_rope_head_dim);
    if (c.kv_lora_rank > 65536 || c.qk_nope_head_dim > 4096 || c.v_head_dim > 4096)
        return INVALID("kv_lora_rank %d, qk_nope_head_dim %d or v_head_dim %d exceeds what clmla supports "
                       "(kv_lora_rank <= 65536, head dims <= 4096)", c.kv_lora_rank, c.qk_nope_head_dim, c.v_head_dim);
    /* Every weight and per-token activation must be indexable. */
    const int64_t dq = (int64_t)c.qk_nope_head_dim + c.qk_rope_head_dim;
    const int64_t products[][2] = {
        {(int64_t)c.num_heads * dq, c.q_lora_rank ? c.q_lora_rank : c.hidden_size},
        {(int64_t)c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
        {c.hidden_size, (int64_t)c.num_heads * c.v_head_dim},
        {(int64_t)c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size},
        {c.q_lora_rank, c.hidden_size},
        {c.num_heads, c.kv_lora_rank},
    };
    for (size_t i = 0; i < sizeof(products) / sizeof(products[0]); i++)
        if (products[i][0] >= MAX_ELEMENTS || products[i][1] >= MAX_ELEMENTS ||
            products[i][0] * products[i][1] >= MAX_ELEMENTS)
            return INVALID("a weight of %lld x %lld elements is too large (at most 2^31 elements)",
                           (long long)products[i][0], (long long)products[i][1]);
    const struct {
        const char *name;
        double value;
    } reals[] = {{"rms_norm_eps", c.rms_norm_eps}, {"rope_theta", c.rope_theta}, {"yarn_factor", c.yarn_factor},
                 {"yarn_beta_fast", c.yarn_beta_fast}, {"yarn_beta_slow", c.yarn_beta_slow},
                 {"yarn_mscale", c.yarn_mscale}, {"yarn_mscale_all_dim", c.yarn_mscale_all_dim}};
    for (size_t i = 0; i < sizeof(reals) / sizeof(reals[0]); i++)
        if (!isfinite(reals[i].value))
            return INVALID("%s is %g, it must be a finite number", reals[i].name, reals[i].value);
    if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1))
        return INVALID("rms_norm_eps %g is not in (0, 1)", c.rms_norm_eps);
    if (!(c.rope_theta > 1))
        return INVALID("rope_theta %g must be > 1", c.rope_theta);
    if (c.rope_pairing != CLMLA_ROPE_INTERLEAVED && c.rope_pairing != CLMLA_ROPE_HALF_SPLIT)
        return INVALID("rope_pairing %d is neither interleaved (0) nor half-split (1)", (int)c.rope_pairing);
    if (c.rope_type < CLMLA_ROPE_TYPE_DEFAULT || c.rope_type > CLMLA_ROPE_TYPE_NONE)
        return INVALID("rope_type %d is not one of clmla_rope_type", (int)c.rope_type);
    if (c.rope_attention_factor != 0 && c.rope_type != CLMLA_ROPE_TYPE_YARN && c.rope_type != CLMLA_ROPE_TYPE_LONGROPE)
        return INVALID("rope_attention_factor %g: only the yarn and longrope types have an attention factor (rope_type %d)",
                       c.rope_attention_factor, (int)c.rope_type);
    const struct {
        const char *name;
        double value;
        int signed_ok; /* may be negative */
    } more[] = {{"rope_attention_factor", c.rope_attention_factor, 0}, {"llama3_low_freq_factor", c.llama3_low_freq_factor, 0},
                {"llama3_high_freq_factor", c.llama3_high_freq_factor, 0}, {"query_scale_beta", c.query_scale_beta, 1},
                {"q_latent_scale", c.q_latent_scale, 0}, {"kv_latent_scale", c.kv_latent_scale, 0}};
    for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++)
        if (!isfinite(more[i].value) || (!more[i].signed_ok && more[i].value < 0))
            return INVALID("%s is %g, it must be a finite number%s", more[i].name, more[i].value,
                           more[i].signed_ok ? "" : " >= 0");
    if (c.q_latent_scale <= 0 || c.kv_latent_scale <= 0)
        return INVALID("q_latent_scale %g and kv_latent_scale %g must be positive", c.q_latent_scale, c.kv_latent_scale);
    if (c.query_scale_beta != 0 && c.query_scale_interval < 1)
        return INVALID("query_scale_interval %d must be at least 1", c.query_scale_interval);
    if (c.dense_max_keys < 0)
        return INVALID("dense_max_keys %d must be >= 0", c.dense_max_keys);
    if (c.tp_size < 0)
        return INVALID("tp_size %d must be >= 0 (0 or 1: the whole layer)", c.tp_size);
    if (c.tp_size > 1 && c.num_heads % c.tp_size != 0)
        return INVALID("tp_size %d does not divide num_heads %d: every tensor-parallel shard holds num_heads / tp_size "
                       "heads", c.tp_size, c.num_heads);
    if (c.tp_rank < 0 || c.tp_rank >= (c.tp_size > 1 ? c.tp_size : 1))
        return INVALID("tp_rank %d is out of range for tp_size %d (0 to %d)", c.tp_rank, c.tp_size,
                       (c.tp_size > 1 ? c.tp_size : 1) - 1);
    if (c.index_shared != 0 && c.index_shared != 1)
        return INVALID("index_shared %d must be 0 or 1", c.index_shared);
    if (c.index_shared) {
        if (c.index_n_heads != 0)
            return INVALID("index_shared 1 (a shared layer: no indexer of its own) with index_n_heads %d; it must "
                           "be 0",
                           c.index_n_heads);
        if (c.index_topk < 1)
            return INVALID("index_topk %d must be >= 1 (a shared layer attends to its full layer's index_topk keys)",
                           c.index_topk);
        if (c.dense_max_keys != 0)
            return INVALID("dense_max_keys %d must be 0 in a shared layer (index_shared 1): it attends to its full "
                           "layer's selection instead",
                           c.dense_max_keys);
    }
    if (c.index_n_heads < 0)
        return INVALID("index_n_heads %d must be >= 0 (0: no indexer)", c.index_n_heads);
    if (c.index_n_heads > 0) {
        if (c.q_lora_rank == 0)
            return INVALID("the indexer (index_n_heads %d) reads c^Q, but q_lora_rank is 0", c.index_n_heads);
        if (c.index_n_heads > 4096 || c.index_head_dim > 1024 || c.index_head_dim < c.qk_rope_head_dim ||
            c.index_head_dim % 2)
            return INVALID("index_n_heads %d must be at most 4096 and index_head_dim %d even, at least "
                           "qk_rope_head_dim %d and at most 1024",
                           c.index_n_heads, c.index_head_dim, c.qk_rope_head_dim);
        if (c.index_topk < 1)
            return INVALID("index_topk %d must be >= 1", c.index_topk);
        if (c.dense_max_keys != 0)
            return INVALID("dense_max_keys %d must be 0 with an indexer (index_n_heads %d): the indexer selects "
                           "index_topk keys instead", c.dense_max_keys, c.index_n_heads);
        if (c.index_rope_pairing != CLMLA_ROPE_INTERLEAVED && c.index_rope_pairing != CLMLA_ROPE_HALF_SPLIT)
            return INVALID("index_rope_pairing %d is neither interleaved (0) nor half-split (1)",
                           (int)c.index_rope_pairing);
        if (!(c.index_norm_eps > 0 && c.index_norm_eps < 1))
            return INVALID("index_norm_eps %g is not in (0, 1)", c.index_norm_eps);
        if ((int64_t)c.index_n_heads * c.index_head_dim * (c.q_lora_rank > c.hidden_size ? c.q_lora_rank : c.hidden_size) >=
            MAX_ELEMENTS)
            return INVALID("the indexer's weights (index_n_heads %d x index_head_dim %d) are too large",
                           c.index_n_heads, c.index_head_dim);
    }
    if (c.rope_type == CLMLA_ROPE_TYPE_LONGROPE) {
        if (c.qk_rope_head_dim / 2 > CLMLA_MAX_ROPE_PAIRS)
            return INVALID("LongRoPE keeps at most %d factors, qk_rope_head_dim %d needs %d", CLMLA_MAX_ROPE_PAIRS,
                           c.qk_rope_head_dim, c.qk_rope_head_dim / 2);
        for (int i = 0; i < c.qk_rope_head_dim / 2; i++)
            if (!(c.longrope_short_factor[i] > 0 && isfinite(c.longrope_short_factor[i])) ||
                !(c.longrope_long_factor[i] > 0 && isfinite(c.longrope_long_factor[i])))
                return INVALID("LongRoPE factor %d is %g (short) / %g (long), both must be positive", i,
                               c.longrope_short_factor[i], c.longrope_long_factor[i]);
    }
    if (c.rope_type == CLMLA_ROPE_TYPE_LLAMA3 &&
        !(c.llama3_low_freq_factor > 0 && c.llama3_high_freq_factor > c.llama3_low_freq_factor && c.yarn_factor > 0))
        return INVALID("llama3 RoPE needs factor > 0 and 0 < low_freq_factor < high_freq_factor (got %g, %g, %g)",
                       c.yarn_factor, c.llama3_low_freq_factor, c.llama3_high_freq_factor);
    if (c.rope_type == CLMLA_ROPE_TYPE_LINEAR && !(c.yarn_factor > 0))
        return INVALID("linear RoPE needs factor > 0 (got %g)", c.yarn_factor);
    if (c.rope_type == CLMLA_ROPE_TYPE_YARN) {
        if (!(c.yarn_factor > 0) || c.yarn_original_max_position < 1 || !(c.yarn_beta_fast > 0) || !(c.yarn_beta_slow > 0) ||
            !(c.yarn_mscale >= 0) || !(c.yarn_mscale_all_dim >= 0))
            return INVALID("YaRN needs factor > 0, original_max_position >= 1, beta_fast > 0, beta_slow > 0 and "
                           "mscales >= 0 (got %g, %d, %g, %g, %g, %g)",
                           c.yarn_factor, c.yarn_original_max_position, c.yarn_beta_fast, c.yarn_beta_slow, c.yarn_mscale,
                              c.yarn_mscale_all_dim);
    } else if (c.yarn_factor != c.yarn_factor || c.yarn_factor < 0) {
        return INVALID("yarn_factor %g is not a number >= 0", c.yarn_factor);
    }
    return CLMLA_SUCCESS;
}

void clmla_tensor_shape_text(const clmla_tensor *t, char *buf, size_t size)
{
    if (t->ndim == 1)
        snprintf(buf, size, "[%lld]", (long long)t->shape[0]);
    else if (t->ndim == 2)
        snprintf(buf, size, "[%lld, %lld]", (long long)t->shape[0], (long long)t->shape[1]);
    else
        snprintf(buf, size, "(%d dimensions)", t->ndim);
}

clmla_tensor clmla_tensor_2d(const float *data, int64_t rows, int64_t cols)
{
    clmla_tensor t = {data, 2, {rows, cols}, CLMLA_DTYPE_F32, NULL};
    return t;
}

clmla_tensor clmla_tensor_1d(const float *data, int64_t size)
{
    clmla_tensor t = {data, 1, {size, 0}, CLMLA_DTYPE_F32, NULL};
    return t;
}
