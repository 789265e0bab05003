/* Which attention path AUTO takes for an entry, and the scratch each path may hold (docs/DESIGN.md,
   "Which path"). */
#include "attention.h"
#include "hooks.h"
#include "kernel_tuning.h"
#include "mla_layer.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>

/* Which path AUTO takes for a dense entry (docs/DESIGN.md, "Which path"). Per query token the
   absorbed path costs X = 2 rkv H (dn + dv) FLOPs (W^UK into the query, W^UV after the sum), per
   (query, key) pair A = 2 H (2 rkv + dr); the decompressed path costs X per key (up-projecting it)
   and D = 2 H (dq + dv) per pair. An entry of t tokens after a prefix of p has p + t keys and
   t (p + (t + 1) / 2) causal pairs, so decompressing pays once pairs (A - D) >= p X, that is
   t (p + (t + 1) / 2) >= p n with n = X / (A - D): about n tokens after a long prefix, fewer after
   a short one, any number after none. n is the layer's auto_threshold. Each part is weighted by
   the speed its kernels reach, the device's planner rates (clmla_plan_rates_for: the built-in
   entries of host/mla/tuning_data/plan.json say where each was measured), as fractions of the
   up-projection's FLOP rate:
   - CPU devices: absorbed pairs at cpu_lanes_absorbed_pair_rate where the latent tuning runs
     attn_latent_lanes (rows_lanes, 16 heads or more), else at cpu_absorbed_pair_rate; decompressed
     pairs at cpu_decompressed_pair_rate.
   - Other devices, where attn_prefill_tiled runs: absorbed pairs at gpu_absorbed_pair_rate,
     decompressed pairs at gpu_tiled_pair_rate and keys at gpu_tiled_key_rate (counting X a key),
     each of the entry's own tokens counting as gpu_tiled_chunk_keys keys: pairs >= n (p + c t).
     Where attn_prefill runs (one query per work-item; where no block of attn_prefill_tiled fits the
     device or the tuning turns it off) the decompressed path costs per key, cached or new, at
     gpu_decompressed_key_rate, nothing per pair: pairs >= n (p + t).
   Shapes whose absorbed pairs cost no more than decompressed ones (small test shapes on CPUs) take
   the absorbed path always. Below the rates' min_tokens tokens the absorbed path is kept whatever
   the prefix (and a multi-token decode entry stays in its batch's absorbed call). */

/* n, and in *chunk_keys how many keys each of the entry's own tokens counts as in the decompressed
   path's cost (0 on CPUs), and in *min_tokens the fewest tokens an entry sent decompressed has;
   LAYER_AUTO_NEVER: the decompressed path never pays. Needs the layer's kernels (whether
   attn_prefill_tiled runs). */
int clmla_layer_auto_threshold_of(const clmla_layer *L, double *chunk_keys, int *min_tokens)
{
    clmla_plan_rates r;
    clmla_plan_rates_for(L->ctx, &r);
    const double X = 2.0 * L->rkv * L->H * (L->dn + L->dv), A = 2.0 * L->H * (2 * L->rkv + L->dr),
                 D = 2.0 * L->H * (L->dq + L->dv);
    double n;
    if (L->ctx->info.kind == CLMLA_DEVICE_KIND_CPU) {
        clmla_latent_tuning tn;
        clmla_latent_tuning_for(L->ctx, L->H, &tn);
        const double rate =
            clmla_latent_lanes_vectors(&tn, L->H) ? r.cpu_lanes_absorbed_pair_rate : r.cpu_absorbed_pair_rate;
        const double saved = A / rate - D / r.cpu_decompressed_pair_rate;
        n = saved > 0 ? X / saved : LAYER_AUTO_NEVER;
        *chunk_keys = 0;
    } else if (L->prefill[0].tiled) {
        const double saved = A / r.gpu_absorbed_pair_rate - D / r.gpu_tiled_pair_rate;
        n = saved > 0 ? (X / r.gpu_tiled_key_rate) / saved : LAYER_AUTO_NEVER;
        *chunk_keys = r.gpu_tiled_chunk_keys;
    } else {
        n = (X / r.gpu_decompressed_key_rate) / (A / r.gpu_absorbed_pair_rate);
        *chunk_keys = 1;
    }
    *min_tokens = r.min_tokens;
    return n < r.min_tokens ? r.min_tokens : n >= LAYER_AUTO_NEVER ? LAYER_AUTO_NEVER : (int)ceil(n);
}

/* The scratch each attention path holds beyond the step's own activations (docs/DESIGN.md, "Which
   path"), within one budget: SCRATCH_BUDGET_BYTES, or an eighth of the device's memory where that is
   less.
   - The absorbed path holds its queries in latent space and their attention's outputs for the rows
     it runs at once, 2 H rkv floats a row: a step with more rows than fit the budget runs its
     absorbed attention in pieces of that many rows (2048 at DeepSeek-V3's 128 heads, 16384 at
     V2-Lite's 16), so that this scratch does not grow with a long prompt.
   - The decompressed path gathers an entry's k keys (its prefix and new tokens) as float32 rows of
     rkv + dr values and up-projects them into k rows of H (dn + dv), each in one buffer the context
     keeps for later steps: 130 KiB a key at V3's shape, 4 GiB for a prompt of 32768 tokens. AUTO
     keeps an entry absorbed where that would pass the budget (then the absorbed path, within it,
     holds less) or a buffer the device's largest; a step that names the decompressed path is
     refused past the largest buffer. */
#define SCRATCH_BUDGET_BYTES ((uint64_t)1 << 30)

uint64_t clmla_layer_scratch_budget(const clmla_layer *L)
{
    const uint64_t eighth = L->ctx->info.global_mem_bytes / 8;
    return eighth > 0 && eighth < SCRATCH_BUDGET_BYTES ? eighth : SCRATCH_BUDGET_BYTES;
}

int clmla_layer_absorbed_piece_rows(const clmla_layer *L)
{
    const int forced = clmla_hook_absorbed_piece_rows(L->ctx);
    if (forced > 0)
        return forced;
    const uint64_t rows = clmla_layer_scratch_budget(L) / (2 * (uint64_t)L->H * L->rkv * sizeof(float));
    return rows < 16 ? 16 : rows > INT_MAX ? INT_MAX : (int)rows;
}

/* The decompressed path's scratch bytes a key: the gathered row, the up-projected one. */
void clmla_layer_decompressed_key_bytes(const clmla_layer *L, uint64_t *gather, uint64_t *up)
{
    *gather = (uint64_t)L->row * sizeof(float);
    *up = (uint64_t)L->H * (uint64_t)(L->dn + L->dv) * sizeof(float);
}

/* The most keys a decompressed entry can have: each of its scratch buffers within the device's
   largest buffer. */
long long clmla_layer_decompressed_max_keys(const clmla_layer *L)
{
    uint64_t gather, up;
    clmla_layer_decompressed_key_bytes(L, &gather, &up);
    const uint64_t largest = L->ctx->info.max_alloc_bytes;
    return largest > 0 ? (long long)(largest / (up > gather ? up : gather)) : LLONG_MAX;
}

/* Whether decompressing an entry would hold more scratch than the budget. */
static int decompressed_over_budget(const clmla_layer *L, long long prefix, long long tokens)
{
    uint64_t gather, up;
    clmla_layer_decompressed_key_bytes(L, &gather, &up);
    return (double)(prefix + tokens) * (double)(gather + up) > (double)clmla_layer_scratch_budget(L);
}

/* In a selecting step AUTO sends an entry decompressed only up to this many keys. CPU devices:
   none (the absorbed path was the faster at every prefill run: docs/perf-log.md). Elsewhere, until
   measured, the FLOP count: the decompressed
   kernels score every key (2 dq FLOPs a key, per query and head) and weight the selected ones
   (2 dv each), the absorbed ones only the index_topk selected (2 (2 rkv + dr) each), so past
   index_topk (2 rkv + dr - dv) / dq keys (5 index_topk for DeepSeek-V3.2) the absorbed path does
   less (docs/DESIGN.md). */
static long long sparse_decompressed_keys(const clmla_layer *L)
{
    if (L->ctx->info.kind == CLMLA_DEVICE_KIND_CPU)
        return 0;
    return (long long)L->topk * (2LL * L->rkv + L->dr - L->dv) / L->dq;
}

/* Whether AUTO takes the decompressed path for an entry of `tokens` new tokens in a sequence that
   held `prefix` before the step: the rule above in dense steps, the one of sparse_decompressed_keys
   in steps that select keys. */
int clmla_layer_auto_decompressed(const clmla_layer *L, int prefix, int tokens, int sparse)
{
    if (tokens < L->auto_min_tokens)
        return 0;
    if ((long long)prefix + tokens > clmla_layer_decompressed_max_keys(L) || decompressed_over_budget(L, prefix, tokens))
        return 0;
    if (sparse && (long long)prefix + tokens > sparse_decompressed_keys(L))
        return 0;
    if (L->auto_threshold >= LAYER_AUTO_NEVER)
        return 0;
    const double pairs = (double)tokens * ((double)prefix + (tokens + 1) / 2.0);
    return pairs >= ((double)prefix + L->auto_chunk_keys * tokens) * L->auto_threshold;
}

clmla_status clmla_layer_auto_threshold(const clmla_layer *L, int *tokens)
{
    if (!L || !tokens)
        return clmla_fail(L ? L->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_auto_threshold: NULL argument");
    *tokens = L->auto_threshold;
    return CLMLA_SUCCESS;
}

clmla_status clmla_layer_auto_path(const clmla_layer *L, int prefix, int tokens, clmla_attention_path *path)
{
    if (!L || !path)
        return clmla_fail(L ? L->ctx : NULL, CLMLA_ERROR_INVALID_ARGUMENT, "clmla_layer_auto_path: NULL argument");
    if (prefix < 0 || tokens < 1)
        return clmla_fail(L->ctx, CLMLA_ERROR_INVALID_ARGUMENT,
                          "clmla_layer_auto_path: prefix must be at least 0 and tokens at least 1, got %d and %d", prefix,
                          tokens);
    const int sparse = selects(L) && (long long)prefix + tokens > L->topk;
    *path = clmla_layer_auto_decompressed(L, prefix, tokens, sparse) ? CLMLA_PATH_DECOMPRESSED : CLMLA_PATH_ABSORBED;
    return CLMLA_SUCCESS;
}
