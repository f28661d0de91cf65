#!/usr/bin/env bash
# tests/test_emu_mpi_failure.sh BUILD_DIR: tests/test_mpi_failure.sh with backend=cuda on
# the CUDA emulator (issue 14): a killed rank ends the job within 60 s naming the rank,
# and a hung one makes the others' watchdog end them naming the collective.
exec bash "$(dirname "$0")/test_mpi_failure.sh" "${1:?usage: test_emu_mpi_failure.sh BUILD_DIR}" cuda
