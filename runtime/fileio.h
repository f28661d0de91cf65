/* runtime/fileio.h: the file helpers every writer of run outputs shares: write all of a
 * buffer, write a file atomically (path.tmp, fsync, rename over path), mkdir -p, and
 * read a whole (small) file. Errors name the file (or the temporary file) they concern,
 * with strerror(errno). POSIX only. */
#ifndef MT_RUNTIME_FILEIO_H
#define MT_RUNTIME_FILEIO_H

#include <stddef.h>
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Write n bytes of buf to fd, retrying short writes and EINTR.
 * Returns 0, or -1 with errno set (no message is recorded: callers name their file). */
int mt_write_all(int fd, const void *buf, size_t n);

/* mkdir -p path with mode 0755: every missing component is created; existing
 * directories are fine. Errors: MT_ERR_IO ("cannot create directory '<component>': ..."
 * or "'<path>' exists and is not a directory"; a path of MT_FILE_PATH_MAX bytes or more). */
#define MT_FILE_PATH_MAX 4096
mt_status mt_file_mkdir_p(const char *path);

/* A file being written atomically: the bytes go to "<path>.tmp" (mode 0644), and
 * mt_atomic_commit fsyncs it and renames it over path, so a reader sees the old file
 * or the whole new one, never a part. */
typedef struct mt_atomic_file {
    int fd;           /* of the temporary file; -1 once closed */
    char *tmp;        /* "<path>.tmp" (owned) */
    const char *path; /* the final path (borrowed: must outlive the mt_atomic_file) */
} mt_atomic_file;

/* Create "<path>.tmp" (truncating an old one). Errors: MT_ERR_OOM, MT_ERR_IO
 * ("<tmp>: cannot create: ..."); on error nothing is left to release. */
mt_status mt_atomic_open(mt_atomic_file *f, const char *path);

/* Append n bytes. Errors: MT_ERR_IO ("<tmp>: write failed: ..."); the file stays open
 * (the caller still calls mt_atomic_abort). */
mt_status mt_atomic_write(mt_atomic_file *f, const void *buf, size_t n);

/* fsync, close and rename "<path>.tmp" over path; releases f whatever happens, the
 * temporary file removed on error. Errors: MT_ERR_IO ("<tmp>: fsync failed: ...",
 * "<tmp>: close failed: ...", "<path>: cannot rename <tmp> over it: ..."). */
mt_status mt_atomic_commit(mt_atomic_file *f);

/* Close and remove the temporary file, leaving path as it was; releases f. */
void mt_atomic_abort(mt_atomic_file *f);

/* mt_atomic_open + mt_atomic_write(buf, n) + mt_atomic_commit. Errors: theirs. */
mt_status mt_file_write_atomic(const char *path, const void *buf, size_t n);

/* Read the whole file at path into *out (malloc'ed, NUL-terminated; *len (may be NULL)
 * gets its length without the NUL). Files of more than max_bytes are refused.
 * Errors: MT_ERR_IO ("<path>: cannot open: ...", "<path>: read error"), MT_ERR_FORMAT
 * ("<path>: larger than <max_bytes / 2^20> MiB"), MT_ERR_OOM; *out is NULL on error. */
mt_status mt_file_read_all(const char *path, size_t max_bytes, char **out, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
