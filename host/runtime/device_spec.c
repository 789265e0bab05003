#include "device_spec.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t clmla_spec_default_index(const clmla_device_info *devs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (devs[i].kind == CLMLA_DEVICE_KIND_GPU)
            return i;
    return 0;
}

/* Parses a whole string of decimal digits (at most 9, so no overflow). */
static int parse_index(const char *s, size_t len, long *out)
{
    if (len == 0 || len > 9)
        return 0;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i]))
            return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 1;
}

static int contains_nocase(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (const char *h = hay; *h; h++) {
        size_t i = 0;
        while (i < n && h[i] && tolower((unsigned char)h[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return 1;
    }
    return n == 0;
}

static clmla_status not_found(char *why, size_t size, const clmla_device_info *devs, size_t n,
                              const char *fmt, const char *spec)
{
    snprintf(why, size, fmt, spec);
    size_t used = strlen(why);
    snprintf(why + used, size - used, "; the devices are (index  P:D  type  vendor / name (platform)):");
    clmla_describe_device_list(devs, n, why, size);
    return CLMLA_ERROR_DEVICE_NOT_FOUND;
}

clmla_status clmla_spec_match(const char *spec, const char *env_spec, const clmla_device_info *devs,
                              size_t n, size_t *index, char *why, size_t why_size)
{
    why[0] = '\0';
    if (n == 0) {
        snprintf(why, why_size, "no OpenCL device is available");
        return CLMLA_ERROR_NO_DEVICE;
    }
    const char *origin = "device spec";
    if (!spec) {
        if (env_spec && *env_spec) {
            spec = env_spec;
            origin = "CLMLA_DEVICE";
        } else {
            *index = clmla_spec_default_index(devs, n);
            return CLMLA_SUCCESS;
        }
    }

    /* Trim surrounding blanks; what is left must not be empty. */
    while (isspace((unsigned char)*spec))
        spec++;
    size_t len = strlen(spec);
    while (len > 0 && isspace((unsigned char)spec[len - 1]))
        len--;
    char text[256];
    char msg[320];
    if (len == 0) {
        snprintf(msg, sizeof(msg), "empty %s%%s", origin);
        return not_found(why, why_size, devs, n, msg, "");
    }
    if (len >= sizeof(text)) {
        snprintf(msg, sizeof(msg), "%s is too long (%zu characters)%%s", origin, len);
        return not_found(why, why_size, devs, n, msg, "");
    }
    memcpy(text, spec, len);
    text[len] = '\0';

    /* Numeric forms: "N" and "P:D". Anything that starts like a number must be one of them. */
    char c0 = text[0];
    if (isdigit((unsigned char)c0) || c0 == '-' || c0 == '+' || c0 == ':') {
        const char *colon = strchr(text, ':');
        long a = 0, b = 0;
        if (!colon) {
            if (!parse_index(text, len, &a)) {
                snprintf(msg, sizeof(msg), "malformed %s '%%s': expected N, P:D, gpu, cpu, accelerator or a name", origin);
                return not_found(why, why_size, devs, n, msg, text);
            }
            if ((size_t)a >= n) {
                snprintf(msg, sizeof(msg), "%s '%%s': there is no device with that index", origin);
                return not_found(why, why_size, devs, n, msg, text);
            }
            *index = (size_t)a;
            return CLMLA_SUCCESS;
        }
        if (!parse_index(text, (size_t)(colon - text), &a) || !parse_index(colon + 1, strlen(colon + 1), &b)) {
            snprintf(msg, sizeof(msg), "malformed %s '%%s': P:D needs two decimal indices", origin);
            return not_found(why, why_size, devs, n, msg, text);
        }
        for (size_t i = 0; i < n; i++)
            if (devs[i].platform_index == a && devs[i].device_index == b) {
                *index = i;
                return CLMLA_SUCCESS;
            }
        snprintf(msg, sizeof(msg), "%s '%%s': there is no such platform:device", origin);
        return not_found(why, why_size, devs, n, msg, text);
    }

    static const struct {
        const char *word;
        clmla_device_kind kind;
    } kinds[] = {{"gpu", CLMLA_DEVICE_KIND_GPU}, {"cpu", CLMLA_DEVICE_KIND_CPU}, {"accelerator", CLMLA_DEVICE_KIND_ACCELERATOR}};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        if (strlen(kinds[k].word) == len && contains_nocase(text, kinds[k].word)) {
            for (size_t i = 0; i < n; i++)
                if (devs[i].kind == kinds[k].kind) {
                    *index = i;
                    return CLMLA_SUCCESS;
                }
            snprintf(msg, sizeof(msg), "%s '%%s': there is no device of that type", origin);
            return not_found(why, why_size, devs, n, msg, text);
        }
    }

    for (size_t i = 0; i < n; i++)
        if (contains_nocase(devs[i].name, text) || contains_nocase(devs[i].vendor, text) ||
            contains_nocase(devs[i].platform_name, text)) {
            *index = i;
            return CLMLA_SUCCESS;
        }
    snprintf(msg, sizeof(msg), "%s '%%s' matches no platform, vendor or device name", origin);
    return not_found(why, why_size, devs, n, msg, text);
}
