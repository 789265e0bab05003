/* The device-spec grammar, separate from OpenCL so that it can be tested and fuzzed on any list
   of devices. */
#ifndef CLMLA_DEVICE_SPEC_H
#define CLMLA_DEVICE_SPEC_H
#include "clmla.h"

/* Index of the device the default spec picks: the first GPU, else device 0. n > 0. */
size_t clmla_spec_default_index(const clmla_device_info *devs, size_t n);

/* Resolves spec (NULL = env_spec if that is non-empty, else the default) against devs[0..n).
   On failure returns CLMLA_ERROR_DEVICE_NOT_FOUND and writes into why a message that names the
   problem and lists every device. */
clmla_status clmla_spec_match(const char *spec, const char *env_spec, const clmla_device_info *devs,
                              size_t n, size_t *index, char *why, size_t why_size);

/* Appends one line per device to buf (which holds a NUL-terminated prefix). */
void clmla_describe_device_list(const clmla_device_info *devs, size_t n, char *buf, size_t size);
#endif
