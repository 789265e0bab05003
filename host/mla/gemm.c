/* Matrix products. clmla's own kernels where they measure faster (docs/BENCHMARKS.md):
   - decode-shaped products (up to 8 rows) on every device: the weights are streamed once;
   - y = x W^T with more rows on CPU devices (4-6x CLBlast's untuned kernels on PoCL);
   CLBlast for everything else (large products on GPUs, the per-head W^UK absorption of long
   absorbed chunks). */
#include "gemm.h"
#include "clcall.h"
#include "program.h"
#include "kernel_store.h"
#include "scratch.h"
#include "dtype.h"
#include "trace.h"
#include "kernel_tuning.h"
#include "attention.h"

#include <clblast_c.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

/* Rows up to which the decode-shaped forms are used: cl/gemm_skinny.cl's work-group kernels (its
   MMAX), on CPU devices cl/gemm_rows.cl's blocks of 1, 2, 4 or 8 rows. */
#define SKINNY_MAX_ROWS 8

static CLBlastTranspose op(const clmla_matrix *x)
{
    return x->transposed ? CLBlastTransposeYes : CLBlastTransposeNo;
}

/* The families of the context's product kernel store (clmla_products.kernels), each kept per shape
   class and weight dtype (the store's first key) and per form (its second key), built on first use
   with the class's parameters and kept until the context is destroyed or retuned. */
enum {
    PK_SKINNY_NT = 1,  /* gemm_skinny_nt: form aligned * 16 + rows bucket * 4 + log2 columns per group */
    PK_SKINNY_NN,      /* gemm_skinny_nn */
    PK_SKINNY_NN_SPLIT,/* gemm_skinny_nn_split (skinny_nn_slices > 1): aligned * 4 + rows bucket */
    PK_NT_ROWS,        /* gemm_skinny_nt_rows (CPU devices): rows bucket for 1, 2, 4, 8 rows */
    PK_NN_ROWS,        /* gemm_skinny_nn_rows likewise */
    PK_NN_WIDE,        /* gemm_skinny_nn_wide for 1, 2, 4 rows (CPU devices) */
    PK_NT_ROWS_LARGE,  /* gemm_skinny_nt_rows for 9-63 rows, without prefetch */
    PK_TILED_ROWS,     /* gemm_tiled_rows, x W^T for 64 rows or more on CPUs: form 1 where W is packed */
    PK_PACKED_ROWS,    /* gemm_packed_rows: rows bucket for 1, 2, 4, 8 (and more) rows (CPU devices) */
    PK_WEIGHT_F32      /* gemm_weight_f32: rows of a weight decoded for CLBlast */
};

#define NUM_DTYPES 4
/* Shape classes of the product tuning (clmla_product_k_class - 1): K up to CLMLA_PRODUCT_SMALL_K, larger. */
#define NUM_CLASSES 2
typedef struct clmla_products {
    clmla_kernel_store kernels;                     /* the PK_ families above */
    clmla_product_tuning tuning[NUM_CLASSES];       /* the parameters of each class, */
    int tuned;                                      /* looked up (1) at the first product since creation or retuning */
    int force_clblast;                              /* test hook: every product through CLBlast */
    size_t weight_piece;                            /* test hook: decoded pieces' bytes (0: WEIGHT_PIECE_BYTES) */
} clmla_products;

/* Releases every kernel of P. */
static void release_all(clmla_products *P)
{
    clmla_kernel_store_release(&P->kernels);
}

static void products_release(void *p)
{
    release_all(p);
    free(p);
}

/* The context's product kernels: made by ensure_products before any product runs. */
static clmla_products *products(const clmla_context *ctx)
{
    return ctx->products;
}

/* The shape class of a product of K = k: its index in clmla_products. */
static int shape_class(size_t k)
{
    return k > CLMLA_PRODUCT_SMALL_K;
}

/* The entry of family `family` and form `form` reading weights of `dtype` (a valid clmla_dtype:
   the layer and clmla_linear check) for products of K = k; NULL (failure recorded) where memory for
   a new entry cannot be had. */
static clmla_stored_kernel *entry(clmla_context *ctx, int family, clmla_dtype dtype, size_t k, int form)
{
    clmla_stored_kernel *e =
        clmla_kernel_store_entry(&products(ctx)->kernels, family, shape_class(k) * NUM_DTYPES + (int)dtype, form);
    if (!e)
        clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "products: no memory for a kernel entry");
    return e;
}

/* The parameters of products of K = k (looked up by ensure_products). */
static const clmla_product_tuning *tuning(const clmla_context *ctx, size_t k)
{
    return &products(ctx)->tuning[shape_class(k)];
}

/* Build options naming the weight dtype (cl/prelude.cl's W_DTYPE), after `extra`. */
static void dtype_options(const clmla_context *ctx, clmla_dtype dtype, const char *extra, char *out, size_t size)
{
    snprintf(out, size, "%s -D W_DTYPE=%d%s", extra, (int)dtype,
             dtype == CLMLA_DTYPE_FP8_E4M3 ? clmla_fp8_option(ctx) : "");
}

int clmla_products_rows(const clmla_context *ctx)
{
    return ctx->product_variant == CLMLA_LATENT_ROWS ||
           (ctx->product_variant == CLMLA_LATENT_AUTO && ctx->info.kind == CLMLA_DEVICE_KIND_CPU &&
            clmla_device_row_products_trusted(&ctx->info));
}

static int forced(const clmla_context *ctx)
{
    return ctx->products && products(ctx)->force_clblast;
}

static clmla_status ensure_products(clmla_context *ctx)
{
    if (!ctx->products) {
        ctx->products = clmla_host_realloc(ctx, NULL, sizeof(clmla_products));
        if (!ctx->products)
            return clmla_fail(ctx, CLMLA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
        memset(ctx->products, 0, sizeof(clmla_products));
        ctx->products_release = products_release;
    }
    clmla_products *P = products(ctx);
    if (!P->tuned) { /* a few string compares: no allocation or I/O after the process's first lookup */
        clmla_product_tuning_for(ctx, CLMLA_PRODUCT_SMALL_K, &P->tuning[0]);
        clmla_product_tuning_for(ctx, CLMLA_PRODUCT_SMALL_K + 1, &P->tuning[1]);
        P->tuned = 1;
    }
    return CLMLA_SUCCESS;
}

void clmla_gemm_retune(clmla_context *ctx)
{
    if (!ctx->products)
        return;
    release_all(products(ctx));
    products(ctx)->tuned = 0;
}

/* Here, not in kernel_tuning.c: forcing parameters releases the product kernels built with the
   ones before (the tuning module knows nothing of the kernels). */
clmla_status clmla_context_set_product_tuning(clmla_context *ctx, const clmla_product_tuning *tuning)
{
    if (!ctx)
        return clmla_fail(NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_context_set_product_tuning: NULL context");
    const char *why = NULL;
    if (tuning && clmla_product_tuning_check(tuning, &why) != CLMLA_SUCCESS)
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT, "product kernel parameters refused: %s", why);
    if (tuning)
        ctx->product_forced = *tuning;
    ctx->product_forced_set = tuning != NULL;
    clmla_gemm_retune(ctx);
    return CLMLA_SUCCESS;
}

clmla_status clmla_gemm_force_clblast(clmla_context *ctx, int on)
{
    clmla_status st = ensure_products(ctx);
    if (st == CLMLA_SUCCESS)
        products(ctx)->force_clblast = on;
    return st;
}

clmla_status clmla_gemm_set_weight_piece(clmla_context *ctx, size_t bytes)
{
    clmla_status st = ensure_products(ctx);
    if (st == CLMLA_SUCCESS)
        products(ctx)->weight_piece = bytes;
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

/* A work-group kernel of cl/gemm_skinny.cl built with `options` and -D WG= the largest power of two
   up to `wg`, and at least `min_wg`, that the device, the kernel's own limit and local memory
   (local_bytes) take. */
static clmla_status sized_kernel(clmla_context *ctx, const char *name, const char *options, int wg, int min_wg,
                                 size_t (*local_bytes)(int, const void *), const void *arg, cl_kernel *kernel, int *threads)
{
    const clmla_kernel_fit fit = {"gemm_skinny", name, options, "WG", wg, min_wg, local_bytes, arg};
    clmla_status st = clmla_kernel_create_fitted(ctx, &fit, kernel, threads);
    if (st == CLMLA_SUCCESS && !*kernel)
        return clmla_fail(ctx, CLMLA_ERROR_UNSUPPORTED, "%s: no work-group size fits this device", name);
    return st;
}

/* gemm_skinny_nn (work-group form) for products of K = k: skinny_nn_items items (64 by default)
   or the device's limit. */
static clmla_status nn_kernel(clmla_context *ctx, clmla_dtype dtype, size_t k, cl_kernel *kernel, int *threads)
{
    clmla_stored_kernel *e = entry(ctx, PK_SKINNY_NN, dtype, k, 0);
    if (!e)
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    *kernel = e->kernel;
    *threads = e->threads;
    if (e->kernel)
        return CLMLA_SUCCESS;
    char extra[64], options[128];
    snprintf(extra, sizeof(extra), "-D MMAX=%d", SKINNY_MAX_ROWS);
    dtype_options(ctx, dtype, extra, options, sizeof(options));
    clmla_status st = sized_kernel(ctx, "gemm_skinny_nn", options, tuning(ctx, k)->skinny_nn_items, 1, NULL, NULL,
                                   &e->kernel, &e->threads);
    *kernel = e->kernel;
    *threads = e->threads;
    return st;
}

/* Local memory of gemm_skinny_nn_split: a float4 of partial sums per row and item. */
static size_t nn_split_local_bytes(int items, const void *arg)
{
    return (size_t)*(const int *)arg * (size_t)items * 4 * sizeof(float);
}

/* gemm_skinny_nn_split for rows bucket 1 << bucket, K in skinny_nn_slices slices: skinny_nn_items
   items, or fewer (down to one float4 of columns a group) where the device says so. `aligned`:
   built with W_ALIGNED, each float4 of columns of B one load of the vector type (the caller has
   checked nn_aligned). */
static clmla_status nn_split_kernel(clmla_context *ctx, clmla_dtype dtype, size_t k, int bucket, int aligned,
                                    cl_kernel *kernel, int *threads)
{
    clmla_stored_kernel *e = entry(ctx, PK_SKINNY_NN_SPLIT, dtype, k, aligned * 4 + bucket);
    if (!e)
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    if (!e->kernel) {
        const clmla_product_tuning *t = tuning(ctx, k);
        const int rows = 1 << bucket;
        char extra[64], options[160];
        snprintf(extra, sizeof(extra), "-D MR=%d -D KS=%d%s", rows, t->skinny_nn_slices, aligned ? " -D W_ALIGNED" : "");
        dtype_options(ctx, dtype, extra, options, sizeof(options));
        clmla_status st = sized_kernel(ctx, "gemm_skinny_nn_split", options, t->skinny_nn_items, t->skinny_nn_slices,
                                       nn_split_local_bytes, &rows, &e->kernel, &e->threads);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    *kernel = e->kernel;
    *threads = e->threads;
    return CLMLA_SUCCESS;
}

/* Items per work-group of gemm_skinny_nt, and float4s of each weight row loaded per item before
   any is used (cl/gemm_skinny.cl): the product tuning's skinny_items and skinny_unroll (defaults
   128 and 2; docs/perf-log.md, "Products on GPUs", has the runs behind them). */

/* Local memory of gemm_skinny_nt: the partial sums, rows x columns x items floats. */
static size_t nt_local_bytes(int items, const void *arg)
{
    return (size_t)*(const int *)arg * (size_t)items * sizeof(float);
}

/* gemm_skinny_nt for rows bucket 1 << bucket and 1 << nc_log columns per group, products of K = k,
   `aligned`: built with W_ALIGNED (the caller has checked nt_aligned; the option changes every
   W_LOADn of cl/gemm_skinny.cl, so only this kernel and gemm_skinny_nn_split, under a check of its
   own, are taken from such programs): skinny_items
   items, or fewer where the device's work-group limit, the kernel's own or local memory says so. */
static clmla_status nt_kernel(clmla_context *ctx, clmla_dtype dtype, size_t k, int bucket, int nc_log, int aligned,
                              cl_kernel *kernel, int *threads)
{
    clmla_stored_kernel *e = entry(ctx, PK_SKINNY_NT, dtype, k, aligned * 16 + bucket * 4 + nc_log);
    if (!e)
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    cl_kernel *slot = &e->kernel;
    int *slot_threads = &e->threads;
    if (!*slot) {
        const clmla_product_tuning *t = tuning(ctx, k);
        const int rows = 1 << bucket, nc = 1 << nc_log, sums = rows * nc;
        char extra[96], options[176], vw[16] = "";
        if (t->skinny_vector != 4) /* only when set: the default's options, and cached programs, as before */
            snprintf(vw, sizeof(vw), " -D VW=%d", t->skinny_vector);
        snprintf(extra, sizeof(extra), "-D MR=%d -D NC=%d -D UK=%d%s%s", rows, nc, t->skinny_unroll, vw,
                 aligned ? " -D W_ALIGNED" : "");
        dtype_options(ctx, dtype, extra, options, sizeof(options));
        clmla_status st =
            sized_kernel(ctx, "gemm_skinny_nt", options, t->skinny_items, 1, nt_local_bytes, &sums, slot, slot_threads);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    *kernel = *slot;
    *threads = *slot_threads;
    return CLMLA_SUCCESS;
}

/* Whether gemm_skinny_nt may read its operands as whole vectors (the product tuning's skinny_aligned):
   every vector of VW values of A and B then starts at a multiple of VW elements from its buffer's
   start, which OpenCL aligns to the largest vector type at least. */
static int nt_aligned(const clmla_context *ctx, size_t k, const clmla_matrix *a, size_t a_stride,
                      const clmla_matrix *b, size_t b_stride, size_t batch)
{
    const clmla_product_tuning *t = tuning(ctx, k);
    const size_t vw = (size_t)t->skinny_vector;
    return t->skinny_aligned && a->offset % vw == 0 && a->ld % vw == 0 && b->offset % vw == 0 && b->ld % vw == 0 &&
           (batch <= 1 || (a_stride % vw == 0 && b_stride % vw == 0));
}

/* Whether gemm_skinny_nn_split may read B's float4s of columns as whole vectors (skinny_aligned):
   every one starts at offset + q b_stride + k ld + n with n a multiple of 4, so offset, ld and
   (with a batch) b_stride must be too. */
static int nn_aligned(const clmla_context *ctx, size_t k, const clmla_matrix *b, size_t b_stride, size_t batch)
{
    return tuning(ctx, k)->skinny_aligned && b->offset % 4 == 0 && b->ld % 4 == 0 && (batch <= 1 || b_stride % 4 == 0);
}

/* Columns per work-group of gemm_skinny_nt (log2): skinny_columns (4 by default), unless that
   leaves fewer than 8 groups per compute unit, then fewer down to 1. */
static int nt_columns_log(const clmla_context *ctx, size_t n, size_t k, size_t batch)
{
    const size_t want = 8 * (size_t)(ctx->info.compute_units ? ctx->info.compute_units : 1);
    int lg = 0;
    while ((1 << (lg + 1)) <= tuning(ctx, k)->skinny_columns)
        lg++;
    while (lg > 0 && (n + ((size_t)1 << lg) - 1) / ((size_t)1 << lg) * batch < want)
        lg--;
    return lg;
}

/* Values of K per chunk of a packed weight of this dtype (gemm.h). */
static int pack_chunk(clmla_dtype dtype)
{
    return (int)clmla_pack_chunk(clmla_dtype_bytes(dtype));
}

/* The build options of the CPU kernels for blocks of `rows` rows (1, 2, 4 or 8) and products of
   K = k, shared by gemm_skinny_nt_rows, gemm_skinny_nn_rows, gemm_skinny_nn_wide and
   gemm_packed_rows so that one program serves them: column blocks of 8 / rows, the packing's
   chunk, the prefetch unless `large` or the tuning turns it off, and gemm_packed_rows' streams
   only where the tuning changes them (the defaults give the options, hence the programs, of
   before the tuning). */
static void cpu_options(const clmla_context *ctx, clmla_dtype dtype, size_t k, int rows, int large, char *out,
                        size_t size)
{
    const clmla_product_tuning *t = tuning(ctx, k);
    const int streams = rows == 1 ? t->packed_streams_1 : rows == 2 ? t->packed_streams_2 : t->packed_streams_4;
    const int default_streams = rows == 1 ? 8 : rows == 2 ? 4 : 3; /* the kernel's own STREAMS */
    char extra[160], streams_option[32] = "";
    if (streams != default_streams)
        snprintf(streams_option, sizeof(streams_option), " -D STREAMS=%d", streams);
    /* gemm_packed_rows' line-wide form: bf16, and fp8 where it decodes through half (cl/prelude.cl) */
    const int wide = t->cpu_wide && rows == 1 &&
                     (dtype == CLMLA_DTYPE_BF16 ||
                      (dtype == CLMLA_DTYPE_FP8_E4M3 && clmla_fp8_decoder(ctx) == CLMLA_FP8_DECODER_HALF));
    snprintf(extra, sizeof(extra), "-D MR=%d -D NCC=%d -D PCH=%d%s%s%s%s", rows, 8 / rows, pack_chunk(dtype),
             !large && t->cpu_prefetch && clmla_device_prefetches(&ctx->info) ? " -D CLMLA_PREFETCH" : "",
             streams_option,
             t->cpu_fp8_block_sums && dtype == CLMLA_DTYPE_FP8_E4M3 && rows <= 2 ? " -D W_BLOCK_SUMS" : "",
             wide ? " -D PACKED_WIDE" : "");
    dtype_options(ctx, dtype, extra, out, size);
}

/* The CPU kernel `name` (cl/gemm_rows.cl) for blocks of `rows` rows into *slot, built with
   cpu_options unless made. */
static clmla_status cpu_kernel(clmla_context *ctx, clmla_dtype dtype, size_t k, int rows, int large, const char *name,
                               cl_kernel *slot)
{
    if (*slot)
        return CLMLA_SUCCESS;
    char options[192];
    cpu_options(ctx, dtype, k, rows, large, options, sizeof(options));
    return clmla_kernel_create(ctx, "gemm_rows", options, name, slot);
}

/* The CPU forms for m rows: rows bucket 1, 2, 4 or 8, column blocks 8 / bucket (of single
   columns for the x W^T kernel, of float8 strips for the x B kernel). `large`: the x W^T kernel
   for 9 to TILED_MIN_ROWS - 1 rows, built without the weight prefetch, which slows products of
   that many rows and speeds the decode-shaped ones (docs/perf-log.md). */
static clmla_status rows_kernel(clmla_context *ctx, clmla_dtype dtype, size_t k, size_t m, int transposed_b, int large,
                                cl_kernel *kernel, int *columns)
{
    const int bucket = rows_bucket(m), rows = 1 << bucket;
    *columns = 8 / rows;
    clmla_stored_kernel *e = large          ? entry(ctx, PK_NT_ROWS_LARGE, dtype, k, 0)
                             : transposed_b ? entry(ctx, PK_NT_ROWS, dtype, k, bucket)
                                            : entry(ctx, PK_NN_ROWS, dtype, k, bucket);
    if (!e)
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    cl_kernel *slot = &e->kernel;
    clmla_status st =
        cpu_kernel(ctx, dtype, k, rows, large, transposed_b ? "gemm_skinny_nt_rows" : "gemm_skinny_nn_rows", slot);
    *kernel = *slot;
    return st;
}

static int fits_int(size_t v)
{
    return v <= (size_t)INT_MAX;
}

/* Arguments 0..18, common to every product kernel of cl/gemm_skinny.cl and cl/gemm_rows.cl: M N K
   alpha, then (buffer, offset, ld, batch stride) of A and B, beta, the same of C, then B's block
   scales and their row length. */
static clmla_status set_product_args(clmla_context *ctx, cl_kernel kernel, size_t m, size_t n, size_t k, float alpha,
                                     clmla_matrix a, size_t a_stride, clmla_matrix b, size_t b_stride, float beta,
                                     clmla_matrix c, size_t c_stride)
{
    const int M = (int)m, N = (int)n, K = (int)k;
    const int ao = (int)a.offset, lda = (int)a.ld, as = (int)a_stride;
    const int bo = (int)b.offset, ldb = (int)b.ld, bs = (int)b_stride;
    const int co = (int)c.offset, ldc = (int)c.ld, cs = (int)c_stride;
    const cl_mem scale = b.dtype == CLMLA_DTYPE_FP8_E4M3 ? b.scale : NULL;
    const int scale_ld = (int)b.scale_ld;
    CLMLA_SET_ARGS(ctx, kernel, 0, CLMLA_ARG(M), CLMLA_ARG(N), CLMLA_ARG(K), CLMLA_ARG(alpha), CLMLA_ARG(a.buffer),
                   CLMLA_ARG(ao), CLMLA_ARG(lda), CLMLA_ARG(as), CLMLA_ARG(b.buffer), CLMLA_ARG(bo), CLMLA_ARG(ldb),
                   CLMLA_ARG(bs), CLMLA_ARG(beta), CLMLA_ARG(c.buffer), CLMLA_ARG(co), CLMLA_ARG(ldc), CLMLA_ARG(cs),
                   CLMLA_ARG(scale), CLMLA_ARG(scale_ld));
    return CLMLA_SUCCESS;
}

/* Items wanted for a product on a CPU device: cpu_items_per_cu (8 by default) per compute unit. */
static size_t cpu_items(const clmla_context *ctx, const clmla_product_tuning *t)
{
    return (size_t)t->cpu_items_per_cu * (size_t)(ctx->info.compute_units ? ctx->info.compute_units : 1);
}

static clmla_status packed_rows(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c,
                                size_t c_stride, size_t batch, size_t panel, cl_event *event);

/* A CPU product kernel (cpu_kernel, built unless made) for blocks of `rows` rows, its arguments
   0..18 set; the caller sets the kernel's own and enqueues it. */
static clmla_status cpu_product(clmla_context *ctx, const char *name, cl_kernel *slot, int rows, size_t m, size_t n,
                                size_t k, float alpha, clmla_matrix a, size_t a_stride, clmla_matrix b,
                                size_t b_stride, float beta, clmla_matrix c, size_t c_stride)
{
    clmla_status st = cpu_kernel(ctx, b.dtype, k, rows, 0, name, slot);
    return st == CLMLA_SUCCESS ? set_product_args(ctx, *slot, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride)
                               : st;
}

/* Columns of a gemm_skinny_nn_wide work-item: its NW (64) float8 strips. */
#define NN_WIDE_COLUMNS 512

/* x B for 1 to 4 rows on a CPU device, B row-major with N a multiple of 8: gemm_skinny_nn_wide,
   one work-item per (product, run of NN_WIDE_COLUMNS columns). */
static clmla_status nn_wide(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                            size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c, size_t c_stride,
                            size_t batch, cl_event *event)
{
    const int bucket = rows_bucket(m);
    clmla_stored_kernel *e = entry(ctx, PK_NN_WIDE, b.dtype, k, bucket);
    if (!e)
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    cl_kernel *slot = &e->kernel;
    clmla_status st = cpu_product(ctx, "gemm_skinny_nn_wide", slot, 1 << bucket, m, n, k, alpha, a, a_stride, b,
                                  b_stride, beta, c, c_stride);
    if (st != CLMLA_SUCCESS)
        return st;
    const int row_blocks = 1;
    CLMLA_SET_ARG(ctx, *slot, 19, row_blocks);
    const size_t global[2] = {(n + NN_WIDE_COLUMNS - 1) / NN_WIDE_COLUMNS, batch}, local[2] = {1, 1};
    cl_int err = clmla_cl_enqueue(ctx, *slot, 2, global, local, event);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue gemm_skinny_nn_wide");
}

/* Products of up to SKINNY_MAX_ROWS rows. On CPU devices, two forms before the general ones, for the
   absorbed path's per-head products at decode (docs/perf-log.md, "The absorbed path's per-head
   products"): x W^T with W row-major and rows that fit one chunk of the packing, which is then the
   packed layout, through gemm_packed_rows in panels of a work-item's share (W^UV: 8 streams far
   apart instead of 8 adjacent rows); x B with 1 to 4 rows and work for two items per compute unit
   at least, through gemm_skinny_nn_wide (W^UK: whole rows in turn instead of 64 columns of every
   row; with 8 rows its sums no longer fit in registers, and the L1 traffic costs more than the
   stride saves). */
static clmla_status skinny(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                           size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c, size_t c_stride,
                           size_t batch, cl_event *event)
{
    cl_kernel kernel = NULL;
    int columns = 0, wg = 0, bucket = 0, nc_log = 0;
    const int cpu = clmla_products_rows(ctx);
    const int cpu_rows = cpu && b.transposed;
    const int cpu_nn = cpu && !b.transposed && n % 8 == 0;
    /* x B on other devices, K split over a group's items where the tuning asks (skinny_nn_slices) */
    const int nn_split = !cpu && !b.transposed && n % 4 == 0 && tuning(ctx, k)->skinny_nn_slices > 1;
    if (cpu && m > 0 && n > 0 && batch > 0) {
        if (cpu_rows && b.ld == k && k <= (size_t)pack_chunk(b.dtype)) {
            const size_t items_wanted = cpu_items(ctx, tuning(ctx, k));
            size_t panel = (n * batch + items_wanted - 1) / items_wanted;
            panel = panel > n ? n : panel;
            return packed_rows(ctx, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride, batch, panel, event);
        }
        const size_t cus = ctx->info.compute_units ? ctx->info.compute_units : 1;
        if (cpu_nn && m <= 4 && batch * ((n + NN_WIDE_COLUMNS - 1) / NN_WIDE_COLUMNS) >= 2 * cus)
            return nn_wide(ctx, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride, batch, event);
    }
    clmla_status st;
    if (cpu_rows || cpu_nn)
        st = rows_kernel(ctx, b.dtype, k, m, b.transposed, 0, &kernel, &columns);
    else if (b.transposed) {
        bucket = rows_bucket(m);
        nc_log = nt_columns_log(ctx, n, k, batch);
        st = nt_kernel(ctx, b.dtype, k, bucket, nc_log, nt_aligned(ctx, k, &a, a_stride, &b, b_stride, batch), &kernel,
                       &wg);
    } else if (nn_split) {
        bucket = rows_bucket(m);
        st = nn_split_kernel(ctx, b.dtype, k, bucket, nn_aligned(ctx, k, &b, b_stride, batch), &kernel, &wg);
    } else {
        st = nn_kernel(ctx, b.dtype, k, &kernel, &wg);
    }
    if (st != CLMLA_SUCCESS)
        return st;
    if ((st = set_product_args(ctx, kernel, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride)) != CLMLA_SUCCESS)
        return st;
    cl_int err;
    if (cpu_rows) {
        /* About 8 items per compute unit over the whole batch, in whole column blocks. */
        const size_t items_wanted = cpu_items(ctx, tuning(ctx, k));
        size_t per_item = (n * batch + items_wanted - 1) / items_wanted;
        per_item = (per_item + columns - 1) / columns * columns;
        if (per_item > n)
            per_item = (n + columns - 1) / columns * columns;
        const int cpi = (int)per_item, row_blocks = 1;
        /* chunks of K whose x rows take 16 KiB, half of a common L1 */
        const int k_chunk = (int)(16384 / (sizeof(float) * (size_t)(8 / columns))) & ~7;
        CLMLA_SET_ARG(ctx, kernel, 19, cpi);
        CLMLA_SET_ARG(ctx, kernel, 20, row_blocks);
        CLMLA_SET_ARG(ctx, kernel, 21, k_chunk);
        const size_t global[2] = {(n + per_item - 1) / per_item, batch}, local[2] = {1, 1};
        err = clmla_cl_enqueue(ctx, kernel, 2, global, local, event);
    } else if (cpu_nn) {
        const size_t strip = 8 * (size_t)columns;
        const int strips_per_item = 1, row_blocks = 1;
        CLMLA_SET_ARG(ctx, kernel, 19, strips_per_item);
        CLMLA_SET_ARG(ctx, kernel, 20, row_blocks);
        const size_t global[2] = {(n + strip - 1) / strip, batch}, local[2] = {1, 1};
        err = clmla_cl_enqueue(ctx, kernel, 2, global, local, event);
    } else if (nn_split) {
        const size_t columns_per_group = 4 * (size_t)(wg / tuning(ctx, k)->skinny_nn_slices);
        const size_t global[2] = {(n + columns_per_group - 1) / columns_per_group * (size_t)wg, batch},
                     local[2] = {(size_t)wg, 1};
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

/* The skinny and _rows kernels take A and C untransposed and every index as int. */
static int int_operands(const clmla_matrix *a, const clmla_matrix *b, const clmla_matrix *c, size_t a_span,
                        size_t b_span, size_t c_span)
{
    return !a->transposed && !c->transposed && fits_int(a->offset + a_span) && fits_int(b->offset + b_span) &&
           fits_int(c->offset + c_span) && fits_int(a->ld) && fits_int(b->ld) && fits_int(c->ld);
}

static int use_skinny(size_t m, const clmla_matrix *a, const clmla_matrix *b, const clmla_matrix *c, size_t a_span,
                      size_t b_span, size_t c_span)
{
    return m <= SKINNY_MAX_ROWS && int_operands(a, b, c, a_span, b_span, c_span);
}

/* y = x W^T for TILED_MIN_ROWS rows or more on CPU devices: gemm_tiled_rows, tiles of tiled_rows
   x tiled_columns of C per work-item (256 x 48 by default), K in chunks of tiled_k_chunk (1024; the
   packing's chunk where W is packed), tiled_weight_rows (3) rows of W against 4 of x at a time.
   Below TILED_MIN_ROWS, where the read of W and not the arithmetic sets the time, blocks of rows
   that stream W again per block run instead (docs/perf-log.md has the crossover). */
#define TILED_MIN_ROWS 64
static clmla_status tiled(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                          clmla_matrix b, float beta, clmla_matrix c, cl_event *event)
{
    const int packed_b = b.panel != 0;
    const clmla_product_tuning *t = tuning(ctx, k);
    clmla_stored_kernel *e = entry(ctx, PK_TILED_ROWS, b.dtype, k, packed_b);
    if (!e)
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    cl_kernel *slot = &e->kernel;
    if (!*slot) {
        char extra[128], options[224], mc[16] = "";
        if (t->tiled_weight_rows != 3) /* the kernel's own MC: the defaults build the options of before */
            snprintf(mc, sizeof(mc), " -D MC=%d", t->tiled_weight_rows);
        /* weights of another dtype decoded once per chunk into local memory, where it holds them */
        const int kc = packed_b ? pack_chunk(b.dtype) : t->tiled_k_chunk;
        const int decode = b.dtype != CLMLA_DTYPE_F32 &&
                           (uint64_t)t->tiled_columns * (uint64_t)kc * sizeof(float) <= ctx->info.local_mem_bytes;
        snprintf(extra, sizeof(extra), "-D TR=%d -D TC=%d -D KC=%d%s%s", t->tiled_rows, t->tiled_columns, kc, mc,
                 decode ? " -D TILED_DECODE" : "");
        dtype_options(ctx, b.dtype, extra, options, sizeof(options));
        clmla_status st = clmla_kernel_create(ctx, "gemm_rows", options, "gemm_tiled_rows", slot);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    clmla_status st = set_product_args(ctx, *slot, m, n, k, alpha, a, 0, b, 0, beta, c, 0);
    if (st != CLMLA_SUCCESS)
        return st;
    const int panel = (int)b.panel;
    CLMLA_SET_ARG(ctx, *slot, 19, panel);
    const size_t tc = (size_t)t->tiled_columns, tr = (size_t)t->tiled_rows;
    const size_t global[2] = {(n + tc - 1) / tc, (m + tr - 1) / tr};
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
    clmla_status st = rows_kernel(ctx, b.dtype, k, 4, 1, 1, &kernel, &columns);
    if (st != CLMLA_SUCCESS)
        return st;
    if ((st = set_product_args(ctx, kernel, m, n, k, alpha, a, 0, b, 0, beta, c, 0)) != CLMLA_SUCCESS)
        return st;
    const int cpi = 64, row_blocks = (int)((m + 3) / 4), k_chunk = 0; /* all of K: measured for large products */
    CLMLA_SET_ARG(ctx, kernel, 19, cpi);
    CLMLA_SET_ARG(ctx, kernel, 20, row_blocks);
    CLMLA_SET_ARG(ctx, kernel, 21, k_chunk);
    const size_t global[2] = {(n + cpi - 1) / cpi, (size_t)row_blocks}, local[2] = {1, 1};
    cl_int err = clmla_cl_enqueue(ctx, kernel, 2, global, local, event);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue gemm_skinny_nt_rows");
}

size_t clmla_weight_panel(const clmla_context *ctx, size_t n, size_t k)
{
    if (!clmla_products_rows(ctx) || forced(ctx) || n == 0)
        return 0;
    clmla_product_tuning t;
    clmla_product_tuning_for(ctx, k, &t);
    size_t items = cpu_items(ctx, &t);
    if (t.cpu_min_panel > 0) { /* fewer items per compute unit where theirs would hold fewer rows */
        const size_t cus = ctx->info.compute_units ? ctx->info.compute_units : 1;
        const size_t fit = n / (cus * (size_t)t.cpu_min_panel);
        if (fit < (size_t)t.cpu_items_per_cu)
            items = cus * (fit > 0 ? fit : 1);
    }
    return (n + items - 1) / items;
}

void clmla_pack_weight(const void *w, size_t n, size_t k, size_t bytes, size_t panel, void *out)
{
    const char *src = w;
    char *dst = out;
    for (size_t p0 = 0; p0 < n; p0 += panel) {
        const size_t rows = n - p0 < panel ? n - p0 : panel;
        const size_t chunk = clmla_pack_chunk(bytes);
        for (size_t k0 = 0; k0 < k; k0 += chunk) {
            const size_t len = k - k0 < chunk ? k - k0 : chunk;
            for (size_t r = 0; r < rows; r++, dst += len * bytes)
                memcpy(dst, src + ((p0 + r) * k + k0) * bytes, len * bytes);
        }
    }
}

/* gemm_packed_rows over `batch` products at the given strides, W in panels of `panel` rows: packed
   by clmla_pack_weight, or row-major with rows that fit one chunk of the packing (the same layout
   then, whatever the panel), one work-item per (product, panel, block of rows). */
static clmla_status packed_rows(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c,
                                size_t c_stride, size_t batch, size_t panel, cl_event *event)
{
    const int bucket = rows_bucket(m);
    clmla_stored_kernel *e = entry(ctx, PK_PACKED_ROWS, b.dtype, k, bucket);
    if (!e)
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    cl_kernel *slot = &e->kernel;
    clmla_status st = cpu_product(ctx, "gemm_packed_rows", slot, 1 << bucket, m, n, k, alpha, a, a_stride, b, b_stride,
                                  beta, c, c_stride);
    if (st != CLMLA_SUCCESS)
        return st;
    const int panel_arg = (int)panel, row_blocks = (int)((m + (1u << bucket) - 1) >> bucket);
    CLMLA_SET_ARG(ctx, *slot, 19, panel_arg);
    CLMLA_SET_ARG(ctx, *slot, 20, row_blocks);
    const size_t global[2] = {(n + panel - 1) / panel, batch * (size_t)row_blocks}, local[2] = {1, 1};
    cl_int err = clmla_cl_enqueue(ctx, *slot, 2, global, local, event);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue gemm_packed_rows");
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
    return packed_rows(ctx, m, n, k, alpha, a, 0, b, 0, beta, c, 0, 1, b.panel, event);
}

/* A CLBlast routine in the context's trace (trace.h), named by its batch (0: CLBlastSgemm, else the strided batch) and
   sized m, n, k. */
static void trace_clblast(clmla_context *ctx, CLBlastStatusCode bs, size_t batch, size_t m, size_t n, size_t k,
                          cl_event *ev, int owned)
{
    if (!ctx->trace)
        return;
    const size_t mnk[3] = {m, n, k};
    char what[88];
    if (batch == 0)
        snprintf(what, sizeof(what), "CLBlastSgemm (m,n,k)");
    else
        snprintf(what, sizeof(what), "CLBlastSgemmStridedBatched x%zu (m,n,k)", batch);
    clmla_trace_record(ctx, bs == CLBlastSuccess ? CL_SUCCESS : bs, "clblast", what, 3, mnk, NULL, ev, owned);
}

/* CLBlastSgemm with its temporary buffer (padded copies of the operands, for its indirect kernel)
   in a context scratch slot, so that a product does not allocate one per call. */
static CLBlastStatusCode clblast_sgemm(clmla_context *ctx, CLBlastTranspose a_op, CLBlastTranspose b_op, size_t m,
                                       size_t n, size_t k, float alpha, cl_mem a, size_t a_offset, size_t a_ld, cl_mem b,
                                       size_t b_offset, size_t b_ld, float beta, cl_mem c, size_t c_offset, size_t c_ld,
                                       cl_event *event)
{
    size_t temp_bytes = 0;
    CLBlastStatusCode bs = CLBlastSGemmTempBufferSize(CLBlastLayoutRowMajor, a_op, b_op, m, n, k, a_offset, a_ld, b_offset,
                                                      b_ld, c_offset, c_ld, &ctx->queue, &temp_bytes);
    if (bs != CLBlastSuccess)
        return bs;
    cl_mem temp = NULL;
    const clmla_status st = clmla_scratch(ctx, SCRATCH_CLBLAST_TEMP, temp_bytes, &temp);
    if (st != CLMLA_SUCCESS)
        return (CLBlastStatusCode)st; /* OpenCL's code, which CLBlast's codes include */
    clmla_count_clblast(ctx);
    cl_event own = NULL, *ev = clmla_trace_event(ctx, event, &own);
    bs = CLBlastSgemmWithTempBuffer(CLBlastLayoutRowMajor, a_op, b_op, m, n, k, alpha, a, a_offset, a_ld, b, b_offset, b_ld,
                                    beta, c, c_offset, c_ld, &ctx->queue, ev, temp);
    trace_clblast(ctx, bs, 0, m, n, k, ev, ev == &own);
    return bs;
}

/* CLBlast with B of a weight dtype: B decoded to float32 a piece of at most WEIGHT_PIECE_BYTES at a
   time into a scratch (no whole float32 copy of a weight), each piece's product run before the
   next is decoded (the queue is in order). y = x W^T (B transposed, W [n, k]): a piece of W's rows
   gives a block of C's columns; x W (W [k, n]): a piece of W's rows is a piece of K, the pieces
   after the first added with beta 1. B row-major (packed weights never come here). */
#define WEIGHT_PIECE_BYTES ((size_t)32 << 20)
/* Decodes nr rows of cols values of the weight b, from element `offset` (b.ld apart), into the
   float32 rows of f32 (cols apart), through gemm_weight_f32 (kept with the kernels of a product of
   K = k). */
static clmla_status decode_rows(clmla_context *ctx, clmla_matrix b, size_t k, size_t offset, size_t nr, size_t cols,
                                cl_mem f32)
{
    clmla_stored_kernel *e = entry(ctx, PK_WEIGHT_F32, b.dtype, k, 0);
    if (!e)
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    cl_kernel *kernel = &e->kernel;
    if (!*kernel) {
        char options[96];
        dtype_options(ctx, b.dtype, "", options, sizeof(options));
        clmla_status st = clmla_kernel_create(ctx, "convert", options, "gemm_weight_f32", kernel);
        if (st != CLMLA_SUCCESS)
            return st;
    }
    const int b_offset = (int)offset, ldb = (int)b.ld, nri = (int)nr, K = (int)cols, scale_ld = (int)b.scale_ld;
    const cl_mem scale = b.dtype == CLMLA_DTYPE_FP8_E4M3 ? b.scale : NULL;
    CLMLA_SET_ARG(ctx, *kernel, 0, b.buffer);
    CLMLA_SET_ARG(ctx, *kernel, 1, b_offset);
    CLMLA_SET_ARG(ctx, *kernel, 2, ldb);
    CLMLA_SET_ARG(ctx, *kernel, 3, nri);
    CLMLA_SET_ARG(ctx, *kernel, 4, K);
    CLMLA_SET_ARG(ctx, *kernel, 5, scale);
    CLMLA_SET_ARG(ctx, *kernel, 6, scale_ld);
    CLMLA_SET_ARG(ctx, *kernel, 7, f32);
    const size_t global[2] = {cols, nr};
    cl_int err = clmla_cl_enqueue_rows(ctx, *kernel, 2, global, NULL);
    return err == CL_SUCCESS ? CLMLA_SUCCESS : clmla_fail_cl(ctx, err, "enqueue gemm_weight_f32");
}

static clmla_status decoded_gemm(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                 clmla_matrix b, float beta, clmla_matrix c, cl_event *event)
{
    const size_t rows = b.transposed ? n : k, cols = b.transposed ? k : n;
    size_t piece = WEIGHT_PIECE_BYTES / (cols * sizeof(float));
    piece = piece < 1 ? 1 : piece > rows ? rows : piece;
    if (b.panel || !fits_int(b.offset + rows * b.ld) || !fits_int(cols) || !fits_int(b.scale_ld))
        return clmla_fail(ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "a %s weight through CLBlast (m=%zu n=%zu k=%zu): only row-major within int indices",
                          clmla_dtype_name(b.dtype), m, n, k);
    cl_mem f32 = NULL;
    clmla_status st = clmla_scratch(ctx, SCRATCH_WEIGHT_F32, piece * cols * sizeof(float), &f32);
    for (size_t r0 = 0; st == CLMLA_SUCCESS && r0 < rows; r0 += piece) {
        const size_t nr = rows - r0 < piece ? rows - r0 : piece;
        st = decode_rows(ctx, b, k, b.offset + r0 * b.ld, nr, cols, f32);
        if (st != CLMLA_SUCCESS)
            return st;
        cl_event *ev = r0 + nr == rows ? event : NULL;
        CLBlastStatusCode bs;
        if (b.transposed) /* columns [r0, r0 + nr) of C */
            bs = clblast_sgemm(ctx, op(&a), CLBlastTransposeYes, m, nr, k, alpha, a.buffer, a.offset, a.ld, f32, 0, cols,
                               beta, c.buffer, c.offset + r0, c.ld, ev);
        else /* K's values [r0, r0 + nr): A's columns (or rows, transposed) */
            bs = clblast_sgemm(ctx, op(&a), CLBlastTransposeNo, m, n, nr, alpha, a.buffer,
                               a.offset + (a.transposed ? r0 * a.ld : r0), a.ld, f32, 0, cols, r0 ? 1.0f : beta, c.buffer,
                               c.offset, c.ld, ev);
        if (bs != CLBlastSuccess)
            return clmla_fail(ctx, bs, "CLBlastSgemm(m=%zu n=%zu k=%zu, a decoded %s piece) failed: %s", m, n, k,
                              clmla_dtype_name(b.dtype), clmla_status_string(bs));
    }
    return st;
}

clmla_status clmla_gemm(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a, clmla_matrix b,
                        float beta, clmla_matrix c, cl_event *event)
{
    clmla_status st = ensure_products(ctx);
    if (st != CLMLA_SUCCESS)
        return st;
    if (b.panel) /* packed weights: only gemm_packed_rows reads them, whatever the device */
        return packed(ctx, m, n, k, alpha, a, b, beta, c, event);
    if (!forced(ctx) && clmla_products_rows(ctx) && m > SKINNY_MAX_ROWS && b.transposed &&
        !a.transposed && fits_int(a.offset + m * a.ld) && fits_int(b.offset + n * b.ld) && fits_int(c.offset + m * c.ld))
        return rows_large(ctx, m, n, k, alpha, a, b, beta, c, event);
    if (!forced(ctx) && use_skinny(m, &a, &b, &c, m * a.ld, (b.transposed ? n : k) * b.ld, m * c.ld))
        return skinny(ctx, m, n, k, alpha, a, 0, b, 0, beta, c, 0, 1, event);
    if (clmla_fault_hit(ctx))
        return clmla_fail(ctx, CL_OUT_OF_RESOURCES, "CLBlastSgemm(m=%zu n=%zu k=%zu): injected fault", m, n, k);
    if (b.dtype != CLMLA_DTYPE_F32)
        return decoded_gemm(ctx, m, n, k, alpha, a, b, beta, c, event);
    CLBlastStatusCode bs = clblast_sgemm(ctx, op(&a), op(&b), m, n, k, alpha, a.buffer, a.offset, a.ld, b.buffer, b.offset,
                                         b.ld, beta, c.buffer, c.offset, c.ld, event);
    if (bs != CLBlastSuccess)
        return clmla_fail(ctx, bs, "CLBlastSgemm(m=%zu n=%zu k=%zu) failed: %s", m, n, k, clmla_status_string(bs));
    return CLMLA_SUCCESS;
}

/* A batch of products of more than SKINNY_MAX_ROWS rows each on a CPU device (the absorbed path's
   per-head W^UK and W^UV for a prefill chunk, or for a decode batch of more than 8 tokens), on
   operands the _rows kernels take (x B: N a multiple of 8; W not packed): the kernels in blocks of
   rows, dimension 1 over (product, block). x W^T: blocks of 4 rows x 64 columns, all of K
   (rows_large's kernel); x B: blocks of 8 rows x 8 columns, each item walking enough of them along
   N for about cpu_items items in all, instead of CLBlast's batched GEMM, which would decode a
   weight of another dtype once per batch entry (docs/perf-log.md, "Which path, prefix-aware"). */
static clmla_status batched_rows(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                 size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c,
                                 size_t c_stride, size_t batch, cl_event *event)
{
    const int nt = b.transposed;
    const size_t rows = nt ? 4 : 8; /* the kernel's MR */
    cl_kernel kernel = NULL;
    int columns = 0;
    clmla_status st = rows_kernel(ctx, b.dtype, k, rows, nt, nt, &kernel, &columns);
    if (st == CLMLA_SUCCESS)
        st = set_product_args(ctx, kernel, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride);
    if (st != CLMLA_SUCCESS)
        return st;
    const size_t row_blocks = (m + rows - 1) / rows, pairs = batch * row_blocks;
    size_t per_item; /* columns (x W^T) or strips of 8 columns (x B) an item takes */
    if (nt) {
        per_item = 64;
        const int k_chunk = 0;
        CLMLA_SET_ARG(ctx, kernel, 21, k_chunk);
    } else {
        const size_t strips = n / 8, items = cpu_items(ctx, tuning(ctx, k));
        per_item = (strips * pairs + items - 1) / items;
        per_item = per_item < 1 ? 1 : per_item > strips ? strips : per_item;
    }
    const int per_item_arg = (int)per_item, row_blocks_arg = (int)row_blocks;
    CLMLA_SET_ARG(ctx, kernel, 19, per_item_arg);
    CLMLA_SET_ARG(ctx, kernel, 20, row_blocks_arg);
    const size_t span = nt ? per_item : 8 * per_item;
    const size_t global[2] = {(n + span - 1) / span, pairs}, local[2] = {1, 1};
    const cl_int err = clmla_cl_enqueue(ctx, kernel, 2, global, local, event);
    return err == CL_SUCCESS ? CLMLA_SUCCESS
                             : clmla_fail_cl(ctx, err, nt ? "enqueue gemm_skinny_nt_rows" : "enqueue gemm_skinny_nn_rows");
}

/* CLBlast's strided-batched SGEMM on float32 operands. */
static clmla_status clblast_strided(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                    size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c,
                                    size_t c_stride, size_t batch, cl_event *event)
{
    clmla_count_clblast(ctx);
    cl_event own = NULL, *ev = clmla_trace_event(ctx, event, &own);
    const CLBlastStatusCode bs = CLBlastSgemmStridedBatched(
        CLBlastLayoutRowMajor, op(&a), op(&b), m, n, k, alpha, a.buffer, a.offset, a.ld, a_stride, b.buffer, b.offset, b.ld,
        b_stride, beta, c.buffer, c.offset, c.ld, c_stride, batch, &ctx->queue, ev);
    trace_clblast(ctx, bs, batch, m, n, k, ev, ev == &own);
    if (bs != CLBlastSuccess)
        return clmla_fail(ctx, bs, "CLBlastSgemmStridedBatched(m=%zu n=%zu k=%zu batch=%zu) failed: %s", m, n, k, batch,
                          clmla_status_string(bs));
    return CLMLA_SUCCESS;
}

/* A strided batch whose B has a weight dtype, through CLBlast: where the entries' B lie whole rows
   apart in one weight (the per-head slices of kv_b_proj), as many entries as WEIGHT_PIECE_BYTES
   holds are decoded together (the rows they span, one launch) and multiplied by one
   CLBlastSgemmStridedBatched, instead of a decode and a product per entry (V3: 128 heads, 256
   calls); otherwise, or when a group would hold one entry, entry by entry (decoded_gemm). */
static clmla_status decoded_batched(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                    size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c,
                                    size_t c_stride, size_t batch, cl_event *event)
{
    const size_t rows = b.transposed ? n : k, cols = b.transposed ? k : n;
    const size_t span = b.ld ? b_stride / b.ld : 0; /* rows from one entry's first to the next's */
    const size_t piece = products(ctx)->weight_piece ? products(ctx)->weight_piece : WEIGHT_PIECE_BYTES;
    size_t group = span ? piece / (span * cols * sizeof(float)) : 0;
    group = group > batch ? batch : group;
    const size_t last = b.offset + ((batch - 1) * span + rows) * b.ld;
    if (b.panel || b.ld != cols || b_stride % b.ld || span < rows || group < 2 || !fits_int(last) || !fits_int(cols) ||
        !fits_int(b.scale_ld)) {
        for (size_t i = 0; i < batch; i++) {
            clmla_matrix ai = a, bi = b, ci = c;
            ai.offset += i * a_stride;
            bi.offset += i * b_stride;
            ci.offset += i * c_stride;
            clmla_status st = decoded_gemm(ctx, m, n, k, alpha, ai, bi, beta, ci, i + 1 == batch ? event : NULL);
            if (st != CLMLA_SUCCESS)
                return st;
        }
        return CLMLA_SUCCESS;
    }
    clmla_matrix decoded = b; /* the group's rows in float32, span rows apart */
    decoded.dtype = CLMLA_DTYPE_F32;
    decoded.offset = 0;
    decoded.ld = cols;
    clmla_status st = clmla_scratch(ctx, SCRATCH_WEIGHT_F32, group * span * cols * sizeof(float), &decoded.buffer);
    for (size_t i0 = 0; st == CLMLA_SUCCESS && i0 < batch; i0 += group) {
        const size_t g = batch - i0 < group ? batch - i0 : group;
        clmla_matrix ai = a, ci = c;
        ai.offset += i0 * a_stride;
        ci.offset += i0 * c_stride;
        st = decode_rows(ctx, b, k, b.offset + i0 * b_stride, (g - 1) * span + rows, cols, decoded.buffer);
        if (st == CLMLA_SUCCESS)
            st = clblast_strided(ctx, m, n, k, alpha, ai, a_stride, decoded, span * cols, beta, ci, c_stride, g,
                                 i0 + g == batch ? event : NULL);
    }
    return st;
}

clmla_status clmla_gemm_strided_batched(clmla_context *ctx, size_t m, size_t n, size_t k, float alpha, clmla_matrix a,
                                        size_t a_stride, clmla_matrix b, size_t b_stride, float beta, clmla_matrix c,
                                        size_t c_stride, size_t batch, cl_event *event)
{
    clmla_status st = ensure_products(ctx);
    if (st != CLMLA_SUCCESS)
        return st;
    const int own = !forced(ctx) && fits_int(a_stride) && fits_int(b_stride) && fits_int(c_stride) && fits_int(batch) &&
                    int_operands(&a, &b, &c, batch * a_stride + m * a.ld, batch * b_stride + (b.transposed ? n : k) * b.ld,
                                 batch * c_stride + m * c.ld);
    if (own && m <= SKINNY_MAX_ROWS)
        return skinny(ctx, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride, batch, event);
    if (own && clmla_products_rows(ctx) && !b.panel && (b.transposed || n % 8 == 0))
        return batched_rows(ctx, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride, batch, event);
    if (clmla_fault_hit(ctx))
        return clmla_fail(ctx, CL_OUT_OF_RESOURCES, "CLBlastSgemmStridedBatched: injected fault");
    if (b.dtype != CLMLA_DTYPE_F32)
        return decoded_batched(ctx, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride, batch, event);
    return clblast_strided(ctx, m, n, k, alpha, a, a_stride, b, b_stride, beta, c, c_stride, batch, event);
}
