/* The paged latent KV cache on its own: sizes, appends from device buffers (strides, offsets,
   chunks that end mid-block) read back exactly (f32) or to half precision (f16), the documented
   layout of the layer buffer, CLMLA_ERROR_CACHE_FULL changing nothing, seq_reserve, freeing and
   reusing blocks and ids, exact block accounting under many random adds/appends/frees, unknown
   sequences and bad arguments; truncation, forks with shared blocks and copy on write (a second
   model that also predicts which blocks are shared; the cache's internal invariants; steps of
   several sharers, their rollback and commit; CACHE_FULL; fault injection on the copies; a
   random walk; the layer forward over forks against the float64 reference). Every expectation
   comes from a host-side model of what was appended, never from the cache itself. */
#include "check.h"
#include "clmla.h"
#include "cache.h"
#include "clcall.h"
#include "mla_ref.h"
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

/* Bytes of one token's row (include/clmla.h; fp8 in FlashMLA's layout). */
static size_t row_bytes(clmla_cache_dtype dtype, int rkv, int dr)
{
    if (dtype == CLMLA_CACHE_FP8)
        return (size_t)rkv + 4 * (size_t)(rkv / 128) + 2 * (size_t)dr;
    return (size_t)(rkv + dr) * (dtype == CLMLA_CACHE_F32 ? 4 : 2);
}

/* What the cache must hold for rows of c^KV or of k^R (is_ckv), `cols` values each: the
   reference's rounding of them (ref/; fp8 scales each 128 values of a c^KV row together). */
static void stored_rows(clmla_cache_dtype dtype, int is_ckv, const float *v, size_t n, int cols, double *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = v[i];
    for (size_t r = 0; r + (size_t)cols <= n; r += (size_t)cols)
        if (is_ckv)
            mla_ref_round_cache_row((mla_ref_cache_type)dtype, out + r, cols, NULL, 0);
        else
            mla_ref_round_cache_row((mla_ref_cache_type)dtype, NULL, 0, out + r, cols);
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

/* Compares read-back rows with what was appended, rounded to the dtype by the reference: exactly.
   Returns the number of mismatches and reports the first. */
static int compare_rows_as(const char *name, clmla_cache_dtype dtype, const float *got, const float *want, size_t n,
                           const char *what, int32_t id, int layer, int cols, int first_token)
{
    int bad = 0;
    size_t first = 0;
    double *stored = malloc((n + 1) * sizeof(double));
    stored_rows(dtype, strncmp(what, "c_kv", 4) == 0, want, n, cols, stored);
    for (size_t i = 0; i < n; i++) {
        int ok = (double)got[i] == stored[i];
        if (!ok && bad++ == 0)
            first = i;
    }
    free(stored);
    CHECK(bad == 0, "%s: seq %d layer %d %s: %d of %zu values differ, first token %d [%d]: got %.9g, want %.9g",
          name, (int)id, layer, what, bad, n, first_token + (int)(first / (size_t)cols), (int)(first % (size_t)cols),
          bad ? (double)got[first] : 0.0, bad ? (double)want[first] : 0.0);
    return bad;
}

static int compare_rows(const cache_model *m, const float *got, const float *want, size_t n, const char *what,
                        int32_t id, int layer, int cols, int first_token)
{
    return compare_rows_as(m->name, m->cfg.dtype, got, want, n, what, id, layer, cols, first_token);
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
    cl_mem buf = NULL;
    CHECK_STATUS(clmla_cache_layer_buffer(m->cache, layer, &buf), CLMLA_SUCCESS, ctx);
    CHECK(buf != NULL, "%s: layer %d buffer", m->name, layer);
    if (!buf)
        return;
    const size_t rb = row_bytes(m->cfg.dtype, rkv, dr);
    size_t want_size = (size_t)m->cfg.num_blocks * m->bt * rb, size = 0;
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
    double *want_ckv = malloc((size_t)rkv * sizeof(double)), *want_kr = malloc(((size_t)dr + 1) * sizeof(double));
    for (int t = 0; t < q->len[layer] && err == CL_SUCCESS && blocks_for(t + 1, m->bt) <= nb; t++) {
        size_t r = (size_t)blocks[t / m->bt] * m->bt + (size_t)(t % m->bt);
        const unsigned char *p = raw + r * rb;
        stored_rows(m->cfg.dtype, 1, q->ckv[layer] + (size_t)t * rkv, (size_t)rkv, rkv, want_ckv);
        stored_rows(m->cfg.dtype, 0, q->kr[layer] + (size_t)t * dr, (size_t)dr, dr, want_kr);
        for (int d = 0; d < row; d++) {
            double got;
            uint16_t h;
            if (m->cfg.dtype == CLMLA_CACHE_FP8) { /* codes, a float32 scale per 128, bf16 k^R */
                float scale;
                memcpy(&scale, p + rkv + 4 * (d / 128), 4);
                if (d >= rkv)
                    memcpy(&h, p + rkv + 4 * (rkv / 128) + 2 * (d - rkv), 2);
                got = d < rkv ? mla_ref_decode_e4m3(p[d]) * scale : mla_ref_decode_bf16(h);
            } else if (m->cfg.dtype != CLMLA_CACHE_F32) {
                memcpy(&h, p + (size_t)d * 2, 2);
                got = m->cfg.dtype == CLMLA_CACHE_F16 ? mla_ref_decode_f16(h) : mla_ref_decode_bf16(h);
            } else {
                float f;
                memcpy(&f, p + (size_t)d * 4, 4);
                got = f;
            }
            double want = d < rkv ? want_ckv[d] : want_kr[d - rkv];
            int ok = got == want;
            if (!ok && bad++ == 0)
                CHECK(0, "%s: layer buffer row %zu (seq %d token %d) [%d] = %.9g, expected %.9g", m->name, r,
                      (int)q->id, t, d, got, want);
        }
    }
    free(want_ckv);
    free(want_kr);
    free(raw);
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_create_and_info(void)
{
    for (int dt = 0; dt < 3; dt++) {
        clmla_cache_config cfg = {3, 40, 8, 16, 10, (clmla_cache_dtype)dt, 0, CLMLA_CACHE_F32};
        clmla_cache *cache = NULL;
        CHECK_STATUS(clmla_cache_create(ctx, &cfg, &cache), CLMLA_SUCCESS, ctx);
        if (!cache)
            continue;
        clmla_cache_info info;
        memset(&info, 0xFF, sizeof(info));
        CHECK_STATUS(clmla_cache_get_info(cache, &info), CLMLA_SUCCESS, ctx);
        size_t es = row_bytes(cfg.dtype, 40, 8) / 48;
        CHECK(info.bytes_per_token_per_layer == 48 * es, "dtype %d: bytes per token %zu", dt,
              info.bytes_per_token_per_layer);
        CHECK(info.bytes_per_block == 48 * es * 16, "dtype %d: bytes per block %zu", dt, info.bytes_per_block);
        CHECK(info.bytes_total == 48 * es * 16 * 10 * 3, "dtype %d: bytes total %zu, expected %zu", dt,
              info.bytes_total, 48 * es * 16 * 10 * 3);
        CHECK(info.block_tokens == 16 && info.blocks_total == 10 && info.blocks_used == 0 && info.blocks_free == 10 &&
                  info.sequences == 0,
              "dtype %d: bt %d total %d used %d free %d seqs %d", dt, info.block_tokens, info.blocks_total,
              info.blocks_used, info.blocks_free, info.sequences);
        cl_mem buf = NULL;
        for (int l = 0; l < 3; l++) {
            CHECK_STATUS(clmla_cache_layer_buffer(cache, l, &buf), CLMLA_SUCCESS, ctx);
            CHECK(buf != NULL, "layer %d buffer", l);
        }
        CHECK_STATUS(clmla_cache_layer_buffer(cache, 3, &buf), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(buf == NULL, "layer 3 of 3 has no buffer");
        CHECK_STATUS(clmla_cache_layer_buffer(cache, -1, &buf), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK_STATUS(clmla_cache_layer_buffer(cache, 0, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        clmla_cache_destroy(cache);
    }

    /* Zero means default: 1 layer, 64 tokens per block. */
    clmla_cache_config def = {0, 512, 64, 0, 3, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    CHECK_STATUS(clmla_cache_create(ctx, &def, &cache), CLMLA_SUCCESS, ctx);
    if (cache) {
        clmla_cache_info info;
        clmla_cache_get_info(cache, &info);
        CHECK(info.block_tokens == 64 && info.bytes_per_token_per_layer == 576 * 4 &&
                  info.bytes_total == (size_t)576 * 4 * 64 * 3,
              "defaults: bt %d, bytes/token %zu, total %zu", info.block_tokens, info.bytes_per_token_per_layer,
              info.bytes_total);
        cl_mem buf = NULL;
        CHECK(clmla_cache_layer_buffer(cache, 0, &buf) == CLMLA_SUCCESS && buf &&
                  clmla_cache_layer_buffer(cache, 1, &buf) == CLMLA_ERROR_INVALID_ARGUMENT,
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
        {{1, 0, 8, 16, 4, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32}, "kv_lora_rank 0"},
        {{1, -40, 8, 16, 4, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32}, "kv_lora_rank -40"},
        {{1, 40, -8, 16, 4, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32}, "rope_dim -8"},
        {{1, 40, 8, -16, 4, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32}, "block_tokens -16"},
        {{1, 40, 8, 16, 0, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32}, "num_blocks 0"},
        {{1, 40, 8, 16, -4, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32}, "num_blocks -4"},
        {{-1, 40, 8, 16, 4, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32}, "num_layers -1"},
        {{1, 40, 8, 16, 4, (clmla_cache_dtype)7, 0, CLMLA_CACHE_F32}, "dtype 7"},
        {{1, 40, 8, 16, 4, CLMLA_CACHE_FP8, 0, CLMLA_CACHE_F32}, "fp8 with kv_lora_rank 40 (not a multiple of 128)"},
        {{1, 200, 8, 16, 4, CLMLA_CACHE_FP8, 0, CLMLA_CACHE_F32}, "fp8 with kv_lora_rank 200"},
        {{1, 40, 8, 16, 4, CLMLA_CACHE_F32, -1, CLMLA_CACHE_F32}, "index_head_dim -1"},
        {{1, 40, 8, 16, 4, CLMLA_CACHE_F32, 2048, CLMLA_CACHE_F32}, "index_head_dim 2048"},
        {{1, 40, 8, 16, 4, CLMLA_CACHE_F32, 16, (clmla_cache_dtype)9}, "an index-key cache of dtype 9"},
        {{1, 40, 8, 16, 4, CLMLA_CACHE_F32, 24, CLMLA_CACHE_FP8}, "fp8 index keys of 24 values (not a power of two)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cache = NULL;
        CHECK_STATUS(clmla_cache_create(ctx, &bad[i].cfg, &cache), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
        CHECK(cache == NULL, "%s: cache made anyway", bad[i].what);
        if (bad[i].cfg.dtype == CLMLA_CACHE_FP8)
            CHECK(strstr(clmla_last_error(ctx), "multiple of 128") != NULL, "%s: the message does not name the rule: %s",
                  bad[i].what, clmla_last_error(ctx));
        clmla_cache_destroy(cache);
    }
    /* Sizes whose product overflows: refused one way or another, never made. */
    clmla_cache_config huge = {1 << 20, 1 << 20, 64, 1 << 20, INT_MAX, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
    cache = NULL;
    clmla_status st = clmla_cache_create(ctx, &huge, &cache);
    CHECK(st != CLMLA_SUCCESS && cache == NULL, "an overflowing pool was made (%s)", clmla_status_string(st));
    clmla_cache_destroy(cache);
    /* More token slots than an int holds (2^26 blocks x 64 tokens): refused by that rule, before
       any size check. A layer of more than 2 GiB with fewer slots is allowed up to the device's
       largest allocation (the H100 ran batch 32 x 32K tokens in f32: 2.25 GiB). */
    clmla_cache_config slots = {1, 512, 64, 64, 1 << 26, CLMLA_CACHE_FP8, 0, CLMLA_CACHE_F32};
    cache = NULL;
    CHECK_STATUS(clmla_cache_create(ctx, &slots, &cache), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(cache == NULL && strstr(clmla_last_error(ctx), "2^31 - 1 token slots") != NULL,
          "too many slots: %s", clmla_last_error(ctx));
    clmla_cache_destroy(cache);

    clmla_cache_config ok = {1, 40, 8, 16, 4, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
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
    for (int dt = 0; dt < 3; dt++) {
        cache_model m;
        if (cm_create(&m, (const char *[]){"append f32", "append f16", "append bf16"}[dt], 2, 40, 8, 16, 12, (clmla_cache_dtype)dt, 11 + dt))
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
    for (int dt = 0; dt < 3; dt++) {
        cache_model m;
        if (cm_create(&m, (const char *[]){"full f32", "full f16", "full bf16"}[dt], 1, 40, 8, 16, 6, (clmla_cache_dtype)dt, 21 + dt))
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
    for (int dt = 0; dt < 4; dt++) { /* fp8 needs kv_lora_rank a multiple of 128 */
        cache_model m;
        if (cm_create(&m, (const char *[]){"random f32", "random f16", "random bf16", "random fp8"}[dt], 2,
                      dt == CLMLA_CACHE_FP8 ? 128 : 20, 4, 8, 40, (clmla_cache_dtype)dt, 41 + dt))
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
    cl_mem none = NULL;
    CHECK_STATUS(clmla_cache_layer_buffer(NULL, 0, &none), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    cm_verify(&m);
    clReleaseMemObject(buf);
    cm_destroy(&m);
}

/* ---- shared blocks: truncation, forks, copy on write ----------------------------------------- */

/* A second host model, for the tests of clmla_cache_seq_truncate and clmla_cache_seq_fork. Besides
   every sequence's rows it keeps the block structure the design implies (host/mla/cache.h): a
   table of model block ids per sequence and a count of the sequences listing each model block.
   The cache's real tables must map onto the model's one to one, so a fork that copied a block it
   should have shared, or an append that wrote into a shared block instead of a copy of it, shows
   up besides any wrong count or content. */

enum { SM_SEQS = 12, SM_TOKENS = 192, SM_VBLOCKS = 1 << 15 };

typedef struct sm_seq {
    int live;
    int32_t id;
    int len[MAX_LAYERS];
    float *ckv[MAX_LAYERS]; /* [SM_TOKENS, rkv] */
    float *kr[MAX_LAYERS];  /* [SM_TOKENS, dr] */
    int nb;                 /* table length */
    int vb[SM_TOKENS];      /* model block ids, in token order */
} sm_seq;

typedef struct share_model {
    clmla_cache *cache;
    clmla_cache_config cfg;
    int layers, bt, rkv, dr;
    sm_seq seqs[SM_SEQS];
    int *vrefs;  /* [SM_VBLOCKS] sequences listing each model block */
    int next_vb; /* model block ids are never reused */
    int used;    /* model blocks listed by some sequence */
    tu_rng rng;
    const char *name;
    /* what the operations did, so a test can tell the paths it reached */
    int copies, full, refused, forks, truncates;
} share_model;

static void sm_destroy(share_model *m)
{
    clmla_cache_destroy(m->cache);
    for (int s = 0; s < SM_SEQS; s++)
        for (int l = 0; l < MAX_LAYERS; l++) {
            free(m->seqs[s].ckv[l]);
            free(m->seqs[s].kr[l]);
        }
    free(m->vrefs);
    memset(m, 0, sizeof(*m));
}

/* A model over a new cache of the given shape: 0, or -1 (m freed) where the cache or the
   model's memory could not be made. */
static int sm_create(share_model *m, const char *name, int layers, int rkv, int dr, int bt, int num_blocks,
                     clmla_cache_dtype dtype, uint64_t seed)
{
    memset(m, 0, sizeof(*m));
    m->name = name;
    m->cfg = (clmla_cache_config){layers, rkv, dr, bt, num_blocks, dtype, 0, CLMLA_CACHE_F32};
    m->layers = layers;
    m->bt = bt;
    m->rkv = rkv;
    m->dr = dr;
    m->rng = tu_rng_seed(seed);
    m->vrefs = calloc(SM_VBLOCKS, sizeof(int));
    CHECK(num_blocks * bt <= SM_TOKENS && layers <= MAX_LAYERS, "%s: the model holds at most %d tokens", name,
          SM_TOKENS);
    clmla_status st = clmla_cache_create(ctx, &m->cfg, &m->cache);
    CHECK(st == CLMLA_SUCCESS && m->cache, "%s: cache_create: %s: %s", name, clmla_status_string(st),
          clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS && m->cache && m->vrefs)
        return 0;
    sm_destroy(m);
    return -1;
}

static int sm_free_blocks(const share_model *m)
{
    return m->cfg.num_blocks - m->used;
}

static int sm_new_block(share_model *m)
{
    CHECK(m->next_vb < SM_VBLOCKS, "%s: the model ran out of block ids", m->name);
    const int v = m->next_vb < SM_VBLOCKS - 1 ? m->next_vb++ : SM_VBLOCKS - 1;
    m->vrefs[v] = 1;
    m->used++;
    return v;
}

static void sm_release(share_model *m, int v)
{
    if (--m->vrefs[v] == 0)
        m->used--;
}

/* A model slot for a sequence the cache gave id `id`, with no tokens and no blocks. */
static int sm_take_slot(share_model *m, int32_t id)
{
    for (int s = 0; s < SM_SEQS; s++)
        CHECK(!m->seqs[s].live || m->seqs[s].id != id, "%s: new sequence id %d is already live", m->name, (int)id);
    for (int s = 0; s < SM_SEQS; s++) {
        sm_seq *q = &m->seqs[s];
        if (q->live)
            continue;
        for (int l = 0; l < m->layers; l++) {
            if (!q->ckv[l])
                q->ckv[l] = malloc((size_t)SM_TOKENS * m->rkv * sizeof(float));
            if (!q->kr[l])
                q->kr[l] = malloc((size_t)SM_TOKENS * m->dr * sizeof(float));
            q->len[l] = 0;
        }
        q->live = 1;
        q->id = id;
        q->nb = 0;
        return s;
    }
    CHECK(0, "%s: more than %d live sequences", m->name, SM_SEQS);
    return -1;
}

static int sm_add(share_model *m)
{
    int32_t id = -7;
    clmla_status st = clmla_cache_seq_add(m->cache, &id);
    CHECK(st == CLMLA_SUCCESS && id >= 0, "%s: seq_add: %s, id %d", m->name, clmla_status_string(st), (int)id);
    return st == CLMLA_SUCCESS ? sm_take_slot(m, id) : -1;
}

static int sm_longest(const share_model *m, const sm_seq *q)
{
    int n = 0;
    for (int l = 0; l < m->layers; l++)
        n = q->len[l] > n ? q->len[l] : n;
    return n;
}

static int sm_shortest(const share_model *m, const sm_seq *q)
{
    int n = q->len[0];
    for (int l = 1; l < m->layers; l++)
        n = q->len[l] < n ? q->len[l] : n;
    return n;
}

/* Shared blocks at table positions [first, end) of a sequence: those a write there must copy. */
static int sm_shared_in(const share_model *m, const sm_seq *q, int first, int end)
{
    int n = 0;
    for (int j = first; j < end && j < q->nb; j++)
        n += m->vrefs[q->vb[j]] > 1;
    return n;
}

/* The model side of making positions [first, want) writable: shared blocks copied, new ones added. */
static void sm_prepare(share_model *m, sm_seq *q, int first, int want)
{
    for (int j = first; j < want && j < q->nb; j++)
        if (m->vrefs[q->vb[j]] > 1) {
            sm_release(m, q->vb[j]);
            q->vb[j] = sm_new_block(m);
            m->copies++;
        }
    while (q->nb < want)
        q->vb[q->nb++] = sm_new_block(m);
}

/* What an append of n tokens to layer `layer` must return. */
static clmla_status sm_expect_append(const share_model *m, const sm_seq *q, int layer, int n)
{
    const int len = q->len[layer], want = blocks_for(len + n, m->bt);
    const int grow = want > q->nb ? want - q->nb : 0, copies = sm_shared_in(m, q, len / m->bt, want);
    if (len + n > m->cfg.num_blocks * m->bt || grow + copies > sm_free_blocks(m))
        return CLMLA_ERROR_CACHE_FULL;
    return CLMLA_SUCCESS;
}

/* The model side of a successful append of rows ckv [n, rkv], kr [n, dr]. */
static void sm_apply_append(share_model *m, int slot, int layer, int n, const float *ckv, const float *kr)
{
    sm_seq *q = &m->seqs[slot];
    const int len = q->len[layer];
    sm_prepare(m, q, len / m->bt, blocks_for(len + n, m->bt));
    memcpy(q->ckv[layer] + (size_t)len * m->rkv, ckv, (size_t)n * m->rkv * sizeof(float));
    memcpy(q->kr[layer] + (size_t)len * m->dr, kr, (size_t)n * m->dr * sizeof(float));
    q->len[layer] += n;
}

static clmla_status sm_append(share_model *m, int slot, int layer, int n)
{
    sm_seq *q = &m->seqs[slot];
    float *ckv = malloc((size_t)n * m->rkv * sizeof(float)), *kr = malloc((size_t)n * m->dr * sizeof(float));
    random_rows(ckv, (size_t)n * m->rkv, &m->rng);
    random_rows(kr, (size_t)n * m->dr, &m->rng);
    const clmla_status want = sm_expect_append(m, q, layer, n);
    clmla_status st = append_host(m->cache, layer, q->id, n, ckv, kr, m->rkv, m->dr, 0);
    CHECK(st == want, "%s: append %d tokens to seq %d layer %d (length %d, %d blocks, %d of %d used): %s, expected %s: %s",
          m->name, n, (int)q->id, layer, q->len[layer], q->nb, m->used, m->cfg.num_blocks, clmla_status_string(st),
          clmla_status_string(want), clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS)
        sm_apply_append(m, slot, layer, n, ckv, kr);
    m->full += st == CLMLA_ERROR_CACHE_FULL;
    free(ckv);
    free(kr);
    return st;
}

/* n tokens to every layer. */
static void sm_append_all(share_model *m, int slot, int n)
{
    for (int l = 0; l < m->layers; l++)
        sm_append(m, slot, l, n);
}

static clmla_status sm_reserve(share_model *m, int slot, int tokens)
{
    sm_seq *q = &m->seqs[slot];
    /* Appends up to `tokens` write positions [shortest length, tokens): those blocks, if any. */
    const int want = blocks_for(tokens, m->bt);
    const int first = tokens > sm_shortest(m, q) ? sm_shortest(m, q) / m->bt : want;
    const int grow = want > q->nb ? want - q->nb : 0, copies = sm_shared_in(m, q, first, want);
    const clmla_status expect = tokens < 0                             ? CLMLA_ERROR_INVALID_ARGUMENT
                                : grow + copies > sm_free_blocks(m) ? CLMLA_ERROR_CACHE_FULL
                                                                       : CLMLA_SUCCESS;
    clmla_status st = clmla_cache_seq_reserve(m->cache, q->id, tokens);
    CHECK(st == expect, "%s: reserve %d tokens for seq %d (%d blocks, %d copies needed, %d free): %s, expected %s: %s",
          m->name, tokens, (int)q->id, q->nb, copies, sm_free_blocks(m), clmla_status_string(st),
          clmla_status_string(expect), clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS)
        sm_prepare(m, q, first, want);
    m->full += st == CLMLA_ERROR_CACHE_FULL;
    return st;
}

static clmla_status sm_truncate(share_model *m, int slot, int tokens)
{
    sm_seq *q = &m->seqs[slot];
    const clmla_status expect =
        tokens < 0 || tokens > sm_shortest(m, q) ? CLMLA_ERROR_INVALID_ARGUMENT : CLMLA_SUCCESS;
    clmla_status st = clmla_cache_seq_truncate(m->cache, q->id, tokens);
    CHECK(st == expect, "%s: truncate seq %d (shortest layer %d tokens) to %d: %s, expected %s: %s", m->name,
          (int)q->id, sm_shortest(m, q), tokens, clmla_status_string(st), clmla_status_string(expect),
          clmla_last_error(ctx));
    if (st == CLMLA_SUCCESS) {
        for (int l = 0; l < m->layers; l++)
            q->len[l] = tokens;
        while (q->nb > blocks_for(tokens, m->bt))
            sm_release(m, q->vb[--q->nb]);
        m->truncates++;
    }
    m->refused += st == CLMLA_ERROR_INVALID_ARGUMENT;
    return st;
}

/* Forks a sequence; returns the new slot, or -1. */
static int sm_fork(share_model *m, int slot)
{
    const sm_seq *src = &m->seqs[slot];
    int32_t id = -7;
    clmla_status st = clmla_cache_seq_fork(m->cache, src->id, &id);
    CHECK(st == CLMLA_SUCCESS && id >= 0, "%s: fork of seq %d: %s, id %d: %s", m->name, (int)src->id,
          clmla_status_string(st), (int)id, clmla_last_error(ctx));
    if (st != CLMLA_SUCCESS)
        return -1;
    const int d = sm_take_slot(m, id);
    if (d < 0)
        return -1;
    sm_seq *q = &m->seqs[d];
    for (int l = 0; l < m->layers; l++) {
        q->len[l] = src->len[l];
        memcpy(q->ckv[l], src->ckv[l], (size_t)src->len[l] * m->rkv * sizeof(float));
        memcpy(q->kr[l], src->kr[l], (size_t)src->len[l] * m->dr * sizeof(float));
    }
    q->nb = blocks_for(sm_longest(m, src), m->bt); /* the blocks holding tokens, not reserved ones */
    for (int j = 0; j < q->nb; j++) {
        q->vb[j] = src->vb[j];
        m->vrefs[q->vb[j]]++;
    }
    m->forks++;
    return d;
}

static void sm_free(share_model *m, int slot)
{
    sm_seq *q = &m->seqs[slot];
    CHECK_STATUS(clmla_cache_seq_free(m->cache, q->id), CLMLA_SUCCESS, ctx);
    while (q->nb > 0)
        sm_release(m, q->vb[--q->nb]);
    q->live = 0;
}

/* The cache's invariants, from its internals, and its block structure against the model's:
   every block is free or listed, never both, and listed at most once per sequence; each block's
   count is the number of sequences listing it; the free stack holds each free block once;
   blocks_used + blocks_free = blocks_total and blocks_used is the model's; the real tables map
   onto the model's one to one; lengths match. */
static void sm_check_invariants(const share_model *m)
{
    const clmla_cache *c = m->cache;
    const int nblk = m->cfg.num_blocks;
    int *listed = calloc((size_t)nblk, sizeof(int)), *stamp = calloc((size_t)nblk, sizeof(int));
    char *in_free = calloc((size_t)nblk, 1);
    int in_use = 0, bad = 0;
    for (int i = 0; i < c->num_seqs; i++) {
        const cache_seq *s = &c->seqs[i];
        if (!s->in_use)
            continue;
        in_use++;
        for (int j = 0; j < s->num_blocks; j++) {
            const int b = s->blocks[j];
            if (b < 0 || b >= nblk) {
                CHECK(0, "%s: seq %d lists block %d of %d", m->name, i, b, nblk);
                continue;
            }
            if (stamp[b] == i + 1 && bad++ < 3)
                CHECK(0, "%s: seq %d lists block %d twice", m->name, i, b);
            stamp[b] = i + 1;
            listed[b]++;
        }
    }
    for (int k = 0; k < c->num_free; k++) {
        const int b = c->free_blocks[k];
        if (b < 0 || b >= nblk) {
            CHECK(0, "%s: free stack holds block %d of %d", m->name, b, nblk);
            continue;
        }
        if (in_free[b] && bad++ < 3)
            CHECK(0, "%s: block %d is in the free stack twice", m->name, b);
        in_free[b] = 1;
    }
    int owned = 0;
    for (int b = 0; b < nblk; b++) {
        owned += listed[b] > 0;
        if (c->refs[b] != listed[b] && bad++ < 3)
            CHECK(0, "%s: block %d counts %d owners, %d sequences list it", m->name, b, c->refs[b], listed[b]);
        if ((listed[b] > 0) == (in_free[b] != 0) && bad++ < 3)
            CHECK(0, "%s: block %d is %s", m->name, b, listed[b] ? "both listed and free" : "neither listed nor free");
    }
    CHECK(bad == 0, "%s: %d block invariants broken", m->name, bad);
    clmla_cache_info info;
    memset(&info, 0, sizeof(info));
    CHECK_STATUS(clmla_cache_get_info(c, &info), CLMLA_SUCCESS, ctx);
    int live = 0;
    for (int s = 0; s < SM_SEQS; s++)
        live += m->seqs[s].live;
    CHECK(info.blocks_total == nblk && info.blocks_used + info.blocks_free == nblk && info.blocks_used == owned &&
              info.blocks_free == c->num_free && info.blocks_used == m->used && info.sequences == live &&
              in_use == live,
          "%s: info total %d used %d free %d sequences %d; %d blocks listed, %d in the free stack, %d sequences in "
          "use; the model: %d used, %d sequences",
          m->name, info.blocks_total, info.blocks_used, info.blocks_free, info.sequences, owned, c->num_free, in_use,
          m->used, live);

    /* The model's block structure, through the public calls. */
    int *v2r = malloc((size_t)(m->next_vb + 1) * sizeof(int)), *r2v = malloc((size_t)nblk * sizeof(int));
    int32_t *blocks = malloc(((size_t)nblk + 1) * sizeof(int32_t));
    for (int v = 0; v <= m->next_vb; v++)
        v2r[v] = -1;
    for (int b = 0; b < nblk; b++)
        r2v[b] = -1;
    int mismatched = 0;
    for (int s = 0; s < SM_SEQS; s++) {
        const sm_seq *q = &m->seqs[s];
        if (!q->live)
            continue;
        for (int l = 0; l < m->layers; l++) {
            int len = -1;
            CHECK_STATUS(clmla_cache_seq_length(c, q->id, l, &len), CLMLA_SUCCESS, ctx);
            CHECK(len == q->len[l], "%s: seq %d layer %d length %d, expected %d", m->name, (int)q->id, l, len, q->len[l]);
        }
        int nb = -1;
        CHECK_STATUS(clmla_cache_seq_blocks(c, q->id, blocks, nblk, &nb), CLMLA_SUCCESS, ctx);
        CHECK(nb == q->nb, "%s: seq %d lists %d blocks, expected %d", m->name, (int)q->id, nb, q->nb);
        for (int j = 0; j < nb && j < q->nb; j++) {
            const int v = q->vb[j], r = blocks[j];
            if (r < 0 || r >= nblk)
                continue;
            if (v2r[v] < 0 && r2v[r] < 0) {
                v2r[v] = r;
                r2v[r] = v;
            } else if ((v2r[v] != r || r2v[r] != v) && mismatched++ < 3) {
                CHECK(0, "%s: seq %d position %d is block %d; the model expects %s", m->name, (int)q->id, j, r,
                      v2r[v] >= 0 ? "the block another sequence lists there (sharing)" : "a block of its own");
            }
        }
    }
    CHECK(mismatched == 0, "%s: %d table entries differ from the model's sharing", m->name, mismatched);
    free(v2r);
    free(r2v);
    free(blocks);
    free(listed);
    free(stamp);
    free(in_free);
}

/* Every live sequence's rows in every layer, read back, against what was appended. */
static void sm_check_contents(const share_model *m)
{
    float *ckv = malloc(((size_t)SM_TOKENS * m->rkv + 1) * sizeof(float));
    float *kr = malloc(((size_t)SM_TOKENS * m->dr + 1) * sizeof(float));
    for (int s = 0; s < SM_SEQS; s++) {
        const sm_seq *q = &m->seqs[s];
        for (int l = 0; q->live && l < m->layers; l++) {
            const int n = q->len[l];
            if (n == 0)
                continue;
            clmla_status st = clmla_cache_read(m->cache, l, q->id, 0, n, ckv, kr);
            CHECK(st == CLMLA_SUCCESS, "%s: read seq %d layer %d: %s: %s", m->name, (int)q->id, l,
                  clmla_status_string(st), clmla_last_error(ctx));
            if (st != CLMLA_SUCCESS)
                continue;
            compare_rows_as(m->name, m->cfg.dtype, ckv, q->ckv[l], (size_t)n * m->rkv, "c_kv", q->id, l, m->rkv, 0);
            compare_rows_as(m->name, m->cfg.dtype, kr, q->kr[l], (size_t)n * m->dr, "k_rope", q->id, l, m->dr, 0);
        }
    }
    free(ckv);
    free(kr);
}

static void sm_verify(const share_model *m)
{
    sm_check_invariants(m);
    sm_check_contents(m);
}

/* The cache's whole host-side state (free stack in order, counts, tables, lengths), to compare
   before and after a call that must change nothing. */
typedef struct cache_state {
    int *v;
    size_t n, cap;
} cache_state;

static void cs_push(cache_state *s, int x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->v = realloc(s->v, s->cap * sizeof(int));
    }
    s->v[s->n++] = x;
}

static cache_state cs_take(const clmla_cache *c)
{
    cache_state s = {NULL, 0, 0};
    cs_push(&s, c->num_free);
    for (int k = 0; k < c->num_free; k++)
        cs_push(&s, c->free_blocks[k]);
    for (int b = 0; b < c->config.num_blocks; b++)
        cs_push(&s, c->refs[b]);
    for (int i = 0; i < c->num_seqs; i++) {
        cs_push(&s, c->seqs[i].in_use);
        if (!c->seqs[i].in_use)
            continue;
        cs_push(&s, c->seqs[i].num_blocks);
        for (int j = 0; j < c->seqs[i].num_blocks; j++)
            cs_push(&s, c->seqs[i].blocks[j]);
        for (int l = 0; l < c->config.num_layers; l++)
            cs_push(&s, c->seqs[i].length[l]);
    }
    return s;
}

/* 1 when the cache's state is `before`'s; frees `before`. */
static int cs_same(cache_state *before, const clmla_cache *c)
{
    cache_state now = cs_take(c);
    const int same = now.n == before->n && memcmp(now.v, before->v, now.n * sizeof(int)) == 0;
    free(now.v);
    free(before->v);
    memset(before, 0, sizeof(*before));
    return same;
}

static int error_mentions(const char *a, const char *b)
{
    const char *e = clmla_last_error(ctx);
    return strstr(e, a) != NULL && (!b || strstr(e, b) != NULL);
}

/* Truncation: refused past the shortest layer (naming both numbers) or below 0, changing nothing;
   to the full length, to the middle of a block, to a block boundary, to 0; the blocks past the
   kept ones (reserved ones too) return to the pool; the rows kept are unchanged and appends go on
   from the new length. Another sequence stays intact throughout. */
static void test_truncate(void)
{
    share_model m;
    if (sm_create(&m, "truncate", 3, 24, 8, 8, 20, CLMLA_CACHE_F32, 61))
        return;
    int a = sm_add(&m), b = sm_add(&m);
    sm_append_all(&m, a, 14);
    sm_append(&m, b, 0, 20);
    sm_append_all(&m, a, 16); /* 30 tokens in 4 blocks, interleaved with b's */
    sm_append(&m, b, 2, 9);
    sm_verify(&m);
    const int32_t id = m.seqs[a].id;

    cache_state before = cs_take(m.cache);
    CHECK(sm_truncate(&m, a, 31) == CLMLA_ERROR_INVALID_ARGUMENT && error_mentions("31", "30"),
          "truncate past the length: the message names both numbers: %s", clmla_last_error(ctx));
    CHECK(sm_truncate(&m, a, -1) == CLMLA_ERROR_INVALID_ARGUMENT, "truncate to -1");
    CHECK(cs_same(&before, m.cache), "a refused truncate changed the cache");

    /* Layers of different lengths: the shortest one bounds the truncation. */
    sm_append(&m, a, 0, 5); /* layer 0: 35 tokens, a 5th block */
    before = cs_take(m.cache);
    CHECK(sm_truncate(&m, a, 32) == CLMLA_ERROR_INVALID_ARGUMENT && error_mentions("32", "30"),
          "truncate past layer 1's length: %s", clmla_last_error(ctx));
    CHECK(cs_same(&before, m.cache), "a refused truncate changed the cache");
    sm_verify(&m);
    int used = m.used;
    CHECK(sm_truncate(&m, a, 30) == CLMLA_SUCCESS && m.used == used - 1, "to the full length of the shortest layer: "
          "layer 0's extra block returns (%d used, was %d)", m.used, used);
    sm_verify(&m);
    before = cs_take(m.cache);
    CHECK(sm_truncate(&m, a, 30) == CLMLA_SUCCESS, "to the full length");
    CHECK(cs_same(&before, m.cache), "a truncate to the full length changed the cache");

    /* The middle of a block, then appends from there in place. */
    CHECK(sm_truncate(&m, a, 21) == CLMLA_SUCCESS && m.seqs[a].nb == 3, "to 21 tokens: 3 blocks");
    sm_verify(&m);
    sm_append(&m, a, 1, 6);
    sm_append(&m, a, 0, 2);
    sm_verify(&m);
    /* A block boundary. */
    CHECK(sm_truncate(&m, a, 16) == CLMLA_SUCCESS && m.seqs[a].nb == 2, "to 16 tokens: 2 blocks");
    sm_verify(&m);
    sm_append_all(&m, a, 3);
    sm_verify(&m);
    /* Nothing at all. */
    CHECK(sm_truncate(&m, a, 0) == CLMLA_SUCCESS && m.seqs[a].nb == 0, "to 0 tokens: no block");
    sm_verify(&m);
    sm_append_all(&m, a, 9);
    sm_verify(&m);
    /* Reserved blocks go too. */
    CHECK(sm_reserve(&m, a, 60) == CLMLA_SUCCESS && m.seqs[a].nb == 8, "reserve 60 tokens");
    CHECK(sm_truncate(&m, a, 9) == CLMLA_SUCCESS && m.seqs[a].nb == 2, "to 9 tokens after a reserve: 2 blocks");
    sm_verify(&m);
    /* An empty sequence. */
    int c = sm_add(&m);
    CHECK(sm_truncate(&m, c, 0) == CLMLA_SUCCESS, "an empty sequence to 0");
    CHECK(sm_truncate(&m, c, 1) == CLMLA_ERROR_INVALID_ARGUMENT, "an empty sequence to 1");
    sm_verify(&m);

    /* Unknown ids and a NULL cache. */
    const int32_t freed = m.seqs[c].id;
    sm_free(&m, c);
    before = cs_take(m.cache);
    const int32_t unknown[] = {freed, 99, -1, INT32_MAX};
    for (int u = 0; u < 4; u++)
        CHECK_STATUS(clmla_cache_seq_truncate(m.cache, unknown[u], 0), CLMLA_ERROR_UNKNOWN_SEQUENCE, ctx);
    CHECK_STATUS(clmla_cache_seq_truncate(NULL, id, 0), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK(cs_same(&before, m.cache), "truncates of unknown sequences changed the cache");
    sm_verify(&m);
    sm_destroy(&m);
}

/* Forks: of an empty sequence, of one ending mid-block, of one ending at a block boundary; appends
   to parent and child afterwards (the first into the shared partly filled block copies it, once;
   full blocks stay shared); freeing the parent, then the child. Both dtypes: the device copy
   moves f16 rows bit for bit. */
static void test_fork(void)
{
    for (int dt = 0; dt < 3; dt++) {
        share_model m;
        if (sm_create(&m, (const char *[]){"fork f32", "fork f16", "fork bf16"}[dt], 3, 24, 8, 8, 20, (clmla_cache_dtype)dt, 71 + dt))
            continue;
        /* An empty sequence: the fork lists no block; each then grows on its own. */
        int e = sm_add(&m), f = sm_fork(&m, e);
        CHECK(f >= 0 && m.used == 0 && m.seqs[f].nb == 0, "%s: fork of an empty sequence", m.name);
        sm_verify(&m);
        sm_append_all(&m, f, 5);
        sm_append_all(&m, e, 3);
        sm_verify(&m);

        /* Mid-block: 20 tokens are 2 full blocks and a partly filled one, all three shared. */
        int p = sm_add(&m);
        sm_append_all(&m, p, 20);
        int used = m.used, copies = m.copies;
        int c = sm_fork(&m, p);
        CHECK(c >= 0 && m.used == used, "%s: a fork takes no block", m.name);
        sm_verify(&m);
        int32_t tp[8] = {0}, tc[8] = {1};
        int np = 0, nc = 0;
        clmla_cache_seq_blocks(m.cache, m.seqs[p].id, tp, 8, &np);
        clmla_cache_seq_blocks(m.cache, m.seqs[c].id, tc, 8, &nc);
        CHECK(np == 3 && nc == 3 && memcmp(tp, tc, 3 * sizeof(int32_t)) == 0, "%s: the fork lists the parent's blocks",
              m.name);
        /* The parent appends: its own copy of the last block (all three layers' rows), once. */
        sm_append(&m, p, 0, 1);
        CHECK(m.used == used + 1 && m.copies == copies + 1, "%s: the parent's first append copies one block", m.name);
        sm_append(&m, p, 1, 2);
        sm_append(&m, p, 2, 1);
        CHECK(m.used == used + 1 && m.copies == copies + 1, "%s: later appends copy nothing", m.name);
        sm_verify(&m);
        /* The child now is the old block's only owner: it appends in place, then grows. */
        sm_append(&m, c, 0, 3);
        CHECK(m.used == used + 1 && m.copies == copies + 1, "%s: the child appends in place", m.name);
        sm_append(&m, c, 1, 12);
        CHECK(m.used == used + 2, "%s: the child's 32nd token takes a new block", m.name);
        sm_verify(&m);
        CHECK(m.vrefs[m.seqs[p].vb[0]] == 2 && m.vrefs[m.seqs[p].vb[1]] == 2, "%s: full blocks stay shared", m.name);

        /* A block boundary: appends after the fork take new blocks and copy nothing. */
        int q = sm_add(&m);
        sm_append_all(&m, q, 16);
        int r = sm_fork(&m, q);
        used = m.used;
        copies = m.copies;
        sm_append_all(&m, r, 1);
        sm_append_all(&m, q, 9);
        CHECK(m.used == used + 3 && m.copies == copies, "%s: fork at a block boundary: %d blocks taken, %d copies",
              m.name, m.used - used, m.copies - copies);
        sm_verify(&m);

        /* Free the parent, then the child: shared blocks return with their last owner. */
        used = m.used;
        sm_free(&m, p);
        CHECK(m.used == used - 1, "%s: freeing the parent returns only its own copy", m.name);
        sm_verify(&m);
        sm_free(&m, c);
        sm_verify(&m);
        /* And the other pair the other way round. */
        sm_free(&m, r);
        sm_verify(&m);
        sm_free(&m, q);
        sm_free(&m, e);
        sm_free(&m, f);
        CHECK(m.used == 0, "%s: all blocks back", m.name);
        sm_verify(&m);
        sm_destroy(&m);
    }
}

/* Fork chains (a fork of a fork: blocks listed by three and four sequences), the middle of the
   chain freed first; forks of sequences whose layers have different lengths, where appends to
   the short layers copy blocks that the long layers filled. */
static void test_fork_chain(void)
{
    share_model m;
    if (sm_create(&m, "fork chain", 3, 24, 8, 8, 24, CLMLA_CACHE_F32, 75))
        return;
    int g0 = sm_add(&m);
    sm_append_all(&m, g0, 13);
    int g1 = sm_fork(&m, g0), g2 = sm_fork(&m, g1);
    CHECK(g1 >= 0 && g2 >= 0 && m.used == 2, "fork of a fork takes no block");
    sm_verify(&m);
    int32_t b0 = -1;
    clmla_cache_seq_blocks(m.cache, m.seqs[g2].id, &b0, 1, NULL);
    CHECK(b0 >= 0 && m.cache->refs[b0] == 3, "block %d is listed by three sequences, counts %d", (int)b0,
          b0 >= 0 ? m.cache->refs[b0] : -1);
    int used = m.used, copies = m.copies;
    sm_append(&m, g1, 0, 1); /* copies block 1 */
    sm_append(&m, g2, 1, 4); /* block 1 still listed by g0 and g2: copies it too, then a new block 2 */
    sm_append(&m, g0, 2, 3); /* g0 is the last owner of the old block 1: in place */
    CHECK(m.used == used + 3 && m.copies == copies + 2, "two copies along the chain (%d), one new block (%d)",
          m.copies - copies, m.used - used - (m.copies - copies));
    sm_verify(&m);
    int g3 = sm_fork(&m, g2); /* g2: 13, 17, 13 tokens: 3 blocks */
    CHECK(g3 >= 0 && m.seqs[g3].nb == 3 && m.vrefs[m.seqs[g3].vb[0]] == 4, "a fork of a fork of a fork");
    sm_append(&m, g3, 0, 1);
    sm_append(&m, g2, 2, 9);
    sm_verify(&m);
    sm_free(&m, g1); /* the middle of the chain */
    sm_verify(&m);
    sm_free(&m, g0);
    sm_verify(&m);
    sm_append_all(&m, g3, 2);
    sm_free(&m, g2);
    sm_verify(&m);
    sm_free(&m, g3);
    CHECK(m.used == 0, "the chain freed: %d blocks used", m.used);
    sm_verify(&m);

    /* Layers of different lengths: 20, 5 and 0 tokens. */
    int s = sm_add(&m);
    sm_append(&m, s, 0, 20);
    sm_append(&m, s, 1, 5);
    int t = sm_fork(&m, s);
    CHECK(t >= 0 && m.seqs[t].nb == 3, "the fork lists the blocks of the longest layer");
    sm_verify(&m);
    used = m.used;
    copies = m.copies;
    sm_append(&m, t, 2, 3);  /* into block 0, which layer 0 filled: a copy of its rows in layers 0 and 1 */
    sm_append(&m, t, 1, 10); /* block 0 (its own now) and block 1 (shared): one copy */
    sm_append(&m, s, 1, 4);  /* s is block 0's only owner now */
    CHECK(m.used == used + 2 && m.copies == copies + 2, "two copies for the short layers (%d)", m.copies - copies);
    sm_verify(&m);
    sm_append(&m, t, 0, 1); /* block 2 */
    sm_append(&m, s, 2, 17);
    sm_verify(&m);
    /* Truncate both to their shortest layer or below, then fork and append: a block shared again is
       copied again. t: 21, 15, 3 tokens; s: 20, 9, 17. */
    CHECK(sm_truncate(&m, t, 4) == CLMLA_ERROR_INVALID_ARGUMENT, "t's layer 2 holds 3 tokens");
    CHECK(sm_truncate(&m, t, 3) == CLMLA_SUCCESS && sm_truncate(&m, s, 6) == CLMLA_SUCCESS, "truncates");
    sm_verify(&m);
    int u = sm_fork(&m, t);
    sm_append_all(&m, u, 2);
    sm_append_all(&m, t, 5);
    sm_verify(&m);
    sm_destroy(&m);
}

/* CLMLA_ERROR_CACHE_FULL around forks: the fork itself succeeds in a full pool; an append or a
   reserve whose copy finds no block fails and changes nothing; a block the parent truncated away
   is the child's alone; after a truncate into a block another sequence still reads, a reserve
   copies it, and appends up to the reserve take no block; a step that needs exactly the free
   blocks succeeds, one more fails. */
static void test_fork_full(void)
{
    share_model m;
    if (sm_create(&m, "fork full", 3, 24, 8, 8, 6, CLMLA_CACHE_F32, 77))
        return;
    int a = sm_add(&m), b = sm_add(&m);
    sm_append_all(&m, a, 20);
    sm_append(&m, b, 0, 24);
    CHECK(m.used == 6, "the pool is full (%d)", m.used);
    int c = sm_fork(&m, a);
    CHECK(c >= 0, "a fork succeeds in a full pool");
    sm_verify(&m);

    cache_state before = cs_take(m.cache);
    CHECK(sm_append(&m, c, 0, 1) == CLMLA_ERROR_CACHE_FULL && error_mentions("cache full", NULL),
          "the child's copy on write finds no block: %s", clmla_last_error(ctx));
    CHECK(sm_append(&m, a, 2, 4) == CLMLA_ERROR_CACHE_FULL, "the parent's copy on write finds no block");
    CHECK(sm_append(&m, c, 1, 1) == CLMLA_ERROR_CACHE_FULL, "nor in layer 1");
    CHECK(sm_reserve(&m, c, 21) == CLMLA_ERROR_CACHE_FULL, "a reserve that must copy");
    CHECK(sm_reserve(&m, a, 20) == CLMLA_SUCCESS, "a reserve that writes nothing copies nothing");
    CHECK(cs_same(&before, m.cache), "CACHE_FULL changed the cache");
    sm_verify(&m);

    /* The parent truncates to a block boundary: the old last block is the child's alone. */
    CHECK(sm_truncate(&m, a, 16) == CLMLA_SUCCESS && m.used == 6, "the truncated block stays the child's");
    CHECK(sm_append(&m, c, 0, 1) == CLMLA_SUCCESS && m.used == 6, "the child appends in place");
    sm_verify(&m);

    /* A truncate into a block a holds rows of (a: 8..15, c: 8..11): a reserve copies it. */
    sm_free(&m, b);
    CHECK(sm_truncate(&m, c, 12) == CLMLA_SUCCESS, "child to 12 tokens");
    int copies = m.copies;
    CHECK(sm_reserve(&m, c, 20) == CLMLA_SUCCESS && m.copies == copies + 1, "a reserve copies the shared block");
    int used = m.used;
    sm_append_all(&m, c, 8);
    CHECK(m.used == used && m.copies == copies + 1, "appends up to the reserve take no block");
    sm_verify(&m);

    /* A step that needs exactly the free blocks: a copy and a new block. */
    int d = sm_fork(&m, c); /* c: 20 tokens, its last block partly filled */
    CHECK(sm_free_blocks(&m) == 2, "2 free blocks (%d)", sm_free_blocks(&m));
    before = cs_take(m.cache);
    CHECK(sm_append(&m, d, 0, 13) == CLMLA_ERROR_CACHE_FULL, "a copy and two new blocks do not fit in two");
    CHECK(cs_same(&before, m.cache), "CACHE_FULL changed the cache");
    CHECK(sm_append(&m, d, 0, 12) == CLMLA_SUCCESS && sm_free_blocks(&m) == 0, "a copy and a new block fit in two");
    sm_verify(&m);
    sm_destroy(&m);
}

/* A step with several sequences that share the block they write into (host/mla/cache.h): each
   takes a copy and the old block keeps its count until commit; rollback restores every table,
   count and the free stack exactly; commit returns the old block to the pool; the device copies
   hold every layer's rows. The step's block need counts those copies: one short, CACHE_FULL. */
static void test_fork_step(void)
{
    share_model m;
    if (sm_create(&m, "fork step", 3, 24, 8, 8, 12, CLMLA_CACHE_F32, 79))
        return;
    int p = sm_add(&m);
    sm_append_all(&m, p, 12);
    int c = sm_fork(&m, p), d = sm_fork(&m, p);
    sm_verify(&m);
    const int slots[3] = {p, c, d};
    int32_t old[2] = {-1, -1};
    clmla_cache_seq_blocks(m.cache, m.seqs[p].id, old, 2, NULL);
    clmla_batch_entry entries[3] = {{m.seqs[p].id, 1}, {m.seqs[c].id, 2}, {m.seqs[d].id, 1}};

    cache_state before = cs_take(m.cache);
    const int free_before = m.cache->num_free;
    cache_txn txn;
    CHECK_STATUS(clmla_cache_begin_append(m.cache, 0, entries, 3, &txn), CLMLA_SUCCESS, ctx);
    int32_t copy[3] = {-1, -1, -1};
    for (int i = 0; i < 3; i++) {
        const cache_seq *s = &m.cache->seqs[entries[i].seq_id];
        copy[i] = s->blocks[1];
        CHECK(s->num_blocks == 2 && s->blocks[0] == old[0] && s->blocks[1] != old[1] &&
                  s->length[0] == 12 + entries[i].num_tokens,
              "entry %d: blocks [%d %d] (old %d %d), length %d", i, (int)s->blocks[0], (int)s->blocks[1], (int)old[0],
              (int)old[1], s->length[0]);
    }
    CHECK(copy[0] != copy[1] && copy[0] != copy[2] && copy[1] != copy[2], "three distinct copies");
    CHECK(m.cache->refs[old[1]] == 3 && m.cache->refs[old[0]] == 3 && m.cache->num_free == free_before - 3,
          "in the step: old block counts %d, block 0 counts %d, %d free (was %d)", m.cache->refs[old[1]],
          m.cache->refs[old[0]], m.cache->num_free, free_before);
    clmla_cache_rollback(m.cache, &txn);
    CHECK(cs_same(&before, m.cache), "rollback did not restore the cache exactly");
    sm_verify(&m);

    CHECK_STATUS(clmla_cache_begin_append(m.cache, 0, entries, 3, &txn), CLMLA_SUCCESS, ctx);
    clmla_cache_commit(&txn);
    CHECK(m.cache->refs[old[1]] == 0 && m.cache->num_free == free_before - 2, "after commit: old block counts %d, %d free",
          m.cache->refs[old[1]], m.cache->num_free);
    /* The model: each has its own copy of block 1. The step wrote no rows: truncate back to 12. */
    for (int i = 0; i < 3; i++) {
        sm_seq *q = &m.seqs[slots[i]];
        sm_release(&m, q->vb[1]);
        q->vb[1] = sm_new_block(&m);
        q->len[0] += entries[i].num_tokens;
        sm_truncate(&m, slots[i], 12);
    }
    sm_verify(&m);

    /* Three writers into a block all three share, with two free blocks: CACHE_FULL. */
    int e = sm_fork(&m, p), f = sm_fork(&m, p), g = sm_add(&m);
    CHECK(sm_reserve(&m, g, (sm_free_blocks(&m) - 2) * m.bt) == CLMLA_SUCCESS && sm_free_blocks(&m) == 2, "fill to 2 free");
    clmla_batch_entry three[3] = {{m.seqs[p].id, 1}, {m.seqs[e].id, 1}, {m.seqs[f].id, 1}};
    before = cs_take(m.cache);
    CHECK_STATUS(clmla_cache_check_append(m.cache, 0, three, 3, NULL), CLMLA_ERROR_CACHE_FULL, ctx);
    CHECK(error_mentions("copies", NULL), "the message counts the copies: %s", clmla_last_error(ctx));
    CHECK_STATUS(clmla_cache_begin_append(m.cache, 0, three, 3, &txn), CLMLA_ERROR_CACHE_FULL, ctx);
    CHECK(cs_same(&before, m.cache), "CACHE_FULL changed the cache");
    before = cs_take(m.cache);
    CHECK_STATUS(clmla_cache_begin_append(m.cache, 1, three + 1, 2, &txn), CLMLA_SUCCESS, ctx);
    clmla_cache_rollback(m.cache, &txn);
    CHECK(cs_same(&before, m.cache), "rollback did not restore the cache exactly");
    sm_verify(&m);
    sm_destroy(&m);
}

/* Fault injection (host/runtime/clcall.h) on appends and reserves that copy a shared block: each
   counted call (the device copies of three layers, the slot upload, the write) fails in turn; the
   call returns the injected code and leaves the cache exactly as it was. */
static void test_fork_faults(void)
{
    share_model m;
    if (sm_create(&m, "fork faults", 3, 24, 8, 8, 10, CLMLA_CACHE_F32, 83))
        return;
    int p = sm_add(&m);
    sm_append_all(&m, p, 13);
    int c = sm_fork(&m, p), r = sm_fork(&m, p);
    for (int op = 0; op < 2; op++) {
        float ckv[24], kr[8];
        random_rows(ckv, 24, &m.rng);
        random_rows(kr, 8, &m.rng);
        long n = 1;
        for (;; n++) {
            cache_state before = cs_take(m.cache);
            clmla_fault_arm(ctx, n);
            clmla_status st = op == 0 ? append_host(m.cache, 1, m.seqs[c].id, 1, ckv, kr, 24, 8, 0)
                                      : clmla_cache_seq_reserve(m.cache, m.seqs[r].id, 20);
            const long calls = clmla_fault_count(ctx);
            clmla_fault_arm(ctx, 0);
            if (st == CLMLA_SUCCESS) {
                CHECK(calls < n, "op %d succeeded although call %ld of %ld failed", op, n, calls);
                free(before.v);
                break;
            }
            CHECK(st == CL_OUT_OF_RESOURCES || st == CL_MEM_OBJECT_ALLOCATION_FAILURE,
                  "op %d, fault at call %ld: %s: %s", op, n, clmla_status_string(st), clmla_last_error(ctx));
            CHECK(cs_same(&before, m.cache), "op %d, fault at call %ld changed the cache", op, n);
            if (n > 50) {
                CHECK(0, "op %d still failing after 50 faults", op);
                break;
            }
        }
        CHECK(n > 3, "op %d: only %ld counted calls (the copies of 3 layers are counted)", op, n - 1);
        if (op == 0) {
            sm_apply_append(&m, c, 1, 1, ckv, kr);
        } else {
            sm_prepare(&m, &m.seqs[r], 13 / m.bt, blocks_for(20, m.bt));
        }
        sm_verify(&m);
    }
    sm_destroy(&m);
}

/* Random adds, forks, appends, reserves, truncates (some refused) and frees against the model, the
   invariants after every operation and every sequence's rows every few. */
static void test_fork_random(void)
{
    for (int dt = 0; dt < 4; dt++) { /* fp8 needs kv_lora_rank a multiple of 128 */
        share_model m;
        if (sm_create(&m, (const char *[]){"fork random f32", "fork random f16", "fork random bf16", "fork random fp8"}[dt], 3,
                      dt == CLMLA_CACHE_FP8 ? 128 : 20, 4, 4, 40, (clmla_cache_dtype)dt,
                      91 + dt))
            continue;
        for (int step = 0; step < 600 && check_failed < 20; step++) {
            int live[SM_SEQS], nlive = 0;
            for (int s = 0; s < SM_SEQS; s++)
                if (m.seqs[s].live)
                    live[nlive++] = s;
            const int op = tu_rng_below(&m.rng, 14);
            const int s = nlive ? live[tu_rng_below(&m.rng, nlive)] : -1;
            if (nlive == 0 || (op == 0 && nlive < SM_SEQS)) {
                sm_add(&m);
            } else if (op <= 2 && nlive < SM_SEQS) {
                sm_fork(&m, s);
            } else if (op == 3 || (op <= 2 && nlive == SM_SEQS)) {
                sm_free(&m, s);
            } else if (op == 4) {
                sm_reserve(&m, s, sm_longest(&m, &m.seqs[s]) + tu_rng_below(&m.rng, 12));
            } else if (op <= 6) {
                sm_truncate(&m, s, tu_rng_below(&m.rng, sm_shortest(&m, &m.seqs[s]) + 3));
            } else {
                sm_append(&m, s, tu_rng_below(&m.rng, 3), 1 + tu_rng_below(&m.rng, 9));
            }
            sm_check_invariants(&m);
            if (step % 25 == 24)
                sm_check_contents(&m);
        }
        sm_verify(&m);
        printf("# %s: %d forks, %d copies, %d truncates, %d refused, %d cache full\n", m.name, m.forks, m.copies,
               m.truncates, m.refused, m.full);
        CHECK(m.forks > 20 && m.copies > 20 && m.truncates > 20 && m.refused > 0 && m.full > 0,
              "%s: the walk reached too few states", m.name);
        sm_destroy(&m);
    }
}

/* ---- the layer over forked and truncated sequences -------------------------------------------- */

typedef struct fl_entry {
    int32_t id;
    int n;
    const float *x;       /* [n, D]: the entry's hidden states */
    const tu_ref_run *ref; /* the reference of the sequence's whole history */
    int pos;              /* position of the entry's first token */
} fl_entry;

/* One step through the layer in every cache layer; every entry's output against its reference. */
static clmla_status fl_step(clmla_layer *layer, clmla_cache *cache, int layers, clmla_attention_path path,
                            const fl_entry *e, int count, int D, const char *what)
{
    int rows = 0;
    for (int i = 0; i < count; i++)
        rows += e[i].n;
    float *x = malloc((size_t)rows * D * sizeof(float)), *out = malloc((size_t)rows * D * sizeof(float));
    clmla_batch_entry entries[4];
    for (int i = 0, r = 0; i < count; r += e[i].n, i++) {
        entries[i] = (clmla_batch_entry){e[i].id, e[i].n};
        memcpy(x + (size_t)r * D, e[i].x, (size_t)e[i].n * D * sizeof(float));
    }
    clmla_status st = CLMLA_SUCCESS;
    for (int l = 0; l < layers && st == CLMLA_SUCCESS; l++) {
        clmla_forward_args args = {entries, count, l, path};
        st = clmla_layer_forward(layer, cache, &args, x, out);
        if (st != CLMLA_SUCCESS)
            break;
        for (int i = 0, r = 0; i < count; r += e[i].n, i++)
            CHECK_CLOSE(out + (size_t)r * D, e[i].ref->out + (size_t)e[i].pos * D, (size_t)e[i].n * D, D,
                        TOL_F32_CACHE, "%s: cache layer %d, entry %d (seq %d, tokens %d..%d) [token, i]", what, l, i,
                        (int)e[i].id, e[i].pos, e[i].pos + e[i].n - 1);
    }
    free(x);
    free(out);
    return st;
}

/* A sequence's cache rows in every layer against its reference. */
static void fl_check_cache(clmla_cache *cache, int layers, int32_t id, const tu_ref_run *ref, int n, int rkv, int dr,
                           const char *what)
{
    float *ckv = malloc((size_t)n * rkv * sizeof(float)), *kr = malloc((size_t)n * dr * sizeof(float));
    for (int l = 0; l < layers; l++) {
        int len = -1;
        clmla_cache_seq_length(cache, id, l, &len);
        CHECK(len == n, "%s: seq %d layer %d holds %d tokens, expected %d", what, (int)id, l, len, n);
        clmla_status st = clmla_cache_read(cache, l, id, 0, n, ckv, kr);
        CHECK(st == CLMLA_SUCCESS, "%s: read: %s", what, clmla_last_error(ctx));
        if (st != CLMLA_SUCCESS)
            continue;
        CHECK_CLOSE(ckv, ref->ckv, (size_t)n * rkv, rkv, TOL_F32_CACHE, "%s: seq %d layer %d c_kv", what, (int)id, l);
        CHECK_CLOSE(kr, ref->kr, (size_t)n * dr, dr, TOL_F32_CACHE, "%s: seq %d layer %d k_rope", what, (int)id, l);
    }
    free(ckv);
    free(kr);
}

/* clmla_layer_forward over forks, against the float64 reference, in 3 cache layers, on both
   paths: a prompt; its fork and the parent decoding different tokens in one step (the step
   copies the shared partly filled block); the parent truncated into a block its fork still
   reads, then both decoding in one step; a step whose copy finds no block fails with
   CLMLA_ERROR_CACHE_FULL and changes nothing. */
static void test_fork_layer(void)
{
    const int D = 32, rkv = 16, dr = 4, bt = 4, L = 3;
    clmla_layer_config cfg = tu_small_config(D, 2, 0, rkv, 8, dr, 8);
    tu_weights w;
    if (tu_weights_make(&w, &cfg, 81) != 0) {
        CHECK(0, "weights: out of memory");
        return;
    }
    clmla_layer *layer = NULL;
    CHECK_STATUS(clmla_layer_create(ctx, &w.config, &w.layer, &layer), CLMLA_SUCCESS, ctx);
    /* P: 10 tokens. C: P's first 9, then its own. Q: P truncated to 6, then its own. */
    enum { TP = 10, TC = 13, TQ = 8 };
    float *xp = tu_random_inputs(TP, D, 82), *xc = tu_random_inputs(TC, D, 83), *xq = tu_random_inputs(TQ, D, 84);
    tu_ref_run rp, rc, rq;
    memset(&rp, 0, sizeof(rp));
    memset(&rc, 0, sizeof(rc));
    memset(&rq, 0, sizeof(rq));
    int ok = layer && xp && xc && xq;
    if (ok) {
        memcpy(xc, xp, (size_t)9 * D * sizeof(float));
        memcpy(xq, xp, (size_t)6 * D * sizeof(float));
        ok = tu_ref_run_make(&rp, &w, TP, xp, MLA_REF_DECOMPRESSED) == 0 &&
             tu_ref_run_make(&rc, &w, TC, xc, MLA_REF_DECOMPRESSED) == 0 &&
             tu_ref_run_make(&rq, &w, TQ, xq, MLA_REF_DECOMPRESSED) == 0;
        CHECK(ok, "reference failed");
    }
    static const clmla_attention_path paths[] = {CLMLA_PATH_ABSORBED, CLMLA_PATH_DECOMPRESSED};
    for (int run = 0; run < 2 && ok; run++) {
        const clmla_attention_path path = paths[run];
        const char *pn = run ? "decompressed" : "absorbed";
        clmla_cache_config cc = {L, rkv, dr, bt, 12, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
        clmla_cache *cache = NULL;
        CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
        if (!cache)
            break;
        int32_t p = -1, c = -1, d = -1, filler = -1;
        clmla_cache_seq_add(cache, &p);
        char what[96];
        snprintf(what, sizeof(what), "%s prompt", pn);
        fl_entry prompt = {p, 9, xp, &rp, 0};
        CHECK_STATUS(fl_step(layer, cache, L, path, &prompt, 1, D, what), CLMLA_SUCCESS, ctx);
        CHECK_STATUS(clmla_cache_seq_fork(cache, p, &c), CLMLA_SUCCESS, ctx);

        /* Both decode in one step, the child first: each writes into the shared third block. */
        snprintf(what, sizeof(what), "%s step after the fork", pn);
        fl_entry s1[2] = {{c, 2, xc + (size_t)9 * D, &rc, 9}, {p, 1, xp + (size_t)9 * D, &rp, 9}};
        CHECK_STATUS(fl_step(layer, cache, L, path, s1, 2, D, what), CLMLA_SUCCESS, ctx);
        fl_check_cache(cache, L, p, &rp, TP, rkv, dr, what);
        fl_check_cache(cache, L, c, &rc, 11, rkv, dr, what);

        /* The parent truncated to 6 tokens: into block 1, whose rows 4..7 the child still reads. */
        CHECK_STATUS(clmla_cache_seq_truncate(cache, p, 6), CLMLA_SUCCESS, ctx);
        snprintf(what, sizeof(what), "%s step after the truncate", pn);
        fl_entry s2[2] = {{p, 2, xq + (size_t)6 * D, &rq, 6}, {c, 2, xc + (size_t)11 * D, &rc, 11}};
        CHECK_STATUS(fl_step(layer, cache, L, path, s2, 2, D, what), CLMLA_SUCCESS, ctx);
        fl_check_cache(cache, L, p, &rq, TQ, rkv, dr, what);
        fl_check_cache(cache, L, c, &rc, TC, rkv, dr, what);

        /* A fork of the child (13 tokens: its last block partly filled) in a full pool. */
        CHECK_STATUS(clmla_cache_seq_fork(cache, c, &d), CLMLA_SUCCESS, ctx);
        clmla_cache_seq_add(cache, &filler);
        clmla_cache_info info;
        clmla_cache_get_info(cache, &info);
        CHECK_STATUS(clmla_cache_seq_reserve(cache, filler, info.blocks_free * bt), CLMLA_SUCCESS, ctx);
        cache_state before = cs_take(cache);
        snprintf(what, sizeof(what), "%s step in a full pool", pn);
        fl_entry s3 = {d, 1, xc + (size_t)12 * D, &rc, 13};
        CHECK_STATUS(fl_step(layer, cache, L, path, &s3, 1, D, what), CLMLA_ERROR_CACHE_FULL, ctx);
        CHECK(cs_same(&before, cache), "%s: CACHE_FULL changed the cache", what);
        fl_check_cache(cache, L, d, &rc, TC, rkv, dr, what);
        fl_check_cache(cache, L, c, &rc, TC, rkv, dr, what);
        clmla_cache_destroy(cache);
    }
    tu_ref_run_free(&rp);
    tu_ref_run_free(&rc);
    tu_ref_run_free(&rq);
    free(xp);
    free(xc);
    free(xq);
    clmla_layer_destroy(layer);
    tu_weights_free(&w);
}

/* Forks of unknown sequences and with NULL arguments: the documented status, *new_seq -1, and
   nothing changes. */
static void test_fork_bad_arguments(void)
{
    share_model m;
    if (sm_create(&m, "fork bad args", 3, 16, 4, 4, 8, CLMLA_CACHE_F32, 97))
        return;
    int s = sm_add(&m), f = sm_add(&m);
    sm_append_all(&m, s, 6);
    const int32_t id = m.seqs[s].id, freed = m.seqs[f].id;
    sm_free(&m, f);
    cache_state before = cs_take(m.cache);
    const int32_t unknown[] = {freed, 99, -1, INT32_MAX};
    for (int u = 0; u < 4; u++) {
        int32_t out = 5;
        CHECK_STATUS(clmla_cache_seq_fork(m.cache, unknown[u], &out), CLMLA_ERROR_UNKNOWN_SEQUENCE, ctx);
        CHECK(out == -1, "fork of unknown sequence %d: *new_seq %d", (int)unknown[u], (int)out);
    }
    int32_t out = 5;
    CHECK_STATUS(clmla_cache_seq_fork(NULL, id, &out), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK(out == -1, "fork with a NULL cache: *new_seq %d", (int)out);
    CHECK_STATUS(clmla_cache_seq_fork(m.cache, id, NULL), CLMLA_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(cs_same(&before, m.cache), "bad forks changed the cache");
    sm_verify(&m);
    sm_destroy(&m);
}

int main(int argc, char **argv)
{
    static const tu_part parts[] = {{"create", test_create_and_info}, {"append", test_append_read},       {"full", test_cache_full},
                 {"reuse", test_free_reuse},       {"random", test_many_sequences}, {"bad-args", test_bad_arguments},
                 {"truncate", test_truncate},      {"fork", test_fork},             {"fork-chain", test_fork_chain},
                 {"fork-full", test_fork_full},    {"fork-step", test_fork_step},   {"fork-faults", test_fork_faults},
                 {"fork-random", test_fork_random}, {"fork-layer", test_fork_layer}, {"fork-args", test_fork_bad_arguments}};
    return tu_parts_exit(
        tu_run_parts(argc, argv, parts, (int)(sizeof(parts) / sizeof(parts[0])), NULL, &ctx, &check_failed));
}
