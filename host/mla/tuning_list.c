/* The reader of tuning files' entry lists that the parsers of kernel_tuning.c and plan_rates.c share
   (tuning_data.h). */
#include "tuning_data.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

cJSON *clmla_tuning_json_list(const char *text, char *why, size_t why_size)
{
    cJSON *list = text ? cJSON_Parse(text) : NULL;
    if (cJSON_IsArray(list))
        return list;
    cJSON_Delete(list);
    snprintf(why, why_size, "not a JSON array of entries");
    return NULL;
}

int clmla_tuning_list_parse(const char *text, size_t size, clmla_tuning_entry_parser parse, const void *arg,
                            void **entries, size_t *count, char *why, size_t why_size)
{
    *entries = NULL;
    *count = 0;
    why[0] = '\0';
    cJSON *list = clmla_tuning_json_list(text, why, why_size);
    if (!list)
        return -1;
    const int n = cJSON_GetArraySize(list);
    char *slots = calloc(n > 0 ? (size_t)n : 1, size);
    if (!slots) {
        cJSON_Delete(list);
        snprintf(why, why_size, "out of host memory");
        return -1;
    }
    int refused = 0;
    const cJSON *item = NULL;
    cJSON_ArrayForEach(item, list)
    {
        char one[512] = "";
        const int r = parse(item, slots + *count * size, arg, one, sizeof(one));
        if (r > 0)
            (*count)++;
        else if (r == 0 && !refused++)
            snprintf(why, why_size, "%s", one); /* the first refusal; the others are refused too */
    }
    cJSON_Delete(list);
    *entries = slots;
    return refused;
}
