/* train/report.h: what `meshtrain plan` and `meshtrain estimate` print on stdout: the
 * text tables and the --json documents (one JSON object on one line each).
 *
 * Printing only: the figures come from train/estimate.h (mt_memory_plan_rank,
 * mt_estimate), the command lines and the commands file from train/main.c.
 * tests/test_cli_estimate*.sh, tests/test_cli_plan_offload.sh and
 * tests/test_cli_train.sh read this output: the field names, column order and number
 * formats are an interface. */
#ifndef MT_TRAIN_REPORT_H
#define MT_TRAIN_REPORT_H

#include <stddef.h>
#include "models/remat.h"
#include "runtime/plan.h"
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
 * remat, host, and the bytes per plan category live at peak and in total). */
void mt_report_plan(const mt_train_config *cfg, const mt_memory_report *r, const mt_plan *plan,
                    const mt_plan *host, const mt_remat_policy *pol, int json);

/* Longest runnable command line of an estimate row, with its terminating NUL. */
#define MT_REPORT_COMMAND_MAX 4096

/* `meshtrain estimate`: the result res of mt_estimate for cfg under step model sm;
 * r0 is the plan of the first row's batch (it gives the mesh and num_params);
 * commands[i] is row i's runnable `train` line, written to commands_file (named in the
 * output); any_fixed: tensors fixed on the command line. json = 0: the header lines
 * (model, mode, step model; a note under backend=cpu) and one table row per result;
 * json = 1: one JSON object with the same figures and each row's command. */
void mt_report_estimate(const mt_train_config *cfg, const mt_memory_report *r0, const mt_estimate_result *res,
                        const mt_step_model *sm, const char (*commands)[MT_REPORT_COMMAND_MAX],
                        const char *commands_file, int any_fixed, int json);

#ifdef __cplusplus
}
#endif
#endif
