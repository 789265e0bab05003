/* Latent attention kernel tuning (include/clmla.h, "Latent attention kernel tuning"): entries
   parsed, matched and ranked (user file over the built-in table over the defaults, exact heads over
   "any"), illegal values refused by name, entries saved and merged, and attention run with
   non-default parameters from a user file against a float64 reference, on both kernels.
   `test_kernel_tuning malformed` checks that a malformed user file is reported and ignored (the
   file is read once per process, hence a process of its own). Exit 77 without a device. */
#include "check.h"
#include "clmla.h"
#include "tuning.h"
#include "attention.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64] = "/tmp/clmla-kt-XXXXXX";

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_parse(void)
{
    clmla_device_info pocl, other;
    memset(&pocl, 0, sizeof(pocl));
    snprintf(pocl.vendor, sizeof(pocl.vendor), "AuthenticAMD");
    snprintf(pocl.name, sizeof(pocl.name), "pthread-haswell-AMD EPYC");
    snprintf(pocl.platform_name, sizeof(pocl.platform_name), "Portable Computing Language");
    snprintf(pocl.driver_version, sizeof(pocl.driver_version), "3.1+debian");
    other = pocl;
    snprintf(other.name, sizeof(other.name), "Some GPU");

    clmla_latent_tuning t, d;
    clmla_latent_tuning_defaults(&d);
    CHECK(d.rows_heads == 16 && d.rows_keys == 8 && d.rows_groups_per_cu == 4 && d.group_heads == 16 &&
              d.group_keys == 4 && d.group_max_items == 128 && d.group_groups_per_cu == 8,
          "defaults are not today's values");
    const char *src = NULL;
    /* no user file: the built-in table for the PoCL device at 16 heads, defaults elsewhere */
    CHECK(clmla_latent_tuning_resolve(NULL, "", &pocl, 16, &t, &src) == 1 && strcmp(src, "built-in table") == 0,
          "built-in entry not found: %s", src);
    CHECK(clmla_latent_tuning_resolve(NULL, "", &other, 16, &t, &src) == 0 && strcmp(src, "defaults") == 0 &&
              memcmp(&t, &d, sizeof(t)) == 0,
          "other device: %s", src);

    const char *text = "[{\"kernel\": \"attn_latent\", \"vendor\": \"AuthenticAMD\", \"device\": \"pthread-haswell-AMD EPYC\","
                       " \"heads\": \"any\", \"parameters\": {\"rows_keys\": 12}},"
                       " {\"vendor\": \"AuthenticAMD\", \"device\": \"pthread-haswell-AMD EPYC\", \"heads\": 16,"
                       "  \"parameters\": {\"rows_heads\": 8, \"rows_groups_per_cu\": 2}},"
                       " {\"vendor\": \"AuthenticAMD\", \"device\": \"pthread-haswell-AMD EPYC\", \"driver\": \"9.9\","
                       "  \"heads\": 128, \"parameters\": {\"rows_heads\": 4}},"
                       " {\"vendor\": \"V\", \"device\": \"Some GPU\", \"parameters\": {\"rows_keys\": 6}},"
                       " {\"vendor\": \"V\", \"device\": \"Some GPU\", \"parameters\": {\"bogus\": 1}}]";
    latent_entry_list list;
    char why[512];
    const int refused = clmla_latent_tuning_parse(text, &list, why, sizeof(why));
    CHECK(refused == 2 && list.count == 3, "refused %d, kept %zu", refused, list.count);
    CHECK(strstr(why, "rows_keys") != NULL, "the refusal does not name rows_keys: %s", why);
    /* exact heads wins over "any"; the user file wins over the built-in table */
    CHECK(clmla_latent_tuning_resolve(&list, "file U", &pocl, 16, &t, &src) == 2 && strcmp(src, "file U") == 0 &&
              t.rows_heads == 8 && t.rows_groups_per_cu == 2 && t.rows_keys == 8,
          "16 heads: %s %d %d %d", src, t.rows_heads, t.rows_groups_per_cu, t.rows_keys);
    /* 128 heads: the driver-specific entry does not match this driver, so "any" */
    CHECK(clmla_latent_tuning_resolve(&list, "file U", &pocl, 128, &t, &src) == 2 && t.rows_keys == 12 &&
              t.rows_heads == 16,
          "128 heads: %d %d", t.rows_keys, t.rows_heads);
    /* illegal entries of another device are refused: that device gets the defaults */
    CHECK(clmla_latent_tuning_resolve(&list, "file U", &other, 16, &t, &src) == 0, "refused entry applied");
    clmla_latent_tuning_list_free(&list);

    const char *bogus = "[{\"vendor\": \"V\", \"device\": \"Some GPU\", \"parameters\": {\"bogus\": 1}}]";
    CHECK(clmla_latent_tuning_parse(bogus, &list, why, sizeof(why)) == 1 && strstr(why, "bogus"), "%s", why);
    clmla_latent_tuning_list_free(&list);
    CHECK(clmla_latent_tuning_parse("{not json", &list, why, sizeof(why)) == -1 && why[0], "malformed text parsed");
    clmla_latent_tuning_list_free(&list);

    /* the checks by name */
    const char *w = NULL;
    t = d;
    t.group_max_items = 96;
    CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_ERROR_INVALID_ARGUMENT && w && strstr(w, "group_max_items"), "NT 96");
    t = d;
    t.rows_heads = 7;
    CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_ERROR_INVALID_ARGUMENT && w && strstr(w, "rows_heads"), "HGC 7");
    CHECK(clmla_latent_tuning_check(&d, &w) == CLMLA_SUCCESS && !w, "defaults refused");

    /* save: a new file, a second device merged, the first replaced; a malformed file left alone */
    char path[128], bad[128];
    snprintf(path, sizeof(path), "%s/saved.json", dir);
    snprintf(bad, sizeof(bad), "%s/bad.json", dir);
    t = d;
    t.rows_keys = 16;
    CHECK_STATUS(clmla_latent_tuning_save(path, &pocl, 16, &t, "note"), CLMLA_SUCCESS, NULL);
    CHECK_STATUS(clmla_latent_tuning_save(path, &other, 0, &d, NULL), CLMLA_SUCCESS, NULL);
    t.rows_keys = 4;
    CHECK_STATUS(clmla_latent_tuning_save(path, &pocl, 16, &t, NULL), CLMLA_SUCCESS, NULL);
    FILE *f = fopen(path, "r");
    char buf[8192] = "";
    if (f) {
        buf[fread(buf, 1, sizeof(buf) - 1, f)] = '\0';
        fclose(f);
    }
    CHECK(clmla_latent_tuning_parse(buf, &list, why, sizeof(why)) == 0 && list.count == 2, "saved file: %s", why);
    CHECK(clmla_latent_tuning_resolve(&list, "f", &pocl, 16, &t, &src) == 2 && t.rows_keys == 4, "replaced entry");
    CHECK(clmla_latent_tuning_resolve(&list, "f", &other, 3, &t, &src) == 2, "merged entry");
    clmla_latent_tuning_list_free(&list);
    write_text(bad, "[1, 2");
    CHECK_STATUS(clmla_latent_tuning_save(bad, &pocl, 16, &d, NULL), CLMLA_ERROR_INVALID_FILE, NULL);
}

/* Attention on the device with the user file's parameters, against float64. */
static void test_attention(clmla_context *ctx, int variant)
{
    enum { H = 16, RKV = 512, DR = 64, BT = 64, T = 3 };
    const int len[T] = {700, 65, 1};
    const int per_seq = (700 + BT - 1) / BT;
    clmla_attention_set_variant(ctx, variant);
    clmla_cache_config cfg = {1, RKV, DR, BT, T * per_seq, CLMLA_CACHE_F32};
    clmla_cache *cache = NULL;
    CHECK_STATUS(clmla_cache_create(ctx, &cfg, &cache), CLMLA_SUCCESS, ctx);
    if (!cache)
        return;
    cl_context clctx;
    clGetCommandQueueInfo(clmla_context_queue(ctx), CL_QUEUE_CONTEXT, sizeof(clctx), &clctx, NULL);
    float *ckv = malloc(700 * RKV * sizeof(float)), *kr = malloc(700 * DR * sizeof(float));
    float *ql = malloc(T * H * RKV * sizeof(float)), *qr = malloc(T * H * DR * sizeof(float));
    float *got = malloc(T * H * RKV * sizeof(float));
    uint32_t s = 99;
#define RND() (s = s * 1664525u + 1013904223u, (float)((double)(s >> 8) / 16777216.0 * 2 - 1))
    for (int i = 0; i < 700 * RKV; i++)
        ckv[i] = RND();
    for (int i = 0; i < 700 * DR; i++)
        kr[i] = RND();
    for (int i = 0; i < T * H * RKV; i++)
        ql[i] = RND();
    for (int i = 0; i < T * H * DR; i++)
        qr[i] = RND();
    cl_int err;
    cl_mem bckv = clCreateBuffer(clctx, CL_MEM_COPY_HOST_PTR, 700 * RKV * 4, ckv, &err);
    cl_mem bkr = clCreateBuffer(clctx, CL_MEM_COPY_HOST_PTR, 700 * DR * 4, kr, &err);
    int32_t table[T * ((700 + BT - 1) / BT)], tseq[T];
    for (int t = 0; t < T; t++) {
        int32_t id = 0;
        int nb = 0;
        CHECK_STATUS(clmla_cache_seq_add(cache, &id), CLMLA_SUCCESS, ctx);
        CHECK_STATUS(clmla_cache_append_cl(cache, 0, id, len[t], bckv, 0, RKV, bkr, 0, DR, NULL), CLMLA_SUCCESS, ctx);
        CHECK_STATUS(clmla_cache_seq_blocks(cache, id, table + t * per_seq, per_seq, &nb), CLMLA_SUCCESS, ctx);
        tseq[t] = id;
    }
    cl_mem bt = clCreateBuffer(clctx, CL_MEM_COPY_HOST_PTR, sizeof(table), table, &err);
    cl_mem bs = clCreateBuffer(clctx, CL_MEM_COPY_HOST_PTR, sizeof(tseq), tseq, &err);
    cl_mem bl = clCreateBuffer(clctx, CL_MEM_COPY_HOST_PTR, sizeof(len), (void *)len, &err);
    cl_mem bql = clCreateBuffer(clctx, CL_MEM_COPY_HOST_PTR, T * H * RKV * 4, ql, &err);
    cl_mem bqr = clCreateBuffer(clctx, CL_MEM_COPY_HOST_PTR, T * H * DR * 4, qr, &err);
    cl_mem bo = clCreateBuffer(clctx, CL_MEM_READ_WRITE, T * H * RKV * 4, NULL, &err);
    clmla_latent_attention_args a;
    memset(&a, 0, sizeof(a));
    a.num_tokens = T;
    a.num_heads = H;
    a.softmax_scale = 0.04f;
    a.q_latent = bql;
    a.q_rope = bqr;
    a.block_table = bt;
    a.max_blocks_per_seq = per_seq;
    a.token_seq = bs;
    a.token_ctx_len = bl;
    a.max_ctx_len = 700;
    a.out = bo;
    CHECK_STATUS(clmla_attention_latent(cache, 0, &a, NULL), CLMLA_SUCCESS, ctx);
    clEnqueueReadBuffer(clmla_context_queue(ctx), bo, CL_TRUE, 0, T * H * RKV * 4, got, 0, NULL, NULL);
    double worst = 0, sc[700], ref[RKV];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *q1 = ql + (t * H + h) * RKV, *q2 = qr + (t * H + h) * DR;
            double m = -INFINITY, sum = 0;
            for (int j = 0; j < len[t]; j++) {
                double dot = 0;
                for (int i = 0; i < RKV; i++)
                    dot += (double)q1[i] * ckv[j * RKV + i];
                for (int i = 0; i < DR; i++)
                    dot += (double)q2[i] * kr[j * DR + i];
                sc[j] = 0.04 * dot;
                m = fmax(m, sc[j]);
            }
            memset(ref, 0, sizeof(ref));
            for (int j = 0; j < len[t]; j++) {
                const double w = exp(sc[j] - m);
                sum += w;
                for (int i = 0; i < RKV; i++)
                    ref[i] += w * ckv[j * RKV + i];
            }
            for (int i = 0; i < RKV; i++)
                worst = fmax(worst, fabs(got[(t * H + h) * RKV + i] - ref[i] / sum));
        }
    CHECK(worst < 1e-4, "variant %d: error %g against float64", variant, worst);
    printf("variant %d (tuned parameters): largest error %.2e\n", variant, worst);
    cl_mem all[] = {bckv, bkr, bt, bs, bl, bql, bqr, bo};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        clReleaseMemObject(all[i]);
    clmla_cache_destroy(cache);
    clmla_attention_set_variant(ctx, CLMLA_LATENT_AUTO);
    free(ckv);
    free(kr);
    free(ql);
    free(qr);
    free(got);
}

int main(int argc, char **argv)
{
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char user[128];
    snprintf(user, sizeof(user), "%s/user.json", dir);
    setenv("CLMLA_KERNEL_TUNING", user, 1);
    const int malformed = argc > 1 && strcmp(argv[1], "malformed") == 0;
    clmla_context *ctx = NULL;
    if (clmla_context_create(NULL, &ctx) != CLMLA_SUCCESS) {
        printf("no OpenCL device: %s\n", clmla_last_error(NULL));
        return 77;
    }
    clmla_device_info info;
    clmla_context_device(ctx, &info);
    clmla_latent_tuning t;
    const char *src = NULL;
    if (malformed) {
        write_text(user, "[{\"vendor\": \"x\", \"device\": ");
        const clmla_status st = clmla_latent_tuning_lookup(&info, 16, &t, &src);
        CHECK(st == CLMLA_ERROR_INVALID_FILE && strstr(clmla_last_error(NULL), "user.json") &&
                  strstr(clmla_last_error(NULL), "ignored"),
              "malformed file: %s: %s", clmla_status_string(st), clmla_last_error(NULL));
        CHECK(strncmp(src, "file", 4) != 0, "source %s", src);
        printf("reported: %s\n", clmla_last_error(NULL));
    } else {
        test_parse();
        /* non-default values for this device, both kernels */
        char text[2048];
        snprintf(text, sizeof(text),
                 "[{\"kernel\": \"attn_latent\", \"vendor\": \"%s\", \"device\": \"%s\", \"heads\": 16, \"parameters\": "
                 "{\"rows_heads\": 6, \"rows_keys\": 12, \"rows_groups_per_cu\": 3, \"group_heads\": 8, "
                 "\"group_keys\": 2, \"group_max_items\": 64, \"group_groups_per_cu\": 3}}]",
                 info.vendor, info.name);
        write_text(user, text);
        CHECK_STATUS(clmla_latent_tuning_lookup(&info, 16, &t, &src), CLMLA_SUCCESS, NULL);
        CHECK(strncmp(src, "file ", 5) == 0 && t.rows_heads == 6 && t.rows_keys == 12 && t.group_max_items == 64,
              "user entry not applied: %s", src);
        test_attention(ctx, CLMLA_LATENT_ROWS);
        test_attention(ctx, CLMLA_LATENT_GROUP);
    }
    clmla_context_destroy(ctx);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", dir);
    return check_summary();
}
