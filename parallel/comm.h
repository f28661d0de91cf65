/* parallel/comm.h: communicators and collectives (one communicator per mesh
 * axis; NCCL on device buffers, MPI on host buffers).
 *
 * models/ and train/ call only this header, never mpi.h (or nccl.h). A communicator
 * is a group of ranks (one mesh axis, data x fsdp, or the world). Two backends:
 * - MPI (parallel/comm_mpi.c): HOST buffers (the CPU backend's tensors are host
 *   memory). A process not started by mpirun (no OMPI_COMM_WORLD_SIZE / PMI_SIZE in
 *   the environment) runs as a world of one without touching MPI, and every
 *   collective on a group of one is a local copy that moves 0 bytes.
 * - NCCL (parallel/comm_nccl.c, built when CUDA and NCCL are found): a communicator
 *   split with MT_COMM_DEVICE (mt_comm_split_on, mt_mesh_create_on) also carries an
 *   NCCL communicator of the same group, created from a unique id that the group's
 *   rank 0 broadcasts over MPI (ncclCommInitRank). A call on such a communicator whose
 *   buffer is DEVICE memory (cudaPointerGetAttributes: device or managed) goes to
 *   NCCL; a host buffer on the same communicator still goes to MPI, so host-side
 *   sums (loss counts, checkpoint gathers) need no second communicator.
 *   NCCL work runs on a communication stream of its own (one per communicator,
 *   non-blocking): an event recorded on the CUDA backend's compute stream
 *   (mt_cuda_compute_stream) before the call makes the comm stream wait for the
 *   compute work that produced the input, and an event recorded after it makes the
 *   compute stream wait before the result is used (mt_comm_wait, or at once for the
 *   blocking calls). So a "blocking" NCCL call returns when the collective is QUEUED:
 *   the buffers are ordered with the compute stream, not the host (copy_to_host and
 *   be->ops->sync wait for it). On a device group of one the local copy is a
 *   cudaMemcpyAsync on the compute stream.
 * - Staged (parallel/comm_mpi.c): a DEVICE buffer that does not go to NCCL (a build
 *   without NCCL, such as the CUDA emulator's, or a communicator split with
 *   MT_COMM_HOST) is copied to host memory, passed to MPI and copied back, once the
 *   process has named its device backend (mt_comm_set_device_backend), through
 *   page-locked buffers that are reused (mt_backend_host_alloc; at most 16 in use at
 *   once): correct on any layout, slow (two synchronising copies per call), and what
 *   multi-rank backend=cuda runs on in CI under the emulator. Byte accounting is the
 *   same as for the other paths (what crosses the network, not the staging copies).
 * mt_comm_backend() says whether MPI runs; mt_comm_is_device() whether a communicator
 * carries NCCL.
 *
 * Reductions are sums. Every call adds the bytes THIS rank sends under the ring
 * algorithm (NCCL's accounting; Patarasuk & Yuan 2009) to the communicator's counter
 * of that collective kind, for a payload of S bytes on a group of n ranks:
 *   all_reduce     2 (n - 1) S / n        (reduce-scatter + all-gather; integer division)
 *   reduce_scatter S_total - S_own        (S_total = all chunks; (n-1)/n S_total if equal)
 *   all_gather     S_total - S_own
 *   broadcast      S on the root, 0 elsewhere
 *   send           S (recv counts nothing; sendrecv counts its send half)
 *   barrier        0
 * so the bytes per rank per step of a layout can be checked against a formula.
 *
 * Failures: communicators return errors instead of aborting (MPI_ERRORS_RETURN);
 * a failed call returns MT_ERR_RUNTIME naming this rank, the collective and the
 * group. When the program asks for it (mt_comm_set_process_control(1): the CLI does,
 * a library user may), a watchdog thread watches the collective in progress: if one
 * does not complete within the timeout (mt_comm_set_timeout, default 30 s) it writes
 * "meshtrain: rank R: <collective> on <group> did not complete in T s ..." to stderr
 * and ends the process with exit status 1 (a peer that died or hangs would otherwise
 * hang this rank forever); mpirun then stops the remaining ranks. A rank killed
 * outright is reported by mpirun, which stops the others. Without process control the
 * library never ends the process or installs signal handlers.
 * NCCL: the same watchdog polls each NCCL communicator's oldest queued collective
 * (cudaEventQuery on its completion event) and its asynchronous error
 * (ncclCommGetAsyncError); a collective not complete within the timeout (counted from
 * its launch, so it includes compute work it was queued behind), or an
 * asynchronous error, makes it call ncclCommAbort on that communicator (which ends
 * the kernels stuck on it), write the same message naming the rank, the collective
 * and the group, and end the process with exit status 1. Without process control a
 * hung NCCL collective is the caller's to notice (its next stream synchronisation
 * does not return). */
#ifndef MT_PARALLEL_COMM_H
#define MT_PARALLEL_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_comm_dtype {
    MT_COMM_F32 = 0, /* float */
    MT_COMM_F64 = 1, /* double */
    MT_COMM_I64 = 2, /* int64_t */
    MT_COMM_U16 = 3, /* 16-bit payload (bf16 bits): gather, broadcast, send only */
    MT_COMM_BF16 = 4 /* bfloat16 (runtime/dtype.h mt_bf16): moved like U16, and summable (see below) */
} mt_comm_dtype;

/* Sums of MT_COMM_BF16 (all_reduce, reduce_scatter): MPI and NCCL have no bf16 sum in
 * common, so it is defined here as the sum of the operands widened (exactly) to fp32
 * and rounded to nearest even once per reduction step: each step that combines a
 * partial result with a peer's adds two values in fp32 and rounds once. MPI: a
 * user-defined commutative operation (MPI_Op_create) on 16-bit elements with that rule;
 * NCCL: ncclBfloat16 with ncclSum, which reduces the same way (each hop widens, adds in
 * fp32 and rounds to bf16). A group of n ranks combines n - 1 times, so an element of
 * the result errs from the exact sum of its bf16 operands by at most (n - 1) u times the
 * sum of their magnitudes (u = 2^-8, to first order; Higham 2002, "Accuracy and
 * Stability of Numerical Algorithms", section 4.2, recursive summation), and is the
 * same on every rank. all_reduce_max refuses it. */

typedef enum mt_coll_kind {
    MT_COLL_ALL_REDUCE = 0,
    MT_COLL_REDUCE_SCATTER,
    MT_COLL_ALL_GATHER,
    MT_COLL_BROADCAST,
    MT_COLL_SEND,
    MT_COLL_BARRIER,
    MT_COLL_KINDS
} mt_coll_kind;

typedef struct mt_comm mt_comm;

/* Bytes of one element of dt. */
size_t mt_comm_dtype_size(mt_comm_dtype dt);

/* Start the process group once per process (idempotent): MPI_Init_thread (asking for
 * MPI_THREAD_MULTIPLE, for the asynchronous collectives' progress thread) when started
 * by mpirun, else a world of one. Registers an exit handler that finalises MPI (with
 * a bounded wait, so a rank exiting on an error does not hang on its peers).
 * Errors: MT_ERR_RUNTIME (MPI init failed; or started by mpirun in a build without
 * MPI and the world has more than one rank). */
mt_status mt_comm_world_init(void);
/* Let the library own process-level failure handling: the collective watchdog (which
 * ends a hung rank with exit status 1) and a SIGTERM handler naming where the rank was
 * stopped. Off by default (a linked library must not end its host process); the CLI
 * turns it on. Takes effect at the next mt_comm_world_init that starts MPI. */
void mt_comm_set_process_control(int on);
/* The exit status this process has decided on (0..255; the CLI, once it returns from
 * a command): with process control on, a SIGTERM from the launcher after this ends the
 * process at once with that status and without the "stopped by the launcher" line.
 * mpirun takes the job down as soon as one rank exits non-zero, so the other ranks,
 * ending with the same verdict a moment later (bad input that every rank found), were
 * killed by the signal mid-exit, or printed that they were stopped. */
void mt_comm_set_exit_status(int status);
/* Join the caller's communicator instead: mpi_comm points to an MPI_Comm of an MPI the
 * caller initialised (and will finalise); it is duplicated. No exit handler, signal
 * handler or watchdog is installed: the caller's program decides how it ends. NULL
 * means mt_comm_world_init(). Call before any communicator is split.
 * Errors: MT_ERR_INVALID (MPI not initialised, or already joined to another
 * communicator), MT_ERR_RUNTIME (MPI_Comm_dup failed), MT_ERR_UNSUPPORTED (no MPI). */
mt_status mt_comm_world_init_from(void *mpi_comm);
int mt_comm_world_rank(void); /* 0 before init */
int mt_comm_world_size(void); /* 1 before init */
/* This process's rank among the world ranks on its node, and their count
 * (MPI_Comm_split_type MPI_COMM_TYPE_SHARED at world init; 0 and 1 before init and in a
 * world of one): the GPU a rank binds (kernels/backend.h mt_backend_bind_device). */
int mt_comm_local_rank(void);
int mt_comm_local_size(void);
/* "mpi" or "none" (world of one without MPI). */
const char *mt_comm_backend(void);

/* Seconds the watchdog lets one collective run before it ends the process (> 0). */
void mt_comm_set_timeout(double seconds);

/* A communicator of the world ranks with the same `color`, ordered by `key` (the
 * MPI_Comm_split rule), collective over the world. `name` (e.g. "data", "tensor")
 * appears in byte tables and error messages. Errors: MT_ERR_RUNTIME, MT_ERR_OOM. */
mt_status mt_comm_split(mt_comm **out, int color, int key, const char *name);

/* Where a communicator's collectives may take their buffers. */
typedef enum mt_comm_mem {
    MT_COMM_HOST = 0,  /* host buffers, MPI */
    MT_COMM_DEVICE = 1 /* also device buffers: NCCL (see the header comment) */
} mt_comm_mem;

/* The device backend whose buffers the communicators may be handed (process-wide: one
 * process drives one device): a buffer for which mt_backend_is_device_ptr(be, p) holds
 * and that does not go to NCCL is staged through host memory (header comment), and a
 * group-of-one "collective" copies it with be's copy ops. NULL (the default) forgets it:
 * buffers are then host memory or NCCL's. Call with no collective in flight; be must
 * outlive every later call (set NULL before freeing it). */
struct mt_backend;
void mt_comm_set_device_backend(struct mt_backend *be);

/* 1 when this build has the NCCL backend (CUDA and NCCL found at configure time). */
int mt_comm_have_nccl(void);

/* mt_comm_split, and with MT_COMM_DEVICE also the group's NCCL communicator
 * (collective over the group: rank 0 makes the unique id, MPI_Bcast sends it,
 * ncclCommInitRank on each rank; a group of one needs none). The first device split of
 * a process selects its GPU if nothing did before: the node-local rank
 * (mt_comm_local_rank) modulo the visible devices (cudaSetDevice); the trainer binds it
 * earlier and checks the counts (kernels/backend.h mt_backend_bind_device). One rank
 * per GPU (NCCL refuses two ranks on one device). A device group of one (any axis of size 1) has no NCCL communicator: its
 * collectives are local copies on the compute stream.
 * Errors: those of mt_comm_split; MT_ERR_UNSUPPORTED (MT_COMM_DEVICE in a build
 * without NCCL, or with no device visible); MT_ERR_RUNTIME naming the rank, the
 * group and NCCL's or CUDA's error text. */
mt_status mt_comm_split_on(mt_comm **out, int color, int key, const char *name, mt_comm_mem mem);
/* 1 when c was split with MT_COMM_DEVICE (its device buffers go to NCCL). */
int mt_comm_is_device(const mt_comm *c);
void mt_comm_free(mt_comm *c);

int mt_comm_rank(const mt_comm *c);
int mt_comm_size(const mt_comm *c);
const char *mt_comm_name(const mt_comm *c);

/* buf[count] = sum over the group of buf[count] (in place). dt: F32, F64, I64 or BF16. */
mt_status mt_comm_all_reduce(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt);

/* buf[count] = elementwise maximum over the group (in place). dt: F32 or F64. */
mt_status mt_comm_all_reduce_max(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt);

/* send holds the group's chunks back to back, chunk i of counts[i] elements;
 * recv[counts[rank]] = sum over the group of chunk `rank`. dt: F32, F64, I64 or BF16.
 * counts[] has mt_comm_size entries (each < 2^31). recv may be this rank's own chunk
 * inside send (in place, as NCCL's in-place reduce-scatter; on MPI with host buffers the
 * result is staged apart and copied into place); the rest of send is then unchanged. */
mt_status mt_comm_reduce_scatter(mt_comm *c, const void *send, void *recv, const int64_t *counts,
                                 mt_comm_dtype dt);

/* recv = the group's chunks back to back (chunk i: counts[i] elements from rank i);
 * this rank contributes send[counts[rank]]. send may point into recv at its own chunk. */
mt_status mt_comm_all_gather(mt_comm *c, const void *send, void *recv, const int64_t *counts,
                             mt_comm_dtype dt);

/* buf[count] of `root` copied to every rank. */
mt_status mt_comm_broadcast(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt, int root);

/* Point to point inside the group (ranks are group ranks), blocking. */
mt_status mt_comm_send(mt_comm *c, const void *buf, int64_t count, mt_comm_dtype dt, int peer);
mt_status mt_comm_recv(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt, int peer);
/* Send sbuf to `to` and receive rbuf from `from` at once (ring steps); no deadlock. */
mt_status mt_comm_sendrecv(mt_comm *c, const void *sbuf, int to, void *rbuf, int from, int64_t count,
                           mt_comm_dtype dt);

/* Every rank of the group reaches here (MPI_Barrier). On a device communicator the
 * compute stream is synchronised first, so the rank's queued device work (NCCL
 * collectives included) is done. */
mt_status mt_comm_barrier(mt_comm *c);
/* A barrier the watchdog allows `seconds` instead of the collective timeout: for ranks
 * waiting while one rank does long I/O (rank 0 writing a checkpoint). */
mt_status mt_comm_barrier_wait(mt_comm *c, double seconds);

/* ---- asynchronous collectives (both backends) ----
 * _start queues the collective and returns at once with *req; mt_comm_wait(req)
 * completes it and frees req. Between the two, the caller must neither write `send`
 * (or the in-place buffer) nor read `recv`. Several requests may be outstanding on one
 * communicator; every rank of the group starts the same collectives in the same order
 * (the MPI rule) and must wait on each of them. Same arguments, results, byte
 * accounting (counted at _start) and errors as the blocking calls above, whose
 * sequence _start + wait is. *req is NULL when nothing is left to wait for (a group of
 * one: the local copy is done at _start); mt_comm_wait(NULL) returns MT_OK.
 *   MPI (host buffers): MPI_Iallreduce / MPI_Ireduce_scatter / MPI_Iallgatherv, under
 *   the watchdog in the wait (its timeout counts from the start of the wait, the time
 *   this rank blocks). Open MPI advances a non-blocking collective only inside MPI
 *   calls, so a progress thread (started at the first _start when MPI provides
 *   MPI_THREAD_MULTIPLE, which mt_comm_world_init asks for) calls MPI_Test on the
 *   requests in flight about every 50 us and the wait waits for its word: the transfer
 *   overlaps the caller's compute. Without MPI_THREAD_MULTIPLE (a caller's MPI joined
 *   by mt_comm_world_init_from at a lower level) the wait is MPI_Wait and the transfer
 *   of messages above the eager limit happens in it.
 *   NCCL (device buffers): launched on the comm stream after the compute stream's
 *   work so far; wait makes the compute stream wait for it (the host does not
 *   block). */
typedef struct mt_comm_request mt_comm_request;

/* Asynchronous mt_comm_all_reduce (sum, in place). Errors: as mt_comm_all_reduce; MT_ERR_OOM. */
mt_status mt_comm_all_reduce_start(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt, mt_comm_request **req);
/* Asynchronous mt_comm_reduce_scatter. Errors: as mt_comm_reduce_scatter; MT_ERR_OOM. */
mt_status mt_comm_reduce_scatter_start(mt_comm *c, const void *send, void *recv, const int64_t *counts,
                                       mt_comm_dtype dt, mt_comm_request **req);
/* Asynchronous mt_comm_all_gather (send may point into recv at its own chunk).
 * Errors: as mt_comm_all_gather; MT_ERR_OOM. */
mt_status mt_comm_all_gather_start(mt_comm *c, const void *send, void *recv, const int64_t *counts,
                                   mt_comm_dtype dt, mt_comm_request **req);
/* Complete req (see above) and free it; NULL is a no-op. Errors: MT_ERR_RUNTIME naming
 * the rank, the collective and the group (MPI_Wait failed; NCCL: the event wait could
 * not be queued). */
mt_status mt_comm_wait(mt_comm_request *req);

/* Bytes this rank sent on c by collective kind (see the header comment), and the
 * sum over kinds; reset zeroes all kinds. */
uint64_t mt_comm_bytes(const mt_comm *c, mt_coll_kind kind);
uint64_t mt_comm_bytes_total(const mt_comm *c);
void mt_comm_reset_bytes(mt_comm *c);
const char *mt_coll_kind_name(mt_coll_kind kind);

#ifdef __cplusplus
}
#endif
#endif
