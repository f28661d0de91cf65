/* fuzz/fuzz_safetensors.c: libFuzzer target for the safetensors reader
 * (models/safetensors.h). The input is written to a file (the reader works on paths
 * and preads tensor data on demand) and opened; when the header validates, every
 * tensor is read raw and, for the float dtypes, converted to float32 (NaN/Inf and
 * range errors are expected outcomes). Any crash, sanitizer report, leak or a
 * validated tensor whose bytes do not match its shape is a bug.
 * Build and run: fuzz/build.sh, tests/test_fuzz.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/safetensors.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    if (mt_fuzz_write_temp(path, sizeof path, "st", data, size) != 0) return 0;
    mt_safetensors *f = NULL;
    if (mt_safetensors_open(&f, path) == MT_OK) {
        int n = mt_safetensors_count(f);
        for (int i = 0; i < n; i++) {
            const mt_st_tensor *t = mt_safetensors_tensor(f, i);
            if (!t) abort();
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
            if (t->end < t->begin || t->end - t->begin != (uint64_t)numel * mt_dtype_size(t->dtype)) abort();
            if (mt_safetensors_find(f, t->name) < 0) abort();
            size_t bytes = (size_t)(t->end - t->begin);
            if (bytes > (1u << 20)) continue; /* bounded by the input size anyway */
            void *raw = malloc(bytes ? bytes : 1);
            float *f32 = malloc((size_t)(numel ? numel : 1) * sizeof(float));
            if (raw && mt_safetensors_read_raw(f, i, raw, bytes) != MT_OK) abort();
            if (f32) (void)mt_safetensors_read_f32(f, i, f32, numel);
            free(raw);
            free(f32);
        }
        (void)mt_safetensors_metadata(f, "format");
        (void)mt_safetensors_tensor(f, n); /* out of range: NULL */
        mt_safetensors_close(f);
    } else if (f) {
        abort(); /* on error *out must be NULL */
    }
    unlink(path);
    return 0;
}
