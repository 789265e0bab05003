/* config.json -> clmla_model_desc (see config.h; the rules are written out in docs/MODELS.md). */
#include "config.h"
#include "internal.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the families ------------------------------------------------------------------------------ */

enum pairing { PAIR_KEY, PAIR_INTERLEAVED, PAIR_HALF }; /* PAIR_KEY: "rope_interleave", default true */

enum {
    F_REMOTE_YARN = 1 << 0,    /* a legacy "rope_scaling" is read as the published modeling_deepseek.py reads it */
    F_NO_ROPE = 1 << 1,        /* no rotation at all; rope keys are not read (kimi_linear) */
    F_Q_LORA = 1 << 2,         /* q_lora_rank is required */
    F_LATENT_SCALES = 1 << 3,  /* c^Q x sqrt(D/rq), c^KV x sqrt(D/rkv); two attentions per layer (longcat_flash) */
    F_QUERY_SCALE = 1 << 4,    /* Llama-4 query scale; rope width from head_dim = dn + dr (mistral4) */
    F_DSA = 1 << 5,            /* sparse attention beyond index_topk keys (deepseek_v32, glm_moe_dsa) */
    F_V_FROM_D = 1 << 6,       /* v_head_dim null or absent: hidden_size / heads (minicpm3) */
    F_PARTIAL_DEFAULT = 1 << 7, /* the default rope type honours partial_rotary_factor (glm4_moe_lite) */
    F_HEAD_DIM_IS_DR = 1 << 8, /* a "head_dim" key replaces the rope width: refuse one that is not dr */
    F_KIMI_LAYERS = 1 << 9,    /* MLA layers from layer_types / linear_attn_config (kimi_linear) */
    F_DEEPSEEK_YARN = 1 << 10, /* rope type "deepseek_yarn" means "yarn" (sarvam_mla) */
};

typedef struct family {
    const char *model_type;
    const char *refusal; /* not NULL: the family is not run, and this says why */
    double default_theta;
    enum pairing pairing;
    unsigned flags;
} family;

static const family families[] = {
    {"deepseek_v2", NULL, 1e4, PAIR_INTERLEAVED, F_REMOTE_YARN},
    {"deepseek_v3", NULL, 1e4, PAIR_KEY, F_REMOTE_YARN | F_HEAD_DIM_IS_DR},
    {"kimi_k2", NULL, 1e4, PAIR_KEY, F_REMOTE_YARN | F_HEAD_DIM_IS_DR},
    {"axk1", NULL, 1e4, PAIR_KEY, F_Q_LORA | F_HEAD_DIM_IS_DR},
    {"youtu", NULL, 1e4, PAIR_KEY, F_HEAD_DIM_IS_DR},
    {"sarvam_mla", NULL, 1e4, PAIR_KEY, F_DEEPSEEK_YARN},
    {"glm4_moe_lite", NULL, 1e4, PAIR_KEY, F_PARTIAL_DEFAULT | F_HEAD_DIM_IS_DR},
    {"minicpm3", NULL, 1e4, PAIR_HALF, F_V_FROM_D},
    {"mistral4", NULL, 1e4, PAIR_KEY, F_QUERY_SCALE},
    {"longcat_flash", NULL, 1e7, PAIR_INTERLEAVED, F_Q_LORA | F_LATENT_SCALES},
    {"kimi_linear", NULL, 1e4, PAIR_INTERLEAVED, F_NO_ROPE | F_KIMI_LAYERS},
    {"deepseek_v32", NULL, 1e4, PAIR_INTERLEAVED, F_Q_LORA | F_DSA},
    {"glm_moe_dsa", NULL, 1e4, PAIR_INTERLEAVED, F_Q_LORA | F_DSA},
    /* MLA-like, but with attention clmla does not compute. */
    {"bailing_hybrid", "its MLA layers gate each head's output with a sigmoid of the hidden state, and its other layers "
                       "are linear attention (KDA)", 0, PAIR_KEY, 0},
    {"axk2", "its query projection also yields a per-channel sigmoid gate on the attention output", 0, PAIR_KEY, 0},
    {"hy_v4", "it adds learned attention sinks and a per-channel output gate to MLA", 0, PAIR_KEY, 0},
    {"hy_v4_vl", "it adds learned attention sinks and a per-channel output gate to MLA", 0, PAIR_KEY, 0},
    {"dots3_note", "its layers differ in shape, normalise k^R and gate each head's output; half of them use a sliding "
                   "window", 0, PAIR_KEY, 0},
    {"glm5_next", "its MLA layers attend only to the keys its k-pool indexer selects, and the others are linear "
                  "attention (KDA)", 0, PAIR_KEY, 0},
    {"glm5_next_text", "its MLA layers attend only to the keys its k-pool indexer selects, and the others are linear "
                       "attention (KDA)", 0, PAIR_KEY, 0},
    {"mistral_large4", "it shares latent KV across layers, learns its RoPE frequencies and has NoPE layers", 0, PAIR_KEY, 0},
    {"mistral_large4_text", "it shares latent KV across layers, learns its RoPE frequencies and has NoPE layers", 0,
     PAIR_KEY, 0},
    {"deepseek_v4", "its compressed sparse attention is not MLA (it has no kv_lora_rank)", 0, PAIR_KEY, 0},
};
#define NUM_FAMILIES (sizeof(families) / sizeof(families[0]))
#define CONFIG_MAX_LAYERS 4096

const char *clmla_model_types(void)
{
    return "deepseek_v2, deepseek_v3, kimi_k2 (and kimi_k25's text model), axk1, youtu, sarvam_mla, glm4_moe_lite, "
           "minicpm3, mistral4 (and mistral3 wrapping it), longcat_flash, kimi_linear (its MLA layers), deepseek_v32 "
           "and glm_moe_dsa (with their sparse-attention indexer)";
}

/* ---- reading JSON ------------------------------------------------------------------------------ */

typedef struct reader {
    const char *name; /* for messages */
    const char *where; /* "" or "text_config." */
    char *err;
    size_t errsize;
} reader;

static clmla_status bad(const reader *r, clmla_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static clmla_status bad(const reader *r, clmla_status status, const char *fmt, ...)
{
    if (r->err && r->errsize) {
        int n = snprintf(r->err, r->errsize, "%s: ", r->name);
        if (n >= 0 && (size_t)n < r->errsize) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(r->err + n, r->errsize - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return status;
}

static int present(const cJSON *item)
{
    return item && !cJSON_IsNull(item);
}

/* obj[key], or NULL when absent or null. A key given twice means its last value, as Python's
   json module (and so transformers) reads it. */
static const cJSON *item(const cJSON *obj, const char *key)
{
    const cJSON *found = NULL;
    if (obj && cJSON_IsObject(obj))
        for (const cJSON *i = obj->child; i; i = i->next)
            if (i->string && strcmp(i->string, key) == 0)
                found = i;
    return present(found) ? found : NULL;
}

/* An integer field; `fallback` < 0 makes it required. `where` prefixes the key in messages. */
static clmla_status get_int(const reader *r, const cJSON *obj, const char *where, const char *key, int fallback, int min,
                            int *value)
{
    const cJSON *it = item(obj, key);
    if (!it) {
        if (fallback < 0)
            return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is missing", where, key);
        *value = fallback;
        return CLMLA_SUCCESS;
    }
    const double d = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!(d >= INT_MIN && d <= INT_MAX) || d != floor(d))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is not an integer", where, key);
    if (d < min)
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is %d, it must be at least %d", where, key, (int)d, min);
    *value = (int)d;
    return CLMLA_SUCCESS;
}

/* A number field; absent or null gives fallback and *found 0. */
static clmla_status get_number(const reader *r, const cJSON *obj, const char *where, const char *key, double fallback,
                               double *value, int *found)
{
    const cJSON *it = item(obj, key);
    if (found)
        *found = it != NULL;
    if (!it) {
        *value = fallback;
        return CLMLA_SUCCESS;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is not a number", where, key);
    *value = it->valuedouble;
    return CLMLA_SUCCESS;
}

static clmla_status get_bool(const reader *r, const cJSON *obj, const char *where, const char *key, int fallback,
                             int *value)
{
    const cJSON *it = item(obj, key);
    if (!it) {
        *value = fallback;
        return CLMLA_SUCCESS;
    }
    if (!cJSON_IsBool(it))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is not true or false", where, key);
    *value = cJSON_IsTrue(it);
    return CLMLA_SUCCESS;
}

static clmla_status get_string(const reader *r, const cJSON *obj, const char *where, const char *key, const char **value)
{
    const cJSON *it = item(obj, key);
    *value = NULL;
    if (!it)
        return CLMLA_SUCCESS;
    if (!cJSON_IsString(it) || !it->valuestring)
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is not a string", where, key);
    *value = it->valuestring;
    return CLMLA_SUCCESS;
}

/* ---- RoPE ------------------------------------------------------------------------------------------ */

/* YaRN's g(s, m). */
static double g_mscale(double s, double m)
{
    return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0;
}

/* A list of n positive numbers into out. */
static clmla_status get_factors(const reader *r, const cJSON *params, const char *where, const char *key, int n, double *out)
{
    const cJSON *list = item(params, key);
    if (!list)
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is missing (longrope needs it)", where, key);
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != n)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG, "\"%s%s\" must be a list of %d numbers (half the rotary width)", where,
                   key, n);
    int i = 0;
    for (const cJSON *v = list->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
            return bad(r, CLMLA_ERROR_INVALID_CONFIG, "\"%s%s\"[%d] is not a positive number", where, key, i);
        out[i] = v->valuedouble;
    }
    return CLMLA_SUCCESS;
}

/* The rotary width transformers derives, which must be dr: int(head_dim * partial_rotary_factor). */
static clmla_status check_width(const reader *r, const char *why, double head_dim, double pf, int dr)
{
    const double width = floor(head_dim * pf);
    if (width != dr)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                   "%s: the rotary width int(%g x partial_rotary_factor %g) = %g differs from qk_rope_head_dim %d, "
                   "and clmla rotates exactly the qk_rope_head_dim dims",
                   why, head_dim, pf, width, dr);
    return CLMLA_SUCCESS;
}

/* The RoPE dict transformers reads: a non-empty legacy rope_scaling replaces rope_parameters
   wholesale. *params NULL when there is neither; *legacy says which; pw gets its name for messages. */
static clmla_status rope_params(const reader *r, const cJSON *root, const cJSON **params, int *legacy, char *pw,
                                size_t pw_size)
{
    const char *w = r->where;
    const cJSON *scaling = item(root, "rope_scaling");
    const cJSON *parameters = item(root, "rope_parameters");
    if (scaling && !cJSON_IsObject(scaling))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%srope_scaling\" is neither an object nor null", w);
    if (parameters && !cJSON_IsObject(parameters))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%srope_parameters\" is neither an object nor null", w);
    *legacy = scaling && scaling->child != NULL;
    *params = *legacy ? scaling : parameters;
    snprintf(pw, pw_size, "%s%s.", w, *legacy ? "rope_scaling" : "rope_parameters");
    return CLMLA_SUCCESS;
}

static clmla_status read_rope(const reader *r, const cJSON *root, const family *f, clmla_layer_config *c)
{
    const char *w = r->where;
    if (f->flags & F_NO_ROPE) {
        c->rope_type = CLMLA_ROPE_TYPE_NONE;
        c->rope_theta = 1e4; /* unused */
        return CLMLA_SUCCESS;
    }
    const cJSON *params = NULL;
    int legacy = 0;
    char pw[64];
    clmla_status st = rope_params(r, root, &params, &legacy, pw, sizeof(pw));
    if (st != CLMLA_SUCCESS)
        return st;
    if (params) {
        const cJSON *first = params->child;
        if (first && cJSON_IsObject(first))
            return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                       "\"%s\" holds per-layer-type RoPE settings (\"%s\"); no MLA family clmla runs uses them", pw,
                       first->string ? first->string : "?");
    }

    /* rope_theta: the dict's value, else the top-level key, else the family's default. */
    st = get_number(r, root, w, "rope_theta", f->default_theta, &c->rope_theta, NULL);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, params, pw, "rope_theta", c->rope_theta, &c->rope_theta, NULL);
    if (st != CLMLA_SUCCESS)
        return st;

    /* rope_type wins over type; neither: "default". */
    const char *type = NULL, *type2 = NULL;
    st = get_string(r, params, pw, "rope_type", &type);
    if (st == CLMLA_SUCCESS)
        st = get_string(r, params, pw, "type", &type2);
    if (st != CLMLA_SUCCESS)
        return st;
    if (!type)
        type = type2 ? type2 : "default";
    if ((f->flags & F_DEEPSEEK_YARN) && strcmp(type, "deepseek_yarn") == 0)
        type = "yarn";

    /* partial_rotary_factor: the dict first, then the top-level key. */
    double pf = 1.0;
    int has_pf = 0;
    st = get_number(r, root, w, "partial_rotary_factor", 1.0, &pf, &has_pf);
    if (st == CLMLA_SUCCESS) {
        int in_dict = 0;
        st = get_number(r, params, pw, "partial_rotary_factor", pf, &pf, &in_dict);
        has_pf = has_pf || in_dict;
    }
    if (st != CLMLA_SUCCESS)
        return st;
    const int is_default = strcmp(type, "default") == 0;
    const int dr = c->qk_rope_head_dim;
    if (f->flags & F_QUERY_SCALE) {
        /* mistral4: head_dim = dn + dr; every non-default type rotates int(head_dim * pf) dims. */
        if (is_default)
            return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                       "\"%srope_type\" is \"default\", which rotates all qk_nope_head_dim + qk_rope_head_dim dims in "
                       "mistral4 (transformers fails on it); clmla needs a type that honours partial_rotary_factor",
                       pw);
        if (!has_pf)
            return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                       "\"%spartial_rotary_factor\" is missing: mistral4 would rotate all qk_nope_head_dim + "
                       "qk_rope_head_dim dims (transformers adds it only to \"rope_parameters\")", pw);
        st = check_width(r, "mistral4", c->qk_nope_head_dim + dr, pf, dr);
    } else if (has_pf && (!is_default || (f->flags & F_PARTIAL_DEFAULT))) {
        st = check_width(r, f->model_type, dr, pf, dr);
    }
    if (st != CLMLA_SUCCESS)
        return st;

    /* original_max_position_embeddings: a top-level key overrides the dict, else the dict, else
       max_position_embeddings (transformers) or 4096 (DeepSeek's modeling_deepseek.py, which reads
       only a legacy rope_scaling). */
    const int remote = legacy && (f->flags & F_REMOTE_YARN);
    double original = 0, max_pos = 0;
    int has_original = 0, has_top_original = 0, has_max_pos = 0;
    st = get_number(r, root, w, "max_position_embeddings", 0, &max_pos, &has_max_pos);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, params, pw, "original_max_position_embeddings", 0, &original, &has_original);
    if (st == CLMLA_SUCCESS) {
        double top = 0;
        st = get_number(r, root, w, "original_max_position_embeddings", 0, &top, &has_top_original);
        if (has_top_original && !remote)
            original = top, has_original = 1;
    }
    if (st != CLMLA_SUCCESS)
        return st;
    if (!has_original) {
        if (remote)
            original = 4096, has_original = 1;
        else if (has_max_pos)
            original = max_pos, has_original = 1;
    }

    if (is_default) {
        c->rope_type = CLMLA_ROPE_TYPE_DEFAULT;
        return CLMLA_SUCCESS;
    }
    const int yarn = strcmp(type, "yarn") == 0, linear = strcmp(type, "linear") == 0;
    const int longrope = strcmp(type, "longrope") == 0, llama3 = strcmp(type, "llama3") == 0;
    if (!yarn && !linear && !longrope && !llama3)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                   "\"%srope_type\" '%.64s' is not supported (clmla implements default, linear, yarn, longrope and "
                   "llama3; \"dynamic\" rescales the frequencies by the longest sequence seen so far)",
                   pw, type);
    if (remote && !yarn && !linear)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                   "\"%stype\" '%.64s': DeepSeek's published modeling code accepts only linear, dynamic and yarn", pw,
                   type);
    if (!has_original && !linear)
        return bad(r, CLMLA_ERROR_INVALID_FILE,
                   "\"%soriginal_max_position_embeddings\" is missing, and so is \"%smax_position_embeddings\" (rope "
                   "type %s needs one)", pw, w, type);
    if (!(original >= 1 && original <= INT_MAX) || original != floor(original))
        if (!linear)
            return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%soriginal_max_position_embeddings\" is not a positive integer",
                       pw);
    if (!linear)
        c->yarn_original_max_position = (int)original;

    /* factor: required by linear, yarn and llama3; null in yarn and longrope means
       max_position_embeddings / original. */
    double factor = 0;
    int has_factor = 0;
    st = get_number(r, params, pw, "factor", 0, &factor, &has_factor);
    if (st != CLMLA_SUCCESS)
        return st;
    if (!has_factor) {
        const cJSON *raw = cJSON_GetObjectItemCaseSensitive(params, "factor");
        if ((linear || llama3 || (yarn && !raw)) || !has_max_pos)
            return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%sfactor\" is missing (rope type %s needs it)", pw, type);
        factor = max_pos / original;
    }
    if (!(factor > 0))
        return bad(r, CLMLA_ERROR_INVALID_CONFIG, "\"%sfactor\" is %g, it must be positive", pw, factor);
    c->yarn_factor = factor;

    double attention_factor = 0, mscale = 0, mscale_all_dim = 0;
    int has_af = 0, has_m = 0, has_mad = 0;
    st = get_number(r, params, pw, "attention_factor", 0, &attention_factor, &has_af);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, params, pw, "mscale", 0, &mscale, &has_m);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, params, pw, "mscale_all_dim", 0, &mscale_all_dim, &has_mad);
    if (st != CLMLA_SUCCESS)
        return st;
    if (has_af && !(attention_factor > 0) && !linear)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG, "\"%sattention_factor\" is %g, it must be positive", pw,
                   attention_factor);
    /* The softmax scale's mscale_all_dim (any type but default, in transformers and DeepSeek's code). */
    c->yarn_mscale_all_dim = mscale_all_dim;

    if (linear) {
        c->rope_type = CLMLA_ROPE_TYPE_LINEAR;
        return CLMLA_SUCCESS;
    }
    if (longrope) {
        c->rope_type = CLMLA_ROPE_TYPE_LONGROPE;
        if (dr / 2 > CLMLA_MAX_ROPE_PAIRS)
            return bad(r, CLMLA_ERROR_INVALID_CONFIG, "longrope with qk_rope_head_dim %d: clmla keeps at most %d factors",
                       dr, CLMLA_MAX_ROPE_PAIRS);
        st = get_factors(r, params, pw, "short_factor", dr / 2, c->longrope_short_factor);
        if (st == CLMLA_SUCCESS)
            st = get_factors(r, params, pw, "long_factor", dr / 2, c->longrope_long_factor);
        if (st == CLMLA_SUCCESS && has_af)
            c->rope_attention_factor = attention_factor;
        return st;
    }
    if (llama3) {
        c->rope_type = CLMLA_ROPE_TYPE_LLAMA3;
        int has_lo = 0, has_hi = 0;
        st = get_number(r, params, pw, "low_freq_factor", 0, &c->llama3_low_freq_factor, &has_lo);
        if (st == CLMLA_SUCCESS)
            st = get_number(r, params, pw, "high_freq_factor", 0, &c->llama3_high_freq_factor, &has_hi);
        if (st == CLMLA_SUCCESS && (!has_lo || !has_hi))
            st = bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is missing (llama3 needs it)", pw,
                     has_lo ? "high_freq_factor" : "low_freq_factor");
        return st;
    }

    /* yarn */
    c->rope_type = CLMLA_ROPE_TYPE_YARN;
    int truncate = 1;
    st = get_number(r, params, pw, "beta_fast", 32, &c->yarn_beta_fast, NULL);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, params, pw, "beta_slow", 1, &c->yarn_beta_slow, NULL);
    if (st == CLMLA_SUCCESS)
        st = get_bool(r, params, pw, "truncate", 1, &truncate);
    if (st != CLMLA_SUCCESS)
        return st;
    if (c->yarn_beta_fast == 0) /* transformers: `or 32`, `or 1` */
        c->yarn_beta_fast = 32;
    if (c->yarn_beta_slow == 0)
        c->yarn_beta_slow = 1;
    c->yarn_no_truncate = !truncate;
    if (has_af) {
        c->rope_attention_factor = attention_factor;
    } else if (remote) {
        /* modeling_deepseek.py: g(s, mscale) / g(s, mscale_all_dim), defaults 1 and 0. */
        c->yarn_mscale = has_m ? mscale : 1.0;
        c->rope_attention_factor = g_mscale(factor, c->yarn_mscale) / g_mscale(factor, mscale_all_dim);
    } else if (mscale != 0 && mscale_all_dim != 0) {
        c->yarn_mscale = mscale;
        c->rope_attention_factor = g_mscale(factor, mscale) / g_mscale(factor, mscale_all_dim);
    } else {
        c->yarn_mscale = 1.0;
        c->rope_attention_factor = g_mscale(factor, 1.0);
    }
    if (!(c->rope_attention_factor > 0) || !isfinite(c->rope_attention_factor))
        return bad(r, CLMLA_ERROR_INVALID_CONFIG, "YaRN's attention factor comes out as %g from factor %g, mscale %g and "
                   "mscale_all_dim %g", c->rope_attention_factor, factor, mscale, mscale_all_dim);
    return CLMLA_SUCCESS;
}

/* ---- which layers are MLA ---------------------------------------------------------------------- */

static clmla_status read_kimi_layers(const reader *r, const cJSON *root, clmla_model_desc *d)
{
    const char *w = r->where;
    d->is_mla = calloc((size_t)d->num_layers, 1);
    if (!d->is_mla)
        return bad(r, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    const cJSON *types = item(root, "layer_types");
    const cJSON *lac = item(root, "linear_attn_config");
    const cJSON *full = lac ? item(lac, "full_attn_layers") : NULL;
    const cJSON *kda = lac ? item(lac, "kda_layers") : NULL;
    if (types) {
        if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != d->num_layers)
            return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%slayer_types\" is not a list of num_hidden_layers (%d) names", w,
                       d->num_layers);
        int i = 0;
        for (const cJSON *t = types->child; t; t = t->next, i++)
            d->is_mla[i] = cJSON_IsString(t) && t->valuestring && strcmp(t->valuestring, "full_attention") == 0;
    } else if (full && kda) {
        if (!cJSON_IsArray(full))
            return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%slinear_attn_config.full_attn_layers\" is not a list", w);
        for (const cJSON *t = full->child; t; t = t->next) {
            const double v = cJSON_IsNumber(t) ? t->valuedouble : 0;
            if (!(v >= 1 && v <= d->num_layers) || v != floor(v))
                return bad(r, CLMLA_ERROR_INVALID_FILE,
                           "\"%slinear_attn_config.full_attn_layers\" names a layer outside 1..%d (it counts from 1)", w,
                           d->num_layers);
            d->is_mla[(int)v - 1] = 1;
        }
    } else {
        for (int i = 0; i < d->num_layers; i++)
            d->is_mla[i] = i > 0 && i % 4 == 0;
    }
    return CLMLA_SUCCESS;
}

/* ---- the sparse-attention indexer (deepseek_v32, glm_moe_dsa) ----------------------------------- */

/* transformers' DeepseekV32Indexer / GlmMoeDsaIndexer: index_n_heads (64 / 32), index_head_dim 128,
   index_topk 2048, the key LayerNorm's eps fixed at 1e-6, and the indexer's RoPE pairing fixed per
   family (half-split / interleaved); "indexer_rope_interleave", which vLLM reads and GLM-5's
   config.json carries, overrides it when present. glm_moe_dsa's "shared" layers (indexer_types, else
   index_topk_pattern, else index_topk_freq and index_skip_topk_offset, as its configuration derives
   them) reuse the previous full layer's selection. */
static clmla_status read_indexer(const reader *r, const cJSON *root, clmla_model_desc *d)
{
    const char *w = r->where;
    clmla_layer_config *c = &d->layer;
    const int glm = strcmp(d->model_type, "glm_moe_dsa") == 0;
    int interleave = glm;
    clmla_status st = get_int(r, root, w, "index_topk", 2048, 1, &c->index_topk);
    if (st == CLMLA_SUCCESS)
        st = get_int(r, root, w, "index_head_dim", 128, 2, &c->index_head_dim);
    if (st == CLMLA_SUCCESS)
        st = get_int(r, root, w, "index_n_heads", glm ? 32 : 64, 1, &c->index_n_heads);
    if (st == CLMLA_SUCCESS)
        st = get_bool(r, root, w, "indexer_rope_interleave", glm, &interleave);
    if (st != CLMLA_SUCCESS)
        return st;
    c->index_rope_pairing = interleave ? CLMLA_ROPE_INTERLEAVED : CLMLA_ROPE_HALF_SPLIT;
    c->index_norm_eps = 1e-6;
    if (!glm)
        return CLMLA_SUCCESS;
    const int n = d->num_layers;
    d->index_shared = calloc((size_t)n, 1);
    if (!d->index_shared)
        return bad(r, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    const cJSON *types = item(root, "indexer_types"), *pattern = item(root, "index_topk_pattern");
    if (types) {
        if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != n)
            return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%sindexer_types\" is not a list of num_hidden_layers (%d) names", w,
                       n);
        int i = 0;
        for (const cJSON *t = types->child; t; t = t->next, i++) {
            const char *v = cJSON_IsString(t) ? t->valuestring : NULL;
            if (!v || (strcmp(v, "full") != 0 && strcmp(v, "shared") != 0))
                return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%sindexer_types\"[%d] is neither \"full\" nor \"shared\"", w,
                           i);
            d->index_shared[i] = strcmp(v, "shared") == 0;
        }
    } else if (pattern) {
        const char *v = cJSON_IsString(pattern) ? pattern->valuestring : NULL;
        if (!v || (int)strlen(v) != n || strspn(v, "FS") != strlen(v))
            return bad(r, CLMLA_ERROR_INVALID_FILE,
                       "\"%sindex_topk_pattern\" is not a string of num_hidden_layers (%d) letters F and S", w, n);
        for (int i = 0; i < n; i++)
            d->index_shared[i] = v[i] == 'S';
    } else {
        int freq = 1, offset = 2;
        st = get_int(r, root, w, "index_topk_freq", 1, INT_MIN, &freq);
        if (st == CLMLA_SUCCESS)
            st = get_int(r, root, w, "index_skip_topk_offset", 2, INT_MIN, &offset);
        if (st != CLMLA_SUCCESS)
            return st;
        if (freq < 1)
            freq = 1;
        for (int i = 0; i < n; i++) {
            const long long k = (long long)i - offset + 1;
            d->index_shared[i] = (k > 0 ? k : 0) % freq != 0;
        }
    }
    return CLMLA_SUCCESS;
}

/* ---- the whole config ---------------------------------------------------------------------------- */

static const family *find_family(const char *model_type)
{
    for (size_t i = 0; i < NUM_FAMILIES; i++)
        if (strcmp(families[i].model_type, model_type) == 0)
            return &families[i];
    return NULL;
}

static clmla_status read_config(reader *r, const cJSON *top, clmla_model_desc *d)
{
    if (!cJSON_IsObject(top))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "JSON but not an object");
    const char *model_type = NULL;
    clmla_status st = get_string(r, top, "", "model_type", &model_type);
    if (st != CLMLA_SUCCESS)
        return st;
    if (!model_type)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG, "\"model_type\" is missing, so the model family is unknown (clmla runs %s)",
                   clmla_model_types());
    /* Multimodal wrappers: the attention is the text model's. */
    const cJSON *root = top;
    if (strcmp(model_type, "kimi_k25") == 0 || strcmp(model_type, "mistral3") == 0) {
        const cJSON *text = item(top, "text_config");
        if (!text || !cJSON_IsObject(text))
            return bad(r, CLMLA_ERROR_INVALID_FILE, "model_type %s keeps its language model in \"text_config\", which is "
                       "missing", model_type);
        const char *inner = NULL;
        r->where = "text_config.";
        st = get_string(r, text, r->where, "model_type", &inner);
        if (st != CLMLA_SUCCESS)
            return st;
        if (strcmp(model_type, "kimi_k25") == 0 && (!inner || strcmp(inner, "kimi_k2") == 0))
            inner = "deepseek_v3"; /* as transformers rewrites it */
        const int mla = inner && (strcmp(model_type, "kimi_k25") == 0 || strcmp(inner, "mistral4") == 0);
        if (!mla)
            return bad(r, CLMLA_ERROR_INVALID_CONFIG, "%s wraps text model_type '%.64s', which is not MLA", model_type,
                       inner ? inner : "(absent)");
        model_type = inner;
        root = text;
    }
    const char *w = r->where;
    const family *f = find_family(model_type);
    if (!f)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG, "model_type '%.64s' is not an MLA family clmla runs (it runs %s)",
                   model_type, clmla_model_types());
    if (f->refusal)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG, "model_type '%s' is refused: %s", model_type, f->refusal);
    snprintf(d->model_type, sizeof(d->model_type), "%s", model_type);
    d->config_path = w;

    clmla_layer_config *c = &d->layer;
    const int v_optional = (f->flags & F_V_FROM_D) != 0;
    const struct {
        const char *key;
        int *value;
        int fallback, min;
    } ints[] = {
        {"hidden_size", &c->hidden_size, -1, 1},
        {"num_attention_heads", &c->num_heads, -1, 1},
        {"q_lora_rank", &c->q_lora_rank, (f->flags & F_Q_LORA) ? -1 : 0, 0},
        {"kv_lora_rank", &c->kv_lora_rank, -1, 1},
        {"qk_nope_head_dim", &c->qk_nope_head_dim, -1, 1},
        {"qk_rope_head_dim", &c->qk_rope_head_dim, -1, 2},
        {"v_head_dim", &c->v_head_dim, v_optional ? 0 : -1, v_optional ? 0 : 1},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]) && st == CLMLA_SUCCESS; i++)
        st = get_int(r, root, w, ints[i].key, ints[i].fallback, ints[i].min, ints[i].value);
    if (st != CLMLA_SUCCESS)
        return st;
    if (v_optional && c->v_head_dim == 0)
        c->v_head_dim = c->hidden_size / c->num_heads;
    if ((f->flags & F_Q_LORA) && c->q_lora_rank == 0)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG, "\"%sq_lora_rank\" is 0, but %s always compresses the query", w, model_type);

    /* Decoder layers. */
    if (f->flags & F_LATENT_SCALES) {
        int half = 0;
        st = get_int(r, root, w, "num_layers", 0, 1, &d->num_layers);
        if (st == CLMLA_SUCCESS && d->num_layers == 0) {
            st = get_int(r, root, w, "num_hidden_layers", -1, 2, &half);
            d->num_layers = half / 2;
        }
        d->attentions_per_layer = 2;
    } else {
        st = get_int(r, root, w, "num_hidden_layers", -1, 1, &d->num_layers);
        d->attentions_per_layer = 1;
    }
    /* DeepSeek-V3 and Kimi-K2 have 61 decoder layers; the bound, far above any published model, keeps a
       corrupt count from making the reader allocate and walk billions of per-layer flags. */
    if (st == CLMLA_SUCCESS && d->num_layers > CONFIG_MAX_LAYERS)
        st = bad(r, CLMLA_ERROR_INVALID_CONFIG, "\"%s%s\" gives %d decoder layers; clmla reads at most %d", w,
                 d->attentions_per_layer == 2 ? "num_layers" : "num_hidden_layers", d->num_layers, CONFIG_MAX_LAYERS);
    if (st != CLMLA_SUCCESS)
        return st;

    /* Fields every DeepSeek-derived attention reads. */
    int kv_heads = 0;
    st = get_int(r, root, w, "num_key_value_heads", 0, 1, &kv_heads);
    if (st == CLMLA_SUCCESS && kv_heads && kv_heads != c->num_heads)
        st = bad(r, CLMLA_ERROR_INVALID_CONFIG,
                 "\"%snum_key_value_heads\" is %d but num_attention_heads is %d: MLA shares one latent across all "
                 "heads, and clmla supports only equal counts (as every MLA checkpoint has)",
                 w, kv_heads, c->num_heads);
    if (st == CLMLA_SUCCESS)
        st = get_bool(r, root, w, "attention_bias", 0, &d->attention_bias);
    double eps = 0;
    if (st == CLMLA_SUCCESS)
        st = get_number(r, root, w, "rms_norm_eps", 1e-6, &eps, NULL);
    if (st == CLMLA_SUCCESS && !(eps > 0))
        st = bad(r, CLMLA_ERROR_INVALID_FILE, "\"%srms_norm_eps\" is %g, it must be positive", w, eps);
    if (st != CLMLA_SUCCESS)
        return st;
    c->rms_norm_eps = 1e-6; /* the latent norms' own eps in every family run here (docs/MODELS.md) */

    /* head_dim and its relatives. */
    int head_dim = 0;
    st = get_int(r, root, w, "head_dim", 0, 0, &head_dim);
    if (st != CLMLA_SUCCESS)
        return st;
    if ((f->flags & F_HEAD_DIM_IS_DR) && head_dim && head_dim != c->qk_rope_head_dim)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                   "\"%shead_dim\" is %d but qk_rope_head_dim is %d: transformers' %s takes head_dim as the rotary "
                   "width, which clmla does not support apart from qk_rope_head_dim",
                   w, head_dim, c->qk_rope_head_dim, model_type);
    if (f->flags & F_LATENT_SCALES) {
        int qk_head_dim = 0;
        if (head_dim == 0)
            head_dim = 64; /* LongcatFlashConfig's default */
        if (head_dim != c->qk_rope_head_dim)
            return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                       "\"%shead_dim\" is %d (the rotary width in longcat_flash) but qk_rope_head_dim is %d", w, head_dim,
                       c->qk_rope_head_dim);
        st = get_int(r, root, w, "qk_head_dim", 0, 0, &qk_head_dim);
        if (st != CLMLA_SUCCESS)
            return st;
        if (qk_head_dim && qk_head_dim != c->qk_nope_head_dim + c->qk_rope_head_dim)
            return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                       "\"%sqk_head_dim\" is %d, not qk_nope_head_dim + qk_rope_head_dim = %d", w, qk_head_dim,
                       c->qk_nope_head_dim + c->qk_rope_head_dim);
        c->q_latent_scale = sqrt((double)c->hidden_size / c->q_lora_rank);
        c->kv_latent_scale = sqrt((double)c->hidden_size / c->kv_lora_rank);
    }

    /* Pairing. */
    if (f->pairing == PAIR_KEY) {
        int interleave = 1;
        st = get_bool(r, root, w, "rope_interleave", 1, &interleave);
        if (st != CLMLA_SUCCESS)
            return st;
        c->rope_pairing = interleave ? CLMLA_ROPE_INTERLEAVED : CLMLA_ROPE_HALF_SPLIT;
    } else {
        c->rope_pairing = f->pairing == PAIR_HALF ? CLMLA_ROPE_HALF_SPLIT : CLMLA_ROPE_INTERLEAVED;
    }

    st = read_rope(r, root, f, c);
    if (st != CLMLA_SUCCESS)
        return st;

    if (f->flags & F_QUERY_SCALE) {
        const cJSON *params = NULL;
        int legacy = 0, has_beta = 0;
        char pw[64];
        st = rope_params(r, root, &params, &legacy, pw, sizeof(pw));
        if (st == CLMLA_SUCCESS)
            st = get_number(r, params, pw, "llama_4_scaling_beta", 0, &c->query_scale_beta, &has_beta);
        if (st == CLMLA_SUCCESS && !has_beta)
            st = bad(r, CLMLA_ERROR_INVALID_FILE, "\"%sllama_4_scaling_beta\" is missing (mistral4 scales its queries "
                     "with it)", pw);
        if (st != CLMLA_SUCCESS)
            return st;
        c->query_scale_interval = c->yarn_original_max_position;
    }
    if (f->flags & F_DSA) {
        st = read_indexer(r, root, d);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    if (f->flags & F_KIMI_LAYERS) {
        int nope = 1;
        st = get_bool(r, root, w, "mla_use_nope", 1, &nope);
        if (st == CLMLA_SUCCESS && !nope)
            st = bad(r, CLMLA_ERROR_INVALID_CONFIG, "\"%smla_use_nope\" is false: Kimi-Linear's MLA layers with RoPE are "
                     "not what transformers' kimi_linear computes, and clmla follows it", w);
        if (st == CLMLA_SUCCESS)
            st = read_kimi_layers(r, root, d);
        if (st != CLMLA_SUCCESS)
            return st;
    }

    /* FP8 checkpoints: clmla reads 128 x 128 block scales. */
    const cJSON *quant = item(top, "quantization_config");
    if (quant && cJSON_IsObject(quant)) {
        const cJSON *block = item(quant, "weight_block_size");
        if (block && (!cJSON_IsArray(block) || cJSON_GetArraySize(block) != 2 || !cJSON_IsNumber(block->child) ||
                      !cJSON_IsNumber(block->child->next) || block->child->valuedouble != 128 ||
                      block->child->next->valuedouble != 128))
            return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                       "\"quantization_config.weight_block_size\" is not [128, 128], the only FP8 block size clmla reads");
    }

    st = clmla_layer_config_validate(c);
    if (st != CLMLA_SUCCESS)
        return bad(r, st, "%s", clmla_last_error(NULL));
    return CLMLA_SUCCESS;
}

void clmla_model_desc_free(clmla_model_desc *d)
{
    if (d) {
        free(d->is_mla);
        d->is_mla = NULL;
        free(d->index_shared);
        d->index_shared = NULL;
    }
}

clmla_status clmla_model_config_parse(const char *text, size_t length, const char *name, clmla_model_desc *desc,
                                      char *err, size_t errsize)
{
    reader r = {name ? name : "config.json", "", err, errsize};
    if (!desc || (!text && length))
        return bad(&r, CLMLA_ERROR_INVALID_ARGUMENT, "NULL argument");
    memset(desc, 0, sizeof(*desc));
    const char *end = NULL;
    cJSON *root = length ? cJSON_ParseWithLengthOpts(text, length, &end, 0) : NULL;
    if (!root) {
        const size_t at = end && end >= text ? (size_t)(end - text) : 0;
        return bad(&r, CLMLA_ERROR_INVALID_FILE, "not valid JSON (parsing stopped at byte %zu)", at);
    }
    const char *p = end ? end : text + length;
    while (p < text + length && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\0'))
        p++;
    clmla_model_desc d;
    memset(&d, 0, sizeof(d));
    clmla_status st = p == text + length ? read_config(&r, root, &d)
                                         : bad(&r, CLMLA_ERROR_INVALID_FILE, "data after the JSON object");
    cJSON_Delete(root);
    if (st != CLMLA_SUCCESS) {
        clmla_model_desc_free(&d);
        return st;
    }
    *desc = d;
    return CLMLA_SUCCESS;
}

clmla_status clmla_config_parse(const char *text, size_t length, const char *name, clmla_layer_config *config,
                                int *num_layers, char *err, size_t errsize)
{
    if (!config || !num_layers) {
        if (err && errsize)
            snprintf(err, errsize, "%s: NULL argument", name ? name : "config.json");
        return CLMLA_ERROR_INVALID_ARGUMENT;
    }
    memset(config, 0, sizeof(*config));
    *num_layers = 0;
    clmla_model_desc d;
    const clmla_status st = clmla_model_config_parse(text, length, name, &d, err, errsize);
    if (st == CLMLA_SUCCESS) {
        *config = d.layer;
        *num_layers = d.num_layers;
        clmla_model_desc_free(&d);
    }
    return st;
}
