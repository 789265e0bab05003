/* config.json -> clmla_layer_config. */
#include "config.h"
#include "internal.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct reader {
    const char *name; /* for messages */
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

/* An integer field; `fallback` < 0 makes it required. `where` prefixes the key in messages. */
static clmla_status get_int(const reader *r, const cJSON *obj, const char *where, const char *key, int fallback, int min,
                            int *value)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!present(item)) {
        if (fallback < 0)
            return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is missing", where, key);
        *value = fallback;
        return CLMLA_SUCCESS;
    }
    const double d = cJSON_IsNumber(item) ? item->valuedouble : NAN;
    if (!(d >= INT_MIN && d <= INT_MAX) || d != floor(d))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is not an integer", where, key);
    if (d < min)
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is %d, it must be at least %d", where, key, (int)d, min);
    *value = (int)d;
    return CLMLA_SUCCESS;
}

/* A number field; absent or null gives fallback. */
static clmla_status get_number(const reader *r, const cJSON *obj, const char *where, const char *key, double fallback,
                               double *value)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!present(item)) {
        *value = fallback;
        return CLMLA_SUCCESS;
    }
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"%s%s\" is not a number", where, key);
    *value = item->valuedouble;
    return CLMLA_SUCCESS;
}

static int is_deepseek_family(const char *model_type)
{
    static const char *const known[] = {"deepseek_v2", "deepseek_v3", "kimi_k2"};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strcmp(model_type, known[i]) == 0)
            return 1;
    return 0;
}

static clmla_status read_rope_scaling(const reader *r, const cJSON *root, clmla_layer_config *c)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!present(rs))
        return CLMLA_SUCCESS;
    if (!cJSON_IsObject(rs))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"rope_scaling\" is neither an object nor null");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!present(type))
        type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!present(type))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"rope_scaling\" has no \"type\" or \"rope_type\"");
    if (!cJSON_IsString(type) || !type->valuestring)
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"rope_scaling.type\" is not a string");
    if (strcmp(type->valuestring, "default") == 0)
        return CLMLA_SUCCESS; /* transformers' name for plain RoPE */
    if (strcmp(type->valuestring, "yarn") != 0)
        return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                   "rope_scaling type '%.64s' is not supported (clmla implements \"yarn\" and plain RoPE)", type->valuestring);
    const cJSON *factor = cJSON_GetObjectItemCaseSensitive(rs, "factor");
    if (!present(factor))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"rope_scaling.factor\" is missing (YaRN needs it)");
    /* The defaults of DeepSeek's YaRN rotary embedding (and transformers'). */
    double original = 0;
    clmla_status st = get_number(r, rs, "rope_scaling.", "factor", 1.0, &c->yarn_factor);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, rs, "rope_scaling.", "original_max_position_embeddings", 4096, &original);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, rs, "rope_scaling.", "beta_fast", 32.0, &c->yarn_beta_fast);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, rs, "rope_scaling.", "beta_slow", 1.0, &c->yarn_beta_slow);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, rs, "rope_scaling.", "mscale", 1.0, &c->yarn_mscale);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, rs, "rope_scaling.", "mscale_all_dim", 0.0, &c->yarn_mscale_all_dim);
    if (st != CLMLA_SUCCESS)
        return st;
    if (!(c->yarn_factor > 0))
        return bad(r, CLMLA_ERROR_INVALID_CONFIG, "\"rope_scaling.factor\" is %g, it must be positive", c->yarn_factor);
    if (!(original >= 1 && original <= INT_MAX) || original != floor(original))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"rope_scaling.original_max_position_embeddings\" is not a positive integer");
    c->yarn_original_max_position = (int)original;
    return CLMLA_SUCCESS;
}

static clmla_status read_config(const reader *r, const cJSON *root, clmla_layer_config *c, int *num_layers)
{
    if (!cJSON_IsObject(root))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "JSON but not an object");
    const struct {
        const char *key;
        int *value;
        int fallback, min;
    } ints[] = {
        {"hidden_size", &c->hidden_size, -1, 1},
        {"num_attention_heads", &c->num_heads, -1, 1},
        {"q_lora_rank", &c->q_lora_rank, 0, 0},
        {"kv_lora_rank", &c->kv_lora_rank, -1, 1},
        {"qk_nope_head_dim", &c->qk_nope_head_dim, -1, 1},
        {"qk_rope_head_dim", &c->qk_rope_head_dim, -1, 2},
        {"v_head_dim", &c->v_head_dim, -1, 1},
        {"num_hidden_layers", num_layers, -1, 1},
    };
    clmla_status st = CLMLA_SUCCESS;
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]) && st == CLMLA_SUCCESS; i++)
        st = get_int(r, root, "", ints[i].key, ints[i].fallback, ints[i].min, ints[i].value);
    double eps = 0;
    if (st == CLMLA_SUCCESS)
        st = get_number(r, root, "", "rms_norm_eps", 1e-6, &eps);
    if (st == CLMLA_SUCCESS && !(eps > 0))
        st = bad(r, CLMLA_ERROR_INVALID_FILE, "\"rms_norm_eps\" is %g, it must be positive", eps);
    if (st == CLMLA_SUCCESS)
        st = get_number(r, root, "", "rope_theta", 10000.0, &c->rope_theta);
    if (st == CLMLA_SUCCESS)
        st = read_rope_scaling(r, root, c);
    if (st != CLMLA_SUCCESS)
        return st;
    c->rms_norm_eps = 1e-6; /* see config.h */

    const cJSON *model_type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (present(model_type) && (!cJSON_IsString(model_type) || !model_type->valuestring))
        return bad(r, CLMLA_ERROR_INVALID_FILE, "\"model_type\" is not a string");
    const cJSON *interleave = cJSON_GetObjectItemCaseSensitive(root, "rope_interleave");
    if (present(interleave)) {
        if (!cJSON_IsBool(interleave))
            return bad(r, CLMLA_ERROR_INVALID_FILE, "\"rope_interleave\" is not true or false");
        c->rope_pairing = cJSON_IsTrue(interleave) ? CLMLA_ROPE_INTERLEAVED : CLMLA_ROPE_HALF_SPLIT;
    } else if (present(model_type) && is_deepseek_family(model_type->valuestring)) {
        c->rope_pairing = CLMLA_ROPE_INTERLEAVED;
    } else {
        return bad(r, CLMLA_ERROR_INVALID_CONFIG,
                   "model_type '%.64s' is not a DeepSeek or Kimi model and \"rope_interleave\" is absent, so the RoPE "
                   "pairing is unknown (add \"rope_interleave\": true or false)",
                   present(model_type) ? model_type->valuestring : "(absent)");
    }

    st = clmla_layer_config_validate(c);
    if (st != CLMLA_SUCCESS)
        return bad(r, st, "%s", clmla_last_error(NULL));
    return CLMLA_SUCCESS;
}

clmla_status clmla_config_parse(const char *text, size_t length, const char *name, clmla_layer_config *config,
                                int *num_layers, char *err, size_t errsize)
{
    const reader r = {name ? name : "config.json", err, errsize};
    if (!config || !num_layers || (!text && length))
        return bad(&r, CLMLA_ERROR_INVALID_ARGUMENT, "NULL argument");
    memset(config, 0, sizeof(*config));
    *num_layers = 0;
    const char *end = NULL;
    cJSON *root = length ? cJSON_ParseWithLengthOpts(text, length, &end, 0) : NULL;
    if (!root) {
        const size_t at = end && end >= text ? (size_t)(end - text) : 0;
        return bad(&r, CLMLA_ERROR_INVALID_FILE, "not valid JSON (parsing stopped at byte %zu)", at);
    }
    const char *p = end ? end : text + length;
    while (p < text + length && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\0'))
        p++;
    clmla_layer_config c;
    memset(&c, 0, sizeof(c));
    int layers = 0;
    clmla_status st = p == text + length ? read_config(&r, root, &c, &layers)
                                         : bad(&r, CLMLA_ERROR_INVALID_FILE, "data after the JSON object");
    cJSON_Delete(root);
    if (st == CLMLA_SUCCESS) {
        *config = c;
        *num_layers = layers;
    }
    return st;
}
