/* A minimal check harness for the ctest programs: each CHECK prints a line on failure, and
   check_summary() prints "N passed, N failed" and gives main's exit code (1 where a check failed or
   none was made). */
#ifndef CLMLA_TEST_CHECK_H
#define CLMLA_TEST_CHECK_H
#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            check_passed++;                                                     \
        } else {                                                                \
            check_failed++;                                                     \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);              \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
        }                                                                       \
    } while (0)

/* A status check that prints the library's message when it is not the expected one. */
#define CHECK_STATUS(got, want, ctx)                                            \
    do {                                                                        \
        int got_ = (got), want_ = (want);                                       \
        CHECK(got_ == want_, "status %s (%d), expected %s: %s",                 \
              clmla_status_string(got_), got_, clmla_status_string(want_),      \
              clmla_last_error(ctx));                                           \
    } while (0)

/* A run that made no check fails: a test with nothing to run returns 77 (skipped) before this. */
static inline int check_summary(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    if (!check_passed && !check_failed) {
        printf("FAIL: the run made no check (a test with nothing to run reports itself skipped, 77)\n");
        return 1;
    }
    return check_failed ? 1 : 0;
}
#endif
