/* runtime/tensor.h: a non-owning view of a dense, row-major tensor of up to four
 * dimensions. The view never allocates or frees: `data` belongs to an arena entry
 * (runtime/plan.h), a checkpoint buffer or the caller. */
#ifndef MT_RUNTIME_TENSOR_H
#define MT_RUNTIME_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "runtime/dtype.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_TENSOR_MAX_DIMS 4

typedef struct mt_tensor {
    void *data;                         /* first element (host or device memory) */
    mt_dtype dtype;                     /* element type */
    int ndim;                           /* 0 (scalar) .. MT_TENSOR_MAX_DIMS */
    int64_t shape[MT_TENSOR_MAX_DIMS];  /* shape[0..ndim), row-major; unused dims are 1 */
} mt_tensor;

/* Fill *t with a view of `data` with the given dtype and shape[0..ndim).
 * Errors: MT_ERR_INVALID if t is NULL, ndim is outside [0, MT_TENSOR_MAX_DIMS],
 * shape is NULL while ndim > 0, a dimension is negative, or dtype is unknown. */
mt_status mt_tensor_init(mt_tensor *t, void *data, mt_dtype dtype, int ndim, const int64_t *shape);

/* Number of elements: the product of shape[0..ndim) (1 for a scalar). */
int64_t mt_tensor_numel(const mt_tensor *t);

/* Size in bytes: numel * mt_dtype_size(dtype). */
size_t mt_tensor_bytes(const mt_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
