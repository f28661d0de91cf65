/* tests/cudaemu/selftest/selftest.h: helpers of the emulator's self-tests (plain exit
 * codes for ctest: 0 pass, 1 fail). */
#ifndef CUDAEMU_SELFTEST_H
#define CUDAEMU_SELFTEST_H

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int st_failures = 0;

#define ST_CHECK(cond, ...)                                                 \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            st_failures++;                                                  \
        }                                                                   \
    } while (0)

/* The line of the first "@marker" in source file `path` (0 if absent): the expected
 * lines of errors are marked in the .cu itself, so editing it cannot stale them. */
static int st_line_of(const char *path, const char *marker) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[1024], want[128];
    snprintf(want, sizeof want, "@%s ", marker);
    int line = 0, found = 0;
    while (!found && fgets(buf, sizeof buf, f)) {
        line++;
        found = strstr(buf, want) != NULL;
    }
    fclose(f);
    return found ? line : 0;
}

/* Check that the current error is `want` and that its message names the kernel and
 * the lines of the given markers (NULL-terminated) as "<file base name>:<line>". */
__attribute__((unused)) static void st_expect_error(cudaError_t want, const char *kernel, const char *file, ...) {
    const cudaError_t e = cudaPeekAtLastError();
    const char *msg = cudaGetErrorString(e);
    ST_CHECK(e == want, "error %d, want %d (%s)", (int)e, (int)want, msg);
    ST_CHECK(strstr(msg, kernel) != NULL, "message does not name kernel %s: %s", kernel, msg);
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    va_list ap;
    va_start(ap, file);
    for (const char *m; (m = va_arg(ap, const char *)) != NULL;) {
        char at[256];
        snprintf(at, sizeof at, "%s:%d", base, st_line_of(file, m));
        ST_CHECK(st_line_of(file, m) > 0 && strstr(msg, at) != NULL, "message does not name %s (%s): %s", m, at, msg);
    }
    va_end(ap);
}

template <class T>
static T *st_dev(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        exit(1);
    }
    return (T *)p;
}

#endif
