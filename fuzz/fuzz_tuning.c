/* libFuzzer: a CLBlast tuning file through clmla_tuning_parse, for a device whose vendor and
   name are those of the corpus entries. An entry it returns must satisfy the Xgemm constraints
   for that device, and a refusal must say why. */
#include "tuning.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    clmla_device_info device;
    memset(&device, 0, sizeof(device));
    strcpy(device.vendor, "AuthenticAMD");
    strcpy(device.name, "pthread-haswell-AMD EPYC");
    device.max_work_group_size = 4096;
    device.local_mem_bytes = 512 << 10;
    clmla_xgemm_tuning found;
    char why[512] = "";
    const int r = clmla_tuning_parse(text, &device, &found, why, sizeof(why));
    free(text);
    if (r < 0 && !why[0])
        abort();
    if (r > 0) {
        clmla_context ctx; /* clmla_xgemm_values_check reads only the device limits */
        memset(&ctx, 0, sizeof(ctx));
        ctx.info = device;
        const char *bad = NULL;
        if (clmla_xgemm_values_check(&ctx, found.values, &bad) != CLMLA_SUCCESS || strcmp(found.device, device.name) != 0)
            abort();
    }
    return 0;
}
