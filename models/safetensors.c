/* models/safetensors.c: strict safetensors reader and atomic writer.
 *
 * Validation follows the reference implementation (huggingface/safetensors,
 * safetensors/src/tensor.rs: Metadata::validate, SafeTensorError variants): header
 * length within the file, a JSON object, known dtype, data_offsets that match the
 * shape and cover the data section with no gap or overlap. The host is assumed
 * little-endian (x86-64, aarch64), as the format is. */
#include "models/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/fileio.h"

#define ST_CHUNK_BYTES ((size_t)1 << 20)          /* conversion buffer for read_f32 */
#define ST_MAX_HEADER ((uint64_t)100000000)        /* safetensors' own MAX_HEADER_SIZE */
#define ST_MAX_EXACT ((uint64_t)1 << 53)          /* largest integer a JSON double holds */

struct mt_safetensors {
    char *path;
    int fd;
    uint64_t data_start; /* 8 + header length */
    uint64_t data_size;
    int count;
    mt_st_tensor *tensors;
    cJSON *metadata; /* detached "__metadata__" object or NULL */
};

static const struct {
    const char *name;
    mt_dtype dtype; /* MT_DTYPE_COUNT: known to safetensors but unsupported here */
} st_dtypes[] = {
    {"F32", MT_F32}, {"BF16", MT_BF16}, {"F16", MT_F16}, {"I32", MT_I32},
    {"U16", MT_U16}, {"U32", MT_U32},   {"F64", MT_F64},
};

static const char *st_dtype_str(mt_dtype t) {
    for (size_t k = 0; k < sizeof st_dtypes / sizeof st_dtypes[0]; k++)
        if (st_dtypes[k].dtype == t) return st_dtypes[k].name;
    return NULL;
}

/* pread exactly n bytes at off; 0 on success, -1 on error or short read. */
static int st_pread_all(int fd, void *buf, size_t n, uint64_t off) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* A JSON number that is a non-negative integer a double holds exactly. */
static int st_json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0.0) || v > (double)ST_MAX_EXACT || v != floor(v)) return 0;
    *out = (uint64_t)v;
    return 1;
}

static int st_cmp_begin(const void *a, const void *b) {
    const mt_st_tensor *x = *(const mt_st_tensor *const *)a, *y = *(const mt_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Parse one header entry into t. Returns MT_OK or an MT_ERR_FORMAT naming file and tensor. */
static mt_status st_parse_entry(const char *path, const cJSON *e, mt_st_tensor *t,
                                uint64_t data_size) {
    const char *name = e->string;
    if (strlen(name) == 0 || strlen(name) >= sizeof t->name)
        return mt_set_error(MT_ERR_FORMAT, "%s: tensor name '%.64s...' is empty or longer than %zu bytes",
                            path, name, sizeof t->name - 1);
    strcpy(t->name, name);
    if (!cJSON_IsObject(e))
        return mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", path, name);

    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(jd))
        return mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"", path, name);
    int found = 0;
    for (size_t k = 0; k < sizeof st_dtypes / sizeof st_dtypes[0]; k++)
        if (strcmp(jd->valuestring, st_dtypes[k].name) == 0) {
            t->dtype = st_dtypes[k].dtype;
            found = 1;
        }
    if (!found)
        return mt_set_error(MT_ERR_FORMAT,
                            "%s: tensor '%s': unsupported dtype \"%s\" (supported: F32 BF16 F16 F64 I32 U16 U32)",
                            path, name, jd->valuestring);

    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(js))
        return mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s': missing or non-array \"shape\"", path, name);
    int nd = cJSON_GetArraySize(js);
    if (nd > MT_ST_MAX_DIMS)
        return mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s': %d dimensions (at most %d)", path, name, nd,
                            MT_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int d = 0;
    for (const cJSON *x = js->child; x; x = x->next, d++) {
        uint64_t v;
        if (!st_json_uint(x, &v))
            return mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                                path, name, d);
        t->shape[d] = (int64_t)v;
        if (v != 0 && numel > UINT64_MAX / v)
            return mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s': element count overflows", path, name);
        numel *= v;
    }
    for (; d < MT_ST_MAX_DIMS; d++) t->shape[d] = 0;

    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    uint64_t b, en;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !st_json_uint(jo->child, &b) ||
        !st_json_uint(jo->child->next, &en))
        return mt_set_error(MT_ERR_FORMAT,
                            "%s: tensor '%s': \"data_offsets\" must be [begin, end] non-negative integers",
                            path, name);
    if (en < b)
        return mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s': data_offsets end %llu < begin %llu", path, name,
                            (unsigned long long)en, (unsigned long long)b);
    if (en > data_size)
        return mt_set_error(MT_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%llu, %llu) outside the data section of %llu bytes",
                            path, name, (unsigned long long)b, (unsigned long long)en,
                            (unsigned long long)data_size);
    uint64_t esz = mt_dtype_size(t->dtype);
    if (numel > UINT64_MAX / esz || en - b != numel * esz)
        return mt_set_error(MT_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets span %llu bytes but shape and dtype %s need %llu",
                            path, name, (unsigned long long)(en - b), jd->valuestring,
                            (unsigned long long)(numel * esz));
    t->begin = b;
    t->end = en;
    return MT_OK;
}

static mt_status st_parse_header(mt_safetensors *f, const char *path, char *text) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        size_t at = end ? (size_t)(end - text) : 0;
        return mt_set_error(MT_ERR_FORMAT, "%s: header is not valid JSON (near byte %zu of the header)", path, at);
    }
    mt_status s = MT_OK;
    if (!cJSON_IsObject(root)) {
        s = mt_set_error(MT_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        for (const cJSON *g = root->child; g != e; g = g->next)
            if (strcmp(g->string, e->string) == 0) {
                s = mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", path, e->string);
                goto done;
            }
        if (strcmp(e->string, "__metadata__") != 0) n++;
    }
    f->tensors = calloc(n > 0 ? (size_t)n : 1, sizeof *f->tensors);
    mt_st_tensor **order = calloc(n > 0 ? (size_t)n : 1, sizeof *order);
    if (!f->tensors || !order) {
        free(order);
        s = mt_set_error(MT_ERR_OOM, "%s: out of memory for %d tensor entries", path, n);
        goto done;
    }
    for (cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                s = mt_set_error(MT_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", path);
                break;
            }
            for (const cJSON *m = e->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    s = mt_set_error(MT_ERR_FORMAT, "%s: __metadata__ value of \"%s\" is not a string", path,
                                     m->string);
                    break;
                }
            continue;
        }
        s = st_parse_entry(path, e, &f->tensors[f->count], f->data_size);
        if (s != MT_OK) break;
        order[f->count] = &f->tensors[f->count];
        f->count++;
    }
    if (s == MT_OK) {
        /* Sorted by begin, each tensor must start where the previous ended. */
        qsort(order, (size_t)f->count, sizeof *order, st_cmp_begin);
        uint64_t pos = 0;
        for (int i = 0; i < f->count && s == MT_OK; i++) {
            const mt_st_tensor *t = order[i];
            if (t->begin < pos)
                s = mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s' [%llu, %llu) overlaps tensor '%s' ending at %llu",
                                 path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                                 order[i - 1]->name, (unsigned long long)pos);
            else if (t->begin > pos)
                s = mt_set_error(MT_ERR_FORMAT, "%s: gap in the data: tensor '%s' begins at %llu, expected %llu",
                                 path, t->name, (unsigned long long)t->begin, (unsigned long long)pos);
            pos = t->end;
        }
        if (s == MT_OK && pos != f->data_size)
            s = mt_set_error(MT_ERR_FORMAT,
                             "%s: tensors cover %llu bytes of data but the file holds %llu bytes after the header",
                             path, (unsigned long long)pos, (unsigned long long)f->data_size);
    }
    free(order);
    if (s == MT_OK) f->metadata = cJSON_DetachItemFromObjectCaseSensitive(root, "__metadata__");
done:
    cJSON_Delete(root);
    return s;
}

mt_status mt_safetensors_open(mt_safetensors **out, const char *path) {
    *out = NULL;
    mt_safetensors *f = calloc(1, sizeof *f);
    if (!f) return mt_set_error(MT_ERR_OOM, "%s: out of memory", path);
    f->fd = -1;
    f->path = strdup(path);
    mt_status s = MT_OK;
    char *text = NULL;
    if (!f->path) {
        s = mt_set_error(MT_ERR_OOM, "%s: out of memory", path);
        goto fail;
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        s = mt_set_error(MT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = mt_set_error(MT_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    unsigned char lenb[8];
    if (size < 8 || st_pread_all(f->fd, lenb, 8, 0) != 0) {
        s = mt_set_error(MT_ERR_FORMAT, "%s: truncated: %llu bytes, shorter than the 8-byte header length",
                         path, (unsigned long long)size);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = (hlen << 8) | lenb[k];
    if (hlen > size - 8) {
        s = mt_set_error(MT_ERR_FORMAT, "%s: header length %llu is larger than the %llu bytes after it (truncated?)",
                         path, (unsigned long long)hlen, (unsigned long long)(size - 8));
        goto fail;
    }
    if (hlen < 2 || hlen > ST_MAX_HEADER) {
        s = mt_set_error(MT_ERR_FORMAT, "%s: header length %llu is outside [2, %llu]", path,
                         (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
        goto fail;
    }
    text = malloc((size_t)hlen + 1);
    if (!text) {
        s = mt_set_error(MT_ERR_OOM, "%s: out of memory for a %llu-byte header", path, (unsigned long long)hlen);
        goto fail;
    }
    if (st_pread_all(f->fd, text, (size_t)hlen, 8) != 0) {
        s = mt_set_error(MT_ERR_IO, "%s: cannot read the %llu-byte header", path, (unsigned long long)hlen);
        goto fail;
    }
    text[hlen] = '\0';
    if (memchr(text, '\0', (size_t)hlen)) {
        s = mt_set_error(MT_ERR_FORMAT, "%s: header contains a NUL byte", path);
        goto fail;
    }
    f->data_start = 8 + hlen;
    f->data_size = size - 8 - hlen;
    s = st_parse_header(f, path, text);
    if (s != MT_OK) goto fail;
    free(text);
    *out = f;
    return MT_OK;
fail:
    free(text);
    mt_safetensors_close(f);
    return s;
}

int mt_safetensors_count(const mt_safetensors *f) { return f->count; }

const mt_st_tensor *mt_safetensors_tensor(const mt_safetensors *f, int i) {
    return (i >= 0 && i < f->count) ? &f->tensors[i] : NULL;
}

int mt_safetensors_find(const mt_safetensors *f, const char *name) {
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return i;
    return -1;
}

const char *mt_safetensors_metadata(const mt_safetensors *f, const char *key) {
    if (!f->metadata) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->metadata, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

const char *mt_safetensors_path(const mt_safetensors *f) { return f->path; }

static int64_t st_numel(const mt_st_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

mt_status mt_safetensors_read_f32(const mt_safetensors *f, int i, float *dst, int64_t numel) {
    if (i < 0 || i >= f->count)
        return mt_set_error(MT_ERR_INVALID, "%s: tensor index %d out of range [0, %d)", f->path, i, f->count);
    const mt_st_tensor *t = &f->tensors[i];
    if (numel != st_numel(t))
        return mt_set_error(MT_ERR_INVALID, "%s: tensor '%s' has %lld elements, caller expects %lld", f->path,
                            t->name, (long long)st_numel(t), (long long)numel);
    if (t->dtype != MT_F32 && t->dtype != MT_BF16 && t->dtype != MT_F16 && t->dtype != MT_F64)
        return mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s' has dtype %s, not a floating-point type", f->path,
                            t->name, st_dtype_str(t->dtype));
    size_t esz = mt_dtype_size(t->dtype);
    unsigned char *buf = NULL;
    if (t->dtype != MT_F32) {
        buf = malloc(ST_CHUNK_BYTES);
        if (!buf) return mt_set_error(MT_ERR_OOM, "%s: out of memory", f->path);
    }
    size_t per = ST_CHUNK_BYTES / esz;
    for (int64_t done = 0; done < numel;) {
        size_t cnt = (size_t)(numel - done) < per ? (size_t)(numel - done) : per;
        uint64_t off = f->data_start + t->begin + (uint64_t)done * esz;
        void *target = t->dtype == MT_F32 ? (void *)(dst + done) : (void *)buf;
        if (st_pread_all(f->fd, target, cnt * esz, off) != 0) {
            free(buf);
            return mt_set_error(MT_ERR_IO, "%s: tensor '%s': short read at byte %llu", f->path, t->name,
                                (unsigned long long)off);
        }
        float *o = dst + done;
        if (t->dtype == MT_BF16) {
            mt_bf16_to_f32_array(o, (const mt_bf16 *)buf, cnt);
        } else if (t->dtype == MT_F16) {
            const uint16_t *h = (const uint16_t *)buf;
            for (size_t k = 0; k < cnt; k++) o[k] = mt_f16_to_f32(h[k]);
        } else if (t->dtype == MT_F64) {
            const double *g = (const double *)buf;
            for (size_t k = 0; k < cnt; k++) {
                if (isfinite(g[k]) && fabs(g[k]) > (double)3.4028235677973366e38) {
                    double bad = g[k];
                    free(buf);
                    return mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s': element %lld = %g is outside float32 range",
                                        f->path, t->name, (long long)(done + (int64_t)k), bad);
                }
                o[k] = (float)g[k];
            }
        }
        for (size_t k = 0; k < cnt; k++)
            if (!isfinite(o[k])) {
                free(buf);
                return mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s': element %lld is %s", f->path, t->name,
                                    (long long)(done + (int64_t)k), isnan(o[k]) ? "NaN" : "Inf");
            }
        done += (int64_t)cnt;
    }
    free(buf);
    return MT_OK;
}

mt_status mt_safetensors_read_raw(const mt_safetensors *f, int i, void *dst, size_t bytes) {
    if (i < 0 || i >= f->count)
        return mt_set_error(MT_ERR_INVALID, "%s: tensor index %d out of range [0, %d)", f->path, i, f->count);
    const mt_st_tensor *t = &f->tensors[i];
    if ((uint64_t)bytes != t->end - t->begin)
        return mt_set_error(MT_ERR_INVALID, "%s: tensor '%s' holds %llu bytes, caller expects %zu", f->path,
                            t->name, (unsigned long long)(t->end - t->begin), bytes);
    if (bytes && st_pread_all(f->fd, dst, bytes, f->data_start + t->begin) != 0)
        return mt_set_error(MT_ERR_IO, "%s: tensor '%s': short read", f->path, t->name);
    return MT_OK;
}

void mt_safetensors_close(mt_safetensors *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    cJSON_Delete(f->metadata);
    free(f->tensors);
    free(f->path);
    free(f);
}

/* ---- writer ---- */

/* Growable string for the header. */
typedef struct st_buf {
    char *p;
    size_t len, cap;
    int oom;
} st_buf;

static void sb_put(st_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(st_buf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(st_buf *b, const char *fmt, unsigned long long v) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, fmt, v);
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal (RFC 8259 escaping). */
static void sb_json_str(st_buf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            sb_put(b, e, 2);
        } else if (*p < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", *p);
            sb_put(b, e, 6);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

mt_status mt_safetensors_write(const char *path, const mt_st_write_tensor *t, int n,
                               const char *const *metadata) {
    return mt_safetensors_write_fetch(path, t, n, metadata, NULL, NULL);
}

mt_status mt_safetensors_write_fetch(const char *path, const mt_st_write_tensor *t, int n,
                                     const char *const *metadata, mt_st_fetch_fn fetch, void *ctx) {
    if (n < 0 || (n > 0 && !t)) return mt_set_error(MT_ERR_INVALID, "%s: bad tensor list (n = %d)", path, n);
    /* Validate everything before touching the file system. */
    uint64_t *bytes = calloc(n > 0 ? (size_t)n : 1, sizeof *bytes);
    if (!bytes) return mt_set_error(MT_ERR_OOM, "%s: out of memory", path);
    mt_status s = MT_OK;
    for (int i = 0; i < n && s == MT_OK; i++) {
        const char *nm = t[i].name;
        if (!nm || !*nm || strlen(nm) > 255 || strcmp(nm, "__metadata__") == 0) {
            s = mt_set_error(MT_ERR_INVALID, "%s: tensor %d has an empty, reserved or over-long name", path, i);
            break;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(t[j].name, nm) == 0) {
                s = mt_set_error(MT_ERR_INVALID, "%s: tensor '%s' given twice", path, nm);
                break;
            }
        if (s != MT_OK) break;
        if ((int)t[i].dtype < 0 || t[i].dtype >= MT_DTYPE_COUNT || !st_dtype_str(t[i].dtype)) {
            s = mt_set_error(MT_ERR_INVALID, "%s: tensor '%s' has an unknown dtype %d", path, nm, (int)t[i].dtype);
            break;
        }
        if (t[i].ndim < 0 || t[i].ndim > MT_ST_MAX_DIMS) {
            s = mt_set_error(MT_ERR_INVALID, "%s: tensor '%s' has ndim %d (0..%d)", path, nm, t[i].ndim,
                             MT_ST_MAX_DIMS);
            break;
        }
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            int64_t v = t[i].shape[d];
            if (v < 0 || (uint64_t)v > ST_MAX_EXACT || (v && numel > ST_MAX_EXACT / (uint64_t)v)) {
                s = mt_set_error(MT_ERR_INVALID, "%s: tensor '%s' has a bad shape[%d] = %lld", path, nm, d,
                                 (long long)v);
                break;
            }
            numel *= (uint64_t)v;
        }
        if (s != MT_OK) break;
        bytes[i] = numel * mt_dtype_size(t[i].dtype);
        if (bytes[i] && !t[i].data && !fetch)
            s = mt_set_error(MT_ERR_INVALID, "%s: tensor '%s' has no data", path, nm);
    }
    if (s == MT_OK && metadata)
        for (int k = 0; metadata[k]; k += 2)
            if (!metadata[k + 1]) {
                s = mt_set_error(MT_ERR_INVALID, "%s: metadata key '%s' has no value", path, metadata[k]);
                break;
            }
    if (s != MT_OK) {
        free(bytes);
        return s;
    }

    st_buf h = {0};
    sb_str(&h, "{");
    int first = 1;
    if (metadata && metadata[0]) {
        sb_str(&h, "\"__metadata__\":{");
        for (int k = 0; metadata[k]; k += 2) {
            if (k) sb_str(&h, ",");
            sb_json_str(&h, metadata[k]);
            sb_str(&h, ":");
            sb_json_str(&h, metadata[k + 1]);
        }
        sb_str(&h, "}");
        first = 0;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!first) sb_str(&h, ",");
        first = 0;
        sb_json_str(&h, t[i].name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, st_dtype_str(t[i].dtype));
        sb_str(&h, "\",\"shape\":[");
        for (int d = 0; d < t[i].ndim; d++) sb_fmt(&h, d ? ",%llu" : "%llu", (unsigned long long)t[i].shape[d]);
        sb_fmt(&h, "],\"data_offsets\":[%llu,", off);
        off += bytes[i];
        sb_fmt(&h, "%llu]}", off);
    }
    sb_str(&h, "}");
    while (!h.oom && h.len % 8) sb_str(&h, " ");
    if (h.oom) {
        free(h.p);
        free(bytes);
        return mt_set_error(MT_ERR_OOM, "%s: out of memory for the header", path);
    }

    mt_atomic_file af;
    s = mt_atomic_open(&af, path);
    if (s != MT_OK) goto out;
    unsigned char lenb[8];
    for (int k = 0; k < 8; k++) lenb[k] = (unsigned char)((uint64_t)h.len >> (8 * k));
    void *scratch = NULL;
    if (fetch) {
        uint64_t most = 1;
        for (int i = 0; i < n; i++) most = bytes[i] > most ? bytes[i] : most;
        scratch = malloc((size_t)most);
        if (!scratch)
            s = mt_set_error(MT_ERR_OOM, "%s: out of memory for a %llu-byte tensor", path, (unsigned long long)most);
    }
    if (s == MT_OK) s = mt_atomic_write(&af, lenb, 8);
    if (s == MT_OK) s = mt_atomic_write(&af, h.p, h.len);
    for (int i = 0; i < n && s == MT_OK; i++) {
        const void *src = t[i].data;
        if (fetch && bytes[i]) {
            s = fetch(ctx, i, scratch, (size_t)bytes[i]);
            src = scratch;
        }
        if (s == MT_OK) s = mt_atomic_write(&af, src, (size_t)bytes[i]);
    }
    free(scratch);
    if (s == MT_OK) s = mt_atomic_commit(&af);
    else mt_atomic_abort(&af);
out:
    free(h.p);
    free(bytes);
    return s;
}
