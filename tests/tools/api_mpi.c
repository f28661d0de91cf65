/* tests/tools/api_mpi.c: a researcher's multi-process program over the public API.
 * It initialises MPI itself, hands the library a communicator (a duplicate of
 * MPI_COMM_WORLD split into one group, as a program with other communicators would),
 * creates a session with data parallelism over it and prints rank 0's step losses.
 * Used by tests/test_mpi_api.sh, which compares them with one process.
 * Usage: api_mpi CONFIG.yml [key=value ...] */
#include <stdio.h>

#include "meshtrain.h"
#ifdef MT_HAVE_MPI
#include <mpi.h>
#endif

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: api_mpi CONFIG.yml [key=value ...]\n");
        return 2;
    }
    int rank = 0, world = 1;
#ifdef MT_HAVE_MPI
    MPI_Init(&argc, &argv);
    MPI_Comm mine;
    MPI_Comm_split(MPI_COMM_WORLD, 0, 0, &mine);
    mt_status st = mt_distributed_init(&mine, &rank, &world);
#else
    mt_status st = mt_distributed_init(NULL, &rank, &world);
#endif
    mt_session *s = NULL;
    if (st == MT_OK) st = mt_session_create(&s, argv[1], argc - 2, (const char *const *)argv + 2);
    for (int i = 0; st == MT_OK && i < 3; i++) {
        mt_step_result r;
        st = mt_session_step(s, &r);
        if (st == MT_OK && rank == 0) printf("step %lld loss %.9f world %d\n", (long long)r.step, r.loss, world);
    }
    if (st != MT_OK) fprintf(stderr, "api_mpi: rank %d: %s\n", rank, mt_last_error());
    mt_session_free(s);
#ifdef MT_HAVE_MPI
    MPI_Comm_free(&mine);
    MPI_Finalize();
#endif
    return st == MT_OK ? 0 : 1;
}
