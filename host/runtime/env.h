/* The environment variables clmla reads, all in one place (documented in README.md). */
#ifndef CLMLA_ENV_H
#define CLMLA_ENV_H
#include "clmla.h"

#define CLMLA_PATH_SIZE 4096

typedef struct clmla_env {
    char device[256];               /* CLMLA_DEVICE: the default device spec ("" = unset) */
    char kernel_dir[CLMLA_PATH_SIZE]; /* CLMLA_KERNEL_DIR: load cl/NAME.cl files from here ("" = embedded) */
    char cache_dir[CLMLA_PATH_SIZE];  /* program binary cache; "" when disabled */
    char clblast_tuning[CLMLA_PATH_SIZE]; /* CLMLA_CLBLAST_TUNING: a tuning file, "off", or "" (unset) */
    char attention_kernels[32];     /* CLMLA_ATTENTION_KERNELS: "auto", "rows", "group" or "" (unset) */
    char product_kernels[32];       /* CLMLA_PRODUCT_KERNELS: the same values */
    char trace[CLMLA_PATH_SIZE];    /* CLMLA_TRACE: a file to record the queue's commands in (trace.h), "" = off */
    char kernel_tuning[CLMLA_PATH_SIZE]; /* CLMLA_KERNEL_TUNING: a file, "auto", "off" or "" (unset); read
                                            once per process (kernel_tuning.c), not a context option */
    char program_binaries[16];      /* CLMLA_PROGRAM_BINARIES: "auto", "on", "off" or "" (unset) */
    char log[16];                   /* CLMLA_LOG: "off", "warning", "info" or "" (unset): messages to stderr
                                       for contexts whose options give no log callback */
} clmla_env;

/* CLMLA_CACHE_DIR, else $XDG_CACHE_HOME/clmla, else $HOME/.cache/clmla; "off" disables. */
void clmla_env_read(clmla_env *env);

/* The environment, then each field the options set (clmla_context_options) over it; the device
   spec is the caller's to match (clmla_spec_match), with env->device as its fallback. */
void clmla_env_with_options(clmla_env *env, const clmla_context_options *options);
#endif
