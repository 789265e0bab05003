/* Matrix products. clmla's own kernels where they measure faster (docs/BENCHMARKS.md):
   - decode-shaped products (up to 8 rows) on every device: the weights are streamed once;
   - y = x W^T with more rows on CPU devices (4-6x CLBlast's untuned kernels on PoCL);
   CLBlast for everything else (large products on GPUs, the per-head W^UK absorption of long
   absorbed chunks). */
#include "gemm.h"
#include "clcall.h"
#include "program.h"

#include <clblast_c.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

/* Rows up to which cl/gemm_skinny.cl is used (its MMAX). */
#define SKINNY_MAX_ROWS 8

static CLBlastTranspose op(const clmla_matrix *x)
{
    return x->transposed ? CLBlastTransposeYes : CLBlastTransposeNo;
}

/* The product kernels of a context, built on first use and kept until it is destroyed. */
typedef struct clmla_products {
    cl_kernel skinny_nt[4][3];   /* gemm_skinny_nt for 1, 2, 4, 8 rows x 1, 2, 4 columns per group */
    int skinny_nt_threads[4][3];
    cl_kernel skinny_nn;         /* gemm_skinny_nn */
    int skinny_nn_threads;
    cl_kernel skinny_rows[4];    /* gemm_skinny_nt_rows for 1, 2, 4, 8 rows (CPU devices) */
    cl_kernel skinny_nn_rows[4]; /* gemm_skinny_nn_rows likewise */
    cl_kernel skinny_rows_large; /* gemm_skinny_nt_rows for 9-63 rows, without prefetch */
    cl_kernel tiled_rows[2];     /* gemm_tiled_rows, x W^T for 64 rows or more on CPUs: W row-major, packed */
    cl_kernel packed_rows[4];    /* gemm_packed_rows for 1, 2, 4, 8 (and more) rows (CPU devices) */
    int force_clblast;           /* test hook: every product through CLBlast */
} clmla_products;

static void release_kernels(cl_kernel *k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (k[i])
            clReleaseKernel(k[i]);
}

static void products_release(void *p)
{
    clmla_products *P = p;
    release_kernels(&P->skinny_nt[0][0], 12);
    release_kernels(&P->skinny_nn, 1);
    release_kernels(P->skinny_rows, 4);
    release_kernels(P->skinny_nn_rows, 4);
    release_kernels(&P->skinny_rows_large, 1);
    release_kernels(P->tiled_rows, 2);
    release_kernels(P->packed_rows, 4);
    free(P);
}

/* The context's product kernels: made by ensure_products before any product runs. */
static clmla_products *products(const clmla_context *ctx)
{
    return ctx->products;
}

static int forced(const clmla_context *ctx)
{
    return ctx->products && products(ctx)->force_clblast;
}

static clmla_status ensure_products(clmla_context *ctx)
{
    if (ctx->products)
        return CLMLA_SUCCESS;
    ctx->products = calloc(1, sizeof(clmla_products));
    if (!ctx->products)
        return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    ctx->products_release = products_release;
    return CLMLA_SUCCESS;
}

clmla_status clmla_gemm_force_clblast(clmla_context *ctx, int on)
{
    clmla_status st = ensure_products(ctx);
    if (st == CLMLA_SUCCESS)
        products(ctx)->force_clblast = on;
    return st;
}

/* The rows bucket of a product of m rows: log2 of m rounded up to 1, 2, 4 or 8 (more rows: 8). */
static int rows_bucket(size_t m)
{
    int bucket = 0;
    while (bucket < 3 && ((size_t)1 << bucket) < m)
        bucket++;
    return bucket;
}

/* A work-group kernel of gemm_skinny built with `options` and -D WG= the largest power of two up
   to `wg` that the device, the kernel's own limit and local memory (local_bytes) take. */
static clmla_status sized_kernel(clmla_context *ctx, const char *name, const char *options, int wg,
                                 size_t (*local_bytes)(int, const void *), const void *arg, cl_kernel *kernel, int *threads)
{
    const clmla_kernel_fit fit = {"gemm_skinny", name, options, "WG", wg, 1, local_bytes, arg};
    clmla_status st = clmla_kernel_create_fitted(ctx, &fit, kernel, threads);
    if (st == CLMLA_SUCCESS && !*kernel)
        return clmla_fail(ctx, CLMLA_ERROR_UNSUPPORTED, "%s: no work-group size fits this device", name);
    return st;
}

/* gemm_skinny_nn (work-group form): 64 items or the device's limit. */
static clmla_status nn_kernel(clmla_context *ctx)
{
    if (products(ctx)->skinny_nn)
        return CLMLA_SUCCESS;
    char options[64];
    snprintf(options, sizeof(options), "-D MMAX=%d", SKINNY_MAX_ROWS);
    return sized_kernel(ctx, "gemm_skinny_nn", options, 64, NULL, NULL, &products(ctx)->skinny_nn, &products(ctx)->skinny_nn_threads);
}

/* Items per work-group of gemm_skinny_nt, and float4s of each weight row loaded per item before
   any is used (cl/gemm_skinny.cl). On an H100, against the kernel before (64 items, 4 columns,
   partial sums added by one item each, 32-way bank conflicts at 8 rows) with the V2-Lite
   projections: 8 rows 1.2-2.0x faster, 1 row 1.0-1.3x; 64 or 256 items, 4 float4s in flight,
   and fixed 1, 2 or 4 columns were within a few microseconds of these (docs/perf-log.md, "Products on GPUs"). */
#define NT_ITEMS 128
#define NT_UNROLL 2

/* Local memory of gemm_skinny_nt: the partial sums, rows x columns x items floats. */
static size_t nt_local_bytes(int items, const void *arg)
{
    return (size_t)*(const int *)arg * (size_t)items * sizeof(float);
}

/* gemm_skinny_nt for rows bucket 1 << bucket and 1 << nc_log columns per group: NT_ITEMS items,
   or fewer where the device's work-group limit, the kernel's own or local memory says so. */
static clmla_status nt_kernel(clmla_context *ctx, int bucket, int nc_log, cl_kernel *kernel, int *threads)
{
    cl_kernel *slot = &products(ctx)->skinny_nt[bucket][nc_log];
    int *slot_threads = &products(ctx)->skinny_nt_threads[bucket][nc_log];
    if (!*slot) {
        const int rows = 1 << bucket, nc = 1 << nc_log, sums = rows * nc;
        char options[64];
        snprintf(options, sizeof(options), "-D MR=%d -D NC=%d -D UK=%d", rows, nc, NT_UNROLL);
        clmla_status st = sized_kernel(ctx, "gemm_skinny_nt", options, NT_ITEMS, nt_local_bytes, &sums, slot, slot_threads);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    *kernel = *slot;
    *threads = *slot_threads;
    return CLMLA_SUCCESS;
}

/* Columns per work-group of gemm_skinny_nt (log2): 4, unless that leaves fewer than 8 groups per
   compute unit, then 2 or 1. */
static int nt_columns_log(const clmla_context *ctx, size_t n, size_t batch)
{
    const size_t want = 8 * (size_t)(ctx->info.compute_units ? ctx->info.compute_units : 1);
    int lg = 2;
    while (lg > 0 && (n + ((size_t)1 << lg) - 1) / ((size_t)1 << lg) * batch < want)
        lg--;
    return lg;
}

/* The CPU forms for m rows: rows bucket 1, 2, 4 or 8, column blocks 8 / bucket (of single
   columns for the x W^T kernel, of float8 strips for the x B kernel). `large`: the x W^T kernel
   for 9 to TILED_MIN_ROWS - 1 rows, built without the weight prefetch (20% slower there: 2048^3
   in 200 against 170 ms, while 8 rows of the decode-shaped products gain 25-40%). */
static clmla_status rows_kernel(clmla_context *ctx, size_t m, int transposed_b, int large, cl_kernel *kernel,
                                int *columns)
{
    const int bucket = rows_bucket(m), rows = 1 << bucket;
    *columns = 8 / rows;
    cl_kernel *slot = large ? &products(ctx)->skinny_rows_large
                      : transposed_b ? &products(ctx)->skinny_rows[bucket] : &products(ctx)->skinny_nn_rows[bucket];
    if (!*slot) {
        char options[96];
        snprintf(options, sizeof(options), "-D MR=%d -D NCC=%d -D PCH=%d%s", rows, *columns, CLMLA_PACK_CHUNK,
                 !large && clmla_device_prefetches(&ctx->info) ? " -D CLMLA_PREFETCH" : "");
        clmla_status st = clmla_kernel_create(ctx, "gemm_skinny", options,
                                              transposed_b ? "gemm_skinny_nt_rows" : "gemm_skinny_nn_rows", slot);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    *kernel = *slot;
    return CLMLA_SUCCESS;
}

static int fits_int(size_t v)
{
    return v <= (size_t)INT_MAX;
}

/* Arguments 0..16, common to every gemm_skinny kernel: M N K alpha, then (buffer, offset, ld,
   batch stride) of A and B, beta, and the same of C. */
static clmla_status set_product_args(clmla_context *ctx, cl_kernel kernel, size_t m, size_t n, size_t k, float alpha,
                                     clmla_matrix a, size_t a_stride, clmla_matrix b, size_t b_stride, float beta,
                                     clmla_matrix c, size_t c_stride)
{
    const int M = (int)m, N = (int)n, K = (int)k;
    const int ao = (int)a.offset, lda = (int)a.ld, as = (int)a_stride;
    const int bo = (int)b.offset, ldb = (int)b.ld, bs = (int)b_stride;
    const int co = (int)c.offset, ldc = (int)c.ld, cs = (int)c_stride;
    CLMLA_SET_ARG(ctx, kernel, 0, M);
    CLMLA_SET_ARG(ctx, kernel, 1, N);
    CLMLA_SET_ARG(ctx, kernel, 2, K);
    CLMLA_SET_ARG(ctx, kernel, 3, alpha);
    CLMLA_SET_ARG(ctx, kernel, 4, a.buffer);
    CLMLA_SET_ARG(ctx, kernel, 5, ao);
    CLMLA_SET_ARG(ctx, kernel, 6, lda);
    CLMLA_SET_ARG(ctx, kernel, 7, as);
    CLMLA_SET_ARG(ctx, kernel, 8, b.buffer);
    CLMLA_SET_ARG(ctx, kernel, 9, bo);
    CLMLA_SET_ARG(ctx, kernel, 10, ldb);
    CLMLA_SET_ARG(ctx, kernel, 11, bs);
    CLMLA_SET_ARG(ctx, kernel, 12, beta);
    CLMLA_SET_ARG(ctx, kernel, 13, c.buffer);
    CLMLA_SET_ARG(ctx, kernel, 14, co);
    CLMLA_SET_ARG(ctx, kernel, 15, ldc);
    CLMLA_SET_ARG(ctx, kernel, 16, cs);
    return CLMLA_SUCCESS;
}

/* Items wanted for a product on a CPU device: about 8 per compute unit. */
static size_t cpu_items(const clmla_context *ctx)
{
    return 8 * (size_t)(ctx->info.compute_units ? ctx->info.compute_units : 1);
}

static clmla_status skinny(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                           size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c, size_t c_stride,
                           size_t batch, cl_event *event)
{
    cl_kernel kernel = NULL;
    int columns = 0, wg = 0, bucket = 0, nc_log = 0;
    const int cpu = ctx->info.kind == CLMLA_DEVICE_KIND_CPU;
    const int cpu_rows = cpu && b.transposed;
    const int cpu_nn = cpu && !b.transposed && n % 8 == 0;
    clmla_status st;
    if (cpu_rows || cpu_nn)
        st = rows_kernel(ctx, m, b.transposed, 0, &kernel, &columns);
    else if (b.transposed) {
        bucket = rows_bucket(m);
        nc_log = nt_columns_log(ctx, n, batch);
        st = nt_kernel(ctx, bucket, nc_log, &kernel, &wg);
    } else {
        st = nn_kernel(ctx);
        kernel = products(ctx)->skinny_nn;
        wg = products(ctx)->skinny_nn_threads;
    }
    if (st != CLMLA_SUCCESS)
        return st;
    if ((st = set_product_args(ctx, kernel, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride)) != CLMLA_SUCCESS)
        return st;
    cl_int err;
    if (cpu_rows) {
        /* About 8 items per compute unit over the whole batch, in whole column blocks. */
        const size_t items_wanted = cpu_items(ctx);
        size_t per_item = (n * batch + items_wanted - 1) / items_wanted;
        per_item = (per_item + columns - 1) / columns * columns;
        if (per_item > n)
            per_item = (n + columns - 1) / columns * columns;
        const int cpi = (int)per_item, row_blocks = 1;
        /* chunks of K whose x rows take 16 KiB, half of a common L1 */
        const int k_chunk = (int)(16384 / (sizeof(float) * (size_t)(8 / columns))) & ~7;
        CLMLA_SET_ARG(ctx, kernel, 17, cpi);
        CLMLA_SET_ARG(ctx, kernel, 18, row_blocks);
        CLMLA_SET_ARG(ctx, kernel, 19, k_chunk);
        const size_t global[2] = {(n + per_item - 1) / per_item, batch}, local[2] = {1, 1};
        err = clmla_cl_enqueue(ctx, kernel, 2, global, local, event);
    } else if (cpu_nn) {
        const size_t strip = 8 * (size_t)columns;
        const size_t global[2] = {(n + strip - 1) / strip, batch}, local[2] = {1, 1};
        err = clmla_cl_enqueue(ctx, kernel, 2, global, local, event);
    } else if (b.transposed) {
        const size_t nc = (size_t)1 << nc_log;
        const size_t global[2] = {(n + nc - 1) / nc * (size_t)wg, batch}, local[2] = {(size_t)wg, 1};
        err = clmla_cl_enqueue(ctx, kernel, 2, global, local, event);
    } else {
        const size_t global[2] = {(n + wg - 1) / wg * wg, batch}, local[2] = {(size_t)wg, 1};
        err = clmla_cl_enqueue(ctx, kernel, 2, global, local, event);
    }
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue gemm_skinny");
}

/* The skinny kernels take A untransposed and every index as int. */
static int use_skinny(size_t m, const clmla_matrix *a, const clmla_matrix *b, const clmla_matrix *c, size_t a_span,
                      size_t b_span, size_t c_span)
{
    return m <= SKINNY_MAX_ROWS && !a->transposed && !c->transposed && fits_int(a->offset + a_span) &&
           fits_int(b->offset + b_span) && fits_int(c->offset + c_span) && fits_int(a->ld) && fits_int(b->ld) &&
           fits_int(c->ld);
}

/* y = x W^T for TILED_MIN_ROWS rows or more on CPU devices: gemm_tiled_rows, tiles of TILED_ROWS
   x TILED_COLUMNS of C per work-item, K in chunks of 1024 (of the packing's chunk where W is
   packed). Below TILED_MIN_ROWS, where the read of W and not the arithmetic sets the time, blocks
   of rows that stream W again per block were faster (16 and 32 rows: 1.2-2x); at 64 rows the two
   were even, from 128 the tiles faster. Sizes measured on the EPYC (docs/perf-log.md). */
#define TILED_MIN_ROWS 64
#define TILED_ROWS 256
#define TILED_COLUMNS 48
static clmla_status tiled(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                          clmla_matrix b, float beta, clmla_matrix c, cl_event *event)
{
    const int packed_b = b.panel != 0;
    cl_kernel *slot = &products(ctx)->tiled_rows[packed_b];
    if (!*slot) {
        char options[96];
        snprintf(options, sizeof(options), "-D TR=%d -D TC=%d -D KC=%d", TILED_ROWS, TILED_COLUMNS,
                 packed_b ? CLMLA_PACK_CHUNK : 1024);
        clmla_status st = clmla_kernel_create(ctx, "gemm_skinny", options, "gemm_tiled_rows", slot);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    clmla_status st = set_product_args(ctx, *slot, m, n, k, alpha, a, 0, b, 0, beta, c, 0);
    if (st != CLMLA_SUCCESS)
        return st;
    const int panel = (int)b.panel;
    CLMLA_SET_ARG(ctx, *slot, 17, panel);
    const size_t global[2] = {(n + TILED_COLUMNS - 1) / TILED_COLUMNS, (m + TILED_ROWS - 1) / TILED_ROWS};
    const size_t local[2] = {1, 1};
    cl_int err = clmla_cl_enqueue(ctx, *slot, 2, global, local, event);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue gemm_tiled_rows");
}

/* y = x W^T with more than 8 rows, W row-major, on a CPU device: from TILED_MIN_ROWS rows the tiles;
   below, blocks of 4 rows x 64 columns per work-item, so a block's weight rows are reused from L2
   for 4 rows at a time and x's rows stay in L1/L2. */
static clmla_status rows_large(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                               clmla_matrix b, float beta, clmla_matrix c, cl_event *event)
{
    if (m >= TILED_MIN_ROWS)
        return tiled(ctx, m, n, k, alpha, a, b, beta, c, event);
    cl_kernel kernel = NULL;
    int columns = 0;
    clmla_status st = rows_kernel(ctx, 4, 1, 1, &kernel, &columns);
    if (st != CLMLA_SUCCESS)
        return st;
    if ((st = set_product_args(ctx, kernel, m, n, k, alpha, a, 0, b, 0, beta, c, 0)) != CLMLA_SUCCESS)
        return st;
    const int cpi = 64, row_blocks = (int)((m + 3) / 4), k_chunk = 0; /* all of K: measured for large products */
    CLMLA_SET_ARG(ctx, kernel, 17, cpi);
    CLMLA_SET_ARG(ctx, kernel, 18, row_blocks);
    CLMLA_SET_ARG(ctx, kernel, 19, k_chunk);
    const size_t global[2] = {(n + cpi - 1) / cpi, (size_t)row_blocks}, local[2] = {1, 1};
    cl_int err = clmla_cl_enqueue(ctx, kernel, 2, global, local, event);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue gemm_skinny_nt_rows");
}

size_t clmla_weight_panel(const clmla_context *ctx, size_t n)
{
    if (ctx->info.kind != CLMLA_DEVICE_KIND_CPU || forced(ctx) || n == 0)
        return 0;
    const size_t items = cpu_items(ctx);
    return (n + items - 1) / items;
}

void clmla_pack_weight(const float *w, size_t n, size_t k, size_t panel, float *out)
{
    for (size_t p0 = 0; p0 < n; p0 += panel) {
        const size_t rows = n - p0 < panel ? n - p0 : panel;
        for (size_t k0 = 0; k0 < k; k0 += CLMLA_PACK_CHUNK) {
            const size_t len = k - k0 < CLMLA_PACK_CHUNK ? k - k0 : CLMLA_PACK_CHUNK;
            for (size_t r = 0; r < rows; r++, out += len)
                memcpy(out, w + (p0 + r) * k + k0, len * sizeof(float));
        }
    }
}

/* y = x W^T with W packed (clmla_pack_weight): gemm_packed_rows with blocks of 1, 2, 4 or 8 rows
   of x (blocks of 8 for 9 to TILED_MIN_ROWS - 1 rows), one work-item per (panel, block); from
   TILED_MIN_ROWS rows on, gemm_tiled_rows. The build options are those of rows_kernel for the
   same rows, so that one program serves both kernels. */
static clmla_status packed(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                           clmla_matrix b, float beta, clmla_matrix c, cl_event *event)
{
    if (!b.transposed || a.transposed || !fits_int(a.offset + m * a.ld) || !fits_int(b.offset + n * k) ||
        !fits_int(c.offset + m * c.ld) || !fits_int(b.panel))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "packed weights (m=%zu n=%zu k=%zu): only y = x W^T within int indices", m, n, k);
    if (m >= TILED_MIN_ROWS)
        return tiled(ctx, m, n, k, alpha, a, b, beta, c, event);
    const int bucket = rows_bucket(m);
    cl_kernel *slot = &products(ctx)->packed_rows[bucket];
    if (!*slot) {
        char options[96];
        const int rows = 1 << bucket;
        snprintf(options, sizeof(options), "-D MR=%d -D NCC=%d -D PCH=%d%s", rows, 8 / rows, CLMLA_PACK_CHUNK,
                 clmla_device_prefetches(&ctx->info) ? " -D CLMLA_PREFETCH" : "");
        clmla_status st = clmla_kernel_create(ctx, "gemm_skinny", options, "gemm_packed_rows", slot);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    clmla_status st = set_product_args(ctx, *slot, m, n, k, alpha, a, 0, b, 0, beta, c, 0);
    if (st != CLMLA_SUCCESS)
        return st;
    const int panel = (int)b.panel, row_blocks = (int)((m + (1u << bucket) - 1) >> bucket);
    CLMLA_SET_ARG(ctx, *slot, 17, panel);
    CLMLA_SET_ARG(ctx, *slot, 18, row_blocks);
    const size_t global[2] = {(n + b.panel - 1) / b.panel, (size_t)row_blocks}, local[2] = {1, 1};
    cl_int err = clmla_cl_enqueue(ctx, *slot, 2, global, local, event);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue gemm_packed_rows");
}

clmla_status clmla_gemm(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a, clmla_matrix b,
                        float beta, clmla_matrix c, cl_event *event)
{
    clmla_status st = ensure_products(ctx);
    if (st != CLMLA_SUCCESS)
        return st;
    if (b.panel) /* packed weights: only gemm_packed_rows reads them, whatever the device */
        return packed(ctx, m, n, k, alpha, a, b, beta, c, event);
    if (!forced(ctx) && ctx->info.kind == CLMLA_DEVICE_KIND_CPU && m > SKINNY_MAX_ROWS && b.transposed &&
        !a.transposed && fits_int(a.offset + m * a.ld) && fits_int(b.offset + n * b.ld) && fits_int(c.offset + m * c.ld))
        return rows_large(ctx, m, n, k, alpha, a, b, beta, c, event);
    if (!forced(ctx) && use_skinny(m, &a, &b, &c, m * a.ld, (b.transposed ? n : k) * b.ld, m * c.ld))
        return skinny(ctx, m, n, k, alpha, a, 0, b, 0, beta, c, 0, 1, event);
    if (clmla_fault_hit(ctx))
        return clmla_fail(ctx, CL_OUT_OF_RESOURCES, "CLBlastSgemm(m=%zu n=%zu k=%zu): injected fault", m, n, k);
    CLBlastStatusCode bs = CLBlastSgemm(CLBlastLayoutRowMajor, op(&a), op(&b), m, n, k, alpha, a.buffer, a.offset, a.ld,
                                        b.buffer, b.offset, b.ld, beta, c.buffer, c.offset, c.ld, &ctx->queue, event);
    if (bs != CLBlastSuccess)
        return clmla_fail(ctx, bs, "CLBlastSgemm(m=%zu n=%zu k=%zu) failed: %s", m, n, k, clmla_status_string(bs));
    return CLMLA_SUCCESS;
}

clmla_status clmla_gemm_strided_batched(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                        size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c,
                                        size_t c_stride, size_t batch, cl_event *event)
{
    clmla_status st = ensure_products(ctx);
    if (st != CLMLA_SUCCESS)
        return st;
    if (!forced(ctx) && fits_int(a_stride) && fits_int(b_stride) && fits_int(c_stride) && fits_int(batch) &&
        use_skinny(m, &a, &b, &c, batch * a_stride + m * a.ld, batch * b_stride + (b.transposed ? n : k) * b.ld,
                   batch * c_stride + m * c.ld))
        return skinny(ctx, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride, batch, event);
    if (clmla_fault_hit(ctx))
        return clmla_fail(ctx, CL_OUT_OF_RESOURCES, "CLBlastSgemmStridedBatched: injected fault");
    CLBlastStatusCode bs = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, op(&a), op(&b), m, n, k, alpha, a.buffer,
                                                      a.offset, a.ld, a_stride, b.buffer, b.offset, b.ld, b_stride, beta,
                                                      c.buffer, c.offset, c.ld, c_stride, batch, &ctx->queue, event);
    if (bs != CLBlastSuccess)
        return clmla_fail(ctx, bs, "CLBlastSgemmStridedBatched(m=%zu n=%zu k=%zu batch=%zu) failed: %s", m, n, k, batch,
                          clmla_status_string(bs));
    return CLMLA_SUCCESS;
}
