/* train/vocab.c: a SentencePiece .vocab file, read and decoded (see vocab.h). */
#include "train/vocab.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mt_vocab {
    char **pieces;
    int64_t n;
};

void mt_vocab_free(mt_vocab *v) {
    if (!v) return;
    for (int64_t i = 0; i < v->n; i++) free(v->pieces[i]);
    free(v->pieces);
    free(v);
}

mt_status mt_vocab_load(mt_vocab **out, const char *path) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return mt_set_error(MT_ERR_IO, "cannot open tokenizer vocab '%s': %s", path, strerror(errno));
    mt_vocab *v = calloc(1, sizeof *v);
    if (!v) {
        fclose(f);
        return mt_set_error(MT_ERR_OOM, "vocab: out of memory");
    }
    int64_t cap = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    mt_status st = MT_OK;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        char *tab = strchr(line, '\t');
        if (!tab) {
            st = mt_set_error(MT_ERR_FORMAT, "%s:%lld: expected 'piece<TAB>score'", path, (long long)v->n + 1);
            break;
        }
        *tab = '\0';
        if (v->n == cap) {
            cap = cap ? cap * 2 : 1024;
            char **p = realloc(v->pieces, sizeof(char *) * (size_t)cap);
            if (!p) {
                st = mt_set_error(MT_ERR_OOM, "vocab: out of memory");
                break;
            }
            v->pieces = p;
        }
        if (!(v->pieces[v->n] = strdup(line))) {
            st = mt_set_error(MT_ERR_OOM, "vocab: out of memory");
            break;
        }
        v->n++;
    }
    free(line);
    fclose(f);
    if (st == MT_OK && v->n == 0) st = mt_set_error(MT_ERR_FORMAT, "%s: empty vocabulary", path);
    if (st != MT_OK) {
        mt_vocab_free(v);
        return st;
    }
    *out = v;
    return MT_OK;
}

int64_t mt_vocab_size(const mt_vocab *v) { return v->n; }

const char *mt_vocab_piece(const mt_vocab *v, int64_t id) { return id >= 0 && id < v->n ? v->pieces[id] : NULL; }

int64_t mt_vocab_find(const mt_vocab *v, const char *piece) {
    for (int64_t i = 0; i < v->n; i++)
        if (strcmp(v->pieces[i], piece) == 0) return i;
    return -1;
}

static int is_control(const char *p) {
    return strcmp(p, "<s>") == 0 || strcmp(p, "</s>") == 0 || strcmp(p, "<unk>") == 0 || strcmp(p, "<pad>") == 0;
}

mt_status mt_vocab_decode(const mt_vocab *v, const int32_t *ids, int64_t n, char **text) {
    size_t total = 1;
    for (int64_t i = 0; i < n; i++) {
        const char *p = mt_vocab_piece(v, ids[i]);
        if (p) total += strlen(p);
    }
    char *s = malloc(total);
    if (!s) return mt_set_error(MT_ERR_OOM, "vocab: out of memory");
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *p = mt_vocab_piece(v, ids[i]);
        if (!p || is_control(p)) continue;
        for (size_t j = 0; p[j];) {
            /* U+2581 is E2 96 81 in UTF-8. */
            if ((unsigned char)p[j] == 0xE2 && (unsigned char)p[j + 1] == 0x96 && (unsigned char)p[j + 2] == 0x81) {
                s[k++] = ' ';
                j += 3;
            } else {
                s[k++] = p[j++];
            }
        }
    }
    s[k] = '\0';
    if (s[0] == ' ') memmove(s, s + 1, k); /* SentencePiece's dummy prefix */
    *text = s;
    return MT_OK;
}
