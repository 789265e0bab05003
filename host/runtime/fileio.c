/* Files whole (fileio.h). */
#include "fileio.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

clmla_status clmla_read_file(const char *path, size_t max_bytes, const char *what, char **text, size_t *length,
                             char *err, size_t errsize)
{
    *text = NULL;
    *length = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        const int why = errno;
        snprintf(err, errsize, "%s: cannot open: %s", path, strerror(why));
        errno = why; /* callers may tell a missing file from another failure */
        return CLMLA_ERROR_IO;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        snprintf(err, errsize, "%s: not a regular file", path);
        return CLMLA_ERROR_IO;
    }
    if ((uint64_t)sb.st_size > max_bytes) {
        fclose(f);
        snprintf(err, errsize, "%s: %lld bytes, more than the %zu %s may have", path, (long long)sb.st_size, max_bytes,
                 what);
        return CLMLA_ERROR_INVALID_FILE;
    }
    const size_t size = (size_t)sb.st_size;
    char *buf = malloc(size + 1);
    if (!buf) {
        fclose(f);
        snprintf(err, errsize, "%s: out of host memory", path);
        return CLMLA_ERROR_OUT_OF_HOST_MEMORY;
    }
    const size_t n = fread(buf, 1, size, f);
    const int failed = ferror(f) || n != size;
    fclose(f);
    if (failed) {
        free(buf);
        snprintf(err, errsize, "%s: read error", path);
        return CLMLA_ERROR_IO;
    }
    buf[n] = '\0';
    *text = buf;
    *length = n;
    return CLMLA_SUCCESS;
}

int clmla_path_absent(const char *path)
{
    struct stat sb;
    return stat(path, &sb) != 0 && errno == ENOENT;
}

static atomic_long sibling_count;

clmla_status clmla_write_file_replacing(const char *path, const void *data, size_t size, char *err, size_t errsize)
{
    char tmp[CLMLA_PATH_SIZE + 192];
    const int n = snprintf(tmp, sizeof(tmp), "%s.%ld.%ld.tmp", path, (long)getpid(), atomic_fetch_add(&sibling_count, 1));
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        snprintf(err, errsize, "cannot write %s: the path is too long", path);
        return CLMLA_ERROR_IO;
    }
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(data, 1, size, f) == size;
    int e = errno;
    if (f && fclose(f) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        e = errno;
    }
    if (!ok) {
        remove(tmp);
        snprintf(err, errsize, "cannot write %s: %s", path, strerror(e));
        return CLMLA_ERROR_IO;
    }
    return CLMLA_SUCCESS;
}

clmla_status clmla_file_error(char *err, size_t errsize, clmla_status status, const char *name, const char *fmt, ...)
{
    if (err && errsize) {
        int n = snprintf(err, errsize, "%s: ", name ? name : "(unnamed)");
        if (n >= 0 && (size_t)n < errsize) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + n, errsize - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return status;
}
