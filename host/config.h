/* config.json of a Hugging Face checkpoint -> clmla_layer_config (MLA.md sections 3, 4, 7). */
#ifndef CLMLA_CONFIG_H
#define CLMLA_CONFIG_H
#include "clmla.h"

#include <stddef.h>

/* Reads hidden_size, num_attention_heads, q_lora_rank (null or absent: 0), kv_lora_rank,
   qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rope_theta (absent: 10000), rope_scaling
   (absent or null: plain RoPE; "type" or "rope_type" "yarn" with factor,
   original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim; "default":
   plain RoPE; any other type is refused by name), rope_interleave (false: half-split pairs) and
   num_hidden_layers. Without rope_interleave, DeepSeek and Kimi model types pair interleaved;
   another model_type must say which pairing it uses.

   rms_norm_eps, when present, must be a positive number, but the latent norms use 1e-6 whatever
   it says: the published modelling code builds q_a_layernorm and kv_a_layernorm with the RMSNorm
   default (1e-6); rms_norm_eps is the decoder's input and post-attention norms'.

   The result passes clmla_layer_config_validate. err gets "<name>: <problem>". Returns
   CLMLA_SUCCESS, CLMLA_ERROR_INVALID_FILE (not JSON, a missing or mistyped field) or
   CLMLA_ERROR_INVALID_CONFIG (an unsupported rope_scaling, an inconsistent configuration). */
clmla_status clmla_config_parse(const char *text, size_t length, const char *name, clmla_layer_config *config,
                                int *num_layers, char *err, size_t errsize);

#endif
