/* tests/cudaemu/src/env.cpp: the emulator's environment variables, checked once.
 *
 * Every CUDAEMU_* variable is validated the first time the emulator reads any of them
 * (cudaemu_env_check, called by each reader). A value outside its documented range, or
 * a CUDAEMU_ name the emulator does not know (a typo would otherwise be ignored, and a
 * test relying on it would pass without doing what it says), is bad input: the process
 * prints the variable, its value and what is expected, and exits 2 (as the project's
 * CLI does for a bad key). The table is README.md's "Environment". */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudaemu_internal.h"

extern char **environ;

namespace {

/* 1 if s is a decimal integer in [lo, hi] (no sign, no trailing characters). */
int uint_in(const char *s, unsigned long long lo, unsigned long long hi) {
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p)) return 0;
    if (strlen(s) > 19) return 0;
    const unsigned long long v = strtoull(s, nullptr, 10);
    return v >= lo && v <= hi;
}

int ok_order(const char *v) {
    if (!strcmp(v, "forward") || !strcmp(v, "reverse") || !strcmp(v, "random")) return 1;
    return !strncmp(v, "random:", 7) && uint_in(v + 7, 0, ~0ULL);
}

int ok_fail_kernel(const char *v) {
    const char *colon = strchr(v, ':');
    const size_t len = colon ? (size_t)(colon - v) : strlen(v);
    if (len == 0) return 0;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)v[i]) && v[i] != '_' && v[i] != '<' && v[i] != '>' && v[i] != ',' &&
            v[i] != ' ')
            return 0;
    return !colon || uint_in(colon + 1, 1, 1ULL << 62);
}

struct var {
    const char *name, *expect;
    int (*ok)(const char *);
};

const var kVars[] = {
    {"CUDAEMU_ORDER", "forward, reverse, random or random:<seed>", ok_order},
    {"CUDAEMU_BLOCK_ORDER", "forward or reverse", [](const char *v) { return (int)(!strcmp(v, "forward") || !strcmp(v, "reverse")); }},
    {"CUDAEMU_STACK_KIB", "an integer from 16 to 8192 (KiB per fiber stack)", [](const char *v) { return uint_in(v, 16, 8192); }},
    {"CUDAEMU_FAIL_KERNEL", "<kernel name>[:<n>], n >= 1 (the n-th launch faults)", ok_fail_kernel},
    {"CUDAEMU_FILL", "0 (zero-filled memory) or 1 (0xFF bytes: NaN floats, the default)", [](const char *v) { return uint_in(v, 0, 1); }},
    {"CUDAEMU_QUIET", "0 or 1", [](const char *v) { return uint_in(v, 0, 1); }},
    {"CUDAEMU_DEVICES", "an integer from 0 to 64 (devices cudaGetDeviceCount reports)", [](const char *v) { return uint_in(v, 0, 64); }},
    {"CUDAEMU_MEM_GIB", "an integer from 1 to 1048576 (GiB cudaMemGetInfo reports)", [](const char *v) { return uint_in(v, 1, 1048576); }},
    {"CUDAEMU_HOST_ACCESS", "trap (host code that touches cudaMalloc memory aborts) or allow",
     [](const char *v) { return (int)(!strcmp(v, "trap") || !strcmp(v, "allow")); }},
};

void bad(const char *name, const char *value, const char *expect) {
    fprintf(stderr, "cudaemu: bad environment variable %s=%s: expected %s (tests/cudaemu/README.md)\n", name, value,
            expect);
    exit(2);
}

} /* namespace */

extern "C" void cudaemu_env_check(void) {
    static int done = 0;
    if (done) return;
    done = 1;
    for (const var &v : kVars) {
        const char *s = getenv(v.name);
        if (s && *s && !v.ok(s)) bad(v.name, s, v.expect);
    }
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "CUDAEMU_", 8) != 0) continue;
        const char *eq = strchr(*e, '=');
        const size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        int known = 0;
        for (const var &v : kVars) known |= strlen(v.name) == len && !strncmp(v.name, *e, len);
        if (!known) {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(len < 100 ? len : 100), *e);
            bad(name, eq ? eq + 1 : "", "one of CUDAEMU_ORDER, CUDAEMU_BLOCK_ORDER, CUDAEMU_STACK_KIB, "
                                        "CUDAEMU_FAIL_KERNEL, CUDAEMU_FILL, CUDAEMU_QUIET, CUDAEMU_DEVICES, "
                                        "CUDAEMU_MEM_GIB, CUDAEMU_HOST_ACCESS (an unknown CUDAEMU_ name)");
        }
    }
}
