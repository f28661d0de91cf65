/* tests/cudaemu/include/cudaemu_stats.h: counters of the emulator's host <-> device traffic
 * and of the places where the host waits for the device (implemented in src/runtime.cpp).
 *
 * For tests that hold code to a synchronisation budget (tests/test_emu_syncs.c: a training
 * step reads the device exactly twice). The emulator runs everything synchronously, so
 * nothing here measures time: each counter says what the same calls would do on a real
 * device, following the CUDA runtime's "API synchronization behavior" section:
 *  - d2h_copies: cudaMemcpy, cudaMemcpyAsync and cudaMemcpy2D with a device (or managed)
 *    source and a host destination (pageable, cudaMallocHost or cudaHostRegister memory),
 *    whatever the kind says (cudaMemcpyDefault is resolved from the pointers);
 *  - h2d_copies: the same calls with a host source and a device destination;
 *  - syncs: calls after which the host has waited for the device's queued work, the sum of
 *      device_syncs  cudaDeviceSynchronize,
 *      stream_syncs  cudaStreamSynchronize,
 *      event_syncs   cudaEventSynchronize,
 *      copy_syncs    cudaMemcpy / cudaMemcpy2D between host and device in either direction
 *                    (device -> host waits for the data; host -> device waits for the
 *                    stream before it starts, or until done from pinned memory), and
 *                    cudaMemcpyAsync from device into pageable host memory (returns only
 *                    once the copy is done); not cudaMemcpyAsync host -> device (pageable
 *                    memory is staged, pinned memory is read later) nor device -> pinned
 *                    host, nor device -> device copies,
 *      free_syncs    cudaFree / cudaFreeHost of an allocation (CUDA synchronises the device
 *                    implicitly before freeing).
 *    The queries (cudaStreamQuery, cudaEventQuery) do not wait and are not counted.
 * Only calls that succeed are counted (a call refused for its arguments or a sticky error
 * does nothing). Counters are per process, shared by all host threads (atomic), start at 0
 * and are cleared only by cudaemu_stats_reset (not by cudaDeviceReset). */
#ifndef CUDAEMU_STATS_H
#define CUDAEMU_STATS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cudaemu_stats {
    uint64_t d2h_copies; /* device -> host copies */
    uint64_t h2d_copies; /* host -> device copies */
    uint64_t syncs;      /* host waits for the device: the sum of the five below */
    uint64_t device_syncs, stream_syncs, event_syncs, copy_syncs, free_syncs;
} cudaemu_stats;

/* *out = the counters since the start of the process or the last cudaemu_stats_reset. */
void cudaemu_stats_get(cudaemu_stats *out);

/* Set every counter to 0. */
void cudaemu_stats_reset(void);

#ifdef __cplusplus
}
#endif
#endif
