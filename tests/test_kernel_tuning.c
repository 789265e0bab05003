/* Latent attention kernel tuning (include/clmla_tuning.h, "Latent attention kernel tuning"): entries
   parsed, matched and ranked (user file over the built-in table over the defaults, exact heads over
   "any"), illegal values refused by name, entries saved and merged, and attention run with
   non-default parameters from a user file against a float64 reference, on both kernels; the same
   for the product kernels' parameters (clmla_product_tuning), whose every value off its default
   must give the float64 product on odd shapes.
   `test_kernel_tuning malformed` checks that a malformed user file is reported and ignored (the
   file is read once per process, hence a process of its own). Exit 77 without a device. */
#include "check.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "kernel_tuning.h"
#include "attention.h"
#include "gemm.h"

#include <math.h>
#include <stddef.h>
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

/* The text of path (at most size - 1 bytes) into buf; "" when it cannot be read. */
static void read_text(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (f) {
        buf[fread(buf, 1, size - 1, f)] = '\0';
        fclose(f);
    }
}

/* The two devices the parse tests match tuning files against: a PoCL CPU, and one that differs
   from it only in its name. */
static const clmla_device_info pocl = {.vendor = "AuthenticAMD", .name = "pthread-haswell-AMD EPYC",
                                       .platform_name = "Portable Computing Language", .driver_version = "3.1+debian"};
static const clmla_device_info other = {.vendor = "AuthenticAMD", .name = "Some GPU",
                                        .platform_name = "Portable Computing Language", .driver_version = "3.1+debian"};

/* An int parameter of a tuning struct at offset, set to a value its check refuses naming the field:
   the rows of the tables of refusals below. */
typedef struct bad_value {
    size_t offset;
    int value;
    const char *name;
} bad_value;
#define LATENT_BAD(field, value) {offsetof(clmla_latent_tuning, field), value, #field}
#define PRODUCT_BAD(field, value) {offsetof(clmla_product_tuning, field), value, #field}

static void test_parse(void)
{
    clmla_latent_tuning t, d;
    clmla_latent_tuning_defaults(&d);
    CHECK(d.rows_heads == 16 && d.rows_keys == 8 && d.rows_groups_per_cu == 4 && d.group_heads == 16 &&
              d.group_keys == 4 && d.group_max_items == 128 && d.group_groups_per_cu == 8,
          "defaults are not today's values");
    const char *src = NULL;
    /* no user file: the built-in table for the PoCL device at 16 heads, defaults elsewhere */
    /* (its source names the table and the entry's date) */
    CHECK(clmla_latent_tuning_resolve(NULL, "", &pocl, 16, &t, &src) == 1 && strncmp(src, "built-in table (2026-", 21) == 0,
          "built-in entry not found: %s", src);
    CHECK(clmla_latent_tuning_resolve(NULL, "", &other, 16, &t, &src) == 0 && strcmp(src, "defaults") == 0 &&
              memcmp(&t, &d, sizeof(t)) == 0,
          "other device: %s", src);
    /* the compiled-not-run vendor entries (issue 58, docs/VENDORS.md): AMD CDNA by its ISA name,
       any platform and driver and any heads: 8 heads of 256 items, group_keys 2, attn_prefill_tiled
       in blocks of 16 queries with 1 key an item, the rest the defaults; the H100's entry keeps its
       measured 16 heads */
    {
        clmla_device_info gpu;
        memset(&gpu, 0, sizeof(gpu));
        snprintf(gpu.vendor, sizeof(gpu.vendor), "Advanced Micro Devices, Inc.");
        snprintf(gpu.name, sizeof(gpu.name), "gfx942:sramecc+:xnack-");
        snprintf(gpu.platform_name, sizeof(gpu.platform_name), "AMD Accelerated Parallel Processing");
        clmla_latent_tuning want = d;
        want.group_heads = 8;
        want.group_max_items = 256;
        want.group_keys = 2;
        want.prefill_queries = 16;
        want.prefill_item_keys = 1;
        CHECK(clmla_latent_tuning_resolve(NULL, "", &gpu, 128, &t, &src) == 1 && memcmp(&t, &want, sizeof(t)) == 0 &&
                  strstr(src, "compiled, not run"),
              "MI300X: %s, heads %d items %d keys %d", src, t.group_heads, t.group_max_items, t.group_keys);
        snprintf(gpu.name, sizeof(gpu.name), "gfx90a:sramecc+:xnack-");
        CHECK(clmla_latent_tuning_resolve(NULL, "", &gpu, 16, &t, &src) == 1 && memcmp(&t, &want, sizeof(t)) == 0,
              "MI250: %s", src);
        snprintf(gpu.vendor, sizeof(gpu.vendor), "NVIDIA Corporation");
        snprintf(gpu.name, sizeof(gpu.name), "NVIDIA H100 80GB HBM3");
        snprintf(gpu.platform_name, sizeof(gpu.platform_name), "NVIDIA CUDA");
        CHECK(clmla_latent_tuning_resolve(NULL, "", &gpu, 16, &t, &src) == 1 && t.group_heads == 16 &&
                  t.group_max_items == 128 && t.group_keys == 4,
              "H100 at 16 heads: %d %d %d", t.group_heads, t.group_max_items, t.group_keys);
    }

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
    t = d;
    t.group_query_layout = 2;
    CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_ERROR_INVALID_ARGUMENT && w && strstr(w, "group_query_layout"),
          "QLAYOUT 2");
    t = d;
    t.prefill_tiled = 2;
    CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_ERROR_INVALID_ARGUMENT && w && strstr(w, "prefill_tiled"),
          "prefill_tiled 2");
    t = d;
    t.group_decode_heads = 12;
    CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_ERROR_INVALID_ARGUMENT && w && strstr(w, "group_decode_heads"),
          "group_decode_heads 12");
    CHECK(clmla_latent_tuning_check(&d, &w) == CLMLA_SUCCESS && !w, "defaults refused");
    t = d;
    t.group_min_split_keys = 8;
    CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_ERROR_INVALID_ARGUMENT && w && strstr(w, "group_min_split_keys"),
          "group_min_split_keys 8");
    CHECK(d.group_min_split_keys == 128, "default group_min_split_keys %d", d.group_min_split_keys);
    /* group_stage_keys, removed in 0.4.0: a file's 0 (what older `clmla tune` wrote) is taken and
       changes nothing, 1 refuses the entry naming it */
    {
        latent_entry_list list;
        char why[256] = "";
        CHECK(clmla_latent_tuning_parse("[{\"kernel\": \"attn_latent\", \"vendor\": \"V\", \"device\": \"D\", "
                                        "\"parameters\": {\"group_stage_keys\": 0, \"group_keys\": 2}}]",
                                        &list, why, sizeof(why)) == 0 &&
                  list.count == 1,
              "group_stage_keys 0 refused: %s", why);
        clmla_latent_tuning_list_free(&list);
        CHECK(clmla_latent_tuning_parse("[{\"kernel\": \"attn_latent\", \"vendor\": \"V\", \"device\": \"D\", "
                                        "\"parameters\": {\"group_stage_keys\": 1}}]",
                                        &list, why, sizeof(why)) == 1 &&
                  list.count == 0 && strstr(why, "group_stage_keys") && strstr(why, "removed"),
              "group_stage_keys 1: %s", why);
        clmla_latent_tuning_list_free(&list);
    }
    /* values out of range, each refused naming its field */
    static const bad_value out_of_range[] = {
        LATENT_BAD(group_aligned, -1), LATENT_BAD(group_aligned, 3), LATENT_BAD(group_row_slices, -1),
        LATENT_BAD(group_row_slices, 3), LATENT_BAD(group_row_slices, 5), LATENT_BAD(group_row_slices, 8),
        LATENT_BAD(rows_lanes, -1), LATENT_BAD(rows_lanes, 3), LATENT_BAD(group_mma, -1), LATENT_BAD(group_mma, 2),
    };
    for (size_t i = 0; i < sizeof(out_of_range) / sizeof(out_of_range[0]); i++) {
        t = d;
        memcpy((char *)&t + out_of_range[i].offset, &out_of_range[i].value, sizeof(int));
        CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_ERROR_INVALID_ARGUMENT && w && strstr(w, out_of_range[i].name),
              "%s %d", out_of_range[i].name, out_of_range[i].value);
    }
    t = d;
    t.group_aligned = 2;
    CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_SUCCESS && !w, "group_aligned 2 refused");
    CHECK(d.group_aligned == 1, "default group_aligned %d (1 since the H200 of 2026-11-28)", d.group_aligned);
    t = d;
    t.group_row_slices = 4;
    CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_SUCCESS && !w, "group_row_slices 4 refused");
    CHECK(d.group_row_slices == 1, "default group_row_slices %d", d.group_row_slices);
    CHECK(d.group_mma == 0, "default group_mma %d", d.group_mma);
    CHECK(d.rows_lanes == 0, "default rows_lanes %d", d.rows_lanes);
    /* rows_lanes by name in a file */
    CHECK(clmla_latent_tuning_parse("[{\"vendor\": \"AuthenticAMD\", \"device\": \"Some GPU\", \"parameters\": "
                                    "{\"rows_lanes\": 1}}]",
                                    &list, why, sizeof(why)) == 0 &&
              clmla_latent_tuning_resolve(&list, "file U", &other, 16, &t, &src) == 2 && t.rows_lanes == 1 &&
              t.rows_keys == d.rows_keys,
          "rows_lanes from a file: %s", why);
    clmla_latent_tuning_list_free(&list);
    /* attn_prefill_tiled's tiles: BQ a power of two (the build halves it to fit), BK and KC float4s */
    static const bad_value tiles[] = {
        LATENT_BAD(prefill_queries, 24), LATENT_BAD(prefill_queries, 2), LATENT_BAD(prefill_queries, 128),
        LATENT_BAD(prefill_keys, 4), LATENT_BAD(prefill_keys, 30), LATENT_BAD(prefill_keys, 68),
        LATENT_BAD(prefill_chunk, 12), LATENT_BAD(prefill_chunk, 66), LATENT_BAD(prefill_chunk, 260),
        LATENT_BAD(prefill_rows_queries, 0), LATENT_BAD(prefill_rows_queries, 10), LATENT_BAD(prefill_rows_queries, 68),
        LATENT_BAD(prefill_item_keys, 0), LATENT_BAD(prefill_item_keys, 3), LATENT_BAD(prefill_item_keys, 8),
    };
    for (size_t i = 0; i < sizeof(tiles) / sizeof(tiles[0]); i++) {
        t = d;
        *(int *)((char *)&t + tiles[i].offset) = tiles[i].value;
        CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_ERROR_INVALID_ARGUMENT && w && strstr(w, tiles[i].name),
              "%s %d: %s", tiles[i].name, tiles[i].value, w ? w : "accepted");
    }
    t = d;
    t.prefill_queries = 4;
    t.prefill_keys = 8;
    t.prefill_chunk = 16;
    t.prefill_rows_queries = 4;
    t.prefill_item_keys = 1;
    CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_SUCCESS, "the smallest tiles refused: %s", w ? w : "");
    t.prefill_queries = 64;
    t.prefill_keys = 64;
    t.prefill_chunk = 256;
    t.prefill_rows_queries = 64;
    CHECK(clmla_latent_tuning_check(&t, &w) == CLMLA_SUCCESS, "the largest tiles refused: %s", w ? w : "");
    CHECK(d.prefill_queries == 32 && d.prefill_keys == 32 && d.prefill_chunk == 64 && d.prefill_rows_queries == 16 &&
              d.prefill_item_keys == 4,
          "default tiles %d x %d, chunk %d, %d keys an item, %d queries an item on CPUs", d.prefill_queries,
          d.prefill_keys, d.prefill_chunk, d.prefill_item_keys, d.prefill_rows_queries);
    CHECK(d.group_query_layout == 1 && d.prefill_tiled == 1 && d.group_decode_heads == 8,
          "defaults: query layout %d, prefill_tiled %d, group_decode_heads %d", d.group_query_layout, d.prefill_tiled,
          d.group_decode_heads);

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
    char buf[8192];
    read_text(path, buf, sizeof(buf));
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
    clmla_cache_config cfg = {1, RKV, DR, BT, T * per_seq, CLMLA_CACHE_F32, 0, CLMLA_CACHE_F32};
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
    clmla_latent_attention_args a = {.num_tokens = T, .num_heads = H, .softmax_scale = 0.04f, .q_latent = bql,
                                     .q_rope = bqr, .block_table = bt, .max_blocks_per_seq = per_seq, .token_seq = bs,
                                     .token_ctx_len = bl, .max_ctx_len = 700, .out = bo};
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

/* ---- product kernel parameters ---------------------------------------------------------------- */

static void test_products_parse(void)
{
    clmla_product_tuning t, d;
    clmla_product_tuning_defaults(&d);
    CHECK(d.skinny_items == 128 && d.skinny_unroll == 2 && d.skinny_columns == 4 && d.skinny_nn_items == 256 &&
              d.cpu_items_per_cu == 8 && d.packed_streams_1 == 8 && d.packed_streams_2 == 4 && d.packed_streams_4 == 3 &&
              d.cpu_prefetch == 1 && d.tiled_rows == 256 && d.tiled_columns == 48 && d.tiled_weight_rows == 3 &&
              d.tiled_k_chunk == 1024 && d.skinny_nn_slices == 16 && d.skinny_aligned == 1 && d.cpu_wide == 0 &&
              d.cpu_min_panel == 0,
          "product defaults are not the documented ones (W^UK split 256 x 16 since the H100 of 2026-11-27, "
          "skinny_aligned 1 since the H200 of 2026-11-28)");
    t = d;
    t.skinny_nn_items = 16;
    t.skinny_nn_slices = 32; /* more slices than items */
    const char *problem = NULL;
    CHECK(clmla_product_tuning_check(&t, &problem) == CLMLA_ERROR_INVALID_ARGUMENT && problem &&
              strstr(problem, "skinny_nn_slices"),
          "32 slices over 16 items: %s", problem ? problem : "accepted");
    CHECK(clmla_product_k_class(0) == 0 && clmla_product_k_class(4096) == 1 && clmla_product_k_class(4097) == 2,
          "shape classes");
    const char *src = NULL;
    CHECK(clmla_product_tuning_resolve(NULL, "", &other, 2048, &t, &src) == 0 && strcmp(src, "defaults") == 0 &&
              memcmp(&t, &d, sizeof(t)) == 0,
          "no entry: %s", src);
    /* the AVX2 EPYC's built-in entry (2026-11-29): the defaults with fp8 block sums */
    clmla_product_tuning want = d;
    want.cpu_fp8_block_sums = 1;
    CHECK(clmla_product_tuning_resolve(NULL, "", &pocl, 2048, &t, &src) == 1 && strncmp(src, "built-in table", 14) == 0 &&
              memcmp(&t, &want, sizeof(t)) == 0,
          "the AVX2 EPYC's built-in entry: %s, block sums %d", src, t.cpu_fp8_block_sums);
    /* the Max 1550's compiled-not-run entry (issue 58): the defaults with 2 columns a group */
    {
        clmla_device_info pvc;
        memset(&pvc, 0, sizeof(pvc));
        snprintf(pvc.vendor, sizeof(pvc.vendor), "Intel(R) Corporation");
        snprintf(pvc.name, sizeof(pvc.name), "Intel(R) Data Center GPU Max 1550");
        want = d;
        want.skinny_columns = 2;
        CHECK(clmla_product_tuning_resolve(NULL, "", &pvc, 8192, &t, &src) == 1 && memcmp(&t, &want, sizeof(t)) == 0,
              "the Max 1550's built-in entry: %s, columns %d", src, t.skinny_columns);
    }

    /* a file of both kernels: the latent parser skips the product entries and the other way round */
    const char *text =
        "[{\"kernel\": \"attn_latent\", \"vendor\": \"AuthenticAMD\", \"device\": \"pthread-haswell-AMD EPYC\","
        " \"heads\": 16, \"parameters\": {\"rows_keys\": 12}},"
        " {\"kernel\": \"products\", \"vendor\": \"AuthenticAMD\", \"device\": \"pthread-haswell-AMD EPYC\","
        "  \"k_class\": \"any\", \"parameters\": {\"tiled_rows\": 128}},"
        " {\"kernel\": \"products\", \"vendor\": \"AuthenticAMD\", \"device\": \"pthread-haswell-AMD EPYC\","
        "  \"k_class\": \"large\", \"parameters\": {\"cpu_items_per_cu\": 4, \"packed_streams_4\": 2}},"
        " {\"kernel\": \"products\", \"vendor\": \"AuthenticAMD\", \"device\": \"pthread-haswell-AMD EPYC\","
        "  \"driver\": \"9.9\", \"k_class\": \"small\", \"parameters\": {\"tiled_columns\": 7}},"
        " {\"kernel\": \"products\", \"vendor\": \"V\", \"device\": \"Some GPU\", \"parameters\": {\"skinny_items\": 96}},"
        " {\"kernel\": \"products\", \"vendor\": \"V\", \"device\": \"Some GPU\", \"k_class\": \"medium\","
        "  \"parameters\": {}},"
        " {\"kernel\": \"products\", \"vendor\": \"V\", \"device\": \"Some GPU\", \"parameters\": {\"NT\": 1}}]";
    product_entry_list list;
    latent_entry_list latent;
    char why[512];
    CHECK(clmla_latent_tuning_parse(text, &latent, why, sizeof(why)) == 0 && latent.count == 1,
          "latent parse of a mixed file: %s", why);
    clmla_latent_tuning_list_free(&latent);
    const int refused = clmla_product_tuning_parse(text, &list, why, sizeof(why));
    CHECK(refused == 3 && list.count == 3, "refused %d, kept %zu", refused, list.count);
    CHECK(strstr(why, "skinny_items") != NULL, "the refusal does not name skinny_items: %s", why);
    /* the exact class wins over "any"; a driver-specific entry for another driver does not match */
    CHECK(clmla_product_tuning_resolve(&list, "file U", &pocl, 7168, &t, &src) == 2 && strcmp(src, "file U") == 0 &&
              t.cpu_items_per_cu == 4 && t.packed_streams_4 == 2 && t.tiled_rows == 256,
          "large K: %s %d %d", src, t.cpu_items_per_cu, t.tiled_rows);
    CHECK(clmla_product_tuning_resolve(&list, "file U", &pocl, 2048, &t, &src) == 2 && t.tiled_rows == 128 &&
              t.tiled_columns == 48 && t.cpu_items_per_cu == 8,
          "small K: %d %d", t.tiled_rows, t.tiled_columns);
    CHECK(clmla_product_tuning_resolve(&list, "file U", &pocl, 0, &t, &src) == 2 && t.tiled_rows == 128, "K 0: any");
    CHECK(clmla_product_tuning_resolve(&list, "file U", &other, 2048, &t, &src) == 0 && memcmp(&t, &d, sizeof(t)) == 0,
          "a refused entry applied");
    clmla_product_tuning_list_free(&list);
    CHECK(clmla_product_tuning_parse("[{\"kernel\": \"products\", \"vendor\": \"V\", \"device\": \"G\", \"k_class\": "
                                     "\"medium\", \"parameters\": {}}]",
                                     &list, why, sizeof(why)) == 1 &&
              strstr(why, "k_class"),
          "%s", why);
    clmla_product_tuning_list_free(&list);
    CHECK(clmla_product_tuning_parse("[{\"kernel\": \"products\", \"vendor\": \"V\", \"device\": \"G\", "
                                     "\"parameters\": {\"NT\": 1}}]",
                                     &list, why, sizeof(why)) == 1 &&
              strstr(why, "\"NT\""),
          "%s", why);
    clmla_product_tuning_list_free(&list);
    CHECK(clmla_product_tuning_parse("{not json", &list, why, sizeof(why)) == -1 && why[0], "malformed text parsed");
    clmla_product_tuning_list_free(&list);

    /* every check, by name */
    static const bad_value out_of_range[] = {
        PRODUCT_BAD(skinny_items, 8), PRODUCT_BAD(skinny_items, 100), PRODUCT_BAD(skinny_unroll, 0),
        PRODUCT_BAD(skinny_unroll, 9), PRODUCT_BAD(skinny_columns, 3), PRODUCT_BAD(skinny_columns, 16),
        PRODUCT_BAD(skinny_nn_items, 2048), PRODUCT_BAD(cpu_items_per_cu, 0), PRODUCT_BAD(cpu_items_per_cu, 65),
        PRODUCT_BAD(packed_streams_1, 9), PRODUCT_BAD(packed_streams_2, 0), PRODUCT_BAD(packed_streams_4, 5),
        PRODUCT_BAD(cpu_prefetch, 2), PRODUCT_BAD(tiled_rows, 130), PRODUCT_BAD(tiled_rows, 0),
        PRODUCT_BAD(tiled_columns, 513), PRODUCT_BAD(tiled_weight_rows, 5), PRODUCT_BAD(tiled_k_chunk, 1000),
        PRODUCT_BAD(tiled_k_chunk, 0), PRODUCT_BAD(skinny_nn_slices, 0), PRODUCT_BAD(skinny_nn_slices, 6),
        PRODUCT_BAD(skinny_nn_slices, 128), PRODUCT_BAD(skinny_aligned, 2), PRODUCT_BAD(skinny_aligned, -1),
        PRODUCT_BAD(cpu_wide, 2), PRODUCT_BAD(cpu_wide, -1), PRODUCT_BAD(cpu_min_panel, -1),
        PRODUCT_BAD(cpu_min_panel, 65537),
    };
    for (size_t i = 0; i < sizeof(out_of_range) / sizeof(out_of_range[0]); i++) {
        const char *w = NULL;
        t = d;
        *(int *)((char *)&t + out_of_range[i].offset) = out_of_range[i].value;
        CHECK(clmla_product_tuning_check(&t, &w) == CLMLA_ERROR_INVALID_ARGUMENT && w && strstr(w, out_of_range[i].name),
              "%s = %d: %s", out_of_range[i].name, out_of_range[i].value, w ? w : "accepted");
    }
    const char *w = "x";
    CHECK(clmla_product_tuning_check(&d, &w) == CLMLA_SUCCESS && !w, "defaults refused");
    CHECK(clmla_product_tuning_check(NULL, &w) == CLMLA_ERROR_INVALID_ARGUMENT, "NULL accepted");
    CHECK_STATUS(clmla_product_tuning_lookup(NULL, 0, &t, &src), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    CHECK_STATUS(clmla_context_set_product_tuning(NULL, &d), CLMLA_ERROR_INVALID_ARGUMENT, NULL);

    /* save: into a file with a latent entry (kept), each class, one replaced; a malformed file left alone */
    char path[128], bad_path[128];
    snprintf(path, sizeof(path), "%s/products.json", dir);
    snprintf(bad_path, sizeof(bad_path), "%s/bad-products.json", dir);
    clmla_latent_tuning lt;
    clmla_latent_tuning_defaults(&lt);
    CHECK_STATUS(clmla_latent_tuning_save(path, &pocl, 16, &lt, NULL), CLMLA_SUCCESS, NULL);
    t = d;
    t.tiled_columns = 24;
    CHECK_STATUS(clmla_product_tuning_save(path, &pocl, 2048, &t, "note"), CLMLA_SUCCESS, NULL);
    t.packed_streams_1 = 6;
    CHECK_STATUS(clmla_product_tuning_save(path, &pocl, 7168, &t, NULL), CLMLA_SUCCESS, NULL);
    CHECK_STATUS(clmla_product_tuning_save(path, &other, 0, &d, NULL), CLMLA_SUCCESS, NULL);
    t.tiled_columns = 96;
    t.packed_streams_1 = 8;
    CHECK_STATUS(clmla_product_tuning_save(path, &pocl, 1536, &t, NULL), CLMLA_SUCCESS, NULL); /* replaces "small" */
    t.tiled_rows = 130;
    CHECK_STATUS(clmla_product_tuning_save(path, &pocl, 1536, &t, NULL), CLMLA_ERROR_INVALID_ARGUMENT, NULL);
    char buf[16384];
    read_text(path, buf, sizeof(buf));
    CHECK(clmla_product_tuning_parse(buf, &list, why, sizeof(why)) == 0 && list.count == 3, "saved file: %s (%zu)", why,
          list.count);
    CHECK(clmla_product_tuning_resolve(&list, "f", &pocl, 2048, &t, &src) == 2 && t.tiled_columns == 96 &&
              t.packed_streams_1 == 8,
          "replaced entry: %d", t.tiled_columns);
    CHECK(clmla_product_tuning_resolve(&list, "f", &pocl, 7168, &t, &src) == 2 && t.tiled_columns == 24 &&
              t.packed_streams_1 == 6,
          "large entry");
    CHECK(clmla_product_tuning_resolve(&list, "f", &other, 99999, &t, &src) == 2 && memcmp(&t, &d, sizeof(t)) == 0,
          "merged \"any\" entry");
    clmla_product_tuning_list_free(&list);
    CHECK(clmla_latent_tuning_parse(buf, &latent, why, sizeof(why)) == 0 && latent.count == 1, "latent entry lost: %s",
          why);
    clmla_latent_tuning_list_free(&latent);
    write_text(bad_path, "[{\"kernel\": \"products\", \"vendor\": \"V\", \"device\": \"G\", \"parameters\": {\"tiled_rows\": 3}}]");
    CHECK_STATUS(clmla_product_tuning_save(bad_path, &pocl, 0, &d, NULL), CLMLA_ERROR_INVALID_FILE, NULL);
    CHECK_STATUS(clmla_latent_tuning_save(bad_path, &pocl, 16, &lt, NULL), CLMLA_ERROR_INVALID_FILE, NULL);
}

/* float8 e4m3 (FN) to double */
static double fp8_value(uint8_t c)
{
    const int e = (c >> 3) & 15, m = c & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return c >> 7 ? -v : v;
}

/* A weight [n, k] of dtype: codes for the library, the values it holds for the reference. */
typedef struct pweight {
    int n, k;
    clmla_dtype dtype;
    void *codes;
    float *scales;
    double *values;
} pweight;

static void pweight_make(pweight *w, int n, int k, clmla_dtype dtype, uint32_t s)
{
    w->n = n;
    w->k = k;
    w->dtype = dtype;
    const size_t count = (size_t)n * k, sr = ((size_t)n + 127) / 128, sc = ((size_t)k + 127) / 128;
    const size_t eb = dtype == CLMLA_DTYPE_F32 ? 4 : dtype == CLMLA_DTYPE_FP8_E4M3 ? 1 : 2;
    w->codes = malloc(count * eb);
    w->values = malloc(count * sizeof(double));
    w->scales = dtype == CLMLA_DTYPE_FP8_E4M3 ? malloc(sr * sc * sizeof(float)) : NULL;
    for (size_t i = 0; w->scales && i < sr * sc; i++)
        w->scales[i] = 0.25f + 0.0625f * (float)(i % 13);
    for (size_t i = 0; i < count; i++) {
        const float v = RND();
        if (dtype == CLMLA_DTYPE_F32) {
            ((float *)w->codes)[i] = v;
            w->values[i] = v;
        } else if (dtype == CLMLA_DTYPE_BF16) {
            uint32_t bits;
            memcpy(&bits, &v, 4);
            bits &= 0xffff0000u;
            float back;
            memcpy(&back, &bits, 4);
            ((uint16_t *)w->codes)[i] = (uint16_t)(bits >> 16);
            w->values[i] = back;
        } else {
            uint8_t c = (uint8_t)(RND() * 127.0f + 128.0f);
            if ((c & 0x7f) == 0x7f)
                c ^= 1;
            ((uint8_t *)w->codes)[i] = c;
            w->values[i] = fp8_value(c) * w->scales[(i / (size_t)k / 128) * sc + (i % (size_t)k) / 128];
        }
    }
}

static void pweight_free(pweight *w)
{
    free(w->codes);
    free(w->scales);
    free(w->values);
}

/* The largest error of y [m, n] = x W^T against float64, relative to the sum of |x_i w_i|. */
static double product_error(const pweight *w, int m, const float *x, const float *y)
{
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < w->n; j++) {
            double ref = 0, mag = 1e-30;
            for (int c = 0; c < w->k; c++) {
                const double p = (double)x[(size_t)i * w->k + c] * w->values[(size_t)j * w->k + c];
                ref += p;
                mag += fabs(p);
            }
            worst = fmax(worst, fabs(y[(size_t)i * w->n + j] - ref) / mag);
        }
    return worst;
}

/* The values of every candidate of `clmla tune --kernels --products --quick`'s grids (cmd_tune.c,
   pt_grid), and the other parameters at values off their defaults, give y = x W^T of the float64
   reference, on
   shapes that are multiples of nothing, at 1, 2, 3 and 8 rows and at 77 (the tiled kernel), through a
   packed weight (clmla_linear: panels of cpu_items_per_cu) and a row-major one (clmla_gemm: the
   row kernels and the tiles with tiled_k_chunk), in every weight dtype but f16. */
static void test_products_device(clmla_context *ctx, int other_kind)
{
    uint32_t s = 4242;
    clmla_product_tuning d, cands[24];
    clmla_product_tuning_defaults(&d);
    int nc = 0;
    cands[nc++] = d;
#define SET(field, v) (cands[nc].field = (v))
    /* Each set changes the parameters of different kernels at once (the decode kernels of CPUs,
       the tiles, the GPU kernels), so that the quick grid's candidates of all three searches are
       covered by a few builds: A and B hold the quick grid's CPU and tiled candidates with a GPU
       one each, C the third tiled and GPU ones, D and E the other values off their defaults. */
    cands[nc] = d; /* A */
    SET(cpu_items_per_cu, 4), SET(tiled_rows, 128), SET(skinny_items, 256), nc++;
    cands[nc] = d; /* B */
    SET(packed_streams_1, 4), SET(tiled_columns, 96), SET(skinny_unroll, 4), nc++;
    cands[nc] = d; /* C */
    SET(tiled_weight_rows, 2), SET(skinny_columns, 8), SET(packed_streams_2, 3), SET(packed_streams_4, 1);
    SET(cpu_prefetch, 0), SET(tiled_k_chunk, 384), SET(skinny_nn_items, 16), nc++;
    cands[nc] = d; /* D */
    SET(cpu_items_per_cu, 3), SET(packed_streams_1, 5), SET(packed_streams_4, 4), SET(tiled_rows, 20);
    SET(tiled_columns, 7), SET(tiled_weight_rows, 4), nc++;
    cands[nc] = d; /* E */
    SET(tiled_weight_rows, 1), SET(packed_streams_2, 8), SET(tiled_k_chunk, 128), nc++;
    cands[nc] = d; /* F: fp8 block sums, at the default streams and at others */
    SET(cpu_fp8_block_sums, 1), nc++;
    cands[nc] = d;
    SET(cpu_fp8_block_sums, 1), SET(packed_streams_1, 3), SET(packed_streams_2, 5), nc++;
    const int g = nc;
    cands[nc] = d; /* G: the GPU kernel's wider loads */
    SET(skinny_vector, 16), nc++;
    cands[nc] = d;
    SET(skinny_vector, 8), SET(skinny_unroll, 1), SET(skinny_columns, 2), nc++;
    cands[nc] = d; /* H: loads through vloadN, the defaults' whole-vector loads off (the defaults take them at
                      K 1100, aligned at 4 values a load; at 4105 not: the kernel without) */
    SET(skinny_aligned, 0), nc++;
#undef SET
    const int rows_counts = other_kind ? 4 : 5;
    if (other_kind) { /* the other kind's kernels (a GPU's on a CPU): the defaults, A, G's two and H, 1-8 rows */
        for (int i = 0; i < 3; i++)
            cands[2 + i] = cands[g + i];
        nc = 5;
    }
    enum { SHAPES = 2, MAXM = 77 };
    const int shape_n[SHAPES] = {203, 67}, shape_k[SHAPES] = {1100, 4105}; /* K 4105: the "large" class */
    const clmla_dtype dts[3] = {CLMLA_DTYPE_F32, CLMLA_DTYPE_BF16, CLMLA_DTYPE_FP8_E4M3};
    const int ms[5] = {1, 2, 3, 8, MAXM};
    pweight ws[SHAPES][3];
    for (int s = 0; s < SHAPES; s++)
        for (int t = 0; t < 3; t++)
            pweight_make(&ws[s][t], shape_n[s], shape_k[s], dts[t], 17u * (uint32_t)(s * 3 + t) + 1);
    float *x = malloc((size_t)MAXM * 4105 * sizeof(float)), *y = malloc((size_t)MAXM * 203 * sizeof(float));
    for (int i = 0; i < MAXM * 4105; i++)
        x[i] = RND();
    cl_context clctx = clmla_context_cl_context(ctx);
    cl_command_queue q = clmla_context_queue(ctx);
    cl_int err;
    cl_mem bx = clCreateBuffer(clctx, CL_MEM_COPY_HOST_PTR, (size_t)MAXM * 4105 * sizeof(float), x, &err);
    cl_mem by = clCreateBuffer(clctx, CL_MEM_READ_WRITE, (size_t)MAXM * 203 * sizeof(float), NULL, &err);
    double worst = 0;
    for (int c = 0; c < nc; c++) {
        CHECK_STATUS(clmla_context_set_product_tuning(ctx, &cands[c]), CLMLA_SUCCESS, ctx);
        for (int s = 0; s < SHAPES; s++)
            for (int t = 0; t < 3; t++) {
                const pweight *w = &ws[s][t];
                clmla_tensor tensor = {w->codes, 2, {w->n, w->k}, w->dtype, w->scales};
                clmla_linear *lin = NULL;
                CHECK_STATUS(clmla_linear_create(ctx, &tensor, &lin), CLMLA_SUCCESS, ctx);
                /* the same weight row-major, for clmla_gemm's unpacked paths */
                const size_t eb = w->dtype == CLMLA_DTYPE_F32 ? 4 : w->dtype == CLMLA_DTYPE_FP8_E4M3 ? 1 : 2;
                const size_t sbytes = ((size_t)(w->n + 127) / 128) * ((size_t)(w->k + 127) / 128) * sizeof(float);
                cl_mem bw = clCreateBuffer(clctx, CL_MEM_COPY_HOST_PTR, (size_t)w->n * w->k * eb, w->codes, &err);
                cl_mem bs = w->scales ? clCreateBuffer(clctx, CL_MEM_COPY_HOST_PTR, sbytes, w->scales, &err) : NULL;
                for (int mi = 0; mi < rows_counts && lin; mi++) {
                    const int m = ms[mi];
                    for (int path = 0; path < 2; path++) {
                        clmla_status st;
                        if (path == 0)
                            st = clmla_linear_forward(lin, m, x, y);
                        else {
                            clmla_matrix a = {bx, 0, (size_t)w->k, 0, 0, CLMLA_DTYPE_F32, NULL, 0};
                            clmla_matrix b = {bw, 0, (size_t)w->k, 1, 0, w->dtype, bs, (size_t)(w->k + 127) / 128};
                            clmla_matrix cm = {by, 0, (size_t)w->n, 0, 0, CLMLA_DTYPE_F32, NULL, 0};
                            st = clmla_gemm(ctx, (size_t)m, (size_t)w->n, (size_t)w->k, 1.0f, a, b, 0.0f, cm, NULL);
                            if (st == CLMLA_SUCCESS)
                                clEnqueueReadBuffer(q, by, CL_TRUE, 0, (size_t)m * w->n * sizeof(float), y, 0, NULL, NULL);
                        }
                        CHECK_STATUS(st, CLMLA_SUCCESS, ctx);
                        const double e = st == CLMLA_SUCCESS ? product_error(w, m, x, y) : 1;
                        CHECK(e < 1e-5, "candidate %d, %d x %d %s, %d rows, %s: relative error %.2e", c, w->n, w->k,
                              clmla_dtype_name(w->dtype), m, path ? "row-major" : "packed", e);
                        worst = fmax(worst, e);
                    }
                }
                clmla_linear_destroy(lin);
                clReleaseMemObject(bw);
                if (bs)
                    clReleaseMemObject(bs);
            }
    }
    CHECK_STATUS(clmla_context_set_product_tuning(ctx, NULL), CLMLA_SUCCESS, ctx);
    printf("products%s: %d parameter sets x 2 shapes x 3 dtypes x %d row counts x 2 layouts, largest relative error "
           "%.2e\n", other_kind ? " (the other kind of device's kernels)" : "", nc, rows_counts, worst);
    clReleaseMemObject(bx);
    clReleaseMemObject(by);
    free(x);
    free(y);
    for (int s = 0; s < SHAPES; s++)
        for (int t = 0; t < 3; t++)
            pweight_free(&ws[s][t]);
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
    /* a part by name (ctest runs them as entries of their own, in parallel: a GPU's compiler takes
       seconds a program), or every part but malformed */
    static const char *const part_names[] = {"malformed", "entries", "products", "products-other"};
    int part = -1;
    if (argc > 1) {
        for (int i = 0; i < 4; i++)
            if (strcmp(argv[1], part_names[i]) == 0)
                part = i;
        if (part < 0) {
            printf("usage: test_kernel_tuning [malformed | entries | products | products-other]\n");
            return 2;
        }
    }
    const int malformed = part == 0;
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
        clmla_product_tuning pt, pd;
        clmla_product_tuning_defaults(&pd);
        /* the file ignored: the built-in table's entry for this device, else the defaults */
        CHECK(clmla_product_tuning_lookup(&info, 2048, &pt, &src) == CLMLA_ERROR_INVALID_FILE &&
                  (strncmp(src, "built-in table", 14) == 0 || (strcmp(src, "defaults") == 0 && memcmp(&pt, &pd, sizeof(pt)) == 0)),
              "malformed file, products: %s", src);
        printf("reported: %s\n", clmla_last_error(NULL));
    } else if (part < 0 || part == 1) {
        test_parse();
        /* non-default values for this device, both kernels */
        char text[2048];
        snprintf(text, sizeof(text),
                 "[{\"kernel\": \"attn_latent\", \"vendor\": \"%s\", \"device\": \"%s\", \"heads\": 16, \"parameters\": "
                 "{\"rows_heads\": 6, \"rows_keys\": 12, \"rows_groups_per_cu\": 3, \"group_heads\": 8, "
                 "\"group_keys\": 2, \"group_max_items\": 64, \"group_groups_per_cu\": 3, \"group_query_layout\": 0, "
                 "\"prefill_tiled\": 0, \"group_decode_heads\": 16, \"prefill_queries\": 8, "
                 "\"prefill_keys\": 16, \"prefill_chunk\": 128, \"prefill_rows_queries\": 24, \"group_aligned\": 2, "
                 "\"group_row_slices\": 0, \"prefill_item_keys\": 2}}]",
                 info.vendor, info.name);
        write_text(user, text);
        CHECK_STATUS(clmla_latent_tuning_lookup(&info, 16, &t, &src), CLMLA_SUCCESS, NULL);
        CHECK(strncmp(src, "file ", 5) == 0 && t.rows_heads == 6 && t.rows_keys == 12 && t.group_max_items == 64 &&
                  t.group_query_layout == 0 && t.prefill_tiled == 0 && t.group_decode_heads == 16 &&
                  t.prefill_queries == 8 && t.prefill_keys == 16 && t.prefill_chunk == 128 &&
                  t.prefill_rows_queries == 24 && t.group_aligned == 2 && t.group_row_slices == 0 &&
                  t.prefill_item_keys == 2,
              "user entry not applied: %s", src);
        test_attention(ctx, CLMLA_LATENT_ROWS);
        test_attention(ctx, CLMLA_LATENT_GROUP);
    }
    if (part < 0 || part == 2) {
        test_products_parse();
        test_products_device(ctx, 0);
    }
    if (part < 0 || part == 3) {
        /* the same on the other kind of device: the products' kernels are chosen by it (CPUs:
           gemm_packed_rows, gemm_tiled_rows; GPUs: gemm_skinny_nt and CLBlast) */
        const clmla_device_kind real = ctx->info.kind;
        ctx->info.kind = real == CLMLA_DEVICE_KIND_CPU ? CLMLA_DEVICE_KIND_GPU : CLMLA_DEVICE_KIND_CPU;
        test_products_device(ctx, 1);
        ctx->info.kind = real;
    }
    clmla_context_destroy(ctx);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", dir);
    return check_summary();
}
