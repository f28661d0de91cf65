/* tests/tools/tool_backend.h: helpers for the command-line tools (tests/tools/, bench/)
 * that call a backend's ops directly: a failed op prints its message and exits 1 (these
 * are programs, not the library). */
#ifndef MT_TESTS_TOOLS_TOOL_BACKEND_H
#define MT_TESTS_TOOLS_TOOL_BACKEND_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "runtime/status.h"

/* Exit 1 with the message when a backend call fails. */
#define TOOL_OK(expr)                                                               \
    do {                                                                            \
        if ((expr) != MT_OK) {                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, mt_last_error()); \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

/* `bytes` of be's memory, or NULL with the message in mt_last_error(). */
static inline void *tool_alloc(mt_backend *be, size_t bytes) {
    void *p = NULL;
    return be->ops->alloc(be, bytes, &p) == MT_OK ? p : NULL;
}

/* be->ops->sumsq's result (exits 1 on failure): accumulated into a zeroed double of be's
 * memory and read back (the op adds to backend memory without synchronising). */
static inline double tool_sumsq(mt_backend *be, const float *x, int64_t n) {
    void *acc = NULL;
    double s = 0.0;
    TOOL_OK(be->ops->alloc(be, sizeof s, &acc));
    TOOL_OK(be->ops->zero(be, acc, sizeof s));
    TOOL_OK(be->ops->sumsq(be, x, n, acc));
    TOOL_OK(be->ops->copy_to_host(be, &s, acc, sizeof s));
    be->ops->release(be, acc);
    return s;
}

#endif
