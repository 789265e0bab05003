#include "kernel_store.h"

#include <stdlib.h>

const clmla_stored_kernel *clmla_kernel_store_find(const clmla_kernel_store *store, int family, int a, int b)
{
    for (int i = 0; i < store->count; i++) {
        const clmla_stored_kernel *e = &store->entries[i];
        if (e->family == family && e->a == a && e->b == b)
            return e;
    }
    return NULL;
}

clmla_stored_kernel *clmla_kernel_store_entry(clmla_kernel_store *store, int family, int a, int b)
{
    const clmla_stored_kernel *found = clmla_kernel_store_find(store, family, a, b);
    if (found)
        return &store->entries[found - store->entries];
    if (store->count == store->capacity) {
        const int grown = store->capacity ? 2 * store->capacity : 16;
        clmla_stored_kernel *entries = realloc(store->entries, (size_t)grown * sizeof(*entries));
        if (!entries)
            return NULL;
        store->entries = entries;
        store->capacity = grown;
    }
    clmla_stored_kernel *e = &store->entries[store->count++];
    *e = (clmla_stored_kernel){family, a, b, NULL, 0};
    return e;
}

void clmla_kernel_store_release(clmla_kernel_store *store)
{
    for (int i = 0; i < store->count; i++)
        clmla_release_kernel(store->entries[i].kernel);
    free(store->entries);
    *store = (clmla_kernel_store){NULL, 0, 0};
}
