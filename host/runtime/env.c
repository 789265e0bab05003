#include "env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void copy_var(char *dst, size_t size, const char *name)
{
    const char *v = getenv(name);
    snprintf(dst, size, "%s", v ? v : "");
}

void clmla_env_read(clmla_env *env)
{
    memset(env, 0, sizeof(*env));
    copy_var(env->device, sizeof(env->device), "CLMLA_DEVICE");
    copy_var(env->kernel_dir, sizeof(env->kernel_dir), "CLMLA_KERNEL_DIR");
    copy_var(env->clblast_tuning, sizeof(env->clblast_tuning), "CLMLA_CLBLAST_TUNING");
    copy_var(env->attention_kernels, sizeof(env->attention_kernels), "CLMLA_ATTENTION_KERNELS");
    copy_var(env->product_kernels, sizeof(env->product_kernels), "CLMLA_PRODUCT_KERNELS");
    copy_var(env->trace, sizeof(env->trace), "CLMLA_TRACE");
    copy_var(env->kernel_tuning, sizeof(env->kernel_tuning), "CLMLA_KERNEL_TUNING");
    copy_var(env->log, sizeof(env->log), "CLMLA_LOG");
    copy_var(env->program_binaries, sizeof(env->program_binaries), "CLMLA_PROGRAM_BINARIES");

    const char *cache = getenv("CLMLA_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (cache && *cache) {
        if (strcmp(cache, "off") != 0)
            snprintf(env->cache_dir, sizeof(env->cache_dir), "%s", cache);
    } else if (xdg && *xdg) {
        snprintf(env->cache_dir, sizeof(env->cache_dir), "%s/clmla", xdg);
    } else if (home && *home) {
        snprintf(env->cache_dir, sizeof(env->cache_dir), "%s/.cache/clmla", home);
    }
}

void clmla_env_with_options(clmla_env *env, const clmla_context_options *o)
{
    clmla_env_read(env);
    if (!o)
        return;
    if (o->kernel_dir)
        snprintf(env->kernel_dir, sizeof(env->kernel_dir), "%s", o->kernel_dir);
    if (o->cache_dir)
        snprintf(env->cache_dir, sizeof(env->cache_dir), "%s", strcmp(o->cache_dir, "off") == 0 ? "" : o->cache_dir);
    if (o->clblast_tuning)
        snprintf(env->clblast_tuning, sizeof(env->clblast_tuning), "%s", o->clblast_tuning);
    if (o->attention_kernels)
        snprintf(env->attention_kernels, sizeof(env->attention_kernels), "%s", o->attention_kernels);
    if (o->product_kernels)
        snprintf(env->product_kernels, sizeof(env->product_kernels), "%s", o->product_kernels);
    if (o->trace)
        snprintf(env->trace, sizeof(env->trace), "%s", o->trace);
    if (o->program_binaries)
        snprintf(env->program_binaries, sizeof(env->program_binaries), "%s", o->program_binaries);
}
