/* parallel/mesh.c: mesh sizes, layout checks and per-axis communicators (mesh.h). */
#include "parallel/mesh.h"

#include <stdio.h>
#include <stdlib.h>

static const char *const k_keys[MT_MESH_AXES] = {"ici_data_parallelism", "ici_fsdp_parallelism",
                                                 "ici_context_parallelism", "ici_tensor_parallelism"};
static const char *const k_names[MT_MESH_AXES] = {"data", "fsdp", "context", "tensor"};

const char *mt_mesh_axis_key(mt_mesh_axis a) { return a >= 0 && a < MT_MESH_AXES ? k_keys[a] : "?"; }
const char *mt_mesh_axis_name(mt_mesh_axis a) { return a >= 0 && a < MT_MESH_AXES ? k_names[a] : "?"; }

mt_status mt_mesh_resolve(const int64_t ici[MT_MESH_AXES], int world, int dims[MT_MESH_AXES]) {
    int fill = -1;
    int64_t prod = 1;
    for (int a = 0; a < MT_MESH_AXES; a++) {
        if (ici[a] == -1) {
            if (fill >= 0)
                return mt_set_error(MT_ERR_INVALID, "%s and %s are both -1; at most one axis may fill the world",
                                    k_keys[fill], k_keys[a]);
            fill = a;
            continue;
        }
        if (ici[a] < 1)
            return mt_set_error(MT_ERR_INVALID, "%s=%lld must be >= 1 or -1 (fill)", k_keys[a], (long long)ici[a]);
        prod *= ici[a];
    }
    if (fill >= 0) {
        if (prod > world || world % prod != 0)
            return mt_set_error(MT_ERR_INVALID,
                                "%s=-1: the world of %d ranks is not a multiple of the other axes' product %lld",
                                k_keys[fill], world, (long long)prod);
        for (int a = 0; a < MT_MESH_AXES; a++) dims[a] = a == fill ? (int)(world / prod) : (int)ici[a];
        return MT_OK;
    }
    if (prod != world)
        return mt_set_error(MT_ERR_INVALID,
                            "ici_data_parallelism x ici_fsdp_parallelism x ici_context_parallelism x "
                            "ici_tensor_parallelism = %lld x %lld x %lld x %lld = %lld but the world has %d ranks "
                            "(mpirun -np; num_devices for plan and estimate)",
                            (long long)ici[0], (long long)ici[1], (long long)ici[2], (long long)ici[3],
                            (long long)prod, world);
    for (int a = 0; a < MT_MESH_AXES; a++) dims[a] = (int)ici[a];
    return MT_OK;
}

static mt_status need_div(int64_t value, const char *vkey, int64_t by, const char *bkey) {
    if (by > 0 && value % by != 0)
        return mt_set_error(MT_ERR_INVALID, "%s=%lld is not divisible by %s=%lld", vkey, (long long)value, bkey,
                            (long long)by);
    return MT_OK;
}

mt_status mt_mesh_check_tensor_split(int64_t tp, const mt_layout_sizes *s) {
    const char *tk = k_keys[MT_AXIS_TENSOR];
    if (tp <= 1) return MT_OK;
    MT_TRY(need_div(s->num_query_heads, "base_num_query_heads", tp, tk));
    MT_TRY(need_div(s->num_kv_heads, "base_num_kv_heads", tp, tk)); /* no kv-head replication */
    MT_TRY(need_div(s->mlp_dim, "base_mlp_dim", tp, tk));
    return need_div(s->vocab_size, "vocab_size", tp, tk);
}

mt_status mt_mesh_check_layout(const int dims[MT_MESH_AXES], const mt_layout_sizes *s) {
    const int64_t C = dims[MT_AXIS_CONTEXT];
    const char *ck = k_keys[MT_AXIS_CONTEXT];
    MT_TRY(mt_mesh_check_tensor_split(dims[MT_AXIS_TENSOR], s));
    if (C > 1 && s->seq % (2 * C) != 0)
        return mt_set_error(MT_ERR_INVALID, "max_target_length=%lld is not divisible by 2 x %s=%lld (2C chunks)",
                            (long long)s->seq, ck, (long long)C);
    if (s->batch < 1) return mt_set_error(MT_ERR_INVALID, "per_device_batch_size=%lld must be >= 1", (long long)s->batch);
    const int64_t T = dims[MT_AXIS_TENSOR], rows = s->batch * (s->seq / (C > 1 ? C : 1));
    if (s->sequence_parallel && T > 1 && rows % T != 0)
        return mt_set_error(MT_ERR_INVALID, "tensor_sequence_parallelism: the %lld rows per rank "
                            "(per_device_batch_size=%lld x max_target_length=%lld / %s=%lld) are not divisible "
                            "by %s=%lld", (long long)rows, (long long)s->batch, (long long)s->seq, ck, (long long)C,
                            k_keys[MT_AXIS_TENSOR], (long long)T);
    if (s->numel > 0 && dims[MT_AXIS_FSDP] > s->numel)
        return mt_set_error(MT_ERR_INVALID, "%s=%d exceeds the %lld parameters", k_keys[MT_AXIS_FSDP],
                            dims[MT_AXIS_FSDP], (long long)s->numel);
    return MT_OK;
}

void mt_mesh_coords(const int dims[MT_MESH_AXES], int r, int coord[MT_MESH_AXES]) {
    for (int a = MT_MESH_AXES - 1; a >= 0; a--) {
        coord[a] = r % dims[a];
        r /= dims[a];
    }
}

/* World rank of coord. */
static int rank_of(const int dims[MT_MESH_AXES], const int coord[MT_MESH_AXES]) {
    int r = 0;
    for (int a = 0; a < MT_MESH_AXES; a++) r = r * dims[a] + coord[a];
    return r;
}

mt_status mt_mesh_create(mt_mesh **out, const int dims[MT_MESH_AXES]) {
    return mt_mesh_create_on(out, dims, MT_COMM_HOST);
}

mt_status mt_mesh_create_on(mt_mesh **out, const int dims[MT_MESH_AXES], mt_comm_mem mem) {
    *out = NULL;
    MT_TRY(mt_comm_world_init());
    const int world = mt_comm_world_size();
    int prod = 1;
    for (int a = 0; a < MT_MESH_AXES; a++) prod *= dims[a];
    if (prod != world)
        return mt_set_error(MT_ERR_INVALID, "mesh %d x %d x %d x %d (data x fsdp x context x tensor) = %d ranks "
                            "but the world has %d", dims[0], dims[1], dims[2], dims[3], prod, world);
    mt_mesh *m = calloc(1, sizeof *m);
    if (!m) return mt_set_error(MT_ERR_OOM, "mt_mesh_create: out of memory");
    m->rank = mt_comm_world_rank();
    m->world = world;
    for (int a = 0; a < MT_MESH_AXES; a++) m->dims[a] = dims[a];
    mt_mesh_coords(dims, m->rank, m->coord);
    mt_status st = MT_OK;
    for (int a = 0; a < MT_MESH_AXES && st == MT_OK; a++) {
        /* color: the rank with this axis' coordinate set to 0 */
        int c[MT_MESH_AXES];
        for (int b = 0; b < MT_MESH_AXES; b++) c[b] = m->coord[b];
        c[a] = 0;
        st = mt_comm_split_on(&m->axis[a], rank_of(dims, c), m->coord[a], k_names[a], mem);
    }
    if (st == MT_OK) {
        int c[MT_MESH_AXES] = {0, 0, m->coord[MT_AXIS_CONTEXT], m->coord[MT_AXIS_TENSOR]};
        st = mt_comm_split_on(&m->data_fsdp, rank_of(dims, c),
                              m->coord[MT_AXIS_DATA] * dims[MT_AXIS_FSDP] + m->coord[MT_AXIS_FSDP], "data_fsdp", mem);
    }
    if (st == MT_OK) {
        int c[MT_MESH_AXES] = {0, 0, 0, m->coord[MT_AXIS_TENSOR]};
        const int key = (m->coord[MT_AXIS_DATA] * dims[MT_AXIS_FSDP] + m->coord[MT_AXIS_FSDP]) * dims[MT_AXIS_CONTEXT] +
                        m->coord[MT_AXIS_CONTEXT];
        st = mt_comm_split_on(&m->grad, rank_of(dims, c), key, "data_fsdp_context", mem);
    }
    if (st == MT_OK) st = mt_comm_split_on(&m->all, 0, m->rank, "world", mem);
    if (st == MT_OK) { /* grad again, fsdp-major */
        int c[MT_MESH_AXES] = {0, 0, 0, m->coord[MT_AXIS_TENSOR]};
        const int key = (m->coord[MT_AXIS_FSDP] * dims[MT_AXIS_DATA] + m->coord[MT_AXIS_DATA]) * dims[MT_AXIS_CONTEXT] +
                        m->coord[MT_AXIS_CONTEXT];
        st = mt_comm_split_on(&m->grad_fsdp, rank_of(dims, c), key, "fsdp_data_context", mem);
    }
    if (st == MT_OK) {
        int c[MT_MESH_AXES] = {0, m->coord[MT_AXIS_FSDP], 0, m->coord[MT_AXIS_TENSOR]};
        st = mt_comm_split_on(&m->replica, rank_of(dims, c),
                              m->coord[MT_AXIS_DATA] * dims[MT_AXIS_CONTEXT] + m->coord[MT_AXIS_CONTEXT], "data_context",
                              mem);
    }
    if (st != MT_OK) {
        mt_mesh_free(m);
        return st;
    }
    *out = m;
    return MT_OK;
}

void mt_mesh_free(mt_mesh *m) {
    if (!m) return;
    for (int a = 0; a < MT_MESH_AXES; a++) mt_comm_free(m->axis[a]);
    mt_comm_free(m->data_fsdp);
    mt_comm_free(m->grad);
    mt_comm_free(m->all);
    mt_comm_free(m->grad_fsdp);
    mt_comm_free(m->replica);
    free(m);
}

uint64_t mt_mesh_bytes_total(const mt_mesh *m) {
    uint64_t s = 0;
    for (int a = 0; a < MT_MESH_AXES; a++) s += mt_comm_bytes_total(m->axis[a]);
    return s + mt_comm_bytes_total(m->data_fsdp) + mt_comm_bytes_total(m->grad) + mt_comm_bytes_total(m->all) +
           mt_comm_bytes_total(m->grad_fsdp) + mt_comm_bytes_total(m->replica);
}

void mt_mesh_reset_bytes(mt_mesh *m) {
    for (int a = 0; a < MT_MESH_AXES; a++) mt_comm_reset_bytes(m->axis[a]);
    mt_comm_reset_bytes(m->data_fsdp);
    mt_comm_reset_bytes(m->grad);
    mt_comm_reset_bytes(m->all);
    mt_comm_reset_bytes(m->grad_fsdp);
    mt_comm_reset_bytes(m->replica);
}
