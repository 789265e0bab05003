/* Test hooks: settings that only the tests make (a forced fp8 decoder, the absorbed path's pieces,
   an injected fault), kept out of the context's own fields. A context has none until a test asks
   for them (clmla_test_hooks_of); the library reads them through these calls, which give the
   defaults when there are none. */
#ifndef CLMLA_HOOKS_H
#define CLMLA_HOOKS_H
#include "internal.h"

typedef struct clmla_test_hooks {
    int fp8_decoder;         /* program.h's CLMLA_FP8_DECODER_*; 0 = by device */
    int absorbed_piece_rows; /* rows per piece of the absorbed path's attention (layer_plan.c); 0 = by
                                its scratch budget */
    long fault_at;           /* clcall.h: the counted call (since fault_from) that fails; 0 = none */
    long fault_from;         /* the context's counted calls when the fault was armed */
} clmla_test_hooks;

/* The context's hooks, made (all defaults) on first use; NULL when host memory ran out. */
clmla_test_hooks *clmla_test_hooks_of(clmla_context *ctx);
/* The forced fp8 decoder, or CLMLA_FP8_DECODER_AUTO (0) when none is forced. */
int clmla_hook_fp8_decoder(const clmla_context *ctx);
/* The forced rows per absorbed piece, or 0. */
int clmla_hook_absorbed_piece_rows(const clmla_context *ctx);

#endif
