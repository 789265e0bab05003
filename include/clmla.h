/*
 * clmla: DeepSeek Multi-head Latent Attention on any OpenCL device.
 *
 * The stable API: devices and contexts, layers and their configuration, the paged latent cache,
 * attention over clmla's cache and over a caller's, projections, model folders, statuses and
 * errors. It changes only as CHANGELOG.md says, and before 1.0 only in a minor version (0.x.0).
 * The parameters of the kernels, the calls that tune them and the experimental switches are in
 * clmla_tuning.h, which a program includes only when it tunes (opt-in; not stable).
 *
 * Conventions:
 *  - every call that can fail returns a clmla_status; 0 (CLMLA_SUCCESS) is success. OpenCL's own
 *    negative codes and CLBlast's codes pass through unchanged; clmla's own codes are CLMLA_ERROR_*
 *    below, in the range [-5099, -5000]. clmla_status_string() names any of them. The calls that
 *    cannot fail return their value directly: strings (version, status and parameter names,
 *    presets, model types, clmla_last_error), tensor descriptors, the context's OpenCL handles;
 *    destroy and free return nothing;
 *  - one integer type per kind of quantity: counts and indices of tokens, heads, layers and blocks,
 *    positions and dimensions: int; sequence ids: int32_t (the width the kernels' block tables
 *    use); tensor extents: int64_t (as safetensors stores them); byte sizes, buffer offsets and
 *    the lengths and indices of arrays the library hands out (device lists): size_t; memory and
 *    counter statistics: uint64_t;
 *  - the human-readable reason for the last failure is clmla_last_error(ctx), or, for calls that
 *    have no context (or that failed to make one), clmla_last_error(NULL), which is per thread;
 *  - handles are created and destroyed in pairs; destroy accepts NULL;
 *  - descriptor structs are valid when zero-initialised: 0 means "default";
 *  - the library never exits, aborts or prints on its own;
 *  - threads: calls on different contexts (and on the caches and layers made from them) may run
 *    at the same time in different threads (tests/test_concurrency.c). The calls on one context
 *    and its objects must not overlap: serialise them, one thread at a time. Calls that take no
 *    context (device lists, device specs, presets, configuration checks, config.json and .npy
 *    reading, status strings) may be made from any thread. clmla_last_error(NULL) is per thread.
 *    CLBlast's tuned parameters are per process: a context applies them at creation only when its
 *    options (or CLMLA_CLBLAST_TUNING) ask for it (clmla_tuning.h).
 */
#ifndef CLMLA_H
#define CLMLA_H

#include <stddef.h>
#include <stdint.h>

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CLMLA_VERSION_MAJOR 0
#define CLMLA_VERSION_MINOR 5
#define CLMLA_VERSION_PATCH 0

/* "MAJOR.MINOR.PATCH" of the library actually linked. */
const char *clmla_version_string(void);

/* ---- status codes ------------------------------------------------------------------------- */

typedef int clmla_status;

enum {
    CLMLA_SUCCESS = 0,
    /* Values in [-5099, -5000] are clmla's own; any other negative value is an OpenCL or CLBlast
       code passed through unchanged. */
    CLMLA_ERROR_INVALID_ARGUMENT = -5000, /* a NULL handle, a bad size, a malformed value */
    CLMLA_ERROR_OUT_OF_HOST_MEMORY = -5001,
    CLMLA_ERROR_NO_PLATFORM = -5002,      /* no OpenCL platform / ICD is installed */
    CLMLA_ERROR_NO_DEVICE = -5003,        /* platforms exist, but they expose no device */
    CLMLA_ERROR_DEVICE_NOT_FOUND = -5004, /* a device spec matched nothing or was malformed */
    CLMLA_ERROR_KERNEL_NOT_FOUND = -5005, /* no such kernel source (embedded or in CLMLA_KERNEL_DIR) */
    CLMLA_ERROR_BUILD_FAILED = -5006,     /* kernel compile error; the log is in clmla_last_error */
    CLMLA_ERROR_INVALID_CONFIG = -5007,   /* a layer configuration is inconsistent */
    CLMLA_ERROR_SHAPE_MISMATCH = -5008,   /* a tensor's shape differs from the expected one */
    CLMLA_ERROR_MISSING_TENSOR = -5009,   /* a required weight was not given */
    CLMLA_ERROR_CACHE_FULL = -5010,       /* the KV cache has too few free blocks; nothing changed */
    CLMLA_ERROR_UNKNOWN_SEQUENCE = -5011, /* a sequence id that the cache does not hold */
    CLMLA_ERROR_UNSUPPORTED = -5012,      /* the device lacks something the call needs */
    CLMLA_ERROR_IO = -5013,               /* a file could not be read or written */
    CLMLA_ERROR_INVALID_FILE = -5014,     /* a file's contents are malformed */
    CLMLA_ERROR_INTERNAL = -5099          /* a bug in clmla: please report it */
};

/* A static, never-NULL name for any status: "CLMLA_ERROR_CACHE_FULL", "CL_OUT_OF_RESOURCES",
   "CLBlastInvalidDimension", or "unknown status -123". */
const char *clmla_status_string(clmla_status status);

/* ---- devices ------------------------------------------------------------------------------ */

typedef enum clmla_device_kind {
    CLMLA_DEVICE_KIND_OTHER = 0,
    CLMLA_DEVICE_KIND_CPU = 1,
    CLMLA_DEVICE_KIND_GPU = 2,
    CLMLA_DEVICE_KIND_ACCELERATOR = 3
} clmla_device_kind;

/* "cpu", "gpu", "accelerator" or "other": the names device specs and `clmla devices` use. */
const char *clmla_device_kind_name(clmla_device_kind kind);

typedef struct clmla_device_info {
    int index;              /* position in the flat list `clmla devices` prints */
    int platform_index;     /* P of "P:D" */
    int device_index;       /* D of "P:D": the device's index inside its platform */
    clmla_device_kind kind;
    char platform_name[128];
    char vendor[128];
    char name[128];
    char device_version[128]; /* CL_DEVICE_VERSION */
    char driver_version[128]; /* CL_DRIVER_VERSION */
    uint64_t global_mem_bytes;
    uint64_t max_alloc_bytes;
    uint64_t local_mem_bytes;
    unsigned compute_units;
    size_t max_work_group_size;
    int fp16;               /* 1 when cl_khr_fp16 (half arithmetic) is supported */
    int fp64;               /* 1 when cl_khr_fp64 is supported */
    int is_default;         /* 1 for the device the default spec (no argument, CLMLA_DEVICE unset) picks */
    cl_platform_id platform_id;
    cl_device_id device_id;
} clmla_device_info;

/* Every OpenCL device on every platform, in the flat order of `clmla devices`. The array is
   allocated by the library; free it with clmla_free(). With no platform at all the call returns
   CLMLA_ERROR_NO_PLATFORM and *count = 0. */
clmla_status clmla_devices_list(clmla_device_info **devices, size_t *count);

/* Resolves a device spec to an index of clmla_devices_list. spec NULL or "" means: the
   CLMLA_DEVICE environment variable, else the first GPU, else the first device. Forms:
     "P:D"       platform P, device D (both decimal)
     "N"         flat index N
     "gpu" | "cpu" | "accelerator"   the first device of that type
     text        the first device whose platform, vendor or device name contains it (any case)
   A spec that matches nothing, or is malformed, returns CLMLA_ERROR_DEVICE_NOT_FOUND and the
   message in clmla_last_error(NULL) lists every device. */
clmla_status clmla_device_resolve(const char *spec, size_t *index);

/* Frees memory the library allocated for the caller (device lists). NULL is accepted. */
void clmla_free(void *ptr);

/* ---- context ------------------------------------------------------------------------------ */

typedef struct clmla_context clmla_context;

/* Opens the device the spec names (see clmla_device_resolve) with its own OpenCL context and an
   in-order command queue (profiling enabled when the device allows it). On failure *ctx is NULL
   and clmla_last_error(NULL) says why. */
clmla_status clmla_context_create(const char *device_spec, clmla_context **ctx);

/* Wraps a caller's OpenCL objects instead (an engine that already has its queue). The queue must
   be in-order; the library retains the context, device and queue and releases them on destroy. */
clmla_status clmla_context_create_from_queue(cl_command_queue queue, clmla_context **ctx);

/* Settings of a context. Zero-initialised (or NULL where a pointer to options is taken), every
   field falls back to its environment variable (README: Environment variables), then to the
   built-in default; a field that is set wins over the variable. */
/* Diagnostics a context can hand to the caller (the library itself never prints). */
typedef enum clmla_log_level {
    CLMLA_LOG_OFF = 0,
    CLMLA_LOG_WARNING = 1, /* something was recovered from: a corrupt program-cache file rebuilt, a
                              binary that could not be stored */
    CLMLA_LOG_INFO = 2     /* what setup did: each kernel program built from source or loaded from
                              the disk cache (and how long it took), the CLBlast entry applied */
} clmla_log_level;

typedef void (*clmla_log_fn)(void *user, clmla_log_level level, const char *message);

typedef struct clmla_context_options {
    const char *device;         /* device spec (clmla_device_resolve); NULL: CLMLA_DEVICE, else the
                                   first GPU, else the first device. Ignored by _from_queue. */
    const char *kernel_dir;     /* load kernel sources NAME.cl from here; NULL: CLMLA_KERNEL_DIR,
                                   else (and "") the sources embedded in the library */
    const char *cache_dir;      /* compiled-kernel cache folder, "off" for none; NULL: CLMLA_CACHE_DIR,
                                   else $XDG_CACHE_HOME/clmla, else ~/.cache/clmla */
    const char *clblast_tuning; /* a tuning switch: whether the context applies tuned CLBlast SGEMM
                                   parameters, which are the whole process's (a file, "auto" or
                                   "off"; see clmla_tuning.h). NULL: CLMLA_CLBLAST_TUNING, else
                                   none. An engine that tunes CLBlast itself keeps its own. */
    clmla_log_fn log;           /* called with each message up to log_level, on the thread of the
                                   call that produced it; NULL: none, unless CLMLA_LOG is warning or
                                   info (then each message up to that level is a line of stderr,
                                   "clmla: LEVEL: message"; another value than off fails the
                                   creation, naming it) */
    void *log_user;             /* passed to log */
    clmla_log_level log_level;  /* 0: no messages */
    /* Experimental: which attention kernels the context runs ("auto", "rows" or "group"; see
       clmla_tuning.h). NULL: CLMLA_ATTENTION_KERNELS, else "auto": the kernels for the device. */
    const char *attention_kernels;
    /* A file to append a record of every command the context puts on its queue to
       (its kernels, CLBlast's routines, buffer transfers), with the device's timestamps, one
       tab-separated line each, written when 1024 are pending (the host then waits for them) and
       when the context is destroyed; tools/trace_summary.py sums it up by kernel. Needs a queue
       with profiling (else a warning, and no trace). NULL: CLMLA_TRACE, else none; "": none. */
    const char *trace;
    /* Experimental: which product kernels the context runs ("auto", "rows" or "group"; see
       clmla_tuning.h). NULL: CLMLA_PRODUCT_KERNELS, else "auto": the kernels for the device. */
    const char *product_kernels;
    /* Whether compiled programs are kept in the disk cache (cache_dir): "on", "off", or "auto": on,
       except on PoCL's CPU device, which keeps a kernel cache of its own (POCL_CACHE_DIR) and, asked
       for a program's binary, first compiles every kernel of the file, used or not (README,
       CLMLA_PROGRAM_BINARIES, gives the trade). Decided when the context is made. NULL:
       CLMLA_PROGRAM_BINARIES, else "auto"; another value fails the creation with
       CLMLA_ERROR_INVALID_ARGUMENT naming it. */
    const char *program_binaries;
} clmla_context_options;

/* clmla_context_create and clmla_context_create_from_queue with options (NULL: all defaults). */
clmla_status clmla_context_create_opts(const clmla_context_options *options, clmla_context **ctx);
clmla_status clmla_context_create_from_queue_opts(cl_command_queue queue, const clmla_context_options *options,
                                                  clmla_context **ctx);

/* Waits for the context's queue, then releases the context and what it made for itself; its caches,
   layers, linears and paged objects must be destroyed first. */
void clmla_context_destroy(clmla_context *ctx);

/* The message of the last failed call on this context (or, with NULL, of the last failed call
   without a context on this thread). Never NULL; "" when nothing failed. Valid until the next
   call that fails. */
const char *clmla_last_error(const clmla_context *ctx);

/* The device behind the context, filled as by clmla_devices_list (index -1 when it came from
   clmla_context_create_from_queue and is not in the list). */
clmla_status clmla_context_device(const clmla_context *ctx, clmla_device_info *info);

/* The context's OpenCL context and command queue, owned by it (do not release them): for buffers
   and events an engine passes to the _cl calls; NULL for a NULL context. */
cl_context clmla_context_cl_context(const clmla_context *ctx);
cl_command_queue clmla_context_queue(const clmla_context *ctx);

/* Counters of the context's kernel program cache (in memory and on disk) since its creation. */
typedef struct clmla_program_stats {
    uint64_t built_from_source;   /* clBuildProgram from source */
    uint64_t loaded_from_disk;    /* programs built from a binary in the disk cache */
    uint64_t memory_hits;         /* requests answered from the in-memory cache */
    uint64_t disk_rejected;       /* disk cache files that were unreadable, truncated or corrupt */
    uint64_t disk_written;        /* binaries stored in the disk cache */
} clmla_program_stats;

/* Fills *stats with the context's counters. */
clmla_status clmla_context_program_stats(const clmla_context *ctx, clmla_program_stats *stats);

/* ---- layer configuration (docs/MLA.md sections 1-4, 7) ----------------------------------------- */

typedef enum clmla_rope_pairing {
    CLMLA_ROPE_INTERLEAVED = 0, /* pairs (x[2i], x[2i+1]): DeepSeek and Kimi checkpoints */
    CLMLA_ROPE_HALF_SPLIT = 1   /* pairs (x[i], x[i+dr/2]): "neox" style, e.g. MiniCPM3 */
} clmla_rope_pairing;

/* How the rotary frequencies are made (transformers' "rope_type"). */
typedef enum clmla_rope_type {
    CLMLA_ROPE_TYPE_AUTO = 0,     /* YARN when yarn_factor > 1, else DEFAULT */
    CLMLA_ROPE_TYPE_DEFAULT = 1,  /* inv_freq_i = theta^(-2i/dr) */
    CLMLA_ROPE_TYPE_LINEAR = 2,   /* default / yarn_factor */
    CLMLA_ROPE_TYPE_YARN = 3,     /* docs/MLA.md section 3 */
    CLMLA_ROPE_TYPE_LONGROPE = 4, /* default / short or long factor per pair (MiniCPM3) */
    CLMLA_ROPE_TYPE_LLAMA3 = 5,   /* Llama 3's wavelength-split scaling */
    CLMLA_ROPE_TYPE_NONE = 6      /* no rotation: the rope dims are used as they are (Kimi-Linear) */
} clmla_rope_type;

/* Longest LongRoPE factor list clmla keeps: dr <= 2 * CLMLA_MAX_ROPE_PAIRS for that type. */
#define CLMLA_MAX_ROPE_PAIRS 128

/* Element types of weights (clmla_tensor.dtype); the numbering is clmla_cache_dtype's. */
typedef enum clmla_dtype {
    CLMLA_DTYPE_F32 = 0,
    CLMLA_DTYPE_F16 = 1,     /* IEEE binary16 */
    CLMLA_DTYPE_BF16 = 2,    /* bfloat16: the top 16 bits of a float32 */
    /* float8 e4m3 (OCP "E4M3FN": no infinities, 0x7F / 0xFF NaN, largest 448) with float32 scales
       per 128 x 128 block, DeepSeek-V3's layout: W[i, j] = e4m3(data[i, j]) * scale[i / 128, j / 128]
       (the checkpoint's "<name>_scale_inv"); 2-D weights only. */
    CLMLA_DTYPE_FP8_E4M3 = 3
} clmla_dtype;

/* The type a layer keeps its weights in (clmla_layer_config.weights_dtype). */
typedef enum clmla_weights_dtype {
    CLMLA_WEIGHTS_AS_GIVEN = 0, /* each tensor as given: a checkpoint's own dtype */
    CLMLA_WEIGHTS_F32 = 1,
    CLMLA_WEIGHTS_F16 = 2,
    CLMLA_WEIGHTS_BF16 = 3,
    /* Quantised at creation, 128 x 128 blocks with scale max|W| / 448 (DeepSeek-V3's rule); the
       1-D weights (norms, biases) stay float32. */
    CLMLA_WEIGHTS_FP8 = 4
} clmla_weights_dtype;

/* "f32", "f16", "bf16", "fp8" (the command line's names), or NULL. */
const char *clmla_dtype_name(clmla_dtype dtype);
/* The dtype a weight given as `given` is kept in on the device under `want`. */
clmla_dtype clmla_weights_dtype_held(clmla_weights_dtype want, clmla_dtype given);

typedef struct clmla_layer_config {
    int hidden_size;          /* D */
    int num_heads;            /* H */
    int q_lora_rank;          /* rq; 0 = no query compression (q_proj), as in V2-Lite */
    int kv_lora_rank;         /* rkv */
    int qk_nope_head_dim;     /* dn */
    int qk_rope_head_dim;     /* dr, even */
    int v_head_dim;           /* dv */
    double rms_norm_eps;      /* 0 = 1e-6 */
    double rope_theta;        /* 0 = 10000 */
    clmla_rope_pairing rope_pairing;
    /* YaRN: off when yarn_factor <= 1 (then the other yarn_* fields are ignored). */
    double yarn_factor;                /* s */
    int yarn_original_max_position;    /* L; 0 = 4096 */
    double yarn_beta_fast;             /* 0 = 32 */
    double yarn_beta_slow;             /* 0 = 1 */
    double yarn_mscale;                /* used as given (1.0 in HF's default) */
    double yarn_mscale_all_dim;        /* used as given (0.0 in HF's default) */

    /* ---- RoPE types, scales and limits; all 0: RoPE as the fields above set it, no scale, no limit ---- */
    clmla_rope_type rope_type;         /* AUTO: YARN when yarn_factor > 1, else DEFAULT */
    /* A, the amplitude multiplying cos and sin; 0 = the type's own rule: YARN g(s, yarn_mscale) /
       g(s, yarn_mscale_all_dim) with g(s, m) = 0.1 m ln s + 1 (1 for s <= 1); LONGROPE
       sqrt(1 + ln s / ln L) (1 for s <= 1). Every other type has A = 1 and refuses a non-zero value. */
    double rope_attention_factor;
    int yarn_no_truncate;              /* 1: YaRN's correction range is not rounded (transformers' "truncate": false) */
    double llama3_low_freq_factor;     /* LLAMA3 only */
    double llama3_high_freq_factor;
    /* LONGROPE: per-pair frequency divisors, dr/2 each. A step of a sequence whose last position
       p has p + 1 > L (yarn_original_max_position) rotates its new tokens with the long factors,
       else the short ones; cached keys keep the rotation they were written with (transformers'
       behaviour, decided per sequence and step). yarn_factor is LongRoPE's s, for A. */
    double longrope_short_factor[CLMLA_MAX_ROPE_PAIRS];
    double longrope_long_factor[CLMLA_MAX_ROPE_PAIRS];
    /* Per-position query scale (Mistral 4's Llama-4 scaling): after RoPE every query value of a token
       at position p is multiplied by 1 + query_scale_beta * ln(1 + floor(p / query_scale_interval)).
       0 = off; query_scale_interval 0 = yarn_original_max_position. */
    double query_scale_beta;
    int query_scale_interval;
    /* Constant factors on c^Q and c^KV after their RMSNorms (LongCat-Flash: sqrt(D/rq), sqrt(D/rkv));
       folded into the norm weights at creation. 0 = 1. */
    double q_latent_scale;
    double kv_latent_scale;
    /* A limit for a layer that must not attend densely past it (a sparse-attention model created
       without its indexer, by an engine that selects keys itself): a step that would give a query
       more keys than this fails with CLMLA_ERROR_UNSUPPORTED and changes nothing. 0 = no limit.
       Layers with an indexer (index_n_heads below) select instead and need 0. */
    int dense_max_keys;

    /* The element type the layer keeps its weights in on the device: as each tensor is given
       (clmla_tensor.dtype), or one type for all, converted once at creation. */
    clmla_weights_dtype weights_dtype;

    /* Tensor-parallel shard (docs/MODELS.md, "Tensor-parallel shards"): with tp_size > 1 the layer
       is shard tp_rank of tp_size. num_heads stays the model's H; tp_size must divide it, and
       tp_rank lies in [0, tp_size). The shard holds only heads [tp_rank * H/n, (tp_rank+1) * H/n):
       their rows of q_b_proj (q_proj without a query LoRA) and kv_b_proj and their columns of
       o_proj; q_a_proj, kv_a_proj_with_mqa, the norms and biases are whole. clmla_layer_create
       takes either the full tensors (and keeps its slice) or tensors already sliced for the shard
       (q_b_proj [H/n*(dn+dr), rq], q_proj [H/n*(dn+dr), D], kv_b_proj [H/n*(dn+dv), rkv], o_proj
       [D, H/n*dv]); any other shape is refused naming the tensor. An FP8_E4M3 tensor keeps fp8 with
       the matching slice of its block scales where the shard's boundaries are multiples of 128,
       else it is held in float32 (a warning is logged). Its output is a partial sum: the sum over
       ranks equals the whole layer's output; o_proj_bias is added by rank 0 only. tp_size 0 or 1:
       the whole layer. */
    int tp_rank;
    int tp_size;

    /* ---- DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5; docs/DESIGN.md) ---- */
    /* The lightning indexer: index_n_heads > 0 gives the layer one (its weights are then required,
       and q_lora_rank > 0: its queries come from c^Q). Each step writes every new token's index key
       k = RoPE(LayerNorm(W_k x)) (index_head_dim values, the first qk_rope_head_dim rotated with
       index_rope_pairing, the MLA positions and frequencies) into the cache's index-key cache. A
       step in which some query sees more than index_topk keys scores, for each of its tokens, every
       visible key with (H_I d_I)^-1/2 sum_h w_h ReLU(q_h . k_s) (q = RoPE(W_q c^Q) per head, w = W_w
       x), keeps the index_topk best (ties: the earlier position) and attends to those only, on
       either path; while no query sees more, the layer attends densely, which selects the same
       keys. dense_max_keys must then be 0. index_n_heads 0: no indexer (the other fields ignored). */
    int index_n_heads;                     /* H_I (index_n_heads) */
    int index_head_dim;                    /* d_I (index_head_dim), even, >= qk_rope_head_dim */
    int index_topk;                        /* K (index_topk) >= 1 */
    clmla_rope_pairing index_rope_pairing; /* half-split for deepseek_v32, interleaved for glm_moe_dsa */
    double index_norm_eps;                 /* the key LayerNorm's eps; 0 = 1e-6 */
    /* 1: a "shared" layer (glm_moe_dsa's indexer_types, index_topk_pattern, or index_topk_freq with
       index_skip_topk_offset): no indexer of its own (index_n_heads 0, index_topk as the model's).
       In a step where some query sees more than index_topk keys it attends to the keys that the
       last full layer (one with an indexer) run on the same cache selected in the same step: the
       same entries (sequences and token counts, in order) from the same positions. Without such a
       step before it, or after one of its sequences was truncated or freed, the step is refused
       (CLMLA_ERROR_INVALID_ARGUMENT), and a full layer of another index_topk too
       (CLMLA_ERROR_INVALID_CONFIG); nothing changes. It writes no index keys. 0: not shared. */
    int index_shared;
} clmla_layer_config;

typedef enum clmla_preset {
    CLMLA_PRESET_DEEPSEEK_V2_LITE = 0,
    CLMLA_PRESET_DEEPSEEK_V2 = 1,
    CLMLA_PRESET_DEEPSEEK_V3 = 2, /* also R1 */
    CLMLA_PRESET_KIMI_K2 = 3,
    CLMLA_PRESET_GLM_4_7_FLASH = 4,   /* zai-org/GLM-4.7-Flash (glm4_moe_lite) */
    CLMLA_PRESET_MINICPM3_4B = 5,     /* openbmb/MiniCPM3-4B: half-split pairs, LongRoPE */
    CLMLA_PRESET_MISTRAL_SMALL_4 = 6, /* Mistral-Small-4-119B-2603 (mistral4): YaRN, per-position query scale */
    CLMLA_PRESET_MOONLIGHT = 7        /* moonshotai/Moonlight-16B-A3B: 16 heads, no query compression */
} clmla_preset;

/* The configuration of a published model (docs/MLA.md section 7). */
clmla_status clmla_layer_config_preset(clmla_preset preset, clmla_layer_config *config);
/* The preset's short name ("v2-lite", "v2", "v3", "kimi-k2", "glm-4.7-flash", "minicpm3-4b",
   "mistral-small-4", "moonlight"), or NULL. */
const char *clmla_preset_name(clmla_preset preset);
/* Looks a preset up by short name (any case); CLMLA_ERROR_INVALID_ARGUMENT when unknown. */
clmla_status clmla_preset_from_name(const char *name, clmla_preset *preset);

/* Checks a configuration (zero or negative sizes, odd rope dim, products that overflow, bad YaRN
   values). Returns CLMLA_ERROR_INVALID_CONFIG with the reason in clmla_last_error(NULL). */
clmla_status clmla_layer_config_validate(const clmla_layer_config *config);

/* The softmax scale tau of docs/MLA.md section 4 for this configuration in *scale; a configuration
   that clmla_layer_config_validate refuses returns its status and reason. */
clmla_status clmla_layer_config_softmax_scale(const clmla_layer_config *config, double *scale);

/* ---- weights -------------------------------------------------------------------------------- */

/* A host tensor, row-major, of elements of `dtype` (float32 unless set). The shape is checked
   against the configuration. 1-D tensors (norms, biases) are float32, F16 or BF16. */
typedef struct clmla_tensor {
    const void *data;
    int ndim;          /* 1 or 2 */
    int64_t shape[2];
    /* 0 / NULL: float32 */
    clmla_dtype dtype;
    const float *scale; /* FP8_E4M3 only: [ceil(rows / 128), ceil(cols / 128)] block scales */
} clmla_tensor;

/* One attention layer's weights in the checkpoint layout of docs/MLA.md section 1. With q_lora_rank 0,
   q_proj is required and q_a_proj / q_a_layernorm / q_b_proj must be absent (data NULL); with
   q_lora_rank > 0 it is the other way round. */
typedef struct clmla_layer_weights {
    clmla_tensor q_a_proj;           /* [rq, D] */
    clmla_tensor q_a_layernorm;      /* [rq] */
    clmla_tensor q_b_proj;           /* [H*(dn+dr), rq] */
    clmla_tensor q_proj;             /* [H*(dn+dr), D] */
    clmla_tensor kv_a_proj_with_mqa; /* [rkv+dr, D] */
    clmla_tensor kv_a_layernorm;     /* [rkv] */
    clmla_tensor kv_b_proj;          /* [H*(dn+dv), rkv] */
    clmla_tensor o_proj;             /* [D, H*dv] */
    /* Optional biases, 1-D (checkpoints with "attention_bias": true); data NULL = none. q_proj,
       q_b_proj and kv_b_proj have none in any published MLA model. */
    clmla_tensor q_a_proj_bias;           /* [rq] */
    clmla_tensor kv_a_proj_with_mqa_bias; /* [rkv+dr] */
    clmla_tensor o_proj_bias;             /* [D] */
    /* ---- the lightning indexer (config index_n_heads > 0; data NULL otherwise) ---- */
    clmla_tensor indexer_wq_b;            /* [H_I*d_I, rq]: each head's rope dims first */
    clmla_tensor indexer_wk;              /* [d_I, D] */
    clmla_tensor indexer_k_norm;          /* [d_I] LayerNorm weight */
    clmla_tensor indexer_k_norm_bias;     /* [d_I] LayerNorm bias */
    clmla_tensor indexer_weights_proj;    /* [H_I, D] */
} clmla_layer_weights;

/* Convenience: a 2-D or 1-D tensor descriptor. */
clmla_tensor clmla_tensor_2d(const float *data, int64_t rows, int64_t cols);
clmla_tensor clmla_tensor_1d(const float *data, int64_t size);

/* ---- paged latent KV cache ------------------------------------------------------------------ */

/* The element type of the latent cache. Values are rounded to nearest even when written and read
   back as float32 (clmla_cache_read returns float32 whatever the dtype). */
typedef enum clmla_cache_dtype {
    CLMLA_CACHE_F32 = 0,
    CLMLA_CACHE_F16 = 1, /* vstore_half / vload_half: works on every OpenCL 1.2 device */
    CLMLA_CACHE_BF16 = 2, /* bfloat16: float32's range, 8 bits of mantissa; plain 16-bit loads */
    /* FlashMLA's fp8 layout for DeepSeek's latent cache: per token, c^KV as float8 e4m3 codes with
       one float32 scale per 128 of them (a power of two, from max|x| / 448), then k^R as bf16:
       rkv + 4 rkv/128 + 2 dr bytes (656 for 512 + 64). Needs kv_lora_rank a multiple of 128. */
    CLMLA_CACHE_FP8 = 3
} clmla_cache_dtype;

typedef struct clmla_cache_config {
    int num_layers;        /* 0 = 1 */
    int kv_lora_rank;      /* rkv */
    int rope_dim;          /* dr */
    int block_tokens;      /* tokens per block; 0 = 64 */
    int num_blocks;        /* blocks in the pool, shared by all sequences (each block spans all layers) */
    clmla_cache_dtype dtype;
    /* ---- the index-key cache of sparse-attention layers (clmla_layer_config.
       index_n_heads > 0), paged by the same blocks: index_head_dim values per token and layer, of
       index_dtype (CLMLA_CACHE_F32, CLMLA_CACHE_F16 or CLMLA_CACHE_BF16, rounded to nearest even when
       written; or CLMLA_CACHE_FP8, DeepSeek-V3.2's: the key rotated by a Hadamard transform (H /
       sqrt(index_head_dim), a power of two) in e4m3 codes with a float32 power-of-two scale per key,
       2^ceil(log2(max(max|k|, 1e-4) / 448)), a block holding its tokens' codes then their scales:
       index_head_dim + 4 bytes a token). 0 = none. ---- */
    int index_head_dim;
    clmla_cache_dtype index_dtype;
} clmla_cache_config;

typedef struct clmla_cache clmla_cache;

/* The index-key dtype clmla pairs with a latent cache of `dtype` (clmla run, clmla_model and the
   Python Cache take it unless told otherwise): float32 beside float32, DeepSeek's fp8 beside fp8
   where index_head_dim is a power of two, else bf16. */
clmla_cache_dtype clmla_cache_index_dtype(clmla_cache_dtype dtype, int index_head_dim);

/* Holds, per layer and token, only c^KV after RMSNorm (rkv values) and k^R after RoPE (dr values).
   A sequence owns a list of blocks (its block table), the same blocks in every layer. After
   clmla_cache_seq_fork, sequences may share blocks (see there). */
clmla_status clmla_cache_create(clmla_context *ctx, const clmla_cache_config *config, clmla_cache **cache);
void clmla_cache_destroy(clmla_cache *cache);

/* A new, empty sequence; ids are small non-negative integers, reused after a free. */
clmla_status clmla_cache_seq_add(clmla_cache *cache, int32_t *seq_id);
/* Returns the sequence's blocks to the pool; a block shared with other sequences returns only when
   the last of them lets go of it. */
clmla_status clmla_cache_seq_free(clmla_cache *cache, int32_t seq_id);
/* Makes sure the sequence owns blocks for at least `tokens` tokens in total, so that later appends
   up to that length cannot fail for lack of blocks: a shared block (clmla_cache_seq_fork) that
   those appends would write into is copied now, taking a block. CLMLA_ERROR_CACHE_FULL changes
   nothing. */
clmla_status clmla_cache_seq_reserve(clmla_cache *cache, int32_t seq_id, int tokens);
/* Shortens the sequence to its first `tokens` tokens in every layer (e.g. to drop rejected
   speculative tokens). `tokens` must not exceed its length in any layer, else
   CLMLA_ERROR_INVALID_ARGUMENT and nothing changes. The rows kept are unchanged. The sequence
   keeps the ceil(tokens / block_tokens) blocks that hold them and lets go of the others, blocks
   reserved with clmla_cache_seq_reserve included; a block shared with other sequences returns to
   the pool only when the last of them lets go of it. */
clmla_status clmla_cache_seq_truncate(clmla_cache *cache, int32_t seq_id, int tokens);
/* A new sequence, *new_seq, with the same tokens as src_seq in every layer (parallel sampling,
   beam search), made without copying anything: it lists the blocks that hold src_seq's tokens
   (not those src_seq only reserved), and every block counts the sequences that list it.
   Copy on write: before an append (clmla_cache_append_cl, clmla_layer_forward[_cl]) or a
   clmla_cache_seq_reserve writes into a block that other sequences list too, the writing
   sequence gets a block of its own, filled on the device with a copy of that block's rows in
   every layer, so writes to one sequence never change another's tokens. So after a fork, the
   first of the two sequences to append into their shared, partly filled last block takes a block
   for its copy (CLMLA_ERROR_CACHE_FULL when none is free, and nothing changes) and the other then
   owns the original alone; full blocks stay shared (a truncate into one makes the next append
   copy it). When several sequences sharing a block write into it in one step, each takes a copy
   and the original returns to the pool at the end of the step. Freeing or truncating a sequence
   releases its blocks; a block returns to the pool when the last sequence listing it lets go of
   it. The fork itself takes no block (never CLMLA_ERROR_CACHE_FULL); on failure *new_seq is -1
   and nothing changes. */
clmla_status clmla_cache_seq_fork(clmla_cache *cache, int32_t src_seq, int32_t *new_seq);
/* Tokens stored for the sequence in `layer`. */
clmla_status clmla_cache_seq_length(const clmla_cache *cache, int32_t seq_id, int layer, int *length);
/* The sequence's block ids in order (at most max_blocks are written), and in *num_blocks
   (optional, may be NULL) how many it owns. A block shared after a fork is in the list of every
   sequence sharing it. An append, reserve or truncate may replace entries already listed (copy on
   write, see clmla_cache_seq_fork), not only add or drop some at the end: read the table again
   after them. */
clmla_status clmla_cache_seq_blocks(const clmla_cache *cache, int32_t seq_id, int32_t *blocks, int max_blocks,
                                    int *num_blocks);

typedef struct clmla_cache_info {
    size_t bytes_per_token_per_layer; /* (rkv + dr) * element size */
    size_t bytes_per_block;           /* per layer */
    size_t bytes_total;               /* device memory of the pool, all layers */
    int block_tokens;
    int blocks_total, blocks_used, blocks_free; /* a shared block counts once */
    int sequences;
    /* the index-key cache (0 without one); bytes_per_block and bytes_total include it */
    size_t index_bytes_per_token_per_layer;
} clmla_cache_info;
/* Fills *info with the cache's sizes and counts now. */
clmla_status clmla_cache_get_info(const clmla_cache *cache, clmla_cache_info *info);

/* Appends n tokens to a sequence in one layer from the caller's device buffers (engines that run
   their own projections): c_kv [n, rkv] after RMSNorm and k_rope [n, dr] after RoPE, float32,
   rows of the given strides (in floats), offsets in floats. CLMLA_ERROR_CACHE_FULL changes nothing. */
clmla_status clmla_cache_append_cl(clmla_cache *cache, int layer, int32_t seq_id, int n,
                                   cl_mem c_kv, size_t c_kv_offset, int c_kv_stride,
                                   cl_mem k_rope, size_t k_rope_offset, int k_rope_stride, cl_event *event);

/* Copies tokens [start, start+n) of a sequence in one layer back to the host as float32:
   c_kv [n, rkv], k_rope [n, dr] (either may be NULL). Blocking. */
clmla_status clmla_cache_read(const clmla_cache *cache, int layer, int32_t seq_id, int start, int n, float *c_kv,
                              float *k_rope);
/* Copies the index keys of tokens [start, start+n) of a sequence in one layer back to the host as
   float32: keys [n, index_head_dim] (an fp8 cache: the rotated keys it stores, codes times scale).
   CLMLA_ERROR_INVALID_ARGUMENT when the cache has no index-key cache. Blocking. */
clmla_status clmla_cache_read_index(const clmla_cache *cache, int layer, int32_t seq_id, int start, int n, float *keys);

/* The device buffer of one layer in *buffer (owned by the cache: do not release it):
   [blocks_total * block_tokens, rkv + dr] of the cache dtype, row b*block_tokens + i is token i of
   block b. CLMLA_ERROR_INVALID_ARGUMENT for a layer outside [0, num_layers). */
clmla_status clmla_cache_layer_buffer(const clmla_cache *cache, int layer, cl_mem *buffer);

/* ---- layer and forward step ----------------------------------------------------------------- */

typedef struct clmla_layer clmla_layer;

/* Checks the configuration and every weight's shape (a missing tensor is named; a wrong shape
   names the tensor, the expected and the given shape) and uploads the weights once. A
   tensor-parallel shard (config->tp_size > 1) uploads only its slices (clmla_layer_config.tp_rank). */
clmla_status clmla_layer_create(clmla_context *ctx, const clmla_layer_config *config,
                                const clmla_layer_weights *weights, clmla_layer **layer);
void clmla_layer_destroy(clmla_layer *layer);
/* The configuration as given (defaults resolved); for a shard the model's num_heads and its tp fields. */
clmla_status clmla_layer_get_config(const clmla_layer *layer, clmla_layer_config *config);

typedef enum clmla_attention_path {
    CLMLA_PATH_AUTO = 0,         /* absorbed below the layer's prefill threshold, else decompressed */
    CLMLA_PATH_ABSORBED = 1,     /* attention in latent space (docs/MLA.md section 5) */
    CLMLA_PATH_DECOMPRESSED = 2  /* up-projected keys and values, ordinary causal attention; an
                                    entry whose keys' up-projection would not fit the device's
                                    largest buffer is refused (CLMLA_ERROR_UNSUPPORTED) */
} clmla_attention_path;

/* One entry of a step: num_tokens new tokens of a sequence, appended at its current length in the
   cache layer, so their positions are length .. length+num_tokens-1. A sequence appears at most
   once per step. */
typedef struct clmla_batch_entry {
    int32_t seq_id;
    int num_tokens;
} clmla_batch_entry;

typedef struct clmla_forward_args {
    const clmla_batch_entry *entries; /* [num_entries]; their tokens are consecutive rows of x */
    int num_entries;
    int cache_layer;                  /* which layer of the cache this layer uses */
    clmla_attention_path path;
} clmla_forward_args;

/* The attention output after o_proj (no residual) for hidden states x:
   x [total_tokens, D] -> out [total_tokens, D], float32. Blocking. On any failure (including
   CLMLA_ERROR_CACHE_FULL) every sequence keeps its length and contents. */
clmla_status clmla_layer_forward(clmla_layer *layer, clmla_cache *cache, const clmla_forward_args *args,
                                 const float *x, float *out);

/* The same on device buffers (offsets in floats), enqueued on the context's queue with no
   clFinish; *event (optional) completes when out is written. */
clmla_status clmla_layer_forward_cl(clmla_layer *layer, clmla_cache *cache, const clmla_forward_args *args,
                                    cl_mem x, size_t x_offset, cl_mem out, size_t out_offset, cl_event *event);

/* Builds, before the first real step, the kernels that this layer's steps select on its device
   and with this cache (its dtype), so that no step of a workload pays for a compilation: runs, on
   zero inputs, steps of every size class the kernels distinguish (chunks of 1 to 200 tokens, and
   for the decompressed path contexts of 1 to 296 keys; small chunks at a context past one split
   of the keys) on both attention paths, on a sequence of its own in layer `cache_layer` of `cache`,
   freed again at the end. Needs free blocks for CLMLA_WARMUP_TOKENS tokens: CLMLA_ERROR_CACHE_FULL
   otherwise, before anything runs. The cache's other sequences are not touched. Kernels are kept
   per context (products) and per cache (attention): a second cache needs its own warm-up.
   Blocking; kernels not yet in the program cache are compiled. */
#define CLMLA_WARMUP_TOKENS 296
clmla_status clmla_layer_warmup(clmla_layer *layer, clmla_cache *cache, int cache_layer);

/* In *tokens: after a long prefix, entries with at least this many tokens take the decompressed
   path under CLMLA_PATH_AUTO (1000000: none ever does). After a short prefix the count differs:
   fewer tokens on CPU devices and on others with attn_prefill_tiled, up to twice as many on others
   with attn_prefill (clmla_layer_auto_path gives the choice for any prefix; docs/DESIGN.md, "Which
   path"). */
clmla_status clmla_layer_auto_threshold(const clmla_layer *layer, int *tokens);

/* In *path: the path CLMLA_PATH_AUTO takes (CLMLA_PATH_ABSORBED or CLMLA_PATH_DECOMPRESSED) for
   an entry of `tokens` new tokens in a sequence that holds `prefix` tokens before the step, in a
   step whose sequences hold at most prefix + tokens keys afterwards (a longer one in the same
   step can make a layer with an indexer select keys, which changes the choice). An entry whose
   decompressed scratch would pass 1 GiB (or an eighth of the device's memory), the most the
   absorbed path holds, stays absorbed. docs/DESIGN.md, "Which path", gives the rule. */
clmla_status clmla_layer_auto_path(const clmla_layer *layer, int prefix, int tokens, clmla_attention_path *path);

/* The device memory a layer holds, in bytes, by checkpoint tensor, as the layer stores it: in its
   weights dtype (an FP8 tensor's block scales included), packed in panels on CPU devices;
   q_proj or q_a_proj and kv_a_proj_with_mqa share one buffer, each counted for its rows of it.
   A tensor-parallel shard counts what it holds: its slices, and o_proj's bias on rank 0 only. */
typedef struct clmla_layer_memory {
    size_t q_a_proj;           /* 0 without a query LoRA */
    size_t q_proj;             /* 0 with one */
    size_t kv_a_proj_with_mqa;
    size_t q_b_proj;           /* 0 without a query LoRA */
    size_t kv_b_proj;
    size_t o_proj;
    size_t norms;              /* q_a_layernorm and kv_a_layernorm */
    size_t biases;             /* the optional biases, together */
    size_t rope_table;         /* (A cos, A sin) by position, grown with the longest sequence seen */
    size_t total;              /* every buffer of the layer: the sum of the above and of indexer */
    size_t indexer;            /* the indexer's weights (wq_b, wk, weights_proj, k_norm); 0 without */
} clmla_layer_memory;

/* Fills *memory with the layer's device memory. */
clmla_status clmla_layer_get_memory(const clmla_layer *layer, clmla_layer_memory *memory);

/* ---- latent attention alone (FlashMLA-style) ------------------------------------------------ */

/* For engines that run their own projections: absorbed queries over the paged cache.
   Token t attends to keys 0 .. token_ctx_len[t]-1 of the sequence whose block table is row
   token_seq[t] of block_table. Offsets in elements. */
typedef struct clmla_latent_attention_args {
    int num_tokens;                 /* T */
    int num_heads;                  /* H */
    float softmax_scale;            /* tau */
    cl_mem q_latent; size_t q_latent_offset;   /* [T, H, rkv] float32: q~_h = W^UK_h^T q^C_h */
    cl_mem q_rope; size_t q_rope_offset;       /* [T, H, dr] float32, after RoPE */
    cl_mem block_table;             /* [num_sequences, max_blocks_per_seq] int32 block ids */
    int max_blocks_per_seq;
    cl_mem token_seq;               /* [T] int32: row of block_table */
    cl_mem token_ctx_len;           /* [T] int32: keys attended (0 = none: output 0, lse -inf) */
    int max_ctx_len;                /* an upper bound of token_ctx_len, to size the split; at most
                                       max_blocks_per_seq * block_tokens */
    cl_mem out; size_t out_offset;  /* [T, H, rkv] float32: o-bar_h = softmax-weighted sum of c^KV */
    cl_mem lse; size_t lse_offset;  /* [T, H] float32 natural-log log-sum-exp of the scores; may be NULL */
    /* Multi-token decode (speculative decoding, multi-token prediction), FlashMLA's
       seqlen_q. 0 or 1: the tokens are independent. q > 1: tokens b*q .. b*q+q-1 are q new tokens of
       one sequence (the same token_seq; each keeps its own token_ctx_len, so causal among them), and
       num_tokens a multiple of q. The work-group kernel (GPUs) then reads a cache row once for
       several of a sequence's tokens where the sequence has fewer heads than a group takes
       (clmla_tuning.h: group_fold); the result is that of q = 1. The sparse call ignores it. */
    int query_len;
} clmla_latent_attention_args;

/* Enqueues the attention on the context's queue with no clFinish; *event (optional) completes when
   out and lse are written. A bad argument (a NULL buffer, a layer or size out of range) is
   CLMLA_ERROR_INVALID_ARGUMENT naming it, with nothing enqueued. The kernels are built on the first
   call with a cache (per head count) and kept by the cache. */
clmla_status clmla_attention_latent(clmla_cache *cache, int layer, const clmla_latent_attention_args *args,
                                    cl_event *event);

/* Sparse latent attention (DeepSeek Sparse Attention, DeepSeek-V3.2 and GLM-5), FlashMLA-style,
   for engines that run their own indexer and top-k: token t attends only to the positions
   indices[indices_offset + t*topk + i], i < topk (int32, logical positions in its sequence, the
   row token_seq[t] of block_table, translated through that table as the dense call does). An
   entry < 0 or >= token_ctx_len[t] is no key and is skipped (-1 is the padding convention); a
   token without a valid entry gets out 0 and lse -inf. The order of the entries does not matter;
   a position listed twice counts twice (its weight doubles), as in a softmax over the list.
   Everything else is as clmla_attention_latent: the same args (max_ctx_len is still checked
   against the table but topk, not it, sizes the split of the keys), softmax scale, outputs
   out [T, H, rkv] and lse [T, H], every cache dtype, enqueued with no clFinish. topk must be in
   1 .. CLMLA_SPARSE_MAX_TOPK and indices a buffer holding at least indices_offset + T*topk int32
   (offset in elements); otherwise CLMLA_ERROR_INVALID_ARGUMENT naming the value, and nothing is
   enqueued. The kernels are built on the first call with a cache (per head count, like the dense
   ones) and kept. */
#define CLMLA_SPARSE_MAX_TOPK 65536
clmla_status clmla_attention_latent_sparse(clmla_cache *cache, int layer, const clmla_latent_attention_args *args,
                                           cl_mem indices, size_t indices_offset, int topk, cl_event *event);

/* DeepSeek Sparse Attention's selection (the lightning indexer's scores and top-k), for engines that
   run the indexer's projections themselves; a layer with an indexer runs it inside
   clmla_layer_forward. For token t, with k_s the index key of position s of its sequence (the row
   token_seq[t] of block_table) in the cache's index-key cache of `layer`, every visible position
   s < token_ctx_len[t] (clamped to max_ctx_len) is scored
       I(t, s) = sum_h weights[t, h] max(q[t, h] . k_s, 0)
   and indices[t, :] gets the min(top_k, visible) best positions (on a tie the earlier position), in
   ascending order, then -1 up to top_k: ready for clmla_attention_latent_sparse. The weights carry
   the indexer's scale ((H_I d_I)^-1/2 for DeepSeek-V3.2 and GLM-5). The scores go through the
   context's scratch, a chunk of tokens at a time; enqueued with no clFinish. The kernels are built
   on the first call with a cache and head count, and kept by the cache. A bad argument (no
   index-key cache, a NULL or short buffer, top_k outside 1 .. CLMLA_SPARSE_MAX_TOPK) is
   CLMLA_ERROR_INVALID_ARGUMENT naming it, with nothing enqueued. */
typedef struct clmla_index_select_args {
    int num_tokens;                        /* T >= 1 */
    int num_heads;                         /* H_I >= 1 */
    int top_k;                             /* K */
    cl_mem q; size_t q_offset;             /* [T, H_I, d_I] float32, after RoPE (offsets in elements) */
    cl_mem weights; size_t weights_offset; /* [T, H_I] float32 */
    cl_mem block_table;                    /* [rows, max_blocks_per_seq] int32 block ids */
    int max_blocks_per_seq;
    cl_mem token_seq;                      /* [T] int32: row of block_table */
    cl_mem token_ctx_len;                  /* [T] int32: visible positions 0 .. ctx - 1 */
    int max_ctx_len;                       /* >= 1, at most max_blocks_per_seq * block_tokens */
    cl_mem indices; size_t indices_offset; /* [T, top_k] int32, written */
} clmla_index_select_args;

clmla_status clmla_index_select(clmla_cache *cache, int layer, const clmla_index_select_args *args, cl_event *event);

/* The device buffer of one layer's index-key cache (owned by the cache): [blocks_total *
   block_tokens, index_head_dim] of index_dtype, the same rows as clmla_cache_layer_buffer's.
   CLMLA_ERROR_INVALID_ARGUMENT for a layer out of range or a cache without index keys. */
clmla_status clmla_cache_index_buffer(const clmla_cache *cache, int layer, cl_mem *buffer);

/* ---- attention over a caller's paged cache (engines) ---------------------------------------- */
/* For engines that own their KV cache (vLLM, SGLang, FlashMLA's callers): one layer's latent cache
   is [num_blocks, block_size, row] in the caller's memory, laid out as vLLM's MLA backends and
   FlashMLA hold it. Each token's row is c^KV (kv_lora_rank values) then k^R (rope_dim values):
     CLMLA_CACHE_F32, CLMLA_CACHE_F16, CLMLA_CACHE_BF16: rkv + dr values of 4 or 2 bytes (vLLM's
       "auto" cache of the model's dtype);
     CLMLA_CACHE_FP8: FlashMLA's row (vLLM's "fp8_ds_mla"): rkv e4m3 codes, rkv / 128 float32
       scales (scale i for codes 128 i .. 128 i + 127), then dr bfloat16 values: 656 bytes at 512 + 64.
   Slot s = block * block_size + offset is row s of the cache. A clmla_paged holds the kernels of
   one layout and no memory of the cache: one serves every layer of that layout. Its calls are
   calls on the context (the threading rules at the top), enqueued on the context's queue; every
   argument is checked before anything is enqueued, and a refused call changes nothing. */

/* Memory handed to a paged call: a buffer of the context's cl_context, or host memory.
   - mem: the data starts `offset` bytes into it. A buffer shorter than offset plus what the call
     reads or writes there, or of another cl_context, is refused by name.
   - host (mem NULL): the data starts at host + offset, and `bytes` bytes from there are the
     caller's (required: a region shorter than what the call needs is refused by name). Where the
     device shares host memory (clmla_paged_info.host_unified: PoCL's CPU device, integrated GPUs)
     and host + offset is a multiple of clmla_paged_info.host_alignment (the device's
     CL_DEVICE_MEM_BASE_ADDR_ALIGN), the memory is wrapped with CL_MEM_USE_HOST_PTR and used in
     place: no copy. Otherwise the region is copied to the device and, if the call writes it, back
     (clmla_paged_info counts these copies). A call given any host memory returns when it is done;
     the memory must stay valid until then. */
typedef struct clmla_buffer {
    cl_mem mem;
    void *host;
    size_t offset; /* bytes */
    size_t bytes;  /* host: bytes at host + offset; mem: unused (the buffer's CL_MEM_SIZE is read) */
} clmla_buffer;

typedef struct clmla_paged_config {
    int kv_lora_rank;               /* rkv (512 for DeepSeek-V2/V3); a multiple of 128 for fp8 */
    int rope_dim;                   /* dr (64), even */
    int block_size;                 /* tokens per block, any >= 1 */
    clmla_cache_dtype dtype;        /* the rows' dtype, above */
    /* The index-key cache of sparse-attention layers (clmla_paged_index_select; 0: none): keys of
       index_head_dim values, paged by the same blocks, as clmla_cache_config's index-key cache holds
       them: block b holds its block_size keys of index_dtype (f32, f16, bf16), or for fp8
       (DeepSeek-V3.2's: Hadamard-rotated keys, e4m3 codes, one float32 scale per key) the block's
       block_size x index_head_dim codes, then its block_size scales. */
    int index_head_dim;
    clmla_cache_dtype index_dtype;
} clmla_paged_config;

typedef struct clmla_paged clmla_paged;

/* Builds the kernels of the layout (the attention kernels on first use, per head count). */
clmla_status clmla_paged_create(clmla_context *ctx, const clmla_paged_config *config, clmla_paged **paged);
void clmla_paged_destroy(clmla_paged *paged);

typedef struct clmla_paged_info {
    size_t row_bytes;       /* one token's row: (rkv + dr) x 4 or 2, or rkv + 4 rkv / 128 + 2 dr (fp8) */
    size_t block_bytes;     /* block_size rows: a cache of n blocks is n x block_bytes */
    size_t index_block_bytes; /* one block of the index-key cache (0 without one) */
    size_t host_alignment;  /* bytes: host memory used in place starts at a multiple of this */
    int host_unified;       /* 1 where the device shares host memory (CL_DEVICE_HOST_UNIFIED_MEMORY) */
    uint64_t host_wrapped;  /* host regions used in place so far */
    uint64_t host_copied;   /* host regions copied so far (misaligned, or the device does not share memory) */
    uint64_t host_copied_bytes;
} clmla_paged_info;
/* Fills *info with the layout's sizes and the host-memory counters so far. */
clmla_status clmla_paged_get_info(const clmla_paged *paged, clmla_paged_info *info);

/* Sparse index lists (clmla_paged_attention_args.indices_kind). */
typedef enum clmla_paged_indices {
    CLMLA_PAGED_INDICES_SLOTS = 0,     /* cache slots, block * block_size + offset (FlashMLA's sparse decode:
                                          block_table and cache_seqlens are not read) */
    CLMLA_PAGED_INDICES_POSITIONS = 1  /* positions 0 .. cache_seqlens[b] - 1 of sequence b, through its row of
                                          block_table (clmla_attention_latent_sparse's) */
} clmla_paged_indices;

/* Absorbed attention of B sequences' new tokens over the caller's cache: FlashMLA's
   flash_mla_with_kvcache, and vLLM's forward_mqa. Query (b, i) attends to
     dense, causal 0:  keys 0 .. cache_seqlens[b] - 1 of sequence b;
     dense, causal 1:  keys 0 .. cache_seqlens[b] - seqlen_q + i (the new tokens are the last seqlen_q);
     sparse (topk > 0): the keys indices[b, i, 0 .. topk - 1] names; an entry outside the valid
                       range (-1 is the padding) is no key, a key named twice counts twice;
   where key j of sequence b is row block_table[b, j / block_size] * block_size + j % block_size.
   Scores are softmax_scale (q~ . c^KV + q^R . k^R); out gets the softmax-weighted sum of c^KV and
   lse the natural log of the sum of exp(scores). A query with no key gets out 0 and lse -inf.
   Results are those of clmla_attention_latent over a clmla_cache holding the same rows (the same
   kernels, bit for bit).
   Block tables and lengths in host memory are checked before anything is enqueued: a length
   outside 0 .. max_blocks x block_size, or a block id outside 0 .. num_blocks - 1 among the blocks
   a query reads, is refused naming the sequence, the entry and num_blocks. Held in a device
   buffer, they are checked on the device, in the call: a sequence with such a length or block id
   reads nothing (its queries get out 0 and lse -inf) and the call sets CLMLA_PAGED_BAD_LENGTH or
   CLMLA_PAGED_BAD_BLOCK in the paged object's status (clmla_paged_status). No kernel reads outside
   the cache. */
typedef struct clmla_paged_attention_args {
    int batch;                  /* B >= 1 */
    int seqlen_q;               /* query tokens of each sequence, FlashMLA's seqlen_q (0 = 1) */
    int num_heads;              /* H >= 1 */
    float softmax_scale;        /* 0: (rkv + dr)^-1/2, FlashMLA's default */
    int causal;                 /* dense calls, above; a sparse call must leave it 0 */
    clmla_buffer q;             /* [B, seqlen_q, H, rkv + dr] float32: q~ (W^UK absorbed), then q^R after RoPE */
    clmla_buffer kv_cache;      /* [num_blocks, block_size, row bytes]; offset a multiple of 16 bytes. Host
                                   memory is also used in place where `host` (not host + offset) is a
                                   multiple of host_alignment: the region from `host` is wrapped */
    int num_blocks;             /* >= 1, num_blocks x block_size < 2^31 */
    clmla_buffer block_table;   /* [B, max_blocks] int32; a device buffer's offset a multiple of max_blocks x 4 */
    int max_blocks;             /* >= 1 */
    clmla_buffer cache_seqlens; /* [B] int32: the keys each sequence holds, its new tokens included */
    int max_seqlen;             /* an upper bound of cache_seqlens, to size the split of the keys (0: max_blocks x
                                   block_size) */
    clmla_buffer indices;       /* sparse: [B, seqlen_q, topk] int32 */
    int topk;                   /* 0: dense; else 1 .. CLMLA_SPARSE_MAX_TOPK */
    clmla_paged_indices indices_kind;
    clmla_buffer out;           /* [B, seqlen_q, H, rkv] float32, written */
    clmla_buffer lse;           /* [B, seqlen_q, H] float32, written; optional (mem and host NULL) */
    /* An additive mask (dense calls; optional, mem and host NULL: none), as ggml's and transformers'
       attention take one: [B x seqlen_q, mask_stride] IEEE half, row b x seqlen_q + i for query
       (b, i); key j of the query's keys (the dense rule above) adds mask[row][j] to its score
       (softmax_scale (q . k) + mask), -inf making it no key. The same for every head. mask_stride
       (in values) >= max_blocks x block_size. */
    clmla_buffer mask;
    int mask_stride;
} clmla_paged_attention_args;

/* *event (optional) completes when out and lse are written. */
clmla_status clmla_paged_attention(clmla_paged *paged, const clmla_paged_attention_args *args, cl_event *event);

/* vLLM's concat_and_cache_mla: token t's c^KV (after RMSNorm) and k^R (after RoPE) into row
   slot_mapping[t] of the caller's cache, rounded to the cache's dtype as clmla's own cache writes
   them (fp8: each 128 values under the power-of-two scale 2^ceil(log2(max(max|x| / 448, 1e-4)))).
   A slot of -1 skips the token. Slots must be distinct. Slots in host memory outside -1 ..
   num_blocks x block_size - 1 are refused naming the token; in a device buffer such a token is
   not written and the call sets CLMLA_PAGED_BAD_SLOT in the status. */
typedef struct clmla_paged_write_args {
    int num_tokens;             /* T >= 1 */
    clmla_buffer kv_c;          /* [T, rkv] float32, rows kv_c_stride floats apart */
    int kv_c_stride;            /* 0 = rkv */
    clmla_buffer k_pe;          /* [T, dr] float32, rows k_pe_stride floats apart */
    int k_pe_stride;            /* 0 = dr */
    clmla_buffer slot_mapping;  /* [T] int32 */
    clmla_buffer kv_cache;      /* as clmla_paged_attention_args, written */
    int num_blocks;
} clmla_paged_write_args;

/* *event (optional) completes when the rows are written. */
clmla_status clmla_paged_write(clmla_paged *paged, const clmla_paged_write_args *args, cl_event *event);

/* DeepSeek Sparse Attention's selection over the caller's index-key cache (clmla_index_select's
   work): query (b, i) scores each position s it sees (the dense rule of clmla_paged_attention,
   causal or not) as I = sum_h weights[b, i, h] max(q[b, i, h] . k_s, 0), and indices[b, i, :] gets
   the min(top_k, visible) best positions (on a tie the earlier one) in ascending order, then -1:
   ready for clmla_paged_attention with CLMLA_PAGED_INDICES_POSITIONS. Tables, lengths and their
   refusals and status are as in clmla_paged_attention (a sequence with a bad table sees no
   position: its lists are all -1). Needs a layout with index_head_dim. */
typedef struct clmla_paged_index_args {
    int batch;                  /* B >= 1 */
    int seqlen_q;               /* 0 = 1 */
    int num_heads;              /* H_I >= 1 */
    int top_k;                  /* 1 .. CLMLA_SPARSE_MAX_TOPK */
    int causal;
    clmla_buffer q;             /* [B, seqlen_q, H_I, index_head_dim] float32, after RoPE */
    clmla_buffer weights;       /* [B, seqlen_q, H_I] float32, with the indexer's scale */
    clmla_buffer index_cache;   /* [num_blocks] blocks of index keys (clmla_paged_config); a device buffer's offset a
                                   multiple of host_alignment */
    int num_blocks;
    clmla_buffer block_table;   /* as clmla_paged_attention_args */
    int max_blocks;
    clmla_buffer cache_seqlens;
    int max_seqlen;
    clmla_buffer indices;       /* [B, seqlen_q, top_k] int32, written */
} clmla_paged_index_args;

/* *event (optional) completes when indices are written. */
clmla_status clmla_paged_index_select(clmla_paged *paged, const clmla_paged_index_args *args, cl_event *event);

/* Problems found on the device in block tables, lengths and slots it held (flags OR'ed together
   since the last reset). clmla_paged_status waits for the context's queue, reads them into *flags
   and, with reset 1, clears them. */
#define CLMLA_PAGED_BAD_BLOCK 1   /* a block id outside 0 .. num_blocks - 1: that sequence read nothing */
#define CLMLA_PAGED_BAD_LENGTH 2  /* a cache_seqlens outside 0 .. max_blocks x block_size: likewise */
#define CLMLA_PAGED_BAD_SLOT 4     /* a slot outside -1 .. num_blocks x block_size - 1: that token not written */
clmla_status clmla_paged_status(clmla_paged *paged, int reset, uint32_t *flags);

/* ---- projections alone: y = x W^T ---------------------------------------------------------- */

/* For engines that run their own projections (and for clmla-bench): one weight W [n, k] uploaded
   once and kept on the device as a layer keeps its projections (packed in panels for clmla's CPU
   kernels on CPU devices, row-major elsewhere; docs/DESIGN.md), and y = x W^T run through the
   library's product kernels: clmla's decode-shaped kernels for up to 8 rows on every device and
   for any number of rows on CPUs, CLBlast otherwise. float32, the element type of clmla_tensor.
   A linear belongs to its context like a layer or a cache: the threading rules at the top hold,
   and it is destroyed before the context. */
typedef struct clmla_linear clmla_linear;

/* Checks w and uploads it once; the host array may be freed afterwards. On failure *linear is NULL
   and the message names the shape given: a NULL argument is CLMLA_ERROR_INVALID_ARGUMENT, w->data
   NULL CLMLA_ERROR_MISSING_TENSOR, a w that is not 2-D or has a dimension <= 0
   CLMLA_ERROR_SHAPE_MISMATCH, one larger than the device's largest allocation CL_INVALID_BUFFER_SIZE. */
clmla_status clmla_linear_create(clmla_context *ctx, const clmla_tensor *w, clmla_linear **linear);
void clmla_linear_destroy(clmla_linear *linear);

/* y [m, n] = x [m, k] W^T on float32 device buffers of the context's cl_context, rows contiguous
   (x's row stride k, y's n), offsets in floats, enqueued on the context's queue with no clFinish;
   *event (optional) completes when y is written (NULL after a failure). m <= 0, a NULL buffer, a
   buffer smaller than its offset + m rows (CL_MEM_SIZE), one of another cl_context and an x that
   overlaps y are refused with CLMLA_ERROR_INVALID_ARGUMENT before anything is enqueued. Where W is
   packed (clmla_linear_info) the kernels index x and y by int: each offset + m rows must stay
   below 2^31 floats (split the rows otherwise). */
clmla_status clmla_linear_forward_cl(clmla_linear *linear, int m, cl_mem x, size_t x_offset, cl_mem y, size_t y_offset,
                                     cl_event *event);

/* The same on host arrays x [m, k], y [m, n], through the context's scratch buffers. Blocking. */
clmla_status clmla_linear_forward(clmla_linear *linear, int m, const float *x, float *y);

/* Device memory the weight holds (the scratch of clmla_linear_forward belongs to the context). */
clmla_status clmla_linear_device_bytes(const clmla_linear *linear, size_t *bytes);

typedef struct clmla_linear_info {
    int64_t n;           /* output features: rows of W, columns of y */
    int64_t k;           /* input features: columns of W and of x */
    size_t device_bytes; /* as clmla_linear_device_bytes */
    int packed;          /* 1: W kept in panels for clmla's CPU kernels, 0: row-major */
} clmla_linear_info;
/* Fills *info with the weight's shape and storage. */
clmla_status clmla_linear_get_info(const clmla_linear *linear, clmla_linear_info *info);

/* ---- model folders (Hugging Face checkpoints) ---- */

/* A model folder as published or as transformers' save_pretrained writes it: config.json and
   either model.safetensors or the shards listed in model.safetensors.index.json. The MLA families
   clmla runs, how each config.json field is read (both RoPE layouts, transformers' precedence,
   the family defaults) and what is refused are in docs/MODELS.md; clmla_model_types() lists them. */

/* Reads MODEL_DIR/config.json into the layer configuration every MLA layer of the model shares,
   and the number of decoder layers (into *num_layers, which may be NULL). A model_type that is not
   an MLA family clmla runs, a rope type or field that would change the result and that clmla does
   not implement, a missing or mistyped field: an error naming the file and the field, with the
   message in clmla_last_error(NULL). */
clmla_status clmla_model_read_config(const char *model_dir, clmla_layer_config *config, int *num_layers);

/* Creates the attention of decoder layer `layer_index` of a model folder: reads config.json, finds
   the layer's self_attn tensors (under transformers' names, or a multimodal wrapper's prefix),
   keeps them in their stored dtype (F32, F16, BF16, or F8_E4M3 with their "<name>_scale_inv" 128x128
   block scales, W[i,j] = fp8(Wq[i,j]) * S[i/128, j/128]; see clmla_model_options to convert), with
   the biases when config.json says "attention_bias": true, and calls clmla_layer_create. Every
   other tensor is ignored. A malformed file, a missing tensor or shard, a shape that disagrees with
   config.json (both shapes named), an unsupported dtype or a layer index out of range fails with a
   message in clmla_last_error(ctx). */
clmla_status clmla_layer_create_from_model(clmla_context *ctx, const char *model_dir, int layer_index,
                                           clmla_layer **layer);

/* The config.json model_type values clmla runs, as one line of text (docs/MODELS.md). */
const char *clmla_model_types(void);

/* Which attention of a model folder to load. Zero-initialised: layer 0, its only attention. */
typedef struct clmla_model_options {
    int layer;    /* decoder layer, numbered as the model numbers them (--layer) */
    int sublayer; /* the attention inside it: 0, or 1 for longcat_flash's self_attn.1 (--sublayer) */
    /* the weights as stored (F32, F16, BF16, F8_E4M3 with its scales: 0), or
       converted at load (--weights-dtype) */
    clmla_weights_dtype weights_dtype;
    /* load the layer as tensor-parallel shard tp_rank of tp_size (see
       clmla_layer_config.tp_rank; only the shard's slices are kept). tp_size 0 or 1: the whole layer. */
    int tp_rank;
    int tp_size;
    /* a sparse-attention model (deepseek_v32, glm_moe_dsa) without its indexer: every
       query attends to all its keys at any length (for comparison with the sparse result; --dense) */
    int dense;
} clmla_model_options;

/* clmla_layer_create_from_model with options. A layer that is not MLA (kimi_linear's linear
   attention layers) fails with CLMLA_ERROR_INVALID_CONFIG naming the layers that are. */
clmla_status clmla_layer_create_from_model_opts(clmla_context *ctx, const char *model_dir,
                                                const clmla_model_options *options, clmla_layer **layer);

/* ---- a model's attention layers over one cache ---------------------------------------------- */

/* A model's MLA attentions (all of a folder's, or those of a range of decoder layers) over one
   cache that the model makes and owns, run one step at a time in the model's order. The model
   carries what crosses layers: which attention selects keys for which (glm_moe_dsa's "shared"
   layers), and which cache layer each attention writes. */
typedef struct clmla_model clmla_model;

typedef struct clmla_model_spec {
    /* the decoder layers held, numbered as the model numbers them: [first_layer, first_layer +
       num_layers), num_layers 0 = to the last. Only their MLA attentions are held (kimi_linear's
       linear attention layers are skipped), both of longcat_flash's per layer. */
    int first_layer;
    int num_layers;
    clmla_weights_dtype weights_dtype; /* as clmla_model_options */
    int tp_rank, tp_size;              /* as clmla_model_options */
    int dense;                         /* as clmla_model_options: no indexers, every layer dense */
    /* the cache: its dtype, tokens per block (0 = 64) and blocks (each block spans every layer).
       Index keys (for the layers with an indexer only) are float32 beside a float32 cache,
       DeepSeek's fp8 beside an fp8 one where index_head_dim is a power of two, else bf16. */
    clmla_cache_dtype cache_dtype;
    int block_tokens;
    int num_blocks;
} clmla_model_spec;

/* How an attention of a model chooses its keys. */
typedef enum clmla_attention_kind {
    CLMLA_ATTENTION_DENSE = 0,   /* every query attends to all its keys */
    CLMLA_ATTENTION_INDEXED = 1, /* its indexer selects index_topk keys per query (DeepSeek-V3.2, GLM-5) */
    CLMLA_ATTENTION_SHARED = 2   /* it attends to the selection of attention `source` in the same step */
} clmla_attention_kind;

typedef struct clmla_model_attention {
    int layer;       /* decoder layer, as the model numbers them */
    int sublayer;    /* 0, or 1 for longcat_flash's self_attn.1 */
    int cache_layer; /* the layer of the model's cache it writes and reads */
    clmla_attention_kind kind;
    int source;      /* SHARED: the attention (index in this model) whose selection it takes; else -1 */
} clmla_model_attention;

/* Loads the attentions of spec's layers (clmla_layer_create_from_model_opts for each) and makes
   their cache. A range that starts on a shared layer whose full layer lies before it is refused,
   naming both layers; so is a range holding no MLA attention. On failure nothing is kept. */
clmla_status clmla_model_create(clmla_context *ctx, const char *model_dir, const clmla_model_spec *spec,
                                clmla_model **model);
/* A model of layers the caller made (clmla_layer_create, clmla_layer_create_from_model_opts), in
   the order a step runs them: attention i is layers[i] in cache layer i (its `layer` is i). A
   layer with an indexer is INDEXED; one with index_shared takes the selection of the nearest one
   before it that has an indexer (refused when there is none); the others are DENSE. Only the
   cache fields of spec are read. The layers must share kv_lora_rank and qk_rope_head_dim (and,
   those with an indexer, index_head_dim). The layers stay the caller's: destroy them after the
   model. */
clmla_status clmla_model_create_from_layers(clmla_context *ctx, clmla_layer **layers, int count,
                                            const clmla_model_spec *spec, clmla_model **model);
/* Destroys the cache and the layers the model loaded (not a caller's layers). */
void clmla_model_destroy(clmla_model *model);
/* The number of attentions held, in the order a step runs them. */
clmla_status clmla_model_num_attentions(const clmla_model *model, int *count);
/* Attention `index` (0 .. count-1): its layer, cache layer, kind and source. */
clmla_status clmla_model_attention_info(const clmla_model *model, int index, clmla_model_attention *info);
/* The model's cache (owned by the model: add and free sequences on it; do not destroy it). */
clmla_status clmla_model_cache(const clmla_model *model, clmla_cache **cache);
/* The layer of attention `index` (owned by the model). */
clmla_status clmla_model_layer(const clmla_model *model, int index, clmla_layer **layer);

/* Attention `index` of a step: clmla_layer_forward of its layer in its cache layer. A shared
   attention runs only after its source ran the same step (the same entries from the same
   positions), else it is refused naming both attentions, with the cache unchanged. */
clmla_status clmla_model_forward(clmla_model *model, int index, const clmla_batch_entry *entries, int num_entries,
                                 clmla_attention_path path, const float *x, float *out);
/* The same on device buffers, as clmla_layer_forward_cl. */
clmla_status clmla_model_forward_cl(clmla_model *model, int index, const clmla_batch_entry *entries, int num_entries,
                                    clmla_attention_path path, cl_mem x, size_t x_offset, cl_mem out, size_t out_offset,
                                    cl_event *event);

/* Called after attention `index` of a step with its output [T, D]: writes the next attention's
   input [T, D] into x (the engine's residual, norms and MLP or MoE between them). A non-zero
   return stops the step. */
typedef int (*clmla_model_between_fn)(void *user, int index, const float *attention_out, float *x);

/* A whole step: x [T, D] is the first attention's input; attention i runs on x, then (for every i
   but the last) between(user, i, out, x) makes the next input in x. out [T, D] ends holding the
   last attention's output. A failing attention or a non-zero return from between
   (CLMLA_ERROR_INVALID_ARGUMENT, naming the attention) stops the step: the attentions before it
   keep their tokens in the cache, the others have none of the step's. */
clmla_status clmla_model_run(clmla_model *model, const clmla_batch_entry *entries, int num_entries,
                             clmla_attention_path path, float *x, float *out, clmla_model_between_fn between,
                             void *user);

/* Reads a .npy file of float32, float16 or float64 values (little-endian, C order, 1-D or 2-D) as
   float32 (float64 rounded to nearest):
   *data [shape[0] * shape[1]] (shape[1] = 0 for 1-D), allocated by the library, freed with
   clmla_free(). Anything else (big-endian, Fortran order, another dtype or rank, truncated data,
   a malformed header) is refused with CLMLA_ERROR_INVALID_FILE or CLMLA_ERROR_UNSUPPORTED and
   the reason in clmla_last_error(NULL). */
clmla_status clmla_npy_read_f32(const char *path, float **data, int64_t shape[2], int *ndim);

/* Writes a float32 array of ndim 1 or 2 as a .npy file (format 1.0, '<f4', C order). */
clmla_status clmla_npy_write_f32(const char *path, const float *data, int ndim, const int64_t shape[2]);

#ifdef __cplusplus
}
#endif
#endif /* CLMLA_H */
