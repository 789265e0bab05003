/* clmla tune: searches CLBlast's Xgemm parameters for a device and saves the fastest as an entry
   that every later context on that device applies (include/clmla_tuning.h, "CLBlast tuning"). */
#include "args.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "commands.h"
#include "mla_ref.h"
#include "random_layer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void print_values(const size_t *v)
{
    for (int i = 0; i < CLMLA_XGEMM_PARAMETERS; i++)
        printf("%s%s=%zu", i ? " " : "", clmla_xgemm_parameter_name(i), v[i]);
}

static void progress(void *user, int index, int total, const size_t *values, double gflops, const char *note)
{
    (void)user;
    printf("[%2d/%d] ", index, total);
    if (values)
        print_values(values);
    else
        printf("CLBlast's own values");
    if (gflops > 0)
        printf(": %.1f GFLOP/s\n", gflops);
    else
        printf(": skipped (%s)\n", note && *note ? note : "failed");
    fflush(stdout);
}

/* ---- clmla tune --kernels: the latent attention kernel's parameters ------------------------------ */

#include <math.h>
#include <time.h>

typedef struct kt_run {
    clmla_context *ctx;
    cl_context clctx;
    int heads, rkv, dr, bt, ctx_len, rows; /* rows: the CPU kernel attn_latent_rows */
    int reps;
    clmla_cache_dtype dtype;               /* the cache's (f32, or a decoded one: --cache-dtype) */
    float *h_ckv, *h_kr;                   /* ctx_len random rows, host */
    cl_mem ckv, kr;                        /* the same rows on the device */
} kt_run;

static double kt_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float kt_rand(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((double)(*s >> 8) / 16777216.0 * 2.0 - 1.0);
}

static cl_mem kt_buffer(kt_run *r, size_t bytes, const void *host)
{
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(r->clctx, CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0), bytes, (void *)host, &err);
    return err == CL_SUCCESS ? m : NULL;
}

/* A cache of `seqs` sequences of lengths len[], each holding rows 0.. of the run's rows, and the
   arguments of one call with token t attending to sequence t (all of its keys). Returns 0 on
   success; frees what it made on failure. */
#define KT_MAX_SEQS 8 /* sequences a case holds at most */
typedef struct kt_case {
    clmla_cache *cache;
    int32_t ids[KT_MAX_SEQS]; /* the cache's sequence of each token */
    cl_mem table, seq, clen, ql, qr, out;
    clmla_latent_attention_args a;
    float *h_ql, *h_qr;
} kt_case;

static void kt_case_free(kt_case *c)
{
    cl_mem *m[] = {&c->table, &c->seq, &c->clen, &c->ql, &c->qr, &c->out};
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        if (*m[i])
            clReleaseMemObject(*m[i]);
    clmla_cache_destroy(c->cache);
    free(c->h_ql);
    free(c->h_qr);
    memset(c, 0, sizeof(*c));
}

static int kt_case_make(kt_run *r, kt_case *c, int seqs, const int *len)
{
    memset(c, 0, sizeof(*c));
    if (seqs > KT_MAX_SEQS)
        return -1;
    int max_len = 0;
    for (int s = 0; s < seqs; s++)
        max_len = len[s] > max_len ? len[s] : max_len;
    const int per_seq = (max_len + r->bt - 1) / r->bt;
    clmla_cache_config cfg = {1, r->rkv, r->dr, r->bt, seqs * per_seq, r->dtype, 0, CLMLA_CACHE_F32};
    if (clmla_cache_create(r->ctx, &cfg, &c->cache) != CLMLA_SUCCESS)
        return -1;
    int32_t *table = calloc((size_t)seqs * per_seq, sizeof(int32_t));
    int32_t *tseq = malloc((size_t)seqs * sizeof(int32_t));
    const size_t nq = (size_t)seqs * r->heads;
    c->h_ql = malloc(nq * r->rkv * sizeof(float));
    c->h_qr = malloc(nq * r->dr * sizeof(float));
    int ok = table && tseq && c->h_ql && c->h_qr;
    for (int s = 0; ok && s < seqs; s++) {
        int32_t id = 0, nb = 0;
        ok = clmla_cache_seq_add(c->cache, &id) == CLMLA_SUCCESS &&
             clmla_cache_append_cl(c->cache, 0, id, len[s], r->ckv, 0, r->rkv, r->kr, 0, r->dr, NULL) == CLMLA_SUCCESS &&
             clmla_cache_seq_blocks(c->cache, id, table + (size_t)s * per_seq, per_seq, &nb) == CLMLA_SUCCESS;
        tseq[s] = s;
        c->ids[s] = id;
    }
    uint32_t seed = 777;
    for (size_t i = 0; ok && i < nq * r->rkv; i++)
        c->h_ql[i] = kt_rand(&seed);
    for (size_t i = 0; ok && i < nq * r->dr; i++)
        c->h_qr[i] = kt_rand(&seed);
    if (ok) {
        c->table = kt_buffer(r, (size_t)seqs * per_seq * sizeof(int32_t), table);
        c->seq = kt_buffer(r, (size_t)seqs * sizeof(int32_t), tseq);
        c->clen = kt_buffer(r, (size_t)seqs * sizeof(int32_t), len);
        c->ql = kt_buffer(r, nq * r->rkv * sizeof(float), c->h_ql);
        c->qr = kt_buffer(r, nq * r->dr * sizeof(float), c->h_qr);
        c->out = kt_buffer(r, nq * r->rkv * sizeof(float), NULL);
        ok = c->table && c->seq && c->clen && c->ql && c->qr && c->out;
    }
    free(table);
    free(tseq);
    if (!ok) {
        kt_case_free(c);
        return -1;
    }
    clmla_latent_attention_args *a = &c->a;
    memset(a, 0, sizeof(*a));
    a->num_tokens = seqs;
    a->num_heads = r->heads;
    a->softmax_scale = 1.0f / sqrtf((float)(r->rkv + r->dr));
    a->q_latent = c->ql;
    a->q_rope = c->qr;
    a->block_table = c->table;
    a->max_blocks_per_seq = per_seq;
    a->token_seq = c->seq;
    a->token_ctx_len = c->clen;
    a->max_ctx_len = max_len;
    a->out = c->out;
    return 0;
}

/* The largest difference from a float64 attention (scores, softmax, weighted sum of cache rows)
   over every head of every token; negative when the call fails. A decoded cache is compared on
   the values it stores (read back), so that only the kernel's own error counts. */
static double kt_check(kt_run *r, kt_case *c, const int *len)
{
    const int T = c->a.num_tokens, H = r->heads, rkv = r->rkv, dr = r->dr;
    float *got = malloc((size_t)T * H * rkv * sizeof(float));
    double *sc = malloc((size_t)r->ctx_len * sizeof(double)), *ref = malloc((size_t)rkv * sizeof(double));
    float *ckv = r->h_ckv, *kr = r->h_kr;
    if (r->dtype != CLMLA_CACHE_F32) {
        ckv = malloc((size_t)r->ctx_len * rkv * sizeof(float));
        kr = malloc((size_t)r->ctx_len * dr * sizeof(float));
    }
    double worst = -1;
    if (got && sc && ref && ckv && kr && clmla_attention_latent(c->cache, 0, &c->a, NULL) == CLMLA_SUCCESS &&
        clEnqueueReadBuffer(clmla_context_queue(r->ctx), c->out, CL_TRUE, 0, (size_t)T * H * rkv * sizeof(float), got, 0,
                            NULL, NULL) == CL_SUCCESS) {
        worst = 0;
        for (int t = 0; t < T; t++) {
            if (r->dtype != CLMLA_CACHE_F32 && clmla_cache_read(c->cache, 0, c->ids[t], 0, len[t], ckv, kr) != CLMLA_SUCCESS) {
                worst = -1;
                break;
            }
            for (int h = 0; h < H; h++) {
                const float *ql = c->h_ql + ((size_t)t * H + h) * rkv, *qr = c->h_qr + ((size_t)t * H + h) * dr;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < len[t]; j++) {
                    double d = 0;
                    for (int i = 0; i < rkv; i++)
                        d += (double)ql[i] * ckv[(size_t)j * rkv + i];
                    for (int i = 0; i < dr; i++)
                        d += (double)qr[i] * kr[(size_t)j * dr + i];
                    sc[j] = d * c->a.softmax_scale;
                    m = sc[j] > m ? sc[j] : m;
                }
                for (int i = 0; i < rkv; i++)
                    ref[i] = 0;
                for (int j = 0; j < len[t]; j++) {
                    const double w = exp(sc[j] - m);
                    sum += w;
                    for (int i = 0; i < rkv; i++)
                        ref[i] += w * ckv[(size_t)j * rkv + i];
                }
                for (int i = 0; i < rkv; i++) {
                    const double diff = fabs(got[((size_t)t * H + h) * rkv + i] - ref[i] / sum);
                    worst = diff > worst ? diff : worst;
                }
            }
        }
    }
    if (ckv != r->h_ckv)
        free(ckv);
    if (kr != r->h_kr)
        free(kr);
    free(got);
    free(sc);
    free(ref);
    return worst;
}

static int kt_cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median microseconds of reps calls with the first `tokens` tokens of the case (after one warm-up). */
static double kt_time(kt_run *r, kt_case *c, int tokens)
{
    clmla_latent_attention_args a = c->a;
    a.num_tokens = tokens;
    double t[32];
    const int reps = r->reps < 32 ? r->reps : 32;
    for (int i = -1; i < reps; i++) {
        const double t0 = kt_now();
        if (clmla_attention_latent(c->cache, 0, &a, NULL) != CLMLA_SUCCESS || clFinish(clmla_context_queue(r->ctx)) != CL_SUCCESS)
            return -1;
        if (i >= 0)
            t[i] = (kt_now() - t0) * 1e6;
    }
    qsort(t, (size_t)reps, sizeof(double), kt_cmp);
    return t[reps / 2];
}

/* t appended to cands[*n] unless one of them holds the same values */
static void add_unique(clmla_latent_tuning *cands, int *n, const clmla_latent_tuning *t)
{
    for (int i = 0; i < *n; i++)
        if (memcmp(t, &cands[i], sizeof(*t)) == 0)
            return;
    cands[(*n)++] = *t;
}

static void kt_print(const clmla_latent_tuning *t, int rows, int decoded)
{
    if (rows)
        printf("rows_heads=%-2d rows_keys=%-2d rows_groups_per_cu=%-2d rows_lanes=%d", t->rows_heads, t->rows_keys,
               t->rows_groups_per_cu, t->rows_lanes);
    else
        printf("group_heads=%-2d group_keys=%d group_max_items=%-4d group_groups_per_cu=%-2d group_query_layout=%d "
               "group_min_split_keys=%-4d group_row_slices=%d",
               t->group_heads, t->group_keys, t->group_max_items, t->group_groups_per_cu, t->group_query_layout,
               t->group_min_split_keys, t->group_row_slices);
    if (decoded)
        printf(" group_decode_heads=%-2d group_aligned=%d group_mma=%d", t->group_decode_heads, t->group_aligned,
               t->group_mma);
}

/* The kernel tuning file `clmla tune --kernels` writes into path: --out, else the one the library
   reads (CLMLA_KERNEL_TUNING, else the cache folder's). 0, else the command's exit code (the
   reason printed): 1 the path is too long, 2 there is none and this is no dry run. */
static int kernel_tuning_target(const char *out, int dry_run, char *path, size_t size)
{
    if (out)
        snprintf(path, size, "%s", out);
    else if (clmla_latent_tuning_path(path, size) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    if (!dry_run && !path[0]) {
        fprintf(stderr, "clmla tune: no kernel tuning file to write (set --out, CLMLA_KERNEL_TUNING or CLMLA_CACHE_DIR), "
                        "or use --dry-run\n");
        return 2;
    }
    return 0;
}

/* The latent kernel's parameters, what it chose (saved or not) in *chosen. dtype f32: the grid of the
   kernel the device runs; a decoded cache (f16, bf16, fp8): the heads per item of attn_latent's score
   step for such caches (group_decode_heads), the rest as in force. */
static int tune_kernels(const char *device, int heads, int ctx_len, int quick, int dry_run, const char *out,
                        clmla_cache_dtype dtype, clmla_latent_tuning *chosen)
{
    char path[4096];
    const int bad = kernel_tuning_target(out, dry_run, path, sizeof(path));
    if (bad)
        return bad;
    kt_run r;
    memset(&r, 0, sizeof(r));
    if (cli_context_create(device, &r.ctx) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    clmla_device_info info;
    clmla_context_device(r.ctx, &info);
    clGetCommandQueueInfo(clmla_context_queue(r.ctx), CL_QUEUE_CONTEXT, sizeof(r.clctx), &r.clctx, NULL);
    r.heads = heads;
    r.rkv = 512;
    r.dr = 64;
    r.bt = 64;
    r.ctx_len = quick ? 512 : ctx_len;
    r.rows = cli_runs_row_kernels(&info);
    r.reps = quick ? 3 : 7;
    r.dtype = dtype;
    const int decoded = dtype != CLMLA_CACHE_F32;
    if (decoded && r.rows) {
        fprintf(stderr, "clmla tune: --cache-dtype tunes attn_latent's group_decode_heads; this device runs "
                        "the row kernels, attn_latent_rows and attn_latent_lanes (CLMLA_ATTENTION_KERNELS=group runs the "
                        "other)\n");
        clmla_context_destroy(r.ctx);
        return 2;
    }
    const size_t rows_n = (size_t)r.ctx_len;
    r.h_ckv = malloc(rows_n * r.rkv * sizeof(float));
    r.h_kr = malloc(rows_n * r.dr * sizeof(float));
    int rc = 1;
    if (!r.h_ckv || !r.h_kr) {
        fprintf(stderr, "clmla tune: out of host memory\n");
        goto done;
    }
    uint32_t seed = 4242;
    for (size_t i = 0; i < rows_n * r.rkv; i++)
        r.h_ckv[i] = kt_rand(&seed);
    for (size_t i = 0; i < rows_n * r.dr; i++)
        r.h_kr[i] = kt_rand(&seed);
    r.ckv = kt_buffer(&r, rows_n * r.rkv * sizeof(float), r.h_ckv);
    r.kr = kt_buffer(&r, rows_n * r.dr * sizeof(float), r.h_kr);
    if (!r.ckv || !r.kr) {
        fprintf(stderr, "clmla tune: cannot allocate the cache rows\n");
        goto done;
    }

    /* The candidates: the parameters that apply now (the user file's entry, the built-in table's,
       else the defaults) first, always measured; the defaults when they differ; then the grid. */
    enum { MAX_CANDIDATES = 128 };
    clmla_latent_tuning cands[MAX_CANDIDATES], base, defaults;
    const char *base_source = "defaults";
    clmla_latent_tuning_defaults(&defaults);
    if (clmla_latent_tuning_lookup(&info, r.heads, &base, &base_source) != CLMLA_SUCCESS)
        printf("note: %s\n", clmla_last_error(NULL)); /* a malformed user file: its values are ignored */
    int n = 0;
    cands[n++] = base;
    if (memcmp(&defaults, &base, sizeof(base)) != 0 && !decoded) /* decoded: one parameter, the rest as in force */
        cands[n++] = defaults;
    if (decoded) {
        static const int dh[] = {16, 8, 4};
        for (int i = 0; i < 3; i++) {
            clmla_latent_tuning t = base;
            t.group_decode_heads = dh[i];
            if (!quick || n < 2)
                add_unique(cands, &n, &t);
        }
        /* at each heads an item (--quick: with those in force), the rows read by whole vectors or
           not (where the rows allow them; else the same kernel as in force), and for an f16 cache as
           ushort4s converted in registers (group_aligned 2) */
        const int aligned_variants = dtype == CLMLA_CACHE_F16 ? 2 : 1;
        for (int j = 0; j < aligned_variants; j++)
            for (int i = 0; i < (quick ? 1 : 3); i++) {
                clmla_latent_tuning t = base;
                if (j == 0)
                    t.group_aligned = base.group_aligned ? 0 : 1;
                else
                    t.group_aligned = 2;
                if (!quick)
                    t.group_decode_heads = dh[i];
                add_unique(cands, &n, &t);
            }
    } else if (r.rows) {
        static const int hs[] = {8, 16}, ks[] = {4, 8, 16}, gs[] = {2, 4, 8};
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++)
                for (int g = 0; g < 3; g++) {
                    clmla_latent_tuning t = base;
                    t.rows_lanes = 0;
                    t.rows_heads = hs[i];
                    t.rows_keys = ks[j];
                    t.rows_groups_per_cu = gs[g];
                    if (memcmp(&t, &base, sizeof(t)) != 0 && memcmp(&t, &defaults, sizeof(t)) != 0 && (!quick || n < 2))
                        cands[n++] = t;
                }
        /* attn_latent_lanes (rows_lanes 1, and from 32 heads 2; rows_heads does not apply to it) at 8
           and 16 keys a tile and 2 to 8 items per compute unit (--quick: the kernel in force swapped,
           the rest as in force) */
        static const int lks[] = {8, 16};
        for (int l = 1; l <= (r.heads >= 32 ? 2 : 1); l++)
            for (int j = 0; j < 2; j++)
                for (int g = 0; g < 3; g++) {
                    clmla_latent_tuning t = base;
                    t.rows_lanes = quick ? !base.rows_lanes : l;
                    if (!quick) {
                        t.rows_heads = defaults.rows_heads;
                        t.rows_keys = lks[j];
                        t.rows_groups_per_cu = gs[g];
                    }
                    add_unique(cands, &n, &t);
                }
    } else {
        /* the query layout first (the one value --quick adds), then the grid in both layouts */
        static const int hs[] = {8, 16}, ks[] = {2, 4, 8}, nts[] = {64, 128, 256}, gs[] = {4, 8};
        cands[n] = base;
        cands[n++].group_query_layout = 1;
        for (int q = 0; q < 2; q++)
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++)
                    for (int k = 0; k < 3; k++)
                        for (int g = 0; g < 2; g++) {
                            clmla_latent_tuning t = base;
                            t.group_heads = hs[i];
                            t.group_keys = ks[j];
                            t.group_max_items = nts[k];
                            t.group_groups_per_cu = gs[g];
                            t.group_query_layout = q;
                            if (memcmp(&t, &base, sizeof(t)) != 0 && memcmp(&t, &cands[1], sizeof(t)) != 0 &&
                                n < MAX_CANDIDATES && !quick)
                                cands[n++] = t;
                        }
        /* smaller splits of one sequence's keys (more work-groups at batch 1), the rest as in force */
        static const int splits[] = {32, 64};
        for (int i = 0; i < 2 && !quick; i++) {
            clmla_latent_tuning t = base;
            t.group_min_split_keys = splits[i];
            if (memcmp(&t, &base, sizeof(t)) != 0 && n < MAX_CANDIDATES)
                cands[n++] = t;
        }
        /* each key's dot products shared by 2 or 4 items (group_row_slices), with the splits in force
           and smaller ones (tiles of fewer keys, for more work-groups) */
        static const int slices[] = {2, 4}, slice_splits[] = {0, 32, 64};
        for (int i = 0; i < 2 && !quick; i++)
            for (int j = 0; j < 3; j++) {
                clmla_latent_tuning t = base;
                t.group_row_slices = slices[i];
                if (slice_splits[j])
                    t.group_min_split_keys = slice_splits[j];
                if (n < MAX_CANDIDATES)
                    add_unique(cands, &n, &t);
            }
    }
    /* the work-group kernel on an NVIDIA GPU: attn_latent_mma (both products on the tensor cores; it
       reads none of the parameters above), or attn_latent where it is in force */
    if (!r.rows && strstr(info.vendor, "NVIDIA") && n < MAX_CANDIDATES) {
        clmla_latent_tuning t = base;
        t.group_mma = !base.group_mma;
        add_unique(cands, &n, &t);
    }
    printf("tuning %s on %s (%s, %s, driver %s): %d heads, rkv %d, dr %d, %s cache, ctx %d, batch 1 and 8, %d "
           "candidates\n",
           r.rows ? "attn_latent_rows / attn_latent_lanes" : "attn_latent", info.name, info.vendor, info.platform_name, info.driver_version,
           r.heads, r.rkv, r.dr, cli_cache_dtype_name(dtype), r.ctx_len, n);
    const int check_len[2] = {r.ctx_len < 300 ? r.ctx_len : 300, 77};
    int time_len[8];
    for (int i = 0; i < 8; i++)
        time_len[i] = r.ctx_len;
    double us1[MAX_CANDIDATES], us8[MAX_CANDIDATES], err[MAX_CANDIDATES];
    int best = -1;
    double best_score = 0;
    const double start = kt_now();
    for (int i = 0; i < n; i++) {
        us1[i] = us8[i] = -1;
        kt_case chk, tim;
        if (clmla_context_set_latent_tuning(r.ctx, &cands[i]) != CLMLA_SUCCESS || kt_case_make(&r, &chk, 2, check_len)) {
            fprintf(stderr, "clmla tune: %s\n", clmla_last_error(r.ctx));
            goto done;
        }
        err[i] = kt_check(&r, &chk, check_len);
        kt_case_free(&chk);
        printf("[%2d/%d] ", i + 1, n);
        kt_print(&cands[i], r.rows, decoded);
        if (err[i] < 0 || err[i] > 1e-4) {
            printf("  refused: %s%g\n", err[i] < 0 ? "failed: " : "error ", err[i] < 0 ? 0.0 : err[i]);
            if (err[i] < 0)
                printf("         %s\n", clmla_last_error(r.ctx));
            continue;
        }
        if (kt_case_make(&r, &tim, 8, time_len)) {
            fprintf(stderr, "clmla tune: %s\n", clmla_last_error(r.ctx));
            goto done;
        }
        us1[i] = kt_time(&r, &tim, 1);
        us8[i] = kt_time(&r, &tim, 8);
        kt_case_free(&tim);
        if (us1[i] <= 0 || us8[i] <= 0) {
            printf("  failed\n");
            continue;
        }
        const double score = us1[0] > 0 ? us1[i] / us1[0] + us8[i] / us8[0] : 2;
        printf("  err %.1e  batch 1 %9.1f us  batch 8 %9.1f us  (%.3f of the current)%s\n", err[i], us1[i], us8[i],
               score / 2, i == 0 ? " current" : "");
        fflush(stdout);
        if (best < 0 || score < best_score) {
            best = i;
            best_score = score;
        }
    }
    clmla_context_set_latent_tuning(r.ctx, NULL);
    if (best < 0) {
        fprintf(stderr, "clmla tune: no candidate ran correctly\n");
        goto done;
    }
    printf("\n%.0f s; best: ", kt_now() - start);
    kt_print(&cands[best], r.rows, decoded);
    printf("\n      batch 1 %.1f us, batch 8 %.1f us against %.1f and %.1f with the current parameters (%s)\n",
           us1[best], us8[best], us1[0], us8[0], base_source);
    /* A grid's best on a shared machine may owe its place to the moment it ran: timed again beside
       the current parameters, alternated, it is kept only if it is still at least as fast. */
    if (best != 0) {
        double c1[2][3], c8[2][3];
        for (int round = 0; round < 3; round++)
            for (int w = 0; w < 2; w++) {
                kt_case tim;
                if (clmla_context_set_latent_tuning(r.ctx, &cands[w ? best : 0]) != CLMLA_SUCCESS ||
                    kt_case_make(&r, &tim, 8, time_len)) {
                    fprintf(stderr, "clmla tune: %s\n", clmla_last_error(r.ctx));
                    goto done;
                }
                c1[w][round] = kt_time(&r, &tim, 1);
                c8[w][round] = kt_time(&r, &tim, 8);
                kt_case_free(&tim);
            }
        clmla_context_set_latent_tuning(r.ctx, NULL);
        for (int w = 0; w < 2; w++) {
            qsort(c1[w], 3, sizeof(double), kt_cmp);
            qsort(c8[w], 3, sizeof(double), kt_cmp);
        }
        const double confirmed = (c1[1][1] / c1[0][1] + c8[1][1] / c8[0][1]) / 2;
        printf("confirmation (3 alternations, medians): batch 1 %.1f us, batch 8 %.1f us against %.1f and %.1f: "
               "%.3f of the current, %s\n",
               c1[1][1], c8[1][1], c1[0][1], c8[0][1], confirmed, confirmed <= 1.0 ? "kept" : "the current parameters kept");
        if (confirmed > 1.0)
            best = 0;
        else {
            us1[best] = c1[1][1], us8[best] = c8[1][1];
            us1[0] = c1[0][1], us8[0] = c8[0][1];
        }
    }
    rc = 0;
    *chosen = cands[best];
    if (!dry_run) {
        char note[256];
        snprintf(note, sizeof(note), "ctx %d: batch 1 %.1f us, batch 8 %.1f us; current (%s) %.1f, %.1f us", r.ctx_len,
                 us1[best], us8[best], base_source, us1[0], us8[0]);
        if (clmla_latent_tuning_save(path, &info, r.heads, &cands[best], note) != CLMLA_SUCCESS) {
            fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
            rc = 1;
        } else
            printf("saved to %s\n", path);
    }
done:
    if (r.ckv)
        clReleaseMemObject(r.ckv);
    if (r.kr)
        clReleaseMemObject(r.kr);
    free(r.h_ckv);
    free(r.h_kr);
    clmla_context_set_latent_tuning(r.ctx, NULL);
    clmla_context_destroy(r.ctx);
    return rc;
}

/* ---- clmla tune --kernels --products: the product kernels' parameters ---------------------------- */

/* One projection shape the products are timed on, with its weights in each dtype. */
typedef struct pt_shape {
    const char *name;
    int n, k;
} pt_shape;

/* A weight of one shape and dtype: the tensor handed to clmla_linear_create and, for the float64
   reference, the values it holds (after conversion to the dtype). */
typedef struct pt_weight {
    const pt_shape *shape;
    clmla_dtype dtype;
    void *codes;    /* the tensor's data */
    float *scales;  /* fp8 block scales */
    double *values; /* [n, k] what the device should read */
} pt_weight;

static const char *pt_dtype_name(clmla_dtype d)
{
    return d == CLMLA_DTYPE_F32 ? "f32" : d == CLMLA_DTYPE_BF16 ? "bf16" : d == CLMLA_DTYPE_FP8_E4M3 ? "fp8" : "f16";
}

static void pt_weight_free(pt_weight *w)
{
    free(w->codes);
    free(w->scales);
    free(w->values);
    memset(w, 0, sizeof(*w));
}

/* Random weights in [-1, 1] of the shape in the dtype; fp8: a checkpoint's codes, the nearest e4m3
   to 448 times such a weight (each block's largest near 448, as DeepSeek's scales make it, so that
   subnormal codes are as rare as there: random codes would make one in 16 subnormal, whose cost on
   some CPUs depends on the decoder, cl/prelude.cl), and block scales in [0.5, 1.5]; 0 on success. */
static int pt_weight_make(pt_weight *w, const pt_shape *shape, clmla_dtype dtype, uint32_t seed)
{
    memset(w, 0, sizeof(*w));
    w->shape = shape;
    w->dtype = dtype;
    const size_t n = (size_t)shape->n, k = (size_t)shape->k, count = n * k;
    const size_t eb = dtype == CLMLA_DTYPE_F32 ? 4 : dtype == CLMLA_DTYPE_FP8_E4M3 ? 1 : 2;
    const size_t sr = (n + 127) / 128, sc = (k + 127) / 128;
    w->codes = malloc(count * eb);
    w->values = malloc(count * sizeof(double));
    if (dtype == CLMLA_DTYPE_FP8_E4M3)
        w->scales = malloc(sr * sc * sizeof(float));
    if (!w->codes || !w->values || (dtype == CLMLA_DTYPE_FP8_E4M3 && !w->scales)) {
        pt_weight_free(w);
        return -1;
    }
    for (size_t i = 0; dtype == CLMLA_DTYPE_FP8_E4M3 && i < sr * sc; i++)
        w->scales[i] = 0.5f + 0.5f * (kt_rand(&seed) + 1.0f);
    for (size_t i = 0; i < count; i++) {
        const float v = kt_rand(&seed);
        if (dtype == CLMLA_DTYPE_F32) {
            ((float *)w->codes)[i] = v;
            w->values[i] = v;
        } else if (dtype == CLMLA_DTYPE_BF16) {
            uint32_t bits;
            memcpy(&bits, &v, 4);
            bits &= 0xffff0000u; /* truncated: what the device reads is what the reference uses */
            ((uint16_t *)w->codes)[i] = (uint16_t)(bits >> 16);
            float back;
            memcpy(&back, &bits, 4);
            w->values[i] = back;
        } else {
            const uint8_t c = (uint8_t)mla_ref_encode_e4m3(mla_ref_round_e4m3(448.0 * (double)v));
            ((uint8_t *)w->codes)[i] = c;
            w->values[i] = mla_ref_decode_e4m3(c) * w->scales[(i / k / 128) * sc + (i % k) / 128];
        }
    }
    return 0;
}

typedef struct pt_run {
    clmla_context *ctx;
    int reps;
    float *h_x, *h_y; /* [max rows, max k], [max rows, max n] */
    cl_mem x, y;
} pt_run;

/* The largest error of rows `check` (count of them) of y = x W^T against float64, relative to the
   sum of |x_i w_i| of its element; negative when the product fails. Times are the median of reps
   calls (after one, which builds the kernels), in microseconds, in *us. */
static double pt_measure(pt_run *r, const pt_weight *w, int m, double *us)
{
    const size_t n = (size_t)w->shape->n, k = (size_t)w->shape->k;
    clmla_tensor t;
    memset(&t, 0, sizeof(t));
    t.data = w->codes;
    t.ndim = 2;
    t.shape[0] = (int64_t)n;
    t.shape[1] = (int64_t)k;
    t.dtype = w->dtype;
    t.scale = w->scales;
    clmla_linear *lin = NULL;
    *us = -1;
    if (clmla_linear_create(r->ctx, &t, &lin) != CLMLA_SUCCESS)
        return -1;
    cl_command_queue q = clmla_context_queue(r->ctx);
    double worst = -1;
    if (clmla_linear_forward_cl(lin, m, r->x, 0, r->y, 0, NULL) == CLMLA_SUCCESS &&
        clEnqueueReadBuffer(q, r->y, CL_TRUE, 0, (size_t)m * n * sizeof(float), r->h_y, 0, NULL, NULL) == CL_SUCCESS) {
        worst = 0;
        const int rows[] = {0, 1, 2, m / 2, m - 2, m - 1};
        for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++) {
            const int i = rows[ri];
            if (i < 0 || i >= m)
                continue;
            const float *x = r->h_x + (size_t)i * k;
            for (size_t j = 0; j < n; j++) {
                const double *wr = w->values + j * k;
                double ref = 0, mag = 1e-30;
                for (size_t c = 0; c < k; c++) {
                    ref += (double)x[c] * wr[c];
                    mag += fabs((double)x[c] * wr[c]);
                }
                const double e = fabs(r->h_y[(size_t)i * n + j] - ref) / mag;
                worst = e > worst ? e : worst;
            }
        }
    }
    if (worst >= 0 && worst <= 1e-5) {
        double t_us[32];
        const int reps = r->reps < 32 ? r->reps : 32;
        for (int i = 0; i < reps; i++) {
            const double t0 = kt_now();
            if (clmla_linear_forward_cl(lin, m, r->x, 0, r->y, 0, NULL) != CLMLA_SUCCESS || clFinish(q) != CL_SUCCESS) {
                worst = -1;
                break;
            }
            t_us[i] = (kt_now() - t0) * 1e6;
        }
        if (worst >= 0) {
            qsort(t_us, (size_t)reps, sizeof(double), kt_cmp);
            *us = t_us[reps / 2];
        }
    }
    clmla_linear_destroy(lin);
    return worst;
}

static void pt_print(const clmla_product_tuning *t, int tiled, int cpu)
{
    if (tiled)
        printf("tiled_rows=%-3d tiled_columns=%-3d tiled_weight_rows=%d", t->tiled_rows, t->tiled_columns,
               t->tiled_weight_rows);
    else if (cpu)
        printf("cpu_items_per_cu=%-2d packed_streams_1=%d cpu_fp8_block_sums=%d cpu_wide=%d cpu_min_panel=%-3d",
               t->cpu_items_per_cu, t->packed_streams_1, t->cpu_fp8_block_sums, t->cpu_wide, t->cpu_min_panel);
    else
        printf("skinny_items=%-4d skinny_unroll=%d skinny_columns=%d skinny_vector=%-2d skinny_aligned=%d",
               t->skinny_items, t->skinny_unroll, t->skinny_columns, t->skinny_vector, t->skinny_aligned);
}

/* The grid of one search, around `base`: the skinny kernels' (CPU or GPU) or the tiles'. `base`
   first, then base with the searched fields at their defaults (where that differs), then the grid. */
static int pt_grid(const clmla_product_tuning *base, int tiled, int cpu, int quick, clmla_product_tuning *out, int most)
{
    clmla_product_tuning d, t = *base;
    clmla_product_tuning_defaults(&d);
    if (tiled) {
        t.tiled_rows = d.tiled_rows;
        t.tiled_columns = d.tiled_columns;
        t.tiled_weight_rows = d.tiled_weight_rows;
    } else if (cpu) {
        t.cpu_items_per_cu = d.cpu_items_per_cu;
        t.packed_streams_1 = d.packed_streams_1;
    } else {
        t.skinny_items = d.skinny_items;
        t.skinny_unroll = d.skinny_unroll;
        t.skinny_columns = d.skinny_columns;
        t.skinny_vector = d.skinny_vector;
        t.skinny_aligned = d.skinny_aligned;
    }
    int n = 0;
    out[n++] = *base;
    if (memcmp(&t, base, sizeof(t)) != 0)
        out[n++] = t;
#define PT_ADD()                                                                                                 \
    do {                                                                                                         \
        int seen = 0;                                                                                            \
        for (int s_ = 0; s_ < n; s_++)                                                                           \
            seen |= memcmp(&out[s_], &t, sizeof(t)) == 0;                                                        \
        if (!seen && n < most && clmla_product_tuning_check(&t, NULL) == CLMLA_SUCCESS)                          \
            out[n++] = t;                                                                                        \
    } while (0)
    if (tiled) {
        static const int trs[] = {128, 256}, tcs[] = {24, 48, 96}, mcs[] = {2, 3, 4};
        static const int quick_grid[][3] = {{128, 48, 3}, {256, 96, 3}, {256, 48, 2}};
        if (quick)
            for (int i = 0; i < 3; i++) {
                t = *base;
                t.tiled_rows = quick_grid[i][0];
                t.tiled_columns = quick_grid[i][1];
                t.tiled_weight_rows = quick_grid[i][2];
                PT_ADD();
            }
        else
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 3; b++)
                    for (int c = 0; c < 3; c++) {
                        t = *base;
                        t.tiled_rows = trs[a];
                        t.tiled_columns = tcs[b];
                        t.tiled_weight_rows = mcs[c];
                        PT_ADD();
                    }
    } else if (cpu) {
        static const int items[] = {4, 8, 16}, streams[] = {4, 6, 8};
        static const int quick_grid[][2] = {{4, 8}, {8, 4}};
        if (quick)
            for (int i = 0; i < 2; i++) {
                t = *base;
                t.cpu_items_per_cu = quick_grid[i][0];
                t.packed_streams_1 = quick_grid[i][1];
                PT_ADD();
            }
        else {
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 3; b++) {
                    t = *base;
                    t.cpu_items_per_cu = items[a];
                    t.packed_streams_1 = streams[b];
                    PT_ADD();
                }
            t = *base; /* fp8's block sums the other way (only fp8 weights at 1 and 2 rows differ) */
            t.cpu_fp8_block_sums = !base->cpu_fp8_block_sums;
            PT_ADD();
            t = *base; /* the line-wide form the other way (bf16 and fp8 at 1 row) */
            t.cpu_wide = !base->cpu_wide;
            PT_ADD();
            t = *base; /* a floor of 128 rows on a panel, or none (products of few weight rows) */
            t.cpu_min_panel = base->cpu_min_panel ? 0 : 128;
            PT_ADD();
        }
    } else {
        static const int items[] = {64, 128, 256}, unroll[] = {1, 2, 4}, columns[] = {2, 4, 8};
        static const int quick_grid[][4] = {{256, 2, 4, 4}, {128, 4, 4, 4}, {128, 2, 8, 4}, {128, 2, 4, 16}};
        if (quick)
            for (int i = 0; i < 4; i++) {
                t = *base;
                t.skinny_items = quick_grid[i][0];
                t.skinny_unroll = quick_grid[i][1];
                t.skinny_columns = quick_grid[i][2];
                t.skinny_vector = quick_grid[i][3];
                PT_ADD();
            }
        else { /* the grid at 4 values per load, then wider loads with the base's other values */
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 3; b++)
                    for (int c = 0; c < 3; c++) {
                        t = *base;
                        t.skinny_vector = 4;
                        t.skinny_items = items[a];
                        t.skinny_unroll = unroll[b];
                        t.skinny_columns = columns[c];
                        PT_ADD();
                    }
            for (int w = 8; w <= 16; w *= 2) {
                t = *base;
                t.skinny_vector = w;
                PT_ADD();
            }
            for (int w = 4; w <= 16; w *= 2) { /* and read as whole vectors (the shapes' rows are aligned) */
                t = *base;
                t.skinny_vector = w;
                t.skinny_aligned = !base->skinny_aligned;
                PT_ADD();
            }
        }
    }
#undef PT_ADD
    return n;
}

/* One search over a grid for one shape class: every candidate on every (shape, dtype) at m rows,
   checked then timed; the index of the best (the lowest mean of its times relative to the first
   candidate's, the current parameters), -1 when none ran. */
static int pt_search(pt_run *r, const char *what, pt_weight *ws, int nw, int m, const clmla_product_tuning *cands,
                     int n, int tiled, int cpu, double *best_ratio, double *cur_us, double *best_us)
{
    double us0[16] = {0};
    int best = -1;
    *best_ratio = 0;
    printf("\n%s: %d rows, %d candidates on", what, m, n);
    for (int w = 0; w < nw; w++)
        printf("%s %s %s (%d x %d)", w ? "," : "", ws[w].shape->name, pt_dtype_name(ws[w].dtype), ws[w].shape->n,
               ws[w].shape->k);
    printf("\n");
    for (int i = 0; i < n; i++) {
        printf("[%2d/%d] ", i + 1, n);
        pt_print(&cands[i], tiled, cpu);
        fflush(stdout);
        if (clmla_context_set_product_tuning(r->ctx, &cands[i]) != CLMLA_SUCCESS) {
            printf("  refused: %s\n", clmla_last_error(r->ctx));
            continue;
        }
        double us[16] = {0}, ratio = 0;
        int ok = 1;
        for (int w = 0; w < nw && ok; w++) {
            const double err = pt_measure(r, &ws[w], m, &us[w]);
            if (err < 0 || err > 1e-5 || us[w] <= 0) {
                printf("  refused: %s %s %s\n", ws[w].shape->name, pt_dtype_name(ws[w].dtype),
                       err < 0 ? clmla_last_error(r->ctx) : "wrong result");
                if (err > 1e-5)
                    printf("         relative error %.2e against float64\n", err);
                ok = 0;
            }
        }
        if (!ok) {
            if (i == 0)
                return -1; /* the current parameters must run to compare against */
            continue;
        }
        if (i == 0)
            memcpy(us0, us, sizeof(us0));
        for (int w = 0; w < nw; w++) {
            ratio += us[w] / us0[w] / nw;
            printf("  %.0f", us[w]);
        }
        printf(" us  (%.3f of the current)%s\n", ratio, i == 0 ? " current" : "");
        fflush(stdout);
        if (best < 0 || ratio < *best_ratio) {
            best = i;
            *best_ratio = ratio;
            for (int w = 0; w < nw; w++)
                best_us[w] = us[w];
        }
    }
    for (int w = 0; w < nw; w++)
        cur_us[w] = us0[w];
    return best;
}

/* ---- a layer with random weights, for the parameters that have no public call of their own ------ */

typedef struct tune_layer {
    cli_random_layer rl; /* the weights, and as the layer holds them for the reference */
    int made, D;
    float *h_x, *h_out;  /* inputs; outputs read back */
    double *ref;         /* the reference's outputs */
    cl_mem x, out;       /* the steps' inputs and outputs on the device */
    clmla_cache *cache;
} tune_layer;

static void tune_layer_free(tune_layer *t)
{
    clmla_cache_destroy(t->cache);
    if (t->x)
        clReleaseMemObject(t->x);
    if (t->out)
        clReleaseMemObject(t->out);
    if (t->made)
        cli_random_layer_free(&t->rl);
    free(t->h_x);
    free(t->h_out);
    free(t->ref);
    memset(t, 0, sizeof(*t));
}

/* The layer of `preset` with weights kept as `want` (drawn from seed), `rows` random inputs, room
   for `out_rows` outputs on the host and `dev_rows` rows of inputs and outputs on the device, and
   the reference's outputs for the first ref_rows inputs as one step by path ref_path (MLA_REF_*);
   0 or -1 (said). The device's inputs are left to the caller. */
static int tune_layer_make(tune_layer *t, clmla_context *ctx, const char *name, clmla_preset preset,
                           clmla_weights_dtype want, uint64_t seed, int rows, int out_rows, int dev_rows, int ref_rows,
                           int ref_path)
{
    memset(t, 0, sizeof(*t));
    uint64_t rng = seed;
    if (cli_random_layer_make(&t->rl, preset, want, &rng) != 0) {
        fprintf(stderr, "clmla tune: out of host memory for the %s layer\n", name);
        return -1;
    }
    t->made = 1;
    const int D = t->D = t->rl.cfg.hidden_size;
    t->h_x = cli_random_floats((size_t)rows * D, 1.0f, 0, &rng);
    t->h_out = malloc((size_t)out_rows * D * sizeof(float));
    t->ref = malloc((size_t)ref_rows * D * sizeof(double));
    cl_int err = CL_SUCCESS;
    const size_t bytes = (size_t)dev_rows * D * sizeof(float);
    t->x = clCreateBuffer(clmla_context_cl_context(ctx), CL_MEM_READ_WRITE, bytes, NULL, &err);
    t->out = clCreateBuffer(clmla_context_cl_context(ctx), CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (!t->h_x || !t->h_out || !t->ref || !t->x || !t->out) {
        fprintf(stderr, "clmla tune: out of memory for the %s layer\n", name);
        return -1;
    }
    if (mla_ref_forward(&t->rl.rcfg, &t->rl.rw_held, ref_rows, t->h_x, ref_path, t->ref, NULL, NULL, NULL, NULL, NULL,
                        NULL) != 0) {
        fprintf(stderr, "clmla tune: the reference could not run the %s layer\n", name);
        return -1;
    }
    return 0;
}

/* ---- the per-head absorption's K split (gemm_skinny_nn on the work-group forms) ----------------
   The W^UK product of the absorbed path, x B with K = qk_nope_head_dim per head, has no public call
   of its own, so its parameters (skinny_nn_items, skinny_nn_slices) are timed where it runs: decode
   steps of a layer with random weights, each candidate's first step checked against the float64
   reference before it is timed. */

#define NN_PREFIX 15 /* tokens in the cache before the timed steps */
#define NN_BATCH 8   /* the most sequences of a timed step */

typedef struct nn_layer {
    const char *name;
    tune_layer t;          /* inputs [NN_PREFIX + 1, D]; h_out [D], a step's output; x, out [NN_BATCH, D] */
    clmla_layer *layer;
    int32_t seq[NN_BATCH]; /* forks of one prefilled sequence, NN_PREFIX tokens each between uses */
    int batches;
} nn_layer;

static void nn_free(nn_layer *n)
{
    clmla_layer_destroy(n->layer);
    tune_layer_free(&n->t);
    memset(n, 0, sizeof(*n));
}

/* The layer of `preset` with weights kept as `want`, an f32 cache holding NN_PREFIX tokens of
   random inputs in NN_BATCH sequences, and the reference's output for the next token; 0 or -1 (said). */
static int nn_make(nn_layer *n, clmla_context *ctx, const char *name, clmla_preset preset, clmla_weights_dtype want,
                   int batches)
{
    memset(n, 0, sizeof(*n));
    n->name = name;
    n->batches = batches;
    const int T = NN_PREFIX + 1;
    if (tune_layer_make(&n->t, ctx, name, preset, want, 0x5DEECE66DULL + (uint64_t)preset, T, 1, NN_BATCH, T,
                        MLA_REF_ABSORBED) != 0)
        return -1;
    const clmla_layer_config *cfg = &n->t.rl.cfg;
    const int D = n->t.D;
    /* every timed row is the last input: the steps differ only in where they sit */
    for (int b = 0; b < NN_BATCH; b++)
        if (clEnqueueWriteBuffer(clmla_context_queue(ctx), n->t.x, CL_TRUE, (size_t)b * D * sizeof(float),
                                 (size_t)D * sizeof(float), n->t.h_x + (size_t)NN_PREFIX * D, 0, NULL, NULL) != CL_SUCCESS) {
            fprintf(stderr, "clmla tune: cannot write the %s layer's inputs\n", name);
            return -1;
        }
    /* a block each for the prefix's sequence and every fork's copy of it, and for the warm-up */
    const int bt = 64, steps = 64;
    const clmla_cache_config cc = {1, cfg->kv_lora_rank, cfg->qk_rope_head_dim, bt,
                                   (NN_BATCH + 1) * ((NN_PREFIX + steps) / bt + 2) + CLMLA_WARMUP_TOKENS / bt + 2,
                                   CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
    int32_t prefix = -1;
    clmla_batch_entry e = {0, NN_PREFIX};
    const clmla_forward_args args = {&e, 1, 0, CLMLA_PATH_AUTO};
    float *scratch = malloc((size_t)NN_PREFIX * D * sizeof(float));
    int ok = scratch && clmla_layer_create(ctx, cfg, &n->t.rl.w, &n->layer) == CLMLA_SUCCESS &&
             clmla_cache_create(ctx, &cc, &n->t.cache) == CLMLA_SUCCESS &&
             clmla_cache_seq_add(n->t.cache, &prefix) == CLMLA_SUCCESS;
    e.seq_id = prefix;
    ok = ok && clmla_layer_forward(n->layer, n->t.cache, &args, n->t.h_x, scratch) == CLMLA_SUCCESS;
    for (int b = 0; b < NN_BATCH && ok; b++)
        ok = clmla_cache_seq_fork(n->t.cache, prefix, &n->seq[b]) == CLMLA_SUCCESS;
    ok = ok && clmla_cache_seq_free(n->t.cache, prefix) == CLMLA_SUCCESS;
    free(scratch);
    if (!ok) {
        fprintf(stderr, "clmla tune: the %s layer: %s\n", name, clmla_last_error(ctx));
        return -1;
    }
    return 0;
}

/* One candidate on one layer: the next token's output at batch 1 against the reference (its
   largest relative error in *err), then the median microseconds of reps steps of 1 and, where the
   layer takes them, NN_BATCH sequences (us[0], us[1]); every sequence is cut back to the prefix
   after. 0, or -1 when a step fails. */
static int nn_measure(nn_layer *n, clmla_context *ctx, int reps, double *err, double *us)
{
    cl_command_queue q = clmla_context_queue(ctx);
    clmla_batch_entry e[NN_BATCH];
    for (int b = 0; b < NN_BATCH; b++) {
        e[b].seq_id = n->seq[b];
        e[b].num_tokens = 1;
    }
    clmla_forward_args args = {e, 1, 0, CLMLA_PATH_ABSORBED};
    int ok = clmla_layer_forward_cl(n->layer, n->t.cache, &args, n->t.x, 0, n->t.out, 0, NULL) == CLMLA_SUCCESS &&
             clEnqueueReadBuffer(q, n->t.out, CL_TRUE, 0, (size_t)n->t.D * sizeof(float), n->t.h_out, 0, NULL, NULL) ==
                 CL_SUCCESS;
    *err = ok ? mla_ref_max_rel_err(n->t.h_out, n->t.ref + (size_t)NN_PREFIX * n->t.D, (size_t)n->t.D, NULL) : -1;
    reps = reps < 32 ? reps : 32;
    for (int k = 0; k < n->batches && ok; k++) {
        args.num_entries = k ? NN_BATCH : 1;
        double t[32];
        for (int i = -1; i < reps && ok; i++) { /* -1: builds the kernels of this many rows */
            const double t0 = kt_now();
            ok = clmla_layer_forward_cl(n->layer, n->t.cache, &args, n->t.x, 0, n->t.out, 0, NULL) == CLMLA_SUCCESS &&
                 clFinish(q) == CL_SUCCESS;
            if (i >= 0)
                t[i] = (kt_now() - t0) * 1e6;
        }
        for (int b = 0; b < NN_BATCH && ok; b++)
            ok = clmla_cache_seq_truncate(n->t.cache, n->seq[b], NN_PREFIX) == CLMLA_SUCCESS;
        if (ok) {
            qsort(t, (size_t)reps, sizeof(double), kt_cmp);
            us[k] = t[reps / 2];
        }
    }
    for (int b = 0; b < NN_BATCH; b++)
        clmla_cache_seq_truncate(n->t.cache, n->seq[b], NN_PREFIX);
    return ok ? 0 : -1;
}

/* The candidates' skinny_nn_items and skinny_nn_slices on top of base, the current ones first. */
static int nn_grid(const clmla_product_tuning *base, int quick, clmla_product_tuning *out, int most)
{
    static const int items[] = {64, 128, 256}, slices[] = {1, 4, 8, 16, 32};
    static const int quick_grid[][2] = {{64, 8}, {64, 16}};
    int n = 0;
    out[n++] = *base;
    for (int a = 0; a < (quick ? 2 : 3); a++)
        for (int b = 0; b < (quick ? 1 : 5) && n < most; b++) {
            clmla_product_tuning t = *base;
            t.skinny_nn_items = quick ? quick_grid[a][0] : items[a];
            t.skinny_nn_slices = quick ? quick_grid[a][1] : slices[b];
            if (t.skinny_nn_slices > t.skinny_nn_items ||
                (t.skinny_nn_items == base->skinny_nn_items && t.skinny_nn_slices == base->skinny_nn_slices))
                continue;
            out[n++] = t;
        }
    return n;
}

/* Searches the grid on the layers; the index of the fastest candidate by the mean of its times'
   ratios to the first's (-1 when the first fails), its ratio in *best_ratio. */
static int nn_search(clmla_context *ctx, nn_layer *layers, int nl, int reps, const clmla_product_tuning *cands, int n,
                     double *best_ratio)
{
    double us0[4][2];
    int best = -1;
    printf("\nper-head absorption x W^UK (gemm_skinny_nn, K %d) in a decode step, %d candidates on",
           layers[0].t.rl.cfg.qk_nope_head_dim, n);
    for (int l = 0; l < nl; l++)
        printf("%s %s (%d heads, weights %s)", l ? "," : "", layers[l].name, layers[l].t.rl.cfg.num_heads,
               clmla_dtype_name(layers[l].t.rl.held));
    printf(": step times in us at batch 1%s\n", layers[0].batches > 1 ? " and 8" : "");
    for (int i = 0; i < n; i++) {
        printf("[%2d/%d] skinny_nn_items=%-3d skinny_nn_slices=%-2d", i + 1, n, cands[i].skinny_nn_items,
               cands[i].skinny_nn_slices);
        fflush(stdout);
        if (clmla_context_set_product_tuning(ctx, &cands[i]) != CLMLA_SUCCESS) {
            printf("  refused: %s\n", clmla_last_error(ctx));
            if (i == 0)
                return -1;
            continue;
        }
        double us[4][2] = {{0}}, ratio = 0, worst = 0;
        int ok = 1, terms = 0;
        for (int l = 0; l < nl && ok; l++) {
            double err = -1;
            ok = nn_measure(&layers[l], ctx, reps, &err, us[l]) == 0 && err >= 0 && err <= 1e-4;
            worst = err > worst ? err : worst;
            if (!ok)
                printf("  refused: %s %s\n", layers[l].name,
                       err < 0 ? clmla_last_error(ctx) : "wrong result against float64");
        }
        if (!ok) {
            if (i == 0)
                return -1; /* the current parameters must run to compare against */
            continue;
        }
        if (i == 0)
            memcpy(us0, us, sizeof(us0));
        for (int l = 0; l < nl; l++)
            for (int k = 0; k < layers[l].batches; k++) {
                printf("  %.0f", us[l][k]);
                ratio += us[l][k] / us0[l][k];
                terms++;
            }
        ratio /= terms;
        printf("  err %.1e  (%.3f of the current)%s\n", worst, ratio, i == 0 ? " current" : "");
        fflush(stdout);
        if (best < 0 || ratio < *best_ratio) {
            best = i;
            *best_ratio = ratio;
        }
    }
    return best;
}

/* The K split of the per-head absorption for the "small" entry, on top of *best (updated): V2-Lite
   in bf16 and V3 in fp8 (as published), or V2-Lite in fp8 alone with quick. 0, or 1 (said). */
static int tune_nn(clmla_context *ctx, int quick, int reps, clmla_product_tuning *best, double *ratio)
{
    nn_layer layers[2];
    const int nl = quick ? 1 : 2;
    memset(layers, 0, sizeof(layers));
    int rc = nn_make(&layers[0], ctx, "v2-lite", CLMLA_PRESET_DEEPSEEK_V2_LITE,
                     quick ? CLMLA_WEIGHTS_FP8 : CLMLA_WEIGHTS_BF16, quick ? 1 : 2) != 0;
    if (!rc && !quick)
        rc = nn_make(&layers[1], ctx, "v3", CLMLA_PRESET_DEEPSEEK_V3, CLMLA_WEIGHTS_FP8, 2) != 0;
    *ratio = 1;
    if (!rc) {
        clmla_product_tuning cands[16];
        const int n = nn_grid(best, quick, cands, 16);
        const int b = nn_search(ctx, layers, nl, reps, cands, n, ratio);
        if (b < 0) {
            fprintf(stderr, "clmla tune: the current per-head parameters fail: %s\n", clmla_last_error(ctx));
            rc = 1;
        } else if (b > 0) { /* timed again beside the current ones, so that a noisy win is not saved */
            clmla_product_tuning pair[2] = {cands[0], cands[b]};
            double again = 1;
            printf("confirmation:");
            if (nn_search(ctx, layers, nl, reps, pair, 2, &again) == 1) {
                *ratio = again;
                *best = cands[b];
            } else
                *ratio = 1;
        }
        if (!rc)
            printf("best: skinny_nn_items=%d skinny_nn_slices=%d (%.3f of the current)\n", best->skinny_nn_items,
                   best->skinny_nn_slices, *ratio);
    }
    for (int l = 0; l < nl; l++)
        nn_free(&layers[l]);
    clmla_context_set_product_tuning(ctx, NULL);
    return rc;
}

static int tune_products(const char *device, int quick, int dry_run, const char *out)
{
    char path[4096];
    const int bad = kernel_tuning_target(out, dry_run, path, sizeof(path));
    if (bad)
        return bad;
    pt_run r;
    memset(&r, 0, sizeof(r));
    if (cli_context_create(device, &r.ctx) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    clmla_device_info info;
    clmla_context_device(r.ctx, &info);
    const int cpu = cli_runs_row_products(&info);
    r.reps = quick ? 3 : 7;
    /* V2-Lite's and V3's projections (docs/MLA.md): the fused q / kv_a product and o_proj of
       V2-Lite, V3's q_b_proj (K 1536), its fused q_a / kv_a product (K 7168) and its kv_a_proj
       alone (576 rows: the product of few rows that cpu_min_panel is for). */
    static const pt_shape small_full[] = {{"v2-lite q+kv_a", 3648, 2048}, {"v2-lite o_proj", 2048, 2048},
                                          {"v3 q_b", 24576, 1536}};
    static const pt_shape large_full[] = {{"v3 q_a+kv_a", 2112, 7168}, {"v3 kv_a", 576, 7168}};
    static const pt_shape small_quick[] = {{"v2-lite o_proj", 2048, 2048}};
    static const clmla_dtype dtypes_full[] = {CLMLA_DTYPE_F32, CLMLA_DTYPE_BF16, CLMLA_DTYPE_FP8_E4M3};
    const int classes = quick ? 1 : 2, ndt = quick ? 2 : 3;
    const int tiled_m = quick ? 128 : 512;
    const size_t max_k = quick ? 2048 : 7168, max_n = quick ? 2048 : 24576;
    r.h_x = malloc((size_t)tiled_m * max_k * sizeof(float));
    r.h_y = malloc((size_t)tiled_m * max_n * sizeof(float));
    int rc = 1;
    if (!r.h_x || !r.h_y) {
        fprintf(stderr, "clmla tune: out of host memory\n");
        goto done;
    }
    uint32_t seed = 31337;
    for (size_t i = 0; i < (size_t)tiled_m * max_k; i++)
        r.h_x[i] = kt_rand(&seed);
    cl_context clctx = clmla_context_cl_context(r.ctx);
    cl_int err = CL_SUCCESS;
    r.x = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (size_t)tiled_m * max_k * sizeof(float), r.h_x,
                         &err);
    r.y = clCreateBuffer(clctx, CL_MEM_READ_WRITE, (size_t)tiled_m * max_n * sizeof(float), NULL, &err);
    if (!r.x || !r.y) {
        fprintf(stderr, "clmla tune: cannot allocate the products' buffers\n");
        goto done;
    }
    printf("tuning the product kernels on %s (%s, %s, driver %s): %s\n", info.name, info.vendor, info.platform_name,
           info.driver_version,
           cpu ? "gemm_packed_rows at 1 row, gemm_tiled_rows at prefill rows" : "gemm_skinny_nt at 1 row");
    const double start = kt_now();
    rc = 0;
    for (int cls = 0; cls < classes && rc == 0; cls++) {
        const pt_shape *shapes = quick ? small_quick : cls == 0 ? small_full : large_full;
        const int nshapes = quick ? 1 : cls == 0 ? 3 : 2;
        const size_t k_of_class = cls == 0 ? 2048 : 7168;
        pt_weight ws[16];
        int nw = 0;
        for (int s = 0; s < nshapes && rc == 0; s++)
            for (int d = 0; d < ndt && rc == 0; d++) {
                if (pt_weight_make(&ws[nw], &shapes[s], dtypes_full[d], 1000u + (uint32_t)(7 * s + d))) {
                    fprintf(stderr, "clmla tune: out of host memory for the weights\n");
                    rc = 1;
                } else
                    nw++;
            }
        clmla_product_tuning current, cands[40], best;
        const char *source = NULL;
        if (clmla_product_tuning_lookup(&info, k_of_class, &current, &source) != CLMLA_SUCCESS)
            printf("warning: %s\n", clmla_last_error(NULL));
        printf("\nK %s 4096 (k_class \"%s\"): current parameters from %s\n", cls == 0 ? "<=" : ">",
               cls == 0 ? "small" : "large", source);
        best = current;
        double ratio = 0, cur_us[16], best_us[16], tcur_us[16], tbest_us[16], tratio = 1;
        int n = rc == 0 ? pt_grid(&current, 0, cpu, quick, cands, 40) : 0;
        const int b = n ? pt_search(&r, cpu ? "decode products (gemm_packed_rows)" : "decode products (gemm_skinny_nt)",
                                    ws, nw, 1, cands, n, 0, cpu, &ratio, cur_us, best_us)
                        : -1;
        if (rc == 0 && b < 0) {
            fprintf(stderr, "clmla tune: the current parameters fail: %s\n", clmla_last_error(r.ctx));
            rc = 1;
        }
        if (rc == 0 && b > 0) { /* timed again beside the current ones, so that a noisy win is not saved */
            clmla_product_tuning pair[2] = {current, cands[b]};
            double again = 0, c_us[16], b_us[16];
            if (pt_search(&r, "confirmation", ws, nw, 1, pair, 2, 0, cpu, &again, c_us, b_us) == 1) {
                ratio = again;
                best = cands[b];
            } else
                ratio = 1;
        }
        if (rc == 0) {
            printf("best: ");
            pt_print(&best, 0, cpu);
            printf(" (%.3f of the current)\n", ratio);
        }
        /* the per-head absorption's K split, on the work-group forms (K = 128: the small class) */
        double nn_ratio = 0;
        if (rc == 0 && !cpu && cls == 0)
            rc = tune_nn(r.ctx, quick, r.reps, &best, &nn_ratio);
        int tb = -1;
        if (rc == 0 && cpu) {
            clmla_product_tuning tc[32];
            clmla_product_tuning base = best;
            n = pt_grid(&base, 1, cpu, quick, tc, 32);
            /* the tiles on the first shape only (prefill costs a FLOP per weight per row) */
            pt_weight tws[3];
            int ntw = 0;
            for (int w = 0; w < nw; w++)
                if (ws[w].shape == &shapes[0])
                    tws[ntw++] = ws[w];
            tb = pt_search(&r, "prefill products (gemm_tiled_rows)", tws, ntw, tiled_m, tc, n, 1, cpu, &tratio, tcur_us,
                           tbest_us);
            if (tb > 0) { /* timed again beside the current tiles */
                clmla_product_tuning pair[2] = {tc[0], tc[tb]};
                double again = 0, c_us[16], b_us[16];
                if (pt_search(&r, "confirmation", tws, ntw, tiled_m, pair, 2, 1, cpu, &again, c_us, b_us) == 1)
                    tratio = again;
                else {
                    tb = 0;
                    tratio = 1;
                }
            }
            if (tb < 0) {
                fprintf(stderr, "clmla tune: the current tiles fail: %s\n", clmla_last_error(r.ctx));
                rc = 1;
            } else {
                best.tiled_rows = tc[tb].tiled_rows;
                best.tiled_columns = tc[tb].tiled_columns;
                best.tiled_weight_rows = tc[tb].tiled_weight_rows;
                printf("best: ");
                pt_print(&best, 1, cpu);
                printf(" (%.3f of the current)\n", tratio);
            }
        }
        for (int w = 0; w < nw; w++)
            pt_weight_free(&ws[w]);
        if (rc != 0)
            break;
        if (!dry_run) {
            char note[512];
            int len = snprintf(note, sizeof(note), "batch 1: %.3f of the current (%s)", ratio, source);
            if (cpu && tb >= 0 && len > 0 && (size_t)len < sizeof(note))
                snprintf(note + len, sizeof(note) - (size_t)len, "; %d rows: %.3f", tiled_m, tratio);
            len = (int)strlen(note);
            if (nn_ratio > 0 && (size_t)len < sizeof(note))
                snprintf(note + len, sizeof(note) - (size_t)len, "; per-head x W^UK in a decode step: %.3f", nn_ratio);
            if (clmla_product_tuning_save(path, &info, k_of_class, &best, note) != CLMLA_SUCCESS) {
                fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
                rc = 1;
            } else
                printf("saved the \"%s\" entry to %s\n", cls == 0 ? "small" : "large", path);
        }
    }
    printf("\n%.0f s\n", kt_now() - start);
done:
    clmla_context_set_product_tuning(r.ctx, NULL);
    if (r.x)
        clReleaseMemObject(r.x);
    if (r.y)
        clReleaseMemObject(r.y);
    free(r.h_x);
    free(r.h_y);
    clmla_context_destroy(r.ctx);
    return rc;
}

/* ---- clmla tune --kernels --prefill: the decompressed path's attention tiles ---------------------
   The decompressed path's attention has no public call of its own, so its tiles (on devices that
   run the work-group kernels attn_prefill_tiled's prefill_queries, prefill_keys, prefill_chunk, and
   prefill_tiled 0 for attn_prefill; on CPUs attn_prefill_rows's prefill_rows_queries) are timed
   where it runs: prefill steps of a layer with random weights, V2-Lite's at 16 heads and
   V3's at 128 (weights as published, bf16 and fp8; the attention is float32 either way). Each
   candidate's layer is built with it, and its outputs for two chunks (the second after a prefix, so
   that tiles cross both the prefix and the diagonal) are checked against the float64 reference before
   it is timed. Timed: a prompt with no prefix and a chunk after a long prefix, whole steps (the
   products are the same for every candidate, so the ratios understate the kernel's own). */

enum { PF_FIRST = 23, PF_SECOND = 18, PF_CHECK = PF_FIRST + PF_SECOND };

typedef struct pf_run {
    clmla_context *ctx;
    tune_layer t;              /* inputs and device rows [x_rows, D]; h_out and ref [PF_CHECK, D] */
    int prompt, prefix, chunk; /* timed: prompt tokens alone; chunk tokens after prefix */
    int x_rows;
    int rows_kernel;           /* the device runs attn_prefill_rows */
    int32_t seq_prompt, seq_chunk; /* seq_chunk holds the prefix between uses */
} pf_run;

/* One forward step of `tokens` tokens of seq from row `row` of x, on the decompressed path. */
static clmla_status pf_step(pf_run *r, clmla_layer *layer, int32_t seq, int row, int tokens)
{
    clmla_batch_entry e = {seq, tokens};
    const clmla_forward_args args = {&e, 1, 0, CLMLA_PATH_DECOMPRESSED};
    return clmla_layer_forward_cl(layer, r->t.cache, &args, r->t.x, (size_t)row * r->t.D, r->t.out, (size_t)row * r->t.D, NULL);
}

/* The layer, inputs, reference and cache; 0 or -1 (said). */
static int pf_make(pf_run *r, clmla_preset preset, clmla_weights_dtype want)
{
    r->x_rows = r->prompt > r->prefix + r->chunk ? r->prompt : r->prefix + r->chunk;
    r->x_rows = r->x_rows > PF_CHECK ? r->x_rows : PF_CHECK;
    if (tune_layer_make(&r->t, r->ctx, "prefill", preset, want, 0x9E3779B97F4A7C15ULL + (uint64_t)preset, r->x_rows,
                        PF_CHECK, r->x_rows, PF_CHECK, MLA_REF_DECOMPRESSED) != 0)
        return -1;
    const clmla_layer_config *cfg = &r->t.rl.cfg;
    if (clEnqueueWriteBuffer(clmla_context_queue(r->ctx), r->t.x, CL_TRUE, 0, (size_t)r->x_rows * r->t.D * sizeof(float),
                             r->t.h_x, 0, NULL, NULL) != CL_SUCCESS) {
        fprintf(stderr, "clmla tune: cannot write the prefill layer's inputs\n");
        return -1;
    }
    const int bt = 64;
    const int blocks = (PF_CHECK + bt - 1) / bt + (r->prompt + bt - 1) / bt + (r->prefix + r->chunk + bt - 1) / bt +
                       CLMLA_WARMUP_TOKENS / bt + 4;
    const clmla_cache_config cc = {1, cfg->kv_lora_rank, cfg->qk_rope_head_dim, bt, blocks, CLMLA_CACHE_F32, 0,
                                   CLMLA_CACHE_F32};
    r->seq_prompt = r->seq_chunk = -1;
    if (clmla_cache_create(r->ctx, &cc, &r->t.cache) != CLMLA_SUCCESS ||
        clmla_cache_seq_add(r->t.cache, &r->seq_prompt) != CLMLA_SUCCESS ||
        clmla_cache_seq_add(r->t.cache, &r->seq_chunk) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: the cache: %s\n", clmla_last_error(r->ctx));
        return -1;
    }
    return 0;
}

/* The candidate's largest relative error against the reference over both checked chunks (-1: a step
   failed), then (when it is within 1e-4) the median microseconds of reps prompts (us[0]) and chunks
   after the prefix (us[1]). The prefix is written by the first call. 0, or -1 (said). */
static int pf_measure(pf_run *r, const clmla_latent_tuning *t, int reps, double *err, double *us)
{
    *err = -1;
    clmla_layer *layer = NULL;
    int32_t check = -1;
    cl_command_queue q = clmla_context_queue(r->ctx);
    int ok = clmla_context_set_latent_tuning(r->ctx, t) == CLMLA_SUCCESS &&
             clmla_layer_create(r->ctx, &r->t.rl.cfg, &r->t.rl.w, &layer) == CLMLA_SUCCESS &&
             clmla_cache_seq_add(r->t.cache, &check) == CLMLA_SUCCESS && pf_step(r, layer, check, 0, PF_FIRST) == CLMLA_SUCCESS &&
             pf_step(r, layer, check, PF_FIRST, PF_SECOND) == CLMLA_SUCCESS &&
             clEnqueueReadBuffer(q, r->t.out, CL_TRUE, 0, (size_t)PF_CHECK * r->t.D * sizeof(float), r->t.h_out, 0, NULL, NULL) ==
                 CL_SUCCESS;
    if (check >= 0)
        clmla_cache_seq_free(r->t.cache, check);
    if (ok)
        *err = mla_ref_max_rel_err(r->t.h_out, r->t.ref, (size_t)PF_CHECK * r->t.D, NULL);
    int len = 0;
    clmla_cache_seq_length(r->t.cache, r->seq_chunk, 0, &len);
    if (ok && len == 0) /* the prefix, once: every candidate writes the same rows */
        ok = pf_step(r, layer, r->seq_chunk, 0, r->prefix) == CLMLA_SUCCESS && clFinish(q) == CL_SUCCESS;
    reps = reps < 32 ? reps : 32;
    for (int k = 0; k < 2 && ok && *err <= 1e-4; k++) {
        const int32_t seq = k ? r->seq_chunk : r->seq_prompt;
        const int keep = k ? r->prefix : 0;
        double tm[32];
        for (int i = -1; i < reps && ok; i++) { /* -1: a warm-up */
            const double t0 = kt_now();
            ok = pf_step(r, layer, seq, k ? r->prefix : 0, k ? r->chunk : r->prompt) == CLMLA_SUCCESS &&
                 clFinish(q) == CL_SUCCESS;
            if (i >= 0)
                tm[i] = (kt_now() - t0) * 1e6;
            ok = ok && clmla_cache_seq_truncate(r->t.cache, seq, keep) == CLMLA_SUCCESS;
        }
        if (ok) {
            qsort(tm, (size_t)reps, sizeof(double), kt_cmp);
            us[k] = tm[reps / 2];
        }
    }
    if (!ok)
        printf("  failed: %s\n", clmla_last_error(r->ctx));
    clmla_layer_destroy(layer);
    clmla_context_set_latent_tuning(r->ctx, NULL);
    return ok ? 0 : -1;
}

static void pf_print(const clmla_latent_tuning *t, int rows)
{
    if (rows)
        printf("prefill_rows_queries=%-2d", t->prefill_rows_queries);
    else if (t->prefill_tiled)
        printf("prefill_queries=%-2d prefill_keys=%-2d prefill_chunk=%-3d", t->prefill_queries, t->prefill_keys,
               t->prefill_chunk);
    else
        printf("prefill_tiled=0 (attn_prefill)%17s", "");
}

/* Times the candidates: each one's times in us[i] and the mean of their ratios to the first's in
   ratios[i] (-1: failed or wrong). The index of the fastest, or -1 when the first fails or is wrong. */
static int pf_search(pf_run *r, const clmla_latent_tuning *cands, int n, int reps, double (*us)[2], double *ratios)
{
    const int rows = r->rows_kernel;
    int best = -1;
    for (int i = 0; i < n; i++) {
        printf("[%2d/%d] ", i + 1, n);
        pf_print(&cands[i], rows);
        fflush(stdout);
        double err = -1;
        ratios[i] = -1;
        const int failed = pf_measure(r, &cands[i], reps, &err, us[i]) != 0;
        if (failed || err < 0 || err > 1e-4) {
            if (!failed)
                printf("  refused: error %g against float64\n", err);
            if (i == 0)
                return -1; /* the current parameters must run to compare against */
            continue;
        }
        ratios[i] = (us[i][0] / us[0][0] + us[i][1] / us[0][1]) / 2;
        printf("  err %.1e  prompt %9.1f us  chunk %9.1f us  (%.3f of the current)%s\n", err, us[i][0], us[i][1],
               ratios[i], i == 0 ? " current" : "");
        fflush(stdout);
        if (best < 0 || ratios[i] < ratios[best])
            best = i;
    }
    return best;
}

/* `implied`: run because no part was named (a head count other than 16 or 128 is then skipped with
   a note instead of refused). `from`: the latent parameters the latent search of the same command
   just chose, which the saved entry keeps (NULL: those in force). */
static int tune_prefill(const char *device, int heads, int ctx_len, int quick, int dry_run, const char *out,
                        int implied, const clmla_latent_tuning *from)
{
    char path[4096];
    const int bad = kernel_tuning_target(out, dry_run, path, sizeof(path));
    if (bad)
        return bad;
    if (heads != 16 && heads != 128 && implied) {
        printf("\nthe prefill tiles: not tuned, --prefill times 16 or 128 heads\n");
        return 0;
    }
    if (heads != 16 && heads != 128) {
        fprintf(stderr, "clmla tune: --prefill times a V2-Lite (--heads 16) or V3 (--heads 128) layer, not %d heads\n",
                heads);
        return 2;
    }
    pf_run r;
    memset(&r, 0, sizeof(r));
    if (cli_context_create(device, &r.ctx) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    clmla_device_info info;
    clmla_context_device(r.ctx, &info);
    r.rows_kernel = cli_runs_row_kernels(&info);
    r.prompt = quick ? 80 : (ctx_len < 2048 ? ctx_len : 2048);
    r.prefix = quick ? 100 : ctx_len;
    r.chunk = quick ? 40 : 512;
    const int reps = quick ? 3 : 7;
    int rc = 1;
    if (pf_make(&r, heads == 16 ? CLMLA_PRESET_DEEPSEEK_V2_LITE : CLMLA_PRESET_DEEPSEEK_V3,
                heads == 16 ? CLMLA_WEIGHTS_BF16 : CLMLA_WEIGHTS_FP8) != 0)
        goto done;

    enum { MAX_CANDIDATES = 32 };
    clmla_latent_tuning cands[MAX_CANDIDATES], base;
    const char *base_source = "defaults";
    if (clmla_latent_tuning_lookup(&info, heads, &base, &base_source) != CLMLA_SUCCESS)
        printf("note: %s\n", clmla_last_error(NULL));
    if (from) {
        base = *from;
        base_source = "the latent search's choice";
    }
    int n = 0;
    cands[n++] = base;
    clmla_latent_tuning t = base;
    if (r.rows_kernel) {
        static const int qbc[] = {8, 12, 24, 32, 48}, quick_qbc[] = {8, 32};
        for (int i = 0; i < (quick ? 2 : 5); i++) {
            t = base;
            t.prefill_rows_queries = quick ? quick_qbc[i] : qbc[i];
            add_unique(cands, &n, &t);
        }
    } else {
        t.prefill_tiled = !base.prefill_tiled;
        cands[n++] = t; /* attn_prefill, or the tiles in force where the entry turned them off */
        static const int qs[] = {16, 32, 64}, ks[] = {16, 32, 64}, cs[] = {32, 64, 128};
        static const int quick_grid[][3] = {{16, 16, 32}, {64, 64, 128}};
        for (int i = 0; i < (quick ? 2 : 27); i++) {
            t = base;
            t.prefill_tiled = 1;
            t.prefill_queries = quick ? quick_grid[i][0] : qs[i / 9];
            t.prefill_keys = quick ? quick_grid[i][1] : ks[i / 3 % 3];
            t.prefill_chunk = quick ? quick_grid[i][2] : cs[i % 3];
            add_unique(cands, &n, &t);
        }
    }
    printf("\ntuning %s on %s (%s, %s, driver %s): a random %s layer (%d heads, weights %s), the decompressed path, "
           "a prompt of %d tokens and %d after %d, %d candidates; whole steps\n",
           r.rows_kernel ? "attn_prefill_rows" : "attn_prefill_tiled", info.name, info.vendor, info.platform_name,
           info.driver_version, heads == 16 ? "V2-Lite" : "V3", heads, clmla_dtype_name(r.t.rl.held), r.prompt, r.chunk,
           r.prefix, n);
    const double start = kt_now();
    double us[MAX_CANDIDATES][2], ratios[MAX_CANDIDATES];
    int best = pf_search(&r, cands, n, reps, us, ratios);
    if (best < 0) {
        fprintf(stderr, "clmla tune: the current prefill parameters fail\n");
        goto done;
    }
    double ratio = ratios[best];
    printf("\n%.0f s; best: ", kt_now() - start);
    pf_print(&cands[best], r.rows_kernel);
    printf(" (%.3f of the current, %s)\n", ratio, base_source);
    if (best > 0) {
        /* timed again beside the current ones, three alternations, so that a noisy win is not saved:
           kept when the median of its three ratios to them is at most 1 */
        const clmla_latent_tuning pair[2] = {cands[0], cands[best]};
        double again[3], pair_us[2][2], pair_ratios[2];
        printf("confirmation (3 alternations):\n");
        for (int round = 0; round < 3; round++) {
            const int ran = pf_search(&r, pair, 2, reps, pair_us, pair_ratios) >= 0;
            again[round] = ran && pair_ratios[1] > 0 ? pair_ratios[1] : 2; /* a failure counts as a loss */
        }
        qsort(again, 3, sizeof(double), kt_cmp);
        if (again[1] <= 1.0) {
            ratio = again[1];
            printf("kept: %.3f of the current (median of three)\n", ratio);
        } else {
            best = 0;
            ratio = 1;
            printf("the current parameters kept (%.3f of their time, median of three)\n", again[1]);
        }
    }
    rc = 0;
    if (!dry_run) {
        clmla_latent_tuning saved = base; /* the entry in force, its prefill parameters replaced */
        saved.prefill_tiled = cands[best].prefill_tiled;
        saved.prefill_queries = cands[best].prefill_queries;
        saved.prefill_keys = cands[best].prefill_keys;
        saved.prefill_chunk = cands[best].prefill_chunk;
        saved.prefill_rows_queries = cands[best].prefill_rows_queries;
        char note[256];
        snprintf(note, sizeof(note), "prefill %d tokens %.0f us, %d after %d %.0f us (%.3f of %s)", r.prompt,
                 us[best][0], r.chunk, r.prefix, us[best][1], ratio, base_source);
        if (clmla_latent_tuning_save(path, &info, heads, &saved, note) != CLMLA_SUCCESS) {
            fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
            rc = 1;
        } else
            printf("saved to %s\n", path);
    }
done:
    tune_layer_free(&r.t);
    clmla_context_destroy(r.ctx);
    return rc;
}

/* --export: the parameters that apply to the device now (the user file, the built-in table or the
   defaults), for V2-Lite's 16 heads and V3's 128 and for both shape classes of K, written into the
   tuning file as whole entries, every parameter named: a file to edit and try (CLMLA_KERNEL_TUNING),
   whose entries then hold what the device ran rather than the defaults for what they leave out. */
static int export_kernels(const char *device, int dry_run, const char *out)
{
    char path[4096];
    const int bad = kernel_tuning_target(out, dry_run, path, sizeof(path));
    if (bad)
        return bad;
    clmla_device_info *devs = NULL, info;
    size_t count = 0, index = 0;
    if (clmla_devices_list(&devs, &count) != CLMLA_SUCCESS || clmla_device_resolve(device, &index) != CLMLA_SUCCESS ||
        index >= count) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        clmla_free(devs);
        return 1;
    }
    info = devs[index];
    clmla_free(devs);
    static const int heads[] = {16, 128};
    static const size_t ks[] = {2048, 7168};
    for (int i = 0; i < 4; i++) {
        const char *source = NULL;
        char note[256];
        clmla_status st;
        if (i < 2) {
            clmla_latent_tuning t;
            if (clmla_latent_tuning_lookup(&info, heads[i], &t, &source) != CLMLA_SUCCESS)
                printf("warning: %s\n", clmla_last_error(NULL));
            snprintf(note, sizeof(note), "exported from %s", source);
            st = dry_run ? CLMLA_SUCCESS : clmla_latent_tuning_save(path, &info, heads[i], &t, note);
            printf("attn_latent, %d heads: %s\n", heads[i], source);
        } else {
            clmla_product_tuning t;
            if (clmla_product_tuning_lookup(&info, ks[i - 2], &t, &source) != CLMLA_SUCCESS)
                printf("warning: %s\n", clmla_last_error(NULL));
            snprintf(note, sizeof(note), "exported from %s", source);
            st = dry_run ? CLMLA_SUCCESS : clmla_product_tuning_save(path, &info, ks[i - 2], &t, note);
            printf("products, K %s 4096: %s\n", i == 2 ? "<=" : "> ", source);
        }
        if (st != CLMLA_SUCCESS) {
            fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
            return 1;
        }
    }
    if (!dry_run)
        printf("written to %s\n", path);
    return 0;
}

int cmd_tune(int argc, char **argv)
{
    int help = 0, size = 1024, candidates = 40, dry_run = 0, kernels = 0, heads = 16, ctx_len = 4096, quick = 0;
    int latent = 0, products = 0, prefill = 0, export_tuning = 0;
    double max_seconds = 0;
    const char *device = NULL, *out = NULL, *cache_dtype = "f32";
    cli_option opts[] = {
        {"device", CLI_STRING, &device, "SPEC  device to tune (see clmla devices)"},
        {"size", CLI_INT, &size, "N  time the row-major N x N x N SGEMM (default 1024)"},
        {"candidates", CLI_INT, &candidates, "K  parameter sets to try, most promising first (default 40)"},
        {"max-seconds", CLI_DOUBLE, &max_seconds, "S  try no new candidate after S seconds (default: no limit)"},
        {"out", CLI_STRING, &out, "FILE  tuning file to add the entry to (default: CLMLA_CLBLAST_TUNING, else\n"
                                  "                       <cache dir>/clblast-tuning.json, which contexts read)"},
        {"dry-run", CLI_FLAG, &dry_run, "measure and print, write nothing"},
        {"kernels", CLI_FLAG, &kernels, "tune clmla's own kernels instead of CLBlast (default file:\n"
                                        "                       CLMLA_KERNEL_TUNING, else <cache dir>/kernel-tuning.json)"},
        {"latent", CLI_FLAG, &latent, "with --kernels: the latent attention kernel (alone unless --products)"},
        {"products", CLI_FLAG, &products, "with --kernels: the product kernels, decode and prefill-sized"},
        {"prefill", CLI_FLAG, &prefill, "with --kernels: the decompressed path's attention tiles (attn_prefill_tiled\n"
                                        "                       or, on CPUs, attn_prefill_rows); none of the three\n"
                                        "                       flags: all three"},
        {"heads", CLI_INT, &heads, "H  with --kernels: attention heads (default 16, V2-Lite; 128: V3)"},
        {"ctx", CLI_INT, &ctx_len, "N  with --kernels: keys per sequence timed (default 4096; --prefill: the\n"
                                   "                       prefix of a 512-token chunk, and a prompt of up to 2048)"},
        {"cache-dtype", CLI_STRING, &cache_dtype, "f16|bf16|fp8  with --kernels --latent: time over a cache of that\n"
                                                  "                       dtype and tune group_decode_heads alone (GPUs)"},
        {"export", CLI_FLAG, &export_tuning, "with --kernels --out FILE: measure nothing, write the parameters that\n"
                                             "                       apply to the device now (16 and 128 heads, both K classes)\n"
                                             "                       into FILE as whole entries, to edit and try"},
        {"quick", CLI_FLAG, &quick, "with --kernels: a small grid (latent: two candidates at ctx 512; products:\n"
                                    "                       V2-Lite's o_proj, f32 and bf16, 128 prefill rows;\n"
                                    "                       prefill: three or four candidates, a prompt of 80)"},
        {"help", CLI_FLAG, &help, "this text"},
        {NULL, CLI_FLAG, NULL, NULL},
    };
    if (cli_parse("tune", opts, argc, argv, 2))
        return 2;
    if (help) {
        cli_usage("tune",
                  "Searches the 16 parameters of CLBlast's Xgemm kernel (its SGEMM above the direct-kernel\n"
                  "size) for a device: times the SGEMM with CLBlast's own values, then with each candidate\n"
                  "(every candidate compiles once: seconds each on a CPU), keeps only exact results, and adds\n"
                  "the fastest to a tuning file. Every later clmla context on that device applies it (set\n"
                  "CLMLA_CLBLAST_TUNING=off to stop that). Nothing is written when CLBlast's own values win.",
                  opts);
        return 0;
    }
    if (export_tuning && !kernels) {
        fprintf(stderr, "clmla tune: --export goes with --kernels\n");
        return 2;
    }
    if (kernels && export_tuning && !out && !dry_run) {
        /* the default file is the one every context reads: whole entries written there would pin the
           parameters of now over the built-in table's later ones without the user having chosen it */
        fprintf(stderr, "clmla tune: --export needs --out FILE: its whole entries would take precedence over the "
                        "built-in table wherever the file is read; try them with CLMLA_KERNEL_TUNING=FILE\n");
        return 2;
    }
    if (kernels && export_tuning)
        return export_kernels(device, dry_run, out);
    if (kernels) {
        if (heads < 1 || heads > 1024 || ctx_len < 64 || ctx_len > 65536) {
            fprintf(stderr, "clmla tune: --heads must be 1..1024 and --ctx 64..65536\n");
            return 2;
        }
        const int dtype = cli_cache_dtype(cache_dtype);
        if (dtype < 0) {
            fprintf(stderr, "clmla tune: --cache-dtype must be f32, f16, bf16 or fp8, not '%s'\n", cache_dtype);
            return 2;
        }
        if (dtype != 0 && (!latent || products || prefill)) {
            fprintf(stderr, "clmla tune: --cache-dtype goes with --kernels --latent alone\n");
            return 2;
        }
        const int implied = !latent && !products && !prefill;
        if (implied)
            latent = products = prefill = 1;
        clmla_latent_tuning chosen;
        int rc = latent ? tune_kernels(device, heads, ctx_len, quick, dry_run, out, (clmla_cache_dtype)dtype, &chosen) : 0;
        if (rc == 0 && prefill)
            rc = tune_prefill(device, heads, ctx_len, quick, dry_run, out, implied, latent ? &chosen : NULL);
        if (rc == 0 && products)
            rc = tune_products(device, quick, dry_run, out);
        return rc;
    }
    if (size < 16 || size > 8192 || candidates < 1) {
        fprintf(stderr, "clmla tune: --size must be 16..8192 and --candidates at least 1\n");
        return 2;
    }
    char path[4096];
    if (out)
        snprintf(path, sizeof(path), "%s", out);
    else if (clmla_xgemm_tuning_path(path, sizeof(path)) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    if (!dry_run && !path[0]) {
        fprintf(stderr, "clmla tune: no tuning file to write (no cache folder: set --out, CLMLA_CLBLAST_TUNING or "
                        "CLMLA_CACHE_DIR), or use --dry-run\n");
        return 2;
    }
    if (!dry_run) { /* fail before minutes of tuning, not after */
        char folder[4096];
        snprintf(folder, sizeof(folder), "%s", path);
        char *slash = strrchr(folder, '/');
        if (slash)
            *(slash == folder ? slash + 1 : slash) = '\0';
        else
            snprintf(folder, sizeof(folder), ".");
        struct stat s;
        if (stat(folder, &s) != 0 || !S_ISDIR(s.st_mode)) {
            fprintf(stderr, "clmla tune: cannot write %s: folder %s does not exist\n", path, folder);
            return 1;
        }
    }
    /* Measure against CLBlast's own values, not an entry applied earlier. */
    setenv("CLMLA_CLBLAST_TUNING", "off", 1);
    clmla_context *ctx = NULL;
    if (cli_context_create(device, &ctx) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    clmla_device_info info;
    clmla_context_device(ctx, &info);
    printf("tuning CLBlast Xgemm on %s (%s, %s), SGEMM %d x %d x %d\n", info.name, info.vendor, info.platform_name,
           size, size, size);
    clmla_tune_options o = {size, candidates, max_seconds, progress, NULL};
    clmla_xgemm_tuning best;
    clmla_status st = clmla_tune_xgemm(ctx, &o, &best);
    if (st != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(ctx));
        clmla_context_destroy(ctx);
        return 1;
    }
    clmla_context_destroy(ctx);
    printf("\nbest: ");
    print_values(best.values);
    printf("\n      %.1f GFLOP/s against %.1f with CLBlast's own values (%.2fx)\n", best.gflops, best.default_gflops,
           best.default_gflops > 0 ? best.gflops / best.default_gflops : 0.0);
    if (best.gflops <= best.default_gflops) {
        printf("CLBlast's own values are faster: nothing written\n");
        return 0;
    }
    if (dry_run)
        return 0;
    if (clmla_xgemm_tuning_save(path, &best) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla tune: %s\n", clmla_last_error(NULL));
        return 1;
    }
    printf("saved to %s\n", path);
    return 0;
}
