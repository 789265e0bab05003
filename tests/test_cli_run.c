/* `clmla run` end to end: tiny model folders and X.npy written here, the command run with
   combinations of --prefill, --chunk, --path, --cache-dtype, --block-size and --layer, and Y.npy
   compared with the float64 reference on the weights as the checkpoint holds them. Bad inputs
   must fail with a message that says what is wrong. */
#include "check.h"
#include "checkpoint_writer.h"
#include "clmla.h"
#include "mla_ref.h"
#include "tolerance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CLMLA_CLI_PATH
#error "CLMLA_CLI_PATH must name the clmla executable"
#endif

enum { T = 9 };

static char root[512], log_path[700];

/* Runs `clmla run ARGS` with output into log_path; returns the exit status. */
static int run_cli(const char *args)
{
    return ckpt_run_cli(CLMLA_CLI_PATH, args, log_path);
}

static const char *read_log(void)
{
    return ckpt_read_text(log_path);
}

/* Runs the command and compares Y with ref [T, D]. */
static void run_and_compare(const char *what, const char *model, const char *x_path, const char *extra, const double *ref,
                            int D, double tolerance)
{
    char y_path[700], args[3000];
    snprintf(y_path, sizeof(y_path), "%s/y.npy", root);
    remove(y_path);
    snprintf(args, sizeof(args), "--model '%s' --input '%s' --output '%s' %s", model, x_path, y_path, extra);
    const int rc = run_cli(args);
    CHECK(rc == 0, "%s: clmla run %s exited with %d:\n%s", what, extra, rc, read_log());
    if (rc != 0)
        return;
    float *y = NULL;
    int64_t shape[2];
    int ndim = 0;
    const clmla_status st = clmla_npy_read_f32(y_path, &y, shape, &ndim);
    CHECK(st == CLMLA_SUCCESS && ndim == 2 && shape[0] == T && shape[1] == D, "%s: Y.npy: %s", what, clmla_last_error(NULL));
    if (st == CLMLA_SUCCESS && ndim == 2 && shape[0] == T && shape[1] == D) {
        size_t worst = 0;
        const double err = mla_ref_max_rel_err(y, ref, (size_t)T * D, &worst);
        CHECK(err <= tolerance, "%s (%s): error %.3g at %zu against the reference (tolerance %.0e)", what, extra, err, worst,
              tolerance);
        printf("  %-40s %-52s %.2e\n", what, extra, err);
    }
    clmla_free(y);
}

/* Runs the command and expects exit status `want_rc` (-1: any failure) and a needle in the output. */
static void run_fails(const char *args, int want_rc, const char *needle)
{
    const int rc = run_cli(args);
    CHECK(want_rc < 0 ? rc != 0 : rc == want_rc, "clmla run %s: exit status %d, expected %d", args, rc, want_rc);
    const char *text = read_log();
    CHECK(strstr(text, needle) != NULL, "clmla run %s: output lacks \"%s\":\n%s", args, needle, text);
}

static int reference(const clmla_layer_config *c, const ckpt_weights *w, const float *x, double *out)
{
    const mla_ref_config rc = ckpt_ref_config(c);
    const mla_ref_weights rw = ckpt_ref_weights(w);
    return mla_ref_forward(&rc, &rw, T, x, MLA_REF_ABSORBED, out, NULL, NULL, NULL, NULL, NULL, NULL);
}

/* Writes x [T, D] as a float16 .npy (the test's own encoder) and rounds x to what it holds. */
static int write_f16_npy(const char *path, float *x, int D)
{
    char header[128];
    int n = snprintf(header, sizeof(header), "{'descr': '<f2', 'fortran_order': False, 'shape': (%d, %d), }", T, D);
    while ((10 + n + 1) % 64)
        header[n++] = ' ';
    header[n++] = '\n';
    const size_t size = 10 + (size_t)n + (size_t)T * D * 2;
    unsigned char *buf = malloc(size);
    if (!buf)
        return -1;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)n;
    buf[9] = 0;
    memcpy(buf + 10, header, (size_t)n);
    for (int i = 0; i < T * D; i++) {
        const uint16_t h = ckpt_encode_f16(x[i]);
        buf[10 + n + 2 * i] = (unsigned char)h;
        buf[10 + n + 2 * i + 1] = (unsigned char)(h >> 8);
        x[i] = (float)ckpt_value_f16(h);
    }
    const int rc = ckpt_write_bytes(path, buf, size);
    free(buf);
    return rc;
}

int main(void)
{
    if (ckpt_make_temp_dir(root, sizeof(root), "cli-run") != 0)
        return 1;
    snprintf(log_path, sizeof(log_path), "%s/log.txt", root);
    printf("test_cli_run: %s, files under %s\n", CLMLA_CLI_PATH, root);

    /* A: V3-like, F8_E4M3 in three shards, q_lora, YaRN, two layers. B: V2-Lite-like, BF16 single file. */
    char model_a[600], model_b[600], x_path[600], x16_path[600], path[700];
    snprintf(model_a, sizeof(model_a), "%s/model-a", root);
    snprintf(model_b, sizeof(model_b), "%s/model-b", root);
    ckpt_model a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    a.config = ckpt_tiny_config(1, 1);
    a.num_layers = 2;
    a.dtype = "F8_E4M3";
    a.shards = 3;
    a.extras = 1;
    a.seed = 11;
    b.config = ckpt_tiny_config(0, 0);
    b.dtype = "BF16";
    b.model_type = "deepseek_v2";
    b.seed = 12;
    ckpt_weights wa[2], wb[1];
    memset(wa, 0, sizeof(wa));
    memset(wb, 0, sizeof(wb));
    const int D = a.config.hidden_size;
    float *x = malloc(sizeof(float) * T * D);
    double *ref_a0 = malloc(sizeof(double) * T * D), *ref_a1 = malloc(sizeof(double) * T * D);
    double *ref_b = malloc(sizeof(double) * T * D), *ref_b16 = malloc(sizeof(double) * T * D);
    uint64_t rng = 5;
    const int64_t x_shape[2] = {T, D};
    if (!x || !ref_a0 || !ref_a1 || !ref_b || !ref_b16 || ckpt_write_model(model_a, &a, wa) != 0 ||
        ckpt_write_model(model_b, &b, wb) != 0) {
        printf("FAIL: could not write the models\n");
        return 1;
    }
    ckpt_fill_random(x, (size_t)T * D, 1.0f, 0, &rng);
    snprintf(x_path, sizeof(x_path), "%s/x.npy", root);
    snprintf(x16_path, sizeof(x16_path), "%s/x16.npy", root);
    CHECK_STATUS(clmla_npy_write_f32(x_path, x, 2, x_shape), CLMLA_SUCCESS, NULL);
    CHECK(reference(&a.config, &wa[0], x, ref_a0) == 0 && reference(&a.config, &wa[1], x, ref_a1) == 0 &&
              reference(&b.config, &wb[0], x, ref_b) == 0,
          "reference");
    CHECK(write_f16_npy(x16_path, x, D) == 0 && reference(&b.config, &wb[0], x, ref_b16) == 0, "float16 input");

    static const struct {
        const char *extra;
        int layer;
        double tolerance;
    } runs_a[] = {
        {"", 0, TOL_F32_CACHE},
        {"--prefill 5 --chunk 2 --path absorbed", 0, TOL_F32_CACHE},
        {"--prefill 4 --path decompressed --block-size 3", 0, TOL_F32_CACHE},
        {"--prefill 7 --chunk 3 --path auto --block-size 2", 0, TOL_F32_CACHE},
        {"--prefill 0 --path absorbed", 0, TOL_F32_CACHE},
        {"--prefill 3 --chunk 1 --cache-dtype f16", 0, TOL_F16_CACHE},
        {"--prefill 2 --chunk 3 --cache-dtype bf16", 0, TOL_BF16_CACHE},
        {"--layer 1 --prefill 6 --chunk 5 --path decompressed", 1, TOL_F32_CACHE},
        {"--layer 1 --device 0", 1, TOL_F32_CACHE},
    };
    for (size_t i = 0; i < sizeof(runs_a) / sizeof(runs_a[0]); i++)
        run_and_compare("F8_E4M3 sharded, q_lora, yarn", model_a, x_path, runs_a[i].extra,
                        runs_a[i].layer ? ref_a1 : ref_a0, D, runs_a[i].tolerance);
    run_and_compare("BF16 single, q_proj, plain RoPE", model_b, x_path, "", ref_b, D, TOL_F32_CACHE);
    run_and_compare("BF16 single, q_proj, plain RoPE", model_b, x_path, "--prefill 2 --path decompressed", ref_b, D,
                    TOL_F32_CACHE);
    run_and_compare("BF16 single, float16 X.npy", model_b, x16_path, "--prefill 4 --chunk 2", ref_b16, D, TOL_F32_CACHE);

    /* Refusals. */
    char args[3000], y_path[700];
    snprintf(y_path, sizeof(y_path), "%s/y-bad.npy", root);
    snprintf(args, sizeof(args), "--input '%s' --output '%s'", x_path, y_path);
    run_fails(args, 2, "--model, --input and --output are required");
    snprintf(args, sizeof(args), "--model '%s' --input '%s' --output '%s' --layer 2", model_a, x_path, y_path);
    run_fails(args, 2, "--layer 2 is out of range: the model has 2 layers");
    snprintf(args, sizeof(args), "--model '%s' --input '%s' --output '%s' --prefill 10", model_a, x_path, y_path);
    run_fails(args, 2, "--prefill 10 is more than the 9 tokens");
    snprintf(args, sizeof(args), "--model '%s' --input '%s' --output '%s' --path fast", model_a, x_path, y_path);
    run_fails(args, 2, "--path must be auto, absorbed or decompressed, not 'fast'");
    snprintf(args, sizeof(args), "--model '%s' --input '%s' --output '%s' --cache-dtype fp4", model_a, x_path, y_path);
    run_fails(args, 2, "--cache-dtype must be one of f32|f16|bf16");
    snprintf(args, sizeof(args), "--model '%s/nothing' --input '%s' --output '%s'", root, x_path, y_path);
    run_fails(args, 1, "nothing/config.json: cannot open");
    const int64_t wrong_shape[2] = {3, 7};
    snprintf(path, sizeof(path), "%s/wrong.npy", root);
    CHECK_STATUS(clmla_npy_write_f32(path, x, 2, wrong_shape), CLMLA_SUCCESS, NULL);
    snprintf(args, sizeof(args), "--model '%s' --input '%s' --output '%s'", model_a, path, y_path);
    run_fails(args, 1, "has shape (3, 7), expected (T, 160)");
    const int64_t flat_shape[2] = {160, 0};
    CHECK_STATUS(clmla_npy_write_f32(path, x, 1, flat_shape), CLMLA_SUCCESS, NULL);
    run_fails(args, 1, "has shape (160,), expected (T, 160)");
    {
        const char dict[] = "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 1), }\n";
        unsigned char buf[128] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(sizeof(dict) - 1), 0};
        memcpy(buf + 10, dict, sizeof(dict) - 1);
        ckpt_write_bytes(path, buf, 10 + sizeof(dict) - 1 + 4);
    }
    run_fails(args, 1, "Fortran order");
    /* A model whose weights are missing one tensor: named. */
    snprintf(path, sizeof(path), "%s/model-a/model-00002-of-00003.safetensors", root);
    remove(path);
    snprintf(args, sizeof(args), "--model '%s' --input '%s' --output '%s'", model_a, x_path, y_path);
    run_fails(args, 1, "names shard 'model-00002-of-00003.safetensors'");
    run_fails("--bogus", 2, "unknown option '--bogus'");

    for (int l = 0; l < 2; l++)
        tu_weights_free(&wa[l]);
    tu_weights_free(&wb[0]);
    free(x);
    free(ref_a0);
    free(ref_a1);
    free(ref_b);
    free(ref_b16);
    ckpt_remove_dir(root);
    return check_summary();
}
