/* What the consumer's files share. */
#ifndef CLMLA_CONSUMER_H
#define CLMLA_CONSUMER_H
#include <stdio.h>

/* tuning.c: the tuning header's defaults, checked; 0 when they pass. */
int consumer_tuning(void);
#endif
