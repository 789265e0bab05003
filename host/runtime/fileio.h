/* Reading a file whole: JSON (model folders, tuning files), .npy arrays, cached program binaries. */
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

/* "NAME: " and the formatted reason into err (when it has room), for the parsers' messages about
   a file; returns status, so that `return clmla_file_error(...)` reads as one step. */
clmla_status clmla_file_error(char *err, size_t errsize, clmla_status status, const char *name, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
#endif
