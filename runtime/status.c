/* runtime/status.c: status names, exit codes and the per-thread error message
 * (see status.h; modelled on SQLite's result codes and sqlite3_errmsg). */
#include "runtime/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MT_ERROR_TEXT_MAX 1024

/* One message per thread: a failing call on one thread never overwrites the text
 * another thread is about to read. */
static _Thread_local char mt_error_text[MT_ERROR_TEXT_MAX];

const char *mt_status_str(mt_status s) {
    switch (s) {
    case MT_OK: return "ok";
    case MT_ERR_INVALID: return "invalid input";
    case MT_ERR_IO: return "I/O error";
    case MT_ERR_FORMAT: return "malformed file";
    case MT_ERR_OOM: return "out of memory";
    case MT_ERR_RUNTIME: return "runtime failure";
    case MT_ERR_UNSUPPORTED: return "unsupported";
    }
    return "unknown status";
}

const char *mt_last_error(void) { return mt_error_text; }

mt_status mt_set_error(mt_status s, const char *fmt, ...) {
    /* Format into a temporary first: callers may pass mt_last_error() itself as an
     * argument to add context ("loading %s: %s", path, mt_last_error()). */
    char tmp[MT_ERROR_TEXT_MAX];
    tmp[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tmp, sizeof tmp, fmt, ap);
        va_end(ap);
    }
    memcpy(mt_error_text, tmp, sizeof tmp);
    return s;
}

void mt_clear_error(void) { mt_error_text[0] = '\0'; }

int mt_status_exit_code(mt_status s) {
    switch (s) {
    case MT_OK: return 0;
    case MT_ERR_INVALID:
    case MT_ERR_IO:
    case MT_ERR_FORMAT:
    case MT_ERR_UNSUPPORTED: return 2;
    case MT_ERR_OOM:
    case MT_ERR_RUNTIME: return 1;
    }
    return 1; /* an unknown code is a runtime failure, never success */
}
