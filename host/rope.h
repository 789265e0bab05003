/* RoPE tables, computed on the host in double (MLA.md sections 3 and 4). */
#ifndef CLMLA_ROPE_H
#define CLMLA_ROPE_H
#include "clmla.h"

/* The configuration with every 0-means-default field filled in. */
clmla_layer_config clmla_config_resolved(const clmla_layer_config *config);

/* inv_freq[i] for i < dr/2 (YaRN-corrected when on) and the cos/sin amplitude A. */
void clmla_rope_inv_freq(const clmla_layer_config *resolved, double *inv_freq, double *amplitude);

/* table [positions, dr/2] of (A cos(p*inv_freq[i]), A sin(p*inv_freq[i])) as float pairs, for
   positions first .. first+count-1 (written from table[0]). */
void clmla_rope_fill_table(const clmla_layer_config *resolved, int first, int count, float *table);
#endif
