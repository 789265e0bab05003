/* Every kernel clmla ships (the .cl files of cl/), launched directly on small odd shapes and compared with a
 * host computation, and then the library's own launches of them on tiny shapes. This is the
 * program ci/oclgrind.sh runs under oclgrind (out-of-bounds accesses, data races, uninitialised
 * values, API misuse); on the default device it is an ordinary ctest entry.
 *
 *   coverage  every `__kernel` function in the .cl files of CLMLA_SOURCE_DIR/cl has a direct test here, and
 *             when `kernels` ran, was launched by it (a new kernel file fails until it is tested);
 *   kernels   rmsnorm (three work-group sizes, offsets, columns past the normalised ones untouched),
 *             rope (both pairings, heads and k^R, positions out of order), cache_write and
 *             cache_gather (f32 and f16: round-to-nearest-even halves, padded strides, offsets,
 *             permuted slots and block tables, rows outside untouched), attn_latent (1, 3, 8 and 16
 *             heads per group with a partial last group and padded ones, rows not a whole number of float4s, 1 to 3
 *             splits with empty ones, contexts of 0, 1, mid-block and exact multiples), attn_combine
 *             (splits and whole rows of -inf), attn_prefill (query tiles cut short, a cached
 *             prefix, padded strides and offsets);
 *   layer     clmla_layer_forward (both paths, f32 and f16 caches, a mixed AUTO batch),
 *             clmla_attention_latent with split-KV, clmla_cache_read, against the float64
 *             reference, with the launches of a CPU device and of a GPU (layer-dense: the dense
 *             layer alone; layer-dsa: DSA's layer and the split attention).
 *
 * Every device buffer this program makes lives until exit. With --keep-buffers the library's own
 * clReleaseMemObject calls are kept from freeing too (this file defines clReleaseMemObject, which
 * then does nothing): oclgrind 21.10's uninitialised-value checker keeps the shadow state of a
 * released buffer and hands it to the next buffer that reuses its slot, which reports false errors
 * (and hides true ones) in any program that frees and allocates buffers as it goes. */
#define _GNU_SOURCE
#include "check.h"
#include "clmla.h"
#include "internal.h"
#include "indexer_ref.h"
#include "mla_ref.h"
#include "program.h"
#include "test_util.h"
#include "tolerance.h"

#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef CLMLA_SOURCE_DIR
#error "CLMLA_SOURCE_DIR (the repository root) must be defined"
#endif

static clmla_context *ctx;

/* --skip TEXT: latent cases whose name contains TEXT are not run (ci/oclgrind.sh leaves the slowest
   emulated case to its optimised run, which is several times faster than its every-check one);
   --only TEXT: only those whose name contains one of the TEXTs given are (to rerun one case while
   working on it; ci/oclgrind.sh splits the latent cases between processes). */
enum { MAX_SKIPS = 4, MAX_ONLY = 4 };
static const char *skips[MAX_SKIPS], *onlys[MAX_ONLY];
static int num_skips, num_onlys;

static int case_skipped(const char *name)
{
    int wanted = num_onlys == 0;
    for (int i = 0; i < num_onlys && !wanted; i++)
        wanted = strstr(name, onlys[i]) != NULL;
    if (!wanted)
        return 1;
    for (int i = 0; i < num_skips; i++)
        if (strstr(name, skips[i])) {
            printf("# %s: skipped (--skip \"%s\")\n", name, skips[i]);
            return 1;
        }
    return 0;
}

/* ---- buffers that outlive everything ------------------------------------------------------------ */

static int keep_buffers;

/* Interposes the OpenCL entry point for the whole program (the static library and CLBlast call
   this one); see the file comment. */
CL_API_ENTRY cl_int CL_API_CALL clReleaseMemObject(cl_mem memobj)
{
    static cl_int(CL_API_CALL * real)(cl_mem);
    if (keep_buffers)
        return memobj ? CL_SUCCESS : CL_INVALID_MEM_OBJECT;
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "clReleaseMemObject");
    return real ? real(memobj) : CL_INVALID_MEM_OBJECT;
}

enum { MAX_OBJECTS = 512 };
static cl_mem buffers[MAX_OBJECTS];
static int num_buffers;
static cl_kernel kernels[MAX_OBJECTS];
static int num_kernels;

static cl_mem buffer(size_t bytes, const void *host)
{
    cl_mem m = tu_buffer(ctx, bytes, host);
    if (m && num_buffers < MAX_OBJECTS)
        buffers[num_buffers++] = m;
    return m;
}

static void download(cl_mem m, size_t bytes, void *host)
{
    tu_read_buffer(ctx, m, bytes, host);
}

/* ---- kernels and which ones ran ------------------------------------------------------------------ */

enum { MAX_NAMES = 64 };
static char launched[MAX_NAMES][64];
static int num_launched;

static cl_kernel kernel(const char *file, const char *options, const char *name)
{
    cl_kernel k = NULL;
    clmla_status st = clmla_kernel_create(ctx, file, options, name, &k);
    CHECK(st == CLMLA_SUCCESS, "%s.cl with '%s': %s: %s", file, options, clmla_status_string(st), clmla_last_error(ctx));
    if (k && num_kernels < MAX_OBJECTS)
        kernels[num_kernels++] = k;
    return k;
}

#define ARG(k, i, v)                                                                                   \
    do {                                                                                               \
        cl_int e_ = clSetKernelArg((k), (i), sizeof(v), &(v));                                         \
        CHECK(e_ == CL_SUCCESS, "clSetKernelArg(%d): %d", (int)(i), e_);                               \
    } while (0)

/* One kernel argument: its size and where its value is. */
typedef struct karg {
    size_t size;
    const void *value;
} karg;
#define KARG(v) {sizeof(v), &(v)}

/* One CHECK per argument, as ARG: args[j] becomes argument first + j of k. */
static void set_args(cl_kernel k, int first, const karg *args, int n)
{
    for (int j = 0; j < n; j++) {
        cl_int e = clSetKernelArg(k, (cl_uint)(first + j), args[j].size, args[j].value);
        CHECK(e == CL_SUCCESS, "clSetKernelArg(%d): %d", first + j, e);
    }
}

/* ARGS(k, first, KARG(a), KARG(b), ...): a, b, ... become arguments first, first + 1, ... of k. */
#define ARGS(k, first, ...)                                                                            \
    set_args((k), (first), (const karg[]){__VA_ARGS__},                                                \
             (int)(sizeof((const karg[]){__VA_ARGS__}) / sizeof(karg)))

static int launch(cl_kernel k, cl_uint dims, const size_t *global, const size_t *local)
{
    if (!k)
        return 0;
    cl_int err = clEnqueueNDRangeKernel(clmla_context_queue(ctx), k, dims, NULL, global, local, 0, NULL, NULL);
    CHECK(err == CL_SUCCESS, "clEnqueueNDRangeKernel: %d", err);
    clFinish(clmla_context_queue(ctx));
    char name[64];
    tu_kernel_name(k, name, sizeof(name));
    int seen = 0;
    for (int i = 0; i < num_launched; i++)
        seen |= strcmp(launched[i], name) == 0;
    if (!seen && num_launched < MAX_NAMES)
        snprintf(launched[num_launched++], sizeof(launched[0]), "%s", name);
    return err == CL_SUCCESS;
}

/* ---- host helpers ---------------------------------------------------------------------------------- */

static uint32_t shift_rne(uint32_t v, int s)
{
    const uint32_t q = v >> s, r = v & ((1u << s) - 1), half = 1u << (s - 1);
    return q + (r > half || (r == half && (q & 1)));
}

/* float -> IEEE half, round to nearest even (what vstore_half_rte must do). */
static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7FFFFF;
    const int exp = (int)((x >> 23) & 0xFF);
    if (exp == 0xFF)
        return (uint16_t)(sign | 0x7C00 | (mant ? 0x200 : 0));
    const int e = exp - 127 + 15;
    if (e >= 0x1F)
        return (uint16_t)(sign | 0x7C00);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        return (uint16_t)(sign | shift_rne(mant | 0x800000, 14 - e));
    }
    const uint32_t h = ((uint32_t)e << 10) + shift_rne(mant, 13); /* a carry may reach the exponent */
    return (uint16_t)(sign | (h >= 0x7C00 ? 0x7C00 : h));
}

static void fill(float *a, size_t n, float amplitude, tu_rng *rng)
{
    tu_fill_uniform(a, n, 0.0f, amplitude, rng);
}

/* max |got - want| / max |want| over n, like CHECK_CLOSE but for two host arrays. */
#define CHECK_NEAR(got, want, n, cols, tol, ...)                                                           \
    do {                                                                                                   \
        double *w_ = malloc(((size_t)(n) + 1) * sizeof(double));                                          \
        for (size_t i_ = 0; i_ < (size_t)(n); i_++)                                                         \
            w_[i_] = (want)[i_];                                                                           \
        CHECK_CLOSE(got, w_, n, cols, tol, __VA_ARGS__);                                                   \
        free(w_);                                                                                          \
    } while (0)

/* ---- rmsnorm ---------------------------------------------------------------------------------------- */

static void test_rmsnorm(void)
{
    static const int wgs[] = {64, 8, 512}; /* CPUs' work-group, a small one, GPUs' (more items than columns) */
    for (int wi = 0; wi < 3; wi++) {
        const int wg = wgs[wi], rows = 3, cols = 37, stride = 41, offset = 2;
        const size_t n = (size_t)offset + (size_t)rows * stride + 3;
        char options[32];
        snprintf(options, sizeof(options), "-D WG=%d", wg);
        cl_kernel k = kernel("rmsnorm", options, "rmsnorm");
        tu_rng rng = tu_rng_seed(10 + (uint64_t)wg);
        float *x = malloc(n * sizeof(float)), w[37], *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
        fill(x, n, 2.0f, &rng);
        for (int i = 0; i < cols; i++)
            w[i] = 0.5f + (float)i / cols;
        const float eps = 1e-6f;
        memcpy(want, x, n * sizeof(float));
        for (int r = 0; r < rows; r++) {
            float *row = want + offset + (size_t)r * stride;
            double ss = 0;
            for (int i = 0; i < cols; i++)
                ss += (double)row[i] * row[i];
            const double inv = 1.0 / sqrt(ss / cols + eps);
            for (int i = 0; i < cols; i++)
                row[i] = (float)(w[i] * (row[i] * inv));
        }
        cl_mem xb = buffer(n * sizeof(float), x), wb = buffer(sizeof(w), w);
        ARGS(k, 0, KARG(xb), KARG(offset), KARG(stride), KARG(cols), KARG(wb), KARG(eps));
        const size_t local = (size_t)wg, global = local * rows;
        if (launch(k, 1, &global, &local)) {
            download(xb, n * sizeof(float), got);
            CHECK_NEAR(got, want, n, stride, 1e-5, "rmsnorm WG=%d (all of x, the untouched parts too)", wg);
            int moved = 0;
            for (size_t i = 0; i < n; i++) {
                const size_t in_row = (i - offset) % stride;
                if (i < (size_t)offset || i >= (size_t)offset + (size_t)rows * stride || in_row >= (size_t)cols)
                    moved += got[i] != x[i];
            }
            CHECK(moved == 0, "rmsnorm WG=%d changed %d values outside the normalised columns", wg, moved);
        }
        free(x);
        free(got);
        free(want);
    }
}

/* ---- rope -------------------------------------------------------------------------------------------- */

/* Both pairings, and with QSCALE (a per-token multiplier of every query value, nope dims too;
   DN = 11 > DR / 2 so each work-item scales more than one nope dim). */
static void test_rope(void)
{
    for (int variant = 0; variant < 3; variant++) {
        const int half_split = variant == 1, qscaled = variant == 2;
        enum { DR = 8, H = 3, T = 5, DN = 11, RKV = 5, P = 12 };
        const int dq = DN + DR, q_row = H * dq + 2, kv_row = RKV + DR + 1, q_off = 1, kv_off = 4;
        char options[64];
        snprintf(options, sizeof(options), "-D DR=%d%s%s", DR, half_split ? " -D HALF_SPLIT" : "", qscaled ? " -D QSCALE" : "");
        cl_kernel k = kernel("rope", options, "rope");
        const size_t nq = (size_t)q_off + (size_t)T * q_row, nkv = (size_t)kv_off + (size_t)T * kv_row;
        float q[1 + 5 * 59], kv[4 + 5 * 14], table[P * DR], gq[1 + 5 * 59], gkv[4 + 5 * 14];
        const float qscale[T] = {1.5f, 1.0f, 0.25f, 2.0f, 3.0f};
        tu_rng rng = tu_rng_seed(20);
        fill(q, nq, 1.0f, &rng);
        fill(kv, nkv, 1.0f, &rng);
        const double amplitude = 1.25;
        for (int p = 0; p < P; p++)
            for (int i = 0; i < DR / 2; i++) {
                const double angle = p * pow(10000.0, -2.0 * i / DR);
                table[(p * DR / 2 + i) * 2] = (float)(amplitude * cos(angle));
                table[(p * DR / 2 + i) * 2 + 1] = (float)(amplitude * sin(angle));
            }
        const int positions[T] = {7, 0, 11, 3, 3};
        float wq[1 + 5 * 59], wkv[4 + 5 * 14];
        memcpy(wq, q, sizeof(q));
        memcpy(wkv, kv, sizeof(kv));
        for (int t = 0; t < T; t++)
            for (int h = 0; h <= H; h++) {
                float *x = h < H ? wq + q_off + t * q_row + h * dq + DN : wkv + kv_off + t * kv_row + RKV;
                for (int i = 0; i < DR / 2; i++) {
                    const int a = half_split ? i : 2 * i, b = half_split ? i + DR / 2 : 2 * i + 1;
                    const float c = table[(positions[t] * DR / 2 + i) * 2], s = table[(positions[t] * DR / 2 + i) * 2 + 1];
                    const float x0 = x[a], x1 = x[b];
                    x[a] = x0 * c - x1 * s;
                    x[b] = x0 * s + x1 * c;
                    if (qscaled && h < H)
                        x[a] *= qscale[t], x[b] *= qscale[t];
                }
                if (qscaled && h < H)
                    for (int j = 0; j < DN; j++)
                        x[j - DN] *= qscale[t];
            }
        cl_mem qb = buffer(nq * sizeof(float), q), kvb = buffer(nkv * sizeof(float), kv);
        cl_mem pb = buffer(sizeof(positions), positions), tb = buffer(sizeof(table), table);
        const int heads = H, dn = DN, rkv = RKV;
        ARGS(k, 0, KARG(qb), KARG(q_off), KARG(q_row), KARG(dq), KARG(dn), KARG(heads), KARG(kvb), KARG(kv_off),
             KARG(kv_row), KARG(rkv), KARG(pb), KARG(tb));
        cl_mem sb = qscaled ? buffer(sizeof(qscale), qscale) : NULL;
        if (qscaled)
            ARG(k, 12, sb);
        const size_t global[3] = {DR / 2, H + 1, T};
        static const char *const names[] = {"interleaved", "half-split", "interleaved, query scale"};
        if (launch(k, 3, global, NULL)) {
            download(qb, nq * sizeof(float), gq);
            download(kvb, nkv * sizeof(float), gkv);
            CHECK_NEAR(gq, wq, nq, q_row, 1e-6, "rope %s: q (every value)", names[variant]);
            CHECK_NEAR(gkv, wkv, nkv, kv_row, 1e-6, "rope %s: kv (every value)", names[variant]);
        }
    }
}

/* ---- add_bias ----------------------------------------------------------------------------------------- */

/* ---- convert.cl: the prelude's decoders on every code, the bf16 encoder on every rounding case ---- */

/* Same float, or both NaN. */
static int same_value(float got, double want)
{
    if (isnan(want))
        return isnan(got);
    return (double)got == want && (got != 0.0f || !signbit(got) == !signbit(want));
}

static void decode_all(const char *option, size_t code_bytes, int count, double (*decode)(unsigned), const char *what)
{
    unsigned char *codes = malloc((size_t)count * code_bytes);
    float *got = malloc((size_t)count * sizeof(float));
    for (int c = 0; c < count; c++)
        for (size_t b = 0; b < code_bytes; b++) /* little-endian, as OpenCL devices and the checkpoints are */
            codes[(size_t)c * code_bytes + b] = (unsigned char)(c >> (8 * b));
    cl_kernel k = kernel("convert", option, "convert_to_f32");
    cl_mem in = buffer((size_t)count * code_bytes, codes), out = buffer((size_t)count * sizeof(float), NULL);
    ARGS(k, 0, KARG(in), KARG(count), KARG(out));
    const size_t global = (size_t)count;
    if (launch(k, 1, &global, NULL)) {
        download(out, (size_t)count * sizeof(float), got);
        int bad = 0;
        for (int c = 0; c < count; c++)
            if (!same_value(got[c], decode((unsigned)c)) && bad++ < 5)
                CHECK(0, "%s code 0x%x: %.9g, the format's definition gives %.9g", what, c, got[c], decode((unsigned)c));
        CHECK(bad == 0, "%s: %d of %d codes decoded wrong", what, bad, count);
        if (bad == 0)
            printf("  %s: all %d codes decode exactly\n", what, count);
    }
    free(codes);
    free(got);
}

/* The cache's e4m3 decoder reads S.1111.111 as the value it would have, 480 (a cache tile with a
   NaN has a NaN scale instead); every other code as the format defines it. */
static double e4m3_no_nan(unsigned bits)
{
    return (bits & 0x7F) == 0x7F ? ((bits & 0x80) ? -480.0 : 480.0) : mla_ref_decode_e4m3(bits);
}

static void test_convert(void)
{
    decode_all("-D SRC_BF16", 2, 65536, mla_ref_decode_bf16, "bf16");
    decode_all("-D SRC_F16", 2, 65536, mla_ref_decode_f16, "f16 (vload_half)");
    decode_all("-D SRC_E4M3", 1, 256, mla_ref_decode_e4m3, "e4m3");
    /* The kernels' fast decoders (host/runtime/program.h picks one per device): the branch-free
       shift where the device has float denormals (GPUs), the rebiasing form for devices without
       them, and the one through half precision (CPUs). */
    if (clmla_device_denormals(ctx)) {
        decode_all("-D SRC_E4M3X8", 1, 256, e4m3_no_nan, "e4m3 (8 at a time, the shift: GPUs)");
        decode_all("-D SRC_E4M3U", 1, 256, e4m3_no_nan, "e4m3 (one code, the shift: GPUs)");
    } else {
        printf("  e4m3 shift: not run (the device has no float denormals; the library does not use it)\n");
    }
    decode_all("-D SRC_E4M3X8 -D CLMLA_NO_DENORMS", 1, 256, e4m3_no_nan,
               "e4m3 (8 at a time, for devices without denormals)");
    decode_all("-D SRC_E4M3U -D CLMLA_NO_DENORMS", 1, 256, e4m3_no_nan, "e4m3 (one code, for devices without denormals)");
    decode_all("-D SRC_E4M3X8 -D CLMLA_FP8_HALF", 1, 256, e4m3_no_nan, "e4m3 (8 at a time, through half: CPUs)");
    decode_all("-D SRC_E4M3U -D CLMLA_FP8_HALF", 1, 256, e4m3_no_nan, "e4m3 (one code, through half: CPUs)");
    decode_all("-D SRC_E4M3BF16", 1, 256, e4m3_no_nan, "e4m3 to bf16 bits (attn_latent_mma's operands)");

    /* The encoder: for every finite bf16 code, floats just above it, a quarter, exactly half and just
       past half an ulp on, and the next code, each against the reference's rounding. */
    static const uint32_t lows[] = {0x0000, 0x0001, 0x4000, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
    const int nl = (int)(sizeof(lows) / sizeof(lows[0]));
    int n = 0;
    float *in = malloc((size_t)65536 * nl * sizeof(float));
    for (uint32_t c = 0; c < 65536; c++) {
        if (((c >> 7) & 0xFF) == 0xFF) /* inf and NaN codes: below */
            continue;
        for (int l = 0; l < nl; l++) {
            const uint32_t bits = c << 16 | lows[l];
            memcpy(&in[n++], &bits, 4);
        }
    }
    const float special[] = {INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f};
    for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++)
        in[n++] = special[i];
    uint16_t *out = malloc((size_t)n * sizeof(uint16_t));
    cl_kernel k = kernel("convert", "", "convert_to_bf16");
    cl_mem din = buffer((size_t)n * sizeof(float), in), dout = buffer((size_t)n * sizeof(uint16_t), NULL);
    ARGS(k, 0, KARG(din), KARG(n), KARG(dout));
    const size_t global = (size_t)n;
    if (launch(k, 1, &global, NULL)) {
        download(dout, (size_t)n * sizeof(uint16_t), out);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            double want = isnan(in[i]) ? NAN : mla_ref_round_bf16((double)in[i]);
            if (fabs(want) > 3.3895313892515355e38) /* past the largest bf16: rounds to infinity */
                want = want > 0 ? INFINITY : -INFINITY;
            const double got = mla_ref_decode_bf16(out[i]);
            const int ok = isnan(want) ? isnan(got) : got == want && !signbit(got) == !signbit(want);
            if (!ok && bad++ < 5)
                CHECK(0, "bf16 of %.9g (bits 0x%08x): 0x%04x = %.9g, want %.9g", in[i], *(const uint32_t *)&in[i],
                      out[i], got, want);
        }
        CHECK(bad == 0, "bf16 encoder: %d of %d values rounded wrong", bad, n);
        printf("  bf16 encoder: %d values (every finite code, ties included, and the specials) round to nearest even\n", n);
    }
    free(in);
    free(out);

    /* e4m3: every finite code's value, a quarter, a half (the tie) and three quarters of the way to
       the next, negated too; past 448 (saturating), infinities, NaN, and values in the subnormal
       range; each against the reference's rounding. */
    float vals[256 * 8 + 16];
    int nv = 0;
    for (unsigned c = 0; c < 0x7F; c++) {
        const double a = mla_ref_decode_e4m3(c), b = c == 0x7E ? 464.0 : mla_ref_decode_e4m3(c + 1);
        const double pts[4] = {a, a + (b - a) / 4, (a + b) / 2, a + 3 * (b - a) / 4};
        for (int k = 0; k < 4; k++) {
            vals[nv++] = (float)pts[k];
            vals[nv++] = (float)-pts[k];
        }
    }
    const float more[] = {463.9f, 464.0f, 1000.0f, -1e30f, INFINITY, -INFINITY, NAN, 0x1p-10f, 3 * 0x1p-11f, 1e-30f};
    for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++)
        vals[nv++] = more[i];
    uint8_t codes[sizeof(vals) / sizeof(vals[0])];
    cl_kernel k8 = kernel("convert", "", "convert_to_e4m3");
    cl_mem v_in = buffer((size_t)nv * sizeof(float), vals), c_out = buffer((size_t)nv, NULL);
    ARGS(k8, 0, KARG(v_in), KARG(nv), KARG(c_out));
    const size_t g8 = (size_t)nv;
    if (launch(k8, 1, &g8, NULL)) {
        download(c_out, (size_t)nv, codes);
        int bad = 0;
        for (int i = 0; i < nv; i++) {
            const double want = isnan(vals[i]) ? NAN : mla_ref_round_e4m3((double)vals[i]);
            const double got = mla_ref_decode_e4m3(codes[i]);
            const int ok = isnan(want) ? isnan(got) : got == want && !signbit(got) == !signbit(want);
            if (!ok && bad++ < 5)
                CHECK(0, "e4m3 of %.9g: 0x%02x = %.9g, want %.9g", vals[i], codes[i], got, want);
        }
        CHECK(bad == 0, "e4m3 encoder: %d of %d values rounded wrong", bad, nv);
        printf("  e4m3 encoder: %d values (every code, ties, saturation, specials) round to nearest even\n", nv);
    }
}

static void test_add_bias(void)
{
    enum { ROWS = 3, COLS = 13, STRIDE = 17, OFF = 2 };
    const size_t n = OFF + ROWS * STRIDE + 1;
    cl_kernel k = kernel("bias", "", "add_bias");
    float x[OFF + ROWS * STRIDE + 1], bias[COLS], got[OFF + ROWS * STRIDE + 1], want[OFF + ROWS * STRIDE + 1];
    tu_rng rng = tu_rng_seed(23);
    fill(x, n, 1.0f, &rng);
    fill(bias, COLS, 1.0f, &rng);
    memcpy(want, x, sizeof(x));
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < COLS; i++)
            want[OFF + r * STRIDE + i] += bias[i];
    cl_mem xb = buffer(sizeof(x), x), bb = buffer(sizeof(bias), bias);
    const int off = OFF, stride = STRIDE, cols = COLS;
    ARGS(k, 0, KARG(xb), KARG(off), KARG(stride), KARG(cols), KARG(bb));
    const size_t global[2] = {COLS, ROWS};
    if (launch(k, 2, global, NULL)) {
        download(xb, sizeof(x), got);
        CHECK_NEAR(got, want, n, STRIDE, 0, "add_bias: every value, the untouched columns too");
    }
}

/* ---- cache_write / cache_gather ------------------------------------------------------------------------ */

enum { CW_RKV = 5, CW_DR = 2, CW_ROW = CW_RKV + CW_DR };

static void test_cache_write(void)
{
    for (int f16 = 0; f16 < 2; f16++) {
        enum { T = 6, ROWS = 10 };
        const int ckv_stride = 9, ckv_off = 3, kr_stride = 4, kr_off = 1;
        char options[64];
        snprintf(options, sizeof(options), "-D RKV=%d -D DR=%d%s", CW_RKV, CW_DR, f16 ? " -D CACHE_F16" : "");
        cl_kernel k = kernel("cache_write", options, "cache_write");
        float ckv[3 + T * 9], kr[1 + T * 4];
        tu_rng rng = tu_rng_seed(30);
        fill(ckv, sizeof(ckv) / sizeof(float), 3.0f, &rng);
        fill(kr, sizeof(kr) / sizeof(float), 3.0f, &rng);
        /* Values that stress the rounding: a tie, subnormals, the top of the half range. */
        ckv[ckv_off + 0] = 1.0f + 1.0f / 2048.0f;               /* tie: rounds to even, 1.0 */
        ckv[ckv_off + 1] = 1.0f + 3.0f / 2048.0f;               /* tie: rounds up */
        ckv[ckv_off + 2] = 3e-6f;                               /* half subnormal */
        ckv[ckv_off + 3] = -65504.0f;                           /* largest half */
        ckv[ckv_off + 4] = 1e-9f;                               /* below half's range: 0 */
        kr[kr_off] = 65519.0f;                                  /* rounds down to 65504 */
        const int slots[T] = {7, 2, 9, 0, 4, 5};
        const size_t elem = f16 ? 2 : 4, bytes = (size_t)ROWS * CW_ROW * elem;
        unsigned char sentinel[ROWS * CW_ROW * 4], got[ROWS * CW_ROW * 4], want[ROWS * CW_ROW * 4];
        for (size_t i = 0; i < bytes; i++)
            sentinel[i] = (unsigned char)(0xA5 ^ i);
        memcpy(want, sentinel, bytes);
        for (int t = 0; t < T; t++)
            for (int d = 0; d < CW_ROW; d++) {
                const float v = d < CW_RKV ? ckv[ckv_off + t * ckv_stride + d] : kr[kr_off + t * kr_stride + d - CW_RKV];
                const size_t at = (size_t)slots[t] * CW_ROW + d;
                if (f16) {
                    const uint16_t h = float_to_half(v);
                    memcpy(want + at * 2, &h, 2);
                } else {
                    memcpy(want + at * 4, &v, 4);
                }
            }
        cl_mem cb = buffer(sizeof(ckv), ckv), kb = buffer(sizeof(kr), kr), sb = buffer(sizeof(slots), slots);
        cl_mem cache = buffer(bytes, sentinel);
        ARGS(k, 0, KARG(cb), KARG(ckv_off), KARG(ckv_stride), KARG(kb), KARG(kr_off), KARG(kr_stride), KARG(sb),
             KARG(cache));
        const size_t global[2] = {CW_ROW, T};
        if (launch(k, 2, global, NULL)) {
            download(cache, bytes, got);
            size_t first = bytes;
            for (size_t i = 0; i < bytes && first == bytes; i++)
                if (got[i] != want[i])
                    first = i;
            CHECK(first == bytes, "cache_write %s: byte %zu (row %zu) differs", f16 ? "f16" : "f32", first,
                  first / (elem * CW_ROW));
        }
    }
}

/* ---- the paged calls' kernels (cl/paged.cl, cache_write_slots) ------------------------------------------ */

/* paged_tokens: per query token its table row and visible keys; a length outside 0 .. max_blocks *
   block_size or an id outside 0 .. num_blocks - 1 among the blocks read gives 0 keys and a status
   bit; ids past those a query reads are not looked at. The table starts a row into its buffer. */
static void test_paged_tokens(void)
{
    enum { B = 5, MB = 3, BS = 4, NB = 6, SQ = 2 };
    cl_kernel k = kernel("paged", "", "paged_tokens");
    /* row 0 is before the table (table_offset MB) */
    const int32_t table[(B + 1) * MB] = {9, 9, 9, /* */ 0, 1, 2, /* */ 5, 99, 99, /* */ 3, NB, 0, /* */ 4, -1, 1,
                                         /* */ 2, 2, 2};
    const int32_t lens[1 + B] = {77, 9, 3, 9, 4, MB * BS + 1}; /* lens_offset 1 */
    const int want_status = 3;
    int32_t want_seq[B * SQ], want_ctx[B * SQ];
    for (int causal = 0; causal < 2; causal++) {
        for (int t = 0; t < B * SQ; t++) {
            const int b = t / SQ, i = t % SQ, len = lens[1 + b];
            int c = causal ? len - SQ + 1 + i : len;
            c = c < 0 ? 0 : c;
            if (b == 2 || b == 4 || (b == 3 && c > 4)) /* id NB in block 1, a length past the table, -1 in block 1 */
                c = b == 3 && c <= 4 ? c : 0;
            want_seq[t] = 1 + b;
            want_ctx[t] = c;
        }
        const int zero = 0;
        cl_mem bl = buffer(sizeof(lens), lens), bt = buffer(sizeof(table), table);
        cl_mem bseq = buffer(sizeof(want_seq), NULL), bctx = buffer(sizeof(want_ctx), NULL), bst = buffer(4, &zero);
        const int lens_off = 1, table_off = MB, mb = MB, bs = BS, nb = NB, sq = SQ, tokens = B * SQ;
        ARGS(k, 0, KARG(bl), KARG(lens_off), KARG(bt), KARG(table_off), KARG(mb), KARG(bs), KARG(nb), KARG(sq),
             KARG(causal), KARG(tokens), KARG(bseq), KARG(bctx), KARG(bst));
        const size_t global[1] = {B * SQ + 3}; /* items past the tokens, as clmla_cl_enqueue_rows rounds up */
        if (launch(k, 1, global, NULL)) {
            int32_t got_seq[B * SQ], got_ctx[B * SQ], status = 0;
            download(bseq, sizeof(got_seq), got_seq);
            download(bctx, sizeof(got_ctx), got_ctx);
            download(bst, 4, &status);
            CHECK(memcmp(got_seq, want_seq, sizeof(got_seq)) == 0, "paged_tokens causal %d: table rows differ", causal);
            for (int t = 0; t < B * SQ; t++)
                CHECK(got_ctx[t] == want_ctx[t], "paged_tokens causal %d: token %d sees %d keys, expected %d", causal, t,
                      got_ctx[t], want_ctx[t]);
            CHECK(status == want_status, "paged_tokens causal %d: status %d, expected %d", causal, status, want_status);
        }
    }
}

/* cache_write_slots (f32 rows): slots from an offset, -1 skipped, others out of range not written
   and flagged (status bit 4), every other row untouched. */
static void test_cache_write_slots(void)
{
    enum { T = 5, ROWS = 6 };
    char options[64];
    snprintf(options, sizeof(options), "-D RKV=%d -D DR=%d", CW_RKV, CW_DR);
    cl_kernel k = kernel("cache_write", options, "cache_write_slots");
    float ckv[T * CW_RKV], kr[T * CW_DR], cache[ROWS * CW_ROW], want[ROWS * CW_ROW];
    tu_rng rng = tu_rng_seed(31);
    fill(ckv, T * CW_RKV, 2.0f, &rng);
    fill(kr, T * CW_DR, 2.0f, &rng);
    for (int i = 0; i < ROWS * CW_ROW; i++)
        cache[i] = want[i] = -3.0f - (float)i;
    const int32_t slots[1 + T] = {0, 4, -1, ROWS, 1, -2}; /* slots_offset 1 */
    for (int t = 0; t < T; t++) {
        const int s = slots[1 + t];
        if (s < 0 || s >= ROWS)
            continue;
        for (int d = 0; d < CW_ROW; d++)
            want[s * CW_ROW + d] = d < CW_RKV ? ckv[t * CW_RKV + d] : kr[t * CW_DR + d - CW_RKV];
    }
    const int zero = 0, off = 0, rkv = CW_RKV, dr = CW_DR, soff = 1, rows = ROWS;
    cl_mem cb = buffer(sizeof(ckv), ckv), kb = buffer(sizeof(kr), kr), sb = buffer(sizeof(slots), slots);
    cl_mem cacheb = buffer(sizeof(cache), cache), stb = buffer(4, &zero);
    ARGS(k, 0, KARG(cb), KARG(off), KARG(rkv), KARG(kb), KARG(off), KARG(dr), KARG(sb), KARG(soff), KARG(rows),
         KARG(cacheb), KARG(stb));
    const size_t global[2] = {CW_ROW, T};
    if (launch(k, 2, global, NULL)) {
        float got[ROWS * CW_ROW];
        int status = 0;
        download(cacheb, sizeof(got), got);
        download(stb, 4, &status);
        CHECK(memcmp(got, want, sizeof(got)) == 0, "cache_write_slots: the rows differ");
        CHECK(status == 4, "cache_write_slots: status %d, expected 4", status);
    }
}

/* The e4m3 code whose value is v (a value of the format), by search; -0 gets 0x80. */
static uint8_t e4m3_code_of(double v)
{
    for (unsigned c = 0; c < 256; c++)
        if (mla_ref_decode_e4m3(c) == v && !signbit(mla_ref_decode_e4m3(c)) == !signbit(v))
            return (uint8_t)c;
    return 0x7F;
}

/* cache_write and cache_gather with CACHE_FP8 (FlashMLA's row layout, cl/prelude.cl): the bytes
   written against the reference's quantisation (ref/: scales, codes, bf16 k^R), then gathered
   back to float32. RKV 256 (two scales), DR 6, rows of 256 + 8 + 12 = 276 bytes. */
static void test_cache_fp8(void)
{
    enum { RKV = 256, DR = 6, ROWB = RKV + 8 + 2 * DR, T = 3, ROWS = 5, BT = 5 };
    char options[64];
    snprintf(options, sizeof(options), "-D RKV=%d -D DR=%d -D CACHE_FP8", RKV, DR);
    cl_kernel kw = kernel("cache_write", options, "cache_write");
    cl_kernel kg = kernel("cache_gather", options, "cache_gather");
    float ckv[T * RKV], kr[T * DR];
    tu_rng rng = tu_rng_seed(35);
    fill(ckv, T * RKV, 3.0f, &rng);
    fill(kr, T * DR, 3.0f, &rng);
    for (int i = 0; i < 128; i++) /* token 1: a zero tile (the 1e-4 floor), then a tiny one */
        ckv[RKV + i] = 0.0f, ckv[RKV + 128 + i] = 1e-6f * (float)(i - 64);
    ckv[2 * RKV + 5] = 1000.0f; /* token 2: one large value sets its tile's scale */
    ckv[2 * RKV + 200] = NAN;   /* and a NaN makes its second tile all NaN (a NaN scale) */
    const int slots[T] = {4, 0, 2};
    unsigned char sentinel[ROWS * ROWB], got[ROWS * ROWB], want[ROWS * ROWB];
    for (size_t i = 0; i < sizeof(sentinel); i++)
        sentinel[i] = (unsigned char)(0x5A ^ i);
    memcpy(want, sentinel, sizeof(want));
    double stored[T][RKV + DR];
    for (int t = 0; t < T; t++) {
        double c[RKV], r[DR];
        for (int i = 0; i < RKV; i++)
            c[i] = ckv[t * RKV + i];
        for (int i = 0; i < DR; i++)
            r[i] = kr[t * DR + i];
        mla_ref_round_cache_row(MLA_REF_CACHE_FP8, c, RKV, r, DR);
        unsigned char *row = want + (size_t)slots[t] * ROWB;
        for (int g = 0; g < RKV / 128; g++) {
            double amax = 0;
            for (int i = 0; i < 128; i++)
                amax = fmax(amax, fabs((double)ckv[t * RKV + g * 128 + i]));
            int e = 0;
            const double m = frexp(fmax(amax / 448.0, 1e-4), &e), s = m == 0.5 ? ldexp(1, e - 1) : ldexp(1, e);
            const float sf = (float)s;
            memcpy(row + RKV + 4 * g, &sf, 4);
            for (int i = 0; i < 128; i++)
                row[g * 128 + i] = e4m3_code_of(c[g * 128 + i] / s);
        }
        for (int i = 0; i < DR; i++) {
            const float f = (float)r[i];
            uint32_t bits;
            memcpy(&bits, &f, 4);
            const uint16_t h = (uint16_t)(bits >> 16);
            memcpy(row + RKV + 8 + 2 * i, &h, 2);
        }
        for (int i = 0; i < RKV; i++)
            stored[t][i] = c[i];
        for (int i = 0; i < DR; i++)
            stored[t][RKV + i] = r[i];
    }
    const int zero = 0, ckv_stride = RKV, kr_stride = DR;
    cl_mem cb = buffer(sizeof(ckv), ckv), kb = buffer(sizeof(kr), kr), sb = buffer(sizeof(slots), slots);
    cl_mem cache = buffer(sizeof(sentinel), sentinel);
    ARGS(kw, 0, KARG(cb), KARG(zero), KARG(ckv_stride), KARG(kb), KARG(zero), KARG(kr_stride), KARG(sb), KARG(cache));
    const size_t gw[2] = {RKV / 128 + DR, T};
    if (launch(kw, 2, gw, NULL)) {
        download(cache, sizeof(got), got);
        size_t first = sizeof(got);
        /* token 2's NaN tile: its scale must be a NaN; its codes are whatever x / NaN gives */
        unsigned char *nan_row = got + (size_t)slots[2] * ROWB;
        float nan_scale;
        memcpy(&nan_scale, nan_row + RKV + 4, 4);
        CHECK(isnan(nan_scale), "cache_write fp8: a tile with a NaN has scale %g, not NaN", nan_scale);
        memcpy(nan_row + 128, want + (size_t)slots[2] * ROWB + 128, 128);
        memcpy(nan_row + RKV + 4, want + (size_t)slots[2] * ROWB + RKV + 4, 4);
        for (size_t i = 0; i < sizeof(got) && first == sizeof(got); i++)
            if (got[i] != want[i])
                first = i;
        CHECK(first == sizeof(got), "cache_write fp8: byte %zu (row %zu, byte %zu of it) is 0x%02x, want 0x%02x", first,
              first / ROWB, first % ROWB, first < sizeof(got) ? got[first] : 0, first < sizeof(want) ? want[first] : 0);
    }
    /* Gather the three tokens back: a sequence whose block table is {0} (one block of 5 rows) and
       tokens 4, 0, 2 of it are the rows written above. */
    const int table[1] = {0}, table_offset = 0, bt = BT, start = 0;
    float out[ROWS * (RKV + DR)];
    cl_mem tb = buffer(sizeof(table), table), ob = buffer(sizeof(out), NULL);
    ARGS(kg, 0, KARG(cache), KARG(tb), KARG(table_offset), KARG(bt), KARG(start), KARG(ob), KARG(zero));
    const size_t gg[2] = {RKV + DR, ROWS};
    if (launch(kg, 2, gg, NULL)) {
        download(ob, sizeof(out), out);
        int bad = 0;
        for (int t = 0; t < T; t++)
            for (int d = 0; d < RKV + DR; d++) {
                const double g = out[(size_t)slots[t] * (RKV + DR) + d], w = stored[t][d];
                bad += isnan(w) ? !isnan(g) : g != w;
            }
        CHECK(bad == 0, "cache_gather fp8: %d values differ from the stored ones", bad);
    }
}

static void test_cache_gather(void)
{
    for (int f16 = 0; f16 < 2; f16++) {
        enum { BT = 3, BLOCKS = 4, ROWS = BT * BLOCKS, START = 2, N = 8, OUT_OFF = 5 };
        char options[64];
        snprintf(options, sizeof(options), "-D RKV=%d -D DR=%d%s", CW_RKV, CW_DR, f16 ? " -D CACHE_F16" : "");
        cl_kernel k = kernel("cache_gather", options, "cache_gather");
        tu_rng rng = tu_rng_seed(40);
        float values[ROWS * CW_ROW];
        uint16_t halves[ROWS * CW_ROW];
        for (int i = 0; i < ROWS * CW_ROW; i++) {
            halves[i] = (uint16_t)(tu_rng_next(&rng) & 0xFBFF); /* any finite half */
            values[i] = f16 ? tu_half_to_float(halves[i]) : tu_rng_uniform(&rng) * 100.0f;
        }
        const int table[2 + BLOCKS] = {-7, 99, 2, 0, 3, 1}; /* from offset 2; the first two must not be read */
        const int table_offset = 2, bt = BT, start = START, out_off = OUT_OFF;
        const size_t out_n = OUT_OFF + (size_t)N * CW_ROW + 4;
        float *sentinel = malloc(out_n * sizeof(float)), *got = malloc(out_n * sizeof(float));
        float *want = malloc(out_n * sizeof(float));
        for (size_t i = 0; i < out_n; i++)
            sentinel[i] = want[i] = -1234.5f;
        for (int j = 0; j < N; j++) {
            const int token = START + j, row = table[table_offset + token / BT] * BT + token % BT;
            for (int d = 0; d < CW_ROW; d++)
                want[OUT_OFF + j * CW_ROW + d] = values[row * CW_ROW + d];
        }
        cl_mem cache = f16 ? buffer(sizeof(halves), halves) : buffer(sizeof(values), values);
        cl_mem tb = buffer(sizeof(table), table), ob = buffer(out_n * sizeof(float), sentinel);
        ARGS(k, 0, KARG(cache), KARG(tb), KARG(table_offset), KARG(bt), KARG(start), KARG(ob), KARG(out_off));
        const size_t global[2] = {CW_ROW, N};
        if (launch(k, 2, global, NULL)) {
            download(ob, out_n * sizeof(float), got);
            CHECK(memcmp(got, want, out_n * sizeof(float)) == 0, "cache_gather %s: output differs", f16 ? "f16" : "f32");
        }
        free(sentinel);
        free(got);
        free(want);
    }
}

/* ---- attn_latent / attn_combine --------------------------------------------------------------------- */

typedef struct latent_case {
    const char *name;
    int rows;             /* 1 attn_latent_rows: hg is HGC, nt is KTC; 2 attn_latent_lanes: hg 16, nt is KTC;
                             3 the same with two vectors of heads (LHV 2): hg 32; 4 with two tokens of
                             16 heads (LFOLD, runs of latent_query_len tokens): hg 16; 5 attn_latent_mma
                             (cl/attn_latent_mma.cl, its products computed by the items): nt 128, a
                             f32, f16 (f16 1), bf16 (f16 2) or fp8 (f16 3) cache */
    int rkv, dr, heads, hg, nt, splits, split_tokens, bt, f16; /* f16 2: the cache in bf16; 3: fp8 */
    int tokens;
    const int *ctx_len;   /* [tokens] */
    const int *token_seq; /* [tokens] */
} latent_case;

/* Set while run_latent builds the kernels with -D SPARSE: each token's keys are then an index list
   of splits * split_tokens entries (positions in a scrambled order with repeats, a third of the
   entries no key, and for token 0 a whole split without any), checked split by split against
   mla_ref_sparse_latent_attention. */
static int latent_sparse;
/* More build options for the work-group kernel (heads per item in the score step, query layout). */
static const char *latent_extra = "";
/* Tokens per sequence's run for the two-token lanes kernel (rows 4) and attn_latent_mma with
   latent_mma_fold > 1: groups of this many from token 0. */
static int latent_query_len = 1;
/* attn_latent_mma (rows 5): tokens of a run folded into a work-group's rows (FOLD; hg is then the
   heads of each token, HG hg * latent_mma_fold); 1: none. */
static int latent_mma_fold = 1;
/* attn_latent_mma over f16 rows: value 5 of every row 0 and every query's value 5 3e5 (1.05e5
   scaled, past f16's 65504): the product is 0 only where the query row is scaled into f16's range
   before it is rounded (inf times 0 is NaN). */
static int latent_big_query;

static void run_latent(const latent_case *c)
{
    if (case_skipped(c->name))
        return;
    const int row = c->rkv + c->dr;
    const int groups = (c->heads + c->hg - 1) / c->hg, T = c->tokens, H = c->heads, S = c->splits;
    int num_seqs = 0, max_ctx = 0;
    for (int t = 0; t < T; t++) {
        if (c->token_seq[t] + 1 > num_seqs)
            num_seqs = c->token_seq[t] + 1;
        if (c->ctx_len[t] > max_ctx)
            max_ctx = c->ctx_len[t];
    }
    const int max_blocks = (max_ctx + c->bt - 1) / c->bt + 1, blocks = num_seqs * max_blocks + 2;
    char options[224];
    static const char *const cache_options[] = {"", " -D CACHE_F16", " -D CACHE_BF16", " -D CACHE_FP8"};
    if (c->rows == 5 && latent_mma_fold > 1)
        snprintf(options, sizeof(options), "-D RKV=%d -D DR=%d%s -D HG=%d -D HT=%d -D FOLD=%d", c->rkv, c->dr,
                 cache_options[c->f16], c->hg * latent_mma_fold, c->hg, latent_mma_fold);
    else if (c->rows == 5)
        snprintf(options, sizeof(options), "-D RKV=%d -D DR=%d%s -D HG=%d%s", c->rkv, c->dr, cache_options[c->f16],
                 c->hg, latent_sparse ? " -D SPARSE" : "");
    else if (c->rows)
        snprintf(options, sizeof(options), "-D RKV=%d -D DR=%d%s -D HGC=%d -D KTC=%d%s%s", c->rkv, c->dr,
                 c->f16 ? " -D CACHE_F16" : "", c->hg, c->nt, latent_sparse ? " -D SPARSE" : "",
                 c->rows == 4   ? " -D ROWS_LANES -D LHV=2 -D LFOLD"
                 : c->rows == 3 ? " -D ROWS_LANES -D LHV=2"
                 : c->rows == 2 ? " -D ROWS_LANES"
                                : "");
    else
        snprintf(options, sizeof(options), "-D RKV=%d -D DR=%d%s -D NT=%d -D HG=%d%s%s", c->rkv, c->dr,
                 c->f16 ? " -D CACHE_F16" : "", c->nt, c->hg, latent_sparse ? " -D SPARSE" : "", latent_extra);
    cl_kernel k = c->rows == 5 ? kernel("attn_latent_mma", options, "attn_latent_mma")
                               : kernel("attn_latent", options,
                                        c->rows >= 2 ? "attn_latent_lanes" : c->rows ? "attn_latent_rows" : "attn_latent");
    tu_rng rng = tu_rng_seed((uint64_t)c->rkv * 7 + (uint64_t)c->heads);
    /* The pool: every row written from the host (f16: random halves of moderate size). */
    const size_t cells = (size_t)blocks * c->bt * row;
    float *values = malloc(cells * sizeof(float));
    uint16_t *halves = malloc(cells * sizeof(uint16_t));
    for (size_t i = 0; i < cells; i++) {
        values[i] = tu_rng_uniform(&rng) * 1.5f;
        halves[i] = float_to_half(values[i]);
        if (c->f16 >= 2) { /* bf16 (fp8: its k^R): the float's upper half */
            uint32_t u;
            memcpy(&u, &values[i], 4);
            halves[i] = (uint16_t)(u >> 16);
            u &= 0xFFFF0000u;
            memcpy(&values[i], &u, 4);
        } else if (c->f16)
            values[i] = tu_half_to_float(halves[i]);
    }
    /* fp8 (FlashMLA's rows: RKV e4m3 codes, RKV / 128 float scales, DR bf16 values): random finite
       codes (subnormal ones among them) with a random scale per row and block, not a power of two,
       and values[] what they denote; k^R the bf16 values above */
    const size_t fp8_row = (size_t)c->rkv + 4 * (size_t)(c->rkv / 128) + 2 * (size_t)c->dr;
    unsigned char *fp8 = c->f16 == 3 ? malloc((size_t)blocks * c->bt * fp8_row) : NULL;
    for (size_t r = 0; fp8 && r < (size_t)blocks * c->bt; r++) {
        unsigned char *dst = fp8 + r * fp8_row;
        for (int b = 0; b < c->rkv / 128; b++) {
            const float sc = 0.0005f + 0.0015f * (tu_rng_uniform(&rng) * 0.5f + 0.5f);
            memcpy(dst + c->rkv + 4 * b, &sc, 4);
            for (int d = 128 * b; d < 128 * b + 128; d++) {
                unsigned code = (unsigned)((tu_rng_uniform(&rng) * 0.5f + 0.5f) * 256.0f) & 0xFF;
                if ((code & 0x7F) == 0x7F)
                    code &= 0xFE; /* not NaN */
                dst[d] = (unsigned char)code;
                values[r * row + d] = (float)(mla_ref_decode_e4m3(code) * sc);
            }
        }
        memcpy(dst + c->rkv + 4 * (c->rkv / 128), halves + r * row + c->rkv, 2 * (size_t)c->dr);
    }
    for (size_t r = 0; latent_big_query && r < (size_t)blocks * c->bt; r++)
        values[r * row + 5] = 0.0f, halves[r * row + 5] = 0;
    /* Block tables: distinct shuffled blocks per sequence. */
    int *table = malloc((size_t)num_seqs * max_blocks * sizeof(int)), *perm = malloc((size_t)blocks * sizeof(int));
    for (int s = 0; s < num_seqs; s++) {
        tu_shuffle_ints(perm, blocks, &rng);
        for (int b = 0; b < max_blocks; b++)
            table[s * max_blocks + b] = perm[b];
    }
    /* Queries with padding between heads and tokens: strides larger than the rows. */
    const int ql_head = c->rkv + 1, ql_tok = H * ql_head + 3, ql_off = 2;
    const int qr_head = c->dr + 2, qr_tok = H * qr_head + 1, qr_off = 5;
    const size_t nql = (size_t)ql_off + (size_t)T * ql_tok, nqr = (size_t)qr_off + (size_t)T * qr_tok;
    float *ql = malloc(nql * sizeof(float)), *qr = malloc(nqr * sizeof(float));
    fill(ql, nql, 0.6f, &rng);
    fill(qr, nqr, 0.6f, &rng);
    for (int t = 0; latent_big_query && t < T; t++)
        for (int h = 0; h < H; h++)
            ql[ql_off + t * ql_tok + h * ql_head + 5] = 3e5f;
    const float scale = 0.35f;
    const int out_off = 3, lse_off = 1;
    const size_t nout = (size_t)out_off + (size_t)T * S * H * c->rkv, nlse = (size_t)lse_off + (size_t)T * S * H;
    float *out = malloc(nout * sizeof(float)), *lse = malloc(nlse * sizeof(float));
    for (size_t i = 0; i < nout; i++)
        out[i] = -777.0f;
    for (size_t i = 0; i < nlse; i++)
        lse[i] = -777.0f;

    cl_mem qlb = buffer(nql * sizeof(float), ql), qrb = buffer(nqr * sizeof(float), qr);
    /* the rows start 48 bytes (3 x 16, the offsets the library gives) into the buffer: the kernels'
       cache_offset of cache_pad units; the bytes before are all ones, NaN in every cache dtype, so a
       key read from there shows in the results */
    const size_t unit = fp8 ? 1 : c->f16 ? 2 : 4, cache_pad = 48 / unit;
    const size_t cache_bytes = fp8 ? (size_t)blocks * c->bt * fp8_row : cells * unit;
    unsigned char *padded = malloc(cache_pad * unit + cache_bytes);
    memset(padded, 0xff, cache_pad * unit);
    memcpy(padded + cache_pad * unit, fp8 ? (const void *)fp8 : c->f16 ? (const void *)halves : (const void *)values,
           cache_bytes);
    cl_mem cache = buffer(cache_pad * unit + cache_bytes, padded);
    free(padded);
    const cl_ulong cache_offset = cache_pad;
    cl_mem tb = buffer((size_t)num_seqs * max_blocks * sizeof(int), table);
    cl_mem tsb = buffer((size_t)T * sizeof(int), c->token_seq), tcb = buffer((size_t)T * sizeof(int), c->ctx_len);
    cl_mem ob = buffer(nout * sizeof(float), out), lb = buffer(nlse * sizeof(float), lse);
    ARGS(k, 0, KARG(qlb), KARG(ql_off), KARG(ql_tok), KARG(ql_head), KARG(qrb), KARG(qr_off), KARG(qr_tok),
         KARG(qr_head), KARG(cache), KARG(tb), KARG(max_blocks), KARG(c->bt), KARG(tsb), KARG(tcb), KARG(H), KARG(S),
         KARG(c->split_tokens), KARG(scale), KARG(ob), KARG(out_off), KARG(lb), KARG(lse_off));
    const int topk = S * c->split_tokens, idx_off = 2;
    int32_t *list = malloc(((size_t)idx_off + (size_t)T * topk) * sizeof(int32_t));
    list[0] = list[1] = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < topk; i++) {
            const int n = c->ctx_len[t];
            int32_t v = n > 0 ? (i * 7 + t) % n : -1;
            if (i % 3 == 2 || (t == 0 && S > 1 && i >= c->split_tokens && i < 2 * c->split_tokens))
                v = i % 2 ? -1 : n + i; /* no key: padding, or past the context */
            list[idx_off + t * topk + i] = v;
        }
    cl_mem ib = buffer(((size_t)idx_off + (size_t)T * topk) * sizeof(int32_t), list);
    if (latent_sparse) {
        ARGS(k, 22, KARG(ib), KARG(idx_off), KARG(topk));
    }
    cl_mem no_first = NULL; /* token_first: none, runs of latent_query_len tokens */
    int next_arg = latent_sparse ? 25 : 22;
    if (c->rows == 4 || (c->rows == 5 && latent_mma_fold > 1)) {
        ARG(k, 22, no_first);
        ARG(k, 23, latent_query_len);
        next_arg = 24;
    }
    ARG(k, next_arg, cache_offset);
    const size_t threads = c->rows && c->rows != 5 ? 1 : (size_t)c->nt;
    /* the two-token kernel's grid is (head group, token, split) */
    const size_t global[3] = {threads * groups, c->rows == 4 ? (size_t)T : (size_t)S, c->rows == 4 ? (size_t)S : (size_t)T},
                 local[3] = {threads, 1, 1};
    if (launch(k, 3, global, local)) {
        download(ob, nout * sizeof(float), out);
        download(lb, nlse * sizeof(float), lse);
        double *qt = malloc((size_t)H * c->rkv * sizeof(double)), *qrd = malloc((size_t)H * c->dr * sizeof(double));
        const size_t key_rows = (size_t)(max_ctx > c->split_tokens ? max_ctx : c->split_tokens) + 1;
        double *keys_c = malloc(key_rows * c->rkv * sizeof(double));
        double *keys_r = malloc(key_rows * c->dr * sizeof(double));
        double *want = malloc((size_t)H * c->rkv * sizeof(double)), *want_lse = malloc((size_t)H * sizeof(double));
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                for (int d = 0; d < c->rkv; d++)
                    qt[h * c->rkv + d] = ql[ql_off + t * ql_tok + h * ql_head + d];
                for (int d = 0; d < c->dr; d++)
                    qrd[h * c->dr + d] = qr[qr_off + t * qr_tok + h * qr_head + d];
            }
            for (int s = 0; s < S; s++) {
                const int k0 = s * c->split_tokens, k1 = c->ctx_len[t] < k0 + c->split_tokens ? c->ctx_len[t] : k0 + c->split_tokens;
                int n = k1 > k0 ? k1 - k0 : 0;
                const int first = latent_sparse ? 0 : k0; /* sparse: every key of the sequence, by position */
                if (latent_sparse)
                    n = c->ctx_len[t];
                for (int j = 0; j < n; j++) {
                    const int key = first + j;
                    const size_t r = (size_t)table[c->token_seq[t] * max_blocks + key / c->bt] * c->bt + key % c->bt;
                    for (int d = 0; d < row; d++) {
                        if (d < c->rkv)
                            keys_c[(size_t)j * c->rkv + d] = values[r * row + d];
                        else
                            keys_r[(size_t)j * c->dr + d - c->rkv] = values[r * row + d];
                    }
                }
                if (latent_sparse) /* entries k0 .. k0 + split_tokens - 1 of the token's list */
                    n = mla_ref_sparse_latent_attention(H, c->rkv, c->dr, scale, n,
                                                        list + idx_off + t * topk + k0, c->split_tokens, qt, qrd,
                                                        keys_c, keys_r, want, want_lse);
                else
                    mla_ref_latent_attention(H, c->rkv, c->dr, scale, n, qt, qrd, keys_c, keys_r, want, want_lse);
                const size_t row0 = (size_t)t * S + s;
                CHECK_CLOSE(out + out_off + row0 * H * c->rkv, want, (size_t)H * c->rkv, c->rkv, TOL_F32_CACHE,
                            "attn_latent %s%s: token %d split %d (%d keys) out [head, i]", c->name, latent_extra, t, s, n);
                for (int h = 0; h < H; h++) {
                    const float g = lse[lse_off + row0 * H + h];
                    const int ok = n == 0 ? (isinf(g) && g < 0) : fabs(g - want_lse[h]) <= 1e-4 * (1.0 + fabs(want_lse[h]));
                    CHECK(ok, "attn_latent %s%s: token %d split %d head %d lse %.7g, want %.7g", c->name, latent_extra, t, s, h, g,
                          want_lse[h]);
                }
            }
        }
        CHECK(out[0] == -777.0f && out[1] == -777.0f && out[2] == -777.0f && lse[0] == -777.0f,
              "attn_latent %s%s wrote before its offsets", c->name, latent_extra);
        free(qt);
        free(qrd);
        free(keys_c);
        free(keys_r);
        free(want);
        free(want_lse);
    }
    free(list);
    free(values);
    free(halves);
    free(fp8);
    free(table);
    free(perm);
    free(ql);
    free(qr);
    free(out);
    free(lse);
}

static void test_attn_latent(void)
{
    /* 5 heads in groups of 3 (the last one partial), 3 splits of 7 keys, 16 work-items. */
    static const int ctx_a[4] = {0, 1, 13, 21}, seq_a[4] = {0, 1, 1, 0};
    const latent_case a = {"rkv 20 dr 4, 5 heads / 3 per group, 3 splits, f32", 0, 20, 4, 5, 3, 16, 3, 7, 4, 0, 4,
                           ctx_a, seq_a};
    /* A row of 80 values over 64 work-items (two elements each), 8 heads in one group. */
    static const int ctx_b[2] = {17, 9}, seq_b[2] = {0, 1};
    const latent_case b = {"rkv 72 dr 8, 8 heads / 8 per group, 64 items, f16", 0, 72, 8, 8, 8, 64, 1, 17, 5, 1, 2,
                           ctx_b, seq_b};
    /* One head per group, 2 splits, 32 items, a context that ends mid-block. */
    static const int ctx_c[1] = {70}, seq_c[1] = {0};
    const latent_case c = {"rkv 20 dr 4, 2 heads / 1 per group, 2 splits, f32", 0, 20, 4, 2, 1, 32, 2, 40, 6, 0, 1,
                           ctx_c, seq_c};
    /* 13 heads padded to a group of 16 (four items per key), a row of 23 (float4s, then 3 values
       against zero-padded queries), 21 values over 8 items (3 each, the last item's third past
       the end), tiles of 16 keys cut short, 2 splits of 23 (each ending inside a block of 7) with an
       empty one. */
    static const int ctx_d[3] = {23, 30, 0}, seq_d[3] = {1, 0, 2};
    const latent_case d = {"rkv 21 dr 2, 13 heads / 16 per group, 64 items, 2 splits, f32", 0, 21, 2, 13, 16, 64, 2,
                           23, 7, 0, 3, ctx_d, seq_d};
    /* f16 rows of 34 halves (not a whole number of half4s), 16 heads in one group of 32 items:
       tiles of 8 keys, 2 items per head in the softmax. */
    static const int ctx_e[2] = {29, 8}, seq_e[2] = {0, 1};
    const latent_case e = {"rkv 30 dr 4, 16 heads / 16 per group, 32 items, f16", 0, 30, 4, 16, 16, 32, 1, 29, 3, 1,
                           2, ctx_e, seq_e};
    /* each case also with 8 heads per item in the score step (2 keys each), and with 16 (1 key, the
       queries in layout 1): for the 1-, 3- and 8-head groups that is all their padded heads; then
       with 8 in layout 1 */
    static const char *const extras[] = {"", " -D HPI=8 -D KPT=2", " -D HPI=16 -D KPT=1 -D QLAYOUT=1",
                                         " -D QLAYOUT=1 -D HPI=8 -D KPT=2"};
    for (size_t x = 0; x < sizeof(extras) / sizeof(extras[0]); x++) {
        latent_extra = extras[x];
        for (latent_sparse = 0; latent_sparse < 2; latent_sparse++) {
            run_latent(&a);
            run_latent(&b);
            run_latent(&c);
            run_latent(&d);
            run_latent(&e);
        }
    }
    /* each key's dot products over 2 and 4 items (RS, the host's group_row_slices): rows of 23 and
       of 34 values (d, e) in slices of unequal length, the last partial float4 in slice ROW4 % RS,
       sparse too; partial groups of heads over splits (a) */
    static const char *const slices[] = {" -D RS=2", " -D RS=4 -D HPI=8 -D KPT=2 -D QLAYOUT=1",
                                         " -D RS=4 -D HPI=16 -D KPT=1"};
    for (size_t x = 0; x < sizeof(slices) / sizeof(slices[0]); x++) {
        latent_extra = slices[x];
        for (latent_sparse = 0; latent_sparse < 2; latent_sparse++) {
            if (!latent_sparse)
                run_latent(&a);
            run_latent(&d);
            run_latent(&e);
        }
    }
    latent_sparse = 0;
    /* whole-vector loads of the f16 rows (CACHE_ALIGNED, the host's group_aligned): case b's rows
       are 160 bytes, so every half4 of them is 8-byte aligned (e's 68-byte rows are not, and the
       host would not build it so); at 4 heads an item and at 8, then in query layout 1, then at 8
       with the halves read as ushort4s and converted in registers (CACHE_HALF_BITS) */
    static const char *const aligned[] = {" -D CACHE_ALIGNED", " -D CACHE_ALIGNED -D HPI=8 -D KPT=2",
                                          " -D CACHE_ALIGNED -D QLAYOUT=1",
                                          " -D CACHE_ALIGNED -D CACHE_HALF_BITS -D HPI=8 -D KPT=2"};
    for (size_t x = 0; x < sizeof(aligned) / sizeof(aligned[0]); x++) {
        latent_extra = aligned[x];
        for (latent_sparse = 0; latent_sparse < 2; latent_sparse++)
            run_latent(&b);
    }
    latent_sparse = 0;
    latent_extra = "";
}

/* attn_latent_mma with its products computed by the work-items in mma.sync's fragment layouts (on
   NVIDIA GPUs with the instruction the host builds it with CLMLA_PTX_MMA; tests/ptx_mma.sh checks
   that form assembles), over bf16, fp8, f16 and f32 rows (the tf32 form): MiniCPM3's row
   (256 + 32) with 3 heads in a group of 16 rows, 2 splits of 40 keys, one token without keys and
   tiles of 64 cut short; DeepSeek's (512 + 64) with 16 heads over two tiles, and 5 of 16 in a
   second group; then sparse lists and folded tokens at MiniCPM3's row. Small: every product costs
   two barriers. */
static void test_attn_latent_mma(void)
{
    static const int ctx_a[3] = {0, 1, 70}, seq_a[3] = {0, 1, 0};
    const latent_case a = {"mma: rkv 256 dr 32, 3 heads, 2 splits, bf16", 5, 256, 32, 3, 3, 128, 2, 40, 3, 2, 3,
                           ctx_a, seq_a};
    const latent_case af = {"mma: rkv 256 dr 32, 3 heads, 2 splits, f32", 5, 256, 32, 3, 3, 128, 2, 40, 3, 0, 3,
                            ctx_a, seq_a};
    static const int ctx_b[2] = {33, 5}, seq_b[2] = {1, 0};
    const latent_case b = {"mma: rkv 512 dr 64, 21 heads / 16 per group, bf16", 5, 512, 64, 21, 16, 128, 1, 33, 16, 2,
                           2, ctx_b, seq_b};
    const latent_case bf = {"mma: rkv 512 dr 64, 21 heads / 16 per group, f32", 5, 512, 64, 21, 16, 128, 1, 33, 16, 0,
                            2, ctx_b, seq_b};
    /* fp8: rows of 328 bytes (8-byte aligned only) and 656, scales per key and block */
    const latent_case a8 = {"mma: rkv 256 dr 32, 3 heads, 2 splits, fp8", 5, 256, 32, 3, 3, 128, 2, 40, 3, 3, 3,
                            ctx_a, seq_a};
    const latent_case b8 = {"mma: rkv 512 dr 64, 21 heads / 16 per group, fp8", 5, 512, 64, 21, 16, 128, 1, 33, 16, 3,
                            2, ctx_b, seq_b};
    /* rkv 768: a warp's 192 columns of a step span two scale blocks (warp 1: 192 .. 383), so the
       value step's scaled weights change inside its 64-column steps */
    const latent_case c8 = {"mma: rkv 768 dr 64, 5 heads, fp8", 5, 768, 64, 5, 16, 128, 1, 33, 16, 3, 2, ctx_b, seq_b};
    /* f16 rows: f16 operands, each query row scaled by a power of two into f16's range; then with
       query values past it (latent_big_query) */
    const latent_case ah = {"mma: rkv 256 dr 32, 3 heads, 2 splits, f16", 5, 256, 32, 3, 3, 128, 2, 40, 3, 1, 3,
                            ctx_a, seq_a};
    const latent_case big = {"mma: big queries, rkv 256 dr 32, 3 heads, 2 splits, f16", 5, 256, 32, 3, 3, 128, 2, 40,
                             3, 1, 3, ctx_a, seq_a};
    const latent_case bh = {"mma: rkv 512 dr 64, 21 heads / 16 per group, f16", 5, 512, 64, 21, 16, 128, 1, 33, 16, 1,
                            2, ctx_b, seq_b};
    run_latent(&a);
    run_latent(&a8);
    run_latent(&ah);
    latent_big_query = 1;
    run_latent(&big);
    latent_big_query = 0;
    /* 16 rows of 576-value queries: 47040 bytes of local memory in two bf16 terms, 42112 in f32,
       3072 more for the items' exchange, more than some devices have (oclgrind's runs in
       ci/oclgrind.sh take 32 KiB); MiniCPM3's rows take 28608 and 23680 */
    const uint64_t local = ctx->info.local_mem_bytes;
    if (local >= 23680 + 3072)
        run_latent(&af);
    if (local >= 47040 + 3072)
        run_latent(&b);
    if (local >= 47040 + 128 + 3072)
        run_latent(&bh);
    if (local >= 42112 + 3072)
        run_latent(&bf);
    if (local >= 43136 + 3072)
        run_latent(&b8);
    if (local >= 60032 + 3072)
        run_latent(&c8);
    if (local < 47040 + 3072)
        printf("# attn_latent_mma at rkv 512: skipped, %llu bytes of local memory\n", (unsigned long long)local);

    /* -D SPARSE (DeepSeek Sparse Attention's lists: entries in scrambled order with repeats, a third
       of them no key, token 0's second split without any; tokens of 0 and 1 keys) over each dtype */
    const latent_case sa = {"mma: sparse, rkv 256 dr 32, 3 heads, 2 splits, bf16", 5, 256, 32, 3, 3, 128, 2, 40, 3, 2,
                            3, ctx_a, seq_a};
    const latent_case sa8 = {"mma: sparse, rkv 256 dr 32, 3 heads, 2 splits, fp8", 5, 256, 32, 3, 3, 128, 2, 40, 3, 3,
                             3, ctx_a, seq_a};
    const latent_case saf = {"mma: sparse, rkv 256 dr 32, 3 heads, 2 splits, f32", 5, 256, 32, 3, 3, 128, 2, 40, 3, 0,
                             3, ctx_a, seq_a};
    latent_sparse = 1;
    run_latent(&sa);
    run_latent(&sa8);
    if (local >= 23680 + 256 + 3072)
        run_latent(&saf);
    latent_sparse = 0;
    /* -D FOLD (multi-token decode): 3 heads of each of up to 4 tokens in a group's 16 rows, runs of 3
       tokens (the last place of each group empty), causal lengths crossing the split at 40 keys, a
       run starting at 0 keys; and 5 heads of 3 tokens with a run of 2 (15 rows, tokens 3 and 4 a
       run of their own) */
    static const int ctx_f[6] = {68, 69, 70, 0, 1, 2}, seq_f[6] = {1, 1, 1, 0, 0, 0};
    const latent_case fa = {"mma: fold 4, rkv 256 dr 32, 3 heads, 2 splits, bf16", 5, 256, 32, 3, 3, 128, 2, 40, 3, 2,
                            6, ctx_f, seq_f};
    const latent_case fa8 = {"mma: fold 4, rkv 256 dr 32, 3 heads, 2 splits, fp8", 5, 256, 32, 3, 3, 128, 2, 40, 3, 3,
                             6, ctx_f, seq_f};
    static const int ctx_g[4] = {39, 40, 80, 81}, seq_g[4] = {0, 0, 1, 1};
    const latent_case ff = {"mma: fold 3, rkv 256 dr 32, 5 heads, 2 splits, f32", 5, 256, 32, 5, 5, 128, 2, 41, 3, 0,
                            4, ctx_g, seq_g};
    latent_mma_fold = 4;
    latent_query_len = 3;
    run_latent(&fa);
    run_latent(&fa8);
    latent_mma_fold = 3;
    latent_query_len = 2;
    if (local >= 23680 + 3072)
        run_latent(&ff);
    latent_mma_fold = 1;
    latent_query_len = 1;
}

static void test_attn_latent_rows(void)
{
    /* 5 heads, 4 per item (the second item has one real head), rkv 20 (16 by float8 + 4 after),
       3 splits with an empty one, tiles of 8 keys cut short. */
    static const int ctx_a[4] = {0, 1, 13, 21}, seq_a[4] = {0, 1, 1, 0};
    const latent_case a = {"rows: rkv 20 dr 4, 5 heads / 4 per item, 3 splits, f32", 1, 20, 4, 5, 4, 8, 3, 7, 4, 0, 4,
                           ctx_a, seq_a};
    /* The library's 16 heads per item with 8 real ones, a row of 80, f16. */
    static const int ctx_b[2] = {17, 9}, seq_b[2] = {0, 1};
    const latent_case b = {"rows: rkv 72 dr 8, 8 heads / 16 per item, f16", 1, 72, 8, 8, 16, 8, 1, 17, 5, 1, 2, ctx_b,
                           seq_b};
    /* Tiles of 4 keys (the scalar softmax), 2 heads, 2 splits. */
    static const int ctx_c[1] = {70}, seq_c[1] = {0};
    const latent_case c = {"rows: rkv 20 dr 4, 2 heads, tiles of 4, 2 splits, f32", 1, 20, 4, 2, 2, 4, 2, 40, 6, 0, 1,
                           ctx_c, seq_c};
    for (latent_sparse = 0; latent_sparse < 2; latent_sparse++) {
        run_latent(&a);
        run_latent(&b);
        run_latent(&c);
    }
    latent_sparse = 0;
}

static void test_attn_latent_lanes(void)
{
    /* 5 heads in the 16 lanes, rkv 20 (two steps of 8 values and 4 after), 3 splits with an empty
       one, tiles of 8 keys cut short. */
    static const int ctx_a[4] = {0, 1, 13, 21}, seq_a[4] = {0, 1, 1, 0};
    const latent_case a = {"lanes: rkv 20 dr 4, 5 heads, 3 splits, f32", 2, 20, 4, 5, 16, 8, 3, 7, 4, 0, 4, ctx_a,
                           seq_a};
    /* 20 heads (a full group and one of 4), a row of 80 halves, tiles of 12 keys. */
    static const int ctx_b[2] = {17, 40}, seq_b[2] = {0, 1};
    const latent_case b = {"lanes: rkv 72 dr 8, 20 heads, tiles of 12, f16", 2, 72, 8, 20, 16, 12, 1, 40, 5, 1, 2,
                           ctx_b, seq_b};
    /* tiles of 4 keys, 16 heads, 2 splits, a context that ends mid-block */
    static const int ctx_c[1] = {70}, seq_c[1] = {0};
    const latent_case c = {"lanes: rkv 20 dr 4, 16 heads, tiles of 4, 2 splits, f32", 2, 20, 4, 16, 16, 4, 2, 40, 6, 0,
                           1, ctx_c, seq_c};
    /* two vectors of heads: 40 heads (a group of 32 and one of 8), rkv 20, tiles of 8; 5 heads in a
       group of 32, tiles of 12, f16 */
    static const int ctx_d[3] = {21, 0, 9}, seq_d[3] = {0, 1, 1};
    const latent_case d = {"lanes x2: rkv 20 dr 4, 40 heads, 2 splits, f32", 3, 20, 4, 40, 32, 8, 2, 11, 4, 0, 3,
                           ctx_d, seq_d};
    const latent_case e = {"lanes x2: rkv 72 dr 8, 5 heads, tiles of 12, f16", 3, 72, 8, 5, 32, 12, 1, 40, 5, 1, 2,
                           ctx_b, seq_b};
    for (latent_sparse = 0; latent_sparse < 2; latent_sparse++) {
        run_latent(&a);
        run_latent(&b);
        run_latent(&c);
        run_latent(&d);
        run_latent(&e);
    }
    latent_sparse = 0;
    /* two tokens of a run an item (LFOLD): 20 heads (a group of 16 and one of 4), runs of 3 tokens
       (a pair and a token alone), one causal, one with a token without keys, 2 splits, the second
       empty for a pair; then f16 rows, runs of 2 with lengths in no order, tiles of 12 */
    static const int ctx_f[6] = {13, 14, 15, 9, 0, 21}, seq_f[6] = {0, 0, 0, 1, 1, 1};
    const latent_case f = {"lanes, two tokens: rkv 20 dr 4, 20 heads, runs of 3, 2 splits, f32", 4, 20, 4, 20, 16, 8,
                           2, 11, 4, 0, 6, ctx_f, seq_f};
    static const int ctx_g[4] = {39, 40, 17, 16}, seq_g[4] = {0, 0, 1, 1};
    const latent_case g = {"lanes, two tokens: rkv 72 dr 8, 16 heads, runs of 2, tiles of 12, f16", 4, 72, 8, 16, 16,
                           12, 1, 40, 5, 1, 4, ctx_g, seq_g};
    latent_query_len = 3;
    run_latent(&f);
    latent_query_len = 2;
    run_latent(&g);
    latent_query_len = 1;
}

/* attn_combine (an item per value) and attn_combine_rows (an item per row, float8 steps: RKV 11
   is one step and three values left over) on the same splits. */
static void run_attn_combine(const char *kernel_name)
{
    enum { RKV = 11, S = 3, H = 2, T = 3, OUT_OFF = 4, LSE_OFF = 1 };
    const int rows = strcmp(kernel_name, "attn_combine_rows") == 0;
    cl_kernel k = kernel("attn_combine", "-D RKV=11", kernel_name);
    tu_rng rng = tu_rng_seed(50);
    float part_out[T * S * H * RKV], part_lse[T * S * H];
    fill(part_out, sizeof(part_out) / sizeof(float), 2.0f, &rng);
    fill(part_lse, sizeof(part_lse) / sizeof(float), 30.0f, &rng);
    part_lse[(1 * S + 2) * H + 0] = -INFINITY; /* token 1: an empty split */
    part_lse[(1 * S + 0) * H + 1] = -INFINITY;
    for (int s = 0; s < S; s++)
        part_lse[(2 * S + s) * H + 1] = -INFINITY; /* token 2, head 1: every split empty */
    part_lse[(0 * S + 1) * H + 0] = 3000.0f;       /* dominates its row by thousands */
    float out[OUT_OFF + T * H * RKV], lse[LSE_OFF + T * H], want[OUT_OFF + T * H * RKV], want_lse[LSE_OFF + T * H];
    for (size_t i = 0; i < sizeof(out) / sizeof(float); i++)
        out[i] = want[i] = 55.0f;
    for (size_t i = 0; i < sizeof(lse) / sizeof(float); i++)
        lse[i] = want_lse[i] = 55.0f;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            double m = -INFINITY;
            for (int s = 0; s < S; s++)
                m = fmax(m, part_lse[(t * S + s) * H + h]);
            for (int d = 0; d < RKV; d++) {
                double sum = 0, acc = 0;
                for (int s = 0; s < S && m != -INFINITY; s++) {
                    const double w = exp(part_lse[(t * S + s) * H + h] - m);
                    sum += w;
                    acc += w * part_out[((t * S + s) * H + h) * RKV + d];
                }
                want[OUT_OFF + (t * H + h) * RKV + d] = m == -INFINITY ? 0.0f : (float)(acc / sum);
                if (d == 0)
                    want_lse[LSE_OFF + t * H + h] = m == -INFINITY ? -INFINITY : (float)(m + log(sum));
            }
        }
    cl_mem pob = buffer(sizeof(part_out), part_out), plb = buffer(sizeof(part_lse), part_lse);
    cl_mem ob = buffer(sizeof(out), out), lb = buffer(sizeof(lse), lse);
    const int splits = S, heads = H, out_off = OUT_OFF, lse_off = LSE_OFF;
    ARGS(k, 0, KARG(pob), KARG(plb), KARG(splits), KARG(heads), KARG(ob), KARG(out_off), KARG(lb), KARG(lse_off));
    const size_t global[3] = {RKV, H, T}, row_global[2] = {H, T}, row_local[2] = {1, 1};
    if (rows ? launch(k, 2, row_global, row_local) : launch(k, 3, global, NULL)) {
        download(ob, sizeof(out), out);
        download(lb, sizeof(lse), lse);
        CHECK_NEAR(out, want, sizeof(out) / sizeof(float), RKV, 1e-5, "%s out (offset area too)", kernel_name);
        int bad = 0;
        for (size_t i = 0; i < sizeof(lse) / sizeof(float); i++)
            bad += !(lse[i] == want_lse[i] || fabs(lse[i] - want_lse[i]) <= 1e-5 * (1 + fabs(want_lse[i])));
        CHECK(bad == 0, "%s: %d lse values differ", kernel_name, bad);
    }
}

static void test_attn_combine(void)
{
    run_attn_combine("attn_combine");
    run_attn_combine("attn_combine_rows");
}

/* ---- attn_prefill ------------------------------------------------------------------------------------ */

typedef struct prefill_case {
    int rows; /* 1: attn_prefill_rows (nt is QBC, kt unused); 2: attn_prefill_tiled (nt is BQ, kt is BK,
                 kc its key chunk) */
    int dn, dr, dv, nt, kt, heads, n_queries, prefix, kc;
    int poison; /* the last key's first value of head 0 NaN: only the last query may see it */
    int kpi;    /* attn_prefill_tiled: keys an item in the score step (KPI), 0 for the kernel's default 4 */
} prefill_case;

static void run_prefill(const prefill_case *c)
{
    const int dq = c->dn + c->dr, H = c->heads, L = c->prefix + c->n_queries, rkv = 6, row = rkv + c->dr;
    char options[160];
    static const char *const names[3] = {"attn_prefill", "attn_prefill_rows", "attn_prefill_tiled"};
    const int kpi = c->kpi ? c->kpi : 4;
    const char *name = names[c->rows];
    if (c->rows == 1)
        snprintf(options, sizeof(options), "-D DN=%d -D DR=%d -D DV=%d -D QBC=%d", c->dn, c->dr, c->dv, c->nt);
    else if (c->rows == 2) {
        char kpi_option[16] = "";
        if (c->kpi)
            snprintf(kpi_option, sizeof(kpi_option), " -D KPI=%d", c->kpi);
        snprintf(options, sizeof(options), "-D DN=%d -D DR=%d -D DV=%d -D TILED -D BQ=%d -D BK=%d -D KC=%d%s", c->dn,
                 c->dr, c->dv, c->nt, c->kt, c->kc, kpi_option);
    }
    else
        snprintf(options, sizeof(options), "-D DN=%d -D DR=%d -D DV=%d -D NT=%d -D KT=%d", c->dn, c->dr, c->dv, c->nt,
                 c->kt);
    cl_kernel k = kernel("attn_prefill", options, name);
    const int q_stride = H * dq + 1, q_off = 3, kvu_stride = H * (c->dn + c->dv) + 2, kvu_off = 1;
    const int o_stride = H * c->dv + 1, o_off = 2;
    const size_t nq = (size_t)q_off + (size_t)c->n_queries * q_stride, nkvu = (size_t)kvu_off + (size_t)L * kvu_stride;
    const size_t ng = (size_t)L * row, no = (size_t)o_off + (size_t)c->n_queries * o_stride + 2;
    tu_rng rng = tu_rng_seed((uint64_t)c->n_queries * 3 + (uint64_t)c->nt);
    float *q = malloc(nq * sizeof(float)), *kvu = malloc(nkvu * sizeof(float)), *g = malloc(ng * sizeof(float));
    float *out = malloc(no * sizeof(float)), *want = malloc(no * sizeof(float));
    fill(q, nq, 1.0f, &rng);
    fill(kvu, nkvu, 1.0f, &rng);
    fill(g, ng, 1.0f, &rng);
    const size_t poisoned = (size_t)kvu_off + (size_t)(L - 1) * kvu_stride + (size_t)c->dn; /* head 0, value 0 */
    if (c->poison)
        kvu[poisoned] = NAN;
    for (size_t i = 0; i < no; i++)
        out[i] = want[i] = 4242.0f;
    const float scale = 0.4f;
    double *p = malloc((size_t)L * sizeof(double));
    for (int i = 0; i < c->n_queries; i++)
        for (int h = 0; h < H; h++) {
            const int keys = c->prefix + i + 1;
            const float *qi = q + q_off + (size_t)i * q_stride + (size_t)h * dq;
            double m = -INFINITY;
            for (int j = 0; j < keys; j++) {
                const float *kj = kvu + kvu_off + (size_t)j * kvu_stride + (size_t)h * (c->dn + c->dv);
                double s = 0;
                for (int d = 0; d < c->dn; d++)
                    s += (double)qi[d] * kj[d];
                for (int d = 0; d < c->dr; d++)
                    s += (double)qi[c->dn + d] * g[(size_t)j * row + rkv + d];
                p[j] = s * scale;
                m = fmax(m, p[j]);
            }
            double sum = 0;
            for (int j = 0; j < keys; j++)
                sum += (p[j] = exp(p[j] - m));
            for (int d = 0; d < c->dv; d++) {
                double acc = 0;
                for (int j = 0; j < keys; j++)
                    acc += p[j] * kvu[kvu_off + (size_t)j * kvu_stride + (size_t)h * (c->dn + c->dv) + c->dn + d];
                want[o_off + (size_t)i * o_stride + (size_t)h * c->dv + d] = (float)(acc / sum);
            }
        }
    cl_mem qb = buffer(nq * sizeof(float), q), kb = buffer(nkvu * sizeof(float), kvu), gb = buffer(ng * sizeof(float), g);
    cl_mem ob = buffer(no * sizeof(float), out);
    ARGS(k, 0, KARG(qb), KARG(q_off), KARG(q_stride), KARG(kb), KARG(kvu_off), KARG(kvu_stride), KARG(gb), KARG(rkv),
         KARG(row), KARG(c->n_queries), KARG(c->prefix), KARG(scale), KARG(ob), KARG(o_off), KARG(o_stride));
    const size_t per = (size_t)c->nt,
                 threads = c->rows == 1 ? 1 : c->rows == 2 ? (size_t)(c->nt / 2) * (size_t)(c->kt / kpi) : per;
    const size_t global[2] = {((size_t)c->n_queries + per - 1) / per * threads, (size_t)H}, local[2] = {threads, 1};
    if (launch(k, 2, global, local)) {
        download(ob, no * sizeof(float), out);
        if (c->poison) { /* the last query's value 0 of head 0 is NaN, as float64's; nothing else is */
            const size_t at = (size_t)o_off + (size_t)(c->n_queries - 1) * o_stride;
            CHECK(isnan(out[at]) && isnan(want[at]), "%s: the poisoned key's NaN: got %g, want %g", name, out[at],
                  want[at]);
            out[at] = want[at] = 0.0f;
        }
        CHECK_NEAR(out, want, no, o_stride, 1e-5, "%s %s=%d KPI=%d H=%d queries %d after %d (all of out)", name,
                   c->rows == 1 ? "QBC" : c->rows == 2 ? "BQ" : "NT", c->nt, kpi, H, c->n_queries, c->prefix);
    }
    free(q);
    free(kvu);
    free(g);
    free(out);
    free(want);
    free(p);
}

static void test_attn_prefill(void)
{
    const prefill_case a = {0, 4, 2, 3, 8, 4, 2, 11, 5, 0, 1, 0}; /* 2 query tiles, the second cut short; a NaN key */
    const prefill_case b = {0, 8, 4, 8, 32, 16, 3, 37, 0, 0, 0, 0}; /* the library's tile sizes */
    run_prefill(&a);
    run_prefill(&b);
}

static void test_attn_prefill_tiled(void)
{
    /* a: dq 6 (one float4 and a padded one), dv 4, blocks of 4 queries, tiles of 8 keys in chunks of
       4 dimensions, 4 items for 1 (query quad, value float4) pair: 3 query blocks, the last cut short,
       after a prefix of 5 (tiles across the diagonal). b: dq 12 in chunks of 8 (the second half
       padding), dv 12 (3 value float4s). c, d: the library's 32 x 32 tiles and 64-value chunks on dq 24
       (one chunk, mostly padding), 2 heads, 45 queries after 70 (whole tiles before the diagonal, the
       second block cut short) and 37 with none. e: 8 items for 20 pairs (3 a piece, the last short).
       a and e: a NaN in the last key's values, which only the last query may see.
       f: DeepSeek's dims (dq 192 in 3 chunks, dv 128) in blocks of 16 (the library's choice where
       local memory is 32 KiB), 2 pairs a piece.
       Fewer keys an item in the score step (KPI), more items: g, DeepSeek's dims in blocks of 16 with
       1 key an item, 256 items, whose value step takes query pairs (quads would leave half idle);
       h, dq 24 and dv 128 in 32 x 32 tiles with 2 keys an item, 256 items, quads, one pair each; i,
       the same over tiles of 16 keys (128 items, quads, 2 pairs each); j, a's small shape with 1 key
       an item (query pairs, items past the last pair idle); k, e's with 2 keys an item (quads, 2
       pairs an item, the last short); i, j and k with a NaN key. */
    const prefill_case a = {2, 4, 2, 4, 4, 8, 2, 11, 5, 4, 1, 0};
    const prefill_case b = {2, 8, 4, 12, 8, 16, 3, 29, 3, 8, 0, 0};
    const prefill_case c = {2, 16, 8, 8, 32, 32, 2, 45, 70, 64, 0, 0};
    const prefill_case d = {2, 16, 8, 8, 32, 32, 1, 37, 0, 64, 0, 0};
    const prefill_case e = {2, 8, 4, 40, 8, 8, 1, 19, 9, 16, 1, 0};
    const prefill_case f = {2, 128, 64, 128, 16, 32, 1, 21, 40, 64, 0, 0};
    const prefill_case g = {2, 128, 64, 128, 16, 32, 1, 21, 40, 64, 0, 1};
    const prefill_case h = {2, 16, 8, 128, 32, 32, 1, 37, 19, 64, 0, 2};
    const prefill_case i = {2, 16, 8, 128, 32, 16, 1, 37, 40, 64, 1, 2};
    const prefill_case j = {2, 4, 2, 4, 4, 8, 2, 11, 5, 4, 1, 1};
    const prefill_case k = {2, 8, 4, 40, 8, 8, 1, 19, 9, 16, 1, 2};
    run_prefill(&a);
    run_prefill(&b);
    run_prefill(&c);
    run_prefill(&d);
    run_prefill(&e);
    run_prefill(&f);
    run_prefill(&g);
    run_prefill(&h);
    run_prefill(&i);
    run_prefill(&j);
    run_prefill(&k);
}

static void test_attn_prefill_rows(void)
{
    /* Blocks of 4 queries after a 5-token prefix (no dimension reaches a float8), and the library's
       16 with dq 12 and dv 8 (float8 parts and tails), 37 queries: the last block is cut short. */
    const prefill_case a = {1, 4, 2, 3, 4, 0, 2, 11, 5, 0, 0, 0};
    const prefill_case b = {1, 8, 4, 8, 16, 0, 3, 37, 0, 0, 0, 0};
    const prefill_case c = {1, 8, 4, 8, 16, 0, 2, 20, 13, 0, 1, 0}; /* a NaN in the last key */
    /* dv 24 and 33 (the cases above stop at 8): the weighted sum in several float8 steps, with no
       value and with one left over; dq 13 (8 + 5 left over); tiles wholly visible and on the diagonal */
    const prefill_case d = {1, 8, 4, 24, 16, 0, 2, 45, 19, 0, 0, 0};
    const prefill_case e = {1, 10, 3, 33, 8, 0, 1, 29, 40, 0, 0, 0};
    run_prefill(&a);
    run_prefill(&b);
    run_prefill(&c);
    run_prefill(&d);
    run_prefill(&e);
}

/* ---- gemm_skinny, gemm_rows ----------------------------------------------------------------------- */

typedef struct gemm_case {
    const char *kernel;  /* gemm_skinny_nt, _nn, _nt_rows, _nn_rows, gemm_packed_rows, gemm_tiled_rows */
    const char *options;
    int M, N, K, batch, transposed;
    float alpha, beta;
    size_t global[2], local[2];
    int columns_per_item, row_blocks; /* the _rows kernels' extra arguments (row_blocks 0: none; _nn_rows:
                                         strips of 8 NCC columns per item); gemm_tiled_rows:
                                         columns_per_item is the panel of packed B */
    int k_chunk;                      /* and its K chunk (0: all of K) */
    int pack_chunk;                   /* gemm_packed_rows: B packed here in panels of columns_per_item
                                         rows, chunks of this many values of K (its -D PCH) */
} gemm_case;

/* The file of a product kernel: the work-group forms are cl/gemm_skinny.cl's, the CPU forms
   cl/gemm_rows.cl's. */
static const char *gemm_file(const char *kernel)
{
    static const char *const work_group[] = {"gemm_skinny_nt", "gemm_skinny_nn", "gemm_skinny_nn_split"};
    for (size_t i = 0; i < sizeof(work_group) / sizeof(work_group[0]); i++)
        if (strcmp(kernel, work_group[i]) == 0)
            return "gemm_skinny";
    return "gemm_rows";
}

/* C = alpha A op(B) + beta C over batch products at strides and offsets, every value of C (its
   padding too) against a double computation. row_blocks > 1 is the many-rows form, dimension 1
   over (product, block of rows). */
static void run_gemm(const gemm_case *c)
{
    const int M = c->M, N = c->N, K = c->K, batch = c->batch;
    /* W_ALIGNED (whole-vector loads: gemm_skinny_nt's and gemm_skinny_nn_split's) promises A's and
       B's vectors of up to 16 values aligned: rows, strides and offsets then a multiple of 16
       values, still padded */
    const int al = strstr(c->options, "W_ALIGNED") ? 16 : 1;
#define ALIGN_UP(v) (((v) + al - 1) / al * al)
    const int lda = ALIGN_UP(K + 3), ldb = c->transposed ? ALIGN_UP(K + 1) : ALIGN_UP(N + 2), ldc = N + 4;
    const int b_rows = c->transposed ? N : K;
    const int a_stride = ALIGN_UP(M * lda + 5), b_stride = ALIGN_UP(b_rows * ldb + 3), c_stride = M * ldc + 2;
    const int ao = ALIGN_UP(2), bo = ALIGN_UP(1), co = 3;
#undef ALIGN_UP
    const size_t na = (size_t)ao + (size_t)(batch - 1) * a_stride + (size_t)M * lda;
    const size_t nb = (size_t)bo + (size_t)(batch - 1) * b_stride + (size_t)b_rows * ldb;
    const size_t nc = (size_t)co + (size_t)(batch - 1) * c_stride + (size_t)M * ldc + 1;
    tu_rng rng = tu_rng_seed((uint64_t)M * 131 + (uint64_t)N * 7 + (uint64_t)K);
    float *a = malloc(na * sizeof(float)), *b = malloc(nb * sizeof(float)), *cm = malloc(nc * sizeof(float));
    float *got = malloc(nc * sizeof(float)), *want = malloc(nc * sizeof(float));
    fill(a, na, 1.0f, &rng);
    fill(b, nb, 1.0f, &rng);
    fill(cm, nc, 1.0f, &rng);
    memcpy(want, cm, nc * sizeof(float));
    /* gemm_packed_rows reads B packed, batch q at bo + q * packed_stride: panels of P rows, each
       [chunk][row][value], written here from the row-major B that the reference uses. */
    const int P = c->columns_per_item, packed_stride = N * K + 3;
    const size_t nbp = c->pack_chunk ? (size_t)bo + (size_t)(batch - 1) * packed_stride + (size_t)N * K : 0;
    float *bp = c->pack_chunk ? calloc(nbp, sizeof(float)) : NULL;
    for (int q = 0; bp && q < batch; q++) {
        float *dst = bp + bo + (size_t)q * packed_stride;
        for (int p0 = 0; p0 < N; p0 += P)
            for (int k0 = 0; k0 < K; k0 += c->pack_chunk)
                for (int r = p0; r < N && r < p0 + P; r++)
                    for (int kk = k0; kk < K && kk < k0 + c->pack_chunk; kk++)
                        *dst++ = b[bo + (size_t)q * b_stride + (size_t)r * ldb + kk];
    }
    for (int q = 0; q < batch; q++)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double s = 0;
                for (int k = 0; k < K; k++) {
                    const float bv = c->transposed ? b[bo + (size_t)q * b_stride + (size_t)n * ldb + k]
                                                   : b[bo + (size_t)q * b_stride + (size_t)k * ldb + n];
                    s += (double)a[ao + (size_t)q * a_stride + (size_t)m * lda + k] * bv;
                }
                float *dst = &want[co + (size_t)q * c_stride + (size_t)m * ldc + n];
                *dst = (float)(c->alpha * s + (c->beta != 0.0f ? (double)c->beta * *dst : 0.0));
            }
    cl_kernel k = kernel(gemm_file(c->kernel), c->options, c->kernel);
    cl_mem ab = buffer(na * sizeof(float), a), cb = buffer(nc * sizeof(float), cm);
    cl_mem bb = bp ? buffer(nbp * sizeof(float), bp) : buffer(nb * sizeof(float), b);
    const int b_stride_arg = bp ? packed_stride : b_stride;
    ARGS(k, 0, KARG(M), KARG(N), KARG(K), KARG(c->alpha), KARG(ab), KARG(ao), KARG(lda), KARG(a_stride), KARG(bb),
         KARG(bo), KARG(ldb), KARG(b_stride_arg), KARG(c->beta), KARG(cb), KARG(co), KARG(ldc), KARG(c_stride));
    const cl_mem no_scale = NULL; /* float32 B: no block scales (test_linear runs the weight dtypes) */
    const int no_scale_ld = 0;
    ARG(k, 17, no_scale);
    ARG(k, 18, no_scale_ld);
    if (strcmp(c->kernel, "gemm_skinny_nn_wide") == 0) {
        ARG(k, 19, c->row_blocks);
    } else if (strcmp(c->kernel, "gemm_tiled_rows") == 0) {
        const int panel = bp ? P : 0;
        ARG(k, 19, panel);
    } else if (c->row_blocks > 0) {
        ARG(k, 19, c->columns_per_item);
        ARG(k, 20, c->row_blocks);
        if (!bp && strcmp(c->kernel, "gemm_skinny_nn_rows") != 0)
            ARG(k, 21, c->k_chunk);
    }
    if (launch(k, 2, c->global, c->local)) {
        download(cb, nc * sizeof(float), got);
        CHECK_NEAR(got, want, nc, ldc, 1e-5, "%s (%s) M=%d N=%d K=%d batch %d alpha %g beta %g: all of C", c->kernel,
                   c->options, M, N, K, batch, (double)c->alpha, (double)c->beta);
    }
    free(a);
    free(b);
    free(bp);
    free(cm);
    free(got);
    free(want);
}

/* gemm_weight_f32 with fp8 codes: rows 1..3 of a 131 x 260 weight with two block rows and three
   block columns of scales, from an offset of whole rows, decoded to float32 = code * its block's
   scale, exactly (ref/'s e4m3 decoder). The bf16 and f16 forms share W_LOAD with the product
   kernels, which test_linear checks per dtype. */
static void test_gemm_weight_f32(void)
{
    enum { R = 131, K = 260, FIRST = 126, ROWS = 5 };
    unsigned char *codes = malloc((size_t)R * K);
    float scales[2 * 3], *got = malloc((size_t)ROWS * K * sizeof(float));
    tu_rng rng = tu_rng_seed(77);
    for (size_t i = 0; i < (size_t)R * K; i++) {
        unsigned c = (unsigned)(tu_rng_next(&rng) & 0xFF);
        codes[i] = (unsigned char)((c & 0x7F) == 0x7F ? c ^ 1 : c);
    }
    for (int i = 0; i < 6; i++)
        scales[i] = 0.25f * (float)(i + 1);
    cl_kernel k = kernel("convert", "-D W_DTYPE=3", "gemm_weight_f32");
    cl_mem cb = buffer((size_t)R * K, codes), sb = buffer(sizeof(scales), scales);
    cl_mem ob = buffer((size_t)ROWS * K * sizeof(float), NULL);
    const int b_offset = FIRST * K, ldb = K, rows = ROWS, cols = K, bs_ld = 3;
    ARGS(k, 0, KARG(cb), KARG(b_offset), KARG(ldb), KARG(rows), KARG(cols), KARG(sb), KARG(bs_ld), KARG(ob));
    const size_t global[2] = {K, ROWS}, local[2] = {4, 1};
    if (launch(k, 2, global, local)) {
        download(ob, (size_t)ROWS * K * sizeof(float), got);
        int bad = 0;
        for (int r = 0; r < ROWS; r++)
            for (int j = 0; j < K; j++) {
                const int row = FIRST + r;
                const double want = mla_ref_decode_e4m3(codes[(size_t)row * K + j]) * scales[(row / 128) * 3 + j / 128];
                bad += got[(size_t)r * K + j] != (float)want;
            }
        CHECK(bad == 0, "gemm_weight_f32 fp8: %d of %d values differ from code * scale", bad, ROWS * K);
    }
    free(codes);
    free(got);
}

/* gemm_packed_rows' line-wide form for one row (PACKED_WIDE: bf16, and fp8 through the half decoder),
   run directly: 19 weight rows in panels of 5 (the last one of 4; segments of one row, so that most
   streams fall past the panel), K 384 in packing chunks of 256 (the last one 128), fp8 with three
   block scales per row, the weights from an offset of 4 codes, beta 0.5; against float64 sums of
   the decoded weights (ref/'s decoders). test_linear runs it through the library. */
static void test_gemm_packed_wide(void)
{
    enum { N = 19, K = 384, P = 5, PCH = 256, OFF = 4 };
    for (int fp8 = 0; fp8 < 2; fp8++) {
        const size_t eb = fp8 ? 1 : 2;
        tu_rng rng = tu_rng_seed(91u + (unsigned)fp8);
        unsigned char *codes = malloc((size_t)N * K * eb), *packed = calloc((size_t)OFF + (size_t)N * K, eb);
        float x[K], c[N], scales[3] = {0.5f, 0.0625f, 3.0f};
        double want[N];
        for (size_t i = 0; i < (size_t)N * K; i++) {
            const unsigned r = (unsigned)tu_rng_next(&rng);
            if (fp8)
                codes[i] = (unsigned char)((r & 0x7F) == 0x7F ? (r & 0xFF) ^ 1 : r & 0xFF);
            else { /* bf16 of sign, exponent 2^-7 .. 2^3, any mantissa */
                const unsigned bits = (r >> 31) << 15 | (120 + (r >> 8) % 11) << 7 | (r & 0x7F);
                codes[2 * i] = (unsigned char)(bits & 0xFF);
                codes[2 * i + 1] = (unsigned char)(bits >> 8);
            }
        }
        fill(x, K, 1.0f, &rng);
        fill(c, N, 1.0f, &rng);
        for (int n = 0; n < N; n++) {
            double sum = 0;
            for (int k = 0; k < K; k++) {
                const size_t i = (size_t)n * K + k;
                const double w = fp8 ? mla_ref_decode_e4m3(codes[i]) * scales[k / 128]
                                     : mla_ref_decode_bf16((unsigned)codes[2 * i] | (unsigned)codes[2 * i + 1] << 8);
                sum += (double)x[k] * w;
            }
            want[n] = sum + 0.5 * c[n];
        }
        unsigned char *dst = packed + OFF * eb; /* panels of P rows, [chunk][row][value] */
        for (int p0 = 0; p0 < N; p0 += P)
            for (int k0 = 0; k0 < K; k0 += PCH)
                for (int r = p0; r < N && r < p0 + P; r++) {
                    const int len = K - k0 < PCH ? K - k0 : PCH;
                    memcpy(dst, codes + ((size_t)r * K + k0) * eb, (size_t)len * eb);
                    dst += (size_t)len * eb;
                }
        cl_kernel k = kernel("gemm_rows",
                             fp8 ? "-D MR=1 -D NCC=8 -D PCH=256 -D PACKED_WIDE -D W_DTYPE=3 -D CLMLA_FP8_HALF -D W_BLOCK_SUMS"
                                 : "-D MR=1 -D NCC=8 -D PCH=256 -D PACKED_WIDE -D W_DTYPE=2",
                             "gemm_packed_rows");
        cl_mem ab = buffer(sizeof(x), x), bb = buffer(((size_t)OFF + (size_t)N * K) * eb, packed);
        cl_mem cb = buffer(sizeof(c), c), sb = buffer(sizeof(scales), scales);
        const int M = 1, n_ = N, k_ = K, zero = 0, lda = K, off = OFF, ldb = K, ldc = N, bs_ld = 3, panel = P, one = 1;
        const float alpha = 1.0f, beta = 0.5f;
        ARGS(k, 0, KARG(M), KARG(n_), KARG(k_), KARG(alpha), KARG(ab), KARG(zero), KARG(lda), KARG(zero), KARG(bb),
             KARG(off), KARG(ldb), KARG(zero), KARG(beta), KARG(cb), KARG(zero), KARG(ldc), KARG(zero), KARG(sb),
             KARG(bs_ld), KARG(panel), KARG(one));
        const size_t global[2] = {(N + P - 1) / P, 1}, local[2] = {1, 1};
        if (launch(k, 2, global, local)) {
            float got[N];
            download(cb, sizeof(got), got);
            CHECK_NEAR(got, want, N, N, 1e-5, "gemm_packed_rows line-wide, %s, N %d K %d", fp8 ? "fp8" : "bf16", N, K);
        }
        free(codes);
        free(packed);
    }
}

static void test_gemm_skinny(void)
{
    /* The work-group forms (GPUs). gemm_skinny_nt: rows bucketed to 1, 2, 4, 8 (5 and 3 rows in
       buckets of 8 and 4: the rows past M neither read nor stored), 1, 2 and 4 columns per group
       with a partial last block, K not a multiple of 4 (a tail of 1-3), K whose float4s end inside
       an unrolled step or take several of them, K under 4, 64, 32 and 16 items. */
    const gemm_case cases[] = {
        {"gemm_skinny_nt", "-D MR=8 -D NC=4 -D WG=64 -D UK=2", 5, 7, 37, 2, 1, 1.0f, 0.0f, {2 * 64, 2}, {64, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nt", "-D MR=8 -D NC=4 -D WG=16 -D UK=2", 8, 9, 133, 1, 1, 0.5f, 2.0f, {3 * 16, 1}, {16, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nt", "-D MR=1 -D NC=1 -D WG=32 -D UK=4", 1, 5, 1030, 2, 1, 1.0f, 0.0f, {5 * 32, 2}, {32, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nt", "-D MR=2 -D NC=2 -D WG=16 -D UK=2", 2, 7, 131, 1, 1, 1.0f, 1.0f, {4 * 16, 1}, {16, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nt", "-D MR=4 -D NC=1 -D WG=64 -D UK=2", 3, 3, 3, 1, 1, 2.0f, 0.0f, {3 * 64, 1}, {64, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nt", "-D MR=4 -D NC=2 -D WG=16 -D UK=4", 4, 6, 512, 3, 1, 1.0f, 0.5f, {3 * 16, 3}, {16, 1}, 0, 0, 0, 0},
        /* whole-vector loads (W_ALIGNED: run_gemm aligns the operands), 4 and 8 values a load, a
           K tail past the vectors, batches. Not 16 here: oclgrind 21.10's uninitialised-value
           check (ci/oclgrind.sh, unoptimised builds) reports every dot of a float16's parts, with
           vload16 as well, while the optimised run passes; test_linear runs 16 on PoCL. */
        {"gemm_skinny_nt", "-D MR=4 -D NC=2 -D WG=16 -D UK=2 -D W_ALIGNED", 3, 7, 133, 2, 1, 1.0f, 0.5f, {4 * 16, 2}, {16, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nt", "-D MR=1 -D NC=4 -D WG=32 -D UK=2 -D VW=8 -D W_ALIGNED", 1, 9, 1030, 2, 1, 1.0f, 0.0f, {3 * 32, 2}, {32, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nn", "-D MMAX=8 -D WG=64", 3, 13, 9, 3, 0, 1.0f, 0.0f, {64, 3}, {64, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nn", "-D MMAX=8 -D WG=16", 8, 40, 5, 1, 0, -1.0f, 1.0f, {48, 1}, {16, 1}, 0, 0, 0, 0},
        /* gemm_skinny_nn_split: N a multiple of 4 (the host's rule) with a last group of columns
           cut short, K not a multiple of the slices and under them, rows bucketed (3 in 4), one
           float4 of columns a group (KS = WG), B's rows not float4-aligned (ldb N + 2, offset 1) */
        {"gemm_skinny_nn_split", "-D MR=4 -D KS=4 -D WG=16", 3, 20, 9, 3, 0, 1.0f, 0.0f, {2 * 16, 3}, {16, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nn_split", "-D MR=8 -D KS=8 -D WG=64", 8, 40, 133, 1, 0, -1.0f, 1.0f, {2 * 64, 1}, {64, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nn_split", "-D MR=1 -D KS=2 -D WG=16", 1, 4, 5, 2, 0, 2.0f, 0.5f, {16, 2}, {16, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nn_split", "-D MR=2 -D KS=16 -D WG=16", 2, 12, 40, 1, 0, 1.0f, 0.0f, {3 * 16, 1}, {16, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nn_split", "-D MR=8 -D KS=4 -D WG=32", 5, 8, 3, 2, 0, 1.0f, 0.0f, {32, 2}, {32, 1}, 0, 0, 0, 0},
        /* ... reading B's float4s as whole vectors (W_ALIGNED): a short last group, a batch */
        {"gemm_skinny_nn_split", "-D MR=4 -D KS=4 -D WG=16 -D W_ALIGNED", 3, 20, 9, 3, 0, 1.0f, 0.5f, {2 * 16, 3}, {16, 1}, 0, 0, 0, 0},
        {"gemm_skinny_nn_split", "-D MR=1 -D KS=8 -D WG=64 -D W_ALIGNED", 1, 40, 133, 1, 0, 1.0f, 0.0f, {2 * 64, 1}, {64, 1}, 0, 0, 0, 0},
        /* The CPU forms: rows bucketed to 1, 2, 4, 8 (NCC = 8 / rows), several column blocks per
           item, N not a multiple of a block, K with a tail past its float8s. */
        {"gemm_skinny_nt_rows", "-D MR=1 -D NCC=8", 1, 19, 37, 2, 1, 1.0f, 0.0f, {2, 2}, {1, 1}, 16, 1, 0, 0},
        {"gemm_skinny_nt_rows", "-D MR=2 -D NCC=4", 2, 19, 37, 1, 1, 1.0f, 1.0f, {3, 1}, {1, 1}, 8, 1, 0, 0},
        {"gemm_skinny_nt_rows", "-D MR=4 -D NCC=2", 3, 10, 8, 2, 1, 2.0f, 0.0f, {5, 2}, {1, 1}, 2, 1, 0, 0},
        {"gemm_skinny_nt_rows", "-D MR=8 -D NCC=1", 7, 5, 21, 1, 1, 1.0f, 0.0f, {5, 1}, {1, 1}, 1, 1, 0, 0},
        /* K in chunks (the partial sums added into C, beta applied once): chunks of 8 and 16 over
           K = 37 (4 whole float8s + a tail) and 133, a chunk longer than K, K under 8. */
        {"gemm_skinny_nt_rows", "-D MR=8 -D NCC=1", 8, 6, 37, 1, 1, 1.0f, 0.5f, {6, 1}, {1, 1}, 1, 1, 8, 0},
        {"gemm_skinny_nt_rows", "-D MR=4 -D NCC=2", 4, 9, 133, 2, 1, 2.0f, -1.0f, {3, 2}, {1, 1}, 4, 1, 16, 0},
        {"gemm_skinny_nt_rows", "-D MR=2 -D NCC=4", 2, 8, 37, 1, 1, 1.0f, 1.0f, {2, 1}, {1, 1}, 4, 1, 512, 0},
        {"gemm_skinny_nt_rows", "-D MR=1 -D NCC=8", 1, 8, 5, 1, 1, 1.0f, 2.0f, {1, 1}, {1, 1}, 8, 1, 8, 0},
        /* ... and many rows: blocks of 4 rows (the last one short), 64 columns per item, one
           product and a batch of three (the absorbed path's W^UV of a prefill chunk). */
        {"gemm_skinny_nt_rows", "-D MR=4 -D NCC=2", 11, 70, 19, 1, 1, 1.0f, 0.0f, {2, 3}, {1, 1}, 64, 3, 0, 0},
        {"gemm_skinny_nt_rows", "-D MR=4 -D NCC=2", 11, 70, 19, 3, 1, 1.0f, 0.5f, {2, 9}, {1, 1}, 64, 3, 0, 0},
        {"gemm_skinny_nn_rows", "-D MR=1 -D NCC=8", 1, 24, 7, 2, 0, 1.0f, 0.0f, {1, 2}, {1, 1}, 1, 1, 0, 0},
        {"gemm_skinny_nn_rows", "-D MR=4 -D NCC=2", 3, 40, 9, 2, 0, 1.0f, 0.5f, {3, 2}, {1, 1}, 1, 1, 0, 0},
        {"gemm_skinny_nn_rows", "-D MR=8 -D NCC=1", 8, 16, 3, 1, 0, 1.0f, 0.0f, {2, 1}, {1, 1}, 1, 1, 0, 0},
        /* x B with many rows (the absorbed path's W^UK of a prefill chunk): 19 rows in blocks of 8
           (the last one short), 2 strips an item (the last item with one), a batch of three. */
        {"gemm_skinny_nn_rows", "-D MR=8 -D NCC=1", 19, 40, 9, 3, 0, 1.0f, 0.0f, {3, 9}, {1, 1}, 2, 3, 0, 0},
        {"gemm_skinny_nn_rows", "-D MR=4 -D NCC=2", 6, 48, 5, 2, 0, 2.0f, 1.0f, {2, 4}, {1, 1}, 2, 2, 0, 0},
        /* x B walking whole rows (W^UK at decode): runs of NW strips, the last one short (N = 40 in
           runs of 16 columns: 16, 16, 8), fewer strips than a run, rows 1, 2, 3 of 4 and 6 as two
           blocks (the last one short), a batch of three */
        {"gemm_skinny_nn_wide", "-D MR=1 -D NCC=8 -D NW=2", 1, 40, 7, 2, 0, 1.0f, 0.0f, {3, 2}, {1, 1}, 0, 1, 0, 0},
        {"gemm_skinny_nn_wide", "-D MR=2 -D NCC=4", 2, 24, 9, 3, 0, 1.0f, 0.5f, {1, 3}, {1, 1}, 0, 1, 0, 0},
        {"gemm_skinny_nn_wide", "-D MR=4 -D NCC=2 -D NW=3", 3, 56, 13, 1, 0, 2.0f, 1.0f, {3, 1}, {1, 1}, 0, 1, 0, 0},
        {"gemm_skinny_nn_wide", "-D MR=4 -D NCC=2 -D NW=2", 6, 32, 5, 2, 0, 1.0f, 0.0f, {2, 4}, {1, 1}, 0, 2, 0, 0},
        /* rows of B in NWS streams (the default 8 takes K 9 and 13 as one row a stream and the
           rest alone, K 5 and 7 all alone): 4 streams of 3 rows and the 13th alone, 3 streams of 3 */
        {"gemm_skinny_nn_wide", "-D MR=2 -D NCC=4 -D NW=2 -D NWS=4", 2, 40, 13, 2, 0, 1.0f, 0.5f, {3, 2}, {1, 1}, 0, 1, 0, 0},
        {"gemm_skinny_nn_wide", "-D MR=1 -D NCC=8 -D NWS=3", 1, 24, 9, 1, 0, 1.0f, 0.0f, {1, 1}, {1, 1}, 0, 1, 0, 0},
        /* Packed weights: rows 1, 2, 4, 8 (8, 4, 3 and 3 streams of panel rows, 8 rows in two
           passes), panels of fewer rows than streams, of rows not a multiple of the streams (the
           last segment short) and a last panel short of P rows, chunks of K whose last one is
           short (a tail under 8 values), and 19 rows as 3 blocks of 8 (the last one short). */
        {"gemm_packed_rows", "-D MR=1 -D NCC=8 -D PCH=16", 1, 19, 37, 2, 1, 1.0f, 0.0f, {4, 2}, {1, 1}, 5, 1, 0, 16},
        {"gemm_packed_rows", "-D MR=1 -D NCC=8 -D PCH=128", 1, 6, 200, 1, 1, 1.0f, 1.0f, {2, 1}, {1, 1}, 3, 1, 0, 128},
        {"gemm_packed_rows", "-D MR=2 -D NCC=4 -D PCH=16", 2, 19, 40, 1, 1, 1.0f, 1.0f, {3, 1}, {1, 1}, 8, 1, 0, 16},
        {"gemm_packed_rows", "-D MR=4 -D NCC=2 -D PCH=64", 3, 10, 133, 2, 1, 2.0f, 0.0f, {4, 2}, {1, 1}, 3, 1, 0, 64},
        {"gemm_packed_rows", "-D MR=8 -D NCC=1 -D PCH=512", 7, 5, 21, 1, 1, 1.0f, 0.5f, {3, 1}, {1, 1}, 2, 1, 0, 512},
        {"gemm_packed_rows", "-D MR=8 -D NCC=1 -D PCH=32", 19, 11, 70, 1, 1, 1.0f, 0.0f, {3, 3}, {1, 1}, 4, 3, 0, 32},
        {"gemm_packed_rows", "-D MR=1 -D NCC=8 -D PCH=16", 1, 50, 37, 1, 1, 1.0f, 0.0f, {3, 1}, {1, 1}, 21, 1, 0, 16},
        {"gemm_packed_rows", "-D MR=4 -D NCC=2 -D PCH=24", 4, 31, 61, 2, 1, 1.0f, 2.0f, {3, 2}, {1, 1}, 13, 1, 0, 24},
        {"gemm_packed_rows", "-D MR=8 -D NCC=1 -D PCH=40", 8, 29, 93, 1, 1, 0.5f, 0.0f, {3, 1}, {1, 1}, 13, 1, 0, 40},
        /* rows of K within one chunk: row-major W (W^UV per head), a batch of three at strides */
        {"gemm_packed_rows", "-D MR=1 -D NCC=8 -D PCH=64", 1, 19, 37, 3, 1, 1.0f, 0.0f, {3, 3}, {1, 1}, 7, 1, 0, 64},
        {"gemm_packed_rows", "-D MR=2 -D NCC=4 -D PCH=64", 2, 19, 37, 3, 1, 1.0f, 0.5f, {1, 3}, {1, 1}, 19, 1, 0, 64},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_gemm(&cases[i]);
}

/* gemm_tiled_rows (CPUs, 64 rows or more): C = alpha A B^T + beta C, B row-major or packed in
   panels of columns_per_item rows and chunks of KC (= pack_chunk) values, one product. Tiles of TR x
   TC small enough here that rows, columns and K all end inside a tile, a micro-tile of 4 x 3 or a
   chunk; then the library's own tile sizes. */
static void test_gemm_tiled(void)
{
    static const gemm_case cases[] = {
        /* row-major: K in chunks with a short last one whose tail is under 8 values */
        {"gemm_tiled_rows", "-D TR=8 -D TC=6 -D KC=16", 19, 17, 37, 1, 1, 1.0f, 0.0f, {3, 3}, {1, 1}, 0, 0, 0, 0},
        {"gemm_tiled_rows", "-D TR=4 -D TC=3 -D KC=8", 5, 7, 5, 1, 1, 2.0f, 0.5f, {3, 2}, {1, 1}, 0, 0, 0, 0},  /* K < 8 */
        {"gemm_tiled_rows", "-D TR=4 -D TC=3 -D KC=8", 3, 4, 0, 1, 1, 1.0f, 2.0f, {2, 1}, {1, 1}, 0, 0, 0, 0},  /* K = 0: beta C */
        {"gemm_tiled_rows", "-D TR=12 -D TC=9 -D KC=24", 13, 10, 48, 1, 1, -1.0f, 1.0f, {2, 2}, {1, 1}, 0, 0, 0, 0},
        /* the library's tiles: two row tiles, a whole chunk and a tail; 8 columns, a micro-tile's
           3 cut short */
        {"gemm_tiled_rows", "-D TR=256 -D TC=48 -D KC=1024", 259, 8, 1030, 1, 1, 1.0f, 0.0f, {1, 2}, {1, 1}, 0, 0, 0, 0},
        /* packed in panels of 5 (the last one short), 7 and 13 rows: tiles cross panels */
        {"gemm_tiled_rows", "-D TR=8 -D TC=9 -D KC=16", 21, 23, 53, 1, 1, 1.0f, 1.0f, {3, 3}, {1, 1}, 5, 0, 0, 16},
        {"gemm_tiled_rows", "-D TR=8 -D TC=6 -D KC=32", 9, 14, 64, 1, 1, 0.5f, 0.0f, {3, 2}, {1, 1}, 7, 0, 0, 32},
        {"gemm_tiled_rows", "-D TR=256 -D TC=48 -D KC=512", 258, 16, 530, 1, 1, 1.0f, 0.0f, {1, 2}, {1, 1}, 13, 0, 0, 512},
        /* B decoded once per chunk into local memory (the form for weights of another dtype; here
           f32, so the copy and its indexing are what is tested; test_linear runs the dtypes): a
           last column tile shorter than the micro-tile, chunks with a tail, K = 0, packed panels */
        {"gemm_tiled_rows", "-D TR=8 -D TC=7 -D KC=16 -D TILED_DECODE", 19, 17, 37, 1, 1, 1.0f, 0.5f, {3, 3}, {1, 1}, 0, 0, 0, 0},
        {"gemm_tiled_rows", "-D TR=4 -D TC=3 -D KC=8 -D TILED_DECODE", 3, 4, 0, 1, 1, 1.0f, 2.0f, {2, 1}, {1, 1}, 0, 0, 0, 0},
        {"gemm_tiled_rows", "-D TR=8 -D TC=9 -D KC=16 -D TILED_DECODE", 21, 23, 53, 1, 1, 1.0f, 1.0f, {3, 3}, {1, 1}, 5, 0, 0, 16},
        /* the library's row tile and chunk, tiles of 6 columns (24 KiB of local memory: oclgrind's
           device has 32), the second of 2 */
        {"gemm_tiled_rows", "-D TR=256 -D TC=6 -D KC=1024 -D TILED_DECODE", 259, 8, 1030, 1, 1, 1.0f, 0.0f, {2, 2}, {1, 1}, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_gemm(&cases[i]);
}

/* ---- the library's launches -------------------------------------------------------------------------- */

static void layer_pass(const char *kind)
{
    clmla_layer_config c = tu_small_config(16, 3, 8, 16, 8, 4, 8);
    const int D = c.hidden_size, rkv = c.kv_lora_rank, dr = c.qk_rope_head_dim;
    tu_weights w;
    if (tu_weights_make(&w, &c, 60) != 0)
        return;
    clmla_layer *layer = NULL;
    CHECK_STATUS(clmla_layer_create(ctx, &c, &w.layer, &layer), CLMLA_SUCCESS, ctx);
    enum { TA = 13, TB = 17 };
    float *xa = tu_random_inputs(TA, D, 61), *xb = tu_random_inputs(TB, D, 62);
    tu_ref_run ra, rb;
    int ok = tu_ref_run_make(&ra, &w, TA, xa, MLA_REF_DECOMPRESSED) == 0 && tu_ref_run_make(&rb, &w, TB, xb, MLA_REF_DECOMPRESSED) == 0;
    printf("# layer: launches as on a %s device\n", kind);
    for (int dt = 0; layer && ok && dt < 2; dt++) {
        clmla_cache_config cc = {1, rkv, dr, 4, 12, (clmla_cache_dtype)dt, 0, CLMLA_CACHE_F32};
        clmla_cache *cache = NULL;
        CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
        if (!cache)
            break;
        int32_t a, b;
        clmla_cache_seq_add(cache, &a);
        clmla_cache_seq_add(cache, &b);
        float out[(TA + TB) * 16], x[(TA + TB) * 16];
        /* a: 5 absorbed, 6 decompressed, then a batch of a's 12th token (absorbed) and all 17 of b
           (decompressed under AUTO: threshold 16), then a's last token alone. */
        clmla_batch_entry e1 = {a, 5};
        clmla_forward_args f1 = {&e1, 1, 0, CLMLA_PATH_ABSORBED};
        CHECK_STATUS(clmla_layer_forward(layer, cache, &f1, xa, out), CLMLA_SUCCESS, ctx);
        clmla_batch_entry e2 = {a, 6};
        clmla_forward_args f2 = {&e2, 1, 0, CLMLA_PATH_DECOMPRESSED};
        CHECK_STATUS(clmla_layer_forward(layer, cache, &f2, xa + 5 * D, out + 5 * D), CLMLA_SUCCESS, ctx);
        CHECK_CLOSE(out, ra.out, (size_t)11 * D, D, TOL_FOR_DTYPE(dt), "layer %s: a's 11 tokens", dt ? "f16" : "f32");
        clmla_batch_entry e3[2] = {{a, 1}, {b, TB}};
        memcpy(x, xa + 11 * D, (size_t)D * sizeof(float));
        memcpy(x + D, xb, (size_t)TB * D * sizeof(float));
        clmla_forward_args f3 = {e3, 2, 0, CLMLA_PATH_AUTO};
        CHECK_STATUS(clmla_layer_forward(layer, cache, &f3, x, out), CLMLA_SUCCESS, ctx);
        CHECK_CLOSE(out, ra.out + 11 * D, (size_t)D, D, TOL_FOR_DTYPE(dt), "layer %s: a's token 11 in the batch",
                    dt ? "f16" : "f32");
        CHECK_CLOSE(out + D, rb.out, (size_t)TB * D, D, TOL_FOR_DTYPE(dt), "layer %s: b in the batch", dt ? "f16" : "f32");
        clmla_batch_entry e4 = {a, 1};
        clmla_forward_args f4 = {&e4, 1, 0, CLMLA_PATH_AUTO};
        CHECK_STATUS(clmla_layer_forward(layer, cache, &f4, xa + 12 * D, out), CLMLA_SUCCESS, ctx);
        CHECK_CLOSE(out, ra.out + 12 * D, (size_t)D, D, TOL_FOR_DTYPE(dt), "layer %s: a's decode", dt ? "f16" : "f32");
        float ckv[TB * 16], kr[TB * 4];
        CHECK_STATUS(clmla_cache_read(cache, 0, b, 0, TB, ckv, kr), CLMLA_SUCCESS, ctx);
        CHECK_CLOSE(ckv, rb.ckv, (size_t)TB * rkv, rkv, TOL_FOR_DTYPE(dt), "layer %s: b's cached c^KV", dt ? "f16" : "f32");
        clmla_cache_destroy(cache);
    }
    if (ok) {
        tu_ref_run_free(&ra);
        tu_ref_run_free(&rb);
    }
    clmla_layer_destroy(layer);
    free(xa);
    free(xb);
    tu_weights_free(&w);
}

/* The rest of the layer's launches on the current kind: DSA's layer, then clmla_attention_latent
   split across work-groups. */
static void layer_pass_dsa(void)
{
    /* a layer with DSA's indexer (3 heads of 8, top-k 3), fp8 and f32 index keys: 9 tokens decompressed
       (the key writer, the queries' RoPE, scores, top-k and the sparse attn_prefill kernel), then 2
       decoded absorbed (the sparse latent kernel); against the float64 DSA reference */
    for (int kdt = 0; kdt < 2; kdt++) {
        clmla_layer_config dc = tu_small_config(16, 3, 8, 16, 8, 4, 8);
        dc.index_n_heads = 3, dc.index_head_dim = 8, dc.index_topk = 3;
        enum { TD = 11 };
        tu_weights dw;
        if (tu_weights_make(&dw, &dc, 63) != 0)
            break;
        float wq[24 * 8], wk[8 * 16], kn[8], kb[8], ww[3 * 16];
        tu_rng rng = tu_rng_seed(64);
        fill(wq, 24 * 8, 0.6f, &rng);
        fill(wk, 8 * 16, 0.4f, &rng);
        tu_fill_uniform(kn, 8, 1.0f, 0.2f, &rng);
        fill(kb, 8, 0.2f, &rng);
        fill(ww, 3 * 16, 0.4f, &rng);
        clmla_layer_weights lw = dw.layer;
        lw.indexer_wq_b = clmla_tensor_2d(wq, 24, 8);
        lw.indexer_wk = clmla_tensor_2d(wk, 8, 16);
        lw.indexer_k_norm = clmla_tensor_1d(kn, 8);
        lw.indexer_k_norm_bias = clmla_tensor_1d(kb, 8);
        lw.indexer_weights_proj = clmla_tensor_2d(ww, 3, 16);
        const idx_ref_config ic = {16, 8, 3, 8, 4, 1, 1e-6};
        const idx_ref_weights iw = {wq, wk, kn, kb, ww};
        float *xd = tu_random_inputs(TD, 16, 65), got[TD * 16];
        double want[TD * 16];
        int ambiguous = -1;
        const clmla_cache_dtype keys = kdt ? CLMLA_CACHE_FP8 : CLMLA_CACHE_F32;
        const int ref_ok = xd && idx_ref_dsa_forward(&dw.ref_config, NULL, &dw.ref, &ic, &iw, 3, (mla_ref_cache_type)keys,
                                                     TD, xd, want, NULL, &ambiguous) == 0;
        CHECK(ref_ok && ambiguous == 0, "DSA layer: reference (%d ambiguous selections)", ambiguous);
        clmla_layer *dl = NULL;
        clmla_cache *cache = NULL;
        const clmla_cache_config cc = {1, 16, 4, 4, 4, CLMLA_CACHE_F32, 8, keys};
        CHECK_STATUS(clmla_layer_create(ctx, &dc, &lw, &dl), CLMLA_SUCCESS, ctx);
        CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
        int32_t sq = -1;
        if (ref_ok && dl && cache && clmla_cache_seq_add(cache, &sq) == CLMLA_SUCCESS) {
            clmla_batch_entry e = {sq, 9};
            clmla_forward_args f = {&e, 1, 0, CLMLA_PATH_DECOMPRESSED};
            CHECK_STATUS(clmla_layer_forward(dl, cache, &f, xd, got), CLMLA_SUCCESS, ctx);
            e.num_tokens = 1;
            f.path = CLMLA_PATH_ABSORBED;
            for (int t = 9; t < TD; t++)
                CHECK_STATUS(clmla_layer_forward(dl, cache, &f, xd + t * 16, got + t * 16), CLMLA_SUCCESS, ctx);
            CHECK_CLOSE(got, want, (size_t)TD * 16, 16, TOL_F32_CACHE, "DSA layer, %s keys", kdt ? "fp8" : "f32");
        }
        clmla_cache_destroy(cache);
        clmla_layer_destroy(dl);
        free(xd);
        tu_weights_free(&dw);
    }

    /* clmla_attention_latent over 300 keys: split across work-groups, then attn_combine. */
    enum { N = 300, H = 2, RKV = 8, DR = 2, ROW = RKV + DR, BT = 16 };
    clmla_cache_config cc = {1, RKV, DR, BT, (N + BT - 1) / BT, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    CHECK_STATUS(clmla_cache_create(ctx, &cc, &cache), CLMLA_SUCCESS, ctx);
    if (!cache)
        return;
    int32_t s;
    clmla_cache_seq_add(cache, &s);
    tu_rng rng = tu_rng_seed(63);
    float *rows = malloc((size_t)N * ROW * sizeof(float));
    fill(rows, (size_t)N * ROW, 1.0f, &rng);
    cl_mem rb_ = buffer((size_t)N * ROW * sizeof(float), rows);
    CHECK_STATUS(clmla_cache_append_cl(cache, 0, s, N, rb_, 0, ROW, rb_, RKV, ROW, NULL), CLMLA_SUCCESS, ctx);
    int32_t table[(N + BT - 1) / BT];
    int nb = 0;
    clmla_cache_seq_blocks(cache, s, table, (N + BT - 1) / BT, &nb);
    float ql[H * RKV], qr[H * DR], out[H * RKV], lse[H];
    fill(ql, H * RKV, 1.0f, &rng);
    fill(qr, H * DR, 1.0f, &rng);
    const int zero = 0, len = N;
    cl_mem qlb = buffer(sizeof(ql), ql), qrb = buffer(sizeof(qr), qr), tb = buffer((size_t)nb * sizeof(int32_t), table);
    cl_mem tsb = buffer(sizeof(int), &zero), tcb = buffer(sizeof(int), &len);
    cl_mem ob = buffer(sizeof(out), NULL), lb = buffer(sizeof(lse), NULL);
    clmla_latent_attention_args la = {.num_tokens = 1, .num_heads = H, .softmax_scale = 0.3f, .q_latent = qlb,
                                      .q_rope = qrb, .block_table = tb, .max_blocks_per_seq = nb, .token_seq = tsb,
                                      .token_ctx_len = tcb, .max_ctx_len = N, .out = ob, .lse = lb};
    CHECK_STATUS(clmla_attention_latent(cache, 0, &la, NULL), CLMLA_SUCCESS, ctx);
    download(ob, sizeof(out), out);
    download(lb, sizeof(lse), lse);
    double *cd = malloc((size_t)N * RKV * sizeof(double)), *kd = malloc((size_t)N * DR * sizeof(double));
    for (int t = 0; t < N; t++)
        for (int d = 0; d < ROW; d++) {
            if (d < RKV)
                cd[t * RKV + d] = rows[t * ROW + d];
            else
                kd[t * DR + d - RKV] = rows[t * ROW + d];
        }
    double qld[H * RKV], qrd[H * DR], want[H * RKV], want_lse[H];
    for (int i = 0; i < H * RKV; i++)
        qld[i] = ql[i];
    for (int i = 0; i < H * DR; i++)
        qrd[i] = qr[i];
    mla_ref_latent_attention(H, RKV, DR, 0.3, N, qld, qrd, cd, kd, want, want_lse);
    CHECK_CLOSE(out, want, (size_t)H * RKV, RKV, TOL_F32_CACHE, "clmla_attention_latent over %d keys [head, i]", N);
    CHECK_CLOSE(lse, want_lse, (size_t)H, H, TOL_F32_CACHE, "clmla_attention_latent lse over %d keys", N);

    /* Two new tokens of the sequence (query_len 2: folded into one work-group's heads on GPU-kind
       devices), seeing 299 and 300 keys, split and merged too */
    {
        float ql2[2 * H * RKV], qr2[2 * H * DR], out2[2 * H * RKV], lse2[2 * H];
        fill(ql2, 2 * H * RKV, 1.0f, &rng);
        fill(qr2, 2 * H * DR, 1.0f, &rng);
        const int seqs2[2] = {0, 0}, lens2[2] = {N - 1, N};
        cl_mem ql2b = buffer(sizeof(ql2), ql2), qr2b = buffer(sizeof(qr2), qr2), ts2 = buffer(sizeof(seqs2), seqs2);
        cl_mem tc2 = buffer(sizeof(lens2), lens2), o2 = buffer(sizeof(out2), NULL), l2 = buffer(sizeof(lse2), NULL);
        clmla_latent_attention_args la2 = la;
        la2.num_tokens = 2;
        la2.query_len = 2;
        la2.q_latent = ql2b;
        la2.q_rope = qr2b;
        la2.token_seq = ts2;
        la2.token_ctx_len = tc2;
        la2.out = o2;
        la2.lse = l2;
        CHECK_STATUS(clmla_attention_latent(cache, 0, &la2, NULL), CLMLA_SUCCESS, ctx);
        download(o2, sizeof(out2), out2);
        download(l2, sizeof(lse2), lse2);
        for (int t = 0; t < 2; t++) {
            double q2d[H * RKV], r2d[H * DR], want2[H * RKV], want2_lse[H];
            for (int i = 0; i < H * RKV; i++)
                q2d[i] = ql2[t * H * RKV + i];
            for (int i = 0; i < H * DR; i++)
                r2d[i] = qr2[t * H * DR + i];
            mla_ref_latent_attention(H, RKV, DR, 0.3, lens2[t], q2d, r2d, cd, kd, want2, want2_lse);
            CHECK_CLOSE(out2 + t * H * RKV, want2, (size_t)H * RKV, RKV, TOL_F32_CACHE,
                        "clmla_attention_latent, query_len 2, token %d over %d keys [head, i]", t, lens2[t]);
            CHECK_CLOSE(lse2 + t * H, want2_lse, (size_t)H, H, TOL_F32_CACHE,
                        "clmla_attention_latent, query_len 2, token %d lse", t);
        }
    }

    /* clmla_attention_latent_sparse (-D SPARSE) over a list of 300 entries: every third position in
       reverse, the rest no key (-1, or out of range), split across work-groups too */
    enum { TOPK = 300 };
    int32_t list[TOPK];
    for (int i = 0; i < TOPK; i++)
        list[i] = i % 3 == 0 ? N - 1 - i : i % 3 == 1 ? -1 : N + i;
    cl_mem ib = buffer(sizeof(list), list);
    CHECK_STATUS(clmla_attention_latent_sparse(cache, 0, &la, ib, 0, TOPK, NULL), CLMLA_SUCCESS, ctx);
    download(ob, sizeof(out), out);
    download(lb, sizeof(lse), lse);
    mla_ref_sparse_latent_attention(H, RKV, DR, 0.3, N, list, TOPK, qld, qrd, cd, kd, want, want_lse);
    CHECK_CLOSE(out, want, (size_t)H * RKV, RKV, TOL_F32_CACHE, "clmla_attention_latent_sparse, %d entries [head, i]", TOPK);
    CHECK_CLOSE(lse, want_lse, (size_t)H, H, TOL_F32_CACHE, "clmla_attention_latent_sparse lse, %d entries", TOPK);
    free(cd);
    free(kd);
    free(rows);
    clmla_cache_destroy(cache);
}

/* The layer's launches as on a device of that kind (the context's kind set for the pass): the
   dense layer (dense 1), DSA's layer and the split attention (dsa 1). The library picks kernels by
   device type (CPU: the _rows forms and gemm_skinny_*_rows; else the work-group forms,
   gemm_skinny_nt/nn and CLBlast), so both choices run, whatever the device. */
static void layer_as(clmla_device_kind kind, int dense, int dsa)
{
    const clmla_device_kind real = ctx->info.kind;
    ctx->info.kind = kind;
    if (dense)
        layer_pass(kind == CLMLA_DEVICE_KIND_CPU ? "CPU" : "GPU");
    if (dsa)
        layer_pass_dsa();
    ctx->info.kind = real;
}

/* Both kinds, the device's own first: everything (layer), or the dense layers or the rest alone
   (layer-dense, layer-dsa: ci/oclgrind.sh runs them as two processes). */
static void layers(int dense, int dsa)
{
    const clmla_device_kind real = ctx->info.kind;
    layer_as(real, dense, dsa);
    layer_as(real == CLMLA_DEVICE_KIND_CPU ? CLMLA_DEVICE_KIND_GPU : CLMLA_DEVICE_KIND_CPU, dense, dsa);
}

static void test_layer(void)
{
    layers(1, 1);
}

static void test_layer_dense(void)
{
    layers(1, 0);
}

static void test_layer_dsa(void)
{
    layers(0, 1);
}

/* ---- indexer_key_write / indexer_q_rope (cl/indexer.cl) ----------------------------------------------- */

/* indexer_key_write's arguments: source rows from src_off, src_ld apart, the norm's weight and
   bias, eps 1e-6, table rows, the RoPE table, slots and the key cache. */
static void key_writer_args(cl_kernel kw, cl_mem src, int src_off, int src_ld, cl_mem norm_w, cl_mem norm_b,
                            cl_mem positions, cl_mem table, cl_mem slots, cl_mem keys)
{
    const float eps = 1e-6f;
    ARGS(kw, 0, KARG(src), KARG(src_off), KARG(src_ld), KARG(norm_w), KARG(norm_b), KARG(eps), KARG(positions),
         KARG(table), KARG(slots), KARG(keys));
}

/* d_I 10 (rope 6 first), work-groups of 4 items (the strided loops wrap), 3 tokens at table rows 2, 0,
   5 into slots 7, 1, 4 of a key cache of 9; both pairings, f32 and bf16 keys. Against the float64
   LayerNorm and idx_ref_rope on the same float2 table. Then the queries of 2 tokens x 3 heads rotated
   in place from an offset, the rest of each head untouched. */
static void test_indexer_writer(void)
{
    enum { DI = 10, DR = 6, T = 3, SLOTS = 9, ROWS = 6, SRC_OFF = 3, SRC_LD = 13, HI = 3, QT = 2, QOFF = 5 };
    for (int v = 0; v < 6; v++) {
        /* keys: 0 f32, 1 bf16, 2 f16 */
        const int half = v & 1, kdt = v >> 1, bf16 = kdt == 1, f16 = kdt == 2;
        char options[160];
        snprintf(options, sizeof(options), "-D HI=%d -D DI=%d -D BT=3 -D DR=%d -D WGK=4%s%s", HI, DI, DR,
                 half ? " -D IDX_HALF_SPLIT" : "", bf16 ? " -D KEY_BF16" : f16 ? " -D KEY_F16" : "");
        cl_kernel kw = kernel("indexer", options, "indexer_key_write");
        cl_kernel kq = kernel("indexer", options, "indexer_q_rope");
        tu_rng rng = tu_rng_seed(71 + (uint64_t)v);
        float src[SRC_OFF + T * SRC_LD], nw[DI], nb[DI], table[ROWS * DR], q[QOFF + QT * HI * DI];
        fill(src, sizeof(src) / sizeof(float), 2.0f, &rng);
        fill(nw, DI, 1.0f, &rng);
        fill(nb, DI, 0.5f, &rng);
        fill(q, sizeof(q) / sizeof(float), 1.0f, &rng);
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < DR / 2; i++) { /* unit-free (A cos, A sin) of some angle */
                const double a = 0.37 * (r + 1) * (i + 1);
                table[r * DR + 2 * i] = (float)(0.9 * cos(a));
                table[r * DR + 2 * i + 1] = (float)(0.9 * sin(a));
            }
        const int pos[T] = {2, 0, 5}, slot[T] = {7, 1, 4}, qpos[QT] = {4, 1};
        cl_mem sb = buffer(sizeof(src), src), wb = buffer(sizeof(nw), nw), bb = buffer(sizeof(nb), nb);
        cl_mem tb = buffer(sizeof(table), table), pb = buffer(sizeof(pos), pos), lb = buffer(sizeof(slot), slot);
        cl_mem kb = buffer((size_t)SLOTS * DI * (kdt ? 2 : 4), NULL);
        key_writer_args(kw, sb, SRC_OFF, SRC_LD, wb, bb, pb, tb, lb, kb);
        const size_t global[1] = {4 * T}, local[1] = {4};
        if (launch(kw, 1, global, local)) {
            unsigned char raw[SLOTS * DI * 4];
            download(kb, (size_t)SLOTS * DI * (kdt ? 2 : 4), raw);
            double worst = 0;
            for (int t = 0; t < T; t++) {
                double k[DI], mean = 0, var = 0, c[DR / 2], sn[DR / 2];
                for (int d = 0; d < DI; d++)
                    mean += src[SRC_OFF + t * SRC_LD + d] / (double)DI;
                for (int d = 0; d < DI; d++)
                    var += pow(src[SRC_OFF + t * SRC_LD + d] - mean, 2) / DI;
                for (int d = 0; d < DI; d++)
                    k[d] = (src[SRC_OFF + t * SRC_LD + d] - mean) / sqrt(var + 1e-6) * nw[d] + nb[d];
                for (int i = 0; i < DR / 2; i++)
                    c[i] = table[pos[t] * DR + 2 * i], sn[i] = table[pos[t] * DR + 2 * i + 1];
                idx_ref_rope(k, DR, !half, c, sn);
                for (int d = 0; d < DI; d++) {
                    float got;
                    if (kdt) {
                        uint16_t h;
                        memcpy(&h, raw + 2 * ((size_t)slot[t] * DI + d), 2);
                        got = (float)(bf16 ? mla_ref_decode_bf16(h) : mla_ref_decode_f16(h));
                    } else {
                        memcpy(&got, raw + 4 * ((size_t)slot[t] * DI + d), 4);
                    }
                    /* bf16, f16: the float result rounded, so within one step of the exact value */
                    const double err = fabs(got - k[d]) / (fabs(k[d]) + 1e-3);
                    worst = err > worst ? err : worst;
                }
            }
            CHECK(worst <= (bf16 ? 1.0 / 128 : f16 ? 1.0 / 1024 : 1e-5), "indexer_key_write %s %s: relative error %.3g",
                  half ? "half-split" : "interleaved", bf16 ? "bf16" : f16 ? "f16" : "f32", worst);
        }
        cl_mem qb = buffer(sizeof(q), q), qp = buffer(sizeof(qpos), qpos);
        const int q_off = QOFF;
        ARGS(kq, 0, KARG(qb), KARG(q_off), KARG(qp), KARG(tb));
        const size_t qg[3] = {DR / 2, HI, QT};
        if (launch(kq, 3, qg, NULL)) {
            float got[QOFF + QT * HI * DI];
            download(qb, sizeof(got), got);
            double worst = 0;
            for (int i = 0; i < QOFF; i++)
                worst = got[i] != q[i] ? 1 : worst;
            for (int t = 0; t < QT; t++)
                for (int h = 0; h < HI; h++) {
                    double x[DI], c[DR / 2], sn[DR / 2];
                    const int base = QOFF + (t * HI + h) * DI;
                    for (int d = 0; d < DI; d++)
                        x[d] = q[base + d];
                    for (int i = 0; i < DR / 2; i++)
                        c[i] = table[qpos[t] * DR + 2 * i], sn[i] = table[qpos[t] * DR + 2 * i + 1];
                    idx_ref_rope(x, DR, !half, c, sn);
                    for (int d = 0; d < DI; d++) {
                        const double err = fabs(got[base + d] - x[d]);
                        worst = err > worst ? err : worst;
                    }
                }
            CHECK(worst <= 1e-6, "indexer_q_rope %s: error %.3g", half ? "half-split" : "interleaved", worst);
        }
    }
}

/* indexer_key_write with fp8 keys (DeepSeek's): d_I 16 (rope 6), blocks of 3 tokens, 3 tokens into
   slots 7, 1, 4 of 9; each key's codes at its row of its block, its scale after the block's codes,
   decoded against the float64 LayerNorm, RoPE, Hadamard rotation and act_quant quantisation. */
static void test_indexer_writer_fp8(void)
{
    enum { DI = 16, DR = 6, T = 3, BT = 3, SLOTS = 9, ROWS = 6 };
    for (int half = 0; half < 2; half++) {
        char options[192];
        snprintf(options, sizeof(options), "-D HI=2 -D DI=%d -D BT=%d -D DR=%d -D WGK=4 -D KEY_FP8%s%s", DI, BT, DR,
                 half ? " -D IDX_HALF_SPLIT" : "", clmla_fp8_option(ctx));
        cl_kernel kw = kernel("indexer", options, "indexer_key_write");
        tu_rng rng = tu_rng_seed(81 + (uint64_t)half);
        float src[T * DI], nw[DI], nb[DI], table[ROWS * DR];
        fill(src, sizeof(src) / sizeof(float), 2.0f, &rng);
        fill(nw, DI, 1.0f, &rng);
        fill(nb, DI, 0.5f, &rng);
        src[5] = 40.0f; /* one large value: its key's scale differs from the others' */
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < DR / 2; i++) {
                table[r * DR + 2 * i] = (float)cos(0.31 * (r + 1) * (i + 1));
                table[r * DR + 2 * i + 1] = (float)sin(0.31 * (r + 1) * (i + 1));
            }
        const int pos[T] = {2, 0, 5}, slot[T] = {7, 1, 4};
        cl_mem sb = buffer(sizeof(src), src), wb = buffer(sizeof(nw), nw), bb = buffer(sizeof(nb), nb);
        cl_mem tb = buffer(sizeof(table), table), pb = buffer(sizeof(pos), pos), lb = buffer(sizeof(slot), slot);
        cl_mem kb = buffer((size_t)SLOTS * (DI + 4), NULL);
        key_writer_args(kw, sb, 0, DI, wb, bb, pb, tb, lb, kb);
        const size_t global[1] = {4 * T}, local[1] = {4};
        if (!launch(kw, 1, global, local))
            continue;
        unsigned char raw[SLOTS * (DI + 4)];
        download(kb, sizeof(raw), raw);
        for (int t = 0; t < T; t++) {
            double k[DI], mean = 0, var = 0, c[DR / 2], sn[DR / 2];
            for (int d = 0; d < DI; d++)
                mean += src[t * DI + d] / (double)DI;
            for (int d = 0; d < DI; d++)
                var += pow(src[t * DI + d] - mean, 2) / DI;
            for (int d = 0; d < DI; d++)
                k[d] = (src[t * DI + d] - mean) / sqrt(var + 1e-6) * nw[d] + nb[d];
            for (int i = 0; i < DR / 2; i++)
                c[i] = table[pos[t] * DR + 2 * i], sn[i] = table[pos[t] * DR + 2 * i + 1];
            idx_ref_rope(k, DR, !half, c, sn);
            idx_ref_hadamard(k, DI);
            const double want_scale = idx_ref_quantize_fp8(k, DI);
            const int blk = slot[t] / BT, off = slot[t] % BT;
            float scale;
            memcpy(&scale, raw + (size_t)blk * BT * (DI + 4) + (size_t)BT * DI + 4 * off, 4);
            CHECK(scale == want_scale, "indexer_key_write fp8 token %d: scale %g, want %g", t, scale, want_scale);
            int bad = 0;
            for (int d = 0; d < DI; d++) {
                const double got = mla_ref_decode_e4m3(raw[(size_t)blk * BT * (DI + 4) + (size_t)off * DI + d]) * scale;
                bad += got != k[d];
            }
            CHECK(bad == 0, "indexer_key_write fp8 %s token %d: %d codes differ from the float64 quantisation",
                  half ? "half-split" : "interleaved", t, bad);
        }
    }
}

/* ---- coverage ---------------------------------------------------------------------------------------- */

/* The kernels this file launches directly. */
static const char *const tested[] = {"convert_to_f32", "convert_to_bf16", "convert_to_e4m3", "rmsnorm",        "rope",           "add_bias",       "cache_write",         "cache_gather",
                                     "attn_latent",    "attn_latent_rows", "attn_latent_lanes", "attn_latent_mma", "attn_combine",       "attn_combine_rows", "attn_prefill",
                                     "attn_prefill_rows", "attn_prefill_tiled", "gemm_skinny_nt", "gemm_skinny_nn", "gemm_skinny_nn_split", "gemm_skinny_nt_rows",
                                     "gemm_skinny_nn_rows", "gemm_skinny_nn_wide", "gemm_packed_rows", "gemm_tiled_rows", "gemm_weight_f32",
                                     "indexer_scores", "indexer_topk", "indexer_key_write", "indexer_q_rope", "cache_write_slots",
                                     "paged_tokens"};

static int ident_char(char c)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Appends the `__kernel` function names of one source file to names[]: after each "__kernel"
   (attributes may follow), the identifier after the word "void". */
static void kernels_in(const char *path, char names[][64], char files[][64], int *n, const char *file)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot read %s", path);
    if (!f)
        return;
    static char text[1 << 20];
    const size_t len = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[len] = '\0';
    for (char *p = strstr(text, "__kernel"); p; p = strstr(p + 8, "__kernel")) {
        if (p > text && ident_char(p[-1]))
            continue;
        char *v = p;
        while ((v = strstr(v + 1, "void")) != NULL && (ident_char(v[-1]) || ident_char(v[4])))
            ;
        if (!v)
            break;
        char *name = v + 4;
        while (*name == ' ' || *name == '\t' || *name == '\n' || *name == '\r')
            name++;
        int k = 0;
        while (ident_char(name[k]) && k < 63)
            k++;
        if (k > 0 && *n < MAX_NAMES) {
            snprintf(names[*n], 64, "%.*s", k, name);
            snprintf(files[*n], 64, "%s", file);
            (*n)++;
        }
    }
}

static void check_coverage(int kernels_ran)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/cl", CLMLA_SOURCE_DIR);
    DIR *d = opendir(dir);
    CHECK(d != NULL, "cannot list %s", dir);
    if (!d)
        return;
    char names[MAX_NAMES][64], files[MAX_NAMES][64];
    int n = 0, num_files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".cl") != 0)
            continue;
        char path[8192];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        const int before = n;
        kernels_in(path, names, files, &n, e->d_name);
        /* prelude.cl holds the definitions compiled in front of every file, no kernel */
        CHECK(n > before || strcmp(e->d_name, "prelude.cl") == 0, "cl/%s defines no __kernel this test can find",
              e->d_name);
        num_files++;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        int known = 0, ran = 0;
        for (size_t t = 0; t < sizeof(tested) / sizeof(tested[0]); t++)
            known |= strcmp(names[i], tested[t]) == 0;
        for (int l = 0; l < num_launched; l++)
            ran |= strcmp(names[i], launched[l]) == 0;
        CHECK(known, "kernel %s (cl/%s) has no test in tests/test_kernels.c: add one, ci/oclgrind.sh runs them all",
              names[i], files[i]);
        if (kernels_ran)
            CHECK(ran, "kernel %s (cl/%s) was not launched", names[i], files[i]);
    }
    printf("# coverage: %d kernels in %d files of cl/, %d launched directly\n", n, num_files, num_launched);
}

/* ---- indexer_scores / indexer_topk (cl/indexer.cl) ------------------------------------------------------ */

/* 3 heads (an odd one paired with itself), d 12 (a float8 step and a tail of 4), blocks of 5 tokens
   through a permuted table, 3 tokens with contexts 7, 0 and 11 of max 13, items of 8 keys in groups
   of 2, f32 and bf16 keys; against float64 sums of the same values. */
static void test_indexer_scores(void)
{
    enum { HI = 3, DI = 12, BT = 5, T = 3, NB = 4, MB = 3, MAXC = 13, STRIDE = 15, SOFF = 2, QOFF = 1, WOFF = 3 };
    for (int bf16 = 0; bf16 < 2; bf16++) {
        char options[96];
        snprintf(options, sizeof(options), "-D HI=%d -D DI=%d -D BT=%d%s", HI, DI, BT, bf16 ? " -D KEY_BF16" : "");
        cl_kernel k = kernel("indexer", options, "indexer_scores");
        tu_rng rng = tu_rng_seed(61 + bf16);
        float q[QOFF + T * HI * DI], w[WOFF + T * HI], keys[NB * BT * DI];
        uint16_t kbits[NB * BT * DI];
        fill(q, sizeof(q) / sizeof(float), 1.0f, &rng);
        fill(w, sizeof(w) / sizeof(float), 1.0f, &rng);
        fill(keys, sizeof(keys) / sizeof(float), 1.0f, &rng);
        for (int i = 0; i < NB * BT * DI; i++) {
            if (bf16) {
                keys[i] = (float)mla_ref_round_bf16(keys[i]);
                kbits[i] = (uint16_t)mla_ref_encode_bf16(keys[i]);
            }
        }
        const int32_t table[2 * MB] = {2, 0, 3, 1, 3, 2}, seq[T] = {0, 1, 0}, len[T] = {7, 0, 11};
        float got[SOFF + T * STRIDE + 1], want[SOFF + T * STRIDE + 1];
        for (int i = 0; i < SOFF + T * STRIDE + 1; i++)
            got[i] = want[i] = 4242.0f;
        for (int t = 0; t < T; t++)
            for (int s = 0; s < MAXC; s++) {
                if (s >= len[t]) {
                    want[SOFF + t * STRIDE + s] = -INFINITY;
                    continue;
                }
                const float *kr = keys + ((size_t)table[seq[t] * MB + s / BT] * BT + s % BT) * DI;
                double sum = 0.0;
                for (int h = 0; h < HI; h++) {
                    double l = 0.0;
                    for (int d = 0; d < DI; d++)
                        l += (double)q[QOFF + (t * HI + h) * DI + d] * kr[d];
                    sum += (double)w[WOFF + t * HI + h] * (l > 0.0 ? l : 0.0);
                }
                want[SOFF + t * STRIDE + s] = (float)sum;
            }
        cl_mem qb = buffer(sizeof(q), q), wb = buffer(sizeof(w), w);
        cl_mem kb = bf16 ? buffer(sizeof(kbits), kbits) : buffer(sizeof(keys), keys);
        cl_mem tb = buffer(sizeof(table), table), sb = buffer(sizeof(seq), seq), lb = buffer(sizeof(len), len);
        cl_mem ob = buffer(sizeof(got), got);
        const int q_off = QOFF, w_off = WOFF, nb = NB, rows = 2, mb = MB, tokens = T, maxc = MAXC, chunk = 8;
        const int s_off = SOFF, stride = STRIDE;
        ARGS(k, 0, KARG(qb), KARG(q_off), KARG(wb), KARG(w_off), KARG(kb), KARG(nb), KARG(tb), KARG(rows), KARG(mb),
             KARG(sb), KARG(lb), KARG(tokens), KARG(maxc), KARG(chunk), KARG(ob), KARG(s_off), KARG(stride));
        const int tok_off = 0;
        ARG(k, 17, tok_off);
        /* 2 items of 8 keys cover 13; a group of 2 adds items past max_ctx, a column past T */
        const size_t global[2] = {4, 4}, local[2] = {2, 2};
        if (launch(k, 2, global, local)) {
            download(ob, sizeof(got), got);
            int bad = 0;
            for (int i = 0; i < SOFF + T * STRIDE + 1; i++) {
                const int ok = isinf(want[i]) ? got[i] == want[i] : fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i]));
                if (!ok && bad++ < 3)
                    CHECK(0, "indexer_scores %s: value %d is %.8g, want %.8g", bf16 ? "bf16" : "f32", i, got[i], want[i]);
            }
            CHECK(bad == 0, "indexer_scores %s: %d values differ", bf16 ? "bf16" : "f32", bad);
        }
    }
}

/* Rows of 20 scores with ties, +-0 and -inf; contexts 20, 3 (fewer than K: all, then -1) and 17;
   K 4; work-groups of 1 and 3 items; against the reference's selection (ascending positions). */
static void test_indexer_topk(void)
{
    enum { T = 3, L = 20, K = 4, OOFF = 1 };
    cl_kernel k = kernel("indexer", "-D HI=1 -D DI=8 -D BT=4", "indexer_topk");
    const float row0[L] = {1, 3, 3, 0, 3, -1, 2, 3, 0, 0, -INFINITY, 5, 1, 1, 2, 2, 0, 3, 3, 4};
    const float row2[L] = {0, -0.0f, 0, -0.0f, -1, -2, 0, -0.0f, 0, 0, 0, -3, -0.0f, 0, 0, 0, 0, -5, 7, 8};
    float sc[T * L];
    for (int i = 0; i < L; i++) {
        sc[i] = row0[i];
        sc[L + i] = (float)(i % 3);
        sc[2 * L + i] = row2[i];
    }
    const int32_t len[T] = {20, 3, 17};
    for (int items = 1; items <= 3; items += 2) {
        int32_t got[OOFF + T * K + 1], want[T * K];
        for (int i = 0; i < OOFF + T * K + 1; i++)
            got[i] = 777;
        cl_mem sb = buffer(sizeof(sc), sc), lb = buffer(sizeof(len), len), ob = buffer(sizeof(got), got);
        const int s_off = 0, stride = L, tokens = T, maxc = L, topk = K, o_off = OOFF;
        ARGS(k, 0, KARG(sb), KARG(s_off), KARG(stride), KARG(lb), KARG(tokens), KARG(maxc), KARG(topk), KARG(ob),
             KARG(o_off));
        cl_int e = clSetKernelArg(k, 9, 2 * (size_t)items * sizeof(cl_uint), NULL);
        CHECK(e == CL_SUCCESS, "indexer_topk local argument: %d", e);
        const int tok_off = 0;
        ARG(k, 10, tok_off);
        const size_t global[1] = {(size_t)T * items}, local[1] = {(size_t)items};
        if (!launch(k, 1, global, local))
            continue;
        download(ob, sizeof(got), got);
        for (int t = 0; t < T; t++) {
            double d[L];
            for (int s = 0; s < len[t]; s++)
                d[s] = sc[t * L + s];
            const int n = idx_ref_topk(d, len[t], K, want + t * K);
            for (int i = 1; i < n; i++) /* ascending positions, as the kernel writes them */
                for (int j = i; j > 0 && want[t * K + j - 1] > want[t * K + j]; j--) {
                    const int32_t x = want[t * K + j];
                    want[t * K + j] = want[t * K + j - 1];
                    want[t * K + j - 1] = x;
                }
        }
        int bad = 0;
        for (int i = 0; i < T * K; i++)
            bad += got[OOFF + i] != want[i];
        CHECK(bad == 0 && got[0] == 777 && got[OOFF + T * K] == 777,
              "indexer_topk (%d items): rows (%d %d %d %d | %d %d %d %d | %d %d %d %d), want (%d %d %d %d | %d %d %d %d | "
              "%d %d %d %d), the guards %d %d",
              items, got[1], got[2], got[3], got[4], got[5], got[6], got[7], got[8], got[9], got[10], got[11], got[12],
              want[0], want[1], want[2], want[3], want[4], want[5], want[6], want[7], want[8], want[9], want[10],
              want[11], got[0], got[OOFF + T * K]);
    }
}

/* ---- main -------------------------------------------------------------------------------------------- */

/* The kernels in four groups, each its own ctest entry (test_kernels_latent and so on), so that a
   device whose compiler takes seconds a program (an H100: all of them ran past 5 minutes) builds
   them on several cores at once; the part "kernels" runs the four. */
static void kernels_latent(void)
{
    test_attn_latent();
    test_attn_latent_mma();
    test_attn_latent_rows();
    test_attn_latent_lanes();
    test_attn_combine();
}

static void kernels_prefill(void)
{
    test_attn_prefill();
    test_attn_prefill_rows();
    test_attn_prefill_tiled();
}

static void kernels_gemm(void)
{
    test_gemm_skinny();
    test_gemm_weight_f32();
    test_gemm_packed_wide();
    test_gemm_tiled();
}

static void kernels_other(void)
{
    test_rmsnorm();
    test_rope();
    test_convert();
    test_add_bias();
    test_cache_write();
    test_cache_write_slots();
    test_paged_tokens();
    test_cache_gather();
    test_cache_fp8();
    test_indexer_scores();
    test_indexer_topk();
    test_indexer_writer();
    test_indexer_writer_fp8();
}

static void test_kernels(void)
{
    kernels_other();
    kernels_latent();
    kernels_prefill();
    kernels_gemm();
}

static const struct {
    const char *name;
    void (*run)(void);
} parts[] = {{"kernels", test_kernels},      {"layer", test_layer},         {"latent", kernels_latent},
             {"prefill", kernels_prefill},    {"gemm", kernels_gemm},        {"other", kernels_other},
             {"layer-dense", test_layer_dense}, {"layer-dsa", test_layer_dsa}};
enum { NUM_PARTS = sizeof(parts) / sizeof(parts[0]) };

int main(int argc, char **argv)
{
    int selected[NUM_PARTS] = {0}, any = 0;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--keep-buffers") == 0) {
            keep_buffers = 1;
            continue;
        }
        if (strcmp(argv[a], "--skip") == 0 && a + 1 < argc && num_skips < MAX_SKIPS) {
            skips[num_skips++] = argv[++a];
            continue;
        }
        if (strcmp(argv[a], "--only") == 0 && a + 1 < argc && num_onlys < MAX_ONLY) {
            onlys[num_onlys++] = argv[++a];
            continue;
        }
        int known = 0;
        for (int p = 0; p < NUM_PARTS; p++)
            if (strcmp(argv[a], parts[p].name) == 0)
                known = selected[p] = any = 1;
        if (!known) {
            printf("usage: test_kernels [--keep-buffers] [--skip TEXT]... [--only TEXT]... [kernels | latent prefill gemm other] [layer | layer-dense layer-dsa]\n");
            return 2;
        }
    }
    if (tu_context_or_skip(&ctx) != 0)
        return 77;
    clmla_device_info info;
    clmla_context_device(ctx, &info);
    printf("# device: %s (%s)\n", info.name, info.platform_name);
    for (int p = 0; p < NUM_PARTS; p++) {
        if (any ? !selected[p] : p >= 2) /* no argument: kernels and layer (the groups are kernels again) */
            continue;
        double t0 = tu_seconds();
        int failed = check_failed;
        parts[p].run();
        printf("# part %-8s %6.1f s, %d failed\n", parts[p].name, tu_seconds() - t0, check_failed - failed);
    }
    check_coverage(!any || selected[0]);
    /* Nothing is allocated after this point: releasing is safe under oclgrind too. */
    keep_buffers = 0;
    for (int i = 0; i < num_kernels; i++)
        clReleaseKernel(kernels[i]);
    for (int i = 0; i < num_buffers; i++)
        clReleaseMemObject(buffers[i]);
    clmla_context_destroy(ctx);
    return check_summary();
}
