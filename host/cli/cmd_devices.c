/* clmla devices [--json] [--device SPEC]: the device table, and which device a spec picks. */
#include "args.h"
#include "clmla.h"
#include "clmla_tuning.h"
#include "commands.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

/* What clmla devices --help says of the command. */
static const char summary[] =
    "Lists every OpenCL device: flat index, P:D, type, vendor, name, global memory,\n"
    "compute units, max work-group size, local memory, fp16 arithmetic; '*' marks the\n"
    "device the default spec picks, '>' the one --device picks.";

static int print_json(const clmla_device_info *devs, size_t n, size_t selected)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n && arr; i++) {
        const clmla_device_info *d = &devs[i];
        cJSON *o = cJSON_CreateObject();
        char pd[32];
        snprintf(pd, sizeof(pd), "%d:%d", d->platform_index, d->device_index);
        cJSON_AddNumberToObject(o, "index", d->index);
        cJSON_AddStringToObject(o, "platform_device", pd);
        cJSON_AddStringToObject(o, "type", clmla_device_kind_name(d->kind));
        cJSON_AddStringToObject(o, "platform", d->platform_name);
        cJSON_AddStringToObject(o, "vendor", d->vendor);
        cJSON_AddStringToObject(o, "name", d->name);
        cJSON_AddStringToObject(o, "device_version", d->device_version);
        cJSON_AddStringToObject(o, "driver_version", d->driver_version);
        cJSON_AddNumberToObject(o, "global_mem_mib", (double)(d->global_mem_bytes >> 20));
        cJSON_AddNumberToObject(o, "compute_units", d->compute_units);
        cJSON_AddNumberToObject(o, "max_work_group_size", (double)d->max_work_group_size);
        cJSON_AddNumberToObject(o, "local_mem_kib", (double)(d->local_mem_bytes >> 10));
        cJSON_AddBoolToObject(o, "fp16", d->fp16);
        cJSON_AddBoolToObject(o, "default", d->is_default);
        cJSON_AddBoolToObject(o, "selected", i == selected);
        cJSON_AddItemToArray(arr, o);
    }
    char *text = arr ? cJSON_Print(arr) : NULL;
    if (!text) {
        cJSON_Delete(arr);
        fprintf(stderr, "clmla devices: out of memory\n");
        return 1;
    }
    printf("%s\n", text);
    free(text);
    cJSON_Delete(arr);
    return 0;
}

/* Which latent attention parameters apply to each device, for V2-Lite's 16 heads and V3's 128, and
   which product parameters, for each shape class of K. */
static void print_tuning(const clmla_device_info *devs, size_t n)
{
    char path[4096];
    if (clmla_latent_tuning_path(path, sizeof(path)) != CLMLA_SUCCESS)
        path[0] = '\0';
    printf("\nlatent attention kernel tuning (user file: %s):\n", path[0] ? path : "none");
    for (size_t i = 0; i < n; i++) {
        const int rows = cli_runs_row_kernels(&devs[i]);
        static const int heads[] = {16, 128};
        for (int h = 0; h < 2; h++) {
            clmla_latent_tuning t;
            const char *source = NULL;
            if (clmla_latent_tuning_lookup(&devs[i], heads[h], &t, &source) != CLMLA_SUCCESS && i == 0 && h == 0)
                printf("  warning: %s\n", clmla_last_error(NULL));
            printf("  %zu %-3d heads: %s, ", i, heads[h], source);
            if (rows)
                printf("%s rows_heads=%d rows_keys=%d rows_groups_per_cu=%d rows_lanes=%d, prefill_rows_queries=%d\n",
                       t.rows_lanes ? "attn_latent_lanes" : "attn_latent_rows", t.rows_heads, t.rows_keys,
                       t.rows_groups_per_cu, t.rows_lanes, t.prefill_rows_queries);
            else
                printf("attn_latent group_heads=%d group_keys=%d group_max_items=%d group_groups_per_cu=%d "
                       "group_query_layout=%d group_fold=%d group_decode_heads=%d group_min_split_keys=%d "
                       "group_aligned=%d group_row_slices=%d group_mma=%d group_large_grf=%d, prefill_tiled=%d "
                       "prefill_queries=%d prefill_keys=%d prefill_chunk=%d prefill_item_keys=%d\n",
                       t.group_heads, t.group_keys, t.group_max_items, t.group_groups_per_cu, t.group_query_layout,
                       t.group_fold, t.group_decode_heads, t.group_min_split_keys, t.group_aligned,
                       t.group_row_slices, t.group_mma, t.group_large_grf, t.prefill_tiled, t.prefill_queries,
                       t.prefill_keys, t.prefill_chunk, t.prefill_item_keys);
        }
    }
    printf("\nproduct kernel tuning (the same file):\n");
    for (size_t i = 0; i < n; i++) {
        const int cpu = cli_runs_row_products(&devs[i]); /* the forms in force: CLMLA_PRODUCT_KERNELS, else the kind */
        static const size_t ks[] = {2048, 7168};
        for (int c = 0; c < 2; c++) {
            clmla_product_tuning t;
            const char *source = NULL;
            clmla_product_tuning_lookup(&devs[i], ks[c], &t, &source);
            printf("  %zu K %s 4096: %s, ", i, c ? "> " : "<=", source);
            if (cpu)
                printf("gemm_packed_rows cpu_items_per_cu=%d packed_streams_1/2/4=%d/%d/%d cpu_prefetch=%d "
                       "cpu_fp8_block_sums=%d cpu_wide=%d cpu_min_panel=%d, gemm_tiled_rows tiled_rows=%d "
                       "tiled_columns=%d tiled_weight_rows=%d tiled_k_chunk=%d\n",
                       t.cpu_items_per_cu, t.packed_streams_1, t.packed_streams_2, t.packed_streams_4, t.cpu_prefetch,
                       t.cpu_fp8_block_sums, t.cpu_wide, t.cpu_min_panel, t.tiled_rows, t.tiled_columns,
                       t.tiled_weight_rows, t.tiled_k_chunk);
            else
                printf("gemm_skinny_nt skinny_items=%d skinny_unroll=%d skinny_columns=%d skinny_vector=%d "
                       "skinny_aligned=%d, gemm_skinny_nn skinny_nn_items=%d skinny_nn_slices=%d\n",
                       t.skinny_items, t.skinny_unroll, t.skinny_columns, t.skinny_vector, t.skinny_aligned,
                       t.skinny_nn_items, t.skinny_nn_slices);
        }
    }
}

int cmd_devices(int argc, char **argv)
{
    int exit_code = 0, json = 0, verbose = 0;
    const char *device = NULL;
    cli_option opts[] = {
        {"device", CLI_STRING, &device, "SPEC  mark the device SPEC picks (fails when it picks none)"},
        {"json", CLI_FLAG, &json, "print a JSON array instead of the table"},
        {"verbose", CLI_FLAG, &verbose, "also say which kernel tuning (latent attention, products) applies to each device"},
        {NULL, CLI_FLAG, NULL, NULL},
    };
    if (cli_start("devices", summary, opts, argc, argv, &exit_code))
        return exit_code;
    clmla_device_info *devs = NULL;
    size_t n = 0;
    clmla_status st = clmla_devices_list(&devs, &n);
    if (st != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla devices: %s\n", clmla_last_error(NULL));
        return 1;
    }
    size_t selected = (size_t)-1;
    if (device) {
        st = clmla_device_resolve(device, &selected);
        if (st != CLMLA_SUCCESS) {
            fprintf(stderr, "clmla devices: %s\n", clmla_last_error(NULL));
            clmla_free(devs);
            return 1;
        }
    }
    int rc = 0;
    if (json) {
        rc = print_json(devs, n, selected);
    } else {
        /* the name last and whole: device names run long ("pthread-skylake-avx512-Intel(R) Xeon(R) ...") */
        printf("   %-3s %-5s %-5s %-22s %9s %4s %6s %7s %4s  %s\n", "#", "P:D", "type", "vendor", "mem MiB", "CUs",
               "max WG", "lmem KiB", "fp16", "name");
        for (size_t i = 0; i < n; i++) {
            const clmla_device_info *d = &devs[i];
            char pd[32];
            snprintf(pd, sizeof(pd), "%d:%d", d->platform_index, d->device_index);
            printf("%c%c %-3zu %-5s %-5s %-22.22s %9llu %4u %6zu %7llu %4s  %s\n", d->is_default ? '*' : ' ',
                   i == selected ? '>' : ' ', i, pd, clmla_device_kind_name(d->kind), d->vendor,
                   (unsigned long long)(d->global_mem_bytes >> 20), d->compute_units, d->max_work_group_size,
                   (unsigned long long)(d->local_mem_bytes >> 10), d->fp16 ? "yes" : "no", d->name);
        }
        printf("\n* = picked by the default spec (CLMLA_DEVICE unset: first GPU, else first device)\n");
        if (verbose)
            print_tuning(devs, n);
    }
    clmla_free(devs);
    return rc;
}
