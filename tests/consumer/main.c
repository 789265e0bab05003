/* Opens the default device through the installed library and prints the version; tuning.c uses the
   opt-in tuning header. */
#include <clmla.h>

#include "consumer.h"

#ifdef CLMLA_XGEMM_PARAMETERS
#error "clmla.h declares the tuning API, which belongs to clmla_tuning.h alone"
#endif

int main(void)
{
    clmla_context *ctx = NULL;
    clmla_status st = clmla_context_create(NULL, &ctx);
    printf("clmla %s: %s\n", clmla_version_string(), st == CLMLA_SUCCESS ? "context ok" : clmla_last_error(NULL));
    clmla_context_destroy(ctx);
    return (st == CLMLA_SUCCESS ? 0 : 1) | consumer_tuning();
}
