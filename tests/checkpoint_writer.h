/* Writes tiny Hugging Face model folders for the tests: config.json and safetensors (one file, or
 * shards with model.safetensors.index.json), the attention weights of every layer in F32, F16,
 * BF16 or F8_E4M3 with 128x128 block scales, and returns them as the checkpoint holds them after
 * dequantisation, which is what the float64 reference must be fed.
 *
 * The encoders here are the test's own (round to nearest even), written independently of the
 * library's decoders in host/runtime/dtype.c. */
#ifndef CLMLA_TEST_CHECKPOINT_WRITER_H
#define CLMLA_TEST_CHECKPOINT_WRITER_H
#include "clmla.h"
#include "mla_ref.h"
#include "test_util.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ckpt_model {
    clmla_layer_config config;               /* what config.json says (q_lora_rank 0 is written as null) */
    const clmla_layer_config *tensor_config; /* the shapes the tensors get; NULL = config */
    int num_layers;                          /* 0 = 1 */
    const char *dtype;                       /* "F32", "F16", "BF16", "F8_E4M3"; NULL = F32. Norms of an
                                                F8_E4M3 model are BF16, as in DeepSeek-V3 */
    const char *scale_dtype;                 /* F8_E4M3's "_scale_inv": "F32" (NULL), "F16" or "BF16"; the
                                                scales are rounded to it before the codes are chosen */
    int shards;                              /* 0 = model.safetensors; N >= 1 = N shards and the index */
    int extras;                              /* also write tensors the loader must ignore */
    const char *model_type;                  /* NULL = "deepseek_v3" */
    int write_interleave;                    /* write "rope_interleave" (from config.rope_pairing) */
    int rope_type_key;                       /* name rope_scaling's type "rope_type" instead of "type" */
    const char *omit;                        /* a tensor left out: its name after "self_attn.", e.g.
                                                "kv_b_proj.weight" or "o_proj.weight_scale_inv" */
    const char *retype;                      /* a tensor (same form) whose dtype label becomes retype_as, */
    const char *retype_as;                   /* one of the same element size, e.g. "I32" for F32 */
    const char *reshape;                     /* a tensor (same form) whose shape label becomes reshape_to, */
    int64_t reshape_to[2];                   /* 2-D, with as many elements (its bytes stay as they are) */
    unsigned seed;
} ckpt_model;

/* One layer's weights, float32, checkpoint layout (docs/MLA.md section 1); absent ones NULL. Only
   the 8 tensors of test_util.h's tu_weights are set (its config and views stay zero); free with
   tu_weights_free. */
typedef tu_weights ckpt_weights;

/* Creates dir (if needed) and writes the model; layers (may be NULL) receives num_layers entries,
   free each with tu_weights_free. Returns 0, or -1 after printing why. */
int ckpt_write_model(const char *dir, const ckpt_model *model, ckpt_weights *layers);

/* One tensor for ckpt_write_safetensors: raw little-endian bytes. */
typedef struct ckpt_tensor {
    const char *name;
    const char *dtype;
    int ndim;
    int64_t shape[2];
    const void *data;
    size_t bytes;
} ckpt_tensor;

/* A well-formed safetensors file of these tensors (contiguous, in the order given). */
int ckpt_write_safetensors(const char *path, const ckpt_tensor *tensors, int count);
/* A safetensors file from a header text (its length written in front) and raw data. */
int ckpt_write_safetensors_raw(const char *path, const char *header, const void *data, size_t data_bytes);
/* Any bytes; a text file. */
int ckpt_write_bytes(const char *path, const void *bytes, size_t size);
int ckpt_write_text(const char *path, const char *text);
/* The config.json text of a configuration (malloc'ed; model_type NULL = "deepseek_v3"). */
char *ckpt_config_json(const clmla_layer_config *config, int num_layers, const char *model_type, int write_interleave,
                       int rope_type_key);

/* A fresh directory under $TMPDIR (or /tmp) into buf; removes one made by it with every file in it. */
int ckpt_make_temp_dir(char *buf, size_t size, const char *tag);
void ckpt_remove_dir(const char *dir);

/* Runs `'cli' run ARGS` with its output (stdout and stderr) into the file log; returns its exit
   status (-1 where it could not run, 128 where it did not exit). */
int ckpt_run_cli(const char *cli, const char *args, const char *log);
/* The first 16383 bytes of the file at path (none where it cannot be read), NUL-terminated, in a
   buffer that the next call overwrites. */
const char *ckpt_read_text(const char *path);

/* dir/name into buf. */
const char *ckpt_path(char *buf, size_t size, const char *dir, const char *name);

/* A small configuration for checkpoint tests (D 160, 2 heads, rkv 144; q_lora: rq 136, yarn:
   YaRN with different mscales). */
clmla_layer_config ckpt_tiny_config(int q_lora, int yarn);

/* The reference's view of a configuration and of one layer's weights. */
mla_ref_config ckpt_ref_config(const clmla_layer_config *config);
mla_ref_weights ckpt_ref_weights(const ckpt_weights *w);

/* Uniform values in [-scale, scale) from a 64-bit LCG. */
void ckpt_fill_random(float *out, size_t n, float scale, float bias, uint64_t *state);

/* The test's encoders: float32 -> F16 / BF16 / F8_E4M3 bits (round to nearest even; F8 saturates
   at +-448) and their exact values back. */
uint16_t ckpt_encode_f16(float x);
uint16_t ckpt_encode_bf16(float x);
uint8_t ckpt_encode_f8_e4m3(float x);
double ckpt_value_f16(uint16_t bits);
double ckpt_value_bf16(uint16_t bits);
double ckpt_value_f8_e4m3(uint8_t bits);

#endif
