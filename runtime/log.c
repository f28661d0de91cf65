/* runtime/log.c: leveled logging through a replaceable sink (see log.h).
 *
 * Level and sink are process-wide settings made once at start-up by the CLI or the
 * embedding program; they are atomics so that reading them from worker threads is
 * well defined. Setting the sink and its user pointer is not one atomic step:
 * change the sink while no other thread logs. */
#include "runtime/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define MT_LOG_LINE_MAX 2048

static atomic_int mt_log_level_cur = MT_LOG_OFF;
static _Atomic(mt_log_sink) mt_log_sink_cur = NULL;
static _Atomic(void *) mt_log_user_cur = NULL;

static const char *mt_log_level_name(mt_log_level level) {
    switch (level) {
    case MT_LOG_DEBUG: return "debug";
    case MT_LOG_INFO: return "info";
    case MT_LOG_WARN: return "warn";
    case MT_LOG_ERROR: return "error";
    case MT_LOG_OFF: break;
    }
    return "?";
}

/* Default sink: one write per line so lines from different threads do not mix. */
static void mt_log_stderr_sink(mt_log_level level, const char *line, void *user) {
    (void)user;
    fprintf(stderr, "[%s] %s\n", mt_log_level_name(level), line);
}

void mt_log_set_level(mt_log_level level) { atomic_store(&mt_log_level_cur, (int)level); }

mt_log_level mt_log_get_level(void) { return (mt_log_level)atomic_load(&mt_log_level_cur); }

void mt_log_set_sink(mt_log_sink sink, void *user) {
    atomic_store(&mt_log_user_cur, sink ? user : NULL);
    atomic_store(&mt_log_sink_cur, sink);
}

void mt_log(mt_log_level level, const char *fmt, ...) {
    if ((int)level < (int)MT_LOG_DEBUG || (int)level >= (int)MT_LOG_OFF) return;
    if ((int)level < atomic_load(&mt_log_level_cur)) return;
    char line[MT_LOG_LINE_MAX];
    line[0] = '\0';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt ? fmt : "", ap);
    va_end(ap);
    /* The sink adds the newline; drop any the caller wrote. */
    size_t len = strlen(line);
    while (len > 0 && line[len - 1] == '\n') line[--len] = '\0';
    mt_log_sink sink = atomic_load(&mt_log_sink_cur);
    void *user = atomic_load(&mt_log_user_cur);
    if (sink)
        sink(level, line, user);
    else
        mt_log_stderr_sink(level, line, NULL);
}
