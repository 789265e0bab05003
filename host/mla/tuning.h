/* CLBlast Xgemm tuning entries (include/clmla.h, "CLBlast tuning"). */
#ifndef CLMLA_TUNING_H
#define CLMLA_TUNING_H
#include "internal.h"

/* At context creation: applies the entry for ctx's device from the tuning file, else from the
   built-in table, and records which in ctx. A malformed file (or one whose entry for the device
   CLBlast refuses) returns an error recorded for the thread (clmla_last_error(NULL)). */
clmla_status clmla_tuning_apply(clmla_context *ctx);

/* The entry of a tuning file's text (NUL-terminated) for the device's vendor and name: 1 found
   (*found, its values valid for the device), 0 no entry for it, -1 malformed (why says what: the
   first bad entry, whichever device it is for, or the matching entry's broken constraint). */
int clmla_tuning_parse(const char *text, const clmla_device_info *device, clmla_xgemm_tuning *found, char *why,
                       size_t why_size);

/* ---- latent attention kernel parameters (include/clmla.h, "Latent attention kernel tuning") ---- */
typedef struct latent_entry latent_entry;
typedef struct latent_entry_list {
    latent_entry *entries; /* the legal entries of a file, in its order */
    size_t count;
} latent_entry_list;

/* A kernel-tuning file's text: -1 not a JSON array (nothing kept), else how many entries were
   refused (why: the first refusal, naming the value); the legal ones are in *out either way
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

/* ---- product kernel parameters (include/clmla.h, "Product kernel tuning") ---------------------- */
typedef struct product_entry product_entry;
typedef struct product_entry_list {
    product_entry *entries; /* the legal "products" entries of a file, in its order */
    size_t count;
} product_entry_list;

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
