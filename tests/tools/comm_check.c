/* tests/tools/comm_check.c: the collectives of parallel/comm.h, blocking and
 * asynchronous, on host buffers (MPI) or device buffers (NCCL), checked against values
 * computed here in closed form (tests/test_mpi_comm_async.sh, tests/test_gpu_nccl.sh).
 *
 *   comm_check host         every rank of the world (mpirun -np N, or one process):
 *                           all_gather / reduce_scatter with uneven counts (one chunk
 *                           empty) and with equal counts, all_reduce (sum, max),
 *                           broadcast, sendrecv, each blocking and asynchronous (three
 *                           requests outstanding at once, in-place gather and
 *                           reduce-scatter), the
 *                           byte counters against comm.h's formulas, and overlap: a
 *                           1 MiB all_gather completes before its wait is called
 *   comm_check device       the same on device buffers of the CUDA backend over a
 *                           communicator split with MT_COMM_DEVICE; inputs are made by
 *                           a kernel on the compute stream just before each call and
 *                           results are doubled by a kernel just after it, so a
 *                           missing event (comm stream not waiting for compute, or
 *                           compute not waiting for comm) shows as wrong values.
 *                           Exit 77 without a GPU or without NCCL in the build.
 *   comm_check nccl1        the NCCL backend itself on a communicator of one rank
 *                           (what one GPU can run): every collective through
 *                           ncclCommInitRank, the comm stream and its events. Exit 77
 *                           as above.
 *   comm_check nccl1-hang   the watchdog's NCCL poll on one GPU: an ncclRecv from this
 *                           rank with no matching send never completes; within 10 s
 *                           mt_nccl_poll (timeout 1 s) must abort the communicator
 *                           and name the collective and the group. Exit 77 without a
 *                           GPU, or if NCCL refuses the unmatched receive at launch.
 *   comm_check hang         process control on, timeout 1 s: rank 1 sleeps 6 s before
 *                           joining an asynchronous all_gather, so rank 0's
 *                           mt_comm_wait must be ended by the watchdog (exit 1, message
 *                           naming rank, collective and group).
 *   comm_check device-hang  the same with device buffers: rank 0 queues an NCCL
 *                           all_gather, then synchronises (barrier); its watchdog must
 *                           abort the NCCL communicator and exit 1 naming it.
 * Every value is a small integer or half-integer, exact in fp32 for any summation
 * order, so results are compared for equality. Prints "comm_check: ok" on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/tools/tool_backend.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"

static int g_fail = 0;
static mt_backend *g_ops;

#define CHECK(cond, ...)                                              \
    do {                                                              \
        if (!(cond)) {                                                \
            fprintf(stderr, "comm_check: rank %d: ", mt_comm_world_rank()); \
            fprintf(stderr, __VA_ARGS__);                             \
            fprintf(stderr, "\n");                                    \
            g_fail++;                                                 \
        }                                                             \
    } while (0)
#define OK(call) CHECK((call) == MT_OK, "%s: %s", #call, mt_last_error())

/* Backend buffer of n floats holding host[n] * 0.5, then doubled by a kernel on the
 * compute stream (so the collective that follows must wait for that kernel). */
static float *upload(const float *host, int64_t n) {
    float *d = tool_alloc(g_ops, (size_t)(n > 0 ? n : 1) * sizeof(float));
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = 0.5f * host[i];
    if (n) TOOL_OK(g_ops->ops->copy_to_device(g_ops, d, h, (size_t)n * sizeof(float)));
    if (n) TOOL_OK(g_ops->ops->scale(g_ops, d, 2.0f, n, MT_F32));
    free(h);
    return d;
}

/* host[n] = d[n] / 2 after a doubling kernel queued right after the collective. */
static void download(float *host, float *d, int64_t n) {
    if (!n) return;
    TOOL_OK(g_ops->ops->scale(g_ops, d, 2.0f, n, MT_F32));
    TOOL_OK(g_ops->ops->copy_to_host(g_ops, host, d, (size_t)n * sizeof(float)));
    for (int64_t i = 0; i < n; i++) host[i] *= 0.5f;
}

static int64_t total_of(const int64_t *c, int n) {
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += c[i];
    return s;
}

/* all_gather and reduce_scatter with counts[n], blocking then async; bytes checked. */
static void check_gather_scatter(mt_comm *c, const int64_t *counts, const char *label) {
    const int n = mt_comm_size(c), r = mt_comm_rank(c);
    const int64_t tot = total_of(counts, n);
    int64_t displ[64];
    for (int i = 0, d = 0; i < n; d += (int)counts[i], i++) displ[i] = d;
    float *h = malloc(sizeof(float) * (size_t)(tot + 1)), *got = malloc(sizeof(float) * (size_t)(tot + 1));

    /* all_gather: rank i's chunk is 100 i + j */
    for (int64_t j = 0; j < counts[r]; j++) h[j] = (float)(100 * r + j);
    for (int async = 0; async < 2; async++) {
        float *send = upload(h, counts[r]), *recv = upload(h, tot); /* recv: garbage to overwrite */
        const uint64_t b0 = mt_comm_bytes(c, MT_COLL_ALL_GATHER);
        if (async) {
            mt_comm_request *q = NULL;
            OK(mt_comm_all_gather_start(c, send, recv, counts, MT_COMM_F32, &q));
            OK(mt_comm_wait(q));
        } else {
            OK(mt_comm_all_gather(c, send, recv, counts, MT_COMM_F32));
        }
        const uint64_t want = n > 1 ? (uint64_t)(tot - counts[r]) * 4 : 0;
        CHECK(mt_comm_bytes(c, MT_COLL_ALL_GATHER) - b0 == want, "%s all_gather%s bytes %llu, formula %llu", label,
              async ? "_start" : "", (unsigned long long)(mt_comm_bytes(c, MT_COLL_ALL_GATHER) - b0),
              (unsigned long long)want);
        download(got, recv, tot);
        for (int i = 0; i < n; i++)
            for (int64_t j = 0; j < counts[i]; j++)
                CHECK(got[displ[i] + j] == (float)(100 * i + j), "%s all_gather%s: element %lld of chunk %d is %g, "
                      "want %d", label, async ? "_start" : "", (long long)j, i, got[displ[i] + j], (int)(100 * i + j));
        g_ops->ops->release(g_ops, send);
        g_ops->ops->release(g_ops, recv);
    }
    /* in place: send points at this rank's chunk of recv */
    {
        for (int64_t k = 0; k < tot; k++) h[k] = -1.0f;
        for (int64_t j = 0; j < counts[r]; j++) h[displ[r] + j] = (float)(100 * r + j);
        float *recv = upload(h, tot);
        mt_comm_request *q = NULL;
        OK(mt_comm_all_gather_start(c, recv + displ[r], recv, counts, MT_COMM_F32, &q));
        OK(mt_comm_wait(q));
        download(got, recv, tot);
        for (int i = 0; i < n; i++)
            for (int64_t j = 0; j < counts[i]; j++)
                CHECK(got[displ[i] + j] == (float)(100 * i + j), "%s in-place all_gather_start: chunk %d element "
                      "%lld is %g", label, i, (long long)j, got[displ[i] + j]);
        g_ops->ops->release(g_ops, recv);
    }

    /* reduce_scatter: rank q sends (q + 1)(k + 1) at flat index k; rank r receives
     * sum_q (q + 1) (displ[r] + j + 1) = n (n + 1) / 2 (displ[r] + j + 1) */
    for (int64_t k = 0; k < tot; k++) h[k] = (float)((r + 1) * (k + 1));
    for (int async = 0; async < 2; async++) {
        float *send = upload(h, tot), *recv = upload(h, counts[r]);
        const uint64_t b0 = mt_comm_bytes(c, MT_COLL_REDUCE_SCATTER);
        if (async) {
            mt_comm_request *q = NULL;
            OK(mt_comm_reduce_scatter_start(c, send, recv, counts, MT_COMM_F32, &q));
            OK(mt_comm_wait(q));
        } else {
            OK(mt_comm_reduce_scatter(c, send, recv, counts, MT_COMM_F32));
        }
        const uint64_t want = n > 1 ? (uint64_t)(tot - counts[r]) * 4 : 0;
        CHECK(mt_comm_bytes(c, MT_COLL_REDUCE_SCATTER) - b0 == want, "%s reduce_scatter bytes %llu, formula %llu",
              label, (unsigned long long)(mt_comm_bytes(c, MT_COLL_REDUCE_SCATTER) - b0), (unsigned long long)want);
        download(got, recv, counts[r]);
        for (int64_t j = 0; j < counts[r]; j++) {
            const float want_v = (float)(n * (n + 1) / 2 * (displ[r] + j + 1));
            CHECK(got[j] == want_v, "%s reduce_scatter%s: element %lld is %g, want %g", label, async ? "_start" : "",
                  (long long)j, got[j], want_v);
        }
        g_ops->ops->release(g_ops, send);
        g_ops->ops->release(g_ops, recv);
    }
    /* in place: recv is this rank's chunk of send; the sum lands there and the other
     * chunks of send are left as they were (blocking, then async) */
    for (int async = 0; async < 2; async++) {
        float *send = upload(h, tot);
        if (async) {
            mt_comm_request *q = NULL;
            OK(mt_comm_reduce_scatter_start(c, send, send + displ[r], counts, MT_COMM_F32, &q));
            OK(mt_comm_wait(q));
        } else {
            OK(mt_comm_reduce_scatter(c, send, send + displ[r], counts, MT_COMM_F32));
        }
        download(got, send, tot);
        for (int64_t k = 0; k < tot; k++) {
            const int mine = k >= displ[r] && k < displ[r] + counts[r];
            const float want_v = mine ? (float)(n * (n + 1) / 2 * (k + 1)) : h[k];
            CHECK(got[k] == want_v, "%s in-place reduce_scatter%s: element %lld is %g, want %g", label,
                  async ? "_start" : "", (long long)k, got[k], want_v);
        }
        g_ops->ops->release(g_ops, send);
    }
    free(h);
    free(got);
}

/* all_reduce (blocking and async), all_reduce_max, broadcast, sendrecv; then three
 * asynchronous collectives outstanding at once, waited for in order. */
static void check_rest(mt_comm *c, const char *label) {
    const int n = mt_comm_size(c), r = mt_comm_rank(c);
    enum { K = 37 };
    float h[K], got[K];
    for (int async = 0; async < 2; async++) {
        for (int j = 0; j < K; j++) h[j] = (float)r + 0.5f * (float)j;
        float *buf = upload(h, K);
        const uint64_t b0 = mt_comm_bytes(c, MT_COLL_ALL_REDUCE);
        if (async) {
            mt_comm_request *q = NULL;
            OK(mt_comm_all_reduce_start(c, buf, K, MT_COMM_F32, &q));
            OK(mt_comm_wait(q));
        } else {
            OK(mt_comm_all_reduce(c, buf, K, MT_COMM_F32));
        }
        const uint64_t want = n > 1 ? 2 * (uint64_t)(n - 1) * K * 4 / (uint64_t)n : 0;
        CHECK(mt_comm_bytes(c, MT_COLL_ALL_REDUCE) - b0 == want, "%s all_reduce bytes %llu, formula %llu", label,
              (unsigned long long)(mt_comm_bytes(c, MT_COLL_ALL_REDUCE) - b0), (unsigned long long)want);
        download(got, buf, K);
        for (int j = 0; j < K; j++) {
            const float w = (float)(n * (n - 1) / 2) + (float)n * 0.5f * (float)j;
            CHECK(got[j] == w, "%s all_reduce%s: element %d is %g, want %g", label, async ? "_start" : "", j, got[j], w);
        }
        g_ops->ops->release(g_ops, buf);
    }
    for (int j = 0; j < K; j++) h[j] = (float)(r * j);
    float *buf = upload(h, K);
    OK(mt_comm_all_reduce_max(c, buf, K, MT_COMM_F32));
    download(got, buf, K);
    for (int j = 0; j < K; j++) CHECK(got[j] == (float)((n - 1) * j), "%s all_reduce_max: element %d is %g", label, j, got[j]);
    g_ops->ops->release(g_ops, buf);

    const int root = n - 1;
    for (int j = 0; j < K; j++) h[j] = r == root ? (float)(7 * j + 1) : -3.0f;
    buf = upload(h, K);
    const uint64_t bb = mt_comm_bytes(c, MT_COLL_BROADCAST);
    OK(mt_comm_broadcast(c, buf, K, MT_COMM_F32, root));
    CHECK(mt_comm_bytes(c, MT_COLL_BROADCAST) - bb == (n > 1 && r == root ? (uint64_t)K * 4 : 0),
          "%s broadcast bytes", label);
    download(got, buf, K);
    for (int j = 0; j < K; j++) CHECK(got[j] == (float)(7 * j + 1), "%s broadcast: element %d is %g", label, j, got[j]);
    g_ops->ops->release(g_ops, buf);

    for (int j = 0; j < K; j++) h[j] = (float)(1000 * r + j);
    float *sb = upload(h, K), *rb = upload(h, K);
    OK(mt_comm_sendrecv(c, sb, (r + 1) % n, rb, (r + n - 1) % n, K, MT_COMM_F32));
    download(got, rb, K);
    for (int j = 0; j < K; j++)
        CHECK(got[j] == (float)(1000 * ((r + n - 1) % n) + j), "%s sendrecv: element %d is %g", label, j, got[j]);
    g_ops->ops->release(g_ops, sb);
    g_ops->ops->release(g_ops, rb);

    /* three outstanding: gather (uneven), reduce_scatter (equal), all_reduce */
    int64_t cg[64], ce[64];
    for (int i = 0; i < n; i++) {
        cg[i] = i % 2 ? 3 : 5;
        ce[i] = 4;
    }
    const int64_t tg = total_of(cg, n), te = total_of(ce, n);
    float *hg = malloc(sizeof(float) * (size_t)(tg + te + K)), *og = malloc(sizeof(float) * (size_t)(tg + te + K));
    for (int64_t j = 0; j < cg[r]; j++) hg[j] = (float)(10 * r + j);
    float *gs = upload(hg, cg[r]), *gr = upload(hg, tg);
    for (int64_t k = 0; k < te; k++) hg[k] = (float)(k + 1);
    float *ss = upload(hg, te), *sr = upload(hg, ce[r]);
    for (int j = 0; j < K; j++) hg[j] = 1.0f;
    float *ab = upload(hg, K);
    mt_comm_request *q1 = NULL, *q2 = NULL, *q3 = NULL;
    OK(mt_comm_all_gather_start(c, gs, gr, cg, MT_COMM_F32, &q1));
    OK(mt_comm_reduce_scatter_start(c, ss, sr, ce, MT_COMM_F32, &q2));
    OK(mt_comm_all_reduce_start(c, ab, K, MT_COMM_F32, &q3));
    OK(mt_comm_wait(q1));
    OK(mt_comm_wait(q2));
    OK(mt_comm_wait(q3));
    download(og, gr, tg);
    for (int i = 0, d = 0; i < n; d += (int)cg[i], i++)
        for (int64_t j = 0; j < cg[i]; j++)
            CHECK(og[d + j] == (float)(10 * i + j), "%s outstanding all_gather: chunk %d element %lld is %g", label, i,
                  (long long)j, og[d + j]);
    download(og, sr, ce[r]);
    for (int64_t j = 0; j < ce[r]; j++)
        CHECK(og[j] == (float)(n * (4 * r + j + 1)), "%s outstanding reduce_scatter: element %lld is %g", label,
              (long long)j, og[j]);
    download(og, ab, K);
    for (int j = 0; j < K; j++) CHECK(og[j] == (float)n, "%s outstanding all_reduce: element %d is %g", label, j, og[j]);
    g_ops->ops->release(g_ops, gs);
    g_ops->ops->release(g_ops, gr);
    g_ops->ops->release(g_ops, ss);
    g_ops->ops->release(g_ops, sr);
    g_ops->ops->release(g_ops, ab);
    free(hg);
    free(og);
    CHECK(mt_comm_wait(NULL) == MT_OK, "mt_comm_wait(NULL)");
}

/* MT_COMM_BF16 sums (comm.h): all_reduce (blocking and async) and reduce_scatter of bf16
 * buffers made by from_f32 on the compute stream and read back by to_f32. Elements
 * r + j / 2 (and their sums, at most 7 significant bits) are exact in bf16 in any
 * order, so the result is compared for equality; on two ranks one more element tests the
 * rounding: 1 + 3 x 2^-9 (rank 0: 1, rank 1: 3 x 2^-9) rounds to nearest 1 + 2^-7 (a
 * truncating or bitwise sum would not). Bytes: 2 per element. */
static void *bf16_upload(const float *host, int64_t n) {
    float *f = upload(host, n);
    void *b = tool_alloc(g_ops, (size_t)(n > 0 ? n : 1) * 2);
    if (n) TOOL_OK(g_ops->ops->from_f32(g_ops, b, MT_BF16, f, n, 0, 0, 0));
    g_ops->ops->release(g_ops, f);
    return b;
}
static void bf16_download(float *host, void *b, int64_t n) {
    float *f = tool_alloc(g_ops, (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (n) TOOL_OK(g_ops->ops->to_f32(g_ops, f, b, MT_BF16, n));
    download(host, f, n);
    g_ops->ops->release(g_ops, f);
}
static void check_bf16(mt_comm *c, const char *label) {
    const int n = mt_comm_size(c), r = mt_comm_rank(c);
    enum { K = 33 };
    float h[K + 1], got[K + 1];
    const int64_t k = n == 2 ? K + 1 : K;
    for (int async = 0; async < 2; async++) {
        for (int j = 0; j < K; j++) h[j] = (float)r + 0.5f * (float)j;
        h[K] = r == 0 ? 1.0f : 3.0f / 512.0f;
        void *buf = bf16_upload(h, k);
        const uint64_t b0 = mt_comm_bytes(c, MT_COLL_ALL_REDUCE);
        if (async) {
            mt_comm_request *q = NULL;
            OK(mt_comm_all_reduce_start(c, buf, k, MT_COMM_BF16, &q));
            OK(mt_comm_wait(q));
        } else {
            OK(mt_comm_all_reduce(c, buf, k, MT_COMM_BF16));
        }
        const uint64_t want = n > 1 ? 2 * (uint64_t)(n - 1) * (uint64_t)k * 2 / (uint64_t)n : 0;
        CHECK(mt_comm_bytes(c, MT_COLL_ALL_REDUCE) - b0 == want, "%s bf16 all_reduce bytes %llu, formula %llu", label,
              (unsigned long long)(mt_comm_bytes(c, MT_COLL_ALL_REDUCE) - b0), (unsigned long long)want);
        bf16_download(got, buf, k);
        for (int j = 0; j < K; j++) {
            const float w = (float)(n * (n - 1) / 2) + (float)n * 0.5f * (float)j;
            CHECK(got[j] == w, "%s bf16 all_reduce%s: element %d is %g, want %g", label, async ? "_start" : "", j,
                  got[j], w);
        }
        if (n == 2)
            CHECK(got[K] == 1.0f + 1.0f / 128.0f, "%s bf16 all_reduce%s: 1 + 3 x 2^-9 is %.9g, want 1 + 2^-7", label,
                  async ? "_start" : "", got[K]);
        g_ops->ops->release(g_ops, buf);
    }
    int64_t ce[64];
    for (int i = 0; i < n; i++) ce[i] = 3;
    float hs[3 * 64], gs[3];
    for (int i = 0; i < 3 * n; i++) hs[i] = (float)(i + r);
    void *send = bf16_upload(hs, 3 * n), *recv = bf16_upload(hs, 3);
    const uint64_t b0 = mt_comm_bytes(c, MT_COLL_REDUCE_SCATTER);
    OK(mt_comm_reduce_scatter(c, send, recv, ce, MT_COMM_BF16));
    CHECK(mt_comm_bytes(c, MT_COLL_REDUCE_SCATTER) - b0 == (uint64_t)(n - 1) * 3 * 2, "%s bf16 reduce_scatter bytes",
          label);
    bf16_download(gs, recv, 3);
    for (int j = 0; j < 3; j++) {
        const float w = (float)(n * (3 * r + j) + n * (n - 1) / 2);
        CHECK(gs[j] == w, "%s bf16 reduce_scatter: element %d is %g, want %g", label, j, gs[j], w);
    }
    CHECK(mt_comm_all_reduce(c, send, 1, MT_COMM_U16) == MT_ERR_INVALID, "%s raw 16-bit sum not refused", label);
    g_ops->ops->release(g_ops, send);
    g_ops->ops->release(g_ops, recv);
}

/* Overlap on the CPU: an all_gather of 1 MiB per rank (far above Open MPI's eager
 * limits, so it needs progress after the start) must complete while this rank only
 * sleeps, before mt_comm_wait is called: the MPI backend's progress thread moves it.
 * The probe reads the last element of each peer's chunk (volatile) every 1 ms, for
 * at most 5 s; then waits and checks every element. */
static void check_progress(mt_comm *c) {
    const int n = mt_comm_size(c), r = mt_comm_rank(c);
    if (n == 1) return;
    enum { C = 262144 };
    int64_t counts[64];
    for (int i = 0; i < n; i++) counts[i] = C;
    float *send = malloc(sizeof(float) * C), *recv = calloc((size_t)n * C, sizeof(float));
    for (int j = 0; j < C; j++) send[j] = (float)(r + 1);
    mt_comm_request *q = NULL;
    OK(mt_comm_all_gather_start(c, send, recv, counts, MT_COMM_F32, &q));
    int ms = 0, arrived = 0;
    for (; ms < 5000 && !arrived; ms++) {
        arrived = 1;
        for (int i = 0; i < n; i++)
            if (((volatile float *)recv)[(size_t)i * C + C - 1] != (float)(i + 1)) arrived = 0;
        if (!arrived) nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    CHECK(arrived, "progress: the all_gather did not complete within 5 s before mt_comm_wait (no overlap)");
    OK(mt_comm_wait(q));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < C; j++)
            if (recv[(size_t)i * C + j] != (float)(i + 1)) {
                CHECK(0, "progress: chunk %d element %d is %g", i, j, recv[(size_t)i * C + j]);
                i = n;
                break;
            }
    if (r == 0 && arrived) printf("comm_check: 1 MiB all_gather complete %d ms after its start, before the wait\n", ms);
    free(send);
    free(recv);
}

static void check_all(mt_comm_mem mem) {
    const int W = mt_comm_world_size(), R = mt_comm_world_rank();
    mt_comm *world = NULL, *pair = NULL;
    OK(mt_comm_split_on(&world, 0, R, "checkworld", mem));
    if (!world) return;
    CHECK(mt_comm_is_device(world) == (mem == MT_COMM_DEVICE), "mt_comm_is_device");
    int64_t uneven[64], equal[64];
    for (int i = 0; i < W; i++) {
        uneven[i] = i == 1 ? 0 : 2 + i; /* chunk 1 empty */
        equal[i] = 3;
    }
    check_gather_scatter(world, uneven, "world/uneven");
    check_gather_scatter(world, equal, "world/equal");
    check_rest(world, "world");
    check_bf16(world, "world");
    if (mem == MT_COMM_HOST) check_progress(world);
    /* a sub-group: ranks paired by R / 2 (a group of one for an odd last rank) */
    OK(mt_comm_split_on(&pair, R / 2, R, "checkpair", mem));
    if (pair) {
        int64_t pc[2] = {3, 1};
        check_gather_scatter(pair, pc, "pair");
        check_rest(pair, "pair");
    }
    OK(mt_comm_barrier(world));
    mt_comm_free(pair);
    mt_comm_free(world);
}

#ifdef MT_HAVE_NCCL
/* The NCCL backend on a group of one: a unique id made here, no MPI needed. */
static void check_nccl1(void) {
    unsigned char id[512];
    mt_nccl *n = NULL;
    OK(mt_nccl_select_device(0, 0));
    OK(mt_nccl_get_id(id));
    OK(mt_nccl_create(&n, id, 1, 0, "one", 0));
    if (!n) return;
    enum { K = 1000 };
    float h[K], got[K];
    for (int j = 0; j < K; j++) h[j] = (float)j - 3.5f;
    float *a = upload(h, K), *b = upload(h, K);
    void *done = NULL;
    int64_t cnt[1] = {K};
    for (int rep = 0; rep < 40; rep++) { /* more launches than the event queue holds */
        OK(mt_nccl_all_reduce(n, a, K, MT_COMM_F32, rep % 2, &done));
        OK(mt_nccl_wait(done));
    }
    OK(mt_nccl_all_gather(n, a, b, cnt, MT_COMM_F32, &done));
    OK(mt_nccl_wait(done));
    download(got, b, K);
    for (int j = 0; j < K; j++) CHECK(got[j] == h[j], "nccl1 all_gather: element %d is %g", j, got[j]);
    OK(mt_nccl_reduce_scatter(n, a, b, cnt, MT_COMM_F32, &done));
    OK(mt_nccl_wait(done));
    OK(mt_nccl_broadcast(n, b, K, MT_COMM_F32, 0, &done));
    OK(mt_nccl_wait(done));
    download(got, b, K);
    for (int j = 0; j < K; j++) CHECK(got[j] == h[j], "nccl1 reduce_scatter+broadcast: element %d is %g", j, got[j]);
    OK(mt_nccl_sendrecv(n, a, 0, b, 0, K, MT_COMM_F32, &done));
    OK(mt_nccl_wait(done));
    download(got, b, K);
    for (int j = 0; j < K; j++) CHECK(got[j] == h[j], "nccl1 sendrecv to self: element %d is %g", j, got[j]);
    char msg[256];
    CHECK(mt_nccl_poll(30.0, msg, sizeof msg) == 0, "nccl1: the watchdog poll reports a fault");
    OK(mt_nccl_sync());
    g_ops->ops->release(g_ops, a);
    g_ops->ops->release(g_ops, b);
    mt_nccl_free(n);
}

/* mt_nccl_poll ends a collective that cannot complete (see the header). */
static int check_nccl1_hang(void) {
    unsigned char id[512];
    mt_nccl *n = NULL;
    OK(mt_nccl_select_device(0, 0));
    OK(mt_nccl_get_id(id));
    OK(mt_nccl_create(&n, id, 1, 0, "one", 0));
    if (!n) return 1;
    float *b = tool_alloc(g_ops, 16 * sizeof(float));
    void *done = NULL;
    if (mt_nccl_sendrecv(n, NULL, -1, b, 0, 16, MT_COMM_F32, &done) != MT_OK) {
        printf("comm_check: nccl1-hang: NCCL refused a receive with no matching send (%s): skipped\n",
               mt_last_error());
        return 77;
    }
    char msg[320] = "";
    int fired = 0;
    for (int i = 0; i < 100 && !fired; i++) {
        nanosleep(&(struct timespec){0, 100000000}, NULL);
        fired = mt_nccl_poll(1.0, msg, sizeof msg);
    }
    CHECK(fired, "nccl1-hang: the poll did not end the unmatched receive within 10 s");
    if (fired) printf("comm_check: nccl1-hang: %s\n", msg);
    CHECK(!fired || strstr(msg, "rank 0: recv (ncclRecv) on the 'one' communicator did not complete in 1 s"),
          "nccl1-hang: message '%s'", msg);
    fflush(stdout);
    _exit(g_fail ? 1 : 0); /* the aborted communicator's kernel: leave it to the driver */
}
#endif

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    const int device = !strcmp(mode, "device") || !strcmp(mode, "nccl1") || !strcmp(mode, "device-hang") ||
                       !strcmp(mode, "nccl1-hang");
    if (device) {
        if (mt_backend_create(MT_BACKEND_CUDA, &g_ops) != MT_OK) g_ops = NULL;
        if (!g_ops || !mt_comm_have_nccl()) {
            printf("comm_check: %s: no GPU or no NCCL in this build: skipped\n", mode);
            return 77;
        }
    } else {
        g_ops = mt_cpu_backend();
    }
    if (!strcmp(mode, "hang") || !strcmp(mode, "device-hang")) {
        mt_comm_set_process_control(1);
        mt_comm_set_timeout(1.0);
    }
    if (mt_comm_world_init() != MT_OK) {
        fprintf(stderr, "comm_check: %s\n", mt_last_error());
        return 1;
    }
    if (!strcmp(mode, "host") || !strcmp(mode, "device")) {
        check_all(device ? MT_COMM_DEVICE : MT_COMM_HOST);
    } else if (!strcmp(mode, "nccl1")) {
#ifdef MT_HAVE_NCCL
        check_nccl1();
#endif
    } else if (!strcmp(mode, "nccl1-hang")) {
#ifdef MT_HAVE_NCCL
        return check_nccl1_hang();
#endif
    } else if (!strcmp(mode, "hang") || !strcmp(mode, "device-hang")) {
        if (mt_comm_world_size() < 2) {
            fprintf(stderr, "comm_check: %s needs 2 ranks\n", mode);
            return 1;
        }
        mt_comm *c = NULL;
        OK(mt_comm_split_on(&c, 0, mt_comm_world_rank(), "hangworld", device ? MT_COMM_DEVICE : MT_COMM_HOST));
        if (!c) return 1;
        if (mt_comm_world_rank() == 1) sleep(6); /* joins late: rank 0 must not wait forever */
        int64_t counts[2] = {4, 4};
        float h[8] = {0};
        float *s = upload(h, 4), *r = upload(h, 8);
        mt_comm_request *q = NULL;
        OK(mt_comm_all_gather_start(c, s, r, counts, MT_COMM_F32, &q));
        OK(mt_comm_wait(q));
        OK(mt_comm_barrier(c)); /* device: host waits for the stream here */
        fprintf(stderr, "comm_check: rank %d: the late collective completed (watchdog did not fire)\n",
                mt_comm_world_rank());
        return mt_comm_world_rank() == 0 ? 3 : 0;
    } else {
        fprintf(stderr, "usage: comm_check host|device|nccl1|nccl1-hang|hang|device-hang\n");
        return 2;
    }
    if (g_fail) {
        fprintf(stderr, "comm_check: rank %d: %d check(s) failed\n", mt_comm_world_rank(), g_fail);
        return 1;
    }
    if (mt_comm_world_rank() == 0) printf("comm_check: ok (%s, %d ranks)\n", mode, mt_comm_world_size());
    return 0;
}
