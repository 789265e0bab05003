/* libFuzzer: config.json through clmla_config_parse; on success the configuration must validate. */
#include "config.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    clmla_layer_config config;
    int layers = 0;
    char err[1024];
    if (clmla_config_parse((const char *)data, size, "fuzz/config.json", &config, &layers, err, sizeof(err)) != CLMLA_SUCCESS)
        return 0;
    if (layers < 1 || clmla_layer_config_validate(&config) != CLMLA_SUCCESS)
        abort();
    return 0;
}
