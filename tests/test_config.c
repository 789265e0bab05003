/* Layer configurations: the presets carry docs/MLA.md section 7, the softmax scale follows section 4,
   and clmla_layer_config_validate rejects what cannot be run. No device needed. */
#include "check.h"
#include "clmla.h"
#include "mla_ref.h"
#include "test_util.h"
#include "tolerance.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* clmla_layer_config_softmax_scale of a configuration that must be valid (NaN, and a failed check, if not). */
static double tau_of(const clmla_layer_config *c)
{
    double tau = NAN;
    CHECK_STATUS(clmla_layer_config_softmax_scale(c, &tau), CLMLA_SUCCESS, NULL);
    return tau;
}

/* docs/MLA.md section 7, written out again here so that a preset cannot agree with itself. */
typedef struct expected_preset {
    clmla_preset preset;
    const char *name;
    int hidden, heads, q_lora_rank, kv_lora_rank, nope, rope, v;
    double theta, yarn_factor;
    int original_max_position;
    double beta_fast, beta_slow, mscale, mscale_all_dim;
    double softmax_scale_doc; /* docs/MLA.md section 4, 6 decimals */
} expected_preset;

static const expected_preset expected[] = {
    {CLMLA_PRESET_DEEPSEEK_V2_LITE, "v2-lite", 2048, 16, 0, 512, 128, 64, 128, 1e4, 40, 4096, 32, 1, 0.707, 0.707,
     0.114721},
    {CLMLA_PRESET_DEEPSEEK_V2, "v2", 5120, 128, 1536, 512, 128, 64, 128, 1e4, 40, 4096, 32, 1, 0.707, 0.707, 0.114721},
    {CLMLA_PRESET_DEEPSEEK_V3, "v3", 7168, 128, 1536, 512, 128, 64, 128, 1e4, 40, 4096, 32, 1, 1.0, 1.0, 0.135234},
    {CLMLA_PRESET_KIMI_K2, "kimi-k2", 7168, 64, 1536, 512, 128, 64, 128, 5e4, 32, 4096, 1, 1, 1.0, 1.0, 0.130861},
};
enum { NUM_PRESETS = sizeof(expected) / sizeof(expected[0]) };

/* The presets added with the other MLA families, against their published configs (docs/MODELS.md
   names the sources), written out again here. */
static void test_family_presets(void)
{
    static const struct {
        clmla_preset preset;
        const char *name;
        int hidden, heads, rq, rkv, dn, dr, dv;
        double theta;
        clmla_rope_pairing pairing;
        clmla_rope_type type;
        double tau; /* written out: dq^-1/2, times g(128, 1)^2 for Mistral Small 4's YaRN */
    } want[] = {
        {CLMLA_PRESET_GLM_4_7_FLASH, "glm-4.7-flash", 2048, 20, 768, 512, 192, 64, 256, 1e6, CLMLA_ROPE_INTERLEAVED,
         CLMLA_ROPE_TYPE_DEFAULT, 0.0625},
        {CLMLA_PRESET_MINICPM3_4B, "minicpm3-4b", 2560, 40, 768, 256, 64, 32, 64, 1e4, CLMLA_ROPE_HALF_SPLIT,
         CLMLA_ROPE_TYPE_LONGROPE, 0.10206207261596575},
        {CLMLA_PRESET_MISTRAL_SMALL_4, "mistral-small-4", 4096, 32, 1024, 256, 64, 64, 128, 1e4, CLMLA_ROPE_INTERLEAVED,
         CLMLA_ROPE_TYPE_YARN, 0.19496949473302966},
        {CLMLA_PRESET_MOONLIGHT, "moonlight", 2048, 16, 0, 512, 128, 64, 128, 5e4, CLMLA_ROPE_INTERLEAVED,
         CLMLA_ROPE_TYPE_DEFAULT, 0.07216878364870323},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        clmla_layer_config c;
        CHECK_STATUS(clmla_layer_config_preset(want[i].preset, &c), CLMLA_SUCCESS, NULL);
        CHECK(strcmp(clmla_preset_name(want[i].preset), want[i].name) == 0, "preset %d is '%s'", (int)want[i].preset,
              clmla_preset_name(want[i].preset));
        CHECK(c.hidden_size == want[i].hidden && c.num_heads == want[i].heads && c.q_lora_rank == want[i].rq &&
                  c.kv_lora_rank == want[i].rkv && c.qk_nope_head_dim == want[i].dn && c.qk_rope_head_dim == want[i].dr &&
                  c.v_head_dim == want[i].dv && c.rope_theta == want[i].theta && c.rope_pairing == want[i].pairing &&
                  c.rope_type == want[i].type,
              "%s: a dimension, theta, pairing or rope type differs", want[i].name);
        CHECK_STATUS(clmla_layer_config_validate(&c), CLMLA_SUCCESS, NULL);
        const double tau = tau_of(&c);
        CHECK(fabs(tau - want[i].tau) <= 1e-7 * want[i].tau, "%s: softmax scale %.10g, expected %.10g", want[i].name, tau,
              want[i].tau);
    }
    clmla_layer_config c;
    clmla_layer_config_preset(CLMLA_PRESET_MINICPM3_4B, &c);
    CHECK(c.longrope_short_factor[0] == 1.0591234137867171 && c.longrope_long_factor[15] == 16.940876586213285 &&
              c.yarn_original_max_position == 32768,
          "minicpm3-4b: LongRoPE factors or original context differ");
    clmla_layer_config_preset(CLMLA_PRESET_MISTRAL_SMALL_4, &c);
    CHECK(c.query_scale_beta == 0.1 && c.query_scale_interval == 8192 && c.yarn_factor == 128 &&
              c.yarn_original_max_position == 8192,
          "mistral-small-4: query scale %g / %d, YaRN %g / %d", c.query_scale_beta, c.query_scale_interval, c.yarn_factor,
          c.yarn_original_max_position);
}

/* The value a 0-means-default field stands for. */
static double or_default(double v, double def)
{
    return v == 0.0 ? def : v;
}

static void test_presets(void)
{
    for (int i = 0; i < NUM_PRESETS; i++) {
        const expected_preset *e = &expected[i];
        clmla_layer_config c;
        memset(&c, 0xA5, sizeof(c)); /* the preset must set every field */
        CHECK_STATUS(clmla_layer_config_preset(e->preset, &c), CLMLA_SUCCESS, NULL);
        CHECK(c.hidden_size == e->hidden, "%s hidden_size %d, expected %d", e->name, c.hidden_size, e->hidden);
        CHECK(c.num_heads == e->heads, "%s num_heads %d, expected %d", e->name, c.num_heads, e->heads);
        CHECK(c.q_lora_rank == e->q_lora_rank, "%s q_lora_rank %d, expected %d", e->name, c.q_lora_rank,
              e->q_lora_rank);
        CHECK(c.kv_lora_rank == e->kv_lora_rank, "%s kv_lora_rank %d", e->name, c.kv_lora_rank);
        CHECK(c.qk_nope_head_dim == e->nope && c.qk_rope_head_dim == e->rope && c.v_head_dim == e->v,
              "%s dn/dr/dv %d/%d/%d, expected %d/%d/%d", e->name, c.qk_nope_head_dim, c.qk_rope_head_dim,
              c.v_head_dim, e->nope, e->rope, e->v);
        CHECK(or_default(c.rms_norm_eps, 1e-6) == 1e-6, "%s rms_norm_eps %g", e->name, c.rms_norm_eps);
        CHECK(or_default(c.rope_theta, 1e4) == e->theta, "%s rope_theta %g, expected %g", e->name, c.rope_theta,
              e->theta);
        CHECK(c.rope_pairing == CLMLA_ROPE_INTERLEAVED, "%s pairing %d, expected interleaved", e->name,
              (int)c.rope_pairing);
        CHECK(c.yarn_factor == e->yarn_factor, "%s yarn_factor %g, expected %g", e->name, c.yarn_factor,
              e->yarn_factor);
        int L = c.yarn_original_max_position == 0 ? 4096 : c.yarn_original_max_position;
        CHECK(L == e->original_max_position, "%s yarn L %d", e->name, L);
        CHECK(or_default(c.yarn_beta_fast, 32) == e->beta_fast && or_default(c.yarn_beta_slow, 1) == e->beta_slow,
              "%s beta %g/%g, expected %g/%g", e->name, c.yarn_beta_fast, c.yarn_beta_slow, e->beta_fast,
              e->beta_slow);
        CHECK(c.yarn_mscale == e->mscale && c.yarn_mscale_all_dim == e->mscale_all_dim,
              "%s mscale %g/%g, expected %g/%g", e->name, c.yarn_mscale, c.yarn_mscale_all_dim, e->mscale,
              e->mscale_all_dim);
        CHECK_STATUS(clmla_layer_config_validate(&c), CLMLA_SUCCESS, NULL);

        /* Softmax scale: the exact section 4 formula (via the reference), and the printed digits. */
        double tau = tau_of(&c);
        mla_ref_config rc;
        tu_ref_config(&c, &rc);
        double want = mla_ref_softmax_scale(&rc);
        CHECK(fabs(tau - want) <= TOL_SOFTMAX_SCALE_REL * want, "%s softmax scale %.12g, reference %.12g", e->name,
              tau, want);
        CHECK(fabs(tau - e->softmax_scale_doc) <= TOL_SOFTMAX_SCALE_DOC_ABS, "%s softmax scale %.9f, docs/MLA.md says %.6f",
              e->name, tau, e->softmax_scale_doc);
        /* Written out: dq^-1/2 * (0.1 mscale_all_dim ln s + 1)^2. */
        double g = 0.1 * e->mscale_all_dim * log(e->yarn_factor) + 1.0;
        double formula = g * g / sqrt((double)(e->nope + e->rope));
        CHECK(fabs(tau - formula) <= TOL_SOFTMAX_SCALE_REL * formula, "%s softmax scale %.12g, formula %.12g",
              e->name, tau, formula);

        /* Names, both ways, in any case. */
        const char *name = clmla_preset_name(e->preset);
        CHECK(name && strcmp(name, e->name) == 0, "preset %d name '%s', expected '%s'", (int)e->preset,
              name ? name : "(null)", e->name);
        char upper[32];
        size_t n = strlen(e->name);
        for (size_t k = 0; k <= n; k++)
            upper[k] = (char)(e->name[k] >= 'a' && e->name[k] <= 'z' ? e->name[k] - 32 : e->name[k]);
        clmla_preset p = (clmla_preset)-1;
        CHECK_STATUS(clmla_preset_from_name(e->name, &p), CLMLA_SUCCESS, NULL);
        CHECK(p == e->preset, "from_name('%s') gave %d", e->name, (int)p);
        p = (clmla_preset)-1;
        CHECK_STATUS(clmla_preset_from_name(upper, &p), CLMLA_SUCCESS, NULL);
        CHECK(p == e->preset, "from_name('%s') gave %d", upper, (int)p);
    }

    /* The two V2 presets differ only where the table says. */
    clmla_layer_config lite, v2;
    clmla_layer_config_preset(CLMLA_PRESET_DEEPSEEK_V2_LITE, &lite);
    clmla_layer_config_preset(CLMLA_PRESET_DEEPSEEK_V2, &v2);
    CHECK(tau_of(&lite) == tau_of(&v2),
          "V2-Lite and V2 share the softmax scale");

    /* Unknown presets and names, NULL pointers. */
    clmla_layer_config c;
    CHECK_STATUS(clmla_layer_config_preset((clmla_preset)8, &c), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_layer_config_preset((clmla_preset)-1, &c), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_layer_config_preset(CLMLA_PRESET_DEEPSEEK_V3, NULL), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK(clmla_preset_name((clmla_preset)8) == NULL, "name of preset 8");
    CHECK(clmla_preset_name((clmla_preset)-1) == NULL, "name of preset -1");
    clmla_preset p = CLMLA_PRESET_KIMI_K2;
    static const char *bad_names[] = {"", "v4", "v2-lite ", " v3", "deepseek", "v2lite", "kimi"};
    for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
        CHECK_STATUS(clmla_preset_from_name(bad_names[i], &p), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
        CHECK(p == CLMLA_PRESET_KIMI_K2, "'%s': preset changed to %d on failure", bad_names[i], (int)p);
    }
    CHECK_STATUS(clmla_preset_from_name(NULL, &p), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_preset_from_name("v3", NULL), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
}

/* The softmax scale of configurations other than the presets, against the reference and, where it
   is simple, the formula written out. */
static void test_softmax_scale(void)
{
    struct {
        int nope, rope;
        double factor, mscale, mscale_all_dim;
    } cases[] = {
        {128, 64, 0.0, 0.0, 0.0},    /* YaRN off: dq^-1/2 */
        {128, 64, 1.0, 1.0, 1.0},    /* factor 1 is off too */
        {128, 64, 0.5, 1.0, 1.0},    /* factor < 1 is off */
        {13, 8, 40.0, 0.707, 0.0},   /* HF default mscale_all_dim 0: g = 1 */
        {13, 8, 40.0, 1.0, 0.5},     /* only mscale_all_dim enters tau */
        {64, 32, 4.0, 1.0, 1.0},
        {1, 2, 1000.0, 0.3, 2.5},
        {2, 6, 16.0, 1.0, 0.707},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        clmla_layer_config c = tu_small_config(64, 4, 0, 32, cases[i].nope, cases[i].rope, 16);
        c.yarn_factor = cases[i].factor;
        c.yarn_mscale = cases[i].mscale;
        c.yarn_mscale_all_dim = cases[i].mscale_all_dim;
        double tau = tau_of(&c);
        mla_ref_config rc;
        tu_ref_config(&c, &rc);
        double want = mla_ref_softmax_scale(&rc);
        double g = cases[i].factor > 1.0 ? 0.1 * cases[i].mscale_all_dim * log(cases[i].factor) + 1.0 : 1.0;
        double formula = g * g / sqrt((double)(cases[i].nope + cases[i].rope));
        CHECK(fabs(tau - want) <= TOL_SOFTMAX_SCALE_REL * want && fabs(tau - formula) <= TOL_SOFTMAX_SCALE_REL * formula,
              "case %zu (dq %d, s %g, mscale_all_dim %g): scale %.12g, reference %.12g, formula %.12g", i,
              cases[i].nope + cases[i].rope, cases[i].factor, cases[i].mscale_all_dim, tau, want, formula);
    }
}

static clmla_layer_config valid_config(void)
{
    clmla_layer_config c = tu_small_config(37, 3, 0, 40, 13, 8, 11);
    return c;
}

/* One invalid configuration: the status, and a reason in clmla_last_error(NULL). */
#define EXPECT_INVALID(cfg, what)                                                                           \
    do {                                                                                                    \
        clmla_status st_ = clmla_layer_config_validate(&(cfg));                                             \
        CHECK(st_ == CLMLA_ERROR_INVALID_CONFIG, "%s: status %s, expected CLMLA_ERROR_INVALID_CONFIG", what, \
              clmla_status_string(st_));                                                                    \
        if (st_ == CLMLA_ERROR_INVALID_CONFIG)                                                              \
            CHECK(clmla_last_error(NULL)[0] != '\0', "%s: no reason given", what);                          \
    } while (0)

static void test_validate(void)
{
    clmla_layer_config c = valid_config();
    CHECK_STATUS(clmla_layer_config_validate(&c), CLMLA_SUCCESS, NULL);
    clmla_layer_config with_q = c;
    with_q.q_lora_rank = 5;
    CHECK_STATUS(clmla_layer_config_validate(&with_q), CLMLA_SUCCESS, NULL);
    clmla_layer_config tiny = tu_small_config(1, 1, 1, 1, 1, 2, 1);
    CHECK_STATUS(clmla_layer_config_validate(&tiny), CLMLA_SUCCESS, NULL);
    clmla_layer_config half = c;
    half.rope_pairing = CLMLA_ROPE_HALF_SPLIT;
    half.yarn_factor = 40;
    half.yarn_mscale = 0.707;
    half.yarn_mscale_all_dim = 0.707;
    CHECK_STATUS(clmla_layer_config_validate(&half), CLMLA_SUCCESS, NULL);
    /* With YaRN off the yarn_* fields are ignored, whatever they hold. */
    clmla_layer_config yarn_off = c;
    yarn_off.yarn_factor = 1.0;
    yarn_off.yarn_original_max_position = -5;
    yarn_off.yarn_beta_fast = -1;
    CHECK_STATUS(clmla_layer_config_validate(&yarn_off), CLMLA_SUCCESS, NULL);

    clmla_layer_config zero;
    memset(&zero, 0, sizeof(zero));
    EXPECT_INVALID(zero, "all-zero config");

    /* Every size, zero and negative (q_lora_rank 0 means absent, so only negative). */
    int *fields[] = {&c.hidden_size, &c.num_heads, &c.kv_lora_rank, &c.qk_nope_head_dim, &c.qk_rope_head_dim,
                     &c.v_head_dim, &c.q_lora_rank};
    const char *names[] = {"hidden_size", "num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                           "v_head_dim", "q_lora_rank"};
    for (int f = 0; f < 7; f++) {
        const int values[] = {0, -1, -2, INT_MIN};
        for (int k = f == 6 ? 1 : 0; k < 4; k++) {
            c = valid_config();
            *fields[f] = values[k];
            char what[64];
            snprintf(what, sizeof(what), "%s = %d", names[f], values[k]);
            EXPECT_INVALID(c, what);
        }
    }

    c = valid_config();
    c.qk_rope_head_dim = 7;
    EXPECT_INVALID(c, "odd rope dim 7");
    c.qk_rope_head_dim = 1;
    EXPECT_INVALID(c, "odd rope dim 1");

    /* Products and sums that overflow a dimension: the sizes an entry sets (those it leaves 0 are
       valid_config's). */
    static const struct {
        int hidden_size, num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, q_lora_rank;
        const char *what;
    } overflows[] = {
        {.hidden_size = 1 << 30, .num_heads = 1 << 30, .what = "hidden 2^30 x heads 2^30"},
        {.num_heads = 1 << 16, .qk_nope_head_dim = 1 << 15, .v_head_dim = 1 << 15, .what = "heads * (dn + dv) = 2^32"},
        {.num_heads = 1 << 20, .qk_nope_head_dim = 1 << 11, .qk_rope_head_dim = 1 << 11,
         .what = "heads * (dn + dr) = 2^32"},
        {.kv_lora_rank = INT_MAX, .what = "kv_lora_rank + rope dim past INT_MAX"},
        {.qk_nope_head_dim = INT_MAX - 4, .what = "dn + dr past INT_MAX"},
        {.q_lora_rank = 1 << 30, .hidden_size = 1 << 30, .what = "q_lora_rank 2^30 x hidden 2^30"},
    };
    for (size_t i = 0; i < sizeof(overflows) / sizeof(overflows[0]); i++) {
        const int sizes[7] = {overflows[i].hidden_size,      overflows[i].num_heads,        overflows[i].kv_lora_rank,
                              overflows[i].qk_nope_head_dim, overflows[i].qk_rope_head_dim, overflows[i].v_head_dim,
                              overflows[i].q_lora_rank}; /* in the order of fields */
        c = valid_config();
        for (int f = 0; f < 7; f++)
            if (sizes[f])
                *fields[f] = sizes[f];
        EXPECT_INVALID(c, overflows[i].what);
    }
    /* An attention factor only yarn and longrope have: refused, not applied or ignored. */
    const clmla_rope_type no_factor[] = {CLMLA_ROPE_TYPE_DEFAULT, CLMLA_ROPE_TYPE_LINEAR, CLMLA_ROPE_TYPE_LLAMA3,
                                         CLMLA_ROPE_TYPE_NONE};
    for (size_t i = 0; i < sizeof(no_factor) / sizeof(no_factor[0]); i++) {
        c = valid_config();
        c.rope_type = no_factor[i];
        c.yarn_factor = 4;
        c.llama3_low_freq_factor = 1;
        c.llama3_high_freq_factor = 4;
        CHECK_STATUS(clmla_layer_config_validate(&c), CLMLA_SUCCESS, NULL);
        c.rope_attention_factor = 1.5;
        char what[64];
        snprintf(what, sizeof(what), "rope_attention_factor with rope_type %d", (int)no_factor[i]);
        EXPECT_INVALID(c, what);
    }

    /* Malformed values. */
    c = valid_config();
    c.rope_pairing = (clmla_rope_pairing)2;
    EXPECT_INVALID(c, "rope pairing 2");
    c.rope_pairing = (clmla_rope_pairing)-1;
    EXPECT_INVALID(c, "rope pairing -1");
    c = valid_config();
    c.rms_norm_eps = -1e-6;
    EXPECT_INVALID(c, "negative rms_norm_eps");
    c.rms_norm_eps = NAN;
    EXPECT_INVALID(c, "NaN rms_norm_eps");
    c = valid_config();
    c.rope_theta = -10000;
    EXPECT_INVALID(c, "negative rope_theta");
    c.rope_theta = NAN;
    EXPECT_INVALID(c, "NaN rope_theta");
    c = valid_config();
    c.yarn_factor = NAN;
    EXPECT_INVALID(c, "NaN yarn_factor");
    c = valid_config();
    c.yarn_factor = INFINITY;
    EXPECT_INVALID(c, "infinite yarn_factor");
    c = valid_config();
    c.yarn_factor = 40;
    c.yarn_original_max_position = -4096;
    EXPECT_INVALID(c, "YaRN with negative original_max_position");
    c = valid_config();
    c.yarn_factor = 40;
    c.yarn_beta_fast = -32;
    EXPECT_INVALID(c, "YaRN with negative beta_fast");
    c = valid_config();
    c.yarn_factor = 40;
    c.yarn_beta_slow = NAN;
    EXPECT_INVALID(c, "YaRN with NaN beta_slow");
    c = valid_config();
    c.yarn_factor = 40;
    c.yarn_mscale_all_dim = NAN;
    EXPECT_INVALID(c, "YaRN with NaN mscale_all_dim");

    CHECK_STATUS(clmla_layer_config_validate(NULL), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
}

static void test_tensor_helpers(void)
{
    static const float data[15] = {0};
    clmla_tensor t = clmla_tensor_2d(data, 3, 5);
    CHECK(t.data == data && t.ndim == 2 && t.shape[0] == 3 && t.shape[1] == 5, "tensor_2d: ndim %d shape %lld x %lld",
          t.ndim, (long long)t.shape[0], (long long)t.shape[1]);
    t = clmla_tensor_1d(data, 7);
    CHECK(t.data == data && t.ndim == 1 && t.shape[0] == 7, "tensor_1d: ndim %d shape %lld", t.ndim,
          (long long)t.shape[0]);
    t = clmla_tensor_2d(NULL, (int64_t)1 << 40, 3);
    CHECK(t.data == NULL && t.shape[0] == ((int64_t)1 << 40), "tensor_2d keeps 64-bit rows");
}

int main(void)
{
    test_presets();
    test_family_presets();
    test_softmax_scale();
    test_validate();
    test_tensor_helpers();
    return check_summary();
}
