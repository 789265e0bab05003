/* config.json as transformers reads it, per MLA family (host/io/config.c, docs/MODELS.md): both RoPE
   layouts and their precedence, every rope type, the family defaults and fixed choices, the layer
   sets, and the refusals by name. Expected values are written out here from transformers' and
   DeepSeek's code, not taken from clmla. No device needed. */
#include "check.h"
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* clmla_layer_config_softmax_scale of a configuration that must be valid (NaN, and a failed check, if not). */
static double tau_of(const clmla_layer_config *c)
{
    double tau = NAN;
    CHECK_STATUS(clmla_layer_config_softmax_scale(c, &tau), CLMLA_SUCCESS, NULL);
    return tau;
}

/* A small DeepSeek-shaped config of `model_type` with `extra` JSON members appended. */
static const char *make(const char *model_type, const char *extra)
{
    static char text[8192];
    snprintf(text, sizeof(text),
             "{\"model_type\": \"%s\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"num_hidden_layers\": 3,"
             " \"q_lora_rank\": 24, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8,"
             " \"v_head_dim\": 16, \"max_position_embeddings\": 2048%s%s}",
             model_type, extra[0] ? ", " : "", extra);
    return text;
}

static clmla_model_desc parse_ok(const char *text, const char *what)
{
    clmla_model_desc d;
    char err[2048] = "";
    const clmla_status st = clmla_model_config_parse(text, strlen(text), "m/config.json", &d, err, sizeof(err));
    CHECK(st == CLMLA_SUCCESS, "%s: %s", what, err);
    if (st != CLMLA_SUCCESS)
        memset(&d, 0, sizeof(d));
    return d;
}

static void parse_fails(const char *text, clmla_status want, const char *needle, const char *what)
{
    clmla_model_desc d;
    char err[2048] = "";
    const clmla_status st = clmla_model_config_parse(text, strlen(text), "m/config.json", &d, err, sizeof(err));
    CHECK(st == want, "%s: status %s, expected %s (%s)", what, clmla_status_string(st), clmla_status_string(want), err);
    CHECK(strstr(err, "m/config.json") && strstr(err, needle), "%s: message \"%s\" lacks \"%s\"", what, err, needle);
    if (st == CLMLA_SUCCESS)
        clmla_model_desc_free(&d);
}

#define NEAR(a, b) (fabs((a) - (b)) <= 1e-12 * fabs(b))

/* YaRN's g(s, m) = 0.1 m ln s + 1, written out. */
static double g(double s, double m)
{
    return s <= 1 ? 1 : 0.1 * m * log(s) + 1;
}

static void test_layouts(void)
{
    /* transformers 5 writes rope_parameters and no top-level rope_theta. */
    clmla_model_desc d = parse_ok(make("deepseek_v3", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 50000,"
                                                      " \"factor\": 40, \"original_max_position_embeddings\": 4096,"
                                                      " \"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": 0.707,"
                                                      " \"mscale_all_dim\": 0.707}"),
                                  "rope_parameters layout");
    CHECK(d.layer.rope_type == CLMLA_ROPE_TYPE_YARN && d.layer.rope_theta == 50000 && d.layer.yarn_factor == 40 &&
              d.layer.yarn_original_max_position == 4096 && NEAR(d.layer.rope_attention_factor, 1.0),
          "rope_parameters: type %d theta %g factor %g L %d A %g", (int)d.layer.rope_type, d.layer.rope_theta,
          d.layer.yarn_factor, d.layer.yarn_original_max_position, d.layer.rope_attention_factor);
    const double tau = 1 / sqrt(24.0) * g(40, 0.707) * g(40, 0.707);
    CHECK(NEAR(tau_of(&d.layer), tau), "softmax scale %.12g, expected %.12g",
          tau_of(&d.layer), tau);
    clmla_model_desc_free(&d);

    /* The dict's rope_theta wins over the top-level key; rope_type over type. */
    d = parse_ok(make("deepseek_v3", "\"rope_theta\": 10000, \"rope_parameters\": {\"rope_type\": \"default\", \"type\": \"yarn\","
                                     " \"rope_theta\": 777}"),
                 "precedence");
    CHECK(d.layer.rope_theta == 777 && d.layer.rope_type == CLMLA_ROPE_TYPE_DEFAULT, "theta %g type %d", d.layer.rope_theta,
          (int)d.layer.rope_type);
    clmla_model_desc_free(&d);

    /* A non-empty legacy rope_scaling replaces rope_parameters wholesale; the top-level theta stays. */
    d = parse_ok(make("youtu", "\"rope_theta\": 20000, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2},"
                               " \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 8, \"rope_theta\": 5}"),
                 "legacy wins");
    CHECK(d.layer.rope_type == CLMLA_ROPE_TYPE_LINEAR && d.layer.yarn_factor == 2 && d.layer.rope_theta == 20000,
          "legacy: type %d factor %g theta %g", (int)d.layer.rope_type, d.layer.yarn_factor, d.layer.rope_theta);
    clmla_model_desc_free(&d);

    /* An empty rope_scaling does not: rope_parameters stands. */
    d = parse_ok(make("youtu", "\"rope_scaling\": {}, \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 3}"),
                 "empty legacy");
    CHECK(d.layer.rope_type == CLMLA_ROPE_TYPE_LINEAR && d.layer.yarn_factor == 3, "empty rope_scaling: type %d",
          (int)d.layer.rope_type);
    clmla_model_desc_free(&d);

    /* Neither layout: default RoPE with the family's default theta. */
    d = parse_ok(make("deepseek_v3", ""), "no rope keys");
    CHECK(d.layer.rope_type == CLMLA_ROPE_TYPE_DEFAULT && d.layer.rope_theta == 1e4, "no rope keys: type %d theta %g",
          (int)d.layer.rope_type, d.layer.rope_theta);
    clmla_model_desc_free(&d);

    /* YaRN's original length, by the config's family and members */
    static const struct {
        const char *family, *extra, *what;
        int want;
    } originals[] = {
        /* a top-level original_max_position_embeddings overrides the dict's (transformers) */
        {"youtu",
         "\"original_max_position_embeddings\": 512, \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4,"
         " \"original_max_position_embeddings\": 1024}",
         "top-level original", 512},
        /* absent: max_position_embeddings in transformers' reading, 4096 in DeepSeek's code */
        {"youtu", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4}",
         "original absent (max_position_embeddings)", 2048},
        {"deepseek_v2", "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}", "remote original absent (DeepSeek legacy)",
         4096},
    };
    for (size_t i = 0; i < sizeof(originals) / sizeof(originals[0]); i++) {
        d = parse_ok(make(originals[i].family, originals[i].extra), originals[i].what);
        CHECK(d.layer.yarn_original_max_position == originals[i].want, "%s: original %d, expected %d", originals[i].what,
              d.layer.yarn_original_max_position, originals[i].want);
        clmla_model_desc_free(&d);
    }
}

static void test_yarn_amplitude(void)
{
    /* The amplitude A, by the layout: only mscale_all_dim: DeepSeek's code g(s,1)/g(s,m_all),
       transformers g(s,1); only mscale: DeepSeek g(s, m) (transformers g(s, 1)). */
    const struct {
        const char *family, *extra, *what;
        double want;
    } amplitudes[] = {
        {"deepseek_v3", "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"mscale_all_dim\": 0.707}", "remote yarn",
         g(40, 1) / g(40, 0.707)},
        {"deepseek_v3", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 40, \"mscale_all_dim\": 0.707}",
         "transformers yarn", g(40, 1)},
        {"kimi_k2", "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 32, \"mscale\": 0.5}", "remote mscale", g(32, 0.5)},
    };
    clmla_model_desc d;
    for (size_t i = 0; i < sizeof(amplitudes) / sizeof(amplitudes[0]); i++) {
        d = parse_ok(make(amplitudes[i].family, amplitudes[i].extra), amplitudes[i].what);
        CHECK(NEAR(d.layer.rope_attention_factor, amplitudes[i].want), "%s: A %.12g, expected %.12g", amplitudes[i].what,
              d.layer.rope_attention_factor, amplitudes[i].want);
        clmla_model_desc_free(&d);
    }
    /* attention_factor wins; truncate false; beta 0 means the default. */
    d = parse_ok(make("youtu", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 8, \"attention_factor\": 1.5,"
                               " \"truncate\": false, \"beta_fast\": 0, \"mscale\": 1, \"mscale_all_dim\": 1}"),
                 "attention_factor");
    CHECK(d.layer.rope_attention_factor == 1.5 && d.layer.yarn_no_truncate == 1 && d.layer.yarn_beta_fast == 32,
          "A %g truncate-off %d beta_fast %g", d.layer.rope_attention_factor, d.layer.yarn_no_truncate, d.layer.yarn_beta_fast);
    clmla_model_desc_free(&d);
    /* factor null: max_position_embeddings / original. */
    d = parse_ok(make("youtu", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": null,"
                               " \"original_max_position_embeddings\": 512}"),
                 "factor null");
    CHECK(d.layer.yarn_factor == 4, "factor %g, expected 2048/512", d.layer.yarn_factor);
    clmla_model_desc_free(&d);
}

static void test_families(void)
{
    /* minicpm3: half-split whatever rope_interleave says, v_head_dim from D/H, longrope. */
    clmla_model_desc d = parse_ok(
        "{\"model_type\": \"minicpm3\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"num_hidden_layers\": 2,"
        " \"q_lora_rank\": 24, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8,"
        " \"max_position_embeddings\": 64, \"rope_interleave\": true, \"rope_scaling\": {\"type\": \"longrope\","
        " \"short_factor\": [1, 1.5, 2, 2.5], \"long_factor\": [3, 4, 5, 6], \"original_max_position_embeddings\": 16}}",
        "minicpm3");
    CHECK(d.layer.rope_pairing == CLMLA_ROPE_HALF_SPLIT && d.layer.v_head_dim == 16 &&
              d.layer.rope_type == CLMLA_ROPE_TYPE_LONGROPE && d.layer.longrope_short_factor[3] == 2.5 &&
              d.layer.longrope_long_factor[0] == 3 && d.layer.yarn_factor == 4 && d.layer.yarn_original_max_position == 16,
          "minicpm3: pairing %d dv %d type %d factor %g", (int)d.layer.rope_pairing, d.layer.v_head_dim,
          (int)d.layer.rope_type, d.layer.yarn_factor);
    clmla_model_desc_free(&d);
    parse_fails(make("minicpm3", "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 1, 1],"
                                 " \"long_factor\": [1, 1, 1, 1]}"),
                CLMLA_ERROR_INVALID_CONFIG, "short_factor\" must be a list of 4 numbers", "longrope length");

    /* longcat_flash: two attentions per layer, theta 1e7, latent scales sqrt(D/rq), sqrt(D/rkv). */
    d = parse_ok("{\"model_type\": \"longcat_flash\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"num_layers\": 2,"
                 " \"q_lora_rank\": 16, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8,"
                 " \"head_dim\": 8, \"v_head_dim\": 16}",
                 "longcat_flash");
    CHECK(d.num_layers == 2 && d.attentions_per_layer == 2 && d.layer.rope_theta == 1e7 &&
              NEAR(d.layer.q_latent_scale, 2.0) && NEAR(d.layer.kv_latent_scale, sqrt(2.0)) &&
              d.layer.rope_pairing == CLMLA_ROPE_INTERLEAVED,
          "longcat: layers %d x %d theta %g scales %g %g", d.num_layers, d.attentions_per_layer, d.layer.rope_theta,
          d.layer.q_latent_scale, d.layer.kv_latent_scale);
    clmla_model_desc_free(&d);

    /* kimi_linear: no rotation; MLA layers from linear_attn_config (1-based), layer_types first. */
    d = parse_ok(make("kimi_linear", "\"num_hidden_layers\": 9, \"linear_attn_config\": {\"full_attn_layers\": [4, 9],"
                                     " \"kda_layers\": [1, 2, 3, 5, 6, 7, 8]}, \"rope_scaling\": {\"type\": \"dynamic\"}"),
                 "kimi_linear");
    CHECK(d.layer.rope_type == CLMLA_ROPE_TYPE_NONE && d.is_mla && d.is_mla[3] && d.is_mla[8] && !d.is_mla[0] &&
              !d.is_mla[4],
          "kimi_linear: type %d, layer 3 %d, layer 8 %d", (int)d.layer.rope_type, d.is_mla ? d.is_mla[3] : -1,
          d.is_mla ? d.is_mla[8] : -1);
    CHECK(NEAR(tau_of(&d.layer), 1 / sqrt(24.0)), "kimi_linear tau %g",
          tau_of(&d.layer));
    clmla_model_desc_free(&d);
    d = parse_ok(make("kimi_linear", "\"num_hidden_layers\": 9"), "kimi_linear default layers");
    CHECK(d.is_mla && !d.is_mla[0] && d.is_mla[4] && d.is_mla[8] && !d.is_mla[5], "kimi_linear default: i > 0 and i %% 4 == 0");
    clmla_model_desc_free(&d);
    parse_fails(make("kimi_linear", "\"mla_use_nope\": false"), CLMLA_ERROR_INVALID_CONFIG, "mla_use_nope", "kimi nope");
    /* A corrupt layer count is refused by name before any per-layer flags are allocated or walked (the
       fuzzer's timeout: kimi_linear's default layer walk over 2^31 - 1 layers). */
    parse_fails(make("kimi_linear", "\"num_hidden_layers\": 2147483647"), CLMLA_ERROR_INVALID_CONFIG,
                "\"num_hidden_layers\" gives 2147483647 decoder layers", "kimi huge layer count");
    parse_fails(make("deepseek_v3", "\"num_hidden_layers\": 4097"), CLMLA_ERROR_INVALID_CONFIG, "at most 4096",
                "v3 layer count past the bound");
    d = parse_ok(make("deepseek_v3", "\"num_hidden_layers\": 4096"), "v3 layer count at the bound");
    CHECK(d.num_layers == 4096, "v3 layers %d", d.num_layers);
    clmla_model_desc_free(&d);

    /* deepseek_v32 / glm_moe_dsa: the indexer's fields and transformers' defaults (64 / 32 heads of 128,
       top-k 2048, half-split / interleaved RoPE, eps 1e-6), "indexer_rope_interleave" overriding the
       pairing, and glm_moe_dsa's "shared" layers from each of the three keys that set them. */
    d = parse_ok(make("deepseek_v32", "\"index_topk\": 100"), "deepseek_v32");
    CHECK(d.layer.index_topk == 100 && d.layer.index_n_heads == 64 && d.layer.index_head_dim == 128 &&
              d.layer.index_rope_pairing == CLMLA_ROPE_HALF_SPLIT && d.layer.index_norm_eps == 1e-6 &&
              d.layer.dense_max_keys == 0 && !d.index_shared,
          "deepseek_v32: top-k %d, %d heads of %d, pairing %d, eps %g, dense_max_keys %d", d.layer.index_topk,
          d.layer.index_n_heads, d.layer.index_head_dim, (int)d.layer.index_rope_pairing, d.layer.index_norm_eps,
          d.layer.dense_max_keys);
    clmla_model_desc_free(&d);
    d = parse_ok(make("deepseek_v32", "\"indexer_rope_interleave\": true, \"index_n_heads\": 8, \"index_head_dim\": 32"),
                 "deepseek_v32 interleaved");
    CHECK(d.layer.index_rope_pairing == CLMLA_ROPE_INTERLEAVED && d.layer.index_n_heads == 8 &&
              d.layer.index_head_dim == 32, "deepseek_v32 interleaved: pairing %d", (int)d.layer.index_rope_pairing);
    clmla_model_desc_free(&d);
    d = parse_ok(make("glm_moe_dsa", ""), "glm_moe_dsa");
    CHECK(d.layer.index_topk == 2048 && d.layer.index_n_heads == 32 &&
              d.layer.index_rope_pairing == CLMLA_ROPE_INTERLEAVED && d.index_shared && !d.index_shared[0] &&
              !d.index_shared[1],
          "glm_moe_dsa defaults: top-k %d, %d heads, pairing %d", d.layer.index_topk, d.layer.index_n_heads,
          (int)d.layer.index_rope_pairing);
    clmla_model_desc_free(&d);
    d = parse_ok(make("glm_moe_dsa", "\"num_hidden_layers\": 6, \"index_topk_freq\": 2"), "glm_moe_dsa freq 2");
    /* transformers: full where max(i - offset + 1, 0) % freq == 0, offset 2: layers 0, 1, 3, 5 */
    CHECK(d.index_shared && !d.index_shared[0] && !d.index_shared[1] && d.index_shared[2] && !d.index_shared[3] &&
              d.index_shared[4] && !d.index_shared[5], "glm_moe_dsa index_topk_freq 2");
    clmla_model_desc_free(&d);
    d = parse_ok(make("glm_moe_dsa", "\"num_hidden_layers\": 3, \"index_topk_pattern\": \"FSF\""), "glm pattern");
    CHECK(d.index_shared && !d.index_shared[0] && d.index_shared[1] && !d.index_shared[2], "glm_moe_dsa pattern FSF");
    clmla_model_desc_free(&d);
    d = parse_ok(make("glm_moe_dsa", "\"num_hidden_layers\": 2, \"indexer_types\": [\"full\", \"shared\"]"),
                 "glm indexer_types");
    CHECK(d.index_shared && !d.index_shared[0] && d.index_shared[1], "glm_moe_dsa indexer_types");
    clmla_model_desc_free(&d);
    parse_fails(make("glm_moe_dsa", "\"num_hidden_layers\": 2, \"indexer_types\": [\"full\", \"half\"]"),
                CLMLA_ERROR_INVALID_FILE, "indexer_types", "glm bad indexer_types");
    parse_fails(make("glm_moe_dsa", "\"num_hidden_layers\": 2, \"index_topk_pattern\": \"FX\""),
                CLMLA_ERROR_INVALID_FILE, "index_topk_pattern", "glm bad pattern");

    /* mistral4: width int((dn+dr) pf) = dr, a non-default type, the query scale's beta and interval. */
    d = parse_ok(make("mistral4", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4,"
                                  " \"original_max_position_embeddings\": 8, \"llama_4_scaling_beta\": 0.1,"
                                  " \"partial_rotary_factor\": 0.3333333333333333}"),
                 "mistral4");
    CHECK(d.layer.query_scale_beta == 0.1 && d.layer.query_scale_interval == 8, "mistral4 beta %g interval %d",
          d.layer.query_scale_beta, d.layer.query_scale_interval);
    clmla_model_desc_free(&d);
    parse_fails(make("mistral4", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4,"
                                 " \"partial_rotary_factor\": 0.3333333333333333}"),
                CLMLA_ERROR_INVALID_FILE, "llama_4_scaling_beta", "mistral4 beta");
    parse_fails(make("mistral4", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4, \"llama_4_scaling_beta\": 0.1,"
                                 " \"partial_rotary_factor\": 0.5}"),
                CLMLA_ERROR_INVALID_CONFIG, "rotary width", "mistral4 width");
    parse_fails(make("mistral4", "\"rope_parameters\": {\"rope_type\": \"default\"}"), CLMLA_ERROR_INVALID_CONFIG,
                "\"default\"", "mistral4 default type");

    /* glm4_moe_lite: the default type honours partial_rotary_factor; head_dim aliases dr. */
    parse_fails(make("glm4_moe_lite", "\"partial_rotary_factor\": 0.5"), CLMLA_ERROR_INVALID_CONFIG, "rotary width",
                "glm4_moe_lite pf");
    d = parse_ok(make("glm4_moe_lite", "\"partial_rotary_factor\": 1.0, \"rope_theta\": 1000000"), "glm4_moe_lite");
    CHECK(d.layer.rope_theta == 1e6, "glm theta %g", d.layer.rope_theta);
    clmla_model_desc_free(&d);
    parse_fails(make("deepseek_v3", "\"head_dim\": 12"), CLMLA_ERROR_INVALID_CONFIG, "head_dim", "v3 head_dim");

    /* deepseek_v2: always interleaved; sarvam_mla: deepseek_yarn is yarn. */
    d = parse_ok(make("deepseek_v2", "\"rope_interleave\": false"), "v2 interleave");
    CHECK(d.layer.rope_pairing == CLMLA_ROPE_INTERLEAVED, "deepseek_v2 ignores rope_interleave");
    clmla_model_desc_free(&d);
    d = parse_ok(make("sarvam_mla", "\"rope_scaling\": {\"type\": \"deepseek_yarn\", \"factor\": 4,"
                                    " \"original_max_position_embeddings\": 512}"),
                 "sarvam");
    CHECK(d.layer.rope_type == CLMLA_ROPE_TYPE_YARN, "sarvam type %d", (int)d.layer.rope_type);
    clmla_model_desc_free(&d);

    /* Wrappers. */
    d = parse_ok("{\"model_type\": \"kimi_k25\", \"text_config\": {\"model_type\": \"kimi_k2\", \"hidden_size\": 64,"
                 " \"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"q_lora_rank\": 24, \"kv_lora_rank\": 32,"
                 " \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, \"rope_theta\": 50000}}",
                 "kimi_k25");
    CHECK(strcmp(d.model_type, "deepseek_v3") == 0 && d.layer.rope_theta == 50000, "kimi_k25: %s", d.model_type);
    clmla_model_desc_free(&d);
    parse_fails("{\"model_type\": \"mistral3\", \"text_config\": {\"model_type\": \"mistral\"}}", CLMLA_ERROR_INVALID_CONFIG,
                "not MLA", "mistral3 of mistral");

    /* attention_bias, llama3. */
    d = parse_ok(make("youtu", "\"attention_bias\": true, \"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8,"
                               " \"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 64}"),
                 "bias, llama3");
    CHECK(d.attention_bias == 1 && d.layer.rope_type == CLMLA_ROPE_TYPE_LLAMA3 && d.layer.llama3_high_freq_factor == 4,
          "bias %d type %d", d.attention_bias, (int)d.layer.rope_type);
    clmla_model_desc_free(&d);
}

static void test_refusals(void)
{
    parse_fails(make("bailing_hybrid", ""), CLMLA_ERROR_INVALID_CONFIG, "'bailing_hybrid' is refused: its MLA layers gate",
                "bailing_hybrid");
    parse_fails(make("hy_v4", ""), CLMLA_ERROR_INVALID_CONFIG, "attention sinks", "hy_v4");
    parse_fails(make("mistral_large4", ""), CLMLA_ERROR_INVALID_CONFIG, "shares latent KV", "mistral_large4");
    parse_fails(make("llama", ""), CLMLA_ERROR_INVALID_CONFIG, "model_type 'llama' is not an MLA family", "llama");
    parse_fails("{\"hidden_size\": 64}", CLMLA_ERROR_INVALID_CONFIG, "\"model_type\" is missing", "no model_type");
    parse_fails(make("deepseek_v3", "\"rope_parameters\": {\"rope_type\": \"dynamic\", \"factor\": 2}"),
                CLMLA_ERROR_INVALID_CONFIG, "'dynamic' is not supported", "dynamic");
    parse_fails(make("deepseek_v3", "\"num_key_value_heads\": 2"), CLMLA_ERROR_INVALID_CONFIG, "num_key_value_heads",
                "kv heads");
    parse_fails(make("deepseek_v3", "\"rope_parameters\": {\"rope_type\": \"yarn\"}"), CLMLA_ERROR_INVALID_FILE,
                "rope_parameters.factor\" is missing", "yarn without factor");
    parse_fails(make("deepseek_v3", "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}"),
                CLMLA_ERROR_INVALID_CONFIG, "weight_block_size", "fp8 block");
    parse_fails(make("axk1", "\"q_lora_rank\": null"), CLMLA_ERROR_INVALID_FILE, "q_lora_rank", "axk1 q lora");
    parse_fails(make("youtu", "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\"}}"),
                CLMLA_ERROR_INVALID_CONFIG, "per-layer-type", "nested rope");
    parse_fails(make("deepseek_v3", "\"qk_rope_head_dim\": 8, \"v_head_dim\": \"x\""), CLMLA_ERROR_INVALID_FILE,
                "\"v_head_dim\" is not an integer", "mistyped");
}

int main(void)
{
    test_layouts();
    test_yarn_amplitude();
    test_families();
    test_refusals();
    return check_summary();
}
