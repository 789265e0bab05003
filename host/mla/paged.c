/* Attention over a caller's paged cache (include/clmla.h, "attention over a caller's paged cache"):
   the caller's memory resolved into buffers the kernels take (host memory wrapped in place or
   copied), every argument checked before anything is enqueued, the token tables made and checked
   on the device (cl/paged.cl), then the latent attention kernels of a cache shell of the layout
   (attention.c) over the caller's rows. */
#include "attention.h"
#include "clcall.h"
#include "indexer.h"
#include "program.h"
#include "scratch.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct clmla_paged {
    clmla_context *ctx;
    clmla_paged_config config;
    clmla_cache *shell;      /* the layout's kernels (cache.h: a cache without memory) */
    size_t row_bytes;
    cl_kernel tokens_kernel; /* paged_tokens (cl/paged.cl) */
    cl_kernel write_kernel;  /* cache_write_slots (cl/cache_write.cl) */
    cl_mem status;           /* one int32: CLMLA_PAGED_BAD_* since the last reset */
    cl_mem identity;         /* [identity_blocks] int32 0, 1, 2, ..: the table of slot-indexed sparse calls */
    int identity_blocks;
    size_t host_alignment;
    int host_unified;
    uint64_t wrapped, copied, copied_bytes;
};

clmla_status clmla_paged_create(clmla_context *ctx, const clmla_paged_config *config, clmla_paged **out)
{
    if (!out)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_paged_create: NULL output pointer");
    *out = NULL;
    if (!ctx || !config)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_paged_create: NULL argument");
    if (config->block_size < 1)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_paged_create: block_size %d is not >= 1",
                          config->block_size);
    clmla_paged *p = calloc(1, sizeof(*p));
    if (!p)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_paged_create: out of host memory");
    p->ctx = ctx;
    p->config = *config;
    /* the cache's own checks of the layout (rank, rope dims, dtype), and its kernels */
    const clmla_cache_config cc = {.num_layers = 1, .kv_lora_rank = config->kv_lora_rank, .rope_dim = config->rope_dim,
                                   .block_tokens = config->block_size, .num_blocks = 1, .dtype = config->dtype,
                                   .index_head_dim = config->index_head_dim, .index_dtype = config->index_dtype};
    clmla_status st = clmla_cache_create_shell(ctx, &cc, &p->shell);
    if (st == CLMLA_SUCCESS) {
        p->row_bytes = p->shell->row_bytes;
        st = clmla_kernel_create(ctx, "paged", "", "paged_tokens", &p->tokens_kernel);
    }
    if (st == CLMLA_SUCCESS)
        st = clmla_kernel_create(ctx, "cache_write", p->shell->options, "cache_write_slots", &p->write_kernel);
    if (st == CLMLA_SUCCESS) {
        cl_int err = CL_SUCCESS, zero = 0;
        p->status = clmla_cl_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof(cl_int), &zero, &err);
        if (!p->status)
            st = clmla_fail_cl(ctx, err, "clmla_paged_create: the status buffer");
    }
    if (st == CLMLA_SUCCESS) {
        cl_uint bits = 0;
        cl_bool unified = CL_FALSE;
        if (clGetDeviceInfo(ctx->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof(bits), &bits, NULL) != CL_SUCCESS ||
            bits < 8)
            bits = 1024;
        if (clGetDeviceInfo(ctx->device, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof(unified), &unified, NULL) != CL_SUCCESS)
            unified = CL_FALSE;
        p->host_alignment = bits / 8;
        p->host_unified = unified == CL_TRUE;
    }
    if (st != CLMLA_SUCCESS) {
        clmla_paged_destroy(p);
        return st;
    }
    *out = p;
    return CLMLA_SUCCESS;
}

void clmla_paged_destroy(clmla_paged *p)
{
    if (!p)
        return;
    clFinish(p->ctx->queue);
    clmla_cache_destroy(p->shell);
    clmla_release_kernel(p->tokens_kernel);
    clmla_release_kernel(p->write_kernel);
    clmla_release_mem(p->status);
    clmla_release_mem(p->identity);
    free(p);
}

clmla_status clmla_paged_get_info(const clmla_paged *p, clmla_paged_info *info)
{
    if (!p || !info)
        return clmla_fail(p ? p->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_paged_get_info: NULL argument");
    memset(info, 0, sizeof(*info));
    info->row_bytes = p->row_bytes;
    info->block_bytes = p->row_bytes * (size_t)p->config.block_size;
    info->index_block_bytes = p->shell->index_row_bytes * (size_t)p->config.block_size;
    info->host_alignment = p->host_alignment;
    info->host_unified = p->host_unified;
    info->host_wrapped = p->wrapped;
    info->host_copied = p->copied;
    info->host_copied_bytes = p->copied_bytes;
    return CLMLA_SUCCESS;
}

clmla_status clmla_paged_status(clmla_paged *p, int reset, uint32_t *flags)
{
    if (!p || !flags)
        return clmla_fail(p ? p->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_paged_status: NULL argument");
    cl_int value = 0;
    cl_int err = clmla_cl_read(p->ctx, p->status, 0, sizeof(value), &value);
    if (err == CL_SUCCESS && reset && value) {
        const cl_int zero = 0;
        err = clmla_cl_write(p->ctx, p->status, 0, sizeof(zero), &zero);
    }
    if (err != CL_SUCCESS)
        return clmla_fail_cl(p->ctx, err, "clmla_paged_status: reading the status");
    *flags = (uint32_t)value;
    return CLMLA_SUCCESS;
}

/* ---- the caller's memory ---------------------------------------------------------------------- */

/* One argument of a call, once resolved: the buffer the kernels get and the byte offset into it. */
typedef struct pbuf {
    const char *name;
    const clmla_buffer *given;
    size_t need;      /* bytes the call reads or writes from the start */
    int writes;       /* the call writes it */
    int reads;        /* the call reads it (all but the outputs; a cache it writes rows of, too) */
    int whole;        /* the kernel takes no offset: a device buffer at an offset gets a sub-buffer */
    int shifts;       /* the kernel takes an offset of a multiple of PAGED_SHIFT_ALIGN bytes (the
                         cache of clmla_paged_attention): no sub-buffer, and host memory at such an
                         offset from an aligned `host` is used in place */
    size_t unit;      /* bytes of its elements, which its offset is counted in (the cache: 1) */
    cl_mem mem;       /* for the kernels */
    size_t offset;    /* bytes into mem */
    int owned;        /* mem was made by the call */
    int copied;       /* host memory copied to mem (and back when written) */
} pbuf;

#define PAGED_MAX_BUFFERS 8
#define PAGED_SHIFT_ALIGN 16

typedef struct pcall {
    clmla_paged *p;
    const char *fn;
    int count;
    pbuf b[PAGED_MAX_BUFFERS];
} pcall;

static pbuf *arg(pcall *c, const char *name, const clmla_buffer *given, size_t need, int writes, int whole)
{
    pbuf *b = &c->b[c->count++];
    memset(b, 0, sizeof(*b));
    b->name = name;
    b->given = given;
    b->need = need;
    b->writes = writes;
    b->reads = !writes;
    b->whole = whole;
    b->unit = whole ? 1 : 4;
    return b;
}

/* Checks an argument without changing anything: a buffer of this context long enough, or host
   memory of enough bytes, at an offset aligned to its elements (b->unit bytes). */
static clmla_status check_buffer(pcall *c, const pbuf *b)
{
    clmla_context *ctx = c->p->ctx;
    const size_t unit = b->unit;
    const clmla_buffer *g = b->given;
    if (g->mem && g->host)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s gives both a device buffer and host memory", c->fn,
                          b->name);
    if (!g->mem && !g->host)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s is missing (no device buffer, no host memory)",
                          c->fn, b->name);
    if (g->offset % unit)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s's offset %zu is not a multiple of its %zu-byte elements",
                          c->fn, b->name, g->offset, unit);
    if (b->shifts && g->offset % PAGED_SHIFT_ALIGN)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s's offset %zu is not a multiple of %d bytes", c->fn,
                          b->name, g->offset, PAGED_SHIFT_ALIGN);
    if (g->host) {
        if ((uintptr_t)((const char *)g->host + g->offset) % unit)
            return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                              "%s: %s's host memory is not aligned to its %zu-byte elements", c->fn, b->name, unit);
        if (g->bytes < b->need)
            return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s holds %zu bytes, the call needs %zu", c->fn,
                              b->name, g->bytes, b->need);
        return CLMLA_SUCCESS;
    }
    size_t size = 0;
    cl_context owner = NULL;
    if (clGetMemObjectInfo(g->mem, CL_MEM_SIZE, sizeof(size), &size, NULL) != CL_SUCCESS ||
        clGetMemObjectInfo(g->mem, CL_MEM_CONTEXT, sizeof(owner), &owner, NULL) != CL_SUCCESS)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s is not a valid buffer", c->fn, b->name);
    if (owner != ctx->cl_ctx)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s belongs to another cl_context", c->fn, b->name);
    if (g->offset > size || size - g->offset < b->need)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: %s holds %zu bytes from offset %zu, the call needs %zu", c->fn, b->name,
                          g->offset > size ? (size_t)0 : size - g->offset, g->offset, b->need);
    if (b->whole && !b->shifts && g->offset % c->p->host_alignment)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: %s's offset %zu is not a multiple of the device's base address alignment (%zu bytes)",
                          c->fn, b->name, g->offset, c->p->host_alignment);
    return CLMLA_SUCCESS;
}

/* The buffers the kernels get: device buffers as given (a sub-buffer where the kernel takes no
   offset), host memory wrapped in place where the device shares it and it is aligned, else
   copied. On failure, what was made is released. */
static void release_call(pcall *c)
{
    for (int i = 0; i < c->count; i++)
        if (c->b[i].owned && c->b[i].mem) {
            clReleaseMemObject(c->b[i].mem);
            c->b[i].mem = NULL;
        }
}

static clmla_status materialize(pcall *c)
{
    clmla_paged *p = c->p;
    clmla_context *ctx = p->ctx;
    for (int i = 0; i < c->count; i++) {
        pbuf *b = &c->b[i];
        const clmla_buffer *g = b->given;
        cl_int err = CL_SUCCESS;
        const size_t bytes = b->need ? b->need : 4;
        if (g->mem) {
            b->mem = g->mem;
            b->offset = g->offset;
            if (b->whole && !b->shifts && g->offset) {
                b->mem = clmla_cl_sub_buffer(ctx, g->mem, g->offset, bytes, &err);
                b->offset = 0;
                b->owned = 1;
            }
        } else {
            char *host = (char *)g->host + g->offset;
            const cl_mem_flags access = b->writes ? CL_MEM_READ_WRITE : CL_MEM_READ_ONLY;
            b->offset = 0;
            if (p->host_unified && (uintptr_t)host % p->host_alignment == 0 && b->need) {
                b->mem = clmla_cl_buffer(ctx, access | CL_MEM_USE_HOST_PTR, bytes, host, &err);
                p->wrapped++;
            } else if (p->host_unified && b->shifts && b->need && (uintptr_t)g->host % p->host_alignment == 0 &&
                       g->offset % PAGED_SHIFT_ALIGN == 0) {
                /* from the aligned start the caller gave, the kernel skipping the offset */
                b->mem = clmla_cl_buffer(ctx, access | CL_MEM_USE_HOST_PTR, g->offset + bytes, g->host, &err);
                b->offset = g->offset;
                p->wrapped++;
            } else {
                /* copied in unless the call only writes it (out, lse, the selection) */
                b->mem = clmla_cl_buffer(ctx, access | (b->reads && b->need ? CL_MEM_COPY_HOST_PTR : 0), bytes,
                                         b->reads && b->need ? host : NULL, &err);
                b->copied = 1;
                p->copied++;
                p->copied_bytes += b->need;
            }
            b->owned = 1;
        }
        if (!b->mem) {
            release_call(c);
            return clmla_fail(ctx, err ? err : CLMLA_ERROR_INTERNAL, "%s: a buffer for %s (%zu bytes): %s", c->fn,
                              b->name, bytes, clmla_status_string(err));
        }
    }
    return CLMLA_SUCCESS;
}

/* After the kernels: host memory the call wrote holds the results (wrapped memory mapped, copies
   read back), and the call's own buffers are released. Blocking when any host memory was given. */
static clmla_status finish_call(pcall *c, clmla_status st)
{
    clmla_context *ctx = c->p->ctx;
    int host = 0, maps = 0;
    cl_event mapped[PAGED_MAX_BUFFERS];
    for (int i = 0; i < c->count; i++) {
        pbuf *b = &c->b[i];
        const clmla_buffer *g = b->given;
        if (!g->host || !b->mem)
            continue;
        host = 1;
        if (st != CLMLA_SUCCESS || !b->writes || !b->need)
            continue;
        char *dst = (char *)g->host + g->offset;
        if (b->copied) {
            cl_int err = clmla_cl_read(ctx, b->mem, 0, b->need, dst);
            if (err != CL_SUCCESS)
                st = clmla_fail_cl(ctx, err, "reading back a result into host memory");
            continue;
        }
        /* host memory used in place: a map makes the results visible there; the queue is in order,
           so one wait below covers every map, each checked by its event */
        cl_int err = CL_SUCCESS;
        cl_event ev = NULL;
        void *m = clEnqueueMapBuffer(ctx->queue, b->mem, CL_FALSE, CL_MAP_READ, 0, b->need, 0, NULL, &ev, &err);
        if (!m || err != CL_SUCCESS) {
            st = clmla_fail_cl(ctx, err, "mapping host memory the call wrote");
            if (ev)
                clReleaseEvent(ev);
            continue;
        }
        mapped[maps++] = ev;
        clEnqueueUnmapMemObject(ctx->queue, b->mem, m, 0, NULL, NULL);
    }
    if (host)
        clFinish(ctx->queue);
    for (int i = 0; i < maps; i++) {
        cl_int done = CL_COMPLETE;
        cl_int err = clGetEventInfo(mapped[i], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(done), &done, NULL);
        if ((err != CL_SUCCESS || done < 0) && st == CLMLA_SUCCESS)
            st = clmla_fail_cl(ctx, err != CL_SUCCESS ? err : done, "mapping host memory the call wrote");
        clReleaseEvent(mapped[i]);
    }
    release_call(c);
    return st;
}

/* Entry i of an int32 table given in host memory. */
static int32_t host_int(const pbuf *b, size_t i)
{
    return ((const int32_t *)((const char *)b->given->host + b->given->offset))[i];
}

/* ---- attention ------------------------------------------------------------------------------ */

static clmla_status identity_table(clmla_paged *p, int blocks)
{
    if (p->identity_blocks >= blocks)
        return CLMLA_SUCCESS;
    int32_t *ids = malloc((size_t)blocks * sizeof(int32_t));
    if (!ids)
        return clmla_fail(p->ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "clmla_paged_attention: out of host memory");
    for (int i = 0; i < blocks; i++)
        ids[i] = i;
    cl_int err = CL_SUCCESS;
    cl_mem m = clmla_cl_buffer(p->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (size_t)blocks * sizeof(int32_t), ids, &err);
    free(ids);
    if (!m)
        return clmla_fail_cl(p->ctx, err, "clmla_paged_attention: the table of slot-indexed calls");
    clmla_release_mem(p->identity);
    p->identity = m;
    p->identity_blocks = blocks;
    return CLMLA_SUCCESS;
}

/* What a call's dense rule reads: B sequences' lengths and block tables. */
typedef struct ptables {
    int batch, sq, causal, num_blocks, max_blocks, max_seqlen;
    int slots; /* a sparse call over slots: no tables */
} ptables;

/* The checks of the values that every call over the cache shares (not their memory). */
static clmla_status table_values(const clmla_paged *p, const char *fn, const ptables *t, int heads)
{
    clmla_context *ctx = p->ctx;
    const int bs = p->config.block_size;
    if (t->batch < 1 || t->sq < 1 || heads < 1)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: batch %d, seqlen_q %d and num_heads %d must be >= 1", fn,
                          t->batch, t->sq, heads);
    if (t->causal != 0 && t->causal != 1)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: causal %d is not 0 or 1", fn, t->causal);
    if (t->num_blocks < 1 || (long long)t->num_blocks * bs > INT_MAX)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: num_blocks %d must be >= 1 with num_blocks x block_size (%d) below 2^31", fn, t->num_blocks,
                          bs);
    if (!t->slots && (t->max_blocks < 1 || (long long)t->max_blocks * bs > INT_MAX))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: max_blocks %d must be >= 1 with max_blocks x block_size (%d) below 2^31", fn, t->max_blocks,
                          bs);
    if (!t->slots && (t->max_seqlen < 0 || (long long)t->max_seqlen > (long long)t->max_blocks * bs))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: max_seqlen %d is not in 0..max_blocks %d x block_size %d",
                          fn, t->max_seqlen, t->max_blocks, bs);
    return CLMLA_SUCCESS;
}

static clmla_status attention_values(const clmla_paged *p, const clmla_paged_attention_args *a, const ptables *t,
                                     int sparse)
{
    static const char fn[] = "clmla_paged_attention";
    clmla_context *ctx = p->ctx;
    clmla_status st = table_values(p, fn, t, a->num_heads);
    if (st != CLMLA_SUCCESS)
        return st;
    if (!isfinite(a->softmax_scale))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: softmax_scale %g is not finite", fn, a->softmax_scale);
    if (a->topk < 0 || a->topk > CLMLA_SPARSE_MAX_TOPK)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: topk %d is not in 0..%d", fn, a->topk,
                          CLMLA_SPARSE_MAX_TOPK);
    if (sparse && a->causal)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: causal 1 with topk %d: a sparse call's index lists say which keys each query sees", fn,
                          a->topk);
    const int masked = a->mask.mem || a->mask.host;
    if (masked && sparse)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: a mask with topk %d: a sparse call's index lists say which keys each query sees", fn,
                          a->topk);
    if (masked && (long long)a->mask_stride < (long long)t->max_blocks * p->config.block_size)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: mask_stride %d is less than max_blocks %d x block_size %d", fn, a->mask_stride,
                          t->max_blocks, p->config.block_size);
    if (a->indices_kind != CLMLA_PAGED_INDICES_SLOTS && a->indices_kind != CLMLA_PAGED_INDICES_POSITIONS)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: indices_kind %d is not SLOTS (0) or POSITIONS (1)", fn,
                          (int)a->indices_kind);
    const int rkv = p->config.kv_lora_rank, dr = p->config.rope_dim;
    const long long tokens = (long long)t->batch * t->sq;
    if (tokens * a->num_heads * (rkv + dr) > INT_MAX || (sparse && tokens * a->topk > INT_MAX))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: batch %d x seqlen_q %d x num_heads %d x %d values (or x topk %d) pass 2^31", fn, t->batch,
                          t->sq, a->num_heads, rkv + dr, a->topk);
    return CLMLA_SUCCESS;
}

/* Every argument's memory (check_buffer), in its elements' units. */
static clmla_status check_buffers(pcall *c)
{
    for (int i = 0; i < c->count; i++) {
        const size_t unit = c->b[i].unit;
        clmla_status st = check_buffer(c, &c->b[i]);
        if (st != CLMLA_SUCCESS)
            return st;
        if (unit > 1 && c->b[i].given->offset / unit + c->b[i].need / unit > INT_MAX)
            return clmla_fail(c->p->ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: %s's offset and size pass 2^31 elements",
                              c->fn, c->b[i].name);
    }
    return CLMLA_SUCCESS;
}

/* Lengths and block ids: a device table's offset must be whole rows; in host memory, a length
   outside 0 .. max_blocks x block_size, or a block id outside 0 .. num_blocks - 1 among the blocks
   the sequence's queries read, is refused. *max_ctx: the keys to size the work for (the longest
   host length, else max_seqlen or the table's length). */
static clmla_status check_tables(const clmla_paged *p, const char *fn, const ptables *t, const pbuf *table,
                                 const pbuf *lens, int *max_ctx)
{
    const int bs = p->config.block_size;
    *max_ctx = t->max_seqlen ? t->max_seqlen : t->max_blocks * bs;
    if (table->given->mem && table->given->offset % ((size_t)t->max_blocks * 4))
        return clmla_fail(p->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: block_table's offset %zu is not a multiple of a row (max_blocks %d x 4 bytes)", fn,
                          table->given->offset, t->max_blocks);
    if (!lens->given->host)
        return CLMLA_SUCCESS;
    *max_ctx = 0;
    for (int b = 0; b < t->batch; b++) {
        const int32_t len = host_int(lens, (size_t)b);
        if (len < 0 || (long long)len > (long long)t->max_blocks * bs)
            return clmla_fail(p->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                              "%s: cache_seqlens[%d] = %d is not in 0..%lld (max_blocks %d x block_size %d)", fn, b, len,
                              (long long)t->max_blocks * bs, t->max_blocks, bs);
        if (len > *max_ctx)
            *max_ctx = len;
        if (!table->given->host)
            continue;
        for (int j = 0; j < (len + bs - 1) / bs; j++) {
            const int32_t id = host_int(table, (size_t)b * t->max_blocks + j);
            if (id < 0 || id >= t->num_blocks)
                return clmla_fail(p->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                                  "%s: block_table[%d][%d] = %d is not in 0..%d (num_blocks %d); sequence %d reads %d "
                                  "blocks for cache_seqlens %d",
                                  fn, b, j, id, t->num_blocks - 1, t->num_blocks, b, (len + bs - 1) / bs, len);
        }
    }
    return CLMLA_SUCCESS;
}

static clmla_status enqueue_tokens(clmla_paged *p, const ptables *t, const pbuf *table, const pbuf *lens,
                                   cl_mem token_seq, cl_mem token_ctx)
{
    clmla_context *ctx = p->ctx;
    cl_kernel k = p->tokens_kernel;
    const int lens_off = (int)(lens->offset / 4), table_off = (int)(table->offset / 4);
    const int bs = p->config.block_size;
    CLMLA_SET_ARGS(ctx, k, 0, CLMLA_ARG(lens->mem), CLMLA_ARG(lens_off), CLMLA_ARG(table->mem), CLMLA_ARG(table_off),
                   CLMLA_ARG(t->max_blocks), CLMLA_ARG(bs), CLMLA_ARG(t->num_blocks), CLMLA_ARG(t->sq),
                   CLMLA_ARG(t->causal));
    const int tokens = t->batch * t->sq;
    CLMLA_SET_ARGS(ctx, k, 9, CLMLA_ARG(tokens), CLMLA_ARG(token_seq), CLMLA_ARG(token_ctx), CLMLA_ARG(p->status));
    cl_int err = clmla_cl_enqueue_items(ctx, k, (size_t)tokens, NULL);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue paged_tokens");
}

/* The scratch tables of T query tokens. */
static clmla_status token_tables(clmla_paged *p, size_t T, cl_mem *token_seq, cl_mem *token_ctx)
{
    clmla_status st = clmla_scratch(p->ctx, SCRATCH_PAGED_SEQ, T * sizeof(cl_int), token_seq);
    return st == CLMLA_SUCCESS ? clmla_scratch(p->ctx, SCRATCH_PAGED_CTX, T * sizeof(cl_int), token_ctx) : st;
}

clmla_status clmla_paged_attention(clmla_paged *p, const clmla_paged_attention_args *a, cl_event *event)
{
    static const char fn[] = "clmla_paged_attention";
    CLMLA_ENTRY(p, a, fn, "argument", "argument", event);
    clmla_context *ctx = p->ctx;
    const int sparse = a->topk > 0;
    const ptables t = {a->batch,      a->seqlen_q ? a->seqlen_q : 1, a->causal, a->num_blocks, a->max_blocks,
                       a->max_seqlen, sparse && a->indices_kind == CLMLA_PAGED_INDICES_SLOTS};
    clmla_status st = attention_values(p, a, &t, sparse);
    if (st != CLMLA_SUCCESS)
        return st;
    const int rkv = p->config.kv_lora_rank, dr = p->config.rope_dim, bs = p->config.block_size;
    const size_t T = (size_t)a->batch * t.sq, H = (size_t)a->num_heads;

    pcall c = {.p = p, .fn = fn};
    pbuf *q = arg(&c, "q", &a->q, T * H * (rkv + dr) * 4, 0, 0);
    pbuf *kv = arg(&c, "kv_cache", &a->kv_cache, (size_t)a->num_blocks * bs * p->row_bytes, 0, 1);
    kv->shifts = 1;
    pbuf *table = t.slots ? NULL : arg(&c, "block_table", &a->block_table, (size_t)a->batch * a->max_blocks * 4, 0, 0);
    pbuf *lens = t.slots ? NULL : arg(&c, "cache_seqlens", &a->cache_seqlens, (size_t)a->batch * 4, 0, 0);
    pbuf *idx = sparse ? arg(&c, "indices", &a->indices, T * (size_t)a->topk * 4, 0, 0) : NULL;
    pbuf *out = arg(&c, "out", &a->out, T * H * rkv * 4, 1, 0);
    pbuf *lse = a->lse.mem || a->lse.host ? arg(&c, "lse", &a->lse, T * H * 4, 1, 0) : NULL;
    pbuf *mask = a->mask.mem || a->mask.host
                     ? arg(&c, "mask", &a->mask, ((T - 1) * (size_t)a->mask_stride + (size_t)a->max_blocks * bs) * 2, 0, 0)
                     : NULL;
    if (mask)
        mask->unit = 2; /* half values */
    if ((st = check_buffers(&c)) != CLMLA_SUCCESS)
        return st;
    int max_ctx = a->num_blocks * bs;
    if (!t.slots && (st = check_tables(p, fn, &t, table, lens, &max_ctx)) != CLMLA_SUCCESS)
        return st;
    if (t.slots && (st = identity_table(p, a->num_blocks)) != CLMLA_SUCCESS)
        return st;
    cl_mem token_seq = NULL, token_ctx = NULL;
    if ((st = token_tables(p, T, &token_seq, &token_ctx)) != CLMLA_SUCCESS || (st = materialize(&c)) != CLMLA_SUCCESS)
        return st;
    if (t.slots) { /* every query sees slot s as position s of one sequence whose table is 0, 1, 2, .. */
        const cl_int zero = 0, all = a->num_blocks * bs;
        cl_int err = clEnqueueFillBuffer(ctx->queue, token_seq, &zero, sizeof(zero), 0, T * sizeof(cl_int), 0, NULL, NULL);
        if (err == CL_SUCCESS)
            err = clEnqueueFillBuffer(ctx->queue, token_ctx, &all, sizeof(all), 0, T * sizeof(cl_int), 0, NULL, NULL);
        if (err != CL_SUCCESS)
            st = clmla_fail_cl(ctx, err, "filling the token tables of a slot-indexed call");
    } else {
        st = enqueue_tokens(p, &t, table, lens, token_seq, token_ctx);
    }
    if (st == CLMLA_SUCCESS) {
        latent_launch lp = {.num_tokens = (int)T, .num_heads = a->num_heads,
                            .scale = a->softmax_scale != 0.0f ? a->softmax_scale : (float)(1.0 / sqrt((double)(rkv + dr))),
                            .q_latent = q->mem, .q_latent_offset = q->offset / 4,
                            .q_latent_token_stride = a->num_heads * (rkv + dr), .q_latent_head_stride = rkv + dr,
                            .q_rope = q->mem, .q_rope_offset = q->offset / 4 + (size_t)rkv};
        lp.q_rope_token_stride = lp.q_latent_token_stride;
        lp.q_rope_head_stride = rkv + dr;
        lp.block_table = t.slots ? p->identity : table->mem;
        lp.max_blocks_per_seq = t.slots ? p->identity_blocks : a->max_blocks;
        lp.token_seq = token_seq;
        lp.token_ctx_len = token_ctx;
        lp.max_ctx_len = max_ctx;
        lp.out = out->mem;
        lp.out_offset = out->offset / 4;
        lp.lse = lse ? lse->mem : NULL;
        lp.lse_offset = lse ? lse->offset / 4 : 0;
        if (sparse) {
            lp.indices = idx->mem;
            lp.indices_offset = idx->offset / 4;
            lp.topk = a->topk;
        } else {
            lp.query_len = t.sq > 1 ? t.sq : 0;
        }
        lp.max_run = sparse ? 1 : t.sq;
        lp.kv = kv->mem;
        /* in the kernels' CACHE_T units: float, 2-byte (f16, bf16) or byte (fp8) */
        const clmla_cache_dtype dt = p->config.dtype;
        lp.kv_offset = kv->offset / (dt == CLMLA_CACHE_F32 ? 4 : dt == CLMLA_CACHE_FP8 ? 1 : 2);
        if (mask) {
            lp.mask = mask->mem;
            lp.mask_offset = mask->offset / 2;
            lp.mask_stride = a->mask_stride;
        }
        st = clmla_latent_attention_enqueue(p->shell, 0, &lp, event);
    }
    return finish_call(&c, st);
}

/* ---- the indexer's selection ---------------------------------------------------------------- */

clmla_status clmla_paged_index_select(clmla_paged *p, const clmla_paged_index_args *a, cl_event *event)
{
    static const char fn[] = "clmla_paged_index_select";
    CLMLA_ENTRY(p, a, fn, "argument", "argument", event);
    clmla_context *ctx = p->ctx;
    const ptables t = {a->batch,      a->seqlen_q ? a->seqlen_q : 1, a->causal, a->num_blocks, a->max_blocks,
                       a->max_seqlen, 0};
    clmla_status st = table_values(p, fn, &t, a->num_heads);
    if (st != CLMLA_SUCCESS)
        return st;
    const int dI = p->config.index_head_dim, bs = p->config.block_size;
    if (!dI)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: the layout has no index-key cache (index_head_dim 0)", fn);
    if (a->top_k < 1 || a->top_k > CLMLA_SPARSE_MAX_TOPK)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: top_k %d is not in 1..%d", fn, a->top_k,
                          CLMLA_SPARSE_MAX_TOPK);
    const size_t T = (size_t)a->batch * t.sq, H = (size_t)a->num_heads;
    if ((long long)T * (long long)H * dI > INT_MAX || (long long)T * a->top_k > INT_MAX)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "%s: the queries or the lists pass 2^31 values", fn);
    pcall c = {.p = p, .fn = fn};
    pbuf *q = arg(&c, "q", &a->q, T * H * (size_t)dI * 4, 0, 0);
    pbuf *w = arg(&c, "weights", &a->weights, T * H * 4, 0, 0);
    pbuf *keys = arg(&c, "index_cache", &a->index_cache, (size_t)a->num_blocks * bs * p->shell->index_row_bytes, 0, 1);
    pbuf *table = arg(&c, "block_table", &a->block_table, (size_t)a->batch * a->max_blocks * 4, 0, 0);
    pbuf *lens = arg(&c, "cache_seqlens", &a->cache_seqlens, (size_t)a->batch * 4, 0, 0);
    pbuf *idx = arg(&c, "indices", &a->indices, T * (size_t)a->top_k * 4, 1, 0);
    if ((st = check_buffers(&c)) != CLMLA_SUCCESS)
        return st;
    int max_ctx = 0;
    if ((st = check_tables(p, fn, &t, table, lens, &max_ctx)) != CLMLA_SUCCESS)
        return st;
    clmla_index_kernels *ik = NULL;
    if ((st = clmla_index_kernels_for(p->shell, a->num_heads, 0, CLMLA_ROPE_INTERLEAVED, &ik)) != CLMLA_SUCCESS)
        return st;
    cl_mem token_seq = NULL, token_ctx = NULL;
    if ((st = token_tables(p, T, &token_seq, &token_ctx)) != CLMLA_SUCCESS || (st = materialize(&c)) != CLMLA_SUCCESS)
        return st;
    st = enqueue_tokens(p, &t, table, lens, token_seq, token_ctx);
    if (st == CLMLA_SUCCESS) {
        clmla_index_select_args sa = {.num_tokens = (int)T, .num_heads = a->num_heads, .top_k = a->top_k, .q = q->mem,
                                      .q_offset = q->offset / 4, .weights = w->mem, .weights_offset = w->offset / 4,
                                      .block_table = table->mem, .max_blocks_per_seq = a->max_blocks,
                                      .token_seq = token_seq, .token_ctx_len = token_ctx,
                                      .max_ctx_len = max_ctx > 0 ? max_ctx : 1, .indices = idx->mem,
                                      .indices_offset = idx->offset / 4};
        st = clmla_index_select_enqueue(ik, keys->mem, &sa, event);
    }
    return finish_call(&c, st);
}

/* ---- cache writes --------------------------------------------------------------------------- */

clmla_status clmla_paged_write(clmla_paged *p, const clmla_paged_write_args *a, cl_event *event)
{
    static const char fn[] = "clmla_paged_write";
    CLMLA_ENTRY(p, a, fn, "argument", "argument", event);
    clmla_context *ctx = p->ctx;
    const int rkv = p->config.kv_lora_rank, dr = p->config.rope_dim, bs = p->config.block_size;
    const int kv_stride = a->kv_c_stride ? a->kv_c_stride : rkv, pe_stride = a->k_pe_stride ? a->k_pe_stride : dr;
    if (a->num_tokens < 1 || kv_stride < rkv || pe_stride < dr)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: num_tokens %d must be >= 1, kv_c_stride %d >= kv_lora_rank %d, k_pe_stride %d >= rope_dim %d",
                          fn, a->num_tokens, kv_stride, rkv, pe_stride, dr);
    if (a->num_blocks < 1 || (long long)a->num_blocks * bs > INT_MAX)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "%s: num_blocks %d must be >= 1 with num_blocks x block_size (%d) below 2^31", fn, a->num_blocks,
                          bs);
    const size_t T = (size_t)a->num_tokens;
    pcall c = {.p = p, .fn = fn};
    pbuf *kvc = arg(&c, "kv_c", &a->kv_c, ((T - 1) * (size_t)kv_stride + (size_t)rkv) * 4, 0, 0);
    pbuf *kpe = arg(&c, "k_pe", &a->k_pe, ((T - 1) * (size_t)pe_stride + (size_t)dr) * 4, 0, 0);
    pbuf *slot = arg(&c, "slot_mapping", &a->slot_mapping, T * 4, 0, 0);
    pbuf *kv = arg(&c, "kv_cache", &a->kv_cache, (size_t)a->num_blocks * bs * p->row_bytes, 1, 1);
    kv->reads = 1; /* the rows the call does not write stay as they are */
    clmla_status st = check_buffers(&c);
    if (st != CLMLA_SUCCESS)
        return st;
    const int num_slots = a->num_blocks * bs;
    if (slot->given->host)
        for (size_t t = 0; t < T; t++) {
            const int32_t s = host_int(slot, t);
            if (s < -1 || s >= num_slots)
                return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                                  "%s: slot_mapping[%zu] = %d is not in -1..%d (num_blocks %d x block_size %d)", fn, t, s,
                                  num_slots - 1, a->num_blocks, bs);
        }
    if ((st = materialize(&c)) != CLMLA_SUCCESS)
        return st;
    cl_kernel k = p->write_kernel;
    const int kvc_off = (int)(kvc->offset / 4), kpe_off = (int)(kpe->offset / 4), slot_off = (int)(slot->offset / 4);
#define WRITE_ARG(i, v)                                                                                                  \
    do {                                                                                                             \
        cl_int e_ = clSetKernelArg(k, (i), sizeof(v), &(v));                                                         \
        if (e_ != CL_SUCCESS && st == CLMLA_SUCCESS)                                                                 \
            st = clmla_fail_kernel_arg(ctx, e_, k, (i));                                                             \
    } while (0)
    st = CLMLA_SUCCESS;
    WRITE_ARG(0, kvc->mem);
    WRITE_ARG(1, kvc_off);
    WRITE_ARG(2, kv_stride);
    WRITE_ARG(3, kpe->mem);
    WRITE_ARG(4, kpe_off);
    WRITE_ARG(5, pe_stride);
    WRITE_ARG(6, slot->mem);
    WRITE_ARG(7, slot_off);
    WRITE_ARG(8, num_slots);
    WRITE_ARG(9, kv->mem);
    WRITE_ARG(10, p->status);
#undef WRITE_ARG
    if (st == CLMLA_SUCCESS) {
        /* an item per value, or for fp8 one per 128-value tile of c^KV and one per value of k^R */
        const size_t items = p->config.dtype == CLMLA_CACHE_FP8 ? (size_t)(rkv / 128 + dr) : (size_t)(rkv + dr);
        const size_t global[2] = {items, T};
        cl_int err = clmla_cl_enqueue_rows(ctx, k, 2, global, event);
        if (err != CL_SUCCESS)
            st = clmla_fail_cl(ctx, err, "enqueue cache_write_slots");
    }
    return finish_call(&c, st);
}
