/* bench_timing_check: which profiled spans clmla-bench takes beside the wall clock
   (bench_span_plausible, bench/timing.c). A driver whose events give a span of about 0 for a call
   that took 0.4 s of wall time must not have its rows reported as taking no time. Exit 0 when
   every case gives the expected answer. */
#include "bench.h"

#include <stdio.h>

int main(void)
{
    static const struct {
        double span, wall;
        int want;
        const char *what;
    } cases[] = {
        {5.0, 6.0, 1, "a kernel timed inside its call"},
        {6.05, 6.0, 1, "within 1% and 5 us of the wall time (two clocks)"},
        {6.1, 6.0, 0, "longer than the call's wall time"},
        {0.002, 0.02, 1, "a 2 us kernel behind a 20 us call floor"},
        {0.0004, 400.0, 0, "about 0 for a 0.4 s call (Mesa 22.3's rusticl)"},
        {0.0, 3.0, 0, "zero"},
        {-1.0, 3.0, 0, "negative"},
        {0.02, 3.0, 0, "under 1% of the wall time"},
        {0.04, 3.0, 1, "just over 1% of the wall time"},
    };
    int failed = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const int got = bench_span_plausible(cases[i].span, cases[i].wall);
        if (got != cases[i].want) {
            printf("FAIL span %g ms, wall %g ms (%s): %s, want %s\n", cases[i].span, cases[i].wall, cases[i].what,
                   got ? "taken" : "refused", cases[i].want ? "taken" : "refused");
            failed++;
        }
    }
    printf("%zu cases, %d failed\n", sizeof(cases) / sizeof(cases[0]), failed);
    return failed != 0;
}
