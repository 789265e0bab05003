/* A keyed store of built kernels: each entry holds a kernel and its work-group size under a key of
   a family (the caller's enumeration) and two integers (heads, fold, an index), made on first use
   and released with the store. The owner (a cache, a context's products) keeps one store instead
   of an array slot per kernel form. */
#ifndef CLMLA_KERNEL_STORE_H
#define CLMLA_KERNEL_STORE_H
#include "internal.h"

typedef struct clmla_stored_kernel {
    int family, a, b;
    cl_kernel kernel; /* NULL until built (or where nothing fits: the owner then builds nothing) */
    int threads;      /* its work-group size, where the owner records one */
} clmla_stored_kernel;

typedef struct clmla_kernel_store {
    clmla_stored_kernel *entries;
    int count, capacity;
} clmla_kernel_store;

/* The entry under (family, a, b), added empty (kernel NULL, threads 0) where there is none; NULL
   only where memory for a new entry cannot be had. The pointer holds until the next call adds an
   entry to the same store. */
clmla_stored_kernel *clmla_kernel_store_entry(clmla_kernel_store *store, int family, int a, int b);

/* The entry under (family, a, b), or NULL where there is none (nothing is added). */
const clmla_stored_kernel *clmla_kernel_store_find(const clmla_kernel_store *store, int family, int a, int b);

/* Releases every kernel and the entries; the store is empty and usable after. */
void clmla_kernel_store_release(clmla_kernel_store *store);
#endif
