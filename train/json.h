/* train/json.h: the JSON documents meshtrain writes (metrics.jsonl rows, `plan --json`,
 * `estimate --json`, the bench/ figures), built as cJSON trees and printed in one layout.
 *
 * Layout: cJSON_PrintUnformatted's text with a space after each ':' and ',' outside
 * strings, {"key": value, "list": [1, 2]}, the layout these files had when they were
 * written with printf (tests/lib.sh mt_column and train/metrics.c row_step read it).
 * Keys keep their insertion order; strings are escaped by cJSON (quotes, backslashes,
 * control bytes).
 *
 * Numbers are not printed by cJSON: 1.7.15 prints a double with %1.15g whenever that
 * reads back within an epsilon (not bitwise: about one double in five changes), and a
 * large integer such as 1e15 in exponent form. Integers here are exact decimal digits
 * (int64_t, size_t), doubles are printed in the printf format the caller names
 * ("%.17g" reads back bitwise), and NaN or an infinity is null (JSON has neither).
 *
 * The adders add to an object under key, or append to an array when key is NULL. They
 * return 0, or -1 when out of memory or when parent is NULL (a failed
 * mt_json_add_object / mt_json_add_array upstream): OR the results and check once. */
#ifndef MT_TRAIN_JSON_H
#define MT_TRAIN_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

int mt_json_add_int(cJSON *parent, const char *key, int64_t v);
int mt_json_add_size(cJSON *parent, const char *key, size_t v);
/* v printed with fmt, a printf conversion of one double ("%.17g", "%.2f", ...), or
 * null when v is NaN or infinite. */
int mt_json_add_double(cJSON *parent, const char *key, double v, const char *fmt);
/* s escaped as a JSON string (s non-NULL, UTF-8 passed through). */
int mt_json_add_string(cJSON *parent, const char *key, const char *s);
int mt_json_add_bool(cJSON *parent, const char *key, int v);

/* A new empty object / array under key (appended when key is NULL), or NULL when out of
 * memory or parent is NULL. */
cJSON *mt_json_add_object(cJSON *parent, const char *key);
cJSON *mt_json_add_array(cJSON *parent, const char *key);

/* doc as one line in the layout above, without a newline: malloc'ed (free()), or NULL
 * when out of memory or doc is NULL. */
char *mt_json_line(const cJSON *doc);

/* doc's line and a newline written to f. Returns 0, or -1 when doc is NULL, out of
 * memory or the write failed (nothing is written when the line could not be made). */
int mt_json_write_line(const cJSON *doc, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
