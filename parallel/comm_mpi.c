/* parallel/comm_mpi.c: the MPI backend of parallel/comm.h (host buffers), with the
 * byte counters and the collective watchdog; it owns every communicator and hands the
 * device buffers of a device communicator to the NCCL backend (parallel/comm_nccl.c,
 * with MT_HAVE_NCCL), and stages the other device buffers through host memory
 * (mt_comm_set_device_backend). Without MT_HAVE_MPI (no MPI found at configure time)
 * only the world of one exists. */
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
#include "kernels/backend.h"
#include "runtime/dtype.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef MT_HAVE_MPI
#include <mpi.h>
#endif

struct mt_comm {
    char name[32];
    int rank, size;
    uint64_t bytes[MT_COLL_KINDS];
    int device;   /* split with MT_COMM_DEVICE */
#ifdef MT_HAVE_MPI
    MPI_Comm mpi; /* MPI_COMM_NULL for a group of one without MPI */
#endif
#ifdef MT_HAVE_NCCL
    mt_nccl *nccl; /* a device communicator of more than one rank */
#endif
};

/* An outstanding asynchronous collective (mt_comm_wait frees it). */
/* A buffer of a call as MPI sees it: host memory, or a host copy of a device buffer
 * (parallel/comm.h "Staged"): host is what MPI reads and writes; dev, when not NULL, is
 * the device buffer it stands for (copied back by stage_out), bytes its size. */
typedef struct mt_stage {
    void *host, *dev;
    size_t bytes;
    int plain;  /* dev is host memory (an in-place result staged apart: stage_apart) */
} mt_stage;

struct mt_comm_request {
    mt_comm *c;
    const char *what;  /* static string */
    void *nccl_done;   /* NCCL: the completion event; NULL for MPI */
    mt_stage stage[2]; /* staged device buffers: [0] written back at the wait, [1] freed */
#ifdef MT_HAVE_MPI
    MPI_Request mpi;
    int adopted;       /* owned by the progress thread until done */
    int done, rc;      /* set by the progress thread (under g_pg_mu) */
    struct mt_comm_request *next; /* the progress thread's list */
#endif
    int ic[];          /* MPI v-collectives: counts[size] then displacements[size], live until the wait */
};

static int g_inited = 0, g_use_mpi = 0, g_rank = 0, g_size = 1;
static int g_local_rank = 0, g_local_size = 1; /* among the world ranks on this node */
#ifdef MT_HAVE_MPI
/* The world of this library: MPI_COMM_WORLD, or a duplicate of the communicator a
 * caller handed to mt_comm_world_init_from (then the caller owns MPI's lifetime). */
static MPI_Comm g_world = MPI_COMM_NULL;
#endif

/* A NULL communicator is a group of one (planning, single process). */
static mt_comm g_solo = {.name = "solo", .rank = 0, .size = 1};
#define SOLO(c) \
    do {        \
        if (!(c)) (c) = &g_solo; \
    } while (0)

/* ------------------------------------------------------------------ watchdog ---- */

static _Atomic double g_wd_timeout = 30.0;     /* seconds (mt_comm_set_timeout) */
static int g_process_control = 0;              /* mt_comm_set_process_control */

void mt_comm_set_process_control(int on) { g_process_control = on != 0; }
static volatile sig_atomic_t g_exit_status = -1; /* mt_comm_set_exit_status */
void mt_comm_set_exit_status(int status) { g_exit_status = status >= 0 && status < 256 ? status : 1; }

#ifdef MT_HAVE_MPI
static _Atomic int g_wd_active = 0;            /* a collective is in progress */
static _Atomic double g_wd_start = 0.0;        /* its start (monotonic seconds) */
static const char *_Atomic g_wd_what = NULL;   /* collective name (static string) */
static const char *_Atomic g_wd_group = NULL;  /* communicator name (lives with the comm) */

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *watchdog_main(void *arg) {
    (void)arg;
    for (;;) {
        sleep_ms(200);
#ifdef MT_HAVE_NCCL
        char nmsg[320];
        if (mt_nccl_poll(atomic_load(&g_wd_timeout), nmsg, sizeof nmsg)) {
            fprintf(stderr, "meshtrain: %s; exiting\n", nmsg);
            fflush(stderr);
            _exit(1);
        }
#endif
        if (!atomic_load(&g_wd_active)) continue;
        double start = atomic_load(&g_wd_start), lim = atomic_load(&g_wd_timeout);
        double el = now_s() - start;
        if (el < lim || !atomic_load(&g_wd_active) || atomic_load(&g_wd_start) != start) continue;
        const char *what = atomic_load(&g_wd_what), *grp = atomic_load(&g_wd_group);
        fprintf(stderr,
                "meshtrain: rank %d: %s on the '%s' communicator did not complete in %.0f s "
                "(a peer rank died or hangs); exiting\n",
                g_rank, what ? what : "collective", grp ? grp : "?", el);
        fflush(stderr);
        _exit(1);
    }
    return NULL;
}

static void wd_enter(const mt_comm *c, const char *what) {
    atomic_store(&g_wd_what, what);
    atomic_store(&g_wd_group, c->name);
    atomic_store(&g_wd_start, now_s());
    atomic_store(&g_wd_active, 1);
}
static void wd_leave(void) { atomic_store(&g_wd_active, 0); }

/* SIGTERM (mpirun stopping the job after a peer died): say where this rank was, with
 * async-signal-safe writes only, then die of the signal as before; or, once the rank
 * is ending with a status of its own, exit with it. */
static char g_rank_str[16];

static void put(const char *s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void on_sigterm(int sig) {
    /* already ending with its own verdict (mt_comm_set_exit_status): mpirun takes the
     * job down because a peer ended first with the same; keep the status, quietly */
    if (g_exit_status >= 0) _exit(g_exit_status);
    put("meshtrain: rank ");
    put(g_rank_str);
    if (atomic_load(&g_wd_active)) {
        const char *what = atomic_load(&g_wd_what), *grp = atomic_load(&g_wd_group);
        put(": stopped by the launcher while in ");
        put(what ? what : "a collective");
        put(" on the '");
        put(grp ? grp : "?");
        put("' communicator\n");
    } else {
        put(": stopped by the launcher (not in a collective)\n");
    }
    signal(sig, SIG_DFL);
    raise(sig);
}
#endif

#ifdef MT_HAVE_MPI
/* ------------------------------------------------------------ MPI progress ---- */
/* Open MPI advances a non-blocking collective only inside MPI calls, so a request
 * started before a layer's compute would move its data in mt_comm_wait, after the
 * compute: no overlap. When MPI runs with MPI_THREAD_MULTIPLE, a progress thread
 * (started at the first asynchronous collective) owns every request in flight and
 * calls MPI_Test on them about every 50 us until they complete; mt_comm_wait then
 * waits for its signal. It sleeps on a condition variable while nothing is in flight.
 * Without MPI_THREAD_MULTIPLE (a caller's MPI initialised at a lower level)
 * mt_comm_wait calls MPI_Wait itself. */
static int g_thread_multiple = 0;              /* MPI provides MPI_THREAD_MULTIPLE */
static int g_pg_started = 0, g_pg_stop = 0;    /* under g_pg_mu */
static pthread_mutex_t g_pg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_pg_work = PTHREAD_COND_INITIALIZER, g_pg_done = PTHREAD_COND_INITIALIZER;
static mt_comm_request *g_pg_list = NULL;      /* requests in flight, owned by the thread */

static void *progress_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_pg_mu);
    for (;;) {
        while (!g_pg_list && !g_pg_stop) pthread_cond_wait(&g_pg_work, &g_pg_mu);
        if (g_pg_stop) break;
        int finished = 0;
        for (mt_comm_request **p = &g_pg_list; *p;) {
            mt_comm_request *r = *p;
            int flag = 0;
            r->rc = MPI_Test(&r->mpi, &flag, MPI_STATUS_IGNORE);
            if (flag || r->rc != MPI_SUCCESS) {
                r->done = 1;
                *p = r->next;
                finished = 1;
            } else {
                p = &r->next;
            }
        }
        if (finished) pthread_cond_broadcast(&g_pg_done);
        if (g_pg_list) {
            pthread_mutex_unlock(&g_pg_mu);
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            pthread_mutex_lock(&g_pg_mu);
        }
    }
    pthread_mutex_unlock(&g_pg_mu);
    return NULL;
}

/* Hand a started request to the progress thread; 0 when there is none (the wait then
 * calls MPI_Wait). */
static int progress_adopt(mt_comm_request *r) {
    if (!g_thread_multiple) return 0;
    pthread_mutex_lock(&g_pg_mu);
    if (!g_pg_started && !g_pg_stop) {
        pthread_t th;
        if (pthread_create(&th, NULL, progress_main, NULL) == 0) {
            pthread_detach(th);
            g_pg_started = 1;
        }
    }
    const int ok = g_pg_started && !g_pg_stop;
    if (ok) {
        r->done = 0;
        r->next = g_pg_list;
        g_pg_list = r;
        pthread_cond_signal(&g_pg_work);
    }
    pthread_mutex_unlock(&g_pg_mu);
    return ok;
}

/* Before MPI_Finalize: the progress thread makes no further MPI call. */
static void progress_stop(void) {
    pthread_mutex_lock(&g_pg_mu);
    g_pg_stop = 1;
    g_pg_list = NULL;
    pthread_cond_broadcast(&g_pg_work);
    pthread_mutex_unlock(&g_pg_mu);
}
#endif

void mt_comm_set_timeout(double seconds) {
    if (seconds > 0) atomic_store(&g_wd_timeout, seconds);
}

/* ------------------------------------------------------------------- world ---- */

#ifdef MT_HAVE_MPI
/* Exit handler: finalise MPI if every rank reaches here within a few seconds, else
 * abort (a rank leaving on an error must not wait forever in MPI_Finalize). */
static void finalize_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    progress_stop();
    MPI_Request req;
    if (MPI_Ibarrier(g_world, &req) == MPI_SUCCESS) {
        double t0 = now_s();
        int done = 0;
        while (!done && now_s() - t0 < 10.0) {
            if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
            if (!done) sleep_ms(1);
        }
        if (done) {
            MPI_Finalize();
            return;
        }
    }
    fprintf(stderr, "meshtrain: rank %d: peers did not reach the end of the run; aborting\n", g_rank);
    MPI_Abort(g_world, 1);
}

/* g_local_rank / g_local_size: this rank among the ranks of g_world sharing its node. */
static mt_status node_ranks(void) {
    MPI_Comm node;
    if (MPI_Comm_split_type(g_world, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return mt_set_error(MT_ERR_RUNTIME, "rank %d: MPI_Comm_split_type (the ranks of this node) failed", g_rank);
    MPI_Comm_rank(node, &g_local_rank);
    MPI_Comm_size(node, &g_local_size);
    MPI_Comm_free(&node);
    return MT_OK;
}
#endif

static int launched_by_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

mt_status mt_comm_world_init(void) {
    if (g_inited) return MT_OK;
    if (!launched_by_mpirun()) {
        g_inited = 1;
        return MT_OK;
    }
#ifdef MT_HAVE_MPI
    int provided = 0;
    /* MPI_THREAD_MULTIPLE for the progress thread of the asynchronous collectives;
     * the other threads (watchdog, NCCL) make no MPI call */
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return mt_set_error(MT_ERR_RUNTIME, "MPI_Init_thread failed");
    g_thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    g_world = MPI_COMM_WORLD;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MT_TRY(node_ranks());
    g_use_mpi = 1;
    g_inited = 1;
    atexit(finalize_at_exit);
    snprintf(g_rank_str, sizeof g_rank_str, "%d", g_rank);
    if (g_size > 1 && g_process_control) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigterm;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        pthread_t th;
        if (pthread_create(&th, NULL, watchdog_main, NULL) == 0) pthread_detach(th);
    }
    return MT_OK;
#else
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (!s) s = getenv("PMI_SIZE");
    if (s && atoi(s) > 1)
        return mt_set_error(MT_ERR_RUNTIME,
                            "started by mpirun with %s ranks but this build has no MPI "
                            "(install Open MPI and reconfigure)", s);
    g_inited = 1;
    return MT_OK;
#endif
}

mt_status mt_comm_world_init_from(void *mpi_comm) {
    if (!mpi_comm) return mt_comm_world_init();
#ifdef MT_HAVE_MPI
    int ok = 0, fin = 0;
    MPI_Initialized(&ok);
    MPI_Finalized(&fin);
    if (!ok || fin)
        return mt_set_error(MT_ERR_INVALID,
                            "mt_comm_world_init_from: MPI is not initialised (call MPI_Init first)");
    if (g_inited && g_use_mpi) {
        int cmp = MPI_UNEQUAL;
        MPI_Comm_compare(g_world, *(MPI_Comm *)mpi_comm, &cmp);
        if (cmp == MPI_IDENT || cmp == MPI_CONGRUENT) return MT_OK;
        return mt_set_error(MT_ERR_INVALID,
                            "mt_comm_world_init_from: this process already joined another communicator");
    }
    if (g_inited && g_size > 1)
        return mt_set_error(MT_ERR_INVALID, "mt_comm_world_init_from: already initialised");
    if (MPI_Comm_dup(*(MPI_Comm *)mpi_comm, &g_world) != MPI_SUCCESS)
        return mt_set_error(MT_ERR_RUNTIME, "mt_comm_world_init_from: MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(g_world, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g_world, &g_rank);
    MPI_Comm_size(g_world, &g_size);
    MT_TRY(node_ranks());
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    g_thread_multiple = level >= MPI_THREAD_MULTIPLE;
    snprintf(g_rank_str, sizeof g_rank_str, "%d", g_rank);
    g_use_mpi = 1;
    g_inited = 1; /* no exit handler, no SIGTERM handler, no watchdog: the caller owns them */
    return MT_OK;
#else
    return mt_set_error(MT_ERR_UNSUPPORTED, "mt_comm_world_init_from: this build has no MPI");
#endif
}

int mt_comm_world_rank(void) { return g_rank; }
int mt_comm_world_size(void) { return g_size; }
int mt_comm_local_rank(void) { return g_local_rank; }
int mt_comm_local_size(void) { return g_local_size; }
const char *mt_comm_backend(void) { return g_use_mpi ? "mpi" : "none"; }

/* ------------------------------------------------------------ communicators ---- */

mt_status mt_comm_split(mt_comm **out, int color, int key, const char *name) {
    return mt_comm_split_on(out, color, key, name, MT_COMM_HOST);
}

int mt_comm_have_nccl(void) {
#ifdef MT_HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

int mt_comm_is_device(const mt_comm *c) { return c ? c->device : 0; }

#ifdef MT_HAVE_NCCL
/* The NCCL communicator of c's group (size > 1): rank 0's unique id over c->mpi. */
static mt_status nccl_attach(mt_comm *c) {
    mt_status st = mt_nccl_select_device(g_local_rank, g_rank);
    if (c->size == 1) return st;
#ifdef MT_HAVE_MPI
    unsigned char id[512];
    const size_t nb = mt_nccl_id_bytes();
    if (st == MT_OK && nb > sizeof id) st = mt_set_error(MT_ERR_RUNTIME, "NCCL unique id of %zu bytes", nb);
    if (st == MT_OK && c->rank == 0) st = mt_nccl_get_id(id);
    /* every rank learns whether all have a device and rank 0 an id, so none is left
     * waiting in ncclCommInitRank for a peer that gave up */
    int ok = st == MT_OK, all = 0;
    wd_enter(c, "NCCL communicator setup");
    if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, c->mpi) != MPI_SUCCESS || !all) {
        wd_leave();
        return st != MT_OK ? st : mt_set_error(MT_ERR_RUNTIME, "rank %d: a peer in '%s' could not set up NCCL "
                                               "(see its message)", g_rank, c->name);
    }
    if (MPI_Bcast(id, (int)nb, MPI_BYTE, 0, c->mpi) != MPI_SUCCESS) {
        wd_leave();
        return mt_set_error(MT_ERR_RUNTIME, "rank %d: broadcast of the NCCL unique id for '%s' failed", g_rank, c->name);
    }
    st = mt_nccl_create(&c->nccl, id, c->size, c->rank, c->name, g_rank);
    wd_leave();
    return st;
#else
    return st;
#endif
}
#endif

mt_status mt_comm_split_on(mt_comm **out, int color, int key, const char *name, mt_comm_mem mem) {
    MT_TRY(mt_comm_world_init());
#ifndef MT_HAVE_NCCL
    if (mem == MT_COMM_DEVICE)
        return mt_set_error(MT_ERR_UNSUPPORTED, "communicator '%s' on device buffers: this build has no NCCL "
                            "(CUDA and NCCL are found at configure time)", name ? name : "comm");
#endif
    mt_comm *c = calloc(1, sizeof *c);
    if (!c) return mt_set_error(MT_ERR_OOM, "mt_comm_split: out of memory");
    snprintf(c->name, sizeof c->name, "%s", name ? name : "comm");
    c->rank = 0;
    c->size = 1;
#ifdef MT_HAVE_MPI
    c->mpi = MPI_COMM_NULL;
    if (g_use_mpi) {
        if (MPI_Comm_split(g_world, color, key, &c->mpi) != MPI_SUCCESS) {
            free(c);
            return mt_set_error(MT_ERR_RUNTIME, "rank %d: MPI_Comm_split for '%s' failed", g_rank, c->name);
        }
        MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
        MPI_Comm_rank(c->mpi, &c->rank);
        MPI_Comm_size(c->mpi, &c->size);
    }
#else
    (void)color;
    (void)key;
#endif
#ifdef MT_HAVE_NCCL
    if (mem == MT_COMM_DEVICE) {
        c->device = 1;
        mt_status st = nccl_attach(c);
        if (st != MT_OK) {
            mt_comm_free(c);
            return st;
        }
    }
#endif
    *out = c;
    return MT_OK;
}

void mt_comm_free(mt_comm *c) {
    if (!c) return;
#ifdef MT_HAVE_NCCL
    mt_nccl_free(c->nccl);
#endif
#ifdef MT_HAVE_MPI
    int fin = 0;
    MPI_Finalized(&fin);
    if (c->mpi != MPI_COMM_NULL && !fin) MPI_Comm_free(&c->mpi);
#endif
    free(c);
}

int mt_comm_rank(const mt_comm *c) { return c ? c->rank : 0; }
int mt_comm_size(const mt_comm *c) { return c ? c->size : 1; }
const char *mt_comm_name(const mt_comm *c) { return c ? c->name : "none"; }

uint64_t mt_comm_bytes(const mt_comm *c, mt_coll_kind k) {
    return c && k >= 0 && k < MT_COLL_KINDS ? c->bytes[k] : 0;
}
uint64_t mt_comm_bytes_total(const mt_comm *c) {
    uint64_t s = 0;
    for (int k = 0; c && k < MT_COLL_KINDS; k++) s += c->bytes[k];
    return s;
}
void mt_comm_reset_bytes(mt_comm *c) {
    if (c) memset(c->bytes, 0, sizeof c->bytes);
}

/* ------------------------------------------------------------- collectives ---- */

static int64_t sum_counts(const int64_t *counts, int n) {
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += counts[i];
    return s;
}

#ifdef MT_HAVE_MPI
static MPI_Datatype mpi_type(mt_comm_dtype dt) {
    switch (dt) {
    case MT_COMM_F32: return MPI_FLOAT;
    case MT_COMM_F64: return MPI_DOUBLE;
    case MT_COMM_I64: return MPI_INT64_T;
    case MT_COMM_U16: return MPI_UINT16_T;
    case MT_COMM_BF16: return MPI_UINT16_T;
    }
    return MPI_BYTE;
}

/* The bf16 sum of comm.h: inout[i] = round_to_nearest_even(float(in[i]) + float(inout[i])),
 * one rounding per combination of two partial results (fp32 addition is commutative, so
 * the operation is declared commutative; MPI applies it n - 1 times for n ranks). */
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const mt_bf16 *a = in;
    mt_bf16 *b = inout;
    for (int i = 0; i < *len; i++) b[i] = mt_f32_to_bf16(mt_bf16_to_f32(a[i]) + mt_bf16_to_f32(b[i]));
}

/* *op = MPI's operation for a sum of dt: MPI_SUM, or for bf16 the operation above
 * (created at its first use; collectives are called from one thread). Errors:
 * MT_ERR_RUNTIME when MPI_Op_create fails. */
static MPI_Op g_bf16_sum = MPI_OP_NULL;
static mt_status sum_op(const mt_comm *c, mt_comm_dtype dt, MPI_Op *op) {
    *op = MPI_SUM;
    if (dt != MT_COMM_BF16) return MT_OK;
    if (g_bf16_sum == MPI_OP_NULL && MPI_Op_create(bf16_sum_fn, 1, &g_bf16_sum) != MPI_SUCCESS) {
        g_bf16_sum = MPI_OP_NULL;
        return mt_set_error(MT_ERR_RUNTIME, "rank %d: MPI_Op_create (the bf16 sum) failed on '%s'", g_rank, c->name);
    }
    *op = g_bf16_sum;
    return MT_OK;
}

static mt_status mpi_fail(const mt_comm *c, const char *what, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    msg[0] = '\0';
    MPI_Error_string(rc, msg, &len);
    return mt_set_error(MT_ERR_RUNTIME, "rank %d: %s on the '%s' communicator (%d ranks) failed: %s", g_rank,
                        what, c->name, c->size, msg);
}

/* int counts and displacements for the v-collectives. */
static mt_status int_counts(const mt_comm *c, const int64_t *counts, int *ic, int *id) {
    int64_t d = 0;
    for (int i = 0; i < c->size; i++) {
        if (counts[i] < 0 || counts[i] > INT32_MAX || d > INT32_MAX)
            return mt_set_error(MT_ERR_INVALID, "'%s' collective: chunk %d has %lld elements (limit 2^31)",
                                c->name, i, (long long)counts[i]);
        ic[i] = (int)counts[i];
        id[i] = (int)d;
        d += counts[i];
    }
    return MT_OK;
}
#endif

static mt_status check_count(const mt_comm *c, int64_t count, const char *what) {
    if (count < 0 || count > INT32_MAX)
        return mt_set_error(MT_ERR_INVALID, "%s on '%s': count %lld outside [0, 2^31)", what, c->name,
                            (long long)count);
    return MT_OK;
}

#if defined(MT_HAVE_MPI) || defined(MT_HAVE_NCCL)
/* A request for c with `nint` ints of MPI count storage; NULL when out of memory. */
static mt_comm_request *new_request(mt_comm *c, const char *what, int nint) {
    mt_comm_request *r = calloc(1, sizeof *r + sizeof(int) * (size_t)nint);
    if (!r) return NULL;
    r->c = c;
    r->what = what;
#ifdef MT_HAVE_MPI
    r->mpi = MPI_REQUEST_NULL;
#endif
    return r;
}

static mt_status request_oom(const mt_comm *c, const char *what) {
    return mt_set_error(MT_ERR_OOM, "rank %d: %s on '%s': out of memory for the request", g_rank, what, c->name);
}
#endif

#ifdef MT_HAVE_NCCL
/* Whether buffer p of a call on c goes to NCCL: cudaMalloc memory (the one test of
 * kernels/backend.h mt_cuda_is_device_ptr, which the staging path uses too) on a device
 * communicator. */
static int on_device(const mt_comm *c, const void *p) { return c->device && mt_cuda_is_device_ptr(p); }

/* After an NCCL launch: blocking (req NULL): the compute stream waits for it now;
 * asynchronous: a request holding its completion event. */
static mt_status nccl_finish(mt_comm *c, const char *what, void *done, mt_comm_request **req) {
    if (!req) return mt_nccl_wait(done);
    mt_comm_request *r = new_request(c, what, 0);
    if (!r) {
        (void)mt_nccl_wait(done); /* keep the stream order; the caller gets the error */
        return request_oom(c, what);
    }
    r->nccl_done = done;
    *req = r;
    return MT_OK;
}
#endif

/* ---- device buffers without NCCL: staged through host memory (comm.h "Staged") ---- */

static mt_backend *g_stage_be = NULL; /* mt_comm_set_device_backend */

/* The staging buffers: page-locked host memory of the device backend
 * (mt_backend_host_alloc), kept for reuse because pinning is slow. A call takes the
 * smallest free buffer that is large enough (else frees the largest free one too small
 * and allocates one of the size asked), and gives it back when its collective is done;
 * several can be taken at once (a blocking call while asynchronous ones are in flight).
 * Only the threads calling collectives touch the pool (the progress thread does not). */
enum { MT_STAGE_BUFS = 16 };
typedef struct mt_stage_buf {
    void *p;
    size_t cap;
    int busy;
} mt_stage_buf;
static mt_stage_buf g_stage_pool[MT_STAGE_BUFS];
static pthread_mutex_t g_stage_mu = PTHREAD_MUTEX_INITIALIZER;

static void *stage_take(size_t bytes) {
    pthread_mutex_lock(&g_stage_mu);
    int best = -1, empty = -1, small = -1;
    for (int i = 0; i < MT_STAGE_BUFS; i++) {
        const mt_stage_buf *b = &g_stage_pool[i];
        if (b->busy) continue;
        if (!b->p) {
            if (empty < 0) empty = i;
        } else if (b->cap >= bytes) {
            if (best < 0 || b->cap < g_stage_pool[best].cap) best = i;
        } else if (small < 0 || b->cap < g_stage_pool[small].cap) {
            small = i;
        }
    }
    if (best < 0 && (empty >= 0 || small >= 0)) { /* an empty slot, else replace a free buffer too small */
        mt_stage_buf *b = &g_stage_pool[empty >= 0 ? empty : small];
        mt_backend_host_free(g_stage_be, b->p);
        *b = (mt_stage_buf){0};
        if (mt_backend_host_alloc(g_stage_be, bytes, &b->p) == MT_OK) {
            b->cap = bytes;
            best = (int)(b - g_stage_pool);
        }
    }
    void *p = NULL;
    if (best >= 0) {
        g_stage_pool[best].busy = 1;
        p = g_stage_pool[best].p;
    }
    pthread_mutex_unlock(&g_stage_mu);
    return p;
}

static void stage_give(void *p) {
    pthread_mutex_lock(&g_stage_mu);
    for (int i = 0; i < MT_STAGE_BUFS; i++)
        if (g_stage_pool[i].p == p) g_stage_pool[i].busy = 0;
    pthread_mutex_unlock(&g_stage_mu);
}

void mt_comm_set_device_backend(mt_backend *be) {
    pthread_mutex_lock(&g_stage_mu);
    for (int i = 0; i < MT_STAGE_BUFS; i++) { /* buffers of the backend being replaced */
        mt_backend_host_free(g_stage_be, g_stage_pool[i].p);
        g_stage_pool[i] = (mt_stage_buf){0};
    }
    g_stage_be = be;
    pthread_mutex_unlock(&g_stage_mu);
}

/* Whether buffer p of a call on c is a device buffer that the call stages. */
static int staged(const mt_comm *c, const void *p) {
#ifdef MT_HAVE_NCCL
    if (on_device(c, p)) return 0;
#else
    (void)c;
#endif
    return mt_backend_is_device_ptr(g_stage_be, p);
}

/* *s = buffer p[bytes] as MPI sees it: p itself when it is not staged; else host memory
 * holding a copy of the device buffer (read = 1: the call reads it; copy_to_host
 * synchronises, so the device work that wrote it is done) or uninitialised (read = 0:
 * the call only writes it). Errors: MT_ERR_OOM naming the call, those of copy_to_host. */
static mt_status stage_in(const mt_comm *c, mt_stage *s, const void *p, size_t bytes, int read, const char *what) {
    s->host = (void *)p;
    s->dev = NULL;
    s->bytes = bytes;
    s->plain = 0;
    if (bytes == 0 || !staged(c, p)) return MT_OK;
    s->host = stage_take(bytes);
    if (!s->host)
        return mt_set_error(MT_ERR_OOM, "rank %d: %s on '%s': no pinned host memory to stage %zu bytes of a device "
                            "buffer (%d staging buffers in use)", g_rank, what, c->name, bytes, MT_STAGE_BUFS);
    s->dev = (void *)p;
    if (read) {
        mt_status st = g_stage_be->ops->copy_to_host(g_stage_be, s->host, p, bytes);
        if (st != MT_OK) {
            stage_give(s->host);
            s->dev = NULL;
            return st;
        }
    }
    return MT_OK;
}

/* Release a staged buffer, first copying the host copy back to the device buffer when
 * write != 0 (the call wrote it and succeeded). No-op for an unstaged buffer. */
static mt_status stage_out(mt_stage *s, int write) {
    mt_status st = MT_OK;
    if (s->dev) {
        if (write && s->plain)
            memcpy(s->dev, s->host, s->bytes);
        else if (write)
            st = g_stage_be->ops->copy_to_device(g_stage_be, s->dev, s->host, s->bytes);
        stage_give(s->host);
    }
    s->host = s->dev = NULL;
    s->plain = 0;
    return st;
}

/* An in-place call on host memory (recv, as MPI sees it, inside send: this rank's chunk
 * of a reduce-scatter's input): MPI forbids aliased send and receive buffers (MPI 4.0
 * section 2.3), so the result is written to a staging buffer and copied into place when
 * the call completes (stage_out). No-op when the two do not overlap. Errors: MT_ERR_OOM
 * naming the call. */
static mt_status stage_apart(mt_stage *recv, const mt_stage *send, const char *what) {
    const char *r = recv->host, *s = send->host;
    if (recv->dev || recv->bytes == 0 || !s || r + recv->bytes <= s || s + send->bytes <= r) return MT_OK;
    void *h = stage_take(recv->bytes);
    if (!h)
        return mt_set_error(MT_ERR_OOM, "rank %d: %s: no host memory to stage an in-place result of %zu bytes "
                            "(%d staging buffers in use)", g_rank, what, recv->bytes, MT_STAGE_BUFS);
    recv->dev = recv->host;
    recv->host = h;
    recv->plain = 1;
    return MT_OK;
}

#ifdef MT_HAVE_MPI
/* After the start (rc) of the non-blocking MPI collective of request r (NULL: out of
 * memory) on the buffers out (written) and in (read; either may be unstaged): on
 * success r owns both until mt_comm_wait and *req = r; on failure both are released
 * and the error names the collective w. */
static mt_status start_done(mt_comm *c, mt_comm_request *r, int rc, mt_stage *out, mt_stage *in, const char *w,
                            mt_comm_request **req) {
    if (!r || rc != MPI_SUCCESS) {
        (void)stage_out(in, 0);
        (void)stage_out(out, 0);
        free(r);
        return r ? mpi_fail(c, w, rc) : request_oom(c, w);
    }
    r->stage[0] = *out;
    r->stage[1] = *in;
    r->adopted = progress_adopt(r);
    *req = r;
    return MT_OK;
}

/* After a blocking MPI call (rc): in released, out copied back to its device buffer when
 * the call succeeded, then released; the call's error (naming w) first. */
static mt_status blocking_done(mt_comm *c, int rc, mt_stage *out, mt_stage *in, const char *w) {
    (void)stage_out(in, 0);
    const mt_status st = stage_out(out, rc == MPI_SUCCESS);
    return rc != MPI_SUCCESS ? mpi_fail(c, w, rc) : st;
}
#endif

/* A same-rank copy (group of one): on the compute stream for device buffers. */
static mt_status local_copy(const mt_comm *c, void *dst, const void *src, size_t bytes) {
    if (dst == src || bytes == 0) return MT_OK;
#ifdef MT_HAVE_NCCL
    if (on_device(c, dst) || on_device(c, src)) return mt_nccl_copy(dst, src, bytes);
#endif
    const int dd = staged(c, dst), ds = staged(c, src);
    mt_backend *be = g_stage_be;
    if (dd && ds) return be->ops->copy(be, dst, src, bytes);
    if (dd) return be->ops->copy_to_device(be, dst, src, bytes);
    if (ds) return be->ops->copy_to_host(be, dst, src, bytes);
    memmove(dst, src, bytes);
    return MT_OK;
}

/* all_reduce (sum, max = 0) and all_reduce_max (max = 1); req NULL: blocking. */
static mt_status all_reduce_impl(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt, int max,
                                 mt_comm_request **req) {
    const char *what = max ? "all_reduce_max" : "all_reduce";
    if (req) *req = NULL;
    SOLO(c);
    MT_TRY(check_count(c, count, what));
    if (max && dt != MT_COMM_F32 && dt != MT_COMM_F64)
        return mt_set_error(MT_ERR_INVALID, "all_reduce_max: float32 or float64 payloads only");
    if (!max && dt == MT_COMM_U16)
        return mt_set_error(MT_ERR_INVALID, "all_reduce: raw 16-bit payloads (MT_COMM_U16) cannot be summed "
                            "(bf16: MT_COMM_BF16)");
    if (c->size == 1 || count == 0) return MT_OK;
    const uint64_t S = (uint64_t)count * mt_comm_dtype_size(dt);
    c->bytes[MT_COLL_ALL_REDUCE] += 2 * (uint64_t)(c->size - 1) * S / (uint64_t)c->size;
#ifdef MT_HAVE_NCCL
    if (on_device(c, buf)) {
        void *done = NULL;
        MT_TRY(mt_nccl_all_reduce(c->nccl, buf, count, dt, max, &done));
        return nccl_finish(c, max ? "all_reduce_max (ncclAllReduce)" : "all_reduce (ncclAllReduce)", done, req);
    }
#endif
#ifdef MT_HAVE_MPI
    MPI_Op op = MPI_MAX;
    if (!max) MT_TRY(sum_op(c, dt, &op));
    mt_stage sb, none = {0};
    MT_TRY(stage_in(c, &sb, buf, S, 1, what));
    if (req) {
        const char *w = max ? "all_reduce_max (MPI_Iallreduce)" : "all_reduce (MPI_Iallreduce)";
        mt_comm_request *r = new_request(c, w, 0);
        const int rc = r ? MPI_Iallreduce(MPI_IN_PLACE, sb.host, (int)count, mpi_type(dt), op, c->mpi, &r->mpi)
                         : MPI_SUCCESS;
        return start_done(c, r, rc, &sb, &none, w, req);
    }
    wd_enter(c, what);
    int rc = MPI_Allreduce(MPI_IN_PLACE, sb.host, (int)count, mpi_type(dt), op, c->mpi);
    wd_leave();
    return blocking_done(c, rc, &sb, &none, max ? "all_reduce_max (MPI_Allreduce)" : "all_reduce (MPI_Allreduce)");
#else
    (void)buf;
#endif
    return MT_OK;
}

mt_status mt_comm_all_reduce(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt) {
    return all_reduce_impl(c, buf, count, dt, 0, NULL);
}

mt_status mt_comm_all_reduce_max(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt) {
    return all_reduce_impl(c, buf, count, dt, 1, NULL);
}

mt_status mt_comm_all_reduce_start(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt, mt_comm_request **req) {
    if (!req) return mt_set_error(MT_ERR_INVALID, "mt_comm_all_reduce_start: req is NULL");
    return all_reduce_impl(c, buf, count, dt, 0, req);
}

static mt_status reduce_scatter_impl(mt_comm *c, const void *send, void *recv, const int64_t *counts,
                                     mt_comm_dtype dt, mt_comm_request **req) {
    if (req) *req = NULL;
    SOLO(c);
    if (dt == MT_COMM_U16)
        return mt_set_error(MT_ERR_INVALID, "reduce_scatter: raw 16-bit payloads (MT_COMM_U16) cannot be summed "
                            "(bf16: MT_COMM_BF16)");
    const size_t es = mt_comm_dtype_size(dt);
    if (c->size == 1) return local_copy(c, recv, send, counts[0] > 0 ? (size_t)counts[0] * es : 0);
    const int64_t total = sum_counts(counts, c->size);
    c->bytes[MT_COLL_REDUCE_SCATTER] += (uint64_t)(total - counts[c->rank]) * es;
#ifdef MT_HAVE_NCCL
    if (on_device(c, recv)) {
        void *done = NULL;
        MT_TRY(mt_nccl_reduce_scatter(c->nccl, send, recv, counts, dt, &done));
        return nccl_finish(c, "reduce_scatter (NCCL)", done, req);
    }
#endif
#ifdef MT_HAVE_MPI
    int ic[2 * c->size];
    MT_TRY(int_counts(c, counts, ic, ic + c->size));
    MPI_Op op;
    MT_TRY(sum_op(c, dt, &op));
    mt_stage ss, sr; /* send (read), recv (written) */
    MT_TRY(stage_in(c, &ss, send, (size_t)total * es, 1, "reduce_scatter"));
    mt_status st = stage_in(c, &sr, recv, (size_t)counts[c->rank] * es, 0, "reduce_scatter");
    if (st == MT_OK) st = stage_apart(&sr, &ss, "reduce_scatter");
    if (st != MT_OK) {
        (void)stage_out(&ss, 0);
        return st;
    }
    if (req) {
        const char *w = "reduce_scatter (MPI_Ireduce_scatter)";
        mt_comm_request *r = new_request(c, w, c->size);
        int rc = MPI_SUCCESS;
        if (r) {
            memcpy(r->ic, ic, sizeof(int) * (size_t)c->size);
            rc = MPI_Ireduce_scatter(ss.host, sr.host, r->ic, mpi_type(dt), op, c->mpi, &r->mpi);
        }
        return start_done(c, r, rc, &sr, &ss, w, req);
    }
    wd_enter(c, "reduce_scatter");
    int rc = MPI_Reduce_scatter(ss.host, sr.host, ic, mpi_type(dt), op, c->mpi);
    wd_leave();
    return blocking_done(c, rc, &sr, &ss, "reduce_scatter (MPI_Reduce_scatter)");
#endif
    return MT_OK;
}

mt_status mt_comm_reduce_scatter(mt_comm *c, const void *send, void *recv, const int64_t *counts,
                                 mt_comm_dtype dt) {
    return reduce_scatter_impl(c, send, recv, counts, dt, NULL);
}

mt_status mt_comm_reduce_scatter_start(mt_comm *c, const void *send, void *recv, const int64_t *counts,
                                       mt_comm_dtype dt, mt_comm_request **req) {
    if (!req) return mt_set_error(MT_ERR_INVALID, "mt_comm_reduce_scatter_start: req is NULL");
    return reduce_scatter_impl(c, send, recv, counts, dt, req);
}

static mt_status all_gather_impl(mt_comm *c, const void *send, void *recv, const int64_t *counts, mt_comm_dtype dt,
                                 mt_comm_request **req) {
    if (req) *req = NULL;
    SOLO(c);
    const size_t es = mt_comm_dtype_size(dt);
    if (c->size == 1) return local_copy(c, recv, send, counts[0] > 0 ? (size_t)counts[0] * es : 0);
    const int64_t total = sum_counts(counts, c->size);
    c->bytes[MT_COLL_ALL_GATHER] += (uint64_t)(total - counts[c->rank]) * es;
#ifdef MT_HAVE_NCCL
    if (on_device(c, recv)) {
        void *done = NULL;
        MT_TRY(mt_nccl_all_gather(c->nccl, send, recv, counts, dt, &done));
        return nccl_finish(c, "all_gather (NCCL)", done, req);
    }
#endif
#ifdef MT_HAVE_MPI
    int ic[2 * c->size];
    int *id = ic + c->size;
    MT_TRY(int_counts(c, counts, ic, id));
    const size_t own_off = (size_t)id[c->rank] * es, own_bytes = (size_t)ic[c->rank] * es;
    const int in_place = send == (const void *)((const char *)recv + own_off);
    mt_stage sr, ss = {0}; /* recv (written; in place: its own chunk read), send (read) */
    MT_TRY(stage_in(c, &sr, recv, (size_t)total * es, 0, "all_gather"));
    mt_status st = MT_OK;
    if (in_place && sr.dev && own_bytes)
        st = g_stage_be->ops->copy_to_host(g_stage_be, (char *)sr.host + own_off, send, own_bytes);
    else if (!in_place)
        st = stage_in(c, &ss, send, own_bytes, 1, "all_gather");
    if (st != MT_OK) {
        (void)stage_out(&sr, 0);
        return st;
    }
    const void *sb = in_place ? MPI_IN_PLACE : ss.host;
    if (req) {
        const char *w = "all_gather (MPI_Iallgatherv)";
        mt_comm_request *r = new_request(c, w, 2 * c->size);
        int rc = MPI_SUCCESS;
        if (r) {
            memcpy(r->ic, ic, sizeof ic);
            rc = MPI_Iallgatherv(sb, ic[c->rank], mpi_type(dt), sr.host, r->ic, r->ic + c->size, mpi_type(dt), c->mpi,
                                 &r->mpi);
        }
        return start_done(c, r, rc, &sr, &ss, w, req);
    }
    wd_enter(c, "all_gather");
    int rc = MPI_Allgatherv(sb, ic[c->rank], mpi_type(dt), sr.host, ic, id, mpi_type(dt), c->mpi);
    wd_leave();
    return blocking_done(c, rc, &sr, &ss, "all_gather (MPI_Allgatherv)");
#endif
    return MT_OK;
}

mt_status mt_comm_all_gather(mt_comm *c, const void *send, void *recv, const int64_t *counts,
                             mt_comm_dtype dt) {
    return all_gather_impl(c, send, recv, counts, dt, NULL);
}

mt_status mt_comm_all_gather_start(mt_comm *c, const void *send, void *recv, const int64_t *counts,
                                   mt_comm_dtype dt, mt_comm_request **req) {
    if (!req) return mt_set_error(MT_ERR_INVALID, "mt_comm_all_gather_start: req is NULL");
    return all_gather_impl(c, send, recv, counts, dt, req);
}

mt_status mt_comm_wait(mt_comm_request *r) {
    if (!r) return MT_OK;
    mt_status st = MT_OK;
#ifdef MT_HAVE_NCCL
    if (r->nccl_done) {
        st = mt_nccl_wait(r->nccl_done);
        free(r);
        return st;
    }
#endif
#ifdef MT_HAVE_MPI
    wd_enter(r->c, r->what);
    int rc = MPI_SUCCESS;
    if (r->adopted) { /* the progress thread tests it; wait for its word */
        pthread_mutex_lock(&g_pg_mu);
        while (!r->done && !g_pg_stop) pthread_cond_wait(&g_pg_done, &g_pg_mu);
        rc = r->done ? r->rc : MPI_ERR_OTHER;
        pthread_mutex_unlock(&g_pg_mu);
    } else {
        rc = MPI_Wait(&r->mpi, MPI_STATUS_IGNORE);
    }
    wd_leave();
    if (rc != MPI_SUCCESS) st = mpi_fail(r->c, r->what, rc);
    (void)stage_out(&r->stage[1], 0);
    const mt_status so = stage_out(&r->stage[0], rc == MPI_SUCCESS);
    if (st == MT_OK) st = so;
#endif
    free(r);
    return st;
}

mt_status mt_comm_broadcast(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt, int root) {
    SOLO(c);
    MT_TRY(check_count(c, count, "broadcast"));
    if (root < 0 || root >= c->size)
        return mt_set_error(MT_ERR_INVALID, "broadcast on '%s': root %d outside [0, %d)", c->name, root, c->size);
    if (c->size == 1 || count == 0) return MT_OK;
    if (c->rank == root) c->bytes[MT_COLL_BROADCAST] += (uint64_t)count * mt_comm_dtype_size(dt);
#ifdef MT_HAVE_NCCL
    if (on_device(c, buf)) {
        void *done = NULL;
        MT_TRY(mt_nccl_broadcast(c->nccl, buf, count, dt, root, &done));
        return mt_nccl_wait(done);
    }
#endif
#ifdef MT_HAVE_MPI
    mt_stage sb;
    MT_TRY(stage_in(c, &sb, buf, (size_t)count * mt_comm_dtype_size(dt), c->rank == root, "broadcast"));
    wd_enter(c, "broadcast");
    int rc = MPI_Bcast(sb.host, (int)count, mpi_type(dt), root, c->mpi);
    wd_leave();
    const mt_status st = stage_out(&sb, rc == MPI_SUCCESS && c->rank != root);
    if (rc != MPI_SUCCESS) return mpi_fail(c, "broadcast (MPI_Bcast)", rc);
    return st;
#else
    (void)buf;
#endif
    return MT_OK;
}

static mt_status check_peer(const mt_comm *c, int peer, const char *what) {
    if (peer < 0 || peer >= c->size)
        return mt_set_error(MT_ERR_INVALID, "%s on '%s': peer %d outside [0, %d)", what, c->name, peer, c->size);
    return MT_OK;
}

mt_status mt_comm_send(mt_comm *c, const void *buf, int64_t count, mt_comm_dtype dt, int peer) {
    SOLO(c);
    MT_TRY(check_count(c, count, "send"));
    MT_TRY(check_peer(c, peer, "send"));
    if (peer == c->rank) return mt_set_error(MT_ERR_INVALID, "send on '%s': a rank cannot send to itself", c->name);
    c->bytes[MT_COLL_SEND] += (uint64_t)count * mt_comm_dtype_size(dt);
#ifdef MT_HAVE_NCCL
    if (on_device(c, buf)) {
        void *done = NULL;
        MT_TRY(mt_nccl_sendrecv(c->nccl, buf, peer, NULL, -1, count, dt, &done));
        return mt_nccl_wait(done);
    }
#endif
#ifdef MT_HAVE_MPI
    mt_stage sb;
    MT_TRY(stage_in(c, &sb, buf, (size_t)count * mt_comm_dtype_size(dt), 1, "send"));
    wd_enter(c, "send");
    int rc = MPI_Send(sb.host, (int)count, mpi_type(dt), peer, 7, c->mpi);
    wd_leave();
    (void)stage_out(&sb, 0);
    if (rc != MPI_SUCCESS) return mpi_fail(c, "send (MPI_Send)", rc);
#else
    (void)buf;
#endif
    return MT_OK;
}

mt_status mt_comm_recv(mt_comm *c, void *buf, int64_t count, mt_comm_dtype dt, int peer) {
    SOLO(c);
    MT_TRY(check_count(c, count, "recv"));
    MT_TRY(check_peer(c, peer, "recv"));
    if (peer == c->rank) return mt_set_error(MT_ERR_INVALID, "recv on '%s': a rank cannot receive from itself", c->name);
#ifdef MT_HAVE_NCCL
    if (on_device(c, buf)) {
        void *done = NULL;
        MT_TRY(mt_nccl_sendrecv(c->nccl, NULL, -1, buf, peer, count, dt, &done));
        return mt_nccl_wait(done);
    }
#endif
#ifdef MT_HAVE_MPI
    mt_stage sb;
    MT_TRY(stage_in(c, &sb, buf, (size_t)count * mt_comm_dtype_size(dt), 0, "recv"));
    wd_enter(c, "recv");
    int rc = MPI_Recv(sb.host, (int)count, mpi_type(dt), peer, 7, c->mpi, MPI_STATUS_IGNORE);
    wd_leave();
    mt_stage none = {0};
    return blocking_done(c, rc, &sb, &none, "recv (MPI_Recv)");
#else
    (void)buf;
    (void)dt;
#endif
    return MT_OK;
}

mt_status mt_comm_sendrecv(mt_comm *c, const void *sbuf, int to, void *rbuf, int from, int64_t count,
                           mt_comm_dtype dt) {
    SOLO(c);
    MT_TRY(check_count(c, count, "sendrecv"));
    MT_TRY(check_peer(c, to, "sendrecv"));
    MT_TRY(check_peer(c, from, "sendrecv"));
    const size_t S = (size_t)count * mt_comm_dtype_size(dt);
    if (to == c->rank && from == c->rank) return local_copy(c, rbuf, sbuf, S);
    c->bytes[MT_COLL_SEND] += S;
#ifdef MT_HAVE_NCCL
    if (on_device(c, rbuf) || on_device(c, sbuf)) {
        void *done = NULL;
        MT_TRY(mt_nccl_sendrecv(c->nccl, sbuf, to, rbuf, from, count, dt, &done));
        return mt_nccl_wait(done);
    }
#endif
#ifdef MT_HAVE_MPI
    mt_stage ss, sr;
    MT_TRY(stage_in(c, &ss, sbuf, S, 1, "sendrecv"));
    mt_status st = stage_in(c, &sr, rbuf, S, 0, "sendrecv");
    if (st != MT_OK) {
        (void)stage_out(&ss, 0);
        return st;
    }
    wd_enter(c, "sendrecv");
    int rc = MPI_Sendrecv(ss.host, (int)count, mpi_type(dt), to, 9, sr.host, (int)count, mpi_type(dt), from, 9, c->mpi,
                          MPI_STATUS_IGNORE);
    wd_leave();
    return blocking_done(c, rc, &sr, &ss, "sendrecv (MPI_Sendrecv)");
#endif
    return MT_OK;
}

mt_status mt_comm_barrier_wait(mt_comm *c, double seconds) {
    const double keep = atomic_load(&g_wd_timeout);
    if (seconds > keep) atomic_store(&g_wd_timeout, seconds);
    mt_status st = mt_comm_barrier(c);
    atomic_store(&g_wd_timeout, keep);
    return st;
}

mt_status mt_comm_barrier(mt_comm *c) {
    SOLO(c);
#ifdef MT_HAVE_NCCL
    if (c->device) MT_TRY(mt_nccl_sync());
#endif
    if (c->size == 1) return MT_OK;
#ifdef MT_HAVE_MPI
    wd_enter(c, "barrier");
    int rc = MPI_Barrier(c->mpi);
    wd_leave();
    if (rc != MPI_SUCCESS) return mpi_fail(c, "barrier (MPI_Barrier)", rc);
#endif
    return MT_OK;
}
