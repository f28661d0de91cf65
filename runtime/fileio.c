/* runtime/fileio.c: write-all, atomic writes, mkdir -p and whole-file reads (see fileio.h). */
#include "runtime/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int mt_write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

mt_status mt_file_mkdir_p(const char *path) {
    char buf[MT_FILE_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return mt_set_error(MT_ERR_IO, "path too long: '%s'", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return mt_set_error(MT_ERR_IO, "cannot create directory '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return mt_set_error(MT_ERR_IO, "cannot create directory '%s': %s", buf, strerror(errno));
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return mt_set_error(MT_ERR_IO, "'%s' exists and is not a directory", buf);
    return MT_OK;
}

mt_status mt_atomic_open(mt_atomic_file *f, const char *path) {
    f->fd = -1;
    f->path = path;
    const size_t plen = strlen(path);
    f->tmp = malloc(plen + 5);
    if (!f->tmp) return mt_set_error(MT_ERR_OOM, "%s: out of memory", path);
    memcpy(f->tmp, path, plen);
    memcpy(f->tmp + plen, ".tmp", 5);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        mt_status s = mt_set_error(MT_ERR_IO, "%s: cannot create: %s", f->tmp, strerror(errno));
        free(f->tmp);
        f->tmp = NULL;
        return s;
    }
    return MT_OK;
}

mt_status mt_atomic_write(mt_atomic_file *f, const void *buf, size_t n) {
    if (mt_write_all(f->fd, buf, n) != 0)
        return mt_set_error(MT_ERR_IO, "%s: write failed: %s", f->tmp, strerror(errno));
    return MT_OK;
}

mt_status mt_atomic_commit(mt_atomic_file *f) {
    mt_status s = MT_OK;
    if (fsync(f->fd) != 0) s = mt_set_error(MT_ERR_IO, "%s: fsync failed: %s", f->tmp, strerror(errno));
    if (close(f->fd) != 0 && s == MT_OK) s = mt_set_error(MT_ERR_IO, "%s: close failed: %s", f->tmp, strerror(errno));
    f->fd = -1;
    if (s == MT_OK && rename(f->tmp, f->path) != 0)
        s = mt_set_error(MT_ERR_IO, "%s: cannot rename %s over it: %s", f->path, f->tmp, strerror(errno));
    if (s != MT_OK) unlink(f->tmp);
    free(f->tmp);
    f->tmp = NULL;
    return s;
}

void mt_atomic_abort(mt_atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    if (f->tmp) unlink(f->tmp);
    free(f->tmp);
    f->tmp = NULL;
}

mt_status mt_file_write_atomic(const char *path, const void *buf, size_t n) {
    mt_atomic_file f;
    MT_TRY(mt_atomic_open(&f, path));
    mt_status s = mt_atomic_write(&f, buf, n);
    if (s != MT_OK) {
        mt_atomic_abort(&f);
        return s;
    }
    return mt_atomic_commit(&f);
}

mt_status mt_file_read_all(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return mt_set_error(MT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return mt_set_error(MT_ERR_OOM, "%s: out of memory", path);
        }
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        if (cap > max_bytes) {
            free(buf);
            fclose(f);
            return mt_set_error(MT_ERR_FORMAT, "%s: larger than %zu MiB", path, max_bytes >> 20);
        }
        cap *= 2;
        char *p = realloc(buf, cap);
        if (!p) free(buf);
        buf = p;
    }
    const int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return mt_set_error(MT_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return MT_OK;
}
