/* tests/cudaemu/include/driver_types.h: the emulator's driver types (cudaError_t,
 * streams, events, memcpy kinds, ...), as the toolkit's header of this name provides;
 * they live in cudaemu_types.h and cuda_runtime.h. Exists so that an
 * `#include <driver_types.h>` never reaches a toolkit header. */
#ifndef CUDAEMU_DRIVER_TYPES_H
#define CUDAEMU_DRIVER_TYPES_H
#include "cuda_runtime.h"
#endif
