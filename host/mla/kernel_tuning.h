/* The parameters of clmla's own kernels (include/clmla_tuning.h, "Latent attention kernel tuning"
 * and "Product kernel tuning"): for each kind of kernel, entries of the user's kernel-tuning file (one
 * file for every kind, read once per process), a table built into the library, and defaults, in
 * that precedence; an entry is keyed by device (vendor and name, optionally platform and driver)
 * and a shape class (attn_latent: the head count; products: the class of K), "any" class entries
 * standing behind exact ones. */
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
#endif
