/* CLBlast Xgemm tuning entries (include/clmla_tuning.h, "CLBlast tuning"); clmla's own kernels'
   parameters: kernel_tuning.h. */
#ifndef CLMLA_XGEMM_TUNING_H
#define CLMLA_XGEMM_TUNING_H
#include "clmla_tuning.h"
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

/* The built-in entries (host/mla/tuning_data/clblast.json, parsed once per process as a tuning
   file's entries are): their count, *entries pointing at them (process lifetime). */
size_t clmla_xgemm_tuning_builtin(const clmla_xgemm_tuning **entries);

/* Tuning files (CLBlast's and clmla's own kernels', kernel_tuning.c) are small; a larger one is
   not one. */
#define CLMLA_TUNING_FILE_MAX_BYTES ((size_t)16 << 20)

/* Writes into buf the path of a tuning file for entry point fn: given(env) where not empty, ""
   where that is NULL (no file), else `file` in the cache folder where there is one, else "". Returns
   CLMLA_SUCCESS, or CLMLA_ERROR_INVALID_ARGUMENT for no buffer, or (buf holding "") when the path
   does not fit, naming it "the <what> path". */
clmla_status clmla_tuning_file_path(char *buf, size_t size, const char *fn, const char *(*given)(const clmla_env *env),
                                    const char *file, const char *what);

/* Puts `entry` into the JSON array `list` in place of the first item for which same(item, key)
   holds, else at its end, then writes the list (then deleted) as the file at path, replacing it
   whole (clmla_write_file_replacing): a failure leaves the old file as it was. */
struct cJSON;
clmla_status clmla_tuning_save_json(const char *path, struct cJSON *list, struct cJSON *entry,
                                    int (*same)(const struct cJSON *item, const void *key), const void *key);
#endif
