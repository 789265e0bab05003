/* Freeing a list of host pointers, or releasing a list of OpenCL buffers, in one statement: the
   tests' cleanups. FREE_ALL(a, b, c) frees each; RELEASE_MEMS(x, y) releases each that is not
   NULL. */
#ifndef TESTS_FREE_ALL_H
#define TESTS_FREE_ALL_H
#include <stddef.h>
#include <stdlib.h>

static inline void tu_free_n(void *const *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(p[i]);
}
#define FREE_ALL(...) tu_free_n((void *const[]){__VA_ARGS__}, sizeof((void *[]){__VA_ARGS__}) / sizeof(void *))

#ifdef CL_SUCCESS
static inline void tu_release_n(const cl_mem *m, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (m[i])
            clReleaseMemObject(m[i]);
}
#define RELEASE_MEMS(...) \
    tu_release_n((const cl_mem[]){__VA_ARGS__}, sizeof((cl_mem[]){__VA_ARGS__}) / sizeof(cl_mem))
#endif
#endif
