/* libFuzzer: a .npy image through clmla_npy_parse; on success the data must fit the buffer exactly
   and convert. */
#include "npy.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    clmla_npy_info info;
    char err[1024];
    if (clmla_npy_parse(data, size, "fuzz.npy", &info, err, sizeof(err)) != CLMLA_SUCCESS)
        return 0;
    if (info.data_offset > size || info.numel * (uint64_t)info.element_bytes != size - info.data_offset)
        abort();
    float *out = malloc((size_t)(info.numel ? info.numel : 1) * sizeof(float));
    if (out)
        clmla_npy_to_f32(data, &info, out);
    free(out);
    return 0;
}
