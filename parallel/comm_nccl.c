/* parallel/comm_nccl.c: the NCCL backend of parallel/comm.h (device buffers), used
 * through parallel/comm_mpi.c, which owns the communicators, the byte counters and the
 * MPI side (the unique id broadcast). Compiled to nothing without MT_HAVE_NCCL.
 *
 * Uneven all-gather / reduce-scatter counts (NCCL's own collectives need equal ones):
 * one ncclBroadcast (all-gather) or ncclReduce (reduce-scatter) per chunk, rooted at
 * the chunk's owner, fused in one ncclGroupStart/End, rather than padding every chunk
 * to the largest: no padded staging buffer outside the memory plan, and the result
 * lands in the caller's buffer in place. Equal counts take ncclAllGather and
 * ncclReduceScatter. The byte counters are kept by comm_mpi.c with the ring formula of
 * comm.h either way, so a layout counts the same bytes on both backends.
 *
 * UNVERIFIED: written on a machine without a GPU; it compiles and links, but no call
 * here has run yet (tests/test_gpu_nccl.sh runs it where a GPU is present). */
#ifdef MT_HAVE_NCCL
#include "parallel/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Completion events kept per communicator: a launch that finds the queue full waits
 * for the oldest on the host first (back-pressure; the watchdog still times it). */
#define MT_NCCL_QUEUE 32

struct mt_nccl {
    ncclComm_t comm;
    cudaStream_t stream;     /* the communication stream */
    cudaEvent_t before;      /* recorded on the compute stream before a launch */
    cudaEvent_t ev[MT_NCCL_QUEUE];
    double t0[MT_NCCL_QUEUE];          /* launch time (monotonic seconds) */
    const char *what[MT_NCCL_QUEUE];   /* collective name (static string) */
    int head, len;           /* the queue of launched, not yet completed collectives */
    int size, rank, aborted;
    const char *name;        /* the group's name (owned by the mt_comm) */
    struct mt_nccl *next;    /* the list the watchdog polls */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* the list and every queue */
static mt_nccl *g_list = NULL;
static int g_dev = -1, g_world_rank = 0;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static mt_status cuda_fail(const char *what, cudaError_t e) {
    (void)cudaGetLastError();
    return mt_set_error(MT_ERR_RUNTIME, "rank %d: %s failed: %s", g_world_rank, what, cudaGetErrorString(e));
}
#define CU_TRY(call)                                     \
    do {                                                 \
        cudaError_t e_ = (call);                         \
        if (e_ != cudaSuccess) return cuda_fail(#call, e_); \
    } while (0)

static mt_status nccl_fail(const mt_nccl *n, const char *what, ncclResult_t r) {
    const char *last = n && n->comm ? ncclGetLastError(n->comm) : NULL;
    return mt_set_error(MT_ERR_RUNTIME, "rank %d: %s on the '%s' communicator (%d ranks) failed: %s%s%s",
                        g_world_rank, what, n ? n->name : "?", n ? n->size : 0, ncclGetErrorString(r),
                        last && *last ? ": " : "", last ? last : "");
}

mt_status mt_nccl_select_device(int local_rank, int world_rank) {
    g_world_rank = world_rank;
    if (g_dev >= 0) return MT_OK;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return mt_set_error(MT_ERR_UNSUPPORTED, "rank %d: a device communicator needs a GPU, and none is visible",
                            world_rank);
    }
    const int dev = (local_rank < 0 ? 0 : local_rank) % n;
    CU_TRY(cudaSetDevice(dev));
    g_dev = dev;
    return MT_OK;
}

size_t mt_nccl_id_bytes(void) { return sizeof(ncclUniqueId); }

mt_status mt_nccl_get_id(void *id) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_fail(NULL, "ncclGetUniqueId", r);
    memcpy(id, &u, sizeof u);
    return MT_OK;
}

mt_status mt_nccl_create(mt_nccl **out, const void *id, int size, int rank, const char *name, int world_rank) {
    *out = NULL;
    g_world_rank = world_rank;
    mt_nccl *n = calloc(1, sizeof *n);
    if (!n) return mt_set_error(MT_ERR_OOM, "mt_nccl_create: out of memory");
    n->size = size;
    n->rank = rank;
    n->name = name;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t r = ncclCommInitRank(&n->comm, size, u, rank);
    if (r != ncclSuccess) {
        n->comm = NULL;
        mt_status st = nccl_fail(n, "ncclCommInitRank", r);
        free(n);
        return st;
    }
    cudaError_t e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->before, cudaEventDisableTiming);
    for (int i = 0; i < MT_NCCL_QUEUE && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&n->ev[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        mt_status st = cuda_fail("mt_nccl_create: stream or event", e);
        mt_nccl_free(n);
        return st;
    }
    pthread_mutex_lock(&g_mu);
    n->next = g_list;
    g_list = n;
    pthread_mutex_unlock(&g_mu);
    *out = n;
    return MT_OK;
}

void mt_nccl_free(mt_nccl *n) {
    if (!n) return;
    pthread_mutex_lock(&g_mu);
    for (mt_nccl **p = &g_list; *p; p = &(*p)->next)
        if (*p == n) {
            *p = n->next;
            break;
        }
    const int aborted = n->aborted;
    pthread_mutex_unlock(&g_mu);
    if (n->stream && !aborted) (void)cudaStreamSynchronize(n->stream);
    if (n->comm && !aborted) (void)ncclCommDestroy(n->comm); /* an aborted one is gone already */
    for (int i = 0; i < MT_NCCL_QUEUE; i++)
        if (n->ev[i]) (void)cudaEventDestroy(n->ev[i]);
    if (n->before) (void)cudaEventDestroy(n->before);
    if (n->stream) (void)cudaStreamDestroy(n->stream);
    (void)cudaGetLastError();
    free(n);
}

mt_status mt_nccl_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)mt_cuda_compute_stream()));
    return MT_OK;
}

mt_status mt_nccl_sync(void) {
    CU_TRY(cudaStreamSynchronize((cudaStream_t)mt_cuda_compute_stream()));
    return MT_OK;
}

/* Drop the completed collectives at the head of n's queue (caller holds g_mu). */
static void reap(mt_nccl *n) {
    while (n->len > 0) {
        cudaError_t e = cudaEventQuery(n->ev[n->head]);
        if (e == cudaErrorNotReady) return;
        if (e != cudaSuccess) { /* a device fault: leave it for the timeout to report */
            (void)cudaGetLastError();
            return;
        }
        n->head = (n->head + 1) % MT_NCCL_QUEUE;
        n->len--;
    }
}

/* Before a launch: the comm stream waits for the compute stream's work so far, and
 * the queue has a free slot. */
static mt_status begin(mt_nccl *n) {
    cudaStream_t cs = (cudaStream_t)mt_cuda_compute_stream();
    CU_TRY(cudaEventRecord(n->before, cs));
    CU_TRY(cudaStreamWaitEvent(n->stream, n->before, 0));
    pthread_mutex_lock(&g_mu);
    reap(n);
    if (n->len == MT_NCCL_QUEUE) {
        cudaEvent_t oldest = n->ev[n->head];
        pthread_mutex_unlock(&g_mu);
        CU_TRY(cudaEventSynchronize(oldest));
        pthread_mutex_lock(&g_mu);
        reap(n);
    }
    pthread_mutex_unlock(&g_mu);
    return MT_OK;
}

/* After a launch: record its completion event on the comm stream. */
static mt_status finish(mt_nccl *n, const char *what, void **done) {
    pthread_mutex_lock(&g_mu);
    const int slot = (n->head + n->len) % MT_NCCL_QUEUE;
    cudaError_t e = cudaEventRecord(n->ev[slot], n->stream);
    if (e == cudaSuccess) {
        n->t0[slot] = now_s();
        n->what[slot] = what;
        n->len++;
    }
    pthread_mutex_unlock(&g_mu);
    if (e != cudaSuccess) return cuda_fail("cudaEventRecord(comm stream)", e);
    *done = n->ev[slot];
    return MT_OK;
}

/* NCCL type of dt and the element multiplier: 16-bit payloads without a sum (U16) move as bytes. */
static ncclDataType_t nccl_type(mt_comm_dtype dt, size_t *mult) {
    *mult = 1;
    switch (dt) {
    case MT_COMM_F32: return ncclFloat32;
    case MT_COMM_F64: return ncclFloat64;
    case MT_COMM_I64: return ncclInt64;
    case MT_COMM_U16: *mult = 2; return ncclUint8;
    case MT_COMM_BF16: return ncclBfloat16; /* summed in fp32, rounded to bf16 per hop (comm.h) */
    }
    return ncclUint8;
}

#define NC_TRY(n, what, call)                                  \
    do {                                                       \
        ncclResult_t r_ = (call);                              \
        if (r_ != ncclSuccess) return nccl_fail(n, what, r_);  \
    } while (0)

mt_status mt_nccl_all_reduce(mt_nccl *n, void *buf, int64_t count, mt_comm_dtype dt, int max, void **done) {
    size_t k;
    const ncclDataType_t t = nccl_type(dt, &k);
    const char *what = max ? "all_reduce_max (ncclAllReduce)" : "all_reduce (ncclAllReduce)";
    if (k != 1) return mt_set_error(MT_ERR_INVALID, "%s: 16-bit payloads cannot be reduced", what);
    MT_TRY(begin(n));
    NC_TRY(n, what, ncclAllReduce(buf, buf, (size_t)count, t, max ? ncclMax : ncclSum, n->comm, n->stream));
    return finish(n, what, done);
}

static int equal_counts(const int64_t *counts, int size) {
    for (int i = 1; i < size; i++)
        if (counts[i] != counts[0]) return 0;
    return 1;
}

/* ncclGroupEnd after a failed call inside the group, keeping the first error. */
static mt_status group_end(mt_nccl *n, const char *what, mt_status st) {
    ncclResult_t r = ncclGroupEnd();
    if (st == MT_OK && r != ncclSuccess) return nccl_fail(n, what, r);
    return st;
}

mt_status mt_nccl_reduce_scatter(mt_nccl *n, const void *send, void *recv, const int64_t *counts,
                                 mt_comm_dtype dt, void **done) {
    size_t k;
    const ncclDataType_t t = nccl_type(dt, &k);
    if (k != 1) return mt_set_error(MT_ERR_INVALID, "reduce_scatter: 16-bit payloads cannot be summed");
    const size_t es = mt_comm_dtype_size(dt);
    MT_TRY(begin(n));
    if (equal_counts(counts, n->size)) {
        const char *what = "reduce_scatter (ncclReduceScatter)";
        NC_TRY(n, what, ncclReduceScatter(send, recv, (size_t)counts[0], t, ncclSum, n->comm, n->stream));
        return finish(n, what, done);
    }
    const char *what = "reduce_scatter (grouped ncclReduce)";
    NC_TRY(n, what, ncclGroupStart());
    mt_status st = MT_OK;
    size_t d = 0;
    for (int i = 0; i < n->size && st == MT_OK; i++) {
        if (counts[i] > 0) {
            ncclResult_t r = ncclReduce((const char *)send + d * es, recv, (size_t)counts[i], t, ncclSum, i, n->comm,
                                        n->stream);
            if (r != ncclSuccess) st = nccl_fail(n, what, r);
        }
        d += (size_t)counts[i];
    }
    MT_TRY(group_end(n, what, st));
    return finish(n, what, done);
}

mt_status mt_nccl_all_gather(mt_nccl *n, const void *send, void *recv, const int64_t *counts, mt_comm_dtype dt,
                             void **done) {
    size_t k;
    const ncclDataType_t t = nccl_type(dt, &k);
    const size_t es = mt_comm_dtype_size(dt);
    MT_TRY(begin(n));
    if (equal_counts(counts, n->size)) {
        const char *what = "all_gather (ncclAllGather)";
        NC_TRY(n, what, ncclAllGather(send, recv, (size_t)counts[0] * k, t, n->comm, n->stream));
        return finish(n, what, done);
    }
    const char *what = "all_gather (grouped ncclBroadcast)";
    NC_TRY(n, what, ncclGroupStart());
    mt_status st = MT_OK;
    size_t d = 0;
    for (int i = 0; i < n->size && st == MT_OK; i++) {
        if (counts[i] > 0) {
            char *dst = (char *)recv + d * es;
            const void *src = i == n->rank ? send : dst; /* sendbuff is read on the root only */
            ncclResult_t r = ncclBroadcast(src, dst, (size_t)counts[i] * k, t, i, n->comm, n->stream);
            if (r != ncclSuccess) st = nccl_fail(n, what, r);
        }
        d += (size_t)counts[i];
    }
    MT_TRY(group_end(n, what, st));
    return finish(n, what, done);
}

mt_status mt_nccl_broadcast(mt_nccl *n, void *buf, int64_t count, mt_comm_dtype dt, int root, void **done) {
    size_t k;
    const ncclDataType_t t = nccl_type(dt, &k);
    const char *what = "broadcast (ncclBroadcast)";
    MT_TRY(begin(n));
    NC_TRY(n, what, ncclBroadcast(buf, buf, (size_t)count * k, t, root, n->comm, n->stream));
    return finish(n, what, done);
}

mt_status mt_nccl_sendrecv(mt_nccl *n, const void *sbuf, int to, void *rbuf, int from, int64_t count,
                           mt_comm_dtype dt, void **done) {
    size_t k;
    const ncclDataType_t t = nccl_type(dt, &k);
    const int do_send = sbuf && to >= 0, do_recv = rbuf && from >= 0;
    const char *what = do_send && do_recv ? "sendrecv (ncclSend/ncclRecv)" : do_send ? "send (ncclSend)"
                                                                                   : "recv (ncclRecv)";
    MT_TRY(begin(n));
    NC_TRY(n, what, ncclGroupStart());
    mt_status st = MT_OK;
    ncclResult_t r = ncclSuccess;
    if (do_send) r = ncclSend(sbuf, (size_t)count * k, t, to, n->comm, n->stream);
    if (r == ncclSuccess && do_recv) r = ncclRecv(rbuf, (size_t)count * k, t, from, n->comm, n->stream);
    if (r != ncclSuccess) st = nccl_fail(n, what, r);
    MT_TRY(group_end(n, what, st));
    return finish(n, what, done);
}

mt_status mt_nccl_wait(void *done) {
    if (!done) return MT_OK;
    CU_TRY(cudaStreamWaitEvent((cudaStream_t)mt_cuda_compute_stream(), (cudaEvent_t)done, 0));
    return MT_OK;
}

int mt_nccl_poll(double timeout_s, char *msg, size_t cap) {
    static int dev_set = 0; /* the watchdog thread's current device */
    if (g_dev < 0) return 0;
    if (!dev_set) {
        if (cudaSetDevice(g_dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        dev_set = 1;
    }
    pthread_mutex_lock(&g_mu);
    for (mt_nccl *n = g_list; n; n = n->next) {
        if (n->aborted) continue;
        reap(n);
        ncclResult_t ar = ncclSuccess;
        if (ncclCommGetAsyncError(n->comm, &ar) != ncclSuccess) ar = ncclSuccess;
        const int late = n->len > 0 && now_s() - n->t0[n->head] >= timeout_s;
        if (!late && (ar == ncclSuccess || ar == ncclInProgress)) continue;
        const char *what = n->len > 0 ? n->what[n->head] : "a collective";
        if (late)
            snprintf(msg, cap, "rank %d: %s on the '%s' communicator did not complete in %.0f s "
                     "(a peer rank died or hangs); NCCL communicator aborted", g_world_rank, what, n->name,
                     now_s() - n->t0[n->head]);
        else
            snprintf(msg, cap, "rank %d: %s on the '%s' communicator failed: %s; NCCL communicator aborted",
                     g_world_rank, what, n->name, ncclGetErrorString(ar));
        n->aborted = 1;
        ncclComm_t comm = n->comm;
        pthread_mutex_unlock(&g_mu);
        (void)ncclCommAbort(comm);
        return 1;
    }
    pthread_mutex_unlock(&g_mu);
    return 0;
}

#else
typedef int mt_comm_nccl_unused; /* ISO C: a translation unit is not empty */
#endif
