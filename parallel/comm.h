/* parallel/comm.h: communicators and collectives (DESIGN.md section 5).
 *
 * models/ and train/ call only this header, never mpi.h (or nccl.h). A communicator
 * is a group of ranks (one mesh axis, data x fsdp, or the world). This build has the
 * MPI backend: buffers are HOST memory (the CPU backend's tensors are host memory);
 * a process not started by mpirun (no OMPI_COMM_WORLD_SIZE / PMI_SIZE in the
 * environment) runs as a world of one without touching MPI, and every collective on
 * a group of one is a local copy that moves 0 bytes. The NCCL backend (device
 * buffers, unique id broadcast over MPI) is not built yet: mt_comm_backend() says
 * which backend is active.
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
 * library never ends the process or installs signal handlers. */
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
    MT_COMM_U16 = 3  /* 16-bit payload (bf16 bits): gather, broadcast, send only */
} mt_comm_dtype;

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

/* Start the process group once per process (idempotent): MPI_Init_thread when started
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
/* Join the caller's communicator instead: mpi_comm points to an MPI_Comm of an MPI the
 * caller initialised (and will finalise); it is duplicated. No exit handler, signal
 * handler or watchdog is installed: the caller's program decides how it ends. NULL
 * means mt_comm_world_init(). Call before any communicator is split.
 * Errors: MT_ERR_INVALID (MPI not initialised, or already joined to another
 * communicator), MT_ERR_RUNTIME (MPI_Comm_dup failed), MT_ERR_UNSUPPORTED (no MPI). */
mt_status mt_comm_world_init_from(void *mpi_comm);
int mt_comm_world_rank(void); /* 0 before init */
int mt_comm_world_size(void); /* 1 before init */
/* "mpi" or "none" (world of one without MPI). */
const char *mt_comm_backend(void);

/* Seconds the watchdog lets one collective run before it ends the process (> 0). */
void mt_comm_set_timeout(double seconds);

/* A communicator of the world ranks with the same `color`, ordered by `key` (the
 * MPI_Comm_split rule), collective over the world. `name` (e.g. "data", "tensor")
 * appears in byte tables and error messages. Errors: MT_ERR_RUNTIME, MT_ERR_OOM. */
mt_status mt_comm_split(mt_comm **out, int color, int key, const char *name);
void mt_comm_free(mt_comm *c);

int mt_comm_rank(const mt_comm *c);
int mt_comm_size(const mt_comm *c);
const char *mt_comm_name(const mt_comm *c);

/* buf[count] = sum over the group of buf[count] (in place). dt: F32, F64 or I64. */
mt_status mt_comm_all_reduce(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt);

/* buf[count] = elementwise maximum over the group (in place). dt: F32 or F64. */
mt_status mt_comm_all_reduce_max(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt);

/* send holds the group's chunks back to back, chunk i of counts[i] elements;
 * recv[counts[rank]] = sum over the group of chunk `rank`. dt: F32, F64 or I64.
 * counts[] has mt_comm_size entries (each < 2^31). */
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

mt_status mt_comm_barrier(mt_comm *c);
/* A barrier the watchdog allows `seconds` instead of the collective timeout: for ranks
 * waiting while one rank does long I/O (rank 0 writing a checkpoint). */
mt_status mt_comm_barrier_wait(mt_comm *c, double seconds);

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
