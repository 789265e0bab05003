/* CLBlast Xgemm tuning entries (include/clmla.h, "CLBlast tuning"). */
#ifndef CLMLA_TUNING_H
#define CLMLA_TUNING_H
#include "internal.h"

/* At context creation: applies the entry for ctx's device from the tuning file, else from the
   built-in table, and records which in ctx. A malformed file (or one whose entry for the device
   CLBlast refuses) returns an error recorded for the thread (clmla_last_error(NULL)). */
clmla_status clmla_tuning_apply(clmla_context *ctx);
#endif
