/* libFuzzer: the device-spec grammar (clmla_spec_match, host/runtime/device_spec.h) on device lists made up
 * from the input, checked against the rules of include/clmla.h and the README:
 *   - the status is SUCCESS, DEVICE_NOT_FOUND, or NO_DEVICE exactly when the list is empty;
 *   - no spec (NULL, and no CLMLA_DEVICE) picks the first GPU, else device 0;
 *   - "N" (decimal, after trimming blanks) picks device N, "P:D" the first device with that
 *     platform and device index, "gpu" / "cpu" / "accelerator" (any case) the first of that type,
 *     other text the first device whose name, vendor or platform contains it (any case); anything
 *     else that starts like a number, or is empty, or longer than 255 characters, is not found;
 *   - a failure leaves a NUL-terminated message in the caller's buffer of whatever size (here
 *     exactly that size, so ASan sees any overflow) that, when it has room, lists every device.
 *
 * Input: fields separated by '\n'.
 *   field 0   control: [0] devices (byte % 9), [1] 'n' = spec NULL, [2] 'n' = CLMLA_DEVICE NULL,
 *             'e' = empty, [3] message buffer size (byte % 4: 1, 24, 256, 16384 bytes)
 *   1..n      one device each: [0] kind (% 4), [1] platform index (% 4), [2] device index (% 4),
 *             then "name|vendor|platform" (each cut to 127 bytes)
 *   n+1       the spec             n+2   the CLMLA_DEVICE value
 * Seeds: fuzz/corpus/device_spec/. */
#include "device_spec.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_device_spec: %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

typedef struct reader {
    const uint8_t *data;
    size_t size, at;
    int done;
} reader;

/* The next '\n'-separated field of the input as [*field, *field + *len); 0 past the last one. */
static int next_field(reader *r, const uint8_t **field, size_t *len)
{
    *field = r->data + r->at;
    *len = 0;
    if (r->done)
        return 0;
    const uint8_t *nl = memchr(r->data + r->at, '\n', r->size - r->at);
    *len = nl ? (size_t)(nl - (r->data + r->at)) : r->size - r->at;
    r->at += *len;
    if (nl)
        r->at++;
    else
        r->done = 1;
    return 1;
}

/* Copies at most 127 bytes of [s, s+len) up to `stop` into a NUL-terminated 128-byte field. */
static size_t copy_part(char out[128], const uint8_t *s, size_t len, uint8_t stop)
{
    size_t i = 0;
    while (i < len && s[i] != stop) {
        if (i < 127)
            out[i] = (char)s[i];
        i++;
    }
    out[i < 127 ? i : 127] = '\0';
    return i < len ? i + 1 : i;
}

/* malloc'd C string of a field (it ends at the first NUL byte, as a caller's string would). */
static char *field_string(const uint8_t *s, size_t len)
{
    char *str = malloc(len + 1);
    if (!str)
        abort();
    if (len)
        memcpy(str, s, len);
    str[len] = '\0';
    return str;
}

/* Whether needle occurs in hay, ASCII case ignored (an empty needle always does). */
static int contains_nocase(const char *hay, const char *needle)
{
    const size_t n = strlen(needle), len = strlen(hay);
    for (size_t i = 0; i + n <= len; i++)
        if (strncasecmp(hay + i, needle, n) == 0)
            return 1;
    return 0;
}

static int all_digits(const char *s, size_t len)
{
    if (len == 0 || len > 9)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!isdigit((unsigned char)s[i]))
            return 0;
    return 1;
}

/* What the spec must give: 1 and the index, or 0 for not found. */
static int expected(const char *spec, const clmla_device_info *devs, size_t n, size_t *index)
{
    while (isspace((unsigned char)*spec))
        spec++;
    size_t len = strlen(spec);
    while (len > 0 && isspace((unsigned char)spec[len - 1]))
        len--;
    if (len == 0 || len > 255)
        return 0;
    char text[256];
    memcpy(text, spec, len);
    text[len] = '\0';
    const char c0 = text[0];
    if (isdigit((unsigned char)c0) || c0 == '-' || c0 == '+' || c0 == ':') {
        const char *colon = strchr(text, ':');
        if (!colon) {
            if (!all_digits(text, len) || strtol(text, NULL, 10) >= (long)n)
                return 0;
            *index = (size_t)strtol(text, NULL, 10);
            return 1;
        }
        const size_t plen = (size_t)(colon - text);
        if (!all_digits(text, plen) || !all_digits(colon + 1, strlen(colon + 1)))
            return 0;
        const long p = strtol(text, NULL, 10), d = strtol(colon + 1, NULL, 10);
        for (size_t i = 0; i < n; i++)
            if (devs[i].platform_index == p && devs[i].device_index == d) {
                *index = i;
                return 1;
            }
        return 0;
    }
    static const struct {
        const char *word;
        clmla_device_kind kind;
    } kinds[] = {{"gpu", CLMLA_DEVICE_KIND_GPU}, {"cpu", CLMLA_DEVICE_KIND_CPU}, {"accelerator", CLMLA_DEVICE_KIND_ACCELERATOR}};
    for (size_t k = 0; k < 3; k++)
        if (strlen(kinds[k].word) == len && contains_nocase(text, kinds[k].word)) {
            for (size_t i = 0; i < n; i++)
                if (devs[i].kind == kinds[k].kind) {
                    *index = i;
                    return 1;
                }
            return 0;
        }
    for (size_t i = 0; i < n; i++)
        if (contains_nocase(devs[i].name, text) || contains_nocase(devs[i].vendor, text) ||
            contains_nocase(devs[i].platform_name, text)) {
            *index = i;
            return 1;
        }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t why_sizes[4] = {1, 24, 256, 16384};
    reader r = {data, size, 0, 0};
    const uint8_t *f = NULL;
    size_t len = 0;
    uint8_t control[4] = {0, 0, 0, 0};
    if (next_field(&r, &f, &len) && len)
        memcpy(control, f, len < 4 ? len : 4);
    const size_t n = control[0] % 9;
    const int spec_null = control[1] == 'n', env_null = control[2] == 'n', env_empty = control[2] == 'e';
    const size_t why_size = why_sizes[control[3] % 4];

    /* Exactly n devices, so that reading past the list is an ASan report. */
    clmla_device_info *devs = calloc(n ? n : 1, sizeof(*devs));
    if (!devs)
        abort();
    for (size_t i = 0; i < n; i++) {
        devs[i].index = (int)i;
        next_field(&r, &f, &len);
        devs[i].kind = (clmla_device_kind)(len > 0 ? f[0] % 4 : 0);
        devs[i].platform_index = len > 1 ? f[1] % 4 : 0;
        devs[i].device_index = len > 2 ? f[2] % 4 : 0;
        const uint8_t *s = len > 3 ? f + 3 : f;
        size_t rest = len > 3 ? len - 3 : 0, used;
        used = copy_part(devs[i].name, s, rest, '|');
        s += used, rest -= used;
        used = copy_part(devs[i].vendor, s, rest, '|');
        s += used, rest -= used;
        copy_part(devs[i].platform_name, s, rest, '|');
    }
    next_field(&r, &f, &len);
    char *spec = field_string(f, len);
    next_field(&r, &f, &len);
    char *env = field_string(f, len);
    if (env_empty)
        env[0] = '\0';

    char *why = malloc(why_size);
    if (!why)
        abort();
    size_t index = (size_t)-1;
    const char *spec_arg = spec_null ? NULL : spec, *env_arg = env_null ? NULL : env;
    const clmla_status st = clmla_spec_match(spec_arg, env_arg, devs, n, &index, why, why_size);

    REQUIRE(st == CLMLA_SUCCESS || st == CLMLA_ERROR_DEVICE_NOT_FOUND || st == CLMLA_ERROR_NO_DEVICE);
    REQUIRE((st == CLMLA_ERROR_NO_DEVICE) == (n == 0));
    if (st == CLMLA_SUCCESS) {
        REQUIRE(index < n);
    } else {
        REQUIRE(memchr(why, '\0', why_size) != NULL);
        REQUIRE(why_size == 1 || why[0] != '\0');
    }
    if (n > 0) {
        size_t want = 0;
        const char *effective = spec_arg ? spec_arg : (env_arg && env_arg[0] ? env_arg : NULL);
        if (!effective) {
            REQUIRE(st == CLMLA_SUCCESS && index == clmla_spec_default_index(devs, n));
            size_t first_gpu = 0;
            while (first_gpu < n && devs[first_gpu].kind != CLMLA_DEVICE_KIND_GPU)
                first_gpu++;
            REQUIRE(index == (first_gpu < n ? first_gpu : 0));
        } else if (expected(effective, devs, n, &want)) {
            REQUIRE(st == CLMLA_SUCCESS && index == want);
        } else {
            REQUIRE(st == CLMLA_ERROR_DEVICE_NOT_FOUND);
            /* With room for it, the message lists every device as "  i  P:D". */
            if (why_size == 16384)
                for (size_t i = 0; i < n; i++) {
                    char line[64];
                    snprintf(line, sizeof(line), "\n  %zu  %d:%d ", i, devs[i].platform_index, devs[i].device_index);
                    REQUIRE(strstr(why, line) != NULL);
                }
        }
        /* The same call again gives the same answer: no hidden state. */
        size_t again = (size_t)-1;
        const clmla_status st2 = clmla_spec_match(spec_arg, env_arg, devs, n, &again, why, why_size);
        REQUIRE(st2 == st && (st != CLMLA_SUCCESS || again == index));
    }
    free(why);
    free(spec);
    free(env);
    free(devs);
    return 0;
}
