/* parallel/mesh.h: the device mesh data x fsdp x context x tensor (MaxText's
 * ici_*_parallelism axes).
 *
 * Keys ici_data_parallelism, ici_fsdp_parallelism, ici_context_parallelism,
 * ici_tensor_parallelism; at most one may be -1 ("fill": world / product of the
 * others). World rank r has coordinates with tensor varying fastest:
 *   r = ((data * F + fsdp) * C + context) * T + tensor
 * so tensor groups are neighbouring ranks (MaxText/Megatron ordering: the axis that
 * communicates most is innermost). Each rank holds one communicator per axis (the
 * ranks differing only on that axis, ordered by that coordinate), one for data x fsdp
 * (the ranks reading different data), one for data x fsdp x context (the gradient
 * reduction / ZeRO-1 group: context ranks hold different tokens of the same
 * sequences) and the world; for fsdp the same gradient group ordered fsdp-major
 * (grad_fsdp) and the data x context group of the ranks sharing an fsdp shard
 * (replica). */
#ifndef MT_PARALLEL_MESH_H
#define MT_PARALLEL_MESH_H

#include <stdint.h>
#include "parallel/comm.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_mesh_axis {
    MT_AXIS_DATA = 0,
    MT_AXIS_FSDP = 1,
    MT_AXIS_CONTEXT = 2,
    MT_AXIS_TENSOR = 3,
    MT_MESH_AXES = 4
} mt_mesh_axis;

/* Config key of an axis ("ici_data_parallelism", ...). */
const char *mt_mesh_axis_key(mt_mesh_axis a);
/* Short name ("data", "fsdp", "context", "tensor"). */
const char *mt_mesh_axis_name(mt_mesh_axis a);

/* Sizes from the ici_* values (indexed by mt_mesh_axis) for a world of `world` ranks:
 * -1 is replaced by world / (product of the others). Errors: MT_ERR_INVALID naming
 * the key(s) and numbers: a value of 0 or below -1, more than one -1, a product
 * (or, with -1, the division) that does not match the world size. */
mt_status mt_mesh_resolve(const int64_t ici[MT_MESH_AXES], int world, int dims[MT_MESH_AXES]);

/* Sizes that the layout must divide (checked before any compute). */
typedef struct mt_layout_sizes {
    int64_t num_query_heads, num_kv_heads, mlp_dim, vocab_size;
    int64_t seq;   /* max_target_length */
    int64_t batch; /* per_device_batch_size (sequences per data x fsdp rank) */
    int sequence_parallel; /* tensor_sequence_parallelism: residual rows split over tensor */
    int64_t numel; /* parameters of the whole model (0: not checked) */
} mt_layout_sizes;

/* The tensor-parallel split rules: the one place that says which tensor axis sizes
 * tp the model divides into (used by mt_mesh_check_layout, the model's
 * mt_model_create (its layout check) and the estimator, so that no layout is estimated
 * that the trainer refuses). Megatron-LM's split (Shoeybi et al. 2019, "Megatron-LM",
 * arXiv:1909.08053, section 3), each rank holding equal whole slices:
 *   base_num_query_heads % tp == 0  attention: q_proj column-parallel by heads, o_proj
 *                                   row-parallel over the same heads (each rank
 *                                   attends with whole heads);
 *   base_num_kv_heads % tp == 0     k_proj / v_proj column-parallel by kv head: each
 *                                   rank keeps the kv heads its query heads use.
 *                                   Replicating kv heads when tp > kv heads is not
 *                                   supported and is refused;
 *   base_mlp_dim % tp == 0          MLP: gate/up column-parallel, down row-parallel;
 *   vocab_size % tp == 0            vocab-parallel embedding and loss (no padding).
 * Only the four model fields of s are read; tp <= 1 always passes.
 * Errors: MT_ERR_INVALID for the first rule broken, in the order above:
 * "<model key>=<value> is not divisible by ici_tensor_parallelism=<tp>". */
mt_status mt_mesh_check_tensor_split(int64_t tp, const mt_layout_sizes *s);

/* The layout rules, the one place the trainer (train/trainer.c before any compute),
 * the model (mt_model_create's layout check) and the estimator's mesh search
 * (train/estimate.h) take them from: the tensor split rules
 * (mt_mesh_check_tensor_split) on the tensor axis; seq by 2 x context (2C chunks, rank
 * i holding chunks i and 2C-1-i, the causal load balance of the ring / all-gather
 * schedule, models/model_shard.c); batch >= 1; with sequence_parallel and tensor > 1,
 * the rows of a rank, batch x seq / context, divisible by tensor (each tensor rank
 * holds an equal slice of the residual rows, Korthikanti et al. 2022, "Reducing
 * Activation Recomputation in Large Transformer Models", arXiv:2205.05198, section
 * 4.2.2); fsdp <= numel when numel > 0 (every fsdp rank holds a non-empty shard).
 * Errors: MT_ERR_INVALID for the first rule broken, naming the key of the axis, the
 * model or batch key and both numbers. */
mt_status mt_mesh_check_layout(const int dims[MT_MESH_AXES], const mt_layout_sizes *s);

typedef struct mt_mesh {
    int dims[MT_MESH_AXES];
    int coord[MT_MESH_AXES];
    int rank, world;
    mt_comm *axis[MT_MESH_AXES]; /* per-axis groups */
    mt_comm *data_fsdp;          /* data x fsdp, rank = data * F + fsdp */
    mt_comm *grad;               /* data x fsdp x context, rank = (data * F + fsdp) * C + context:
                                  * the ranks whose gradients and loss sums add up */
    mt_comm *all;                /* the world */
    mt_comm *grad_fsdp;          /* the ranks of grad ordered fsdp-major, rank = (fsdp * D + data) * C +
                                  * context: blocks of the flat gradient in rank order nest inside the
                                  * fsdp shards (parallel/zero1.h mt_grad_sync_set_fsdp) */
    mt_comm *replica;            /* data x context (same fsdp and tensor coordinates), rank = data * C +
                                  * context: the ranks holding the same fsdp parameter shard */
} mt_mesh;

/* Coordinates of world rank r in dims. */
void mt_mesh_coords(const int dims[MT_MESH_AXES], int r, int coord[MT_MESH_AXES]);

/* Build the communicators for dims (product must equal the world size; collective
 * over the world). Errors: MT_ERR_INVALID (product), those of mt_comm_split. */
mt_status mt_mesh_create(mt_mesh **out, const int dims[MT_MESH_AXES]);
/* mt_mesh_create with every communicator split on `mem` (mt_comm_split_on): with
 * MT_COMM_DEVICE each communicator of mt_mesh of more than one rank also gets its
 * NCCL communicator (and its comm stream). Errors: those of
 * mt_mesh_create and mt_comm_split_on (MT_ERR_UNSUPPORTED without NCCL or a GPU). */
mt_status mt_mesh_create_on(mt_mesh **out, const int dims[MT_MESH_AXES], mt_comm_mem mem);
void mt_mesh_free(mt_mesh *m);

/* Sum of the bytes this rank sent on all of the mesh's communicators. */
uint64_t mt_mesh_bytes_total(const mt_mesh *m);
void mt_mesh_reset_bytes(mt_mesh *m);

#ifdef __cplusplus
}
#endif
#endif
