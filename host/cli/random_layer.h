/* A DeepSeek-shaped attention layer with random weights for clmla demo: the library's random layer
   (host/tune/tuner.h: the float32 weights and their descriptors for clmla_layer_create), and the
   same weights for the float64 reference (ref/mla_ref.h), as given and rounded to the dtype the
   layer keeps. */
#ifndef CLMLA_CLI_RANDOM_LAYER_H
#define CLMLA_CLI_RANDOM_LAYER_H
#include "clmla.h"
#include "mla_ref.h"
#include "tuner.h"

#include <stdint.h>

typedef struct cli_random_layer {
    clmla_tuner_random_layer made; /* the library's random layer (host/tune/tuner.h): its
                                      configuration, weights and their descriptors */
    clmla_layer_config cfg;  /* made's: the preset's, with the weights dtype asked for */
    clmla_layer_weights w;   /* made's descriptors of the float32 weights */
    clmla_dtype held;        /* the dtype the layer keeps its projections in */
    mla_ref_config rcfg;     /* the same shape for the reference */
    mla_ref_weights rw;      /* the float32 weights */
    mla_ref_weights rw_held; /* as the layer holds them: rounded to `held` (rw itself when f32) */
    float *rounded[5];       /* rw_held's own copies */
} cli_random_layer;

/* The preset's layer with weights ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) and norms ~ 1 (drawn from
   *state in a fixed order), kept as `want` (CLMLA_WEIGHTS_AS_GIVEN is f32: the weights are made in
   float32). The preset must be a DeepSeek-layout one (v2-lite, v2, v3, kimi-k2: the reference's
   basic configuration). 0, or -1 when out of host memory (r then holds nothing to free). */
int cli_random_layer_make(cli_random_layer *r, clmla_preset preset, clmla_weights_dtype want, uint64_t *state);
void cli_random_layer_free(cli_random_layer *r);
#endif
