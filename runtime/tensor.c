/* runtime/tensor.c: tensor views (see tensor.h). */
#include "runtime/tensor.h"

mt_status mt_tensor_init(mt_tensor *t, void *data, mt_dtype dtype, int ndim, const int64_t *shape) {
    if (!t) return mt_set_error(MT_ERR_INVALID, "mt_tensor_init: NULL tensor");
    if (ndim < 0 || ndim > MT_TENSOR_MAX_DIMS)
        return mt_set_error(MT_ERR_INVALID, "mt_tensor_init: ndim %d outside [0, %d]", ndim, MT_TENSOR_MAX_DIMS);
    if (ndim > 0 && !shape) return mt_set_error(MT_ERR_INVALID, "mt_tensor_init: NULL shape with ndim %d", ndim);
    if ((int)dtype < 0 || dtype >= MT_DTYPE_COUNT)
        return mt_set_error(MT_ERR_INVALID, "mt_tensor_init: unknown dtype %d", (int)dtype);
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0)
            return mt_set_error(MT_ERR_INVALID, "mt_tensor_init: dimension %d is negative (%lld)", d,
                                (long long)shape[d]);
    t->data = data;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < MT_TENSOR_MAX_DIMS; d++) t->shape[d] = d < ndim ? shape[d] : 1;
    return MT_OK;
}

int64_t mt_tensor_numel(const mt_tensor *t) {
    if (!t) return 0;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

size_t mt_tensor_bytes(const mt_tensor *t) {
    if (!t) return 0;
    return (size_t)mt_tensor_numel(t) * mt_dtype_size(t->dtype);
}
