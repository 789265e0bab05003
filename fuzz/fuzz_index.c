/* libFuzzer: model.safetensors.index.json through clmla_st_index_parse; on success every entry
   must be found again and name a plain file. */
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    clmla_st_index index;
    char err[1024];
    if (clmla_st_index_parse((const char *)data, size, "fuzz.index.json", &index, err, sizeof(err)) != CLMLA_SUCCESS)
        return 0;
    for (size_t i = 0; i < index.num_entries; i++) {
        const char *file = clmla_st_index_lookup(&index, index.entries[i].tensor);
        if (file != index.entries[i].file || strchr(file, '/') || !file[0])
            abort();
    }
    clmla_st_index_free(&index);
    return 0;
}
