/* tests/cudaemu/selftest/test_runtime_stats.c: the counters of cudaemu_stats.h: which
 * copies go device -> host or host -> device, which calls make the host wait for the
 * device (the CUDA runtime's "API synchronization behavior"), what is not counted
 * (queries, device -> device copies, asynchronous uploads, failed calls), and reset.
 * Returns the number of failed checks. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cudaemu_stats.h"
#include "runtime_check.h"

/* The counters after `what` are exactly d2h, h2d copies and the five sync kinds. */
#define EXPECT(what, d2h, h2d, dev, str, ev, cp, fr)                                                         \
    do {                                                                                                     \
        cudaemu_stats s_;                                                                                    \
        cudaemu_stats_get(&s_);                                                                              \
        CHECK(s_.d2h_copies == (d2h) && s_.h2d_copies == (h2d) && s_.device_syncs == (dev) &&                \
                  s_.stream_syncs == (str) && s_.event_syncs == (ev) && s_.copy_syncs == (cp) &&             \
                  s_.free_syncs == (fr) && s_.syncs == (uint64_t)(dev) + (str) + (ev) + (cp) + (fr),          \
              "%s: d2h %llu h2d %llu device %llu stream %llu event %llu copy %llu free %llu (syncs %llu)",   \
              what, (unsigned long long)s_.d2h_copies, (unsigned long long)s_.h2d_copies,                    \
              (unsigned long long)s_.device_syncs, (unsigned long long)s_.stream_syncs,                      \
              (unsigned long long)s_.event_syncs, (unsigned long long)s_.copy_syncs,                         \
              (unsigned long long)s_.free_syncs, (unsigned long long)s_.syncs);                              \
    } while (0)

static void test_copies(void) {
    float *d = NULL, *pinned = NULL, h[64] = {0};
    CHECK_EQ_INT(cudaMalloc((void **)&d, sizeof h), cudaSuccess);
    CHECK_EQ_INT(cudaMallocHost((void **)&pinned, sizeof h), cudaSuccess);
    cudaemu_stats_reset();
    EXPECT("after reset", 0, 0, 0, 0, 0, 0, 0);

    /* synchronous copies between host and device wait, in either direction */
    CHECK_EQ_INT(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT("cudaMemcpy H2D", 0, 1, 0, 0, 0, 1, 0);
    CHECK_EQ_INT(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT("cudaMemcpy D2H", 1, 1, 0, 0, 0, 2, 0);
    CHECK_EQ_INT(cudaMemcpy(pinned, d, sizeof h, cudaMemcpyDefault), cudaSuccess); /* direction from the pointers */
    EXPECT("cudaMemcpy Default to pinned", 2, 1, 0, 0, 0, 3, 0);
    CHECK_EQ_INT(cudaMemcpy2D(h, 16, d, 32, 16, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT("cudaMemcpy2D D2H", 3, 1, 0, 0, 0, 4, 0);

    /* asynchronous: only device -> pageable host waits */
    CHECK_EQ_INT(cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, 0), cudaSuccess);
    EXPECT("cudaMemcpyAsync H2D pageable", 3, 2, 0, 0, 0, 4, 0);
    CHECK_EQ_INT(cudaMemcpyAsync(d, pinned, sizeof h, cudaMemcpyDefault, 0), cudaSuccess);
    EXPECT("cudaMemcpyAsync H2D pinned", 3, 3, 0, 0, 0, 4, 0);
    CHECK_EQ_INT(cudaMemcpyAsync(pinned, d, sizeof h, cudaMemcpyDeviceToHost, 0), cudaSuccess);
    EXPECT("cudaMemcpyAsync D2H pinned", 4, 3, 0, 0, 0, 4, 0);
    CHECK_EQ_INT(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, 0), cudaSuccess);
    EXPECT("cudaMemcpyAsync D2H pageable", 5, 3, 0, 0, 0, 5, 0);

    /* neither direction: device -> device, host -> host, memset */
    CHECK_EQ_INT(cudaMemcpy(d, d + 32, 32 * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
    CHECK_EQ_INT(cudaMemcpyAsync(d, d + 32, 32 * sizeof(float), cudaMemcpyDefault, 0), cudaSuccess);
    CHECK_EQ_INT(cudaMemcpy(h, pinned, sizeof h, cudaMemcpyHostToHost), cudaSuccess);
    CHECK_EQ_INT(cudaMemset(d, 0, sizeof h), cudaSuccess);
    EXPECT("D2D, H2H, memset", 5, 3, 0, 0, 0, 5, 0);

    /* failed or empty copies are not counted */
    CHECK_EQ_INT(cudaMemcpy(h, d, sizeof h + 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaMemcpy(d, h, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaMemcpy(h, d, 0, cudaMemcpyDeviceToHost), cudaSuccess);
    (void)cudaGetLastError();
    EXPECT("refused and empty copies", 5, 3, 0, 0, 0, 5, 0);

    /* freeing synchronises the device */
    CHECK_EQ_INT(cudaFree(d), cudaSuccess);
    CHECK_EQ_INT(cudaFreeHost(pinned), cudaSuccess);
    CHECK_EQ_INT(cudaFree(NULL), cudaSuccess);
    EXPECT("cudaFree, cudaFreeHost", 5, 3, 0, 0, 0, 5, 2);
    cudaemu_stats_reset();
    EXPECT("reset", 0, 0, 0, 0, 0, 0, 0);
}

static void test_waits(void) {
    cudaStream_t s = NULL;
    cudaEvent_t e = NULL;
    CHECK_EQ_INT(cudaStreamCreate(&s), cudaSuccess);
    CHECK_EQ_INT(cudaEventCreate(&e), cudaSuccess);
    cudaemu_stats_reset();
    CHECK_EQ_INT(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_EQ_INT(cudaStreamSynchronize(s), cudaSuccess);
    CHECK_EQ_INT(cudaStreamSynchronize(0), cudaSuccess);
    CHECK_EQ_INT(cudaEventRecord(e, s), cudaSuccess);
    CHECK_EQ_INT(cudaEventSynchronize(e), cudaSuccess);
    EXPECT("device, 2 stream, event syncs", 0, 0, 1, 2, 1, 0, 0);
    /* queries and ordering between streams do not make the host wait */
    CHECK_EQ_INT(cudaStreamQuery(s), cudaSuccess);
    CHECK_EQ_INT(cudaEventQuery(e), cudaSuccess);
    CHECK_EQ_INT(cudaStreamWaitEvent(0, e, 0), cudaSuccess);
    EXPECT("queries", 0, 0, 1, 2, 1, 0, 0);
    CHECK_EQ_INT(cudaEventDestroy(e), cudaSuccess);
    CHECK_EQ_INT(cudaStreamDestroy(s), cudaSuccess);
    /* refused: a dead handle */
    CHECK_EQ_INT(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    CHECK_EQ_INT(cudaEventSynchronize(e), cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    EXPECT("refused syncs", 0, 0, 1, 2, 1, 0, 0);
    /* cudaDeviceReset does not clear the counters */
    CHECK_EQ_INT(cudaDeviceReset(), cudaSuccess);
    EXPECT("after cudaDeviceReset", 0, 0, 1, 2, 1, 0, 0);
    cudaemu_stats_reset();
}

int main(void) {
    setenv("CUDAEMU_QUIET", "1", 1);
    test_copies();
    test_waits();
    printf("test_runtime_stats: %d failure(s)\n", g_failures);
    return g_failures != 0;
}
