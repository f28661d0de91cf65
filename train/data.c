/* train/data.c: llm.c token shards, memory-mapped, found by meshtrain's or llm.c's
 * names, a glob or a list, and read in llm.c's DataLoader order (karpathy/llm.c
 * llmc/dataloader.h: dataloader_next_batch, dataloader_advance_, and the per-epoch
 * permutations of shards and of samples within a shard that it draws when shuffling).
 * Here the permutations come from Philox (runtime/rng.h), so the order of any
 * (epoch, shard) is a pure function of the seed: seeking needs no replay. */
#include "train/data.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "runtime/rng.h"

/* Philox streams of the shuffle (tag in the top 16 bits, epoch below): the shard
 * order of epoch e draws (seed, SHARDS | e, i); the unit order of shard s in epoch e
 * draws (seed, UNITS | e, s << 40 | i). */
#define DATA_STREAM_SHARDS (0x4453ull << 48) /* "DS" */
#define DATA_STREAM_UNITS (0x4455ull << 48)  /* "DU" */
#define DATA_MAX_EPOCH ((int64_t)1 << 48)
#define DATA_MAX_SHUFFLED_SHARDS ((int64_t)1 << 24)

typedef struct data_shard {
    char *path;
    const unsigned char *map; /* whole file, PROT_READ */
    size_t map_bytes;
    int64_t count;            /* tokens */
    int width;                /* 2 or 4 bytes per token */
} data_shard;

struct mt_data_loader {
    data_shard *shards;       /* in natural order of their paths (or list order) */
    int64_t nshards;
    int64_t batch, seq;
    int rank, world;
    int64_t window;           /* world * batch * seq: tokens consumed per mt_data_next */
    int64_t unit;             /* tokens of one unit: window x micro_batches when shuffling, else window */
    int shuffle;
    uint64_t seed;
    mt_data_position pos;     /* logical: slot in the epoch's shard order, offset in unit order */
    int64_t max_token;        /* -1 until computed */
    int64_t *shard_order;     /* shuffle: slot -> shard, for epoch order_epoch (-1: not drawn) */
    int64_t order_epoch;
    int64_t *unit_order;      /* shuffle: k -> unit of shard units_shard in epoch units_epoch */
    int64_t units_epoch, units_shard;
};

/* ------------------------------------------------------------ file lists ---- */

typedef struct data_names {
    char **v;
    size_t n, cap;
} data_names;

static void data_names_free(data_names *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static mt_status data_names_push(data_names *l, const char *a, const char *b) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        char **p = realloc(l->v, cap * sizeof *p);
        if (!p) return mt_set_error(MT_ERR_OOM, "data: out of memory");
        l->v = p;
        l->cap = cap;
    }
    size_t la = strlen(a), lb = b ? strlen(b) : 0;
    char *s = malloc(la + lb + 2);
    if (!s) return mt_set_error(MT_ERR_OOM, "data: out of memory");
    memcpy(s, a, la);
    if (b) {
        s[la] = '/';
        memcpy(s + la + 1, b, lb + 1);
    } else {
        s[la] = '\0';
    }
    l->v[l->n++] = s;
    return MT_OK;
}

/* Natural order: runs of digits compare by value (shard_2 < shard_10), the rest
 * bytewise; equal values with different zero padding fall back to strcmp. */
static int data_natural_cmp(const char *a, const char *b) {
    const char *p = a, *q = b;
    while (*p && *q) {
        if (isdigit((unsigned char)*p) && isdigit((unsigned char)*q)) {
            while (*p == '0' && isdigit((unsigned char)p[1])) p++;
            while (*q == '0' && isdigit((unsigned char)q[1])) q++;
            size_t lp = 0, lq = 0;
            while (isdigit((unsigned char)p[lp])) lp++;
            while (isdigit((unsigned char)q[lq])) lq++;
            if (lp != lq) return lp < lq ? -1 : 1;
            int c = strncmp(p, q, lp);
            if (c) return c;
            p += lp;
            q += lq;
        } else {
            if (*p != *q) return (unsigned char)*p < (unsigned char)*q ? -1 : 1;
            p++;
            q++;
        }
    }
    if (*p || *q) return *p ? 1 : -1;
    return strcmp(a, b);
}

static int data_natural_qsort(const void *a, const void *b) {
    return data_natural_cmp(*(char *const *)a, *(char *const *)b);
}

static int data_strcmp_qsort(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static const char *data_base(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int data_has_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

static int data_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Which naming a file's base name follows for `split`: 1 = <split>_*.bin (meshtrain),
 * 2 = <name>_<split>_*.bin or <name>_<split>.bin (llm.c's dev/data scripts), 0 = none. */
static int data_split_kind(const char *base, const char *split) {
    const size_t len = strlen(base), pl = strlen(split);
    if (len < 5 || strcmp(base + len - 4, ".bin") != 0) return 0;
    if (len >= pl + 5 && strncmp(base, split, pl) == 0 && base[pl] == '_') return 1;
    for (const char *q = strchr(base + 1, '_'); q; q = strchr(q + 1, '_')) {
        if (strncmp(q + 1, split, pl) != 0) continue;
        const char *after = q + 1 + pl;
        if ((*after == '_' && after < base + len - 4) || strcmp(after, ".bin") == 0) return 2;
    }
    return 0;
}

/* Expand a glob into out, in natural order, regular files only. *matched = count. */
static mt_status data_glob(const char *pattern, data_names *out, size_t *matched) {
    glob_t g;
    *matched = 0;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) return MT_OK;
    if (rc != 0) {
        if (rc != GLOB_NOSPACE) globfree(&g);
        return mt_set_error(rc == GLOB_NOSPACE ? MT_ERR_OOM : MT_ERR_IO, "%s: cannot expand the pattern (%s)",
                            pattern, rc == GLOB_NOSPACE ? "out of memory" : "read error");
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, data_natural_qsort);
    mt_status s = MT_OK;
    for (size_t i = 0; i < g.gl_pathc && s == MT_OK; i++) {
        if (!data_is_file(g.gl_pathv[i])) continue;
        s = data_names_push(out, g.gl_pathv[i], NULL);
        if (s == MT_OK) (*matched)++;
    }
    globfree(&g);
    return s;
}

/* The split's shards in dataset_path (a directory, a glob or one file): the files of
 * one naming (data_split_kind), in natural order. Both namings present is an error
 * naming a file of each. */
static mt_status data_find_split(const char *dataset_path, const char *split, data_names *out) {
    data_names cand = {0};
    mt_status s = MT_OK;
    DIR *dir = opendir(dataset_path);
    const int is_dir = dir != NULL, dir_errno = errno;
    if (dir) {
        for (struct dirent *e; s == MT_OK && (e = readdir(dir));)
            if (data_split_kind(e->d_name, split)) s = data_names_push(&cand, dataset_path, e->d_name);
        closedir(dir);
    } else if (data_has_glob(dataset_path) || data_is_file(dataset_path)) {
        size_t m;
        s = data_glob(dataset_path, &cand, &m);
    } else {
        return mt_set_error(MT_ERR_IO, "%s: cannot open dataset directory (looking for %s_*.bin or *_%s_*.bin): %s",
                            dataset_path, split, split, strerror(dir_errno));
    }
    if (s == MT_OK) qsort(cand.v, cand.n, sizeof *cand.v, data_natural_qsort);
    const char *first[3] = {NULL, NULL, NULL};
    for (size_t i = 0; s == MT_OK && i < cand.n; i++) {
        const int k = data_split_kind(data_base(cand.v[i]), split);
        if (k && !first[k]) first[k] = cand.v[i];
    }
    if (s == MT_OK && first[1] && first[2])
        s = mt_set_error(MT_ERR_INVALID,
                         "key 'dataset_path' = '%s': ambiguous %s split: '%s' is named %s_*.bin and '%s' is "
                         "named *_%s_*.bin (llm.c's naming); keep one naming there, or list the shards in %s",
                         dataset_path, split, data_base(first[1]), split, data_base(first[2]), split,
                         strcmp(split, "train") == 0 ? "train_files" : "eval_files");
    if (s == MT_OK && !first[1] && !first[2])
        s = is_dir ? mt_set_error(MT_ERR_IO, "%s: no shard matches %s/%s_*.bin or %s/*_%s_*.bin", dataset_path,
                                  dataset_path, split, dataset_path, split)
                   : mt_set_error(MT_ERR_IO, "key 'dataset_path' = '%s': no file it matches is named %s_*.bin "
                                  "or *_%s_*.bin", dataset_path, split, split);
    for (size_t i = 0; s == MT_OK && i < cand.n; i++)
        if (data_split_kind(data_base(cand.v[i]), split)) s = data_names_push(out, cand.v[i], NULL);
    data_names_free(&cand);
    return s;
}

/* The shards an explicit list names: "[a, b]" (YAML) or "a,b", each a file or a glob
 * (matches in natural order), in list order. A glob matching nothing, a missing file
 * and a file named twice are errors naming `key`. */
static mt_status data_find_files(const char *files, const char *key, data_names *out) {
    const size_t len = strlen(files);
    char *buf = malloc(len + 1);
    if (!buf) return mt_set_error(MT_ERR_OOM, "data: out of memory");
    memcpy(buf, files, len + 1);
    char *p = buf, *end = buf + len;
    while (p < end && isspace((unsigned char)*p)) p++;
    while (end > p && isspace((unsigned char)end[-1])) *--end = '\0';
    if (*p == '[' && end > p && end[-1] == ']') {
        *--end = '\0';
        p++;
    }
    mt_status s = MT_OK;
    for (char *item = p; s == MT_OK && item;) {
        char *comma = strchr(item, ',');
        if (comma) *comma = '\0';
        while (isspace((unsigned char)*item) || *item == '"' || *item == '\'') item++;
        size_t il = strlen(item);
        while (il && (isspace((unsigned char)item[il - 1]) || item[il - 1] == '"' || item[il - 1] == '\''))
            item[--il] = '\0';
        if (il == 0) {
            s = mt_set_error(MT_ERR_INVALID, "key '%s' = '%s': an empty entry (give files or globs separated "
                             "by commas)", key, files);
        } else if (data_has_glob(item)) {
            size_t m;
            s = data_glob(item, out, &m);
            if (s == MT_OK && m == 0)
                s = mt_set_error(MT_ERR_IO, "key '%s': '%s' matches no file", key, item);
        } else if (!data_is_file(item)) {
            struct stat st;
            s = stat(item, &st) == 0
                    ? mt_set_error(MT_ERR_INVALID, "key '%s': '%s' is not a shard file (a directory? give a glob "
                                   "such as %s/*_train_*.bin)", key, item, item)
                    : mt_set_error(MT_ERR_IO, "key '%s': '%s': %s", key, item, strerror(errno));
        } else {
            s = data_names_push(out, item, NULL);
        }
        item = comma ? comma + 1 : NULL;
    }
    free(buf);
    if (s != MT_OK) return s;
    /* a file named twice (two overlapping globs) would be read twice per epoch */
    char **sorted = malloc((out->n ? out->n : 1) * sizeof *sorted);
    if (!sorted) return mt_set_error(MT_ERR_OOM, "data: out of memory");
    memcpy(sorted, out->v, out->n * sizeof *sorted);
    qsort(sorted, out->n, sizeof *sorted, data_strcmp_qsort);
    for (size_t i = 1; i < out->n && s == MT_OK; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0)
            s = mt_set_error(MT_ERR_INVALID, "key '%s': '%s' is named twice (overlapping entries of '%s')", key,
                             sorted[i], files);
    free(sorted);
    return s;
}

/* ---------------------------------------------------------------- shuffle ---- */

/* High 64 bits of a * b. */
static uint64_t data_mulhi(uint64_t a, uint64_t b) {
    const uint64_t al = (uint32_t)a, ah = a >> 32, bl = (uint32_t)b, bh = b >> 32;
    const uint64_t p0 = al * bl, p1 = al * bh, p2 = ah * bl, p3 = ah * bh;
    const uint64_t mid = (p0 >> 32) + (uint32_t)p1 + (uint32_t)p2;
    return p3 + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
}

/* perm[0..n) = a permutation of 0..n-1: Fisher-Yates (Knuth, TAOCP 3.4.2 Algorithm P),
 * the swap partner of i drawn as floor(u64 * (i + 1) / 2^64) from Philox word pair
 * (seed, stream, base + i) (bias below n / 2^64). */
static void data_permute(int64_t *perm, int64_t n, uint64_t seed, uint64_t stream, uint64_t base) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t w[4];
        mt_rng_u32x4(seed, stream, base + (uint64_t)i, w);
        const uint64_t x = (uint64_t)w[0] | (uint64_t)w[1] << 32;
        const int64_t j = (int64_t)data_mulhi(x, (uint64_t)i + 1);
        const int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static int64_t data_units(const mt_data_loader *d, int64_t shard) {
    return (d->shards[shard].count - 1) / d->unit;
}

/* The shard at `slot` of epoch `epoch`'s order. */
static int64_t data_shard_at(mt_data_loader *d, int64_t epoch, int64_t slot) {
    if (!d->shuffle) return slot;
    if (d->order_epoch != epoch) {
        data_permute(d->shard_order, d->nshards, d->seed, DATA_STREAM_SHARDS | (uint64_t)epoch, 0);
        d->order_epoch = epoch;
    }
    return d->shard_order[slot];
}

/* The unit read k-th from shard `shard` in epoch `epoch`. */
static int64_t data_unit_at(mt_data_loader *d, int64_t epoch, int64_t shard, int64_t k) {
    if (!d->shuffle) return k;
    if (d->units_epoch != epoch || d->units_shard != shard) {
        data_permute(d->unit_order, data_units(d, shard), d->seed, DATA_STREAM_UNITS | (uint64_t)epoch,
                     (uint64_t)shard << 40);
        d->units_epoch = epoch;
        d->units_shard = shard;
    }
    return d->unit_order[k];
}

/* ------------------------------------------------------------------ shards ---- */

/* Map one shard and check its header and size. */
static mt_status data_map_shard(data_shard *sh, int64_t need, const char *need_what) {
    int fd = open(sh->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_set_error(MT_ERR_IO, "%s: cannot open: %s", sh->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return mt_set_error(MT_ERR_IO, "%s: not a regular file", sh->path);
    }
    int64_t size = (int64_t)st.st_size;
    int64_t hbytes = MT_DATA_HEADER_INTS * 4;
    if (size < hbytes) {
        close(fd);
        return mt_set_error(MT_ERR_FORMAT, "%s: truncated: %lld bytes, shorter than the %lld-byte llm.c header",
                            sh->path, (long long)size, (long long)hbytes);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return mt_set_error(MT_ERR_IO, "%s: mmap failed: %s", sh->path, strerror(errno));
    sh->map = map;
    sh->map_bytes = (size_t)size;
    int32_t hdr[3];
    memcpy(hdr, map, sizeof hdr);
    if (hdr[0] == MT_DATA_MAGIC_U16) {
        if (hdr[1] != MT_DATA_VERSION_U16)
            return mt_set_error(MT_ERR_FORMAT, "%s: magic %d needs version %d, found version %d", sh->path,
                                (int)hdr[0], MT_DATA_VERSION_U16, (int)hdr[1]);
        sh->width = 2;
    } else if (hdr[0] == MT_DATA_MAGIC_U32) {
        if (hdr[1] != MT_DATA_VERSION_U32)
            return mt_set_error(MT_ERR_FORMAT, "%s: magic %d needs version %d, found version %d", sh->path,
                                (int)hdr[0], MT_DATA_VERSION_U32, (int)hdr[1]);
        sh->width = 4;
    } else {
        return mt_set_error(MT_ERR_FORMAT, "%s: bad magic %d (llm.c shards have %d with uint16 or %d with uint32 tokens)",
                            sh->path, (int)hdr[0], MT_DATA_MAGIC_U16, MT_DATA_MAGIC_U32);
    }
    if (hdr[2] < 0)
        return mt_set_error(MT_ERR_FORMAT, "%s: negative token count %d in the header", sh->path, (int)hdr[2]);
    sh->count = hdr[2];
    int64_t expect = hbytes + sh->count * sh->width;
    if (size != expect)
        return mt_set_error(MT_ERR_FORMAT, "%s: file is %lld bytes but the header's %lld tokens of %d bytes need %lld",
                            sh->path, (long long)size, (long long)sh->count, sh->width, (long long)expect);
    if (sh->count < need)
        return mt_set_error(MT_ERR_FORMAT,
                            "%s: %lld tokens, fewer than one step's window of %lld (%s + 1)",
                            sh->path, (long long)sh->count, (long long)need, need_what);
    return MT_OK;
}

mt_status mt_data_open(mt_data_loader **out, const char *dataset_path, const char *split, int64_t batch,
                       int64_t seq, int rank, int world) {
    return mt_data_open_ex(out, dataset_path, split, NULL, batch, seq, rank, world);
}

mt_status mt_data_open_ex(mt_data_loader **out, const char *dataset_path, const char *split,
                          const mt_data_options *opt, int64_t batch, int64_t seq, int rank, int world) {
    *out = NULL;
    const mt_data_options none = {NULL, NULL, 0, 0, 1};
    if (!opt) opt = &none;
    const int listed = opt->files && opt->files[0];
    if ((!listed && !dataset_path) || !split || !*split || strchr(split, '/'))
        return mt_set_error(MT_ERR_INVALID, "data: bad dataset path or split name");
    if (batch < 1 || seq < 1 || world < 1 || rank < 0 || rank >= world)
        return mt_set_error(MT_ERR_INVALID, "data: need batch >= 1, seq >= 1, 0 <= rank < world (got %lld, %lld, %d, %d)",
                            (long long)batch, (long long)seq, rank, world);
    if (opt->micro_batches < 1)
        return mt_set_error(MT_ERR_INVALID, "data: micro_batches = %lld, must be >= 1", (long long)opt->micro_batches);
    const int64_t mb = opt->shuffle ? opt->micro_batches : 1;
    if (batch > INT64_MAX / seq || batch * seq > (INT64_MAX - 1) / world / mb)
        return mt_set_error(MT_ERR_INVALID, "data: batch x seq x world overflows");

    data_names names = {0};
    mt_status s = listed ? data_find_files(opt->files, opt->files_key ? opt->files_key : "files", &names)
                         : data_find_split(dataset_path, split, &names);
    if (s == MT_OK && opt->shuffle && (int64_t)names.n > DATA_MAX_SHUFFLED_SHARDS)
        s = mt_set_error(MT_ERR_INVALID, "data: %zu shards in the %s split; shuffling takes at most %lld",
                         names.n, split, (long long)DATA_MAX_SHUFFLED_SHARDS);
    if (s != MT_OK) {
        data_names_free(&names);
        return s;
    }

    mt_data_loader *d = calloc(1, sizeof *d);
    if (!d || !(d->shards = calloc(names.n, sizeof *d->shards))) {
        free(d);
        data_names_free(&names);
        return mt_set_error(MT_ERR_OOM, "data: out of memory");
    }
    d->nshards = (int64_t)names.n;
    d->batch = batch;
    d->seq = seq;
    d->rank = rank;
    d->world = world;
    d->window = (int64_t)world * batch * seq;
    d->unit = d->window * mb;
    d->shuffle = opt->shuffle != 0;
    d->seed = opt->shuffle_seed;
    d->max_token = -1;
    d->order_epoch = d->units_epoch = d->units_shard = -1;
    const char *what = mb > 1 ? "world x batch x seq x gradient_accumulation_steps" : "world x batch x seq";
    int64_t most = 0;
    for (size_t i = 0; i < names.n && s == MT_OK; i++) {
        d->shards[i].path = names.v[i];
        names.v[i] = NULL; /* owned by the shard now */
        s = data_map_shard(&d->shards[i], d->unit + 1, what);
        if (s == MT_OK && data_units(d, (int64_t)i) > most) most = data_units(d, (int64_t)i);
    }
    data_names_free(&names);
    if (s == MT_OK && d->shuffle &&
        (!(d->shard_order = malloc((size_t)d->nshards * sizeof(int64_t))) ||
         !(d->unit_order = malloc((size_t)most * sizeof(int64_t)))))
        s = mt_set_error(MT_ERR_OOM, "data: out of memory");
    if (s != MT_OK) {
        mt_data_close(d);
        return s;
    }
    *out = d;
    return MT_OK;
}

static inline uint32_t data_token(const data_shard *sh, int64_t i) {
    const unsigned char *p = sh->map + MT_DATA_HEADER_INTS * 4;
    if (sh->width == 2) {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

mt_status mt_data_next(mt_data_loader *d, int32_t *tokens, int32_t *labels) {
    const int64_t shard = data_shard_at(d, d->pos.epoch, d->pos.shard);
    const data_shard *sh = &d->shards[shard];
    const int64_t n = d->batch * d->seq;
    const int64_t unit = data_unit_at(d, d->pos.epoch, shard, d->pos.offset / d->unit);
    const int64_t start = unit * d->unit + d->pos.offset % d->unit + (int64_t)d->rank * n;
    /* Invariant (kept by open/seek/advance): unit < units, so start + n + 1 <= count. */
    uint32_t prev = data_token(sh, start);
    for (int64_t i = 0; i < n; i++) {
        uint32_t next = data_token(sh, start + i + 1);
        if (prev > INT32_MAX || next > INT32_MAX)
            return mt_set_error(MT_ERR_FORMAT, "%s: token %lld is %u, beyond int32", sh->path,
                                (long long)(start + i + (prev > INT32_MAX ? 0 : 1)), prev > INT32_MAX ? prev : next);
        tokens[i] = (int32_t)prev;
        labels[i] = (int32_t)next;
        prev = next;
    }
    d->pos.offset += d->window;
    if (d->pos.offset / d->unit >= data_units(d, shard)) {
        d->pos.offset = 0;
        d->pos.shard++;
        if (d->pos.shard == d->nshards) {
            d->pos.shard = 0;
            d->pos.epoch++;
        }
    }
    return MT_OK;
}

mt_data_position mt_data_tell(const mt_data_loader *d) { return d->pos; }

mt_status mt_data_seek(mt_data_loader *d, mt_data_position p) {
    if (p.shard < 0 || p.shard >= d->nshards || p.epoch < 0 || p.epoch >= DATA_MAX_EPOCH || p.offset < 0)
        return mt_set_error(MT_ERR_INVALID, "data: position (shard %lld, offset %lld, epoch %lld) is out of range "
                            "(%lld shards)", (long long)p.shard, (long long)p.offset, (long long)p.epoch,
                            (long long)d->nshards);
    const int64_t shard = data_shard_at(d, p.epoch, p.shard);
    const data_shard *sh = &d->shards[shard];
    if (p.offset % d->window != 0 || p.offset / d->unit >= data_units(d, shard))
        return mt_set_error(MT_ERR_INVALID,
                            "data: offset %lld in %s (%lld tokens) is not a window start for world x batch x seq = %lld "
                            "(a different dataset or shard sizes, or a different batch, sequence length or world size "
                            "than the saved run?)",
                            (long long)p.offset, sh->path, (long long)sh->count, (long long)d->window);
    d->pos = p;
    return MT_OK;
}

uint64_t mt_data_shuffle_seed(const mt_data_loader *d) { return d->seed; }

void mt_data_set_shuffle_seed(mt_data_loader *d, uint64_t seed) {
    d->seed = seed;
    d->order_epoch = d->units_epoch = d->units_shard = -1; /* drawn with the old key */
}

void mt_data_rewind(mt_data_loader *d) {
    d->pos.shard = 0;
    d->pos.offset = 0;
    d->pos.epoch = 0;
}

int64_t mt_data_max_token(const mt_data_loader *d) {
    if (d->max_token >= 0) return d->max_token;
    int64_t best = 0;
    for (int64_t s = 0; s < d->nshards; s++) {
        const data_shard *sh = &d->shards[s];
        for (int64_t i = 0; i < sh->count; i++) {
            uint32_t v = data_token(sh, i);
            if ((int64_t)v > best) best = v;
        }
    }
    ((mt_data_loader *)d)->max_token = best; /* cache: the loader itself is never const */
    return best;
}

int64_t mt_data_shard_count(const mt_data_loader *d) { return d->nshards; }

int64_t mt_data_total_tokens(const mt_data_loader *d) {
    int64_t t = 0;
    for (int64_t s = 0; s < d->nshards; s++) t += d->shards[s].count;
    return t;
}

int64_t mt_data_shard_tokens(const mt_data_loader *d, int64_t i) {
    return i >= 0 && i < d->nshards ? d->shards[i].count : -1;
}

const char *mt_data_shard_path(const mt_data_loader *d, int64_t i) {
    return i >= 0 && i < d->nshards ? d->shards[i].path : NULL;
}

int64_t mt_data_windows_per_epoch(const mt_data_loader *d) {
    int64_t n = 0;
    for (int64_t s = 0; s < d->nshards; s++) n += data_units(d, s);
    return n * (d->unit / d->window);
}

void mt_data_close(mt_data_loader *d) {
    if (!d) return;
    for (int64_t i = 0; i < d->nshards; i++) {
        if (d->shards[i].map) munmap((void *)d->shards[i].map, d->shards[i].map_bytes);
        free(d->shards[i].path);
    }
    free(d->shards);
    free(d->shard_order);
    free(d->unit_order);
    free(d);
}

mt_status mt_data_write_shard(const char *path, const uint32_t *tokens, int64_t count, int wide) {
    if (count < 0 || count > INT32_MAX || (count > 0 && !tokens))
        return mt_set_error(MT_ERR_INVALID, "%s: token count %lld outside [0, %d]", path, (long long)count, INT32_MAX);
    if (!wide)
        for (int64_t i = 0; i < count; i++)
            if (tokens[i] > 65535)
                return mt_set_error(MT_ERR_INVALID, "%s: token %lld is %u, too big for a uint16 shard (use uint32)",
                                    path, (long long)i, tokens[i]);
    int32_t hdr[MT_DATA_HEADER_INTS] = {0};
    hdr[0] = wide ? MT_DATA_MAGIC_U32 : MT_DATA_MAGIC_U16;
    hdr[1] = wide ? MT_DATA_VERSION_U32 : MT_DATA_VERSION_U16;
    hdr[2] = (int32_t)count;

    mt_atomic_file af;
    MT_TRY(mt_atomic_open(&af, path));
    mt_status s = mt_atomic_write(&af, hdr, sizeof hdr);
    if (wide) {
        if (s == MT_OK) s = mt_atomic_write(&af, tokens, (size_t)count * 4);
    } else {
        uint16_t buf[4096];
        for (int64_t i = 0; i < count && s == MT_OK; i += 4096) {
            int64_t m = count - i < 4096 ? count - i : 4096;
            for (int64_t k = 0; k < m; k++) buf[k] = (uint16_t)tokens[i + k];
            s = mt_atomic_write(&af, buf, (size_t)m * 2);
        }
    }
    if (s == MT_OK) return mt_atomic_commit(&af);
    mt_atomic_abort(&af);
    return s;
}
