/* Files whole: reading JSON (model folders, tuning files), .npy arrays and cached program binaries;
   replacing tuning files and cached binaries. */
#ifndef CLMLA_FILEIO_H
#define CLMLA_FILEIO_H
#include "internal.h"

/* The whole of a regular file of at most max_bytes, malloc'ed in *text with a NUL after its
   *length bytes (so that text can be parsed as a string; binary contents are returned as they are).
   Failures return CLMLA_ERROR_IO (cannot open or read, not a regular file),
   CLMLA_ERROR_INVALID_FILE (larger than max_bytes; `what` names the kind of file in the message)
   or CLMLA_ERROR_OUT_OF_HOST_MEMORY, with "PATH: why" in err. */
clmla_status clmla_read_file(const char *path, size_t max_bytes, const char *what, char **text, size_t *length,
                             char *err, size_t errsize);

/* 1 when nothing is at path (stat fails with ENOENT): a tuning file that is not there holds no
   entry, where one that cannot be read is an error. */
int clmla_path_absent(const char *path);

/* Writes size bytes as the file at path through a sibling file renamed over it, so that a reader
   sees the old file or the new one, never a part, and a failure leaves the old one as it was (the
   sibling removed). The sibling's name is the process's own (pid and a counter), so that threads
   and processes writing the same path do not mix their bytes. CLMLA_ERROR_IO with "cannot write
   PATH: why" in err on failure. */
clmla_status clmla_write_file_replacing(const char *path, const void *data, size_t size, char *err, size_t errsize);

/* "NAME: " and the formatted reason into err (when it has room), for the parsers' messages about
   a file; returns status, so that `return clmla_file_error(...)` reads as one step. */
clmla_status clmla_file_error(char *err, size_t errsize, clmla_status status, const char *name, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
#endif
