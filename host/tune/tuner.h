/* The search behind clmla_tune_latent, clmla_tune_prefill and clmla_tune_products
   (include/clmla_tuning.h): each kernel's parameter space declared as data (a table of the fields
   it varies and their candidate values, in blocks that say in which mode they apply, plus
   constraint functions), and one search over any such space, which enumerates the candidates,
   measures each through its family's callback, refuses those whose output differs from the
   reference parameters' output (the defaults) beyond a tolerance or that fail, and keeps the
   fastest by the mean of its median times relative to the first candidate's (the parameters in
   force). tune_latent.c, tune_products.c and tune_prefill.c hold the tables and the callbacks. */
#ifndef CLMLA_TUNER_H
#define CLMLA_TUNER_H
#include "clmla_tuning.h"
#include "internal.h"

#include <limits.h>
#include <stddef.h>

/* Symbolic candidate values, resolved against the search's base (the parameters in force) and the
   defaults of the struct. */
#define TUNE_BASE INT_MIN          /* the base's value */
#define TUNE_TOGGLE (INT_MIN + 1)  /* 1 where the base's value is 0, else 0 */
#define TUNE_DEFAULT (INT_MIN + 2) /* the defaults' value */

#define TUNE_MAX_VALUES 8
#define TUNE_MAX_AXES 5
#define TUNE_MAX_CANDIDATES 128
#define TUNE_MAX_TIMES 16

/* One field of a tuning struct (an int) and the values a block gives it. */
typedef struct tune_axis {
    const char *name; /* the field's name, as in the tuning files */
    size_t offset;    /* offsetof in the tuning struct */
    int count;        /* values used */
    int values[TUNE_MAX_VALUES];
} tune_axis;

/* Which searches a block adds candidates to. */
enum {
    TUNE_QUICK = 1, /* the quick search */
    TUNE_FULL = 2,  /* the full search */
    TUNE_BOTH = 3,
    TUNE_QUICK_FILL = 6 /* the full search, and the quick one while it has fewer than 2 candidates */
};

/* What a constraint sees: the device and the shape of the search. */
typedef struct tune_env {
    int quick;
    int heads;
    int rows;                    /* the context runs the row-walking (CPU) kernels of this family */
    clmla_cache_dtype dtype;     /* the cache's (latent) */
    size_t max_work_group;       /* the device's largest work-group (0: unknown) */
    const clmla_device_info *info;
} tune_env;

/* A block of candidates: the base with its axes set to every combination of their values (zip 0),
   or to the i-th value of every axis together (zip 1). A candidate is added unless an earlier one
   holds the same values, the struct's own check refuses it, or `allowed` does. */
typedef struct tune_block {
    int modes;                                             /* TUNE_QUICK, TUNE_FULL, ... */
    int zip;
    int (*applies)(const tune_env *env);                   /* NULL: always */
    int (*allowed)(const void *candidate, const tune_env *env); /* NULL: every candidate */
    int naxes;
    tune_axis axes[TUNE_MAX_AXES];
} tune_block;

/* A kernel's parameter space. The candidates are, in order: the base; the base with the default
   fields (else the label fields) at their defaults (where add_defaults); then each block's that applies. */
typedef struct tune_space {
    const char *kernel;        /* the kernel (or stage) searched, for the progress reports */
    size_t size;               /* sizeof the tuning struct */
    int add_defaults;
    const tune_axis *fields;   /* the fields a candidate's label names (axes without values) */
    int nfields;
    const tune_block *blocks;
    int nblocks;
    /* the struct's own check (clmla_latent_tuning_check and the like): 0 when it refuses */
    int (*valid)(const void *candidate);
    /* the label of a candidate, where the fields' names and values do not say it: 1 when written */
    int (*label)(const void *candidate, char *buf, size_t size);
    /* the fields add_defaults sets to their defaults (NULL: the label fields) */
    const tune_axis *default_fields;
    int ndefault_fields;
} tune_space;

/* Writes into cands (room for `most`) the candidates of the space around base; returns how many. */
int clmla_tuner_enumerate(const tune_space *space, const tune_env *env, const void *base, const void *defaults, void *cands,
                   int most);

/* A candidate's label: "name=value" for each of the space's fields, separated by spaces. */
void clmla_tuner_label(const tune_space *space, const void *candidate, char *buf, size_t size);

/* The family's side of a search. */
typedef struct tune_family {
    const tune_space *space;
    void *state;             /* the callbacks' */
    size_t out_count;        /* floats of the output a candidate is checked on */
    int num_times;           /* timed cases a candidate gets (at most TUNE_MAX_TIMES) */
    const char **time_names;  /* their names for the reports (NULL: none) */
    double tolerance;        /* the largest difference from the reference output, relative to its largest value */
    int confirm_rounds;      /* alternations of the best and the first when the best is another */
    const char *detail;      /* what the search times, for the STAGE report */
    /* Forces `tuning` on the context, computes the checked output into out[out_count] and, where
       times is not NULL, times each case into times[num_times] (median microseconds). */
    clmla_status (*measure)(void *state, const void *tuning, float *out, double *times);
} tune_family;

/* The search's settings: the options' (validated), resolved. */
typedef struct tune_settings {
    int quick, reps, max_candidates;
    double max_seconds;
    clmla_tune_progress_fn progress;
    void *user;
} tune_settings;

/* What a search found. */
typedef struct tune_outcome {
    int best;           /* index into cands of the best */
    int candidates;     /* how many were enumerated (after max_candidates) */
    int timed;          /* how many passed the check and were timed */
    double ratio;       /* the best's times relative to the first's (confirmed) */
    double best_times[TUNE_MAX_TIMES], base_times[TUNE_MAX_TIMES];
} tune_outcome;

/* Measures the `reference` parameters' output, then every candidate (cands[0] the base, which must
   run), reporting each through the settings' progress callback; confirms a best other than the
   first in alternations with it. Returns CLMLA_SUCCESS with *outcome filled, or the status of the
   step that failed (the reference or the base failing, or out of memory), recorded on ctx. */
clmla_status clmla_tuner_search(clmla_context *ctx, const tune_family *family, const tune_settings *settings,
                         const void *reference, const void *cands, int n, tune_outcome *outcome);

/* The start of every search call: refuses a NULL ctx or result, copies options (NULL: zeroed)
   into *o, checks the options common to every call (naming the field of a bad one, as `call`:
   field ...) and resolves them into *s. */
clmla_status clmla_tuner_settings_resolve(clmla_context *ctx, const char *call, const void *result,
                                          const clmla_kernel_tune_options *options, clmla_kernel_tune_options *o,
                                          tune_settings *s);
/* The start of a latent or prefill search: clmla_tuner_settings_resolve, then the layer shape:
   *heads from o->heads (0: 16), 1..1024, or for a prefill search 16 (V2-Lite) or 128 (V3);
   *ctx_len from o->ctx_len (0: 4096), 64..65536. A bad one is refused, named as `call`:
   options->field. */
clmla_status clmla_tuner_latent_start(clmla_context *ctx, const char *call, const void *result,
                                      const clmla_kernel_tune_options *options, int prefill,
                                      clmla_kernel_tune_options *o, tune_settings *s, int *heads, int *ctx_len);

/* Reports a STAGE, or a BEST with its label and ratio, through the settings' callback. */
void clmla_tuner_report_stage(const tune_settings *s, const char *stage, const char *detail, int total);
void clmla_tuner_report_best(const tune_settings *s, const tune_space *space, const void *best, double ratio);

/* Seconds of a monotonic clock. */
double clmla_tuner_now(void);
/* The median of n values (reordered). */
double clmla_tuner_median(double *v, int n);
/* Uniform in [-1, 1), from a 32-bit LCG. */
float clmla_tuner_rand(uint32_t *state);

/* A DeepSeek-shaped layer with random float32 weights (drawn from *state) for the searches that
   time layer steps: the preset's configuration with the weights dtype asked for, the weights and
   their descriptors. */
typedef struct clmla_tuner_random_layer {
    clmla_layer_config cfg;
    clmla_layer_weights w;
    float *data[8];
} clmla_tuner_random_layer;

/* Returns CLMLA_SUCCESS, or CLMLA_ERROR_OUT_OF_HOST_MEMORY (recorded on ctx; nothing to free). */
clmla_status clmla_tuner_random_layer_make(clmla_context *ctx, clmla_tuner_random_layer *r, clmla_preset preset,
                                    clmla_weights_dtype want, uint64_t *state);
void clmla_tuner_random_layer_free(clmla_tuner_random_layer *r);
/* n values uniform in [bias - scale, bias + scale) from a 64-bit LCG; NULL when out of memory. */
float *clmla_tuner_random_floats(size_t n, float scale, float bias, uint64_t *state);

/* ---- the families ---------------------------------------------------------------------------- */
/* The latent parameters' spaces (tune_latent.c) and the prefill tiles' (tune_prefill.c): which the
   search uses for a context and cache dtype; the products' (tune_products.c) by stage. */
const tune_space *clmla_tuner_latent_space(int rows, clmla_cache_dtype dtype);
const tune_space *clmla_tuner_prefill_space(int rows);
enum { TUNE_PRODUCTS_SKINNY, TUNE_PRODUCTS_PACKED, TUNE_PRODUCTS_TILED, TUNE_PRODUCTS_NN };
const tune_space *clmla_tuner_products_space(int stage);
#endif
