/* runtime/status.h: status codes and the per-thread error text.
 *
 * Every public meshtrain function returns mt_status (MT_OK == 0). On failure the
 * function records a human-readable message with mt_set_error(); callers fetch it
 * with mt_last_error(). The library never exits the process: only train/main.c maps
 * a status to an exit code (mt_status_exit_code). Modelled on SQLite's result codes
 * plus sqlite3_errmsg(). */
#ifndef MT_RUNTIME_STATUS_H
#define MT_RUNTIME_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_status {
    MT_OK = 0,
    MT_ERR_INVALID = 1,     /* bad input: config key or value, shape, argument (exit 2) */
    MT_ERR_IO = 2,          /* a file is missing, unreadable or unwritable (exit 2) */
    MT_ERR_FORMAT = 3,      /* a file exists but its contents are malformed (exit 2) */
    MT_ERR_OOM = 4,         /* an allocation failed (exit 1) */
    MT_ERR_RUNTIME = 5,     /* a failure while running: numerics, device, comm (exit 1) */
    MT_ERR_UNSUPPORTED = 6  /* a valid request this build cannot do (exit 2) */
} mt_status;

/* Short constant name of a status ("invalid input", ...). Never NULL. */
const char *mt_status_str(mt_status s);

/* The message recorded by the last failing call on this thread, or "" if none.
 * The pointer stays valid until the next mt_set_error on this thread. */
const char *mt_last_error(void);

/* Record a printf-style message (truncated to 1023 bytes) for this thread and
 * return s, so errors are raised as `return mt_set_error(MT_ERR_INVALID, ...)`. */
mt_status mt_set_error(mt_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Clear this thread's message. */
void mt_clear_error(void);

/* Process exit code for a status: 0 for MT_OK; 2 for bad input (INVALID, IO, FORMAT,
 * UNSUPPORTED); 1 for runtime failures (OOM, RUNTIME): the CLI's exit codes (docs/exit_codes.md). */
int mt_status_exit_code(mt_status s);

/* Propagate a failing status: `MT_TRY(mt_foo(...));` */
#define MT_TRY(expr)                               \
    do {                                           \
        mt_status mt_try_s_ = (expr);              \
        if (mt_try_s_ != MT_OK) return mt_try_s_;  \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
