/* runtime/log.h: leveled logging through a replaceable sink.
 *
 * The library is silent by default (level MT_LOG_OFF): research code that links it
 * sees no output unless it asks. The CLI sets MT_LOG_INFO and the stderr sink. */
#ifndef MT_RUNTIME_LOG_H
#define MT_RUNTIME_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_LOG_DEBUG = 0, MT_LOG_INFO = 1, MT_LOG_WARN = 2, MT_LOG_ERROR = 3, MT_LOG_OFF = 4 } mt_log_level;

/* A sink receives one complete line without the trailing newline. */
typedef void (*mt_log_sink)(mt_log_level level, const char *line, void *user);

/* Messages below `level` are dropped. Default MT_LOG_OFF. */
void mt_log_set_level(mt_log_level level);
mt_log_level mt_log_get_level(void);

/* Replace the sink; NULL restores the default, which writes "[level] line\n" to stderr. */
void mt_log_set_sink(mt_log_sink sink, void *user);

/* Format and emit one line at `level` (truncated to 2047 bytes). */
void mt_log(mt_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#define MT_LOG_I(...) mt_log(MT_LOG_INFO, __VA_ARGS__)
#define MT_LOG_W(...) mt_log(MT_LOG_WARN, __VA_ARGS__)
#define MT_LOG_E(...) mt_log(MT_LOG_ERROR, __VA_ARGS__)
#define MT_LOG_D(...) mt_log(MT_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
