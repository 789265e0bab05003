/* The parameters of clmla's own kernels (include/clmla_tuning.h, "Latent attention kernel tuning"
 * and "Product kernel tuning"): for each kind of kernel, entries of the user's kernel-tuning file (one
 * file for every kind, read once per process), a table built into the library, and defaults, in
 * that precedence; an entry is keyed by device (vendor and name, optionally platform and driver)
 * and a shape class (attn_latent: the head count; products: the class of K), "any" class entries
 * standing behind exact ones. Also the path planner's rates (plan_rates.c): built-in entries and
 * defaults only. */
#ifndef CLMLA_KERNEL_TUNING_H
#define CLMLA_KERNEL_TUNING_H
#include "clmla_tuning.h"
#include "internal.h"

typedef struct kernel_entry kernel_entry;
typedef struct kernel_entry_list {
    kernel_entry *entries; /* the legal entries of one kind in a file, in its order */
    size_t count;
} kernel_entry_list;
typedef kernel_entry_list latent_entry_list;
typedef kernel_entry_list product_entry_list;

/* ---- latent attention ----------------------------------------------------------------------- */

/* A kernel-tuning file's text: -1 not a JSON array (nothing kept), else how many of its
   attn_latent entries (an entry without "kernel" is one, and so is one naming no known kernel)
   were refused (why: the first refusal, naming the value); the legal ones are in *out either way
   (free it with clmla_latent_tuning_list_free). */
int clmla_latent_tuning_parse(const char *text, latent_entry_list *out, char *why, size_t why_size);
void clmla_latent_tuning_list_free(latent_entry_list *list);

/* Precedence over `user` (may be NULL; user_source names it), the built-in table and the
   defaults: 2 user entry, 1 built-in, 0 defaults. */
int clmla_latent_tuning_resolve(const latent_entry_list *user, const char *user_source, const clmla_device_info *device,
                                int num_heads, clmla_latent_tuning *tuning, const char **source);

/* What was wrong with the process's user file ("" when nothing), read once per process. */
const char *clmla_latent_tuning_problem(void);

/* The parameters attention.c runs on ctx at num_heads: forced ones
   (clmla_context_set_latent_tuning), else clmla_latent_tuning_lookup's. No allocation, no I/O after
   the process's first call: cheap enough for every launch. */
void clmla_latent_tuning_for(const clmla_context *ctx, int num_heads, clmla_latent_tuning *tuning);

/* ---- products ------------------------------------------------------------------------------- */

/* The shape class of a product of K = k: 0 none ("any" entries only: k = 0), 1 "small"
   (k <= CLMLA_PRODUCT_SMALL_K), 2 "large". */
#define CLMLA_PRODUCT_SMALL_K 4096
int clmla_product_k_class(size_t k);

/* A kernel-tuning file's text: -1 not a JSON array, else how many "products" entries were refused
   (why: the first, naming the value; entries of other kernels are left to their own parser); the
   legal ones are in *out either way (free it with clmla_product_tuning_list_free). */
int clmla_product_tuning_parse(const char *text, product_entry_list *out, char *why, size_t why_size);
void clmla_product_tuning_list_free(product_entry_list *list);

/* Precedence over `user` (may be NULL), the built-in table and the defaults for products of K = k:
   2 user entry, 1 built-in, 0 defaults. */
int clmla_product_tuning_resolve(const product_entry_list *user, const char *user_source,
                                 const clmla_device_info *device, size_t k, clmla_product_tuning *tuning,
                                 const char **source);

/* Why a set of product parameters is refused (the rule it breaks), or NULL when it is legal. */
const char *clmla_product_tuning_problem(const clmla_product_tuning *t);

/* The parameters gemm.c runs on ctx for products of K = k: forced ones
   (clmla_context_set_product_tuning), else the lookup's. No allocation, no I/O after the
   process's first call. */
void clmla_product_tuning_for(const clmla_context *ctx, size_t k, clmla_product_tuning *tuning);

/* ---- the path planner's rates (plan_rates.c) ---------------------------------------------------- */

/* What AUTO weighs its two paths by (layer_plan.c; docs/DESIGN.md, "Which path"): the speed each
   path's kernels reach, as fractions of the FLOP rate of the decompressed path's up-projection.
   A CPU device reads the cpu_ rates, any other device the gpu_ ones. */
typedef struct clmla_plan_rates {
    int min_tokens;                      /* entries of fewer tokens stay absorbed whatever the prefix */
    double cpu_absorbed_pair_rate;       /* the absorbed path's (query, key) pairs under attn_latent_rows */
    double cpu_lanes_absorbed_pair_rate; /* the same under attn_latent_lanes (the latent tuning's rows_lanes) */
    double cpu_decompressed_pair_rate;   /* the decompressed path's pairs */
    double gpu_absorbed_pair_rate;       /* the absorbed path's pairs */
    double gpu_tiled_pair_rate;          /* the decompressed path's pairs under attn_prefill_tiled */
    double gpu_tiled_key_rate;           /* its keys there (each costing the up-projection's FLOPs) */
    double gpu_tiled_chunk_keys;         /* the keys each of an entry's own tokens counts as there */
    double gpu_decompressed_key_rate;    /* the decompressed path's keys, cached or new, under attn_prefill */
} clmla_plan_rates;

typedef struct plan_entry plan_entry;
typedef struct plan_entry_list {
    plan_entry *entries; /* the legal entries of a file, in its order */
    size_t count;
} plan_entry_list;

/* The rates where no entry applies: every rate 1 and no chunk keys (the FLOP count alone),
   min_tokens 16. */
void clmla_plan_rates_defaults(clmla_plan_rates *rates);

/* A file of "plan" entries (host/mla/tuning_data/plan.json): -1 not a JSON array (nothing kept),
   else how many entries were refused (why: the first refusal, naming the value); the legal ones are
   in *out either way (free it with clmla_plan_rates_list_free). */
int clmla_plan_rates_parse(const char *text, plan_entry_list *out, char *why, size_t why_size);
void clmla_plan_rates_list_free(plan_entry_list *list);

/* The rates for a device over `list` (NULL: the built-in entries, parsed once per process): the
   defaults, then the first entry for the device's type ("cpu", or "gpu" for any other), then the
   first entry for the device itself (vendor and name, platform and driver where it names them),
   each setting the rates it lists. Returns how many entries applied (0 to 2). */
int clmla_plan_rates_resolve(const plan_entry_list *list, const clmla_device_info *device, clmla_plan_rates *rates);

/* The rates for ctx's device from the built-in entries. No allocation, no I/O after the process's
   first call. */
void clmla_plan_rates_for(const clmla_context *ctx, clmla_plan_rates *rates);
#endif
