/* clmla-products-bound: what plain C on the host's own cores makes of a decode-shaped product
 * y = x W^T (M rows, W [N, K] float32), without OpenCL, as a yardstick for the "products" phase
 * of clmla-bench on CPU devices.
 *
 * It times, interleaved round by round so that a shared machine's drift hits every case alike:
 *   read      a pure read of W by T threads (the streaming speed of these cores)
 *   read+fma  the same read with M fused multiply-adds per vector of 8 weights into M register
 *             accumulators, by constants held in registers, and the prefetch of +pf: the
 *             product's arithmetic and streaming without its loads of x. Where it stays near the
 *             read, the cores can overlap the two, and what a product loses is x's traffic
 *   walk      the product with W walked in memory order: each thread takes whole rows of W, full K,
 *             all M rows of x at once (x's rows come from L2)
 *   pairs     two rows of W at a time, M rows of x in blocks of 4 (4 x 2 accumulators), W's pair
 *             re-read from L1/L2 for the next block of x
 *   +pf       the same with a software prefetch of W a fixed distance ahead
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

typedef float v8 __attribute__((vector_size(32)));

enum { READ, READ_FMA, WALK, PAIRS, PAIRS_PF, CASES };
static const char *const case_names[CASES] = {"read", "read+fma", "walk", "pairs", "pairs+pf"};

typedef struct job {
    int kind, m, n, k, ldx, prefetch_lines, threads, index;
    const float *w, *x;
    float *y;
    float sum; /* the read case's result, kept so that the loads are not removed */
} job;

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

static void run_read(job *jb, int n0, int n1)
{
    v8 s0 = {0}, s1 = {0};
    const float *p = jb->w + (size_t)n0 * jb->k, *end = jb->w + (size_t)n1 * jb->k;
    for (; p + 16 <= end; p += 16) {
        s0 += load8(p);
        s1 += load8(p + 8);
    }
    jb->sum = hsum(s0 + s1);
}

/* The read with jb->m FMAs per vector of W into as many accumulators, and W prefetched as in
   run_pairs; the multipliers are the first 8 values of x's rows, loaded once, so that nothing is
   constant-folded. */
static void run_read_fma(job *jb, int n0, int n1)
{
    const int m = jb->m;
    v8 c[8], acc[8] = {{0}};
    for (int r = 0; r < 8; r++)
        c[r] = load8(jb->x + (size_t)(r < m ? r : 0) * jb->ldx);
    const float *p = jb->w + (size_t)n0 * jb->k, *end = jb->w + (size_t)n1 * jb->k;
    const size_t ahead = (size_t)jb->prefetch_lines * 16;
    for (; p + 16 <= end; p += 16) {
        if (ahead)
            __builtin_prefetch(p + ahead, 0, 2);
#pragma GCC unroll 2
        for (int h = 0; h < 16; h += 8) {
            const v8 wv = load8(p + h);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                if (r < m)
                    acc[r] += wv * c[r];
        }
    }
    jb->sum = hsum(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
}

/* One row of W against up to 8 rows of x, all of K (K a multiple of 8). */
static void run_walk(job *jb, int n0, int n1)
{
    const int m = jb->m, k = jb->k, ldx = jb->ldx;
    for (int n = n0; n < n1; n++) {
        const float *w = jb->w + (size_t)n * k;
        v8 acc[8] = {{0}};
        for (int i = 0; i < k; i += 8) {
            const v8 wv = load8(w + i);
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
static void run_pairs(job *jb, int n0, int n1, int prefetch_lines)
{
    const int m = jb->m, k = jb->k, ldx = jb->ldx, last = jb->n - 1;
    const size_t ahead = (size_t)prefetch_lines * 16;
    for (int n = n0; n < n1; n += 2) {
        const float *w0 = jb->w + (size_t)n * k, *w1 = jb->w + (size_t)(n + 1 <= last ? n + 1 : n) * k;
        for (int r0 = 0; r0 < m; r0 += 4) {
            const float *x[4];
            for (int r = 0; r < 4; r++)
                x[r] = jb->x + (size_t)(r0 + r < m ? r0 + r : m - 1) * ldx;
            v8 a[4] = {{0}}, b[4] = {{0}};
            for (int i = 0; i < k; i += 8) {
                if (prefetch_lines && r0 == 0 && (i & 15) == 0) {
                    __builtin_prefetch(w0 + i + ahead, 0, 2);
                    __builtin_prefetch(w1 + i + ahead, 0, 2);
                }
                const v8 u = load8(w0 + i), v = load8(w1 + i);
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

static void *thread_main(void *arg)
{
    job *jb = arg;
    int n0, n1;
    share(jb, &n0, &n1);
    switch (jb->kind) {
    case READ:
        run_read(jb, n0, n1);
        break;
    case READ_FMA:
        run_read_fma(jb, n0, n1);
        break;
    case WALK:
        run_walk(jb, n0, n1);
        break;
    default:
        run_pairs(jb, n0, n1, jb->kind == PAIRS_PF ? jb->prefetch_lines : 0);
        break;
    }
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
    fprintf(f, "usage: clmla-products-bound [--m M] [--n N] [--k K] [--threads T] [--rounds R]\n"
               "                            [--prefetch LINES] [--flush MIB] [--warm] [--check]\n"
               "  defaults: 8 x 3072 x 2048 (V2-Lite's q_proj), T 2, R 15, prefetch 128 lines, flush 128 MiB\n");
}

int main(int argc, char **argv)
{
    int m = 8, n = 3072, k = 2048, threads = 2, rounds = 15, prefetch = 128, warm = 0, check = 0;
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
        else {
            usage(stderr);
            return 2;
        }
    }
    if (k % 16) {
        fprintf(stderr, "clmla-products-bound: --k must be a multiple of 16 (got %d)\n", k);
        return 2;
    }
    const int ldx = k + 16;
    const size_t flush_bytes = (size_t)flush_mib << 20;
    float *w = aligned_alloc(64, (size_t)n * k * sizeof(float));
    float *x = aligned_alloc(64, (size_t)8 * ldx * sizeof(float));
    float *y = malloc((size_t)m * n * sizeof(float));
    unsigned char *junk = malloc(flush_bytes);
    const int slots = CASES * 2;
    double *times = malloc(sizeof(double) * (size_t)slots * rounds);
    job *jobs = malloc(sizeof(job) * (size_t)threads);
    pthread_t *ids = malloc(sizeof(pthread_t) * (size_t)threads);
    if (!w || !x || !y || !junk || !times || !jobs || !ids) {
        fprintf(stderr, "clmla-products-bound: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)n * k; i++)
        w[i] = (float)((i * 7919u) % 257u) / 257.0f - 0.5f;
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
                job proto = {c, m, n, k, ldx, prefetch, threads, 0, w, x, y, 0.0f};
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
                                const double p = (double)x[(size_t)i * ldx + t] * w[(size_t)j * k + t];
                                ref += p;
                                mag += fabs(p);
                            }
                            const double err = fabs(y[(size_t)i * n + j] - ref) / (mag > 0 ? mag : 1);
                            if (err > worst)
                                worst = err;
                        }
                    printf("check    %-9s max |y - y64| / sum|x w| = %.2e%s\n", case_names[c], worst,
                           worst > 1e-5 ? "  FAILED" : "");
                    failed |= worst > 1e-5;
                }
            }

    printf("shape    %d x %d x %d float32, W %.1f MiB, %d threads, %d rounds, flush %ld MiB%s\n", m, n, k,
           (double)n * k * 4 / 1048576.0, threads, rounds, flush_mib, warm ? ", also warm" : "");
    double med[CASES][2] = {{0}};
    for (int c = 0; c < CASES; c++)
        for (int hot = 0; hot <= warm; hot++) {
            double *t = &times[(c * 2 + hot) * rounds];
            qsort(t, (size_t)rounds, sizeof(double), compare_double);
            med[c][hot] = rounds % 2 ? t[rounds / 2] : 0.5 * (t[rounds / 2 - 1] + t[rounds / 2]);
        }
    const double bytes = (double)n * k * 4, flops = 2.0 * m * n * k;
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
    free(w);
    free(x);
    free(y);
    free(junk);
    free(times);
    free(jobs);
    free(ids);
    return failed;
}
