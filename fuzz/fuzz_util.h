/* fuzz/fuzz_util.h: helper shared by the libFuzzer targets. */
#ifndef MT_FUZZ_UTIL_H
#define MT_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Write data[size] to a fresh file under $TMPDIR (default /tmp) named
 * mt_fuzz_<tag>_<pid>; path receives its name. Returns 0, or -1 when it cannot. */
static inline int mt_fuzz_write_temp(char *path, size_t n, const char *tag, const uint8_t *data, size_t size) {
    const char *dir = getenv("TMPDIR");
    snprintf(path, n, "%s/mt_fuzz_%s_%ld", dir && *dir ? dir : "/tmp", tag, (long)getpid());
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = size ? fwrite(data, 1, size, fp) : 0;
    if (fclose(fp) != 0 || w != size) {
        unlink(path);
        return -1;
    }
    return 0;
}

#endif
