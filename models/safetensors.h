/* models/safetensors.h: strict reader and atomic writer of safetensors files.
 *
 * Format (huggingface/safetensors, docs "The format"): an 8-byte
 * little-endian header length N, N bytes of a JSON object mapping tensor name ->
 * {"dtype", "shape", "data_offsets": [begin, end)} (offsets in bytes relative to the
 * data start, i.e. file offset 8 + N) plus an optional "__metadata__" object of
 * string values, then the data: row-major, little-endian, covering the data section
 * with no gaps or overlaps.
 *
 * The reader validates everything up front (mt_safetensors_open) and reads tensor
 * data on demand with pread, so memory stays at one header plus what the caller asks
 * for. Every error message names the file and, where one is involved, the tensor. */
#ifndef MT_MODELS_SAFETENSORS_H
#define MT_MODELS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "runtime/dtype.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_ST_MAX_DIMS 8

/* One tensor entry of an open file. dtype is one of F32, BF16, F16, I32, U16, U32,
 * F64 (other safetensors dtypes are rejected at open with MT_ERR_FORMAT
 * "unsupported dtype"). shape has ndim entries (ndim 0 = scalar, numel 1).
 * [begin, end) are byte offsets relative to the data start. */
typedef struct mt_st_tensor {
    char name[256];
    mt_dtype dtype;
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
    uint64_t begin, end;
} mt_st_tensor;

typedef struct mt_safetensors mt_safetensors;

/* Open `path` and validate its header: the 8-byte LE length N with N <= file size - 8,
 * a JSON object, each entry's dtype, shape (0..8 non-negative dims), data_offsets with
 * end - begin == numel * dtype size, offsets inside the data section, and (sorted by
 * begin) no overlaps and no gaps, the last tensor ending exactly at the end of the
 * file; "__metadata__" must be an object of strings.
 * Errors: MT_ERR_IO (cannot open/read), MT_ERR_FORMAT (anything malformed; the message
 * names the file and the tensor), MT_ERR_OOM. On error *out is NULL. */
mt_status mt_safetensors_open(mt_safetensors **out, const char *path);

/* Number of tensors (the __metadata__ entry is not a tensor). */
int mt_safetensors_count(const mt_safetensors *f);

/* Tensor i in file order of the header (0 <= i < count), or NULL when out of range. */
const mt_st_tensor *mt_safetensors_tensor(const mt_safetensors *f, int i);

/* Index of the tensor called `name`, or -1 if absent. */
int mt_safetensors_find(const mt_safetensors *f, const char *name);

/* Value of __metadata__[key], or NULL if absent. Valid until close. */
const char *mt_safetensors_metadata(const mt_safetensors *f, const char *key);

/* The path the file was opened with. */
const char *mt_safetensors_path(const mt_safetensors *f);

/* Read tensor i converted to float32 into host dst[numel]. Converts F32, BF16, F16
 * (IEEE half) and F64 (rounded to nearest float); numel must equal the tensor's.
 * Errors: MT_ERR_INVALID (bad index, numel mismatch naming both), MT_ERR_FORMAT
 * (integer dtype; NaN or Inf in the data, naming file, tensor and flat element
 * index; an F64 value beyond float range), MT_ERR_IO (short read). */
mt_status mt_safetensors_read_f32(const mt_safetensors *f, int i, float *dst, int64_t numel);

/* Read the exact bytes of tensor i (any dtype, little-endian as stored) into host
 * dst[bytes]; bytes must equal end - begin. Errors: MT_ERR_INVALID, MT_ERR_IO. */
mt_status mt_safetensors_read_raw(const mt_safetensors *f, int i, void *dst, size_t bytes);

/* Close and free; NULL is fine. */
void mt_safetensors_close(mt_safetensors *f);

/* One tensor to write: host data of numel(shape) * mt_dtype_size(dtype) bytes. */
typedef struct mt_st_write_tensor {
    const char *name;
    mt_dtype dtype;
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
    const void *data;
} mt_st_write_tensor;

/* Write n tensors, in the given order, to `path`. metadata is NULL or a NULL-terminated
 * list key, value, key, value, ..., NULL stored as __metadata__. The header JSON is
 * padded with spaces to a multiple of 8 bytes. Writes `path`.tmp, fsyncs it and renames
 * it over `path`, so an existing file is never half-overwritten: on any error the old
 * file is untouched and the .tmp file removed.
 * Errors: MT_ERR_INVALID (empty or duplicate or "__metadata__" name, name longer than
 * 255 bytes, ndim outside 0..8, negative dim, NULL data with non-zero size),
 * MT_ERR_IO (cannot create, write, fsync or rename), MT_ERR_OOM. */
mt_status mt_safetensors_write(const char *path, const mt_st_write_tensor *t, int n,
                               const char *const *metadata);

/* Producer of tensor i's bytes for mt_safetensors_write_fetch: fill dst[bytes]
 * (bytes = numel * dtype size) and return MT_OK, or an error (with mt_set_error),
 * which aborts the write and leaves any existing file untouched. */
typedef mt_status (*mt_st_fetch_fn)(void *ctx, int i, void *dst, size_t bytes);

/* As mt_safetensors_write, but the data of each tensor comes from fetch(ctx, i, ...)
 * into one host scratch buffer of the largest tensor's size (t[i].data is ignored),
 * so a device-resident model is written without a host copy of all of it. With
 * fetch == NULL it is mt_safetensors_write. Errors: as mt_safetensors_write, plus
 * whatever fetch returns. */
mt_status mt_safetensors_write_fetch(const char *path, const mt_st_write_tensor *t, int n,
                                     const char *const *metadata, mt_st_fetch_fn fetch, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
