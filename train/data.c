/* train/data.c: llm.c token shards, memory-mapped, read in llm.c's DataLoader order
 * (karpathy/llm.c llmc/dataloader.h: dataloader_next_batch, dataloader_advance_). */
#include "train/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct data_shard {
    char *path;
    const unsigned char *map; /* whole file, PROT_READ */
    size_t map_bytes;
    int64_t count;            /* tokens */
    int width;                /* 2 or 4 bytes per token */
} data_shard;

struct mt_data_loader {
    data_shard *shards;
    int64_t nshards;
    int64_t batch, seq;
    int rank, world;
    int64_t window;           /* world * batch * seq: tokens consumed per step */
    mt_data_position pos;
    int64_t max_token;        /* -1 until computed */
};

static int data_cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void data_free_names(char **names, size_t n) {
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* Map one shard and check its header and size. */
static mt_status data_map_shard(data_shard *sh, int64_t need) {
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
                            "%s: %lld tokens, fewer than one step's window of %lld (world x batch x seq + 1)",
                            sh->path, (long long)sh->count, (long long)need);
    return MT_OK;
}

mt_status mt_data_open(mt_data_loader **out, const char *dataset_path, const char *split, int64_t batch,
                       int64_t seq, int rank, int world) {
    *out = NULL;
    if (!dataset_path || !split || !*split || strchr(split, '/'))
        return mt_set_error(MT_ERR_INVALID, "data: bad dataset path or split name");
    if (batch < 1 || seq < 1 || world < 1 || rank < 0 || rank >= world)
        return mt_set_error(MT_ERR_INVALID, "data: need batch >= 1, seq >= 1, 0 <= rank < world (got %lld, %lld, %d, %d)",
                            (long long)batch, (long long)seq, rank, world);
    if (batch > INT64_MAX / seq || batch * seq > (INT64_MAX - 1) / world)
        return mt_set_error(MT_ERR_INVALID, "data: batch x seq x world overflows");

    DIR *dir = opendir(dataset_path);
    if (!dir)
        return mt_set_error(MT_ERR_IO, "%s: cannot open dataset directory (looking for %s_*.bin): %s", dataset_path,
                            split, strerror(errno));
    size_t plen = strlen(split), n = 0, cap = 0;
    char **names = NULL;
    mt_status s = MT_OK;
    for (struct dirent *e; (e = readdir(dir));) {
        size_t len = strlen(e->d_name);
        if (len < plen + 5 || strncmp(e->d_name, split, plen) != 0 || e->d_name[plen] != '_' ||
            strcmp(e->d_name + len - 4, ".bin") != 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **p = realloc(names, cap * sizeof *names);
            if (!p) {
                s = mt_set_error(MT_ERR_OOM, "data: out of memory");
                break;
            }
            names = p;
        }
        if (!(names[n] = strdup(e->d_name))) {
            s = mt_set_error(MT_ERR_OOM, "data: out of memory");
            break;
        }
        n++;
    }
    closedir(dir);
    if (s != MT_OK) {
        data_free_names(names, n);
        return s;
    }
    if (n == 0) {
        free(names);
        return mt_set_error(MT_ERR_IO, "%s: no shard matches %s/%s_*.bin", dataset_path, dataset_path, split);
    }
    qsort(names, n, sizeof *names, data_cmp_str);

    mt_data_loader *d = calloc(1, sizeof *d);
    if (!d || !(d->shards = calloc(n, sizeof *d->shards))) {
        free(d);
        data_free_names(names, n);
        return mt_set_error(MT_ERR_OOM, "data: out of memory");
    }
    d->nshards = (int64_t)n;
    d->batch = batch;
    d->seq = seq;
    d->rank = rank;
    d->world = world;
    d->window = (int64_t)world * batch * seq;
    d->max_token = -1;
    size_t dlen = strlen(dataset_path);
    for (size_t i = 0; i < n && s == MT_OK; i++) {
        char *p = malloc(dlen + strlen(names[i]) + 2);
        if (!p) {
            s = mt_set_error(MT_ERR_OOM, "data: out of memory");
            break;
        }
        sprintf(p, "%s/%s", dataset_path, names[i]);
        d->shards[i].path = p;
        s = data_map_shard(&d->shards[i], d->window + 1);
    }
    data_free_names(names, n);
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
    const data_shard *sh = &d->shards[d->pos.shard];
    int64_t n = d->batch * d->seq;
    int64_t start = d->pos.offset + (int64_t)d->rank * n;
    /* Invariant (kept by open/seek/advance): offset + window + 1 <= count. */
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
    if (d->pos.offset + d->window + 1 > sh->count) {
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
    if (p.shard < 0 || p.shard >= d->nshards || p.epoch < 0 || p.offset < 0)
        return mt_set_error(MT_ERR_INVALID, "data: position (shard %lld, offset %lld, epoch %lld) is out of range "
                            "(%lld shards)", (long long)p.shard, (long long)p.offset, (long long)p.epoch,
                            (long long)d->nshards);
    const data_shard *sh = &d->shards[p.shard];
    if (p.offset % d->window != 0 || p.offset + d->window + 1 > sh->count)
        return mt_set_error(MT_ERR_INVALID,
                            "data: offset %lld in %s (%lld tokens) is not a window start for world x batch x seq = %lld "
                            "(a different dataset or shard sizes, or a different batch, sequence length or world size "
                            "than the saved run?)",
                            (long long)p.offset, sh->path, (long long)sh->count, (long long)d->window);
    d->pos = p;
    return MT_OK;
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

int64_t mt_data_windows_per_epoch(const mt_data_loader *d) {
    int64_t n = 0;
    for (int64_t s = 0; s < d->nshards; s++) n += (d->shards[s].count - 1) / d->window;
    return n;
}

void mt_data_close(mt_data_loader *d) {
    if (!d) return;
    for (int64_t i = 0; i < d->nshards; i++) {
        if (d->shards[i].map) munmap((void *)d->shards[i].map, d->shards[i].map_bytes);
        free(d->shards[i].path);
    }
    free(d->shards);
    free(d);
}

static int data_write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
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

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return mt_set_error(MT_ERR_OOM, "%s: out of memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    mt_status s = MT_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = mt_set_error(MT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return s;
    }
    int bad = data_write_all(fd, hdr, sizeof hdr);
    if (wide) {
        bad = bad || data_write_all(fd, tokens, (size_t)count * 4);
    } else {
        uint16_t buf[4096];
        for (int64_t i = 0; i < count && !bad; i += 4096) {
            int64_t m = count - i < 4096 ? count - i : 4096;
            for (int64_t k = 0; k < m; k++) buf[k] = (uint16_t)tokens[i + k];
            bad = data_write_all(fd, buf, (size_t)m * 2);
        }
    }
    if (bad) s = mt_set_error(MT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    else if (fsync(fd) != 0) s = mt_set_error(MT_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == MT_OK) s = mt_set_error(MT_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (s == MT_OK && rename(tmp, path) != 0)
        s = mt_set_error(MT_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
    if (s != MT_OK) unlink(tmp);
    free(tmp);
    return s;
}
