/* train/json.c: JSON documents through cJSON in meshtrain's one-line layout (json.h). */
#include "train/json.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* item added to parent under key (appended when key is NULL); item is freed when it
 * cannot be added. */
static int add_item(cJSON *parent, const char *key, cJSON *item) {
    if (!item) return -1;
    if (!parent || !(key ? cJSON_AddItemToObject(parent, key, item) : cJSON_AddItemToArray(parent, item))) {
        cJSON_Delete(item);
        return -1;
    }
    return 0;
}

/* text, already JSON (a number or null), as a raw item: cJSON prints it verbatim. */
static int add_raw(cJSON *parent, const char *key, const char *text) {
    return add_item(parent, key, cJSON_CreateRaw(text));
}

int mt_json_add_int(cJSON *parent, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return add_raw(parent, key, buf);
}

int mt_json_add_size(cJSON *parent, const char *key, size_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%zu", v);
    return add_raw(parent, key, buf);
}

int mt_json_add_double(cJSON *parent, const char *key, double v, const char *fmt) {
    if (!isfinite(v)) return add_raw(parent, key, "null");
    char buf[512]; /* "%.2f" of DBL_MAX is 312 characters */
    const int w = snprintf(buf, sizeof buf, fmt, v);
    if (w < 0 || (size_t)w >= sizeof buf) return -1;
    return add_raw(parent, key, buf);
}

int mt_json_add_string(cJSON *parent, const char *key, const char *s) {
    return add_item(parent, key, cJSON_CreateString(s));
}

int mt_json_add_bool(cJSON *parent, const char *key, int v) {
    return add_item(parent, key, cJSON_CreateBool(v != 0));
}

cJSON *mt_json_add_object(cJSON *parent, const char *key) {
    cJSON *o = cJSON_CreateObject();
    return add_item(parent, key, o) == 0 ? o : NULL;
}

cJSON *mt_json_add_array(cJSON *parent, const char *key) {
    cJSON *a = cJSON_CreateArray();
    return add_item(parent, key, a) == 0 ? a : NULL;
}

char *mt_json_line(const cJSON *doc) {
    if (!doc) return NULL;
    char *flat = cJSON_PrintUnformatted(doc);
    if (!flat) return NULL;
    const size_t n = strlen(flat);
    char *out = malloc(2 * n + 1); /* at most one space per character */
    if (out) {
        size_t o = 0;
        int in_str = 0;
        for (size_t i = 0; i < n; i++) {
            const char c = flat[i];
            out[o++] = c;
            if (in_str) {
                if (c == '\\' && i + 1 < n) out[o++] = flat[++i]; /* \" and \\ stay in the string */
                else if (c == '"') in_str = 0;
            } else if (c == '"') {
                in_str = 1;
            } else if (c == ':' || c == ',') {
                out[o++] = ' ';
            }
        }
        out[o] = '\0';
    }
    cJSON_free(flat);
    return out;
}

int mt_json_write_line(const cJSON *doc, FILE *f) {
    char *line = mt_json_line(doc);
    if (!line) return -1;
    const int bad = fputs(line, f) == EOF || fputc('\n', f) == EOF;
    free(line);
    return bad ? -1 : 0;
}
