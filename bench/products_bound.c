/* clmla-products-bound: what plain C on the host's own cores makes of a decode-shaped product
 * y = x W^T (M rows, W [N, K] float32, or with --dtype fp8 E4M3 codes under 128 x 128 block scales
 * as DeepSeek stores them), without OpenCL, as a yardstick for the "products" phase of clmla-bench
 * on CPU devices.
 *
 * It times, interleaved round by round so that a shared machine's drift hits every case alike:
 *   read      a pure read of W by T threads (the streaming speed of these cores)
 *   read+fma  the same read with M fused multiply-adds per vector of 8 weights (fp8: decoded first)
 *             into 8 register accumulators, by constants held in registers, and the prefetch of +pf: the
 *             product's arithmetic and streaming without its loads of x. Where it stays near the
 *             read, the cores can overlap the two, and what a product loses is x's traffic
 *   walk      the product with W walked in memory order: each thread takes whole rows of W, full K,
 *             all M rows of x at once (x's rows come from L2)
 *   pairs     two rows of W at a time, M rows of x in blocks of 4 (4 x 2 accumulators), W's pair
 *             re-read from L1/L2 for the next block of x
 *   +pf       the same with a software prefetch of W a fixed distance ahead
 *   streams   the kernels' walk (gemm_packed_rows): each thread's rows cut into 8 / M segments
 *             (one for M > 4), a row of each at once, so that the prefetchers see that many
 *             sequential streams; fp8 sums each 128-column block unscaled and scales it once
 * fp8 codes are decoded as the CPU kernels decode them (cl/prelude.cl, CLMLA_FP8_HALF): the code
 * sign-extended to 16 bits, shifted up 7 and masked, is the half 2^-8 times its value, converted 8
 * at a time by F16C (a table where the compiler has no F16C); W's bytes are then the codes, so
 * "GB/s of W" and "of read" count the bytes as stored.
 * each with the caches flushed before every call (a host read of --flush MiB, 128 by default) and,
 * with --warm, also without a flush (W then comes from L3 where it fits). Every timed call starts
 * and joins its threads (tens of microseconds), the read included, so the ratios carry it alike.
 * x's rows are padded to K + 16 floats so that the M lines of one step do not share an L1 set.
 *
 * If the flushed time of a product is close to read + warm, that loop did not overlap streaming
 * with arithmetic; read+fma says how far the cores can overlap them at all.
 * --check compares every product with a float64 host computation and fails on a mismatch.
 *
 * The arithmetic uses GNU C vector extensions (8 floats); build with -O3 -march=native
 * -ffp-contract=fast or the like, so that they become the machine's FMA instructions (in ISO C
 * mode GCC does not contract a * b + c without the last flag). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__F16C__) && defined(__SSE4_1__)
#include <immintrin.h>
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef unsigned u8v __attribute__((vector_size(32)));

enum { READ, READ_FMA, WALK, PAIRS, PAIRS_PF, STREAMS, CASES };
static const char *const case_names[CASES] = {"read", "read+fma", "walk", "pairs", "pairs+pf", "streams"};

typedef struct job {
    int kind, m, n, k, ldx, prefetch_lines, threads, index;
    const float *w, *x;
    const unsigned char *codes; /* fp8: W's codes instead of w */
    const float *scales;        /* fp8: [ceil(n / 128)][k / 128], each times 2^8 (decode8's unit) */
    float *y;
    unsigned sum; /* the read case's result, kept so that the loads are not removed */
} job;

/* ---- fp8 E4M3 ---- */
#define BLOCK 128 /* the columns and rows one scale covers */

/* The value of code c (no NaN codes are made): S.EEEE.MMM, subnormal below E 1. */
static double e4m3_value(unsigned c)
{
    const int e = (int)(c >> 3 & 15u), mant = (int)(c & 7u);
    const double v = e ? ldexp(1.0 + mant / 8.0, e - 7) : ldexp(mant / 8.0, -6);
    return c & 0x80u ? -v : v;
}

#if defined(__F16C__) && defined(__SSE4_1__)
/* 8 codes as 2^-8 times their values, as the CPU kernels decode them */
static inline v8 decode8(const unsigned char *p)
{
    __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)p));
    h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16((short)0xBF80));
    const __m256 f = _mm256_cvtph_ps(h);
    v8 v;
    memcpy(&v, &f, sizeof(v));
    return v;
}
static void decode_init(void)
{
}
#else
static float decode_table[256];
static inline v8 decode8(const unsigned char *p)
{
    v8 v;
    for (int j = 0; j < 8; j++)
        v[j] = decode_table[p[j]];
    return v;
}
static void decode_init(void)
{
    for (unsigned c = 0; c < 256; c++)
        decode_table[c] = (float)ldexp(e4m3_value(c), -8);
}
#endif

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static v8 load8(const float *p)
{
    v8 v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static float hsum(v8 v)
{
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/* The rows [n0, n1) of W that thread jb->index of jb->threads takes, in whole pairs. */
static void share(const job *jb, int *n0, int *n1)
{
    const int pairs = (jb->n + 1) / 2;
    *n0 = 2 * (int)((long)pairs * jb->index / jb->threads);
    *n1 = 2 * (int)((long)pairs * (jb->index + 1) / jb->threads);
    if (*n1 > jb->n)
        *n1 = jb->n;
}

/* The first byte of W's row n, and in *row the bytes of a row: 4 k in f32, k in fp8 */
static const unsigned char *row_bytes(const job *jb, int n, size_t *row)
{
    *row = jb->codes ? (size_t)jb->k : (size_t)jb->k * sizeof(float);
    return jb->codes ? jb->codes + (size_t)n * *row : (const unsigned char *)(jb->w + (size_t)n * jb->k);
}

static void run_read(job *jb, int n0, int n1)
{
    u8v s0 = {0}, s1 = {0}, v;
    size_t row;
    const unsigned char *p = row_bytes(jb, n0, &row), *end = p + (size_t)(n1 - n0) * row;
    for (; p + 64 <= end; p += 64) {
        memcpy(&v, p, sizeof(v));
        s0 ^= v;
        memcpy(&v, p + 32, sizeof(v));
        s1 ^= v;
    }
    s0 ^= s1;
    jb->sum = s0[0] ^ s0[3] ^ s0[7];
}

/* 8 weights of W from element i of row n, f32 or fp8 (unscaled: 2^-8 times the code's value) */
static inline __attribute__((always_inline)) v8 wload8(const job *jb, int n, int i, const int fp8)
{
    return fp8 ? decode8(jb->codes + (size_t)n * jb->k + i) : load8(jb->w + (size_t)n * jb->k + i);
}

/* the scale of W's element (n, i) for wload8's unit: 1 in f32 */
static inline __attribute__((always_inline)) float wscale(const job *jb, int n, int i, const int fp8)
{
    return fp8 ? jb->scales[(size_t)(n / BLOCK) * (size_t)(jb->k / BLOCK) + (size_t)(i / BLOCK)] : 1.0f;
}

/* The read with jb->m FMAs per vector of W (fp8: the codes decoded first) into 8 accumulators, and
   W prefetched as in run_pairs; the multipliers are the first 8 values of x's rows,
   loaded once, so that nothing is constant-folded. */
static inline __attribute__((always_inline)) void read_fma(job *jb, int n0, int n1, const int fp8)
{
    const int m = jb->m;
    v8 c[8], acc[8] = {{0}};
    for (int r = 0; r < 8; r++)
        c[r] = load8(jb->x + (size_t)(r < m ? r : 0) * jb->ldx);
    size_t row;
    const unsigned char *p = row_bytes(jb, n0, &row), *end = p + (size_t)(n1 - n0) * row;
    const size_t ahead = (size_t)jb->prefetch_lines * 64;
    for (; p + 64 <= end; p += 64) { /* a line: 16 floats or 64 codes */
        if (ahead)
            __builtin_prefetch(p + ahead, 0, 2);
#pragma GCC unroll 8
        for (int h = 0; h < 8; h++) {
            if (!fp8 && h >= 2)
                break;
            const v8 wv = fp8 ? decode8(p + 8 * h) : load8((const float *)(const void *)p + 8 * h);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                if (r < m)
                    acc[(r + h) & 7] += wv * c[r]; /* spread, so that one row is not one FMA chain */
        }
    }
    jb->sum = (unsigned)hsum(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
}

/* One row of W against up to 8 rows of x, all of K (K a multiple of 8). */
static inline __attribute__((always_inline)) void walk(job *jb, int n0, int n1, const int fp8)
{
    const int m = jb->m, k = jb->k, ldx = jb->ldx;
    for (int n = n0; n < n1; n++) {
        v8 acc[8] = {{0}};
        for (int i = 0; i < k; i += 8) {
            const v8 wv = wload8(jb, n, i, fp8) * wscale(jb, n, i, fp8);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                if (r < m)
                    acc[r] += load8(jb->x + (size_t)r * ldx + i) * wv;
        }
        for (int r = 0; r < m; r++)
            jb->y[(size_t)r * jb->n + n] = hsum(acc[r]);
    }
}

/* Two rows of W against blocks of 4 rows of x; the pair is re-read from cache for the next block. */
static inline __attribute__((always_inline)) void pairs(job *jb, int n0, int n1, int prefetch_lines, const int fp8)
{
    const int m = jb->m, k = jb->k, ldx = jb->ldx, last = jb->n - 1;
    const int line = fp8 ? 64 : 16; /* values in a 64-byte line */
    const size_t ahead = (size_t)prefetch_lines * 64, elem = fp8 ? 1 : sizeof(float);
    size_t row;
    for (int n = n0; n < n1; n += 2) {
        const int n_1 = n + 1 <= last ? n + 1 : n;
        const unsigned char *p0 = row_bytes(jb, n, &row), *p1 = row_bytes(jb, n_1, &row);
        for (int r0 = 0; r0 < m; r0 += 4) {
            const float *x[4];
            for (int r = 0; r < 4; r++)
                x[r] = jb->x + (size_t)(r0 + r < m ? r0 + r : m - 1) * ldx;
            v8 a[4] = {{0}}, b[4] = {{0}};
            for (int i = 0; i < k; i += 8) {
                if (prefetch_lines && r0 == 0 && i % line == 0) {
                    __builtin_prefetch(p0 + (size_t)i * elem + ahead, 0, 2);
                    __builtin_prefetch(p1 + (size_t)i * elem + ahead, 0, 2);
                }
                const v8 u = wload8(jb, n, i, fp8) * wscale(jb, n, i, fp8);
                const v8 v = wload8(jb, n_1, i, fp8) * wscale(jb, n_1, i, fp8);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
                    const v8 xv = load8(x[r] + i);
                    a[r] += xv * u;
                    b[r] += xv * v;
                }
            }
            for (int r = 0; r < 4 && r0 + r < m; r++) {
                jb->y[(size_t)(r0 + r) * jb->n + n] = hsum(a[r]);
                if (n + 1 <= last)
                    jb->y[(size_t)(r0 + r) * jb->n + n + 1] = hsum(b[r]);
            }
        }
    }
}

/* The thread's rows in S = 8 / m segments (1 for m > 4), a row of each at once: S sequential
   streams of W, m x S accumulators (8 or fewer). fp8 sums each block of 128 columns apart and
   scales the sum once, as the kernels' block sums do (K a multiple of 128). */
static inline __attribute__((always_inline)) void streams(job *jb, int n0, int n1, const int m, const int fp8)
{
    const int k = jb->k, ldx = jb->ldx, rows = n1 - n0;
    const int S = m > 4 ? 1 : 8 / m, seg = (rows + S - 1) / S;
    for (int i = 0; i < seg; i++) {
        int n[8];
        for (int s = 0; s < 8; s++)
            n[s] = n0 + (s < S && s * seg + i < rows ? s * seg + i : rows - 1); /* past the end: dropped */
        v8 acc[8] = {{0}}; /* [r * S + s] */
        for (int kb = 0; kb < k; kb += BLOCK) {
            v8 blk[8] = {{0}};
            const int kend = kb + BLOCK < k ? kb + BLOCK : k;
            for (int i16 = kb; i16 < kend; i16 += 16) { /* x's 16 values against each stream's 16 */
                v8 xv[8][2] = {{{0}}};
#pragma GCC unroll 8
                for (int r = 0; r < 8; r++)
                    if (r < m) {
                        xv[r][0] = load8(jb->x + (size_t)r * ldx + i16);
                        xv[r][1] = load8(jb->x + (size_t)r * ldx + i16 + 8);
                    }
#pragma GCC unroll 8
                for (int s = 0; s < 8; s++)
                    if (s < S)
#pragma GCC unroll 2
                        for (int h = 0; h < 2; h++) {
                            const v8 wv = wload8(jb, n[s], i16 + 8 * h, fp8);
#pragma GCC unroll 8
                            for (int r = 0; r < 8; r++)
                                if (r < m)
                                    blk[r * S + s] += xv[r][h] * wv;
                        }
            }
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                if (j < m * S)
                    acc[j] += blk[j] * wscale(jb, n[j % S], kb, fp8);
        }
        for (int j = 0; j < m * S; j++) {
            const int r = j / S, s = j % S;
            if (s * seg + i < rows)
                jb->y[(size_t)r * jb->n + n0 + s * seg + i] = hsum(acc[j]);
        }
    }
}

/* f(args..., fp8) with fp8 a constant in each copy, so that each dtype's loops are compiled apart */
#define BY_DTYPE(f, ...)                                                                                               \
    do {                                                                                                               \
        if (jb->codes)                                                                                                 \
            f(__VA_ARGS__, 1);                                                                                         \
        else                                                                                                           \
            f(__VA_ARGS__, 0);                                                                                         \
    } while (0)

/* Each loop in a function of its own: inlined together into one, walk's fp8 copy ran 1.4x slower */
static __attribute__((noinline)) void run_read_fma(job *jb, int n0, int n1)
{
    BY_DTYPE(read_fma, jb, n0, n1);
}

static __attribute__((noinline)) void run_walk(job *jb, int n0, int n1)
{
    BY_DTYPE(walk, jb, n0, n1);
}

static __attribute__((noinline)) void run_pairs(job *jb, int n0, int n1, int prefetch_lines)
{
    BY_DTYPE(pairs, jb, n0, n1, prefetch_lines);
}

/* streams with m as a constant in each copy, so that the accumulators' indices are too and they
   stay in registers */
static __attribute__((noinline)) void run_streams(job *jb, int n0, int n1)
{
    switch (jb->m) {
#define STREAMS_M(M)                                                                                                   \
    case M:                                                                                                            \
        BY_DTYPE(streams, jb, n0, n1, M);                                                                              \
        break;
        STREAMS_M(1)
        STREAMS_M(2)
        STREAMS_M(3)
        STREAMS_M(4)
        STREAMS_M(5)
        STREAMS_M(6)
        STREAMS_M(7)
        STREAMS_M(8)
#undef STREAMS_M
    }
}

static void *thread_main(void *arg)
{
    job *jb = arg;
    int n0, n1;
    share(jb, &n0, &n1);
    static void (*const run[CASES])(job *, int, int) = {
        [READ] = run_read, [READ_FMA] = run_read_fma, [WALK] = run_walk, [STREAMS] = run_streams};
    if (run[jb->kind])
        run[jb->kind](jb, n0, n1);
    else /* PAIRS, PAIRS_PF */
        run_pairs(jb, n0, n1, jb->kind == PAIRS_PF ? jb->prefetch_lines : 0);
    return NULL;
}

static int run_case(const job *proto, job *jobs, pthread_t *ids, double *seconds)
{
    const double t0 = now();
    for (int t = 0; t < proto->threads; t++) {
        jobs[t] = *proto;
        jobs[t].index = t;
        if (pthread_create(&ids[t], NULL, thread_main, &jobs[t]) != 0) {
            for (int u = 0; u < t; u++)
                pthread_join(ids[u], NULL);
            return 1;
        }
    }
    for (int t = 0; t < proto->threads; t++)
        pthread_join(ids[t], NULL);
    *seconds = now() - t0;
    return 0;
}

static int compare_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long number(const char *s, const char *what, long lo, long hi)
{
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        fprintf(stderr, "clmla-products-bound: %s must be an integer in %ld..%ld, not '%s'\n", what, lo, hi, s);
        exit(2);
    }
    return v;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: clmla-products-bound [--m M] [--n N] [--k K] [--dtype f32|fp8] [--threads T]\n"
               "                            [--rounds R] [--prefetch LINES] [--flush MIB] [--warm] [--check]\n"
               "  defaults: 8 x 3072 x 2048 (V2-Lite's q_proj), f32, T 2, R 15, prefetch 128 lines, flush 128 MiB\n"
               "  fp8: E4M3 codes with a float scale per 128 x 128 block (K a multiple of 128)\n");
}

int main(int argc, char **argv)
{
    int m = 8, n = 3072, k = 2048, threads = 2, rounds = 15, prefetch = 128, warm = 0, check = 0, fp8 = 0;
    long flush_mib = 128;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--warm"))
            warm = 1;
        else if (!strcmp(a, "--check"))
            check = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (v && !strcmp(a, "--m"))
            m = (int)number(v, "--m", 1, 8), i++;
        else if (v && !strcmp(a, "--n"))
            n = (int)number(v, "--n", 2, 1 << 16), i++;
        else if (v && !strcmp(a, "--k"))
            k = (int)number(v, "--k", 8, 1 << 16), i++;
        else if (v && !strcmp(a, "--threads"))
            threads = (int)number(v, "--threads", 1, 256), i++;
        else if (v && !strcmp(a, "--rounds"))
            rounds = (int)number(v, "--rounds", 1, 1000), i++;
        else if (v && !strcmp(a, "--prefetch"))
            prefetch = (int)number(v, "--prefetch", 0, 4096), i++;
        else if (v && !strcmp(a, "--flush"))
            flush_mib = number(v, "--flush", 1, 1 << 16), i++;
        else if (v && !strcmp(a, "--dtype") && (!strcmp(v, "f32") || !strcmp(v, "fp8")))
            fp8 = !strcmp(v, "fp8"), i++;
        else {
            usage(stderr);
            return 2;
        }
    }
    if (k % (fp8 ? BLOCK : 16)) {
        fprintf(stderr, "clmla-products-bound: --k must be a multiple of %d%s (got %d)\n", fp8 ? BLOCK : 16,
                fp8 ? " with --dtype fp8" : "", k);
        return 2;
    }
    const int ldx = k + 16;
    const size_t flush_bytes = (size_t)flush_mib << 20, elem = fp8 ? 1 : sizeof(float);
    const size_t scale_count = (size_t)((n + BLOCK - 1) / BLOCK) * (size_t)(k / BLOCK);
    /* aligned_alloc wants a multiple of the alignment */
    void *wmem = aligned_alloc(64, ((size_t)n * k * elem + 63) & ~(size_t)63);
    float *w = fp8 ? NULL : wmem, *scales = fp8 ? malloc(sizeof(float) * scale_count) : NULL;
    unsigned char *codes = fp8 ? wmem : NULL;
    float *x = aligned_alloc(64, (size_t)8 * ldx * sizeof(float));
    float *y = malloc((size_t)m * n * sizeof(float));
    unsigned char *junk = malloc(flush_bytes);
    const int slots = CASES * 2;
    double *times = malloc(sizeof(double) * (size_t)slots * rounds);
    job *jobs = malloc(sizeof(job) * (size_t)threads);
    pthread_t *ids = malloc(sizeof(pthread_t) * (size_t)threads);
    if (!wmem || (fp8 && !scales) || !x || !y || !junk || !times || !jobs || !ids) {
        fprintf(stderr, "clmla-products-bound: out of memory\n");
        return 1;
    }
    decode_init();
    for (size_t i = 0; i < (size_t)n * k; i++) {
        if (fp8) { /* every code but the NaNs (S.1111.111), subnormals included */
            const unsigned c = (unsigned)((i * 7919u) % 254u);
            codes[i] = (unsigned char)(c >= 0x7Fu ? c + 1 : c);
        } else
            w[i] = (float)((i * 7919u) % 257u) / 257.0f - 0.5f;
    }
    for (size_t i = 0; fp8 && i < scale_count; i++) /* about DeepSeek's scales; times 2^8, decode8's unit */
        scales[i] = (float)ldexp(1.0 + (double)(i % 5) / 8.0, -8 - (int)(i % 3)) * 256.0f;
    for (size_t i = 0; i < (size_t)8 * ldx; i++)
        x[i] = (float)((i * 104729u) % 263u) / 263.0f - 0.5f;
    memset(junk, 1, flush_bytes);

    int failed = 0;
    volatile unsigned long sink = 0;
    for (int r = 0; r < rounds; r++)
        for (int c = 0; c < CASES; c++)
            for (int hot = 0; hot <= warm; hot++) {
                if (!hot) {
                    unsigned long s = 0;
                    for (size_t i = 0; i < flush_bytes; i += 64)
                        s += junk[i];
                    sink += s;
                }
                memset(y, 0, (size_t)m * n * sizeof(float));
                job proto = {c, m, n, k, ldx, prefetch, threads, 0, w, x, codes, scales, y, 0};
                double sec;
                if (run_case(&proto, jobs, ids, &sec)) {
                    fprintf(stderr, "clmla-products-bound: pthread_create failed\n");
                    return 1;
                }
                times[(c * 2 + hot) * rounds + r] = sec;
                if (check && c != READ && c != READ_FMA && r == 0 && !hot) {
                    double worst = 0;
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < n; j++) {
                            double ref = 0, mag = 0;
                            for (int t = 0; t < k; t++) {
                                const double wv = fp8 ? e4m3_value(codes[(size_t)j * k + t]) *
                                                            scales[(size_t)(j / BLOCK) * (size_t)(k / BLOCK) + (size_t)(t / BLOCK)] / 256.0
                                                      : w[(size_t)j * k + t];
                                const double p = (double)x[(size_t)i * ldx + t] * wv;
                                ref += p;
                                mag += fabs(p);
                            }
                            const double yv = y[(size_t)i * n + j];
                            const double err = isfinite(yv) ? fabs(yv - ref) / (mag > 0 ? mag : 1) : INFINITY;
                            if (err > worst)
                                worst = err;
                        }
                    printf("check    %-9s max |y - y64| / sum|x w| = %.2e%s\n", case_names[c], worst,
                           worst > 1e-5 ? "  FAILED" : "");
                    failed |= worst > 1e-5;
                }
            }

    printf("shape    %d x %d x %d %s, W %.1f MiB, %d threads, %d rounds, flush %ld MiB%s\n", m, n, k,
           fp8 ? "fp8 e4m3, 128 x 128 block scales" : "float32", (double)n * k * elem / 1048576.0, threads, rounds,
           flush_mib, warm ? ", also warm" : "");
    double med[CASES][2] = {{0}};
    for (int c = 0; c < CASES; c++)
        for (int hot = 0; hot <= warm; hot++) {
            double *t = &times[(c * 2 + hot) * rounds];
            qsort(t, (size_t)rounds, sizeof(double), compare_double);
            med[c][hot] = rounds % 2 ? t[rounds / 2] : 0.5 * (t[rounds / 2 - 1] + t[rounds / 2]);
        }
    const double bytes = (double)n * k * elem, flops = 2.0 * m * n * k;
    for (int c = 0; c < CASES; c++)
        for (int hot = 0; hot <= warm; hot++) {
            const double s = med[c][hot];
            printf("%-8s %-7s median %8.3f ms  %6.1f GB/s of W  %5.0f%% of read", case_names[c], hot ? "warm" : "flushed",
                   s * 1e3, bytes / s / 1e9, 100.0 * med[READ][0] / s);
            if (c != READ)
                printf("  %6.1f GFLOP/s", flops / s / 1e9);
            if (c != READ && warm && !hot)
                printf("  read + warm %.3f ms", (med[READ][0] + med[c][1]) * 1e3);
            printf("\n");
        }
    free(wmem);
    free(scales);
    free(x);
    free(y);
    free(junk);
    free(times);
    free(jobs);
    free(ids);
    return failed;
}
