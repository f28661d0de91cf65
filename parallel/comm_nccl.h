/* parallel/comm_nccl.h: the NCCL backend's internal interface, used by
 * parallel/comm_mpi.c only (not installed, not for models/ or train/). Everything here
 * exists when MT_HAVE_NCCL is defined (CUDA and NCCL found at configure time).
 *
 * One mt_nccl per device communicator: an ncclComm_t, a communication stream
 * (cudaStreamNonBlocking, so it never synchronises implicitly with the compute
 * stream), an event recorded on the compute stream before each launch (the comm
 * stream waits on it) and a queue of completion events (the compute stream waits on
 * one in mt_nccl_wait; the watchdog polls the oldest). Every call here is made by the
 * thread that drives the device, except mt_nccl_poll (the watchdog thread). */
#ifndef MT_PARALLEL_COMM_NCCL_H
#define MT_PARALLEL_COMM_NCCL_H

#include <stddef.h>
#include <stdint.h>
#include "parallel/comm.h"

#ifdef MT_HAVE_NCCL

typedef struct mt_nccl mt_nccl;

/* The CUDA backend's compute stream (a cudaStream_t), defined in
 * kernels/cuda/cuda_backend.cu: every op of the CUDA backend is queued there. */
void *mt_cuda_compute_stream(void);

/* Select this process's GPU once: local_rank modulo the visible devices.
 * Errors: MT_ERR_UNSUPPORTED (no device), MT_ERR_RUNTIME (cudaSetDevice). */
mt_status mt_nccl_select_device(int local_rank, int world_rank);

/* Bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES). */
size_t mt_nccl_id_bytes(void);
/* id[mt_nccl_id_bytes()] = a new unique id (ncclGetUniqueId). Errors: MT_ERR_RUNTIME. */
mt_status mt_nccl_get_id(void *id);

/* The NCCL communicator of rank `rank` in a group of `size` (> 1) sharing `id`
 * (ncclCommInitRank; collective over the group), with its stream and events. `name`
 * (kept by pointer: it lives with the mt_comm) names the group in messages.
 * Errors: MT_ERR_RUNTIME naming world_rank, the group and NCCL's text; MT_ERR_OOM. */
mt_status mt_nccl_create(mt_nccl **out, const void *id, int size, int rank, const char *name, int world_rank);
/* Destroy (ncclCommDestroy after the stream drains; nothing for one the watchdog
 * aborted, which ncclCommAbort freed). */
void mt_nccl_free(mt_nccl *n);

/* dst[bytes] = src[bytes] on the compute stream (a device group of one). */
mt_status mt_nccl_copy(void *dst, const void *src, size_t bytes);
/* cudaStreamSynchronize(compute stream). Errors: MT_ERR_RUNTIME. */
mt_status mt_nccl_sync(void);

/* Collectives on device buffers, same contracts as comm.h's. Each is queued on n's
 * comm stream after the compute stream's work so far; *done (a cudaEvent_t) is the
 * event that completes with it, for mt_nccl_wait. Errors: MT_ERR_RUNTIME naming the
 * rank, what and the group; MT_ERR_INVALID (a dtype NCCL cannot reduce). */
mt_status mt_nccl_all_reduce(mt_nccl *n, void *buf, int64_t count, mt_comm_dtype dt, int max, void **done);
/* counts[size]: equal counts use ncclReduceScatter; uneven counts one ncclReduce per
 * chunk (root = the chunk's owner) inside ncclGroupStart/End. */
mt_status mt_nccl_reduce_scatter(mt_nccl *n, const void *send, void *recv, const int64_t *counts,
                                 mt_comm_dtype dt, void **done);
/* counts[size]: equal counts use ncclAllGather; uneven counts one ncclBroadcast per
 * chunk (root = the chunk's owner) inside ncclGroupStart/End. */
mt_status mt_nccl_all_gather(mt_nccl *n, const void *send, void *recv, const int64_t *counts, mt_comm_dtype dt,
                             void **done);
mt_status mt_nccl_broadcast(mt_nccl *n, void *buf, int64_t count, mt_comm_dtype dt, int root, void **done);
/* ncclSend of sbuf to `to` and ncclRecv of rbuf from `from` in one group; a NULL
 * buffer (or a peer < 0) leaves that half out. */
mt_status mt_nccl_sendrecv(mt_nccl *n, const void *sbuf, int to, void *rbuf, int from, int64_t count,
                           mt_comm_dtype dt, void **done);
/* The compute stream waits for `done` (cudaStreamWaitEvent). Errors: MT_ERR_RUNTIME. */
mt_status mt_nccl_wait(void *done);

/* Watchdog (another thread): for every live NCCL communicator, drop the completed
 * collectives from its queue; if the oldest left has run `timeout_s` seconds or more,
 * or ncclCommGetAsyncError reports an error, call ncclCommAbort on it and fill
 * msg[cap] with "rank R: <what> on the '<group>' communicator ..." and return 1.
 * Returns 0 when nothing is wrong. */
int mt_nccl_poll(double timeout_s, char *msg, size_t cap);

#endif /* MT_HAVE_NCCL */
#endif
