/* train/trainer_private.h: the trainer's state and the functions its files share
 * (train/trainer.c: building, the run loop and checkpoint saving; train/step.c: the
 * step and evaluation; train/rundir.c: the run directory policy; train/train_state.c:
 * train_state.safetensors). Not installed; only train/ includes it. */
#ifndef MT_TRAIN_TRAINER_PRIVATE_H
#define MT_TRAIN_TRAINER_PRIVATE_H

#include <stdio.h>

#include "kernels/backend.h"
#include "models/model.h"
#include "parallel/mesh.h"
#include "parallel/zero1.h"
#include "runtime/plan.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/trainer.h"

#define MT_TRAIN_STATE_FORMAT "meshtrain-train-state"
#define MT_TRAIN_STATE_VERSION "1"
#define MT_PATH 2048
#define MT_ID_LEN 40

struct mt_trainer {
    mt_train_config cfg;
    mt_backend *be;
    mt_model *model;
    mt_plan *plan;
    mt_arena arena;
    int have_arena;
    mt_adamw opt;
    mt_param_info *params; /* copy of the model's parameter table */
    int nparams;
    int64_t numel;
    mt_lr_schedule sched;
    mt_data_loader *train, *val;
    int32_t *tokens, *labels; /* host [B*T] */
    int64_t step;             /* optimizer steps done */
    int resumed;
    double flops_per_token, peak_flops; /* peak_flops: one device's x the world size (the job's) */
    char run_dir[MT_PATH];
    int have_lock, lock_fd;   /* world rank 0: the run directory's lock (rundir.c lock_run_dir) */
    /* which history the checkpoints belong to (see "checkpoint identity" below) */
    char run_id[MT_ID_LEN];         /* this run's, in every checkpoint it writes ("" until chosen) */
    char resume_run_id[MT_ID_LEN];  /* load_checkpoint's ("" for one written before ids) */
    double time_sum;          /* wall seconds of the steps of this process */
    int64_t timed_steps;
    /* parallelism (see "parallel step" below) */
    mt_mesh *mesh;            /* data x fsdp x context x tensor communicators */
    mt_grad_sync gs;          /* gradient reduction, ZeRO-1 shard, grad_dtype accumulators */
    mt_param_info *sparams;   /* parameter table cut to this rank's optimizer shard */
    int nsparams;
    float *last_grad;         /* mean gradient of the last step (full, or the ZeRO-1 shard) */
    int chunked_grad;         /* the last step's gradient is read chunk by chunk (mt_grad_sync_read) */
    float last_inv_count;     /* its 1 / token count */
    uint64_t last_step_bytes; /* bytes this rank sent during the last step */
    /* host pool of offloaded activations (train/estimate.h, models/remat.h) */
    mt_plan *host_plan;
    mt_arena host_arena;
    int have_host_arena;
};

/* out = "a/b"; 0 when it does not fit in n bytes (the caller reports "path too long"). */
static inline int mt_trainer_path_join(char *out, size_t n, const char *a, const char *b) {
    int w = snprintf(out, n, "%s/%s", a, b);
    return w >= 0 && (size_t)w < n;
}

/* Rank and size of this process in the data x fsdp group (data loading: the batch is
 * split over data x fsdp). */
static inline int mt_trainer_dp_rank(const mt_mesh *m) {
    return m->coord[MT_AXIS_DATA] * m->dims[MT_AXIS_FSDP] + m->coord[MT_AXIS_FSDP];
}
static inline int mt_trainer_dp_size(const mt_mesh *m) { return m->dims[MT_AXIS_DATA] * m->dims[MT_AXIS_FSDP]; }

/* ---- train/step.c ---- */

/* Bytes one rank sends in one optimizer step of ga micro-batches (parallel/comm.h
 * accounting) for its model and gradient sync: the gradient reduction and parameter
 * all-gathers (parallel/zero1.h mt_grad_sync_step_bytes; a tied embedding in
 * vocabulary chunks reduced twice, mt_grad_sync_range_bytes), the 8-byte all-reduces of
 * loss sum, token count and, under ZeRO-1, squared norm, and per micro-batch the
 * tensor / context collectives (models/model.h mt_model_shard_bytes) and the fsdp
 * layer all-gathers (mt_model_fsdp_gather_floats). Needs no communicator: the figures
 * come from the layout alone, so a plan (mt_trainer_plan_ex) gets them too.
 * tests/test_mpi_layouts.sh holds it equal to the measured bytes of every layout. */
uint64_t mtt_step_bytes_formula(const mt_model *model, const mt_grad_sync *gs, int64_t ga);

/* ---- train/rundir.c: the run directory (checkpoint discovery, identity, history) ---- */

/* 16 random hex digits and a NUL (/dev/urandom; else the clock and the process id mixed). */
void mt_rundir_new_id(char out[MT_ID_LEN]);

/* Remove a directory of plain files (a checkpoint directory); missing is fine, and a
 * plain file of that name is removed. Errors: MT_ERR_IO naming the entry. */
mt_status mt_rundir_remove_flat_dir(const char *path);

/* The largest N of ckdir's complete step_<N> directories, or -1 when there is none. */
int64_t mt_rundir_latest_checkpoint(const char *ckdir);

/* The checkpoint identity checks of a load of dir (see rundir.c "checkpoint identity"):
 * both files record the same step and checkpoint_id, a step_<N> directory holds step N;
 * sets t->resume_run_id. Errors: MT_ERR_INVALID / MT_ERR_FORMAT / MT_ERR_IO naming the file. */
mt_status mt_rundir_check_identity(mt_trainer *t, const char *dir);

/* ---- train/train_state.c: train_state.safetensors ---- */

/* Read the train state of checkpoint dir into t (moments, step, data position).
 * Errors: MT_ERR_FORMAT / MT_ERR_INVALID / MT_ERR_IO naming the file. */
mt_status mt_train_state_load(mt_trainer *t, const char *dir);

/* train_state.safetensors of the current step into dir (rank 0; the other ranks pass
 * dir = NULL and join the gather), recording ckid and t->run_id. Errors: MT_ERR_IO, MT_ERR_OOM. */
mt_status mt_train_state_write(mt_trainer *t, const char *dir, const char *ckid);

#endif
