/* Tiny model folders for the tests (see checkpoint_writer.h). */
#include "checkpoint_writer.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- encoders, independent of the library's decoders ---------------------------------------- */

/* The value of a float of 1 sign bit, exp_bits exponent bits (bias 2^(exp_bits - 1) - 1) and
   man_bits mantissa bits, most significant first. ieee: an all-ones exponent is infinity or NaN;
   else (e4m3) only all-ones exponent and mantissa is NaN, and there is no infinity. */
static double float_value(unsigned bits, int exp_bits, int man_bits, int ieee)
{
    const int sign = (bits >> (exp_bits + man_bits)) & 1, e = (bits >> man_bits) & ((1 << exp_bits) - 1);
    const int m = bits & ((1 << man_bits) - 1), top = (1 << exp_bits) - 1;
    const int shift = (1 << (exp_bits - 1)) - 1 + man_bits; /* bias + man_bits */
    double v;
    if (ieee && e == top)
        v = m ? NAN : INFINITY;
    else if (!ieee && e == top && m == (1 << man_bits) - 1)
        v = NAN;
    else if (e == 0)
        v = ldexp(m, 1 - shift);
    else
        v = ldexp((1 << man_bits) + m, e - shift);
    return sign ? -v : v;
}

double ckpt_value_f16(uint16_t bits)
{
    return float_value(bits, 5, 10, 1);
}

double ckpt_value_bf16(uint16_t bits)
{
    return float_value(bits, 8, 7, 1);
}

double ckpt_value_f8_e4m3(uint8_t bits)
{
    return float_value(bits, 4, 3, 0);
}

uint16_t ckpt_encode_f16(float x)
{
    const uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (isnan(x))
        return 0x7E00;
    if (a >= 65520.0) /* rounds to infinity */
        return sign | 0x7C00;
    if (a < ldexp(1, -14)) /* subnormal (or the smallest normal after rounding): m * 2^-24 */
        return sign | (uint16_t)nearbyint(ldexp(a, 24));
    int e = 0;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1): quantum 2^(e - 11) */
    const double q = nearbyint(ldexp(a, 11 - e)); /* 1024 .. 2048 */
    a = ldexp(q, e - 11);
    frexp(a, &e);
    const int exponent = e - 1 + 15;
    if (exponent >= 31)
        return sign | 0x7C00;
    const int mantissa = (int)(ldexp(a, 10 - (e - 1)) - 1024);
    return sign | (uint16_t)(exponent << 10) | (uint16_t)mantissa;
}

uint16_t ckpt_encode_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

uint8_t ckpt_encode_f8_e4m3(float x)
{
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const double a = fabs((double)x);
    uint8_t best = 0;
    double best_err = INFINITY;
    for (int code = 0; code <= 0x7E; code++) { /* 0x7F is NaN; 0x7E = 448 */
        const double err = fabs(ckpt_value_f8_e4m3((uint8_t)code) - a);
        /* ties go to the even code (even mantissa) */
        if (err < best_err || (err == best_err && (code & 1) == 0)) {
            best = (uint8_t)code;
            best_err = err;
        }
    }
    return sign | best;
}

void ckpt_fill_random(float *out, size_t n, float scale, float bias, uint64_t *state)
{
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
        out[i] = bias + scale * (2.0f * (float)(*state >> 40) / (float)(1 << 24) - 1.0f);
    }
}

/* ---- files ------------------------------------------------------------------------------------ */

const char *ckpt_path(char *buf, size_t size, const char *dir, const char *name)
{
    snprintf(buf, size, "%s/%s", dir, name);
    return buf;
}

int ckpt_write_bytes(const char *path, const void *bytes, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        printf("checkpoint_writer: cannot create %s: %s\n", path, strerror(errno));
        return -1;
    }
    const int ok = fwrite(bytes, 1, size, f) == size;
    if (fclose(f) != 0 || !ok) {
        printf("checkpoint_writer: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

int ckpt_write_text(const char *path, const char *text)
{
    return ckpt_write_bytes(path, text, strlen(text));
}

int ckpt_write_safetensors_raw(const char *path, const char *header, const void *data, size_t data_bytes)
{
    const size_t hlen = strlen(header);
    unsigned char *buf = malloc(8 + hlen + data_bytes + 1);
    if (!buf)
        return -1;
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, header, hlen);
    if (data_bytes)
        memcpy(buf + 8 + hlen, data, data_bytes);
    const int rc = ckpt_write_bytes(path, buf, 8 + hlen + data_bytes);
    free(buf);
    return rc;
}

int ckpt_write_safetensors(const char *path, const ckpt_tensor *tensors, int count)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    size_t offset = 0;
    for (int i = 0; i < count; i++) {
        const ckpt_tensor *t = &tensors[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON_AddStringToObject(e, "dtype", t->dtype);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *offsets = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)(offset + t->bytes)));
        offset += t->bytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json)
        return -1;
    /* Pad the header with spaces to a multiple of 8, as the reference writer does. */
    size_t hlen = strlen(json);
    char *header = malloc(hlen + 8);
    unsigned char *data = malloc(offset ? offset : 1);
    if (!header || !data) {
        free(json);
        free(header);
        free(data);
        return -1;
    }
    memcpy(header, json, hlen);
    while (hlen % 8)
        header[hlen++] = ' ';
    header[hlen] = '\0';
    free(json);
    offset = 0;
    for (int i = 0; i < count; i++) {
        if (tensors[i].bytes)
            memcpy(data + offset, tensors[i].data, tensors[i].bytes);
        offset += tensors[i].bytes;
    }
    const int rc = ckpt_write_safetensors_raw(path, header, data, offset);
    free(header);
    free(data);
    return rc;
}

char *ckpt_config_json(const clmla_layer_config *c, int num_layers, const char *model_type, int write_interleave,
                       int rope_type_key)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model_type", model_type ? model_type : "deepseek_v3");
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("DeepseekV3ForCausalLM"));
    cJSON_AddNumberToObject(root, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(root, "num_attention_heads", c->num_heads);
    cJSON_AddNumberToObject(root, "num_key_value_heads", c->num_heads);
    if (c->q_lora_rank)
        cJSON_AddNumberToObject(root, "q_lora_rank", c->q_lora_rank);
    else
        cJSON_AddNullToObject(root, "q_lora_rank");
    cJSON_AddNumberToObject(root, "kv_lora_rank", c->kv_lora_rank);
    cJSON_AddNumberToObject(root, "qk_nope_head_dim", c->qk_nope_head_dim);
    cJSON_AddNumberToObject(root, "qk_rope_head_dim", c->qk_rope_head_dim);
    cJSON_AddNumberToObject(root, "v_head_dim", c->v_head_dim);
    cJSON_AddNumberToObject(root, "num_hidden_layers", num_layers);
    cJSON_AddNumberToObject(root, "rms_norm_eps", 1e-6);
    cJSON_AddNumberToObject(root, "rope_theta", c->rope_theta ? c->rope_theta : 10000.0);
    cJSON_AddNumberToObject(root, "max_position_embeddings", 163840);
    cJSON_AddNumberToObject(root, "intermediate_size", 64);
    if (c->yarn_factor > 1.0) {
        cJSON *rs = cJSON_AddObjectToObject(root, "rope_scaling");
        cJSON_AddNumberToObject(rs, "beta_fast", c->yarn_beta_fast ? c->yarn_beta_fast : 32.0);
        cJSON_AddNumberToObject(rs, "beta_slow", c->yarn_beta_slow ? c->yarn_beta_slow : 1.0);
        cJSON_AddNumberToObject(rs, "factor", c->yarn_factor);
        cJSON_AddNumberToObject(rs, "mscale", c->yarn_mscale);
        cJSON_AddNumberToObject(rs, "mscale_all_dim", c->yarn_mscale_all_dim);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                c->yarn_original_max_position ? c->yarn_original_max_position : 4096);
        cJSON_AddStringToObject(rs, rope_type_key ? "rope_type" : "type", "yarn");
    } else {
        cJSON_AddNullToObject(root, "rope_scaling");
    }
    if (write_interleave)
        cJSON_AddBoolToObject(root, "rope_interleave", c->rope_pairing == CLMLA_ROPE_INTERLEAVED);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

/* ---- a model ---------------------------------------------------------------------------------- */

typedef struct owned_tensor {
    char name[160];
    const char *dtype;
    int ndim;
    int64_t shape[2];
    void *data;
    size_t bytes;
} owned_tensor;

typedef struct tensor_list {
    owned_tensor *items;
    int count, capacity;
} tensor_list;

static owned_tensor *push(tensor_list *l)
{
    if (l->count == l->capacity) {
        l->capacity = l->capacity ? 2 * l->capacity : 32;
        l->items = realloc(l->items, (size_t)l->capacity * sizeof(*l->items));
        if (!l->items)
            return NULL;
    }
    owned_tensor *t = &l->items[l->count++];
    memset(t, 0, sizeof(*t));
    return t;
}

/* Encodes w [rows, cols] (cols 0: 1-D) in dtype, appends it (and F8 block scales, stored in
   scale_dtype: NULL = F32) to the list, and overwrites w with the values the checkpoint now holds. */
static int add_weight(tensor_list *l, const char *name, const char *dtype, const char *scale_dtype, float *w,
                      int64_t rows, int64_t cols)
{
    const int64_t n = rows * (cols ? cols : 1);
    owned_tensor *t = push(l);
    if (!t)
        return -1;
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->dtype = dtype;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    const int f32 = strcmp(dtype, "F32") == 0, half = strcmp(dtype, "F16") == 0;
    if (f32 || half || strcmp(dtype, "BF16") == 0) {
        /* little-endian bytes of the f32 bits, or of the 16-bit code (w[i] becomes its value) */
        const int size = f32 ? 4 : 2;
        t->bytes = (size_t)n * size;
        t->data = malloc(t->bytes);
        if (!t->data)
            return -1;
        unsigned char *p = t->data;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            if (f32) {
                memcpy(&u, &w[i], 4);
            } else {
                u = half ? ckpt_encode_f16(w[i]) : ckpt_encode_bf16(w[i]);
                w[i] = (float)(half ? ckpt_value_f16((uint16_t)u) : ckpt_value_bf16((uint16_t)u));
            }
            for (int b = 0; b < size; b++)
                p[size * i + b] = (unsigned char)(u >> (8 * b));
        }
        return 0;
    }
    /* F8_E4M3: per 128x128 block, scale = max|w| / 448, q = fp8(w / scale), W = fp8(q) * scale. */
    const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
    float *scales = malloc((size_t)(br * bc) * sizeof(float));
    t->bytes = (size_t)n;
    t->data = malloc(t->bytes);
    if (!scales || !t->data) {
        free(scales);
        return -1;
    }
    unsigned char *q = t->data;
    for (int64_t bi = 0; bi < br; bi++)
        for (int64_t bj = 0; bj < bc; bj++) {
            float amax = 0;
            for (int64_t i = bi * 128; i < rows && i < (bi + 1) * 128; i++)
                for (int64_t j = bj * 128; j < cols && j < (bj + 1) * 128; j++)
                    amax = fmaxf(amax, fabsf(w[i * cols + j]));
            float scale = amax > 0 ? amax / 448.0f : 1.0f;
            /* The scale the checkpoint will hold; a code past 448 after a scale rounded down saturates. */
            if (scale_dtype && strcmp(scale_dtype, "BF16") == 0)
                scale = (float)ckpt_value_bf16(ckpt_encode_bf16(scale));
            else if (scale_dtype && strcmp(scale_dtype, "F16") == 0)
                scale = (float)ckpt_value_f16(ckpt_encode_f16(scale));
            scales[bi * bc + bj] = scale;
            for (int64_t i = bi * 128; i < rows && i < (bi + 1) * 128; i++)
                for (int64_t j = bj * 128; j < cols && j < (bj + 1) * 128; j++) {
                    q[i * cols + j] = ckpt_encode_f8_e4m3(w[i * cols + j] / scale);
                    w[i * cols + j] = (float)ckpt_value_f8_e4m3(q[i * cols + j]) * scale;
                }
        }
    char scale_name[200];
    snprintf(scale_name, sizeof(scale_name), "%s_scale_inv", name);
    const int rc = add_weight(l, scale_name, scale_dtype ? scale_dtype : "F32", NULL, scales, br, bc);
    free(scales);
    return rc;
}

static void free_list(tensor_list *l)
{
    for (int i = 0; i < l->count; i++)
        free(l->items[i].data);
    free(l->items);
}

static float *random_weight(int64_t n, float scale, float bias, uint64_t *rng)
{
    float *p = malloc((size_t)n * sizeof(float));
    if (p)
        ckpt_fill_random(p, (size_t)n, scale, bias, rng);
    return p;
}

/* The layer's weights, encoded into the list; *w gets the dequantised values. */
static int add_layer(tensor_list *l, const ckpt_model *m, int layer, const clmla_layer_config *c, ckpt_weights *w,
                     uint64_t *rng)
{
    const int64_t D = c->hidden_size, H = c->num_heads, rq = c->q_lora_rank, rkv = c->kv_lora_rank;
    const int64_t dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    const char *dtype = m->dtype ? m->dtype : "F32";
    const char *norm_dtype = strcmp(dtype, "F8_E4M3") == 0 ? "BF16" : dtype;
    memset(w, 0, sizeof(*w));
    struct {
        const char *suffix;
        float **slot;
        int64_t rows, cols;
        float scale, bias;
    } specs[] = {
        {"q_a_proj", &w->q_a_proj, rq, D, 1.0f / sqrtf((float)D), 0},
        {"q_a_layernorm", &w->q_a_layernorm, rq, 0, 0.2f, 1.0f},
        {"q_b_proj", &w->q_b_proj, H * (dn + dr), rq, 1.0f / sqrtf((float)(rq ? rq : 1)), 0},
        {"q_proj", &w->q_proj, H * (dn + dr), D, 1.0f / sqrtf((float)D), 0},
        {"kv_a_proj_with_mqa", &w->kv_a_proj_with_mqa, rkv + dr, D, 1.0f / sqrtf((float)D), 0},
        {"kv_a_layernorm", &w->kv_a_layernorm, rkv, 0, 0.2f, 1.0f},
        {"kv_b_proj", &w->kv_b_proj, H * (dn + dv), rkv, 1.0f / sqrtf((float)rkv), 0},
        {"o_proj", &w->o_proj, D, H * dv, 1.0f / sqrtf((float)(H * dv)), 0},
    };
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
        const int is_q_lora = i < 3, is_q_proj = i == 3;
        if ((is_q_lora && rq == 0) || (is_q_proj && rq != 0))
            continue;
        const int64_t n = specs[i].rows * (specs[i].cols ? specs[i].cols : 1);
        float *values = random_weight(n, specs[i].scale, specs[i].bias, rng);
        if (!values)
            return -1;
        *specs[i].slot = values;
        char name[160];
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.%s.weight", layer, specs[i].suffix);
        if (add_weight(l, name, specs[i].cols ? dtype : norm_dtype, m->scale_dtype, values, specs[i].rows,
                       specs[i].cols) != 0)
            return -1;
    }
    return 0;
}

/* Tensors the loader must skip: other parts of the model, other dtypes. */
static int add_extras(tensor_list *l, const clmla_layer_config *c, int layer, uint64_t *rng)
{
    const int64_t D = c->hidden_size;
    float *values = random_weight(4 * D, 0.5f, 0, rng);
    if (!values)
        return -1;
    char name[160];
    snprintf(name, sizeof(name), "model.layers.%d.input_layernorm.weight", layer);
    int rc = add_weight(l, name, "BF16", NULL, values, D, 0);
    snprintf(name, sizeof(name), "model.layers.%d.mlp.gate_proj.weight", layer);
    if (rc == 0)
        rc = add_weight(l, name, "BF16", NULL, values, 4, D);
    free(values);
    owned_tensor *t = rc == 0 ? push(l) : NULL;
    if (!t)
        return -1;
    snprintf(t->name, sizeof(t->name), "model.layers.%d.self_attn.rotary_emb.position_ids", layer);
    t->dtype = "I64";
    t->ndim = 1;
    t->shape[0] = 3;
    t->bytes = 24;
    t->data = calloc(1, 24);
    return t->data ? 0 : -1;
}

static int suffix_is(const char *name, const char *suffix)
{
    const char *p = strstr(name, ".self_attn.");
    return suffix && p && strcmp(p + strlen(".self_attn."), suffix) == 0;
}

int ckpt_write_model(const char *dir, const ckpt_model *m, ckpt_weights *layers)
{
    const int num_layers = m->num_layers ? m->num_layers : 1;
    const clmla_layer_config *tc = m->tensor_config ? m->tensor_config : &m->config;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        printf("checkpoint_writer: cannot create %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char path[1024];
    char *config = ckpt_config_json(&m->config, num_layers, m->model_type, m->write_interleave, m->rope_type_key);
    int rc = config ? ckpt_write_text(ckpt_path(path, sizeof(path), dir, "config.json"), config) : -1;
    free(config);

    tensor_list list = {NULL, 0, 0};
    uint64_t rng = 0x243F6A8885A308D3ULL ^ ((uint64_t)m->seed * 0x9E3779B97F4A7C15ULL);
    if (rc == 0 && m->extras) {
        float *embed = random_weight(8 * (int64_t)tc->hidden_size, 0.5f, 0, &rng);
        rc = embed ? add_weight(&list, "model.embed_tokens.weight", "BF16", NULL, embed, 8, tc->hidden_size) : -1;
        free(embed);
    }
    for (int layer = 0; rc == 0 && layer < num_layers; layer++) {
        ckpt_weights w;
        rc = add_layer(&list, m, layer, tc, &w, &rng);
        if (rc == 0 && m->extras)
            rc = add_extras(&list, tc, layer, &rng);
        if (rc == 0 && layers)
            layers[layer] = w;
        else
            tu_weights_free(&w);
    }
    /* Leave out, relabel or reshape what the test asks for. */
    for (int i = 0; rc == 0 && i < list.count; i++) {
        if (suffix_is(list.items[i].name, m->omit)) {
            free(list.items[i].data);
            list.items[i] = list.items[--list.count];
            i--;
        } else if (suffix_is(list.items[i].name, m->retype)) {
            list.items[i].dtype = m->retype_as;
        } else if (suffix_is(list.items[i].name, m->reshape)) {
            list.items[i].ndim = 2;
            list.items[i].shape[0] = m->reshape_to[0];
            list.items[i].shape[1] = m->reshape_to[1];
        }
    }

    const int shards = m->shards > 0 ? m->shards : 1;
    ckpt_tensor *views = rc == 0 ? calloc((size_t)list.count + 1, sizeof(*views)) : NULL;
    if (!views)
        rc = -1;
    cJSON *index = NULL, *map = NULL;
    if (rc == 0 && m->shards > 0) {
        index = cJSON_CreateObject();
        cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
        size_t total = 0;
        for (int i = 0; i < list.count; i++)
            total += list.items[i].bytes;
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        map = cJSON_AddObjectToObject(index, "weight_map");
    }
    /* Tensor i goes to shard i % shards, so a weight and its scales usually land apart. */
    for (int s = 0; rc == 0 && s < shards; s++) {
        int n = 0;
        char file[128];
        if (m->shards > 0)
            snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", s + 1, shards);
        else
            snprintf(file, sizeof(file), "model.safetensors");
        for (int i = s; i < list.count; i += shards) {
            const owned_tensor *t = &list.items[i];
            ckpt_tensor v = {t->name, t->dtype, t->ndim, {t->shape[0], t->shape[1]}, t->data, t->bytes};
            views[n++] = v;
            if (map)
                cJSON_AddStringToObject(map, t->name, file);
        }
        rc = ckpt_write_safetensors(ckpt_path(path, sizeof(path), dir, file), views, n);
    }
    if (rc == 0 && index) {
        char *text = cJSON_Print(index);
        rc = text ? ckpt_write_text(ckpt_path(path, sizeof(path), dir, "model.safetensors.index.json"), text) : -1;
        free(text);
    }
    cJSON_Delete(index);
    free(views);
    free_list(&list);
    if (rc != 0 && layers)
        for (int layer = 0; layer < num_layers; layer++)
            tu_weights_free(&layers[layer]);
    return rc;
}

/* ---- directories and the reference's view ------------------------------------------------------ */

int ckpt_make_temp_dir(char *buf, size_t size, const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, size, "%s/clmla-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", tag);
    if (!mkdtemp(buf)) {
        printf("checkpoint_writer: mkdtemp %s: %s\n", buf, strerror(errno));
        return -1;
    }
    return 0;
}

void ckpt_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
            ckpt_remove_dir(path);
        else
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

int ckpt_run_cli(const char *cli, const char *args, const char *log)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "'%s' run %s >'%s' 2>&1", cli, args, log);
    const int rc = system(cmd);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

const char *ckpt_read_text(const char *path)
{
    static char text[16384];
    FILE *f = fopen(path, "rb");
    const size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
    if (f)
        fclose(f);
    text[n] = '\0';
    return text;
}

mla_ref_config ckpt_ref_config(const clmla_layer_config *c)
{
    mla_ref_config r = {.hidden = c->hidden_size, .heads = c->num_heads, .q_lora_rank = c->q_lora_rank,
                        .kv_lora_rank = c->kv_lora_rank, .nope_dim = c->qk_nope_head_dim,
                        .rope_dim = c->qk_rope_head_dim, .v_dim = c->v_head_dim, .rms_eps = 1e-6,
                        .rope_theta = c->rope_theta ? c->rope_theta : 10000.0,
                        .rope_half_split = c->rope_pairing == CLMLA_ROPE_HALF_SPLIT, .yarn_factor = c->yarn_factor,
                        .yarn_original_max_pos = c->yarn_original_max_position ? c->yarn_original_max_position : 4096,
                        .yarn_beta_fast = c->yarn_beta_fast ? c->yarn_beta_fast : 32.0,
                        .yarn_beta_slow = c->yarn_beta_slow ? c->yarn_beta_slow : 1.0, .yarn_mscale = c->yarn_mscale,
                        .yarn_mscale_all_dim = c->yarn_mscale_all_dim};
    return r;
}

mla_ref_weights ckpt_ref_weights(const ckpt_weights *w)
{
    mla_ref_weights r = {w->q_a_proj, w->q_a_layernorm, w->q_b_proj, w->q_proj,
                         w->kv_a_proj_with_mqa, w->kv_a_layernorm, w->kv_b_proj, w->o_proj};
    return r;
}

/* D 160 and rkv 144 are past one 128-wide scale block and not a multiple of it. */
clmla_layer_config ckpt_tiny_config(int q_lora, int yarn)
{
    clmla_layer_config c = {.hidden_size = 160, .num_heads = 2, .q_lora_rank = q_lora ? 136 : 0, .kv_lora_rank = 144,
                            .qk_nope_head_dim = 16, .qk_rope_head_dim = 8, .v_head_dim = 16, .rms_norm_eps = 1e-6,
                            .rope_theta = 10000.0, .rope_pairing = CLMLA_ROPE_INTERLEAVED};
    if (yarn) {
        /* Different mscales, so that both the RoPE amplitude and the softmax factor are not 1. */
        c.yarn_factor = 40.0;
        c.yarn_original_max_position = 4096;
        c.yarn_beta_fast = 32.0;
        c.yarn_beta_slow = 1.0;
        c.yarn_mscale = 1.0;
        c.yarn_mscale_all_dim = 0.707;
    }
    return c;
}
