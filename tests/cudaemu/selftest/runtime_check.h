/* tests/cudaemu/selftest/runtime_check.h: the check macro of the runtime-half self-tests
 * (plain C drivers: each test_runtime_* program returns the number of failed checks). */
#ifndef CUDAEMU_RUNTIME_CHECK_H
#define CUDAEMU_RUNTIME_CHECK_H
#include <stdio.h>

static int g_failures;

/* Count and report a failed condition; execution continues. */
#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            g_failures++;                                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                          \
        }                                                                                 \
    } while (0)

/* CHECK that a call returns `want`. */
#define CHECK_EQ_INT(got, want) CHECK((long long)(got) == (long long)(want), "got %lld, want %lld", (long long)(got), (long long)(want))

#endif
