/* train/tokenizer.c: tokenizer.json and SentencePiece .vocab decoding (tokenizer.h). */
#include "train/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/vocab.h"

/* A byte string (may hold NUL bytes: <0x00> decodes to one). */
typedef struct tbuf {
    char *s;
    size_t n;
} tbuf;

typedef struct tvec {
    tbuf *v;
    size_t n, cap;
} tvec;

typedef enum {
    DEC_BYTE_LEVEL, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_REPLACE, DEC_STRIP, DEC_METASPACE, DEC_WORDPIECE, DEC_BPE,
    DEC_SEQUENCE
} dec_kind;

typedef struct dec {
    dec_kind kind;
    char *a, *b;          /* Replace: pattern, content; Metaspace: replacement; WordPiece: prefix; BPE: suffix */
    int64_t start, stop;  /* Strip */
    int flag;             /* Metaspace: strip on the first token; WordPiece: cleanup */
    struct dec *sub;      /* Sequence */
    int nsub;
} dec;

struct mt_tokenizer {
    int is_json;
    mt_vocab *vocab;      /* .vocab */
    char **tok;           /* tokenizer.json: id -> token (NULL = unknown id) */
    unsigned char *special; /* id -> added special token */
    int64_t n;
    int has_decoder;
    dec decoder;
    int64_t bos;
    char encoder[4096];
};

/* ---------------------------------------------------------------- strings ---- */

static int tv_push(tvec *v, const char *s, size_t n) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        tbuf *p = realloc(v->v, cap * sizeof *p);
        if (!p) return 0;
        v->v = p, v->cap = cap;
    }
    char *c = malloc(n + 1);
    if (!c) return 0;
    if (n) memcpy(c, s, n);
    c[n] = '\0';
    v->v[v->n].s = c, v->v[v->n].n = n;
    v->n++;
    return 1;
}

static void tv_free(tvec *v) {
    for (size_t i = 0; i < v->n; i++) free(v->v[i].s);
    free(v->v);
    memset(v, 0, sizeof *v);
}

/* A growing byte buffer. */
typedef struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const void *p, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->s, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->s = q, b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_cp(sbuf *b, uint32_t cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) u[0] = (unsigned char)cp, n = 1;
    else if (cp < 0x800) u[0] = (unsigned char)(0xC0 | (cp >> 6)), u[1] = (unsigned char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        u[0] = (unsigned char)(0xE0 | (cp >> 12)), u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)),
        u[2] = (unsigned char)(0x80 | (cp & 0x3F)), n = 3;
    else
        u[0] = (unsigned char)(0xF0 | (cp >> 18)), u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F)),
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (unsigned char)(0x80 | (cp & 0x3F)), n = 4;
    sb_add(b, u, n);
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 with *bad = the length of the
 * maximal invalid subpart (Unicode "substitution of maximal subparts", as Rust's
 * String::from_utf8_lossy replaces it by one U+FFFD). */
static size_t utf8_next(const unsigned char *s, size_t n, size_t *bad) {
    const unsigned char b = s[0];
    *bad = 1;
    if (b < 0x80) return 1;
    size_t w;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) w = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        w = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        w = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (n < 2 || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < w; k++) {
        *bad = k;
        if (n <= k || s[k] < 0x80 || s[k] > 0xBF) return 0;
    }
    return w;
}

/* s as UTF-8 with each maximal invalid subpart replaced by U+FFFD (per_byte: each byte
 * that starts no valid sequence, as SentencePiece's decoder does); returns whether it
 * was valid. */
static int utf8_lossy_as(sbuf *out, const char *s, size_t n, int per_byte) {
    const unsigned char *u = (const unsigned char *)s;
    int valid = 1;
    for (size_t i = 0; i < n;) {
        size_t bad, w = utf8_next(u + i, n - i, &bad);
        if (w) {
            sb_add(out, u + i, w);
            i += w;
        } else {
            sb_cp(out, 0xFFFD);
            i += per_byte ? 1 : bad;
            valid = 0;
        }
    }
    return valid;
}

static int utf8_lossy(sbuf *out, const char *s, size_t n) { return utf8_lossy_as(out, s, n, 0); }

/* Code point at s (valid UTF-8, as JSON strings are) and its length. */
static uint32_t cp_at(const char *s, size_t n, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t bad, w = utf8_next(u, n, &bad);
    if (!w) {
        *len = 1;
        return u[0];
    }
    *len = w;
    if (w == 1) return u[0];
    uint32_t cp = u[0] & (w == 2 ? 0x1F : w == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < w; k++) cp = (cp << 6) | (u[k] & 0x3F);
    return cp;
}

/* GPT-2's bytes_to_unicode (openai/gpt-2 src/encoder.py), reversed: code point -> byte
 * for the 256 code points it uses (0..323), -1 elsewhere. */
static int byte_of_cp(uint32_t cp) {
    static int table[324];
    static int ready = 0;
    if (!ready) { /* idempotent: every caller computes the same table */
        for (int i = 0; i < 324; i++) table[i] = -1;
        int n = 0;
        for (int b = 0; b < 256; b++) {
            const int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            if (printable) table[b] = b;
            else table[256 + n++] = b;
        }
        ready = 1;
    }
    return cp < 324 ? table[cp] : -1;
}

/* ---------------------------------------------------------------- decoders ---- */

static int tv_replace_all(tvec *out, const tvec *in) { /* out = in, moved */
    *out = *in;
    return 1;
}

/* Replace every occurrence of pat in s[0..n) by rep, into b. */
static void replace_into(sbuf *b, const char *s, size_t n, const char *pat, const char *rep) {
    const size_t pl = strlen(pat), rl = strlen(rep);
    for (size_t i = 0; i < n;) {
        if (pl && i + pl <= n && memcmp(s + i, pat, pl) == 0) {
            sb_add(b, rep, rl);
            i += pl;
        } else {
            sb_add(b, s + i, 1);
            i++;
        }
    }
}

static const char *const cleanup_pairs[][2] = {
    {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
    {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};

/* Run decoder d over the tokens (huggingface/tokenizers decoders/ (one .rs per decoder) decode_chain);
 * *v is replaced. Returns 0 when out of memory. */
static int dec_run(const dec *d, tvec *v) {
    tvec o = {0};
    sbuf b = {0};
    int ok = 1;
    switch (d->kind) {
    case DEC_SEQUENCE:
        for (int i = 0; i < d->nsub && ok; i++) ok = dec_run(&d->sub[i], v);
        return ok;
    case DEC_BYTE_LEVEL: { /* all tokens' bytes, one lossy UTF-8 string */
        sbuf raw = {0};
        for (size_t i = 0; i < v->n; i++) {
            const tbuf *t = &v->v[i];
            size_t start = raw.n, len;
            int all = 1;
            for (size_t j = 0; j < t->n; j += len) {
                const int by = byte_of_cp(cp_at(t->s + j, t->n - j, &len));
                if (by < 0) {
                    all = 0;
                    break;
                }
                const unsigned char c = (unsigned char)by;
                sb_add(&raw, &c, 1);
            }
            if (!all) { /* a char outside the map: the token's own bytes */
                raw.n = start;
                sb_add(&raw, t->s, t->n);
            }
        }
        utf8_lossy(&b, raw.s ? raw.s : "", raw.n);
        ok = !raw.oom && !b.oom && tv_push(&o, b.s ? b.s : "", b.n);
        free(raw.s);
        break;
    }
    case DEC_BYTE_FALLBACK: {
        sbuf run = {0};
        for (size_t i = 0; i <= v->n && ok; i++) {
            const tbuf *t = i < v->n ? &v->v[i] : NULL;
            unsigned int byte;
            char tail;
            if (t && t->n == 6 && memcmp(t->s, "<0x", 3) == 0 && t->s[5] == '>' &&
                sscanf(t->s + 3, "%2x%c", &byte, &tail) == 2 && tail == '>') {
                const unsigned char c = (unsigned char)byte;
                sb_add(&run, &c, 1);
                continue;
            }
            if (run.n) {
                sbuf chk = {0};
                if (utf8_lossy(&chk, run.s, run.n)) ok = tv_push(&o, run.s, run.n);
                else
                    for (size_t k = 0; k < run.n && ok; k++) ok = tv_push(&o, "\xEF\xBF\xBD", 3);
                free(chk.s);
                run.n = 0;
            }
            if (t && ok) ok = tv_push(&o, t->s, t->n);
        }
        ok = ok && !run.oom;
        free(run.s);
        break;
    }
    case DEC_FUSE:
        for (size_t i = 0; i < v->n; i++) sb_add(&b, v->v[i].s, v->v[i].n);
        ok = !b.oom && tv_push(&o, b.s ? b.s : "", b.n);
        break;
    case DEC_REPLACE:
        for (size_t i = 0; i < v->n && ok; i++) {
            b.n = 0;
            replace_into(&b, v->v[i].s, v->v[i].n, d->a, d->b);
            ok = !b.oom && tv_push(&o, b.s ? b.s : "", b.n);
        }
        break;
    case DEC_STRIP:
        for (size_t i = 0; i < v->n && ok; i++) {
            const tbuf *t = &v->v[i];
            const size_t cl = strlen(d->a);
            size_t s0 = 0, e = t->n;
            for (int64_t k = 0; k < d->start && cl && s0 + cl <= e && memcmp(t->s + s0, d->a, cl) == 0; k++) s0 += cl;
            for (int64_t k = 0; k < d->stop && cl && e >= s0 + cl && memcmp(t->s + e - cl, d->a, cl) == 0; k++) e -= cl;
            ok = tv_push(&o, t->s + s0, e - s0);
        }
        break;
    case DEC_METASPACE:
        for (size_t i = 0; i < v->n && ok; i++) {
            b.n = 0;
            replace_into(&b, v->v[i].s, v->v[i].n, d->a, i == 0 && d->flag ? "" : " ");
            ok = !b.oom && tv_push(&o, b.s ? b.s : "", b.n);
        }
        break;
    case DEC_WORDPIECE:
        for (size_t i = 0; i < v->n && ok; i++) {
            const tbuf *t = &v->v[i];
            const size_t pl = strlen(d->a);
            b.n = 0;
            if (i != 0 && pl && t->n >= pl && memcmp(t->s, d->a, pl) == 0) {
                sb_add(&b, t->s + pl, t->n - pl);
            } else {
                if (i != 0) sb_add(&b, " ", 1);
                sb_add(&b, t->s, t->n);
            }
            for (size_t c = 0; d->flag && c < sizeof cleanup_pairs / sizeof cleanup_pairs[0] && !b.oom; c++) {
                sbuf r = {0};
                replace_into(&r, b.s, b.n, cleanup_pairs[c][0], cleanup_pairs[c][1]);
                if (r.oom) b.oom = 1;
                free(b.s);
                b = r;
                if (!b.s) sb_add(&b, "", 0);
            }
            ok = !b.oom && tv_push(&o, b.s ? b.s : "", b.n);
        }
        break;
    case DEC_BPE:
        for (size_t i = 0; i < v->n && ok; i++) {
            b.n = 0;
            replace_into(&b, v->v[i].s, v->v[i].n, d->a, i + 1 == v->n ? "" : " ");
            ok = !b.oom && tv_push(&o, b.s ? b.s : "", b.n);
        }
        break;
    }
    free(b.s);
    if (!ok) {
        tv_free(&o);
        return 0;
    }
    tv_free(v);
    return tv_replace_all(v, &o);
}

static void dec_free(dec *d) {
    free(d->a);
    free(d->b);
    for (int i = 0; i < d->nsub; i++) dec_free(&d->sub[i]);
    free(d->sub);
    memset(d, 0, sizeof *d);
}

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static mt_status dec_parse(const char *path, const cJSON *j, dec *d) {
    memset(d, 0, sizeof *d);
    const char *type = jstr(j, "type");
    if (!type) return mt_set_error(MT_ERR_FORMAT, "%s: a decoder without a \"type\"", path);
#define DUP(dst, src)                                                                  \
    do {                                                                               \
        if (!((dst) = strdup(src))) return mt_set_error(MT_ERR_OOM, "tokenizer: out of memory"); \
    } while (0)
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "decoders");
        if (!cJSON_IsArray(arr)) return mt_set_error(MT_ERR_FORMAT, "%s: Sequence decoder without \"decoders\"", path);
        d->kind = DEC_SEQUENCE;
        const int n = cJSON_GetArraySize(arr);
        d->sub = calloc((size_t)(n ? n : 1), sizeof *d->sub);
        if (!d->sub) return mt_set_error(MT_ERR_OOM, "tokenizer: out of memory");
        for (int i = 0; i < n; i++) {
            mt_status st = dec_parse(path, cJSON_GetArrayItem(arr, i), &d->sub[i]);
            d->nsub = i + 1;
            if (st != MT_OK) return st;
        }
    } else if (strcmp(type, "ByteLevel") == 0) {
        d->kind = DEC_BYTE_LEVEL;
    } else if (strcmp(type, "ByteFallback") == 0) {
        d->kind = DEC_BYTE_FALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        d->kind = DEC_FUSE;
    } else if (strcmp(type, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const char *p = jstr(pat, "String"), *c = jstr(j, "content");
        if (!p || !c)
            return mt_set_error(MT_ERR_UNSUPPORTED, "%s: a Replace decoder with a %s pattern (only a string pattern "
                                "is decoded here)", path, jstr(pat, "Regex") ? "regex" : "missing");
        d->kind = DEC_REPLACE;
        DUP(d->a, p);
        DUP(d->b, c);
    } else if (strcmp(type, "Strip") == 0) {
        const char *c = jstr(j, "content");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "start"), *e = cJSON_GetObjectItemCaseSensitive(j, "stop");
        if (!c || !cJSON_IsNumber(s) || !cJSON_IsNumber(e))
            return mt_set_error(MT_ERR_FORMAT, "%s: a Strip decoder needs content, start and stop", path);
        d->kind = DEC_STRIP;
        DUP(d->a, c);
        d->start = (int64_t)s->valuedouble, d->stop = (int64_t)e->valuedouble;
    } else if (strcmp(type, "Metaspace") == 0) {
        const char *r = jstr(j, "replacement"), *scheme = jstr(j, "prepend_scheme");
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
        d->kind = DEC_METASPACE;
        DUP(d->a, r ? r : "\xE2\x96\x81");
        /* prepend_scheme never (or the older add_prefix_space false) keeps the first space */
        d->flag = scheme ? strcmp(scheme, "never") != 0 : !(aps && cJSON_IsFalse(aps));
    } else if (strcmp(type, "WordPiece") == 0) {
        const char *p = jstr(j, "prefix");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "cleanup");
        d->kind = DEC_WORDPIECE;
        DUP(d->a, p ? p : "##");
        d->flag = !(c && cJSON_IsFalse(c));
    } else if (strcmp(type, "BPEDecoder") == 0) {
        const char *s = jstr(j, "suffix");
        d->kind = DEC_BPE;
        DUP(d->a, s ? s : "</w>");
    } else {
        return mt_set_error(MT_ERR_UNSUPPORTED, "%s: decoder type '%s' is not supported by meshtrain's decoder "
                            "(ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace, WordPiece, BPEDecoder, "
                            "Sequence)", path, type);
    }
#undef DUP
    return MT_OK;
}

/* ---------------------------------------------------------------- loading ---- */

void mt_tokenizer_free(mt_tokenizer *t) {
    if (!t) return;
    mt_vocab_free(t->vocab);
    for (int64_t i = 0; t->tok && i < t->n; i++) free(t->tok[i]);
    free(t->tok);
    free(t->special);
    if (t->has_decoder) dec_free(&t->decoder);
    free(t);
}

static int ends_with(const char *s, const char *suf) {
    const size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static mt_status read_all(const char *path, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return mt_set_error(MT_ERR_IO, "cannot open tokenizer '%s': %s", path, strerror(errno));
    sbuf b = {0};
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) sb_add(&b, chunk, got);
    const int err = ferror(f);
    fclose(f);
    if (err) {
        free(b.s);
        return mt_set_error(MT_ERR_IO, "cannot read tokenizer '%s'", path);
    }
    if (b.oom) {
        free(b.s);
        return mt_set_error(MT_ERR_OOM, "tokenizer '%s': out of memory", path);
    }
    if (!b.s) sb_add(&b, "", 0);
    *out = b.s;
    return MT_OK;
}

/* Set id -> token (the added table wins over model.vocab, as in tokenizers). */
static mt_status set_token(mt_tokenizer *t, const char *path, int64_t id, const char *tok, int special) {
    if (id < 0 || id > INT32_MAX)
        return mt_set_error(MT_ERR_FORMAT, "%s: token '%s' has id %lld, outside [0, 2^31)", path, tok, (long long)id);
    if (id >= t->n) {
        int64_t cap = t->n ? t->n : 1024;
        while (cap <= id) cap *= 2;
        char **p = realloc(t->tok, sizeof(char *) * (size_t)cap);
        if (!p) return mt_set_error(MT_ERR_OOM, "tokenizer: out of memory");
        t->tok = p;
        unsigned char *s = realloc(t->special, (size_t)cap);
        if (!s) return mt_set_error(MT_ERR_OOM, "tokenizer: out of memory");
        t->special = s;
        for (int64_t i = t->n; i < cap; i++) t->tok[i] = NULL, t->special[i] = 0;
        t->n = cap;
    }
    char *c = strdup(tok);
    if (!c) return mt_set_error(MT_ERR_OOM, "tokenizer: out of memory");
    free(t->tok[id]);
    t->tok[id] = c;
    t->special[id] = (unsigned char)(special != 0);
    return MT_OK;
}

static int64_t find_token(const mt_tokenizer *t, const char *tok) {
    for (int64_t i = 0; i < t->n; i++)
        if (t->tok[i] && strcmp(t->tok[i], tok) == 0) return i;
    return -1;
}

/* BOS from a post_processor (header comment); -1 when it names none. */
static int64_t post_bos(const mt_tokenizer *t, const cJSON *pp) {
    const char *type = jstr(pp, "type");
    if (!type) return -1;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(pp, "processors"), *p;
        cJSON_ArrayForEach(p, arr) {
            const int64_t b = post_bos(t, p);
            if (b >= 0) return b;
        }
        return -1;
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pp, "single"), 0);
        const char *name = jstr(cJSON_GetObjectItemCaseSensitive(first, "SpecialToken"), "id");
        if (!name) return -1;
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pp, "special_tokens"), name);
        const cJSON *id = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sp, "ids"), 0);
        return cJSON_IsNumber(id) ? (int64_t)id->valuedouble : find_token(t, name);
    }
    if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0) {
        const cJSON *id = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pp, "cls"), 1);
        return cJSON_IsNumber(id) ? (int64_t)id->valuedouble : -1;
    }
    return -1;
}

static mt_status load_json(mt_tokenizer *t, const char *path) {
    char *text;
    MT_TRY(read_all(path, &text));
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return mt_set_error(MT_ERR_FORMAT, "%s: not JSON (a Hugging Face tokenizer.json is)", path);
    mt_status st = MT_OK;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *e;
    if (cJSON_IsObject(vocab)) { /* BPE, WordPiece, WordLevel: token -> id */
        cJSON_ArrayForEach(e, vocab) {
            if (!cJSON_IsNumber(e)) {
                st = mt_set_error(MT_ERR_FORMAT, "%s: model.vocab['%s'] is not an id", path, e->string);
                break;
            }
            if ((st = set_token(t, path, (int64_t)e->valuedouble, e->string, 0)) != MT_OK) break;
        }
    } else if (cJSON_IsArray(vocab)) { /* Unigram: [[piece, score], ...], id = index */
        int64_t id = 0;
        cJSON_ArrayForEach(e, vocab) {
            const cJSON *p = cJSON_GetArrayItem(e, 0);
            if (!cJSON_IsString(p)) {
                st = mt_set_error(MT_ERR_FORMAT, "%s: model.vocab[%lld] is not [piece, score]", path, (long long)id);
                break;
            }
            if ((st = set_token(t, path, id++, p->valuestring, 0)) != MT_OK) break;
        }
    } else {
        st = mt_set_error(MT_ERR_FORMAT, "%s: no model.vocab (not a Hugging Face tokenizer.json)", path);
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    cJSON_ArrayForEach(e, added) {
        if (st != MT_OK) break;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const char *content = jstr(e, "content");
        if (!cJSON_IsNumber(id) || !content) {
            st = mt_set_error(MT_ERR_FORMAT, "%s: an added_tokens entry without id or content", path);
            break;
        }
        st = set_token(t, path, (int64_t)id->valuedouble, content,
                       cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special")));
    }
    if (st == MT_OK) { /* the table's size: 1 + the largest id */
        int64_t n = t->n;
        while (n > 0 && !t->tok[n - 1]) n--;
        for (int64_t i = n; i < t->n; i++) free(t->tok[i]);
        t->n = n;
        if (n == 0) st = mt_set_error(MT_ERR_FORMAT, "%s: empty vocabulary", path);
    }
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (st == MT_OK && d && !cJSON_IsNull(d)) {
        t->has_decoder = 1;
        st = dec_parse(path, d, &t->decoder);
    }
    if (st == MT_OK) {
        t->bos = post_bos(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
        static const char *const names[] = {"<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>", NULL};
        for (int i = 0; names[i] && t->bos < 0; i++) {
            const int64_t id = find_token(t, names[i]);
            if (id >= 0 && t->special[id]) t->bos = id;
        }
        if (t->bos >= t->n) t->bos = -1;
    }
    cJSON_Delete(root);
    return st;
}

mt_status mt_tokenizer_load(mt_tokenizer **out, const char *path) {
    *out = NULL;
    mt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return mt_set_error(MT_ERR_OOM, "tokenizer: out of memory");
    t->bos = -1;
    struct stat sb;
    char file[4096];
    snprintf(file, sizeof file, "%s", path);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        if (stat(file, &sb) != 0) {
            free(t);
            return mt_set_error(MT_ERR_IO, "tokenizer '%s' is a directory without a tokenizer.json", path);
        }
    }
    mt_status st;
    if (ends_with(file, ".vocab")) {
        st = mt_vocab_load(&t->vocab, file);
        if (st == MT_OK) {
            t->n = mt_vocab_size(t->vocab);
            t->bos = mt_vocab_find(t->vocab, "<s>");
            snprintf(t->encoder, sizeof t->encoder, "%.*s.model", (int)(strlen(file) - 6), file);
        }
    } else {
        t->is_json = 1;
        st = load_json(t, file);
        snprintf(t->encoder, sizeof t->encoder, "%s", file);
    }
    if (st != MT_OK) {
        mt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MT_OK;
}

int64_t mt_tokenizer_size(const mt_tokenizer *t) { return t->n; }
int64_t mt_tokenizer_bos(const mt_tokenizer *t) { return t->bos; }
const char *mt_tokenizer_kind(const mt_tokenizer *t) { return t->is_json ? "tokenizer.json" : "sentencepiece"; }
const char *mt_tokenizer_encoder_path(const mt_tokenizer *t) { return t->encoder; }

int mt_tokenizer_is_stop(const mt_tokenizer *t, int64_t id) {
    if (id < 0 || id >= t->n) return 0;
    if (!t->is_json) {
        const char *p = mt_vocab_piece(t->vocab, id);
        return p && strcmp(p, "</s>") == 0;
    }
    return t->special[id];
}

/* .vocab: as sentencepiece's DecodeIds (sentencepiece_processor.cc): pieces with U+2581
 * as ' ', <s> </s> <pad> skipped, <unk> as " \u2047 ", the dummy prefix (a leading
 * U+2581 while nothing is output yet) dropped, and runs of <0xNN> byte pieces (spm
 * byte_fallback) as UTF-8 bytes, U+FFFD for each byte that starts no valid sequence
 * (sentencepiece's DecodeIds). */
static mt_status decode_vocab(const mt_tokenizer *t, const int32_t *ids, int64_t n, char **text) {
    sbuf out = {0}, bytes = {0};
    for (int64_t i = 0; i <= n; i++) {
        const char *p = i < n ? mt_vocab_piece(t->vocab, ids[i]) : NULL;
        unsigned int byte;
        char tail;
        if (p && strlen(p) == 6 && sscanf(p, "<0x%2x%c", &byte, &tail) == 2 && tail == '>') {
            const unsigned char c = (unsigned char)byte;
            sb_add(&bytes, &c, 1);
            continue;
        }
        if (bytes.n) {
            utf8_lossy_as(&out, bytes.s, bytes.n, 1);
            bytes.n = 0;
        }
        if (!p || strcmp(p, "<s>") == 0 || strcmp(p, "</s>") == 0 || strcmp(p, "<pad>") == 0) continue;
        if (strcmp(p, "<unk>") == 0) { /* sentencepiece's unk_surface */
            sb_add(&out, " \xE2\x81\x87 ", 5);
            continue;
        }
        if (out.n == 0 && strncmp(p, "\xE2\x96\x81", 3) == 0) p += 3; /* the dummy prefix, while nothing is out */
        replace_into(&out, p, strlen(p), "\xE2\x96\x81", " ");
    }
    free(bytes.s);
    if (!out.s) sb_add(&out, "", 0);
    if (out.oom || bytes.oom) {
        free(out.s);
        return mt_set_error(MT_ERR_OOM, "tokenizer: out of memory");
    }
    *text = out.s;
    return MT_OK;
}

mt_status mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, int64_t n, char **text) {
    *text = NULL;
    if (!t->is_json) return decode_vocab(t, ids, n, text);
    tvec v = {0};
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        const int64_t id = ids[i];
        if (id < 0 || id >= t->n || !t->tok[id] || t->special[id]) continue; /* skip_special_tokens=True */
        ok = tv_push(&v, t->tok[id], strlen(t->tok[id]));
    }
    sbuf out = {0};
    if (ok && t->has_decoder) ok = dec_run(&t->decoder, &v);
    for (size_t i = 0; ok && i < v.n; i++) {
        if (!t->has_decoder && i) sb_add(&out, " ", 1);
        sb_add(&out, v.v[i].s, v.v[i].n);
    }
    tv_free(&v);
    if (ok && !out.s) sb_add(&out, "", 0);
    if (!ok || out.oom) {
        free(out.s);
        return mt_set_error(MT_ERR_OOM, "tokenizer: out of memory");
    }
    *text = out.s;
    return MT_OK;
}
