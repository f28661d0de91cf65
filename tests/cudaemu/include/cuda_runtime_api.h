/* tests/cudaemu/include/cuda_runtime_api.h: the runtime API without the device
 * language, as the toolkit's header of this name (the declarations live in the
 * emulator's cuda_runtime.h; C code gets no device prelude from it either way).
 * Exists so that `#include <cuda_runtime_api.h>` never reaches a toolkit header. */
#ifndef CUDAEMU_CUDA_RUNTIME_API_H
#define CUDAEMU_CUDA_RUNTIME_API_H
#include "cuda_runtime.h"
#endif
