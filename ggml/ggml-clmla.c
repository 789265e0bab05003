/* libggml-clmla: a ggml backend (GGML_BACKEND_DL, loaded with ggml_backend_load() or
   GGML_BACKEND_PATH) that runs llama.cpp's MLA flash attention, GGML_OP_FLASH_ATTN_EXT with V a
   view of K's first values, through clmla_paged_attention on the OpenCL device clmla's default
   device spec picks (CLMLA_DEVICE). Its device is an ACCEL device over host memory (the CPU buffer
   type): the scheduler gives it the FA nodes whose sources are in host buffers, and every other op
   stays on the CPU. What it does not compute exactly is declined in supports_op. Built against the
   ggml of a llama.cpp tree (CLMLA_GGML_SOURCE; docs/LLAMA_CPP.md). */
#include "ggml-backend-impl.h"
#include "ggml-impl.h"
#include "ggml.h"

#include "clmla.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLMLA_GGML_NAME "CLMLA"
#define CLMLA_GGML_MAX_LAYOUTS 16

typedef struct clmla_ggml_device {
    clmla_context *ctx; /* NULL: the device failed to open (init_error says why) */
    char description[256];
    char init_error[512];
    /* clmla_paged objects by layout (rkv, dr, block size, dtype) */
    clmla_paged *paged[CLMLA_GGML_MAX_LAYOUTS];
    clmla_paged_config layout[CLMLA_GGML_MAX_LAYOUTS];
    int layouts;
    /* host scratch of a call: the queries, tables, mask rows and outputs gathered or scattered */
    void *scratch;
    size_t scratch_bytes;
    /* and of the rows a sparse mask leaves, gathered (fa_compute) */
    void *gather;
    size_t gather_bytes;
    /* what the backend ran, logged when the backend is freed: nodes, their query rows, and the
       nodes whose tokens each read their own range of keys (per_token_ranges) */
    uint64_t nodes, query_rows, ranged;
    /* FLASH_ATTN_EXT over fewer KV rows is declined (left to the CPU backend, whose cost per node
       is lower): CLMLA_GGML_MIN_KV, else CLMLA_GGML_CPU_MIN_KV on a CPU device, 0 on others */
    int min_kv;
} clmla_ggml_device;

/* The default of min_kv on a CPU device: over fewer KV rows (the first tokens of a generation) the
   call's fixed cost is more than the CPU backend's whole node (docs/LLAMA_CPP.md). */
#define CLMLA_GGML_CPU_MIN_KV 512

static clmla_ggml_device g_device;
static struct ggml_backend_device g_dev;
static struct ggml_backend_reg g_reg;

/* ---- the op ---------------------------------------------------------------------------------- */

/* The FA node's shape as clmla takes it. */
typedef struct fa_shape {
    int rkv, dr;    /* V's width and K's beyond it */
    int kv, tokens; /* keys per KV head and sequence, query tokens */
    int q_heads, kv_heads, per_kv, seqs;
    int block; /* clmla's block size: kv where each (KV head, sequence) slice of K
                  is whole rows from a multiple of kv rows, else 1 (a row a block,
                  K's keys at any multiple of a row apart: permuted caches) */
    clmla_cache_dtype dtype;
    size_t row_bytes;
    const struct ggml_tensor *q, *k, *v, *mask, *dst;
} fa_shape;

static int is_view_of_k(const struct ggml_tensor *v, const struct ggml_tensor *k)
{
    const struct ggml_tensor *vs = v->view_src, *ks = k->view_src ? k->view_src : k;
    if (!vs || vs != ks)
        return 0;
    const size_t koffs = k->view_src ? k->view_offs : 0;
    return v->view_offs == koffs && v->type == k->type && v->nb[1] == k->nb[1] && v->nb[2] == k->nb[2] &&
           v->nb[3] == k->nb[3] && v->ne[1] == k->ne[1] && v->ne[2] == k->ne[2] && v->ne[3] == k->ne[3];
}

/* 1 when clmla computes the node exactly as ggml's CPU backend defines it; *s * filled. */
static int fa_shape_of(const struct ggml_tensor *op, fa_shape *s)
{
    if (op->op != GGML_OP_FLASH_ATTN_EXT)
        return 0;
    const struct ggml_tensor *q = op->src[0], *k = op->src[1], *v = op->src[2], *mask = op->src[3];
    float params[3];
    memcpy(params, op->op_params, sizeof(params));
    if (op->src[4] || params[1] != 0.0f || params[2] != 0.0f) /* sinks, ALiBi, softcap */
        return 0;
    if (!q || !k || !v || q->type != GGML_TYPE_F32 || op->type != GGML_TYPE_F32 ||
        (k->type != GGML_TYPE_F16 && k->type != GGML_TYPE_F32) || !is_view_of_k(v, k))
        return 0;
    const size_t elt = ggml_type_size(k->type);
    if (v->ne[0] < 1 || k->ne[0] <= v->ne[0] || (k->ne[0] - v->ne[0]) % 2 || k->nb[0] != elt || q->ne[0] != k->ne[0] ||
        q->nb[0] != sizeof(float))
        return 0;
    if (q->ne[2] % k->ne[2] || q->ne[3] != k->ne[3] || !ggml_is_contiguous(op))
        return 0;
    /* K's rows at multiples of a row from K's start: a block a slice of kv rows where they are
       contiguous and every slice starts at a multiple of kv rows, else a block a row */
    const size_t row = (size_t)k->ne[0] * elt, slice = (size_t)k->ne[1] * row;
    if (k->nb[1] % row || (k->ne[2] > 1 && k->nb[2] % row) || (k->ne[3] > 1 && k->nb[3] % row))
        return 0;
    s->block = k->nb[1] == row && (k->ne[2] == 1 || k->nb[2] % slice == 0) && (k->ne[3] == 1 || k->nb[3] % slice == 0)
                   ? (int)k->ne[1]
                   : 1;
    if (mask && (mask->type != GGML_TYPE_F16 || !ggml_is_contiguous(mask) || mask->ne[0] < k->ne[1] ||
                 mask->ne[1] < q->ne[1] || mask->ne[2] != 1 || q->ne[3] % mask->ne[3]))
        return 0;
    if (k->ne[1] < 1 || k->ne[1] > (1 << 24) || q->ne[1] < 1)
        return 0;
    s->rkv = (int)v->ne[0];
    s->dr = (int)(k->ne[0] - v->ne[0]);
    s->kv = (int)k->ne[1];
    s->tokens = (int)q->ne[1];
    s->q_heads = (int)q->ne[2];
    s->kv_heads = (int)k->ne[2];
    s->per_kv = s->q_heads / s->kv_heads;
    s->seqs = (int)q->ne[3];
    s->dtype = k->type == GGML_TYPE_F16 ? CLMLA_CACHE_F16 : CLMLA_CACHE_F32;
    s->row_bytes = row;
    s->q = q;
    s->k = k;
    s->v = v;
    s->mask = mask;
    s->dst = op;
    return 1;
}

static clmla_paged *paged_for(clmla_ggml_device *d, const fa_shape *s)
{
    for (int i = 0; i < d->layouts; i++) {
        const clmla_paged_config *c = &d->layout[i];
        if (c->kv_lora_rank == s->rkv && c->rope_dim == s->dr && c->block_size == s->block && c->dtype == s->dtype)
            return d->paged[i];
    }
    if (d->layouts == CLMLA_GGML_MAX_LAYOUTS) { /* forget the oldest */
        clmla_paged_destroy(d->paged[0]);
        memmove(d->paged, d->paged + 1, sizeof(d->paged[0]) * (CLMLA_GGML_MAX_LAYOUTS - 1));
        memmove(d->layout, d->layout + 1, sizeof(d->layout[0]) * (CLMLA_GGML_MAX_LAYOUTS - 1));
        d->layouts--;
    }
    clmla_paged_config c = {.kv_lora_rank = s->rkv, .rope_dim = s->dr, .block_size = s->block, .dtype = s->dtype};
    clmla_paged *p = NULL;
    if (clmla_paged_create(d->ctx, &c, &p) != CLMLA_SUCCESS) {
        fprintf(stderr, "ggml-clmla: %s\n", clmla_last_error(d->ctx));
        return NULL;
    }
    d->layout[d->layouts] = c;
    d->paged[d->layouts++] = p;
    return p;
}

/* The host scratch, at SCRATCH_ALIGN bytes (a multiple of any device's base address alignment), its
   parts at multiples of it, so that clmla uses them in place where the device shares memory. */
#define SCRATCH_ALIGN 4096

static void *grow(void **mem, size_t *have, size_t bytes)
{
    if (bytes > *have) {
        void *p = aligned_alloc(SCRATCH_ALIGN, bytes);
        if (!p)
            return NULL;
        free(*mem);
        *mem = p;
        *have = bytes;
    }
    return *mem;
}

static void *scratch(clmla_ggml_device *d, size_t bytes)
{
    return grow(&d->scratch, &d->scratch_bytes, bytes);
}

#define HALF_NEG_INF 0xFC00u

static size_t up_align(size_t n)
{
    return (n + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

/* K as clmla takes it: from the last multiple of the device's alignment at or before K's data that
   is still in K's ggml buffer, so that clmla uses the memory in place where K itself is not aligned
   (llama.cpp's KV cache in a CPU buffer, 32-byte aligned); else from K's data. */
static void kv_region(clmla_paged *p, const struct ggml_tensor *k, size_t need, clmla_buffer *b)
{
    char *data = k->data;
    b->host = data;
    b->offset = 0;
    b->bytes = need;
    clmla_paged_info info;
    const struct ggml_tensor *owner = k->view_src ? k->view_src : k;
    if (!owner->buffer || clmla_paged_get_info(p, &info) != CLMLA_SUCCESS || !info.host_alignment)
        return;
    char *base = ggml_backend_buffer_get_base(owner->buffer);
    const size_t size = ggml_backend_buffer_get_size(owner->buffer);
    if (data < base || data + need > base + size)
        return;
    char *start = data - (uintptr_t)data % info.host_alignment;
    if (start < base || (size_t)(data - start) % 16)
        return;
    b->host = start;
    b->offset = (size_t)(data - start);
    b->bytes = (size_t)(base + size - data);
}

static int key_live(const uint16_t *mb, int b, int T, int kv, int j)
{
    for (int t = 0; t < T; t++)
        if (mb[((size_t)b * T + t) * kv + j] != HALF_NEG_INF)
            return 1;
    return 0;
}

/* Where the mask leaves few keys, scattered over the slices (llama.cpp's n_kv_max selections), the
   rows it leaves are gathered into the backend's scratch with their mask values, a row a block:
   the call reads those rows instead of every row of the slices. Taken where no slice keeps more
   than a quarter of the keys it would read (lens: each slice's, cut at its last live key); the
   call's arguments are changed to the gathered ones, else left as they are. */
static enum ggml_status gather_live(clmla_ggml_device *d, const fa_shape *s, const uint16_t *mb, int32_t *lens,
                                    clmla_paged **call, clmla_buffer *kv, int32_t **table, int *blocks,
                                    int *max_blocks, const uint16_t **mask, int *stride)
{
    const int B = s->seqs * s->kv_heads, T = s->tokens;
    int keep = 0, span = 0;
    for (int b = 0; b < B; b++) {
        int n = 0;
        for (int j = 0; j < lens[b]; j++)
            n += key_live(mb, b, T, s->kv, j);
        keep = n > keep ? n : keep;
        span = lens[b] > span ? lens[b] : span;
    }
    if (span < 256 || keep < 1 || 4 * keep > span)
        return GGML_STATUS_SUCCESS;
    fa_shape rows = *s;
    rows.block = 1;
    clmla_paged *p = paged_for(d, &rows);
    if (!p)
        return GGML_STATUS_FAILED;
    const size_t kbytes = (size_t)B * keep * s->row_bytes, mbytes = (size_t)B * T * keep * 2,
                 tbytes = (size_t)B * keep * 4;
    char *g = grow(&d->gather, &d->gather_bytes, up_align(kbytes) + up_align(mbytes) + up_align(tbytes));
    if (!g)
        return GGML_STATUS_ALLOC_FAILED;
    uint16_t *gm = (uint16_t *)(g + up_align(kbytes));
    int32_t *gt = (int32_t *)(g + up_align(kbytes) + up_align(mbytes));
    const struct ggml_tensor *k = s->k;
    for (int seq = 0; seq < s->seqs; seq++)
        for (int h = 0; h < s->kv_heads; h++) {
            const int b = seq * s->kv_heads + h;
            int n = 0;
            for (int j = 0; j < lens[b]; j++) {
                if (!key_live(mb, b, T, s->kv, j))
                    continue;
                memcpy(g + ((size_t)b * keep + n) * s->row_bytes,
                       (const char *)k->data + (size_t)h * k->nb[2] + (size_t)seq * k->nb[3] + (size_t)j * k->nb[1],
                       s->row_bytes);
                for (int t = 0; t < T; t++)
                    gm[((size_t)b * T + t) * keep + n] = mb[((size_t)b * T + t) * s->kv + j];
                n++;
            }
            /* the rest of the slice's blocks: zero rows, no key */
            memset(g + ((size_t)b * keep + n) * s->row_bytes, 0, (size_t)(keep - n) * s->row_bytes);
            for (int t = 0; t < T; t++)
                for (int x = n; x < keep; x++)
                    gm[((size_t)b * T + t) * keep + x] = HALF_NEG_INF;
            for (int x = 0; x < keep; x++)
                gt[(size_t)b * keep + x] = b * keep + x;
            lens[b] = n;
        }
    *call = p;
    kv->mem = NULL;
    kv->host = g;
    kv->offset = 0;
    kv->bytes = kbytes;
    *table = gt;
    *blocks = B * keep;
    *max_blocks = keep;
    *mask = gm;
    *stride = keep;
    return GGML_STATUS_SUCCESS;
}

/* Where each query token's live keys end at its own place, as in llama.cpp's causal masks (token t
   of a slice sees the keys up to depth + t), the call is made causal: token t reads keys 0 ..
   reach - T + t, reach the least length that still gives every token all its live keys (reach[b]:
   the most, over the slice's tokens, of the token's live keys plus the tokens after it), instead of
   every token reading up to the slice's last live key (lens). Taken when it reads fewer keys in all
   and every slice has a live key; lens then become the reaches. Returns 1 when taken. */
static int per_token_ranges(const fa_shape *s, int32_t *lens, const int32_t *reach, const int *any_live)
{
    const int B = s->seqs * s->kv_heads, T = s->tokens;
    if (T < 2)
        return 0;
    double flat = 0, ranged = 0;
    for (int b = 0; b < B; b++) {
        if (!any_live[b] || reach[b] > s->kv)
            return 0;
        flat += (double)T * lens[b];
        for (int t = 0; t < T; t++) {
            const int n = reach[b] - T + 1 + t;
            ranged += n > 0 ? n : 0;
        }
    }
    if (ranged >= flat)
        return 0;
    for (int b = 0; b < B; b++)
        lens[b] = reach[b];
    return 1;
}

/* One FA node: batch B = sequences x KV heads, each one block of K (its slice), its query heads'
   tokens gathered from q, the mask's rows per sequence and token, the output scattered into dst. */
static enum ggml_status fa_compute(clmla_ggml_device *d, const fa_shape *s)
{
    clmla_paged *p = paged_for(d, s);
    if (!p)
        return GGML_STATUS_FAILED;
    const int B = s->seqs * s->kv_heads, T = s->tokens, H = s->per_kv, row = s->rkv + s->dr;
    const size_t q_bytes = (size_t)B * T * H * row * 4, out_bytes = (size_t)B * T * H * s->rkv * 4;
    const size_t mask_bytes = s->mask ? (size_t)B * T * s->kv * 2 : 0;
    const int max_blocks = s->kv / s->block;
    const size_t tables = (size_t)B * max_blocks * 4, lens_bytes = (size_t)B * 4;
    char *base = scratch(d, up_align(q_bytes) + up_align(out_bytes) + up_align(mask_bytes) + up_align(tables) +
                                3 * up_align(lens_bytes));
    if (!base)
        return GGML_STATUS_ALLOC_FAILED;
    float *qb = (float *)base, *ob = (float *)(base + up_align(q_bytes));
    uint16_t *mb = (uint16_t *)(base + up_align(q_bytes) + up_align(out_bytes));
    int32_t *table = (int32_t *)(base + up_align(q_bytes) + up_align(out_bytes) + up_align(mask_bytes));
    int32_t *lens = (int32_t *)((char *)table + up_align(tables));
    int32_t *reach = (int32_t *)((char *)lens + up_align(lens_bytes)); /* per_token_ranges' */
    int *any_live = (int *)((char *)reach + up_align(lens_bytes));
    const size_t block = (size_t)s->block * s->row_bytes;
    const struct ggml_tensor *q = s->q, *k = s->k, *m = s->mask;
    int32_t most = 0;
    for (int seq = 0; seq < s->seqs; seq++)
        for (int h = 0; h < s->kv_heads; h++) {
            const int b = seq * s->kv_heads + h;
            for (int j = 0; j < max_blocks; j++) { /* block j of the slice: its first row's */
                const size_t at = (size_t)h * k->nb[2] + (size_t)seq * k->nb[3] + (size_t)j * s->block * k->nb[1];
                table[(size_t)b * max_blocks + j] = (int32_t)(at / block);
                most = table[(size_t)b * max_blocks + j] > most ? table[(size_t)b * max_blocks + j] : most;
            }
            lens[b] = s->kv;
            int live = 0;    /* keys up to the last one the mask leaves to some token */
            int32_t far = 0; /* the most of a token's live keys plus the tokens after it */
            for (int t = 0; t < T; t++) {
                for (int r = 0; r < H; r++) {
                    const char *src = (const char *)q->data + (size_t)t * q->nb[1] + (size_t)(h * H + r) * q->nb[2] +
                                      (size_t)seq * q->nb[3];
                    memcpy(qb + (((size_t)b * T + t) * H + r) * row, src, (size_t)row * 4);
                }
                if (m) {
                    const char *mrow =
                        (const char *)m->data + (size_t)t * m->nb[1] + (size_t)(seq % m->ne[3]) * m->nb[3];
                    uint16_t *to = mb + ((size_t)b * T + t) * s->kv;
                    memcpy(to, mrow, (size_t)s->kv * 2);
                    int j = s->kv;
                    while (j > 0 && to[j - 1] == HALF_NEG_INF)
                        j--;
                    live = j > live ? j : live;
                    far = j + (T - 1 - t) > far ? j + (T - 1 - t) : far;
                }
            }
            reach[b] = far;
            any_live[b] = live > 0;
            /* keys past the last live one add nothing: the call stops there (where none is live, it
               reads them all, as ggml does) */
            if (m && live > 0)
                lens[b] = live;
        }
    /* the call over K's slices as they are, or over the rows a sparse mask leaves */
    clmla_paged *call = p;
    clmla_buffer kv;
    memset(&kv, 0, sizeof(kv));
    kv_region(p, k, (size_t)(most + 1) * block, &kv);
    int32_t *call_table = table;
    int call_blocks = most + 1, call_max_blocks = max_blocks, call_stride = s->kv;
    const uint16_t *call_mask = mb;
    if (m) {
        const enum ggml_status st = gather_live(d, s, mb, lens, &call, &kv, &call_table, &call_blocks, &call_max_blocks,
                                                &call_mask, &call_stride);
        if (st != GGML_STATUS_SUCCESS)
            return st;
    }
    const int causal = m && call == p && per_token_ranges(s, lens, reach, any_live);
    clmla_paged_attention_args a;
    memset(&a, 0, sizeof(a));
    a.batch = B;
    a.seqlen_q = T;
    a.num_heads = H;
    a.causal = causal;
    memcpy(&a.softmax_scale, s->dst->op_params, sizeof(float));
    a.q.host = qb;
    a.q.bytes = q_bytes;
    a.kv_cache = kv;
    a.num_blocks = call_blocks;
    a.block_table.host = call_table;
    a.block_table.bytes = (size_t)B * call_max_blocks * 4;
    a.max_blocks = call_max_blocks;
    a.cache_seqlens.host = lens;
    a.cache_seqlens.bytes = lens_bytes;
    a.out.host = ob;
    a.out.bytes = out_bytes;
    if (m) {
        a.mask.host = (void *)call_mask;
        a.mask.bytes = (size_t)B * T * call_stride * 2;
        a.mask_stride = call_stride;
    }
    if (clmla_paged_attention(call, &a, NULL) != CLMLA_SUCCESS) {
        fprintf(stderr, "ggml-clmla: %s\n", clmla_last_error(d->ctx));
        return GGML_STATUS_FAILED;
    }
    d->nodes++;
    d->ranged += causal;
    d->query_rows += (uint64_t)s->seqs * T * s->q_heads;
    /* dst [rkv, q_heads, tokens, seqs] */
    const struct ggml_tensor *dst = s->dst;
    for (int seq = 0; seq < s->seqs; seq++)
        for (int h = 0; h < s->kv_heads; h++)
            for (int t = 0; t < T; t++)
                for (int r = 0; r < H; r++) {
                    const int b = seq * s->kv_heads + h;
                    char *to = (char *)dst->data + (size_t)(h * H + r) * dst->nb[1] + (size_t)t * dst->nb[2] +
                               (size_t)seq * dst->nb[3];
                    memcpy(to, ob + (((size_t)b * T + t) * H + r) * s->rkv, (size_t)s->rkv * 4);
                }
    return GGML_STATUS_SUCCESS;
}

/* ---- backend --------------------------------------------------------------------------------- */

static const char *backend_name(ggml_backend_t backend)
{
    (void)backend;
    return CLMLA_GGML_NAME;
}

/* One line on what the backend computed: the FA nodes, and how clmla took K (in place or copied). */
static void backend_free(ggml_backend_t backend)
{
    clmla_ggml_device *d = backend->context;
    uint64_t wrapped = 0, copied = 0, copied_bytes = 0;
    for (int i = 0; i < d->layouts; i++) {
        clmla_paged_info info;
        if (clmla_paged_get_info(d->paged[i], &info) == CLMLA_SUCCESS) {
            wrapped += info.host_wrapped;
            copied += info.host_copied;
            copied_bytes += info.host_copied_bytes;
        }
    }
    if (d->nodes)
        GGML_LOG_INFO("%s: so far computed %llu FLASH_ATTN_EXT nodes (%llu query "
                      "rows, %llu nodes with a key range per token); host regions used in place %llu, "
                      "copied %llu (%.1f MiB)\n",
                      CLMLA_GGML_NAME, (unsigned long long)d->nodes, (unsigned long long)d->query_rows,
                      (unsigned long long)d->ranged,
                      (unsigned long long)wrapped, (unsigned long long)copied, copied_bytes / 1048576.0);
    free(backend);
}

static int empty_op(enum ggml_op op)
{
    return op == GGML_OP_NONE || op == GGML_OP_RESHAPE || op == GGML_OP_VIEW || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

static enum ggml_status backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph *graph)
{
    clmla_ggml_device *d = backend->context;
    for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
        struct ggml_tensor *node = ggml_graph_node(graph, i);
        if (empty_op(node->op))
            continue;
        fa_shape s;
        if (!fa_shape_of(node, &s)) {
            fprintf(stderr, "ggml-clmla: node %s (%s) is not an op this backend runs\n", node->name,
                    ggml_op_name(node->op));
            return GGML_STATUS_FAILED;
        }
        const enum ggml_status st = fa_compute(d, &s);
        if (st != GGML_STATUS_SUCCESS)
            return st;
    }
    return GGML_STATUS_SUCCESS;
}

static const struct ggml_backend_i backend_iface = {
    .get_name = backend_name,
    .free = backend_free,
    .graph_compute = backend_graph_compute,
};

static ggml_guid_t backend_guid(void)
{
    static ggml_guid guid = {0x63, 0x6c, 0x6d, 0x6c, 0x61, 0x2d, 0x67, 0x67,
                             0x6d, 0x6c, 0x2d, 0x62, 0x61, 0x63, 0x6b, 0x31};
    return &guid;
}

/* ---- device ---------------------------------------------------------------------------------- */

static const char *dev_name(ggml_backend_dev_t dev)
{
    (void)dev;
    return CLMLA_GGML_NAME;
}

static const char *dev_description(ggml_backend_dev_t dev)
{
    return ((clmla_ggml_device *)dev->context)->description;
}

static void dev_memory(ggml_backend_dev_t dev, size_t *free_bytes, size_t *total)
{
    clmla_ggml_device *d = dev->context;
    clmla_device_info info;
    memset(&info, 0, sizeof(info));
    if (d->ctx)
        clmla_context_device(d->ctx, &info);
    *free_bytes = *total = (size_t)info.global_mem_bytes;
}

static enum ggml_backend_dev_type dev_type(ggml_backend_dev_t dev)
{
    (void)dev;
    return GGML_BACKEND_DEVICE_TYPE_ACCEL;
}

static void dev_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props *props)
{
    memset(props, 0, sizeof(*props));
    props->name = dev_name(dev);
    props->description = dev_description(dev);
    dev_memory(dev, &props->memory_free, &props->memory_total);
    props->type = dev_type(dev);
}

static ggml_backend_t dev_init_backend(ggml_backend_dev_t dev, const char *params)
{
    (void)params;
    clmla_ggml_device *d = dev->context;
    if (!d->ctx) {
        fprintf(stderr, "ggml-clmla: %s\n", d->init_error);
        return NULL;
    }
    ggml_backend_t backend = calloc(1, sizeof(*backend));
    if (!backend)
        return NULL;
    backend->guid = backend_guid();
    backend->iface = backend_iface;
    backend->device = dev;
    backend->context = d;
    return backend;
}

/* The CPU's buffer type: ggml's scheduler moves a node to a higher-priority backend whose buffer
   type is the very one of the backend that had it (pass 3 of ggml_backend_sched_split_graph), so
   that llama.cpp's FA nodes, first given to the CPU, come here; K stays where llama.cpp put it. */
static ggml_backend_buffer_type_t dev_buffer_type(ggml_backend_dev_t dev)
{
    (void)dev;
    return ggml_backend_cpu_buffer_type();
}

static bool dev_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor *op)
{
    const clmla_ggml_device *d = dev->context;
    fa_shape s;
    return d->ctx && (empty_op(op->op) || (fa_shape_of(op, &s) && s.kv >= d->min_kv));
}

static bool dev_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft)
{
    (void)dev;
    return ggml_backend_buft_is_host(buft);
}

static bool dev_offload_op(ggml_backend_dev_t dev, const struct ggml_tensor *op)
{
    (void)dev;
    (void)op;
    return false;
}

static const struct ggml_backend_device_i device_iface = {
    .get_name = dev_name,
    .get_description = dev_description,
    .get_memory = dev_memory,
    .get_type = dev_type,
    .get_props = dev_props,
    .init_backend = dev_init_backend,
    .get_buffer_type = dev_buffer_type,
    .supports_op = dev_supports_op,
    .supports_buft = dev_supports_buft,
    .offload_op = dev_offload_op,
};

/* ---- registration ---------------------------------------------------------------------------- */

static const char *reg_name(ggml_backend_reg_t reg)
{
    (void)reg;
    return CLMLA_GGML_NAME;
}

/* No device where clmla opened none: a program then runs as without the backend (llama.cpp starts
   every ACCEL device's backend, and fails where one does not start). */
static size_t reg_device_count(ggml_backend_reg_t reg)
{
    (void)reg;
    return g_device.ctx ? 1 : 0;
}

static ggml_backend_dev_t reg_device(ggml_backend_reg_t reg, size_t index)
{
    (void)reg;
    return index == 0 && g_device.ctx ? &g_dev : NULL;
}

static void *reg_proc_address(ggml_backend_reg_t reg, const char *name)
{
    (void)reg;
    (void)name;
    return NULL;
}

static const struct ggml_backend_reg_i reg_iface = {
    .get_name = reg_name,
    .get_device_count = reg_device_count,
    .get_device = reg_device,
    .get_proc_address = reg_proc_address,
};

/* The registration: the device opens clmla's default device (CLMLA_DEVICE, else the first GPU, else
   the first device); where that fails the backend registers with no device and logs clmla's
   message (which names the devices, or the missing driver). */
static ggml_backend_reg_t clmla_ggml_reg(void)
{
    static int done;
    /* the structs this file reads are the ggml's it was built against: in a program with another
       ggml it does not register (ggml's loader then reports the failure and goes on) */
    if (strcmp(ggml_version(), CLMLA_GGML_BUILT_FOR) != 0) {
        GGML_LOG_ERROR("%s: libggml-clmla was built against ggml %s; this program's ggml is %s, so the backend "
                       "does not register: build it against the same llama.cpp tree (docs/LLAMA_CPP.md)\n",
                       CLMLA_GGML_NAME, CLMLA_GGML_BUILT_FOR, ggml_version());
        return NULL;
    }
    if (!done) {
        done = 1;
        clmla_ggml_device *d = &g_device;
        if (clmla_context_create(NULL, &d->ctx) != CLMLA_SUCCESS) {
            snprintf(d->init_error, sizeof(d->init_error), "no OpenCL device for clmla: %s", clmla_last_error(NULL));
            snprintf(d->description, sizeof(d->description), "clmla (no device)");
            d->ctx = NULL;
            GGML_LOG_WARN("%s: %s; the backend has no device\n", CLMLA_GGML_NAME, d->init_error);
        } else {
            clmla_device_info info;
            clmla_context_device(d->ctx, &info);
            snprintf(d->description, sizeof(d->description), "clmla %s on %s", clmla_version_string(), info.name);
            d->min_kv = info.kind == CLMLA_DEVICE_KIND_CPU ? CLMLA_GGML_CPU_MIN_KV : 0;
            const char *env = getenv("CLMLA_GGML_MIN_KV");
            if (env && *env) {
                char *end = NULL;
                const long v = strtol(env, &end, 10);
                if (*end || v < 0 || v > (1L << 24))
                    GGML_LOG_WARN("%s: CLMLA_GGML_MIN_KV must be a count of KV rows, 0 or more, not \"%s\"; using %d\n",
                                  CLMLA_GGML_NAME, env, d->min_kv);
                else
                    d->min_kv = (int)v;
            }
        }
        g_dev.iface = device_iface;
        g_dev.reg = &g_reg;
        g_dev.context = d;
        g_reg.api_version = GGML_BACKEND_API_VERSION;
        g_reg.iface = reg_iface;
        g_reg.context = NULL;
    }
    return &g_reg;
}

GGML_BACKEND_DL_IMPL(clmla_ggml_reg)
