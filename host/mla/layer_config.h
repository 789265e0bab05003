/* Layer configurations (layer_config.c): the presets, validation, and the defaults of fields left 0. */
#ifndef CLMLA_LAYER_CONFIG_H
#define CLMLA_LAYER_CONFIG_H
#include "clmla.h"

/* The configuration with every 0-means-default field filled in (rope_type AUTO made explicit). */
clmla_layer_config clmla_config_resolved(const clmla_layer_config *config);
/* "[rows, cols]", "[size]" or "(N dimensions)", for messages. */
void clmla_tensor_shape_text(const clmla_tensor *t, char *buf, size_t size);
#endif
