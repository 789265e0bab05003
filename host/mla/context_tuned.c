/* The public context creators: the runtime's context (host/runtime/context.c), then the CLBlast
   entry that applies to its device (tuning.c), which lives with the products rather than in the
   runtime. */
#include "internal.h"
#include "tuning.h"

#include <string.h>

/* A new context, or none and the tuning's failure. */
static clmla_status tuned(clmla_status st, clmla_context **out)
{
    if (st != CLMLA_SUCCESS)
        return st;
    st = clmla_tuning_apply(*out);
    if (st != CLMLA_SUCCESS) {
        clmla_context_destroy(*out);
        *out = NULL;
    }
    return st;
}

clmla_status clmla_context_create(const char *device_spec, clmla_context **out)
{
    clmla_context_options o;
    memset(&o, 0, sizeof(o));
    o.device = device_spec;
    return clmla_context_create_opts(&o, out);
}

clmla_status clmla_context_create_opts(const clmla_context_options *options, clmla_context **out)
{
    return tuned(clmla_runtime_context_create(options, out), out);
}

clmla_status clmla_context_create_from_queue(cl_command_queue queue, clmla_context **out)
{
    return clmla_context_create_from_queue_opts(queue, NULL, out);
}

clmla_status clmla_context_create_from_queue_opts(cl_command_queue queue, const clmla_context_options *options,
                                                  clmla_context **out)
{
    return tuned(clmla_runtime_context_from_queue(queue, options, out), out);
}
