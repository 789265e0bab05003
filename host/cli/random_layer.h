/* A DeepSeek-shaped attention layer with random weights, for the commands that run one without a
   checkpoint (clmla demo, clmla tune --kernels): the float32 weights, their descriptors for
   clmla_layer_create, and the same weights for the float64 reference (ref/mla_ref.h), as given
   and rounded to the dtype the layer keeps. */
#ifndef CLMLA_CLI_RANDOM_LAYER_H
#define CLMLA_CLI_RANDOM_LAYER_H
#include "clmla.h"
#include "mla_ref.h"

#include <stdint.h>

typedef struct cli_random_layer {
    clmla_layer_config cfg;  /* the preset's, with the weights dtype asked for */
    clmla_layer_weights w;   /* descriptors of the float32 weights below */
    clmla_dtype held;        /* the dtype the layer keeps its projections in */
    mla_ref_config rcfg;     /* the same shape for the reference */
    mla_ref_weights rw;      /* the float32 weights */
    mla_ref_weights rw_held; /* as the layer holds them: rounded to `held` (rw itself when f32) */
    float *q_a, *q_a_norm, *q_b, *q_proj, *kv_a, *kv_norm, *kv_b, *o_proj; /* NULL where absent */
    float *rounded[5];       /* rw_held's own copies */
} cli_random_layer;

/* Uniform in [bias - scale, bias + scale), from a 64-bit LCG: n values, NULL when out of memory. */
float *cli_random_floats(size_t n, float scale, float bias, uint64_t *state);

/* The preset's layer with weights ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) and norms ~ 1 (drawn from
   *state in a fixed order), kept as `want` (CLMLA_WEIGHTS_AS_GIVEN is f32: the weights are made in
   float32). The preset must be a DeepSeek-layout one (v2-lite, v2, v3, kimi-k2: the reference's
   basic configuration). 0, or -1 when out of host memory (r then holds nothing to free). */
int cli_random_layer_make(cli_random_layer *r, clmla_preset preset, clmla_weights_dtype want, uint64_t *state);
void cli_random_layer_free(cli_random_layer *r);
#endif
