#!/usr/bin/env bash
# tests/test_emu_mpi_layouts.sh BUILD_DIR: the mesh layout suite (tests/test_mpi_layouts.sh:
# data, ZeRO-1 with both schedules, tensor, sequence, context all-gather and ring, fsdp
# and their compositions, bf16 accumulators, dtype=bfloat16 with fsdp, tensor and context
# ring) with backend=cuda under mpirun, each rank
# running the CUDA kernels on the emulator and its collectives on device buffers (staged
# through host memory: parallel/comm.h): every layout equals the single-process cuda run
# within the CPU suite's bounds, and the bytes each rank sends equal the formula (issue 14).
exec bash "$(dirname "$0")/test_mpi_layouts.sh" "${1:?usage: test_emu_mpi_layouts.sh BUILD_DIR}" cuda
