/* train/data.h: llm.c token shards and the distributed data loader.
 *
 * Shard format (karpathy/llm.c dev/data/data_common.py write_datafile, and
 * llmc/dataloader.h): a 256 x int32 little-endian header (1024 bytes): [0] magic,
 * [1] version, [2] token count; then the tokens. magic 20240520 / version 1 holds
 * uint16 tokens; magic 20240801 / version 7 (llm.c's llama3 branch) holds uint32
 * tokens. The file size must equal 1024 + count * width.
 *
 * A split is the files <dataset_path>/<split>_*.bin sorted by name. Reading follows
 * llm.c's DataLoader: each rank reads a window of batch*seq + 1 tokens at
 * position + rank*batch*seq (inputs = window[0 .. B*T), labels = window[1 .. B*T]),
 * then the position advances by world*batch*seq; when the next window of the last
 * rank would not fit in the shard, reading moves to the start of the next shard, and
 * past the last shard back to shard 0 with epoch + 1. Shards are memory-mapped, so
 * memory stays small for any corpus size. Deterministic: no shuffling. */
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

/* Where the loader stands: shard index, token offset of the global window start
 * inside that shard (the same on every rank), and the epoch (full passes done). */
typedef struct mt_data_position {
    int64_t shard;
    int64_t offset;
    int64_t epoch;
} mt_data_position;

typedef struct mt_data_loader mt_data_loader;

/* Open split `split` ("train" or "val") of `dataset_path` for `batch` sequences of
 * `seq` tokens per step on rank `rank` of `world`. Validates every shard up front.
 * Errors: MT_ERR_INVALID (batch/seq < 1, rank outside [0, world), bad split name),
 * MT_ERR_IO (missing directory, no <split>_*.bin, unreadable file; names the path
 * and the pattern), MT_ERR_FORMAT (wrong magic, version, or size, naming the file and
 * the numbers; a shard shorter than one global window world*batch*seq + 1 tokens),
 * MT_ERR_OOM. */
mt_status mt_data_open(mt_data_loader **out, const char *dataset_path, const char *split,
                       int64_t batch, int64_t seq, int rank, int world);

/* Fill host tokens[batch*seq] with the next inputs and labels[batch*seq] with the
 * next-token targets (labels[i] == the token after tokens[i]), then advance. Token
 * ids are copied as int32; uint32 ids above INT32_MAX are MT_ERR_FORMAT. */
mt_status mt_data_next(mt_data_loader *d, int32_t *tokens, int32_t *labels);

/* The position the next mt_data_next will read from. */
mt_data_position mt_data_tell(const mt_data_loader *d);

/* Move to p (from mt_data_tell of a loader with the same split, batch, seq, world).
 * Errors: MT_ERR_INVALID naming the values when shard is out of range, epoch < 0,
 * offset < 0, offset not a multiple of world*batch*seq, or the window does not fit. */
mt_status mt_data_seek(mt_data_loader *d, mt_data_position p);

/* Back to shard 0, offset 0, epoch 0 (for evaluation). */
void mt_data_rewind(mt_data_loader *d);

/* Largest token id present in any shard of the split (scanned at open). */
int64_t mt_data_max_token(const mt_data_loader *d);

/* Number of shards and total tokens of the split. */
int64_t mt_data_shard_count(const mt_data_loader *d);
int64_t mt_data_total_tokens(const mt_data_loader *d);

/* Token count of shard i (0 <= i < mt_data_shard_count), or -1 when i is out of range. */
int64_t mt_data_shard_tokens(const mt_data_loader *d, int64_t i);

/* Windows (mt_data_next calls) in one pass over the split before it wraps to shard 0:
 * the sum over shards of (count - 1) / (world * batch * seq), as mt_data_next advances. */
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
