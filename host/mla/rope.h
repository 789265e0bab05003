/* RoPE tables and the softmax scale, computed on the host in double (docs/MLA.md sections 3 and 4,
   and the other rope types of transformers' modeling_rope_utils: linear, longrope, llama3). */
#ifndef CLMLA_ROPE_H
#define CLMLA_ROPE_H
#include "clmla.h"

/* inv_freq[i] for i < dr/2 and the cos/sin amplitude A. `long_factors` picks LongRoPE's long
   list (ignored by the other types). NONE gives inv_freq 0 and A 1: cos 1, sin 0. */
void clmla_rope_inv_freq(const clmla_layer_config *resolved, int long_factors, double *inv_freq, double *amplitude);

/* table [positions, dr/2] of (A cos(p*inv_freq[i]), A sin(p*inv_freq[i])) as float pairs, for
   positions first .. first+count-1 (written from table[0]). */
void clmla_rope_fill_table(const clmla_layer_config *resolved, int long_factors, int first, int count, float *table);

/* Whether a step whose last position is `last` rotates with LongRoPE's long factors. */
int clmla_rope_uses_long(const clmla_layer_config *resolved, long last);

/* tau of docs/MLA.md section 4 for a configuration (resolved here; not validated). */
double clmla_softmax_scale(const clmla_layer_config *config);

/* The per-position query multiplier (query_scale_beta), 1 when off. */
double clmla_query_scale(const clmla_layer_config *resolved, long position);
#endif
