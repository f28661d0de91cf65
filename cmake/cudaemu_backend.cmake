# cmake/cudaemu_backend.cmake: the CUDA backend run on the CPU under tests/cudaemu (the
# emulator of the CUDA kernels), so every change to kernels/cuda runs in `make test`.
#
# meshtrain_emu is libmeshtrain built once more with MT_HAVE_CUDA=1, its kernels/cuda/*.cu
# rewritten and compiled as host C++ against the emulator (no nvcc, no CUDA toolkit, no
# NCCL: multi-rank runs use the MPI backend). Built from it:
#   meshtrain-emu           the CLI (backend=cuda runs the emulated kernels)
#   test_gpu_ops_emu        tests/test_gpu_ops.c (every op against the CPU backend,
#                           whole-model gradients, determinism) on the emulator
#   test_gpu_ops_emu_asan   the same under AddressSanitizer (kernels, emulator and test
#                           instrumented; fibers on ucontext), op-level cases
#   test_emu_*              tests/test_emu_*.c (e.g. test_emu_syncs: host synchronisations
#                           per training step, counted by the emulator)
# ctest label emu: test_gpu_ops_emu under three thread orders (forward; reverse with
# blocks reversed; seeded random), the ASan run, tests/test_emu_*.c and tests/test_emu_*.sh
# (the CLI).
file(GLOB MT_CUDA_EMU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)

add_library(meshtrain_emu_obj OBJECT ${MT_SOURCES})
target_include_directories(meshtrain_emu_obj PUBLIC ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/include ${CBLAS_INCLUDE_DIR})
target_link_libraries(meshtrain_emu_obj PUBLIC OpenMP::OpenMP_C PkgConfig::YAML PkgConfig::CJSON)
target_compile_definitions(meshtrain_emu_obj PUBLIC _POSIX_C_SOURCE=200809L MT_HAVE_CUDA=1)
if(MPI_C_FOUND)
  target_link_libraries(meshtrain_emu_obj PUBLIC MPI::MPI_C)
  target_compile_definitions(meshtrain_emu_obj PUBLIC MT_HAVE_MPI=1)
endif()

# mt_emu_library(NAME EMULATOR): libmeshtrain's objects + the emulated kernels, linked to
# the emulator build EMULATOR (cudaemu or cudaemu_asan).
function(mt_emu_library name emulator)
  add_library(${name} STATIC $<TARGET_OBJECTS:meshtrain_emu_obj>)
  cudaemu_add_cu(${name} LIB ${emulator} ${MT_CUDA_EMU_SOURCES})
  target_link_libraries(${name} PUBLIC meshtrain_emu_obj ${MATH_LIBRARY} ${CMAKE_DL_LIBS}) # OpenBLAS is dlopen'ed (kernels/cpu/gemm.c)
  set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX)
endfunction()
mt_emu_library(meshtrain_emu cudaemu)
mt_emu_library(meshtrain_emu_asan cudaemu_asan)
# `asm` outside kernels/cuda/ptx.cuh fails the build of either backend (tests/cudaemu).
add_dependencies(meshtrain_emu cudaemu_no_asm_check)
if(TARGET meshtrain_cuda)
  add_dependencies(meshtrain_cuda cudaemu_no_asm_check)
endif()

add_executable(meshtrain-emu ${CMAKE_SOURCE_DIR}/train/main.c)
target_link_libraries(meshtrain-emu PRIVATE meshtrain_emu)
set_target_properties(meshtrain-emu PROPERTIES LINKER_LANGUAGE CXX)

# tests/test_emu_*.c: Criterion tests of the library with backend=cuda on the emulator,
# reading the emulator's own state (tests/cudaemu/include/cudaemu_stats.h), e.g.
# test_emu_syncs (host synchronisations per training step). Label emu.
file(GLOB MT_EMU_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/test_emu_*.c)
foreach(src ${MT_EMU_TEST_SOURCES})
  get_filename_component(t ${src} NAME_WE)
  add_executable(${t} ${src})
  target_link_libraries(${t} PRIVATE meshtrain_emu ${CRITERION_LIBRARY})
  target_include_directories(${t} PRIVATE ${CUDAEMU_DIR}/include)
  target_compile_definitions(${t} PRIVATE MT_SOURCE_DIR="${CMAKE_SOURCE_DIR}" MT_BINARY_DIR="${CMAKE_BINARY_DIR}")
  set_target_properties(${t} PROPERTIES LINKER_LANGUAGE CXX RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${t} COMMAND ${t} --jobs 1)
  set_tests_properties(${t} PROPERTIES LABELS emu TIMEOUT 600 ENVIRONMENT "CUDAEMU_QUIET=1;OMP_NUM_THREADS=1")
endforeach()

# mt_emu_op_test(NAME SOURCE ASAN_FILTER): the Criterion test SOURCE built twice, NAME_emu
# on meshtrain_emu and NAME_emu_asan on meshtrain_emu_asan (kernels, emulator and test
# instrumented; fibers on ucontext), registered (label emu) in three thread orders and
# once under AddressSanitizer with ASAN_FILTER (a Criterion --filter, "" for all).
# Thread orders: CUDAEMU_ORDER / CUDAEMU_BLOCK_ORDER (tests/cudaemu/README.md). A kernel
# whose result depends on the order in which a block's threads run between barriers
# (a missing __syncthreads, a read of another lane's shared slot before it is written)
# gives different results, or NaN from the 0xFF fill, under one of them.
function(mt_emu_op_test name source asan_filter)
  foreach(variant emu emu_asan)
    set(t ${name}_${variant})
    add_executable(${t} ${source})
    if(variant STREQUAL emu_asan)
      target_link_libraries(${t} PRIVATE meshtrain_emu_asan ${CRITERION_LIBRARY})
      target_compile_options(${t} PRIVATE -fsanitize=address -fno-omit-frame-pointer)
    else()
      target_link_libraries(${t} PRIVATE meshtrain_emu ${CRITERION_LIBRARY})
    endif()
    target_compile_definitions(${t} PRIVATE MT_SOURCE_DIR="${CMAKE_SOURCE_DIR}" MT_BINARY_DIR="${CMAKE_BINARY_DIR}")
    set_target_properties(${t} PROPERTIES LINKER_LANGUAGE CXX RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  endforeach()
  set(base "CUDAEMU_QUIET=1;OMP_NUM_THREADS=1")
  foreach(spec "forward:CUDAEMU_ORDER=forward" "reverse:CUDAEMU_ORDER=reverse;CUDAEMU_BLOCK_ORDER=reverse"
               "random:CUDAEMU_ORDER=random:20240520")
    string(FIND "${spec}" ":" colon)
    string(SUBSTRING "${spec}" 0 ${colon} order)
    math(EXPR from "${colon} + 1")
    string(SUBSTRING "${spec}" ${from} -1 env)
    add_test(NAME ${name}_emu_${order} COMMAND ${name}_emu --jobs 1)
    set_tests_properties(${name}_emu_${order} PROPERTIES LABELS emu TIMEOUT 600 ENVIRONMENT "${env};${base}")
  endforeach()
  if(asan_filter)
    add_test(NAME ${name}_emu_asan COMMAND ${name}_emu_asan --jobs 1 --filter "${asan_filter}")
  else()
    add_test(NAME ${name}_emu_asan COMMAND ${name}_emu_asan --jobs 1)
  endif()
  set_tests_properties(${name}_emu_asan PROPERTIES LABELS emu TIMEOUT 900
    ENVIRONMENT "CUDAEMU_ORDER=random:7;${base};ASAN_OPTIONS=detect_leaks=0")
endfunction()

# tests/test_gpu_ops.c: every op against the CPU backend, whole-model gradients,
# determinism. Under ASan only the op-level cases, which run every kernel; the
# whole-model cases take 4x their time there and run in the three orders.
mt_emu_op_test(test_gpu_ops ${CMAKE_SOURCE_DIR}/tests/test_gpu_ops.c "gpu_ops/*")
# tests/test_gpu_attention_mma.c (kernels/cuda/attention_mma.cu: mma.sync, ldmatrix and
# cp.async through ptx.cuh's emulation); under ASan a cp.async or load past a device
# buffer.
mt_emu_op_test(test_gpu_attention_mma ${CMAKE_SOURCE_DIR}/tests/test_gpu_attention_mma.c "")

# tests/tools/mpi_layout.c on the emulated CUDA backend: the mesh layout suite under
# mpirun with backend=cuda (tests/test_emu_mpi_layouts.sh).
add_executable(mpi_layout_emu ${CMAKE_SOURCE_DIR}/tests/tools/mpi_layout.c)
target_link_libraries(mpi_layout_emu PRIVATE meshtrain_emu)
set_target_properties(mpi_layout_emu PROPERTIES LINKER_LANGUAGE CXX RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/tools)

# bench/gpu_bench.c on the emulated CUDA backend (MT_GPU_BENCH_SMOKE=1: tiny shapes): the
# benchmark's code paths and JSON run in CI although its figures need a GPU
# (tests/test_emu_gpu_bench.sh).
add_executable(gpu_bench_emu ${CMAKE_SOURCE_DIR}/bench/gpu_bench.c)
target_link_libraries(gpu_bench_emu PRIVATE meshtrain_emu)
target_include_directories(gpu_bench_emu PRIVATE ${CUDAEMU_DIR}/include)
target_compile_definitions(gpu_bench_emu PRIVATE MT_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
set_target_properties(gpu_bench_emu PROPERTIES LINKER_LANGUAGE CXX RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
