/* libFuzzer: a safetensors image through clmla_st_parse; on success every tensor must be found by
   name, lie inside the data, and convert (F8_E4M3 with its _scale_inv when present). */
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    clmla_st_file f;
    char err[1024];
    if (clmla_st_parse(data, size, "fuzz.safetensors", &f, err, sizeof(err)) != CLMLA_SUCCESS)
        return 0;
    for (size_t i = 0; i < f.num_tensors; i++) {
        const clmla_st_tensor *t = &f.tensors[i];
        if (clmla_st_find(&f, t->name) != t || t->begin > t->end || t->end > f.data_size)
            abort();
        const uint64_t n = clmla_st_numel(t);
        if (n > (1u << 20))
            continue;
        char scale_name[512];
        snprintf(scale_name, sizeof(scale_name), "%s_scale_inv", t->name);
        const clmla_st_tensor *scale = clmla_st_find(&f, scale_name);
        float *out = malloc((size_t)(n ? n : 1) * sizeof(float));
        if (out)
            clmla_st_to_f32(&f, t, &f, scale, out, err, sizeof(err));
        free(out);
    }
    clmla_st_close(&f);
    return 0;
}
