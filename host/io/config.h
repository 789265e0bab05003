/* config.json of a Hugging Face model folder -> what clmla runs (docs/MODELS.md).
 *
 * Read as transformers reads it: the RoPE settings from "rope_parameters" (transformers 5) or
 * from the older top-level "rope_theta" / "rope_scaling" (as DeepSeek, Moonshot and openbmb
 * publish them), with transformers' precedence between the two; each MLA family's own defaults,
 * aliases and fixed choices (families[] in config.c). A field that would change the attention
 * output and that clmla does not implement is refused by name; a model_type that is not an MLA
 * family clmla runs is refused with the reason. */
#ifndef CLMLA_CONFIG_H
#define CLMLA_CONFIG_H
#include "clmla.h"

#include <stddef.h>

/* What config.json says about the model's attention layers. */
typedef struct clmla_model_desc {
    clmla_layer_config layer;   /* every MLA layer's configuration; passes clmla_layer_config_validate */
    char model_type[64];        /* the family, after unwrapping a multimodal wrapper's text_config */
    const char *config_path;    /* "" or where the text config sits ("text_config.") for messages */
    int num_layers;             /* decoder layers, numbered as the model numbers them */
    int attentions_per_layer;   /* 1, or 2 (longcat_flash: self_attn.0 and self_attn.1) */
    int attention_bias;         /* q_a_proj, kv_a_proj_with_mqa and o_proj carry biases */
    unsigned char *is_mla;      /* [num_layers]: 1 where the layer is MLA; NULL: every layer is */
    /* [num_layers]: 1 where a sparse-attention layer reuses the previous "full" layer's selection
       (glm_moe_dsa's "shared" indexer_types: no indexer weights of its own); NULL: none does */
    unsigned char *index_shared;
} clmla_model_desc;

void clmla_model_desc_free(clmla_model_desc *desc);

/* Parses config.json text. err gets "<name>: <problem>". Returns CLMLA_SUCCESS,
   CLMLA_ERROR_INVALID_FILE (not JSON, a missing or mistyped field) or CLMLA_ERROR_INVALID_CONFIG
   (an unsupported family, rope type or field; an inconsistent configuration). On failure *desc
   holds nothing to free. */
clmla_status clmla_model_config_parse(const char *text, size_t length, const char *name, clmla_model_desc *desc,
                                      char *err, size_t errsize);

/* Reads MODEL_DIR/config.json into *desc (host/io/model.c); on failure err says why and *desc holds
   nothing to free. */
clmla_status clmla_model_folder_desc(const char *model_dir, clmla_model_desc *desc, char *err, size_t errsize);

/* The layer configuration and decoder layer count alone. */
clmla_status clmla_config_parse(const char *text, size_t length, const char *name, clmla_layer_config *config,
                                int *num_layers, char *err, size_t errsize);


#endif
