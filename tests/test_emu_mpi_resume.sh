#!/usr/bin/env bash
# tests/test_emu_mpi_resume.sh BUILD_DIR: tests/test_mpi_resume.sh with backend=cuda on the
# CUDA emulator (issue 14): dp2 x tp2 x ZeRO-1 and the fsdp layouts equal one process,
# their checkpoints (gathered from device shards) equal its checkpoint, resume is bitwise,
# and the checkpoints load into other layouts.
exec bash "$(dirname "$0")/test_mpi_resume.sh" "${1:?usage: test_emu_mpi_resume.sh BUILD_DIR}" cuda
