# tests/cudaemu/selftest/runtime_tests.cmake: the runtime half's self-tests (runtime API,
# CPU cuBLASLt + dlopen shim, bf16, the counters of cudaemu_stats.h), label emu.
# NOTE to the owner of tests/cudaemu/CMakeLists.txt: include this file after the
# `cudaemu` library target exists:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/selftest/runtime_tests.cmake)
# Each test is a plain driver that returns the number of failed checks (0 = pass).
set(CUDAEMU_RT_DIR ${CMAKE_CURRENT_LIST_DIR}/..)
foreach(src test_runtime_api.c test_runtime_cublaslt.c test_runtime_bf16.cpp test_runtime_stats.c)
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/${src})
  target_include_directories(${name} PRIVATE ${CUDAEMU_RT_DIR}/include ${CUDAEMU_RT_DIR}/src ${CMAKE_CURRENT_LIST_DIR})
  target_compile_definitions(${name} PRIVATE CUDAEMU=1)
  target_link_libraries(${name} PRIVATE cudaemu ${CMAKE_DL_LIBS} m)
  set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS emu TIMEOUT 120)
endforeach()

# CUDAEMU_HOST_ACCESS (src/hostaccess.cpp): host code touching cudaMalloc memory aborts with
# a message and a backtrace; the driver runs each case in a child process. A .cu (kernels).
add_executable(test_runtime_trap)
cudaemu_add_cu(test_runtime_trap ${CMAKE_CURRENT_LIST_DIR}/test_runtime_trap.cu)
target_include_directories(test_runtime_trap PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${CUDAEMU_RT_DIR}/src)
add_test(NAME test_runtime_trap COMMAND test_runtime_trap)
set_tests_properties(test_runtime_trap PROPERTIES LABELS emu TIMEOUT 120 ENVIRONMENT "CUDAEMU_QUIET=1")
add_executable(test_runtime_trap_asan)
cudaemu_add_cu(test_runtime_trap_asan LIB cudaemu_asan ${CMAKE_CURRENT_LIST_DIR}/test_runtime_trap.cu)
target_include_directories(test_runtime_trap_asan PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${CUDAEMU_RT_DIR}/src)
add_test(NAME test_runtime_trap_asan COMMAND test_runtime_trap_asan)
set_tests_properties(test_runtime_trap_asan PROPERTIES LABELS emu TIMEOUT 300
  ENVIRONMENT "CUDAEMU_QUIET=1;ASAN_OPTIONS=detect_leaks=0")
