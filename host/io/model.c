/* Model folders: config.json + safetensors (single file or shards) -> one clmla_layer.
 *
 *   DIR/config.json                       the layer configuration (config.c)
 *   DIR/model.safetensors                 every tensor, or
 *   DIR/model.safetensors.index.json      {"weight_map": {tensor: shard}} and the shards beside it
 *
 * Only the shards that hold the layer's attention tensors are mapped. Each 2-D weight is copied out
 * in its stored dtype (F8_E4M3 with its block scales as float32), so that the layer keeps the
 * checkpoint's precision and memory unless clmla_model_options.weights_dtype asks for a conversion;
 * the 1-D norms and biases become float32, which is what the layer keeps them in. The host copies
 * live until clmla_layer_create has uploaded them (the shards are unmapped before it runs). */
#include "config.h"
#include "dtype.h"
#include "fileio.h"
#include "internal.h"
#include "safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_NAME "config.json"
#define SINGLE_NAME "model.safetensors"
#define INDEX_NAME "model.safetensors.index.json"
/* config.json and the index are small (DeepSeek-V3's index, with its tens of thousands of tensors, is a few MB). */
#define MAX_JSON_BYTES ((size_t)64 << 20)
#define ERR_SIZE 4096

static char *join(const char *dir, const char *name)
{
    const size_t a = strlen(dir), b = strlen(name);
    const int slash = a > 0 && dir[a - 1] != '/';
    char *path = malloc(a + (size_t)slash + b + 1);
    if (path) {
        memcpy(path, dir, a);
        if (slash)
            path[a] = '/';
        memcpy(path + a + slash, name, b + 1);
    }
    return path;
}

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

clmla_status clmla_model_folder_desc(const char *model_dir, clmla_model_desc *desc, char *err, size_t errsize)
{
    char *path = join(model_dir, CONFIG_NAME);
    if (!path) {
        snprintf(err, errsize, "out of host memory");
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    }
    char *text = NULL;
    size_t length = 0;
    clmla_status st = clmla_read_file(path, MAX_JSON_BYTES, "a JSON file of a model folder", &text, &length, err, errsize);
    if (st == CLMLA_SUCCESS)
        st = clmla_model_config_parse(text, length, path, desc, err, errsize);
    free(text);
    free(path);
    return st;
}

clmla_status clmla_model_read_config(const char *model_dir, clmla_layer_config *config, int *num_layers)
{
    if (!model_dir || !config)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_model_read_config: NULL argument");
    char err[ERR_SIZE];
    clmla_model_desc d;
    clmla_status st = clmla_model_folder_desc(model_dir, &d, err, sizeof(err));
    if (st != CLMLA_SUCCESS)
        return clmla_fail(NULL, st, "%s", err);
    *config = d.layer;
    if (num_layers)
        *num_layers = d.num_layers;
    clmla_model_desc_free(&d);
    return CLMLA_SUCCESS;
}

/* ---- finding tensors ------------------------------------------------------------------------ */

#define MAX_OPEN_SHARDS 32

typedef struct shard {
    char *file_name; /* as the index names it */
    clmla_st_file st;
} shard;

typedef struct loader {
    const char *dir;
    char *single_path;   /* DIR/model.safetensors, when that is the layout */
    char *index_path;    /* DIR/model.safetensors.index.json, when sharded */
    clmla_st_index index;
    shard shards[MAX_OPEN_SHARDS]; /* the single file is shards[0] */
    int num_shards;
    char err[ERR_SIZE];
} loader;

static void loader_free(loader *l)
{
    for (int i = 0; i < l->num_shards; i++) {
        free(l->shards[i].file_name);
        clmla_st_close(&l->shards[i].st);
    }
    clmla_st_index_free(&l->index);
    free(l->single_path);
    free(l->index_path);
}

static clmla_status loader_open(loader *l, const char *dir)
{
    memset(l, 0, sizeof(*l));
    l->dir = dir;
    l->single_path = join(dir, SINGLE_NAME);
    l->index_path = join(dir, INDEX_NAME);
    if (!l->single_path || !l->index_path) {
        snprintf(l->err, sizeof(l->err), "out of host memory");
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    }
    /* As transformers does: a single file first, then the index. */
    if (is_file(l->single_path)) {
        free(l->index_path);
        l->index_path = NULL;
        l->shards[0].file_name = strdup(SINGLE_NAME);
        if (!l->shards[0].file_name) {
            snprintf(l->err, sizeof(l->err), "out of host memory");
            return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
        }
        l->num_shards = 1;
        return clmla_st_open(l->single_path, &l->shards[0].st, l->err, sizeof(l->err));
    }
    free(l->single_path);
    l->single_path = NULL;
    if (!is_file(l->index_path)) {
        snprintf(l->err, sizeof(l->err), "%s: neither %s nor %s is there", dir, SINGLE_NAME, INDEX_NAME);
        return CLMLA_ERROR_IO;
    }
    char *text = NULL;
    size_t length = 0;
    clmla_status st = clmla_read_file(l->index_path, MAX_JSON_BYTES, "a JSON file of a model folder", &text, &length, l->err,
                                           sizeof(l->err));
    if (st == CLMLA_SUCCESS)
        st = clmla_st_index_parse(text, length, l->index_path, &l->index, l->err, sizeof(l->err));
    free(text);
    return st;
}

/* The file and header entry of a tensor; *t NULL (and CLMLA_SUCCESS) when it is absent. */
static clmla_status find_tensor(loader *l, const char *name, const clmla_st_file **file, const clmla_st_tensor **t)
{
    *file = NULL;
    *t = NULL;
    if (l->single_path) {
        *file = &l->shards[0].st;
        *t = clmla_st_find(*file, name);
        return CLMLA_SUCCESS;
    }
    const char *shard_name = clmla_st_index_lookup(&l->index, name);
    if (!shard_name)
        return CLMLA_SUCCESS;
    int i = 0;
    while (i < l->num_shards && strcmp(l->shards[i].file_name, shard_name) != 0)
        i++;
    if (i == l->num_shards) {
        if (l->num_shards == MAX_OPEN_SHARDS) {
            snprintf(l->err, sizeof(l->err), "%s: the layer's tensors are spread over more than %d shards", l->index_path,
                     MAX_OPEN_SHARDS);
            return CLMLA_ERROR_UNSUPPORTED;
        }
        char *path = join(l->dir, shard_name);
        shard *s = &l->shards[i];
        s->file_name = strdup(shard_name);
        if (!path || !s->file_name) {
            free(path);
            free(s->file_name);
            s->file_name = NULL;
            snprintf(l->err, sizeof(l->err), "out of host memory");
            return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
        }
        if (!is_file(path)) {
            snprintf(l->err, sizeof(l->err), "%s names shard '%s' (for tensor %s), but %s is missing", l->index_path,
                     shard_name, name, path);
            free(path);
            free(s->file_name);
            s->file_name = NULL;
            return CLMLA_ERROR_IO;
        }
        clmla_status st = clmla_st_open(path, &s->st, l->err, sizeof(l->err));
        free(path);
        if (st != CLMLA_SUCCESS) {
            free(s->file_name);
            s->file_name = NULL;
            return st;
        }
        l->num_shards++;
    }
    *file = &l->shards[i].st;
    *t = clmla_st_find(*file, name);
    if (!*t) {
        snprintf(l->err, sizeof(l->err), "%s: tensor %s is missing (%s places it in this shard)", (*file)->name, name,
                 l->index_path);
        return CLMLA_ERROR_MISSING_TENSOR;
    }
    return CLMLA_SUCCESS;
}

/* A tensor as clmla_layer_create takes it, and the host arrays it points to (malloc'ed). */
typedef struct host_tensor {
    clmla_tensor t;
    void *data;
    float *scale; /* FP8_E4M3's block scales */
} host_tensor;

static void host_tensor_free(host_tensor *h)
{
    free(h->data);
    free(h->scale);
    memset(h, 0, sizeof(*h));
}

/* An edge of a block on an fp8 weight's 128 x 128 scale grid: a multiple of 128 or the weight's edge. */
static int on_scale_grid(int64_t edge, int64_t extent)
{
    return edge % 128 == 0 || edge == extent;
}

/* Copies the block block[0..4) = (r0, rows, c0, cols) of the 2-D tensor t, in its stored dtype, into
   out (rows x cols elements), and for F8_E4M3 the block's scales out of all_scales into scales. */
static clmla_status copy_block(loader *l, const clmla_st_file *file, const clmla_st_tensor *t, clmla_dtype dtype,
                               const int64_t block[4], void *out, const float *all_scales, float *scales)
{
    const size_t eb = clmla_dtype_bytes(dtype), k = (size_t)t->shape[1];
    const size_t r0 = (size_t)block[0], rows = (size_t)block[1], c0 = (size_t)block[2], cols = (size_t)block[3];
    /* whole rows in one copy, else a row's columns at a time: a header entry for just those bytes */
    clmla_st_tensor part = *t;
    const size_t runs = cols == k ? 1 : rows, run_bytes = (cols == k ? rows : 1) * cols * eb;
    clmla_status st = CLMLA_SUCCESS;
    for (size_t i = 0; i < runs && st == CLMLA_SUCCESS; i++) {
        part.begin = t->begin + (uint64_t)(((r0 + i) * k + c0) * eb);
        part.end = part.begin + run_bytes;
        st = clmla_st_copy_raw(file, &part, (char *)out + i * run_bytes, l->err, sizeof(l->err));
    }
    if (st == CLMLA_SUCCESS && dtype == CLMLA_DTYPE_FP8_E4M3) {
        const size_t bk = clmla_fp8_blocks(k), sr = clmla_fp8_blocks(rows), sc = clmla_fp8_blocks(cols);
        for (size_t i = 0; i < sr; i++)
            memcpy(scales + i * sc, all_scales + (r0 / CLMLA_FP8_BLOCK + i) * bk + c0 / CLMLA_FP8_BLOCK,
                   sc * sizeof(float));
    }
    return st;
}

/* Loads one weight into *out after checking its shape: [rows, cols] in its stored dtype (F8_E4M3
   with its "_scale_inv" block scales converted to float32), or [rows] as float32 when cols is 0.
   `block` (NULL: the whole tensor) = (r0, rows, c0, cols) of a 2-D weight that a tensor-parallel
   shard keeps: only those elements are copied, except for an F8_E4M3 weight whose block does not
   lie on its scale grid, which is loaded whole (the layer then decodes its block to float32).
   On failure *out holds nothing. */
static clmla_status load_tensor_block(loader *l, const char *prefix, const char *suffix, int64_t rows, int64_t cols,
                                      const char *implied_by, const int64_t *block, host_tensor *out)
{
    memset(out, 0, sizeof(*out));
    char name[256], scale_name[300];
    snprintf(name, sizeof(name), "%s%s", prefix, suffix);
    snprintf(scale_name, sizeof(scale_name), "%s_scale_inv", name);
    const clmla_st_file *file = NULL, *scale_file = NULL;
    const clmla_st_tensor *t = NULL, *scale = NULL;
    clmla_status st = find_tensor(l, name, &file, &t);
    if (st != CLMLA_SUCCESS)
        return st;
    if (!t) {
        if (l->single_path)
            snprintf(l->err, sizeof(l->err), "%s: tensor %s is missing", l->single_path, name);
        else
            snprintf(l->err, sizeof(l->err), "%s: tensor %s is missing (its weight_map does not list it)", l->index_path,
                     name);
        return CLMLA_ERROR_MISSING_TENSOR;
    }
    const int64_t want[2] = {rows, cols};
    const int want_ndim = cols ? 2 : 1;
    if (t->ndim != want_ndim || t->shape[0] != rows || (cols && t->shape[1] != cols)) {
        char got_text[256], want_text[64];
        clmla_st_shape_text(t->ndim, t->shape, got_text, sizeof(got_text));
        clmla_st_shape_text(want_ndim, want, want_text, sizeof(want_text));
        snprintf(l->err, sizeof(l->err), "%s: tensor %s has shape %s, but config.json implies %s (%s)", file->name, name,
                 got_text, want_text, implied_by);
        return CLMLA_ERROR_SHAPE_MISMATCH;
    }
    const size_t numel = (size_t)clmla_st_numel(t);
    if (!cols) { /* a norm or a bias: float32 (an F8_E4M3 one is refused by the conversion) */
        float *values = malloc((numel ? numel : 1) * sizeof(float));
        if (!values) {
            snprintf(l->err, sizeof(l->err), "out of host memory for %s (%zu values)", name, numel);
            return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
        }
        st = clmla_st_to_f32(file, t, NULL, NULL, values, l->err, sizeof(l->err));
        if (st != CLMLA_SUCCESS) {
            free(values);
            return st;
        }
        out->data = values;
        out->t = clmla_tensor_1d(values, rows);
        return CLMLA_SUCCESS;
    }

    clmla_dtype dtype = CLMLA_DTYPE_F32;
    st = clmla_st_stored_dtype(file, t, &dtype, l->err, sizeof(l->err));
    if (st != CLMLA_SUCCESS)
        return st;
    if (dtype == CLMLA_DTYPE_FP8_E4M3) {
        st = find_tensor(l, scale_name, &scale_file, &scale);
        if (st != CLMLA_SUCCESS)
            return st;
        if (!scale) {
            snprintf(l->err, sizeof(l->err), "%s: tensor %s is F8_E4M3 but its block scales %s are missing", file->name,
                     name, scale_name);
            return CLMLA_ERROR_MISSING_TENSOR;
        }
    }
    if (block && (block[1] == rows && block[3] == cols))
        block = NULL; /* the whole tensor */
    if (block && dtype == CLMLA_DTYPE_FP8_E4M3 &&
        !(block[0] % 128 == 0 && block[2] % 128 == 0 && on_scale_grid(block[0] + block[1], rows) &&
          on_scale_grid(block[2] + block[3], cols)))
        block = NULL; /* its scales do not follow the block: the layer keeps its block in float32 */
    const int64_t out_rows = block ? block[1] : rows, out_cols = block ? block[3] : cols;
    const size_t bytes = (size_t)out_rows * (size_t)out_cols * clmla_dtype_bytes(dtype);
    out->data = malloc(bytes ? bytes : 1);
    if (!out->data) {
        snprintf(l->err, sizeof(l->err), "out of host memory for %s (%zu bytes)", name, bytes);
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    }
    float *all_scales = NULL;
    if (dtype == CLMLA_DTYPE_FP8_E4M3) {
        const size_t blocks = clmla_fp8_blocks((size_t)rows) * clmla_fp8_blocks((size_t)cols);
        const size_t kept = clmla_fp8_blocks((size_t)out_rows) * clmla_fp8_blocks((size_t)out_cols);
        out->scale = malloc(kept * sizeof(float));
        all_scales = block ? malloc(blocks * sizeof(float)) : out->scale;
        if (!out->scale || !all_scales) {
            snprintf(l->err, sizeof(l->err), "out of host memory for %s (%zu values)", scale_name, blocks);
            st = CLMLA_ERROR_OUT_OF_HOST_MEMORY;
        } else {
            st = clmla_st_scales_f32(file, t, scale_file, scale, all_scales, l->err, sizeof(l->err));
        }
    }
    if (st == CLMLA_SUCCESS && block)
        st = copy_block(l, file, t, dtype, block, out->data, all_scales, out->scale);
    else if (st == CLMLA_SUCCESS)
        st = clmla_st_copy_raw(file, t, out->data, l->err, sizeof(l->err));
    if (all_scales != out->scale)
        free(all_scales);
    if (st != CLMLA_SUCCESS) {
        host_tensor_free(out);
        return st;
    }
    out->t.data = out->data;
    out->t.ndim = 2;
    out->t.shape[0] = out_rows;
    out->t.shape[1] = out_cols;
    out->t.dtype = dtype;
    out->t.scale = out->scale;
    return CLMLA_SUCCESS;
}

static clmla_status load_tensor(loader *l, const char *prefix, const char *suffix, int64_t rows, int64_t cols,
                                const char *implied_by, host_tensor *out)
{
    return load_tensor_block(l, prefix, suffix, rows, cols, implied_by, NULL, out);
}

/* Where layer N's attention tensors sit: transformers' own names, and those of the multimodal
   wrappers (kimi_k25, mistral3) as published and as transformers 5 saves them (its kimi_k25
   renaming "blocks" -> "layers" on load writes "blocks" back on save). */
static const char *const prefixes[] = {"model.layers.%d.self_attn.%s", "language_model.model.layers.%d.self_attn.%s",
                                       "model.language_model.layers.%d.self_attn.%s",
                                       "language_model.layers.%d.self_attn.%s",
                                       "language_model.model.blocks.%d.self_attn.%s"};

static clmla_status find_prefix(loader *l, int layer, const char *sub, char *prefix, size_t size)
{
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
        char probe[300];
        snprintf(prefix, size, prefixes[i], layer, sub);
        snprintf(probe, sizeof(probe), "%skv_a_proj_with_mqa.weight", prefix);
        const clmla_st_file *file = NULL;
        const clmla_st_tensor *t = NULL;
        clmla_status st = find_tensor(l, probe, &file, &t);
        if (st != CLMLA_SUCCESS)
            return st;
        if (t)
            return CLMLA_SUCCESS;
    }
    snprintf(prefix, size, prefixes[0], layer, sub); /* the missing-tensor message names transformers' own */
    return CLMLA_SUCCESS;
}

/* "0, 4, 8" of the MLA layers, for messages. */
static void mla_list(const clmla_model_desc *d, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->num_layers && n + 16 < size; i++)
        if (d->is_mla[i])
            n += (size_t)snprintf(buf + n, size - n, "%s%d", n ? ", " : "", i);
}

clmla_status clmla_layer_create_from_model(clmla_context *ctx, const char *model_dir, int layer_index,
                                           clmla_layer **layer)
{
    clmla_model_options o;
    memset(&o, 0, sizeof(o));
    o.layer = layer_index;
    return clmla_layer_create_from_model_opts(ctx, model_dir, &o, layer);
}

clmla_status clmla_layer_create_from_model_opts(clmla_context *ctx, const char *model_dir, const clmla_model_options *opt,
                                                clmla_layer **layer)
{
    if (!layer)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_create_from_model: NULL output pointer");
    *layer = NULL;
    if (!ctx || !model_dir || !opt)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_create_from_model: NULL argument");

    clmla_model_desc d;
    char err[ERR_SIZE];
    clmla_status st = clmla_model_folder_desc(model_dir, &d, err, sizeof(err));
    if (st != CLMLA_SUCCESS)
        return clmla_fail(ctx, st, "%s", err);
    const int layer_index = opt->layer;
    if (layer_index < 0 || layer_index >= d.num_layers) {
        clmla_model_desc_free(&d);
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "layer %d is out of range: %s/%s has %d decoder layers (0 to %d)", layer_index, model_dir,
                          CONFIG_NAME, d.num_layers, d.num_layers - 1);
    }
    if (opt->sublayer < 0 || opt->sublayer >= d.attentions_per_layer) {
        const int n = d.attentions_per_layer;
        clmla_model_desc_free(&d);
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "sublayer %d is out of range: %s has %d attention%s per layer%s",
                          opt->sublayer, d.model_type, n, n == 1 ? "" : "s", n == 1 ? " (sublayer 0)" : " (0 to 1)");
    }
    if (d.is_mla && !d.is_mla[layer_index]) {
        char list[512];
        mla_list(&d, list, sizeof(list));
        clmla_fail(ctx, CLMLA_ERROR_INVALID_CONFIG,
                   "layer %d of %s is not an MLA layer (%s's other layers are linear attention); its MLA layers are %s",
                   layer_index, model_dir, d.model_type, list[0] ? list : "none");
        clmla_model_desc_free(&d);
        return CLMLA_ERROR_INVALID_CONFIG;
    }
    /* A "shared" layer attends to the selection of the full layer before it (clmla_layer_config.
       index_shared); the first layers of a model are full. */
    const int shared = d.index_shared && d.index_shared[layer_index] && !opt->dense;
    if (shared) {
        int full = layer_index - 1;
        while (full >= 0 && d.index_shared[full])
            full--;
        if (full < 0) {
            clmla_fail(ctx, CLMLA_ERROR_INVALID_CONFIG,
                       "layer %d of %s is a \"shared\" sparse-attention layer (indexer_types), but no layer before it "
                       "is a full one whose selection it could take",
                       layer_index, model_dir);
            clmla_model_desc_free(&d);
            return CLMLA_ERROR_INVALID_CONFIG;
        }
    }
    clmla_layer_config c = d.layer;
    if (shared) { /* no indexer of its own: the full layer's selection, of the same index_topk */
        c.index_n_heads = 0;
        c.index_shared = 1;
    }
    if (opt->dense) { /* a sparse-attention model without its indexer: every key, at any length */
        c.index_n_heads = 0;
        c.dense_max_keys = 0;
    }
    /* What the caller asked the weights to be kept in; the layer checks the value. */
    c.weights_dtype = opt->weights_dtype;
    c.tp_rank = opt->tp_rank;
    c.tp_size = opt->tp_size;
    const int bias = d.attention_bias;
    clmla_model_desc_free(&d);
    /* Before anything is read: the shard's slices below need a tp_size that divides the heads. */
    st = clmla_layer_config_validate(&c);
    if (st != CLMLA_SUCCESS)
        return clmla_fail(ctx, st, "%s: %s", model_dir, clmla_last_error(NULL));

    loader *l = calloc(1, sizeof(*l));
    if (!l)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    st = loader_open(l, model_dir);

    const int64_t D = c.hidden_size, H = c.num_heads, rq = c.q_lora_rank, rkv = c.kv_lora_rank;
    const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
    /* A tensor-parallel shard's heads [h0, h0 + Hs): rows of q_b_proj (q_proj) and kv_b_proj, columns
       of o_proj (r0, rows, c0, cols); the layer checks and keeps them (docs/MODELS.md). */
    const int64_t Hs = c.tp_size > 1 ? H / c.tp_size : H, h0 = (int64_t)c.tp_rank * Hs;
    const int64_t q_block[4] = {h0 * (dn + dr), Hs * (dn + dr), 0, rq ? rq : D};
    const int64_t kvb_block[4] = {h0 * (dn + dv), Hs * (dn + dv), 0, rkv};
    const int64_t o_block[4] = {0, D, h0 * dv, Hs * dv};
    char prefix[256], sub[16] = "";
    if (d.attentions_per_layer > 1)
        snprintf(sub, sizeof(sub), "%d.", opt->sublayer);
    if (st == CLMLA_SUCCESS)
        st = find_prefix(l, layer_index, sub, prefix, sizeof(prefix));
    host_tensor q_a, q_a_norm, q_b, q, kv_a, kv_norm, kv_b, o, q_a_bias, kv_a_bias, o_bias;
    host_tensor iq, ik, inorm, inorm_b, iw; /* the indexer's */
    host_tensor *all[] = {&q_a, &q_a_norm, &q_b, &q, &kv_a, &kv_norm, &kv_b, &o, &q_a_bias, &kv_a_bias, &o_bias,
                          &iq, &ik, &inorm, &inorm_b, &iw};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        memset(all[i], 0, sizeof(*all[i]));
    if (st == CLMLA_SUCCESS && rq == 0)
        st = load_tensor_block(l, prefix, "q_proj.weight", H * (dn + dr), D,
                               "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim), hidden_size", q_block, &q);
    if (st == CLMLA_SUCCESS && rq > 0)
        st = load_tensor(l, prefix, "q_a_proj.weight", rq, D, "q_lora_rank, hidden_size", &q_a);
    if (st == CLMLA_SUCCESS && rq > 0)
        st = load_tensor(l, prefix, "q_a_layernorm.weight", rq, 0, "q_lora_rank", &q_a_norm);
    if (st == CLMLA_SUCCESS && rq > 0)
        st = load_tensor_block(l, prefix, "q_b_proj.weight", H * (dn + dr), rq,
                               "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim), q_lora_rank", q_block, &q_b);
    if (st == CLMLA_SUCCESS)
        st = load_tensor(l, prefix, "kv_a_proj_with_mqa.weight", rkv + dr, D,
                         "kv_lora_rank + qk_rope_head_dim, hidden_size", &kv_a);
    if (st == CLMLA_SUCCESS)
        st = load_tensor(l, prefix, "kv_a_layernorm.weight", rkv, 0, "kv_lora_rank", &kv_norm);
    if (st == CLMLA_SUCCESS)
        st = load_tensor_block(l, prefix, "kv_b_proj.weight", H * (dn + dv), rkv,
                               "num_attention_heads x (qk_nope_head_dim + v_head_dim), kv_lora_rank", kvb_block, &kv_b);
    if (st == CLMLA_SUCCESS)
        st = load_tensor_block(l, prefix, "o_proj.weight", D, H * dv, "hidden_size, num_attention_heads x v_head_dim",
                               o_block, &o);
    /* "attention_bias": true (q_proj, q_b_proj and kv_b_proj have none). */
    if (st == CLMLA_SUCCESS && bias && rq > 0)
        st = load_tensor(l, prefix, "q_a_proj.bias", rq, 0, "q_lora_rank, attention_bias", &q_a_bias);
    if (st == CLMLA_SUCCESS && bias)
        st = load_tensor(l, prefix, "kv_a_proj_with_mqa.bias", rkv + dr, 0, "kv_lora_rank + qk_rope_head_dim, attention_bias",
                         &kv_a_bias);
    if (st == CLMLA_SUCCESS && bias)
        st = load_tensor(l, prefix, "o_proj.bias", D, 0, "hidden_size, attention_bias", &o_bias);
    /* the sparse-attention indexer (DeepSeek-V3.2, GLM-5): whole on every tensor-parallel rank */
    const int64_t HI = c.index_n_heads, dI = c.index_head_dim;
    if (st == CLMLA_SUCCESS && HI > 0)
        st = load_tensor(l, prefix, "indexer.wq_b.weight", HI * dI, rq, "index_n_heads x index_head_dim, q_lora_rank", &iq);
    if (st == CLMLA_SUCCESS && HI > 0)
        st = load_tensor(l, prefix, "indexer.wk.weight", dI, D, "index_head_dim, hidden_size", &ik);
    if (st == CLMLA_SUCCESS && HI > 0)
        st = load_tensor(l, prefix, "indexer.k_norm.weight", dI, 0, "index_head_dim", &inorm);
    if (st == CLMLA_SUCCESS && HI > 0)
        st = load_tensor(l, prefix, "indexer.k_norm.bias", dI, 0, "index_head_dim", &inorm_b);
    if (st == CLMLA_SUCCESS && HI > 0)
        st = load_tensor(l, prefix, "indexer.weights_proj.weight", HI, D, "index_n_heads, hidden_size", &iw);
    if (st != CLMLA_SUCCESS)
        clmla_fail(ctx, st, "%s", l->err);
    loader_free(l);
    free(l);

    if (st == CLMLA_SUCCESS) {
        /* Absent tensors (the other query form, no biases) stay zeroed: data NULL. */
        clmla_layer_weights w = {.q_proj = q.t, .q_a_proj = q_a.t, .q_a_layernorm = q_a_norm.t, .q_b_proj = q_b.t,
                                 .kv_a_proj_with_mqa = kv_a.t, .kv_a_layernorm = kv_norm.t, .kv_b_proj = kv_b.t,
                                 .o_proj = o.t, .q_a_proj_bias = q_a_bias.t, .kv_a_proj_with_mqa_bias = kv_a_bias.t,
                                 .o_proj_bias = o_bias.t, .indexer_wq_b = iq.t, .indexer_wk = ik.t,
                                 .indexer_k_norm = inorm.t, .indexer_k_norm_bias = inorm_b.t,
                                 .indexer_weights_proj = iw.t};
        st = clmla_layer_create(ctx, &c, &w, layer);
    }
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        host_tensor_free(all[i]);
    return st;
}
