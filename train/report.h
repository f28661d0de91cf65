/* train/report.h: what `meshtrain plan` and `meshtrain estimate` print on stdout: the
 * text tables and the --json documents (one JSON object on one line each, built with
 * cJSON in train/json.h's layout: strings escaped, a NaN or infinite number null), and
 * estimate's runnable command lines and their file.
 *
 * Output only: the figures come from train/estimate.h (mt_memory_plan_rank,
 * mt_estimate), the command line's words from train/main.c.
 * tests/test_cli_estimate*.sh, tests/test_cli_plan_offload.sh, tests/test_cli_json.sh
 * and tests/test_cli_train.sh read this output: the field names, their order, the
 * column order and number formats are an interface. */
#ifndef MT_TRAIN_REPORT_H
#define MT_TRAIN_REPORT_H

#include <stddef.h>
#include "models/remat.h"
#include "runtime/plan.h"
#include "runtime/status.h"
#include "train/config.h"
#include "train/estimate.h"

#ifdef __cplusplus
extern "C" {
#endif

/* b bytes in binary units into buf[n]: "%.0f B" below 1 KiB, else "%.2f <unit>"
 * (KiB, MiB, GiB, TiB; TiB above). */
void mt_report_human_bytes(double b, char *buf, size_t n);

/* `meshtrain plan`: rank 0's memory r of cfg (mt_memory_plan_rank), with its finalised
 * device plan and host plan (both non-NULL) and cfg's resolved remat policy pol.
 * json = 0: the table (one row per memory row and named tensor; the live-at-peak and
 * all-entries columns in bytes and binary units, then the host rows); json = 1: the
 * same figures as one JSON object (per_device / saved and their _live_at_peak twins,
 * remat, host, and the bytes per plan category live at peak and in total).
 * Errors (json = 1 only): MT_ERR_OOM (nothing printed), MT_ERR_RUNTIME (stdout cannot
 * be written). */
mt_status mt_report_plan(const mt_train_config *cfg, const mt_memory_report *r, const mt_plan *plan,
                         const mt_plan *host, const mt_remat_policy *pol, int json);

/* Longest runnable command line of an estimate row, with its terminating NUL. */
#define MT_REPORT_COMMAND_MAX 4096

/* The file, in the current directory, that `estimate` writes its command lines to. */
#define MT_REPORT_COMMANDS_FILE "remat_commands_from_estimator.txt"

/* The runnable `train` command of estimate row `row` into buf[n]: prog (the binary's
 * path as the user invoked it: relative to the current directory, or a name found on
 * PATH, so the line runs as written from where estimate ran), CONFIG path, the user's
 * key=value words argv[1..argc) without the keys it sets itself (hbm_gib dropped;
 * batch, remat, num_devices, ici_*), then the row's batch and custom policy,
 * num_devices (> 1) and the mesh dims (the row's layout, dims = row->dims from the
 * estimator; every axis spelled out, since train reads no layout from num_devices),
 * under `mpirun -np N` for more than one device. Words a shell would split or expand are single-quoted.
 * Errors: MT_ERR_INVALID when the line does not fit in n bytes (buf is then ""). */
mt_status mt_report_estimate_command(char *buf, size_t n, const char *prog, const char *path, int argc,
                                     char *const *argv, const mt_train_config *cfg, const int dims[4],
                                     const mt_estimate_row *row);

/* ./MT_REPORT_COMMANDS_FILE: a header line (CONFIG path, budget, the axes searched and
 * the top row's mesh) and cmds[0..n) (each carrying its own layout's ici_* keys),
 * written whole to a temporary name and renamed into place, so that a failure leaves
 * any earlier file as it was. res has at least one row. Errors: MT_ERR_IO. */
mt_status mt_report_write_commands_file(const char *path, const mt_train_config *cfg, const mt_estimate_result *res,
                                        const char (*cmds)[MT_REPORT_COMMAND_MAX], int n);

/* `meshtrain estimate`: the result res of mt_estimate_mesh for cfg under step model sm
 * (at least one row); commands[i] is row i's runnable `train` line, written to
 * commands_file (named in the output); any_fixed: tensors fixed on the command line.
 * json = 0: the header lines (model, budget, the mesh search's counts, mode, step
 * model; a note under backend=cpu) and one table row per result: its layout's rank and
 * mesh, batch, device and host GiB, modelled step s, collective GB (the trainer's
 * formula) and tokens/s per device, policy; json = 1: one JSON object with the same
 * figures ("mesh" the top row's, "mesh_search" the counts; each row its "mesh",
 * "flops", "collective_bytes" and command).
 * Errors (json = 1 only): MT_ERR_OOM (nothing printed), MT_ERR_RUNTIME (stdout cannot
 * be written). */
mt_status mt_report_estimate(const mt_train_config *cfg, const mt_estimate_result *res, const mt_step_model *sm,
                             const char (*commands)[MT_REPORT_COMMAND_MAX], const char *commands_file, int any_fixed,
                             int json);

#ifdef __cplusplus
}
#endif
#endif
