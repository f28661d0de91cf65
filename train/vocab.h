/* train/vocab.h: a SentencePiece .vocab file, one "piece<TAB>score" line per id (id =
 * 0-based line number), as written by spm_train. Decoding concatenates pieces, maps
 * U+2581 (LOWER ONE EIGHTH BLOCK, SentencePiece's space marker) to ' ', drops the
 * single leading space SentencePiece's dummy prefix adds, and skips the control
 * pieces <s>, </s>, <unk> and <pad> (as sentencepiece's DecodeIds). */
#ifndef MT_TRAIN_VOCAB_H
#define MT_TRAIN_VOCAB_H

#include <stdint.h>
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_vocab mt_vocab;

/* Load a .vocab file. Errors: MT_ERR_IO (cannot read, naming the path),
 * MT_ERR_FORMAT (a line without a TAB, naming the line; an empty file), MT_ERR_OOM. */
mt_status mt_vocab_load(mt_vocab **out, const char *path);
void mt_vocab_free(mt_vocab *v);

/* Number of pieces; piece of id (NULL when out of range); id of a piece or -1. */
int64_t mt_vocab_size(const mt_vocab *v);
const char *mt_vocab_piece(const mt_vocab *v, int64_t id);
int64_t mt_vocab_find(const mt_vocab *v, const char *piece);

/* Decode ids[n] to a NUL-terminated UTF-8 string the caller frees (see the header
 * comment; ids outside the vocabulary are skipped). Errors: MT_ERR_OOM. */
mt_status mt_vocab_decode(const mt_vocab *v, const int32_t *ids, int64_t n, char **text);

#ifdef __cplusplus
}
#endif
#endif
