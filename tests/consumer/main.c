/* Opens the default device through the installed library and prints the version. */
#include <clmla.h>
#include <stdio.h>

int main(void)
{
    clmla_context *ctx = NULL;
    clmla_status st = clmla_context_create(NULL, &ctx);
    printf("clmla %s: %s\n", clmla_version_string(), st == CLMLA_SUCCESS ? "context ok" : clmla_last_error(NULL));
    clmla_context_destroy(ctx);
    return st == CLMLA_SUCCESS ? 0 : 1;
}
