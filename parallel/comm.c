/* parallel/comm.c: the backend-independent parts of parallel/comm.h (element sizes and
 * collective kind names), shared by the MPI (comm_mpi.c) and NCCL (comm_nccl.c)
 * backends so that neither links against the other for them. */
#include "parallel/comm.h"

size_t mt_comm_dtype_size(mt_comm_dtype dt) {
    switch (dt) {
    case MT_COMM_F32: return 4;
    case MT_COMM_F64: return 8;
    case MT_COMM_I64: return 8;
    case MT_COMM_U16: return 2;
    case MT_COMM_BF16: return 2;
    }
    return 0;
}

const char *mt_coll_kind_name(mt_coll_kind k) {
    static const char *const n[MT_COLL_KINDS] = {"all_reduce", "reduce_scatter", "all_gather",
                                                 "broadcast", "send", "barrier"};
    return k >= 0 && k < MT_COLL_KINDS ? n[k] : "?";
}
