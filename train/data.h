/* train/data.h: llm.c token shards and the distributed data loader.
 *
 * Shard format (karpathy/llm.c dev/data/data_common.py write_datafile, and
 * llmc/dataloader.h): a 256 x int32 little-endian header (1024 bytes): [0] magic,
 * [1] version, [2] token count; then the tokens. magic 20240520 / version 1 holds
 * uint16 tokens; magic 20240801 / version 7 (llm.c's llama3 branch) holds uint32
 * tokens. The file size must equal 1024 + count * width.
 *
 * Finding a split (mt_data_open_ex): an explicit list (train_files / eval_files: files
 * or globs, "[a, b]" or "a,b", in list order, each glob's matches in natural order), or
 * else dataset_path: a directory, a glob or one file, whose files named
 * <split>_*.bin (meshtrain) or <name>_<split>_*.bin / <name>_<split>.bin (llm.c's
 * dev/data scripts) form the split, in natural order (shard_2 before shard_10). Both
 * namings in one place is an error naming a file of each: which one is meant is not
 * ours to guess.
 *
 * Reading follows llm.c's DataLoader: each rank reads a window of batch*seq + 1 tokens
 * at the global window's start + rank*batch*seq (inputs = window[0 .. B*T), labels =
 * window[1 .. B*T]), so every layout with the same world*batch*seq reads the same
 * global batch. A shard is cut into units of world*batch*seq tokens (times the
 * micro-batches of a step when shuffling, so that gradient accumulation still reads
 * what one larger batch would); `(count - 1) / unit` units per shard, the tail is not
 * read. Without shuffling the units are read in file order, shard after shard, and
 * past the last shard back to shard 0 with epoch + 1. With shuffling (llm.c's
 * dataloader_reset / prepare_intra_shard_indices_), every epoch reads the shards in a
 * permuted order and the units of each shard in a permuted order, both Fisher-Yates
 * draws from Philox keyed by the seed (runtime/rng.h), so the order of any (epoch,
 * shard) is computed directly and a saved position resumes without replay. Shards are
 * memory-mapped, so memory stays small for any corpus size (shuffling adds 8 bytes per
 * shard and per unit of the largest shard). */
#ifndef MT_TRAIN_DATA_H
#define MT_TRAIN_DATA_H

#include <stdint.h>
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_DATA_MAGIC_U16 20240520
#define MT_DATA_VERSION_U16 1
#define MT_DATA_MAGIC_U32 20240801
#define MT_DATA_VERSION_U32 7
#define MT_DATA_HEADER_INTS 256

/* Where the loader stands, the same on every rank: shard = the slot in this epoch's
 * shard order, offset = tokens of this shard already read (a multiple of
 * world*batch*seq, in unit order), epoch = full passes done. Without shuffling the
 * slot is the shard index and the offset the token offset in the file. */
typedef struct mt_data_position {
    int64_t shard;
    int64_t offset;
    int64_t epoch;
} mt_data_position;

typedef struct mt_data_loader mt_data_loader;

/* How a split is found and read; NULL or all zero but micro_batches = 1 gives
 * mt_data_open's behaviour. */
typedef struct mt_data_options {
    const char *files;     /* NULL or "": the split of dataset_path; else files or globs, "[a, b]" or "a,b" */
    const char *files_key; /* the config key `files` came from, for messages (NULL: "files") */
    int shuffle;           /* 1: shard order and unit order permuted every epoch */
    uint64_t shuffle_seed; /* Philox key of the permutations */
    int64_t micro_batches; /* mt_data_next calls per optimizer step (>= 1): a shuffled unit's windows */
} mt_data_options;

/* Open split `split` ("train" or "val") of `dataset_path` for `batch` sequences of
 * `seq` tokens per step on rank `rank` of `world`. Validates every shard up front.
 * Errors: MT_ERR_INVALID (batch/seq < 1, rank outside [0, world), bad split name),
 * MT_ERR_IO (missing directory, no <split>_*.bin, unreadable file; names the path
 * and the pattern), MT_ERR_FORMAT (wrong magic, version, or size, naming the file and
 * the numbers; a shard shorter than one global window world*batch*seq + 1 tokens),
 * MT_ERR_OOM. */
mt_status mt_data_open(mt_data_loader **out, const char *dataset_path, const char *split,
                       int64_t batch, int64_t seq, int rank, int world);

/* mt_data_open with options (opt may be NULL): the split from opt->files when given
 * (dataset_path is then not read), shuffling, micro-batches per step. Errors as
 * mt_data_open, plus: MT_ERR_INVALID (dataset_path holds both namings of the split,
 * naming a file of each; a listed file named twice; an empty list entry; a listed
 * directory; micro_batches < 1; over 2^24 shards when shuffling), MT_ERR_IO (a listed
 * glob matching nothing or a missing listed file, naming opt->files_key; a dataset_path
 * glob none of whose matches is named for the split). When shuffling, a shard shorter
 * than world*batch*seq*micro_batches + 1 tokens is MT_ERR_FORMAT. */
mt_status mt_data_open_ex(mt_data_loader **out, const char *dataset_path, const char *split,
                          const mt_data_options *opt, int64_t batch, int64_t seq, int rank, int world);

/* Fill host tokens[batch*seq] with the next inputs and labels[batch*seq] with the
 * next-token targets (labels[i] == the token after tokens[i]), then advance. Token
 * ids are copied as int32; uint32 ids above INT32_MAX are MT_ERR_FORMAT. */
mt_status mt_data_next(mt_data_loader *d, int32_t *tokens, int32_t *labels);

/* The position the next mt_data_next will read from. */
mt_data_position mt_data_tell(const mt_data_loader *d);

/* Move to p (from mt_data_tell of a loader with the same split, batch, seq, world and
 * options). Errors: MT_ERR_INVALID naming the values when shard is out of range, epoch
 * < 0 or >= 2^48, offset < 0, offset not a multiple of world*batch*seq, or past the
 * last unit of the shard at that slot. */
mt_status mt_data_seek(mt_data_loader *d, mt_data_position p);

/* The shuffle's Philox key, and setting it (a resumed run keeps the saved run's order;
 * positions keep their meaning in the new order). No effect without shuffling. */
uint64_t mt_data_shuffle_seed(const mt_data_loader *d);
void mt_data_set_shuffle_seed(mt_data_loader *d, uint64_t seed);

/* Back to shard 0, offset 0, epoch 0 (for evaluation). */
void mt_data_rewind(mt_data_loader *d);

/* Largest token id present in any shard of the split (scanned at open). */
int64_t mt_data_max_token(const mt_data_loader *d);

/* Number of shards and total tokens of the split. */
int64_t mt_data_shard_count(const mt_data_loader *d);
int64_t mt_data_total_tokens(const mt_data_loader *d);

/* Token count of shard i (0 <= i < mt_data_shard_count), or -1 when i is out of range. */
int64_t mt_data_shard_tokens(const mt_data_loader *d, int64_t i);

/* Path of shard i (in the order found: natural order, or list order), or NULL when i
 * is out of range. Owned by the loader. */
const char *mt_data_shard_path(const mt_data_loader *d, int64_t i);

/* Windows (mt_data_next calls) in one pass over the split before it wraps to shard 0:
 * the sum over shards of (count - 1) / unit, times the windows of a unit. */
int64_t mt_data_windows_per_epoch(const mt_data_loader *d);

/* Unmap and free; NULL is fine. */
void mt_data_close(mt_data_loader *d);

/* Write tokens[count] as an llm.c shard: wide == 0 -> magic 20240520 / version 1 with
 * uint16 tokens (MT_ERR_INVALID naming the index if a token > 65535), wide == 1 ->
 * 20240801 / 7 with uint32 tokens. Atomic: path.tmp, fsync, rename.
 * Errors: MT_ERR_INVALID (count < 0, count > INT32_MAX, token too big), MT_ERR_IO. */
mt_status mt_data_write_shard(const char *path, const uint32_t *tokens, int64_t count,
                              int wide);

#ifdef __cplusplus
}
#endif
#endif
