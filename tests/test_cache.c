/* The paged latent KV cache on its own: sizes, appends from device buffers (strides, offsets,
   chunks that end mid-block) read back exactly (f32) or to half precision (f16), the documented
   layout of the layer buffer, CLMLA_ERROR_CACHE_FULL changing nothing, seq_reserve, freeing and
   reusing blocks and ids, exact block accounting under many random adds/appends/frees, unknown
   sequences and bad arguments. Every expectation comes from a host-side model of what was
   appended, never from the cache itself. */
#include "check.h"
#include "clmla.h"
#include "test_util.h"
#include "tolerance.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_LAYERS = 4, MAX_SEQS = 16 };

static clmla_context *ctx;

/* ---- a host model of the cache -------------------------------------------------------------- */

typedef struct seq_model {
    int live;
    int32_t id;
    int owned_blocks;       /* blocks the cache must own for it: ceil(max length / bt), or reserved */
    int len[MAX_LAYERS];
    float *ckv[MAX_LAYERS]; /* [len, rkv] every c^KV row appended, in order */
    float *kr[MAX_LAYERS];  /* [len, dr] */
} seq_model;

typedef struct cache_model {
    clmla_cache *cache;
    clmla_cache_config cfg;
    int layers, bt;
    int used_blocks;
    seq_model seqs[MAX_SEQS];
    tu_rng rng;
    const char *name;
} cache_model;

static size_t elem_size(clmla_cache_dtype dtype)
{
    return dtype == CLMLA_CACHE_F16 ? 2 : 4;
}

static int cm_create(cache_model *m, const char *name, int layers, int rkv, int dr, int bt, int num_blocks,
                     clmla_cache_dtype dtype, uint64_t seed)
{
    memset(m, 0, sizeof(*m));
    m->name = name;
    m->cfg.num_layers = layers;
    m->cfg.kv_lora_rank = rkv;
    m->cfg.rope_dim = dr;
    m->cfg.block_tokens = bt;
    m->cfg.num_blocks = num_blocks;
    m->cfg.dtype = dtype;
    m->layers = layers;
    m->bt = bt;
    m->rng = tu_rng_seed(seed);
    clmla_status st = clmla_cache_create(ctx, &m->cfg, &m->cache);
    CHECK(st == CLMLA_SUCCESS && m->cache, "%s: cache_create: %s: %s", name, clmla_status_string(st),
          clmla_last_error(ctx));
    return st == CLMLA_SUCCESS && m->cache ? 0 : -1;
}

static void cm_destroy(cache_model *m)
{
    clmla_cache_destroy(m->cache);
    for (int s = 0; s < MAX_SEQS; s++)
        for (int l = 0; l < MAX_LAYERS; l++) {
            free(m->seqs[s].ckv[l]);
            free(m->seqs[s].kr[l]);
        }
    memset(m, 0, sizeof(*m));
}

static int blocks_for(int tokens, int bt)
{
    return (tokens + bt - 1) / bt;
}

/* Adds a sequence; returns its slot in the model or -1. */
static int cm_add(cache_model *m)
{
    int slot = -1;
    for (int s = 0; s < MAX_SEQS && slot < 0; s++)
        if (!m->seqs[s].live)
            slot = s;
    if (slot < 0)
        return -1;
    int32_t id = -7;
    clmla_status st = clmla_cache_seq_add(m->cache, &id);
    CHECK(st == CLMLA_SUCCESS && id >= 0, "%s: seq_add: %s, id %d", m->name, clmla_status_string(st), (int)id);
    if (st != CLMLA_SUCCESS)
        return -1;
    for (int s = 0; s < MAX_SEQS; s++)
        CHECK(!m->seqs[s].live || m->seqs[s].id != id, "%s: seq_add gave id %d, already live", m->name, (int)id);
    seq_model *q = &m->seqs[slot];
    for (int l = 0; l < MAX_LAYERS; l++) {
        free(q->ckv[l]);
        free(q->kr[l]);
    }
    memset(q, 0, sizeof(*q));
    q->live = 1;
    q->id = id;
    return slot;
}

/* Appends n tokens from host arrays through device buffers with padded rows and offsets. */
static clmla_status append_host(clmla_cache *cache, int layer, int32_t id, int n, const float *ckv /* [n, rkv] */,
                                const float *kr /* [n, dr] */, int rkv, int dr, int use_event)
{
    const int ckv_stride = rkv + 3, kr_stride = dr + 1;
    const size_t ckv_off = 5, kr_off = 2;
    size_t ckv_n = ckv_off + (size_t)(n > 0 ? n : 1) * ckv_stride, kr_n = kr_off + (size_t)(n > 0 ? n : 1) * kr_stride;
    float *a = calloc(ckv_n, sizeof(float)), *b = calloc(kr_n, sizeof(float));
    for (size_t i = 0; i < ckv_n; i++)
        a[i] = 999.0f; /* padding that must not reach the cache */
    for (size_t i = 0; i < kr_n; i++)
        b[i] = -999.0f;
    for (int t = 0; t < n; t++) {
        memcpy(a + ckv_off + (size_t)t * ckv_stride, ckv + (size_t)t * rkv, (size_t)rkv * sizeof(float));
        memcpy(b + kr_off + (size_t)t * kr_stride, kr + (size_t)t * dr, (size_t)dr * sizeof(float));
    }
    cl_int err;
    cl_context c = clmla_context_cl_context(ctx);
    cl_mem abuf = clCreateBuffer(c, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, ckv_n * sizeof(float), a, &err);
    cl_mem bbuf = clCreateBuffer(c, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, kr_n * sizeof(float), b, &err);
    cl_event ev = NULL;
    clmla_status st = clmla_cache_append_cl(cache, layer, id, n, abuf, ckv_off, ckv_stride, bbuf, kr_off, kr_stride,
                                            use_event ? &ev : NULL);
    if (use_event && st == CLMLA_SUCCESS) {
        CHECK(ev != NULL, "append_cl returned no event");
        if (ev) {
            CHECK(clWaitForEvents(1, &ev) == CL_SUCCESS, "wait for the append event");
            clReleaseEvent(ev);
        }
    }
    clFinish(clmla_context_queue(ctx));
    clReleaseMemObject(abuf);
    clReleaseMemObject(bbuf);
    free(a);
    free(b);
    return st;
}

/* Random c^KV / k^R rows: mostly uniform in +-4, with a few values that stress half precision. */
static void random_rows(float *a, size_t n, tu_rng *rng)
{
    tu_fill_uniform(a, n, 0.0f, 4.0f, rng);
    for (size_t i = 0; i < n; i++) {
        int r = tu_rng_below(rng, 64);
        if (r == 0)
            a[i] = 60000.0f * tu_rng_uniform(rng); /* near the top of the half range */
        else if (r == 1)
            a[i] = 1e-5f * tu_rng_uniform(rng);    /* half subnormal */
        else if (r == 2)
            a[i] = 0.0f;
    }
}

/* What the model predicts, then the call, then the model update. */
static clmla_status cm_append(cache_model *m, int slot, int layer, int n)
{
    seq_model *q = &m->seqs[slot];
    const int rkv = m->cfg.kv_lora_rank, dr = m->cfg.rope_dim;
    float *ckv = malloc((size_t)n * rkv * sizeof(float)), *kr = malloc((size_t)n * dr * sizeof(float));
    random_rows(ckv, (size_t)n * rkv, &m->rng);
    random_rows(kr, (size_t)n * dr, &m->rng);

    int need = blocks_for(q->len[layer] + n, m->bt);
    int extra = need > q->owned_blocks ? need - q->owned_blocks : 0;
    clmla_status want = extra > m->cfg.num_blocks - m->used_blocks ? CLMLA_ERROR_CACHE_FULL : CLMLA_SUCCESS;
    clmla_status st = append_host(m->cache, layer, q->id, n, ckv, kr, rkv, dr, tu_rng_below(&m->rng, 4) == 0);
    CHECK(st == want, "%s: append %d tokens to seq %d layer %d (length %d, owns %d, %d of %d blocks used): %s, "
          "expected %s: %s", m->name, n, (int)q->id, layer, q->len[layer], q->owned_blocks, m->used_blocks,
          m->cfg.num_blocks, clmla_status_string(st), clmla_status_string(want), clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS) {
        q->ckv[layer] = realloc(q->ckv[layer], (size_t)(q->len[layer] + n) * rkv * sizeof(float));
        q->kr[layer] = realloc(q->kr[layer], (size_t)(q->len[layer] + n) * dr * sizeof(float) + 1);
        memcpy(q->ckv[layer] + (size_t)q->len[layer] * rkv, ckv, (size_t)n * rkv * sizeof(float));
        memcpy(q->kr[layer] + (size_t)q->len[layer] * dr, kr, (size_t)n * dr * sizeof(float));
        q->len[layer] += n;
        m->used_blocks += extra;
        q->owned_blocks += extra;
    }
    free(ckv);
    free(kr);
    return st;
}

static clmla_status cm_reserve(cache_model *m, int slot, int tokens)
{
    seq_model *q = &m->seqs[slot];
    int need = blocks_for(tokens, m->bt);
    int extra = need > q->owned_blocks ? need - q->owned_blocks : 0;
    clmla_status want = extra > m->cfg.num_blocks - m->used_blocks ? CLMLA_ERROR_CACHE_FULL : CLMLA_SUCCESS;
    clmla_status st = clmla_cache_seq_reserve(m->cache, q->id, tokens);
    CHECK(st == want, "%s: reserve %d tokens for seq %d (owns %d, %d of %d used): %s, expected %s", m->name, tokens,
          (int)q->id, q->owned_blocks, m->used_blocks, m->cfg.num_blocks, clmla_status_string(st),
          clmla_status_string(want));
    if (st == CLMLA_SUCCESS) {
        q->owned_blocks += extra;
        m->used_blocks += extra;
    }
    return st;
}

static void cm_free(cache_model *m, int slot)
{
    seq_model *q = &m->seqs[slot];
    CHECK_STATUS(clmla_cache_seq_free(m->cache, q->id), CLMLA_SUCCESS, ctx);
    m->used_blocks -= q->owned_blocks;
    q->live = 0;
}

/* Compares read-back rows with what was appended: exact for f32, to half precision for f16.
   Returns the number of mismatches and reports the first. */
static int compare_rows(const cache_model *m, const float *got, const float *want, size_t n, const char *what,
                        int32_t id, int layer, int cols, int first_token)
{
    int bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < n; i++) {
        double w = want[i], g = got[i];
        int ok = m->cfg.dtype == CLMLA_CACHE_F16 ? fabs(g - w) <= TOL_F16_ELEMENT_REL * fabs(w) + TOL_F16_ELEMENT_ABS
                                                 : g == w;
        if (!ok && bad++ == 0)
            first = i;
    }
    CHECK(bad == 0, "%s: seq %d layer %d %s: %d of %zu values differ, first token %d [%d]: got %.9g, want %.9g",
          m->name, (int)id, layer, what, bad, n, first_token + (int)(first / (size_t)cols), (int)(first % (size_t)cols),
          bad ? (double)got[first] : 0.0, bad ? (double)want[first] : 0.0);
    return bad;
}

/* Reads tokens [start, start+n) of one sequence and layer and compares with the model. */
static void cm_check_range(const cache_model *m, int slot, int layer, int start, int n)
{
    const seq_model *q = &m->seqs[slot];
    const int rkv = m->cfg.kv_lora_rank, dr = m->cfg.rope_dim;
    float *ckv = malloc(((size_t)n * rkv + 1) * sizeof(float)), *kr = malloc(((size_t)n * dr + 1) * sizeof(float));
    clmla_status st = clmla_cache_read(m->cache, layer, q->id, start, n, ckv, kr);
    CHECK(st == CLMLA_SUCCESS, "%s: read seq %d layer %d [%d, %d): %s: %s", m->name, (int)q->id, layer, start,
          start + n, clmla_status_string(st), clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS) {
        compare_rows(m, ckv, q->ckv[layer] + (size_t)start * rkv, (size_t)n * rkv, "c_kv", q->id, layer, rkv, start);
        compare_rows(m, kr, q->kr[layer] + (size_t)start * dr, (size_t)n * dr, "k_rope", q->id, layer, dr, start);
    }
    free(ckv);
    free(kr);
}

/* Everything observable against the model: info, lengths, contents, block tables. */
static void cm_verify(const cache_model *m)
{
    clmla_cache_info info;
    memset(&info, 0, sizeof(info));
    CHECK_STATUS(clmla_cache_get_info(m->cache, &info), CLMLA_SUCCESS, ctx);
    int live = 0;
    for (int s = 0; s < MAX_SEQS; s++)
        live += m->seqs[s].live;
    CHECK(info.blocks_total == m->cfg.num_blocks && info.blocks_used == m->used_blocks &&
              info.blocks_free == m->cfg.num_blocks - m->used_blocks && info.sequences == live,
          "%s: info total %d used %d free %d sequences %d, expected %d / %d / %d / %d", m->name, info.blocks_total,
          info.blocks_used, info.blocks_free, info.sequences, m->cfg.num_blocks, m->used_blocks,
          m->cfg.num_blocks - m->used_blocks, live);

    char *owner = calloc((size_t)m->cfg.num_blocks, 1);
    int32_t *blocks = malloc(((size_t)m->cfg.num_blocks + 1) * sizeof(int32_t));
    for (int s = 0; s < MAX_SEQS; s++) {
        const seq_model *q = &m->seqs[s];
        if (!q->live)
            continue;
        for (int l = 0; l < m->layers; l++) {
            int len = -1;
            CHECK_STATUS(clmla_cache_seq_length(m->cache, q->id, l, &len), CLMLA_SUCCESS, ctx);
            CHECK(len == q->len[l], "%s: seq %d layer %d length %d, expected %d", m->name, (int)q->id, l, len, q->len[l]);
            if (len == q->len[l] && len > 0)
                cm_check_range(m, s, l, 0, len);
        }
        int nb = -1;
        CHECK_STATUS(clmla_cache_seq_blocks(m->cache, q->id, blocks, m->cfg.num_blocks, &nb), CLMLA_SUCCESS, ctx);
        CHECK(nb == q->owned_blocks, "%s: seq %d owns %d blocks, expected %d", m->name, (int)q->id, nb, q->owned_blocks);
        for (int b = 0; b < nb && b < m->cfg.num_blocks; b++) {
            int id = blocks[b];
            CHECK(id >= 0 && id < m->cfg.num_blocks, "%s: seq %d block %d has id %d", m->name, (int)q->id, b, id);
            if (id >= 0 && id < m->cfg.num_blocks) {
                CHECK(!owner[id], "%s: block %d owned twice (seq %d)", m->name, id, (int)q->id);
                owner[id] = 1;
            }
        }
    }
    free(owner);
    free(blocks);
}

/* The layer buffer holds row b*bt + i = token i of block b, [c_kv | k_rope], in the cache dtype. */
static void cm_check_layer_buffer(const cache_model *m, int slot, int layer)
{
    const seq_model *q = &m->seqs[slot];
    const int rkv = m->cfg.kv_lora_rank, dr = m->cfg.rope_dim, row = rkv + dr;
    cl_mem buf = clmla_cache_layer_buffer(m->cache, layer);
    CHECK(buf != NULL, "%s: layer %d buffer", m->name, layer);
    if (!buf)
        return;
    size_t want_size = (size_t)m->cfg.num_blocks * m->bt * row * elem_size(m->cfg.dtype), size = 0;
    clGetMemObjectInfo(buf, CL_MEM_SIZE, sizeof(size), &size, NULL);
    CHECK(size >= want_size, "%s: layer buffer %zu bytes, expected at least %zu", m->name, size, want_size);
    if (size < want_size)
        return;
    unsigned char *raw = malloc(want_size);
    cl_int err = clEnqueueReadBuffer(clmla_context_queue(ctx), buf, CL_TRUE, 0, want_size, raw, 0, NULL, NULL);
    CHECK(err == CL_SUCCESS, "read layer buffer: %d", err);
    int32_t blocks[256];
    int nb = 0;
    clmla_cache_seq_blocks(m->cache, q->id, blocks, 256, &nb);
    int bad = 0;
    for (int t = 0; t < q->len[layer] && err == CL_SUCCESS && blocks_for(t + 1, m->bt) <= nb; t++) {
        size_t r = (size_t)blocks[t / m->bt] * m->bt + (size_t)(t % m->bt);
        for (int d = 0; d < row; d++) {
            float got;
            if (m->cfg.dtype == CLMLA_CACHE_F16) {
                uint16_t h;
                memcpy(&h, raw + (r * row + d) * 2, 2);
                got = tu_half_to_float(h);
            } else {
                memcpy(&got, raw + (r * row + d) * 4, 4);
            }
            double want = d < rkv ? q->ckv[layer][(size_t)t * rkv + d] : q->kr[layer][(size_t)t * dr + d - rkv];
            int ok = m->cfg.dtype == CLMLA_CACHE_F16
                         ? fabs(got - want) <= TOL_F16_ELEMENT_REL * fabs(want) + TOL_F16_ELEMENT_ABS
                         : got == want;
            if (!ok && bad++ == 0)
                CHECK(0, "%s: layer buffer row %zu (seq %d token %d) [%d] = %.9g, expected %.9g", m->name, r,
                      (int)q->id, t, d, got, want);
        }
    }
    free(raw);
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_create_and_info(void)
{
    for (int dt = 0; dt < 2; dt++) {
        clmla_cache_config cfg = {3, 40, 8, 16, 10, (clmla_cache_dtype)dt};
        clmla_cache *cache = NULL;
        CHECK_STATUS(clmla_cache_create(ctx, &cfg, &cache), CLMLA_SUCCESS, ctx);
        if (!cache)
            continue;
        clmla_cache_info info;
        memset(&info, 0xFF, sizeof(info));
        CHECK_STATUS(clmla_cache_get_info(cache, &info), CLMLA_SUCCESS, ctx);
        size_t es = elem_size(cfg.dtype);
        CHECK(info.bytes_per_token_per_layer == 48 * es, "dtype %d: bytes per token %zu", dt,
              info.bytes_per_token_per_layer);
        CHECK(info.bytes_per_block == 48 * es * 16, "dtype %d: bytes per block %zu", dt, info.bytes_per_block);
        CHECK(info.bytes_total == 48 * es * 16 * 10 * 3, "dtype %d: bytes total %zu, expected %zu", dt,
              info.bytes_total, 48 * es * 16 * 10 * 3);
        CHECK(info.block_tokens == 16 && info.blocks_total == 10 && info.blocks_used == 0 && info.blocks_free == 10 &&
                  info.sequences == 0,
              "dtype %d: bt %d total %d used %d free %d seqs %d", dt, info.block_tokens, info.blocks_total,
              info.blocks_used, info.blocks_free, info.sequences);
        for (int l = 0; l < 3; l++)
            CHECK(clmla_cache_layer_buffer(cache, l) != NULL, "layer %d buffer", l);
        CHECK(clmla_cache_layer_buffer(cache, 3) == NULL, "layer 3 of 3 has no buffer");
        CHECK(clmla_cache_layer_buffer(cache, -1) == NULL, "layer -1 has no buffer");
        clmla_cache_destroy(cache);
    }

    /* Zero means default: 1 layer, 64 tokens per block. */
    clmla_cache_config def = {0, 512, 64, 0, 3, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    CHECK_STATUS(clmla_cache_create(ctx, &def, &cache), CLMLA_SUCCESS, ctx);
    if (cache) {
        clmla_cache_info info;
        clmla_cache_get_info(cache, &info);
        CHECK(info.block_tokens == 64 && info.bytes_per_token_per_layer == 576 * 4 &&
                  info.bytes_total == (size_t)576 * 4 * 64 * 3,
              "defaults: bt %d, bytes/token %zu, total %zu", info.block_tokens, info.bytes_per_token_per_layer,
              info.bytes_total);
        CHECK(clmla_cache_layer_buffer(cache, 0) != NULL && clmla_cache_layer_buffer(cache, 1) == NULL,
              "default num_layers is 1");
        int32_t id;
        clmla_cache_seq_add(cache, &id);
        int len = -1;
        CHECK_STATUS(clmla_cache_seq_length(cache, id, 1, &len), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    }
    clmla_cache_destroy(cache);
    clmla_cache_destroy(NULL);

    /* Bad configurations: the status, and no cache. */
    struct {
        clmla_cache_config cfg;
        const char *what;
    } bad[] = {
        {{1, 0, 8, 16, 4, CLMLA_CACHE_F32}, "kv_lora_rank 0"},
        {{1, -40, 8, 16, 4, CLMLA_CACHE_F32}, "kv_lora_rank -40"},
        {{1, 40, -8, 16, 4, CLMLA_CACHE_F32}, "rope_dim -8"},
        {{1, 40, 8, -16, 4, CLMLA_CACHE_F32}, "block_tokens -16"},
        {{1, 40, 8, 16, 0, CLMLA_CACHE_F32}, "num_blocks 0"},
        {{1, 40, 8, 16, -4, CLMLA_CACHE_F32}, "num_blocks -4"},
        {{-1, 40, 8, 16, 4, CLMLA_CACHE_F32}, "num_layers -1"},
        {{1, 40, 8, 16, 4, (clmla_cache_dtype)7}, "dtype 7"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cache = NULL;
        CHECK_STATUS(clmla_cache_create(ctx, &bad[i].cfg, &cache), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(cache == NULL, "%s: cache made anyway", bad[i].what);
        clmla_cache_destroy(cache);
    }
    /* Sizes whose product overflows: refused one way or another, never made. */
    clmla_cache_config huge = {1 << 20, 1 << 20, 64, 1 << 20, INT_MAX, CLMLA_CACHE_F32};
    cache = NULL;
    clmla_status st = clmla_cache_create(ctx, &huge, &cache);
    CHECK(st != CLMLA_SUCCESS && cache == NULL, "an overflowing pool was made (%s)", clmla_status_string(st));
    clmla_cache_destroy(cache);

    clmla_cache_config ok = {1, 40, 8, 16, 4, CLMLA_CACHE_F32};
    cache = NULL;
    CHECK_STATUS(clmla_cache_create(NULL, &ok, &cache), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_cache_create(ctx, NULL, &cache), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_cache_create(ctx, &ok, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(cache == NULL, "cache made with a NULL argument");
}

/* Chunks of 7, 13, 23 and others, two layers, both dtypes; full and partial reads; the layer
   buffer's layout; block tables. */
static void test_append_read(void)
{
    for (int dt = 0; dt < 2; dt++) {
        cache_model m;
        if (cm_create(&m, dt ? "append f16" : "append f32", 2, 40, 8, 16, 12, (clmla_cache_dtype)dt, 11 + dt))
            continue;
        int a = cm_add(&m);
        int b = cm_add(&m);
        CHECK(a >= 0 && b >= 0, "two sequences");
        if (a < 0 || b < 0) {
            cm_destroy(&m);
            continue;
        }
        CHECK(m.seqs[a].id != m.seqs[b].id, "distinct ids");
        cm_verify(&m);
        static const int chunks0[] = {7, 13, 23, 1, 16}; /* 60 tokens: 4 blocks, the last partly */
        static const int chunks1[] = {5, 16, 1};         /* 22 tokens in layer 1 */
        for (int i = 0; i < 5; i++) {
            cm_append(&m, a, 0, chunks0[i]);
            if (i < 3)
                cm_append(&m, a, 1, chunks1[i]);
            cm_append(&m, b, i & 1, 3 + 2 * i); /* interleaved: a's and b's blocks alternate */
        }
        cm_verify(&m);
        /* A sequence owns blocks for its longest layer: filling layer 1 up to layer 0's length
           takes no block. */
        int used = m.used_blocks;
        cm_append(&m, a, 1, 60 - 22);
        CHECK(m.used_blocks == used, "layer 1 up to layer 0's length took blocks");
        cm_verify(&m);

        /* Partial reads: crossing blocks, a single token, the last token, one layer. */
        cm_check_range(&m, a, 0, 10, 20);
        cm_check_range(&m, a, 0, 59, 1);
        cm_check_range(&m, a, 0, 16, 16);
        cm_check_range(&m, a, 1, 21, 30);
        cm_check_range(&m, b, 0, 0, 1);
        /* Only one of the two outputs. */
        float kr[8 * 5], ckv[40 * 5];
        CHECK_STATUS(clmla_cache_read(m.cache, 0, m.seqs[a].id, 30, 5, NULL, kr), CLMLA_SUCCESS, ctx);
        compare_rows(&m, kr, m.seqs[a].kr[0] + 30 * 8, 40, "k_rope only", m.seqs[a].id, 0, 8, 30);
        CHECK_STATUS(clmla_cache_read(m.cache, 0, m.seqs[a].id, 30, 5, ckv, NULL), CLMLA_SUCCESS, ctx);
        compare_rows(&m, ckv, m.seqs[a].ckv[0] + 30 * 40, 200, "c_kv only", m.seqs[a].id, 0, 40, 30);

        cm_check_layer_buffer(&m, a, 0);
        cm_check_layer_buffer(&m, a, 1);
        cm_check_layer_buffer(&m, b, 1);

        /* seq_blocks writes at most max_blocks and still counts them all. */
        int32_t blocks[8] = {-5, -5, -5, -5, -5, -5, -5, -5};
        int nb = -1;
        CHECK_STATUS(clmla_cache_seq_blocks(m.cache, m.seqs[a].id, blocks, 2, &nb), CLMLA_SUCCESS, ctx);
        CHECK(nb == 4 && blocks[0] >= 0 && blocks[1] >= 0 && blocks[2] == -5, "seq_blocks(max 2): %d blocks, [%d %d %d]",
              nb, blocks[0], blocks[1], blocks[2]);
        cm_destroy(&m);
    }
}

/* CLMLA_ERROR_CACHE_FULL from appends and reserves changes nothing; an append that fits exactly
   succeeds; reserved blocks are not taken again. */
static void test_cache_full(void)
{
    for (int dt = 0; dt < 2; dt++) {
        cache_model m;
        if (cm_create(&m, dt ? "full f16" : "full f32", 1, 40, 8, 16, 6, (clmla_cache_dtype)dt, 21 + dt))
            continue;
        int a = cm_add(&m), b = cm_add(&m);
        cm_append(&m, a, 0, 40); /* 3 blocks */
        cm_append(&m, b, 0, 30); /* 2 blocks, 1 free */
        cm_verify(&m);
        CHECK(cm_append(&m, b, 0, 20) == CLMLA_ERROR_CACHE_FULL, "50 tokens need 4 blocks, 3 available");
        cm_verify(&m);
        CHECK(cm_append(&m, a, 0, 100) == CLMLA_ERROR_CACHE_FULL, "140 tokens");
        cm_verify(&m);
        CHECK(cm_append(&m, b, 0, 2) == CLMLA_SUCCESS, "32 tokens fit b's 2 blocks exactly");
        CHECK(cm_append(&m, b, 0, 16) == CLMLA_SUCCESS, "the last free block");
        cm_verify(&m);
        int c = cm_add(&m);
        CHECK(c >= 0, "a sequence can be added to a full pool");
        CHECK(cm_append(&m, c, 0, 1) == CLMLA_ERROR_CACHE_FULL, "no block for c");
        CHECK(cm_append(&m, a, 0, 8) == CLMLA_SUCCESS, "a's third block has room for 8");
        CHECK(cm_append(&m, a, 0, 1) == CLMLA_ERROR_CACHE_FULL, "a's blocks are full");
        CHECK(cm_reserve(&m, a, 1000) == CLMLA_ERROR_CACHE_FULL, "reserve 1000");
        CHECK(cm_reserve(&m, a, 48) == CLMLA_SUCCESS, "reserve within owned blocks");
        CHECK(cm_reserve(&m, c, 0) == CLMLA_SUCCESS, "reserve 0");
        cm_verify(&m);

        /* Freeing a returns 3 blocks; c reserves them all, then appends into them without taking more. */
        cm_free(&m, a);
        cm_verify(&m);
        CHECK(cm_reserve(&m, c, 48) == CLMLA_SUCCESS, "reserve 48 = 3 blocks");
        cm_verify(&m);
        CHECK(cm_append(&m, c, 0, 47) == CLMLA_SUCCESS, "47 tokens into reserved blocks");
        CHECK(cm_append(&m, c, 0, 1) == CLMLA_SUCCESS, "48th token");
        CHECK(cm_append(&m, c, 0, 1) == CLMLA_ERROR_CACHE_FULL, "49th token needs a 4th block");
        cm_verify(&m);
        CHECK_STATUS(clmla_cache_seq_reserve(m.cache, m.seqs[c].id, -1), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        cm_verify(&m);
        cm_destroy(&m);
    }
}

/* Freed blocks and ids are reused; the reused blocks hold the new sequence's data. */
static void test_free_reuse(void)
{
    cache_model m;
    if (cm_create(&m, "reuse", 2, 24, 6, 8, 9, CLMLA_CACHE_F32, 31))
        return;
    int s0 = cm_add(&m), s1 = cm_add(&m), s2 = cm_add(&m);
    int32_t id0 = m.seqs[s0].id, id1 = m.seqs[s1].id, id2 = m.seqs[s2].id;
    CHECK(id0 >= 0 && id0 < 3 && id1 >= 0 && id1 < 3 && id2 >= 0 && id2 < 3, "first ids %d %d %d are small", (int)id0,
          (int)id1, (int)id2);
    cm_append(&m, s0, 0, 20);
    cm_append(&m, s1, 0, 24);
    cm_append(&m, s1, 1, 3);
    cm_append(&m, s2, 1, 19);
    cm_verify(&m);
    CHECK(m.used_blocks == 9, "pool is full (%d)", m.used_blocks);
    cm_free(&m, s1);
    cm_verify(&m);
    /* Every operation on the freed id now fails with UNKNOWN_SEQUENCE. */
    int len;
    CHECK_STATUS(clmla_cache_seq_length(m.cache, id1, 0, &len), CLMLA_ERROR_UNKNOWN_SEQUENCE, ctx);
    CHECK_STATUS(clmla_cache_seq_free(m.cache, id1), CLMLA_ERROR_UNKNOWN_SEQUENCE, ctx);
    cm_verify(&m);

    int s3 = cm_add(&m);
    CHECK(s3 >= 0 && m.seqs[s3].id == id1, "the freed id %d is reused, got %d", (int)id1, s3 >= 0 ? (int)m.seqs[s3].id : -1);
    cm_append(&m, s3, 1, 7);
    cm_append(&m, s3, 0, 17);
    CHECK(cm_append(&m, s3, 0, 8) == CLMLA_ERROR_CACHE_FULL, "pool full again (25 tokens need a 4th block)");
    cm_verify(&m);
    for (int l = 0; l < 2; l++)
        cm_check_layer_buffer(&m, s3, l);

    /* Free everything: every block returns; a fresh sequence gets the whole pool. */
    cm_free(&m, s0);
    cm_free(&m, s2);
    cm_free(&m, s3);
    cm_verify(&m);
    int s4 = cm_add(&m);
    CHECK(cm_append(&m, s4, 1, 72) == CLMLA_SUCCESS, "the whole pool for one sequence");
    cm_verify(&m);
    cm_destroy(&m);
}

/* Random adds, appends, reserves and frees against the model, with exact block accounting. */
static void test_many_sequences(void)
{
    for (int dt = 0; dt < 2; dt++) {
        cache_model m;
        if (cm_create(&m, dt ? "random f16" : "random f32", 2, 20, 4, 8, 40, (clmla_cache_dtype)dt, 41 + dt))
            continue;
        int full = 0, frees = 0, adds = 0;
        for (int step = 0; step < 400; step++) {
            int live[MAX_SEQS], nlive = 0;
            for (int s = 0; s < MAX_SEQS; s++)
                if (m.seqs[s].live)
                    live[nlive++] = s;
            int op = tu_rng_below(&m.rng, 10);
            if (nlive == 0 || (op == 0 && nlive < MAX_SEQS)) {
                adds += cm_add(&m) >= 0;
            } else if (op == 1) {
                cm_free(&m, live[tu_rng_below(&m.rng, nlive)]);
                frees++;
            } else if (op == 2) {
                int s = live[tu_rng_below(&m.rng, nlive)];
                int len = m.seqs[s].len[0] > m.seqs[s].len[1] ? m.seqs[s].len[0] : m.seqs[s].len[1];
                full += cm_reserve(&m, s, len + tu_rng_below(&m.rng, 40)) == CLMLA_ERROR_CACHE_FULL;
            } else {
                int s = live[tu_rng_below(&m.rng, nlive)];
                full += cm_append(&m, s, tu_rng_below(&m.rng, 2), 1 + tu_rng_below(&m.rng, 20)) ==
                        CLMLA_ERROR_CACHE_FULL;
            }
            if (step % 40 == 39 || check_failed)
                cm_verify(&m);
            if (check_failed > 20)
                break;
        }
        cm_verify(&m);
        /* The walk must have reached the interesting states. */
        CHECK(full > 0 && frees > 5 && adds > 5, "%s: the random walk hit %d full, %d frees, %d adds", m.name, full,
              frees, adds);
        cm_destroy(&m);
    }
}

/* Unknown ids and bad arguments: the documented status, and nothing changes. */
static void test_bad_arguments(void)
{
    cache_model m;
    if (cm_create(&m, "bad args", 2, 16, 4, 4, 8, CLMLA_CACHE_F32, 51))
        return;
    int s = cm_add(&m), f = cm_add(&m);
    cm_append(&m, s, 0, 6);
    cm_append(&m, s, 1, 2);
    int32_t id = m.seqs[s].id, freed = m.seqs[f].id;
    cm_free(&m, f);
    cm_verify(&m);

    float ckv[16 * 8], kr[4 * 8];
    cl_int err;
    cl_mem buf = clCreateBuffer(clmla_context_cl_context(ctx), CL_MEM_READ_WRITE, 4096, NULL, &err);
    int32_t blocks[8];
    int n = 0, len = 0;
    const int32_t unknown[] = {freed, 99, -1, INT32_MAX};
    for (int u = 0; u < 4; u++) {
        int32_t x = unknown[u];
        CHECK_STATUS(clmla_cache_seq_free(m.cache, x), CLMLA_ERROR_UNKNOWN_SEQUENCE, ctx);
        CHECK_STATUS(clmla_cache_seq_reserve(m.cache, x, 4), CLMLA_ERROR_UNKNOWN_SEQUENCE, ctx);
        CHECK_STATUS(clmla_cache_seq_length(m.cache, x, 0, &len), CLMLA_ERROR_UNKNOWN_SEQUENCE, ctx);
        CHECK_STATUS(clmla_cache_seq_blocks(m.cache, x, blocks, 8, &n), CLMLA_ERROR_UNKNOWN_SEQUENCE, ctx);
        CHECK_STATUS(clmla_cache_append_cl(m.cache, 0, x, 1, buf, 0, 16, buf, 0, 4, NULL), CLMLA_ERROR_UNKNOWN_SEQUENCE,
                     ctx);
        CHECK_STATUS(clmla_cache_read(m.cache, 0, x, 0, 1, ckv, kr), CLMLA_ERROR_UNKNOWN_SEQUENCE, ctx);
    }
    cm_verify(&m);

    /* Layers out of range, reads past the end, negative counts, short strides, NULL pointers. */
    CHECK_STATUS(clmla_cache_seq_length(m.cache, id, 2, &len), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_cache_seq_length(m.cache, id, -1, &len), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_cache_read(m.cache, 2, id, 0, 1, ckv, kr), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_cache_read(m.cache, 0, id, 0, 7, ckv, kr), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_cache_read(m.cache, 0, id, 5, 2, ckv, kr), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_cache_read(m.cache, 1, id, 0, 3, ckv, kr), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_cache_read(m.cache, 0, id, -1, 2, ckv, kr), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_cache_read(m.cache, 0, id, 0, -2, ckv, kr), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_cache_read(NULL, 0, id, 0, 1, ckv, kr), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_cache_append_cl(m.cache, 2, id, 1, buf, 0, 16, buf, 0, 4, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
                 ctx);
    CHECK_STATUS(clmla_cache_append_cl(m.cache, 0, id, -1, buf, 0, 16, buf, 0, 4, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
                 ctx);
    CHECK_STATUS(clmla_cache_append_cl(m.cache, 0, id, 1, NULL, 0, 16, buf, 0, 4, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
                 ctx);
    CHECK_STATUS(clmla_cache_append_cl(m.cache, 0, id, 1, buf, 0, 16, NULL, 0, 4, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
                 ctx);
    CHECK_STATUS(clmla_cache_append_cl(m.cache, 0, id, 2, buf, 0, 15, buf, 0, 4, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
                 ctx);
    CHECK_STATUS(clmla_cache_append_cl(m.cache, 0, id, 2, buf, 0, 16, buf, 0, 3, NULL), CLMLA_ERROR_INVALID_ARGUMENT,
                 ctx);
    CHECK_STATUS(clmla_cache_append_cl(NULL, 0, id, 1, buf, 0, 16, buf, 0, 4, NULL), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_cache_seq_add(m.cache, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    int32_t new_id = -1;
    CHECK_STATUS(clmla_cache_seq_add(NULL, &new_id), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_cache_seq_free(NULL, id), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_cache_seq_reserve(NULL, id, 4), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_cache_seq_length(m.cache, id, 0, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK_STATUS(clmla_cache_seq_length(NULL, id, 0, &len), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_cache_seq_blocks(NULL, id, blocks, 8, &n), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_cache_get_info(m.cache, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    clmla_cache_info info;
    CHECK_STATUS(clmla_cache_get_info(NULL, &info), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK(clmla_cache_layer_buffer(NULL, 0) == NULL, "layer buffer of NULL");
    cm_verify(&m);
    clReleaseMemObject(buf);
    cm_destroy(&m);
}

int main(void)
{
    clmla_status st = clmla_context_create(NULL, &ctx);
    if (st != CLMLA_SUCCESS) {
        printf("skipped: no OpenCL device (%s: %s)\n", clmla_status_string(st), clmla_last_error(NULL));
        return 77;
    }
    static const struct {
        const char *name;
        void (*run)(void);
    } parts[] = {{"create", test_create_and_info}, {"append", test_append_read},       {"full", test_cache_full},
                 {"reuse", test_free_reuse},       {"random", test_many_sequences}, {"bad-args", test_bad_arguments}};
    for (size_t p = 0; p < sizeof(parts) / sizeof(parts[0]); p++) {
        double t0 = tu_seconds();
        parts[p].run();
        printf("# part %-10s %5.1f s\n", parts[p].name, tu_seconds() - t0);
    }
    clmla_context_destroy(ctx);
    return check_summary();
}
