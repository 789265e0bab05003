/* clmla run: one attention layer of a Hugging Face model folder over the hidden states of one
   sequence, prefill (optionally in chunks) then token-by-token decode through the paged latent
   cache; the attention output after o_proj is written as .npy. */
#include "args.h"
#include "clmla.h"
#include "commands.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What clmla run --help says of the command. */
static const char summary[] =
    "Runs the attention of one layer of a Hugging Face model folder (config.json +\n"
    "safetensors, F32/F16/BF16/F8_E4M3) over the hidden states X of one sequence at\n"
    "positions 0..T-1 and writes the output after o_proj (no residual) to Y. A\n"
    "\"shared\" sparse-attention layer (glm_moe_dsa) runs after its full layer, which\n"
    "takes the same X, in every step.";

/* A shared layer (glm_moe_dsa) attends to the selection of the full layer before it: the model of
   layers [full, N] (clmla_model), found by starting the range one layer earlier until it begins on
   the full layer, with a cache for T tokens. *at: layer N's attention in it. */
static clmla_status run_shared_stack(clmla_context *ctx, const char *dir, const clmla_model_options *mo, int dtype,
                                     int block_size, int T, clmla_model **stack, int *at)
{
    clmla_model_spec spec = {.weights_dtype = mo->weights_dtype, .tp_rank = mo->tp_rank, .tp_size = mo->tp_size,
                             .cache_dtype = (clmla_cache_dtype)dtype, .block_tokens = block_size,
                             .num_blocks = (T + block_size - 1) / block_size};
    clmla_status st = CLMLA_ERROR_INVALID_CONFIG;
    for (int full = mo->layer - 1; full >= 0; full--) {
        spec.first_layer = full;
        spec.num_layers = mo->layer - full + 1;
        st = clmla_model_create(ctx, dir, &spec, stack);
        if (st != CLMLA_ERROR_INVALID_ARGUMENT) /* the range did not start on a shared layer */
            break;
    }
    if (st == CLMLA_SUCCESS && clmla_model_num_attentions(*stack, at) == CLMLA_SUCCESS)
        --*at;
    return st;
}

/* One step of a shared layer: its full layer (the stack's first attention) on the same tokens, then
   the shared layer itself. */
static clmla_status step_shared_stack(clmla_model *stack, int at, const clmla_batch_entry *entry,
                                      clmla_attention_path path, const float *x, float *y)
{
    clmla_status st = clmla_model_forward(stack, 0, entry, 1, path, x, y);
    if (st == CLMLA_SUCCESS)
        st = clmla_model_forward(stack, at, entry, 1, path, x, y);
    return st;
}

static int parse_path(const char *text, clmla_attention_path *path)
{
    static const struct {
        const char *name;
        clmla_attention_path path;
    } paths[] = {{"auto", CLMLA_PATH_AUTO}, {"absorbed", CLMLA_PATH_ABSORBED}, {"decompressed", CLMLA_PATH_DECOMPRESSED}};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
        if (strcmp(text, paths[i].name) == 0) {
            *path = paths[i].path;
            return 1;
        }
    return 0;
}

int cmd_run(int argc, char **argv)
{
    int exit_code = 0, layer_index = 0, sublayer = 0, prefill = -1, chunk = 0, block_size = 64, tp_rank = 0, tp_size = 1,
        dense = 0;
    const char *device = NULL, *model = NULL, *input = NULL, *output = NULL, *path_name = "auto", *cache_dtype = "f32",
               *weights_dtype = "auto";
    cli_option opts[] = {
        {"model", CLI_STRING, &model, "DIR   model folder: config.json + model.safetensors or its shards"},
        {"layer", CLI_INT, &layer_index, "N     which decoder layer's attention, as the model numbers them (default 0)"},
        {"sublayer", CLI_INT, &sublayer, "K     which attention inside the layer: 0, or 1 (longcat_flash's self_attn.1)"},
        {"input", CLI_STRING, &input, "X.npy hidden states entering self_attn, float32/float16/float64 [T, hidden_size]"},
        {"output", CLI_STRING, &output, "Y.npy where the attention output after o_proj goes, float32 [T, hidden_size]"},
        {"prefill", CLI_INT, &prefill, "N     the first N tokens are prefilled, the rest decoded one by one (default T)"},
        {"chunk", CLI_INT, &chunk, "C     prefill in steps of C tokens (default: one step)"},
        {"path", CLI_STRING, &path_name, "auto|absorbed|decompressed  attention path of every step (default auto)"},
        {"cache-dtype", CLI_STRING, &cache_dtype, CLI_CACHE_DTYPES "  latent cache storage (default f32)"},
        {"weights-dtype", CLI_STRING, &weights_dtype,
         CLI_WEIGHTS_DTYPES "  weights on the device (default auto: as stored in the checkpoint)"},
        {"block-size", CLI_INT, &block_size, "B     tokens per cache block (default 64)"},
        {"tp-rank", CLI_INT, &tp_rank, "R     load the layer as tensor-parallel shard R of --tp-size (default 0)"},
        {"tp-size", CLI_INT, &tp_size, "N     shards of the layer (default 1: whole); Y is shard R's partial sum"},
        {"dense", CLI_FLAG, &dense,
         "      sparse-attention models (deepseek_v32, glm_moe_dsa): no indexer, every query attends to all its keys"},
        {"device", CLI_STRING, &device, "SPEC  device to run on (see clmla devices)"},
        {NULL, CLI_FLAG, NULL, NULL},
    };
    if (cli_start("run", summary, opts, argc, argv, &exit_code)) {
        if (exit_code == 0)
            printf("\nmodel_type values it runs (docs/MODELS.md): %s\n", clmla_model_types());
        return exit_code;
    }
    clmla_attention_path path = CLMLA_PATH_AUTO;
    if (!model || !input || !output) {
        fprintf(stderr, "clmla run: --model, --input and --output are required (see --help)\n");
        return 2;
    }
    if (!parse_path(path_name, &path)) {
        fprintf(stderr, "clmla run: --path must be auto, absorbed or decompressed, not '%s'\n", path_name);
        return 2;
    }
    const int dtype = cli_cache_dtype(cache_dtype);
    if (dtype < 0) {
        fprintf(stderr, "clmla run: --cache-dtype must be one of " CLI_CACHE_DTYPES ", not '%s'\n", cache_dtype);
        return 2;
    }
    const int wdtype = cli_weights_dtype(weights_dtype);
    if (wdtype < 0) {
        fprintf(stderr, "clmla run: --weights-dtype must be one of " CLI_WEIGHTS_DTYPES ", not '%s'\n", weights_dtype);
        return 2;
    }
    if (block_size < 1 || chunk < 0 || layer_index < 0) {
        fprintf(stderr, "clmla run: --block-size must be >= 1, --chunk >= 1 and --layer >= 0\n");
        return 2;
    }
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
        fprintf(stderr, "clmla run: --tp-size must be >= 1 and --tp-rank in [0, --tp-size), not %d of %d\n", tp_rank,
                tp_size);
        return 2;
    }

    clmla_layer_config config;
    int num_layers = 0;
    if (clmla_model_read_config(model, &config, &num_layers) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla run: %s\n", clmla_last_error(NULL));
        return 1;
    }
    if (layer_index >= num_layers) {
        fprintf(stderr, "clmla run: --layer %d is out of range: the model has %d layers (0 to %d)\n", layer_index,
                num_layers, num_layers - 1);
        return 2;
    }
    float *x = NULL;
    int64_t shape[2] = {0, 0};
    int ndim = 0;
    if (clmla_npy_read_f32(input, &x, shape, &ndim) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla run: %s\n", clmla_last_error(NULL));
        return 1;
    }
    const int D = config.hidden_size;
    if (ndim != 2 || shape[1] != D || shape[0] < 1 || shape[0] > (1 << 24)) {
        char got[64];
        if (ndim == 2)
            snprintf(got, sizeof(got), "(%lld, %lld)", (long long)shape[0], (long long)shape[1]);
        else
            snprintf(got, sizeof(got), "(%lld,)", (long long)shape[0]);
        fprintf(stderr, "clmla run: %s has shape %s, expected (T, %d): 1 to 2^24 tokens of hidden_size %d\n", input, got,
                D, D);
        clmla_free(x);
        return 1;
    }
    const int T = (int)shape[0];
    if (prefill < 0)
        prefill = T;
    if (prefill > T) {
        fprintf(stderr, "clmla run: --prefill %d is more than the %d tokens in %s\n", prefill, T, input);
        clmla_free(x);
        return 2;
    }
    if (chunk == 0 || chunk > prefill)
        chunk = prefill > 0 ? prefill : 1;

    int rc = 1;
    clmla_context *ctx = NULL;
    clmla_layer *layer = NULL;
    clmla_cache *cache = NULL;
    clmla_model *stack = NULL; /* a shared layer's: its full layer .. it, owning layer and cache */
    int shared_at = 0;         /* the shared layer's attention in stack */
    float *y = malloc((size_t)T * (size_t)D * sizeof(float));
    if (!y) {
        fprintf(stderr, "clmla run: out of host memory\n");
        goto done;
    }
    if (cli_context_create("run", device, &ctx, NULL))
        goto done;
    clmla_model_options mo = {.layer = layer_index, .sublayer = sublayer, .weights_dtype = (clmla_weights_dtype)wdtype,
                              .tp_rank = tp_rank, .tp_size = tp_size, .dense = dense};
    if (clmla_layer_create_from_model_opts(ctx, model, &mo, &layer) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla run: %s\n", clmla_last_error(ctx));
        goto done;
    }
    clmla_layer_config first;
    if (clmla_layer_get_config(layer, &first) == CLMLA_SUCCESS && first.index_shared &&
        run_shared_stack(ctx, model, &mo, dtype, block_size, T, &stack, &shared_at) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla run: %s\n", clmla_last_error(ctx));
        goto done;
    }
    if (stack) { /* the stack's own layer N and cache */
        clmla_layer_destroy(layer);
        layer = NULL;
        clmla_model_layer(stack, shared_at, &layer);
        clmla_model_cache(stack, &cache);
    }
    clmla_cache_config cc = {.num_layers = 1, .kv_lora_rank = config.kv_lora_rank, .rope_dim = config.qk_rope_head_dim,
                             .block_tokens = block_size, .num_blocks = (T + block_size - 1) / block_size,
                             .dtype = (clmla_cache_dtype)dtype};
    clmla_layer_config held;
    if (clmla_layer_get_config(layer, &held) == CLMLA_SUCCESS && held.index_n_heads > 0) {
        cc.index_head_dim = held.index_head_dim;
        cc.index_dtype = clmla_cache_index_dtype(cc.dtype, cc.index_head_dim);
    }
    int32_t seq = -1;
    if ((!stack && clmla_cache_create(ctx, &cc, &cache) != CLMLA_SUCCESS) || clmla_cache_seq_add(cache, &seq) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla run: %s\n", clmla_last_error(ctx));
        goto done;
    }
    clmla_batch_entry entry = {seq, 0};
    clmla_forward_args args = {&entry, 1, 0, path};
    for (int t = 0; t < T; t += entry.num_tokens) {
        entry.num_tokens = t < prefill ? (prefill - t < chunk ? prefill - t : chunk) : 1;
        const float *xt = x + (size_t)t * D;
        float *yt = y + (size_t)t * D;
        const clmla_status st = stack ? step_shared_stack(stack, shared_at, &entry, path, xt, yt)
                                      : clmla_layer_forward(layer, cache, &args, xt, yt);
        if (st != CLMLA_SUCCESS) {
            fprintf(stderr, "clmla run: step at token %d (%d tokens): %s\n", t, entry.num_tokens, clmla_last_error(ctx));
            goto done;
        }
    }
    const int64_t out_shape[2] = {T, D};
    if (clmla_npy_write_f32(output, y, 2, out_shape) != CLMLA_SUCCESS) {
        fprintf(stderr, "clmla run: %s\n", clmla_last_error(NULL));
        goto done;
    }
    const int prefill_steps = prefill > 0 ? (prefill + chunk - 1) / chunk : 0;
    char shard[64] = "";
    if (tp_size > 1)
        snprintf(shard, sizeof(shard), " (tensor-parallel shard %d of %d: its partial sum)", tp_rank, tp_size);
    /* the weights' device bytes: what the layer holds less its RoPE table (a cache of positions) */
    clmla_layer_memory mem;
    size_t weight_bytes = 0;
    if (clmla_layer_get_memory(layer, &mem) == CLMLA_SUCCESS)
        weight_bytes = mem.total - mem.rope_table;
    printf("clmla run: layer %d%s of %s, %d tokens: %d prefilled in %d step%s, %d decoded; path %s, weights %s "
           "(%zu bytes on the device), %s cache; wrote %s\n",
           layer_index, shard, model, T, prefill, prefill_steps, prefill_steps == 1 ? "" : "s", T - prefill, path_name,
           wdtype == CLMLA_WEIGHTS_AS_GIVEN ? "as stored" : weights_dtype, weight_bytes, cache_dtype, output);
    rc = 0;

done:
    if (stack)
        clmla_model_destroy(stack);
    else {
        clmla_cache_destroy(cache);
        clmla_layer_destroy(layer);
    }
    clmla_context_destroy(ctx);
    clmla_free(x);
    free(y);
    return rc;
}
