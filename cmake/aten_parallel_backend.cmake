# Compile flags that make at::parallel_for in our files run on LibTorch's intra-op threads
# (at::get_num_threads(), torch.set_num_threads), matched to the backend ATen was built with.
#
# at::parallel_for is a header template. With ATen's OpenMP backend (AT_PARALLEL_OPENMP in
# ATen/Config.h: the PyPI wheels) it is a `#pragma omp parallel` that a file compiled without
# OpenMP drops: every task then runs on the calling thread, whatever the thread count. So those
# files are compiled with OpenMP, and the pragma calls into the OpenMP runtime libtorch_cpu itself
# loads (the wheel ships its own libgomp.so.1), linked by path: a second runtime (LLVM's libomp,
# or another libgomp) in the process would be a second pool of threads, each as large as the
# machine, whose size at::set_num_threads does not set. With the native backend
# (AT_PARALLEL_NATIVE) at::parallel_for calls libtorch_cpu's own pool and needs no flag.
#
# hp_match_aten_parallel_backend() sets, in the caller's scope:
#   HP_ATEN_PARALLEL_BACKEND        OpenMP or native (from ATen/Config.h)
#   HP_INTRA_OP_COMPILE_OPTIONS     options for the files that call at::parallel_for
#   HP_INTRA_OP_LINK_LIBRARIES      the OpenMP runtime libtorch_cpu loads (a file), or nothing
#   HP_INTRA_OP_SERIAL_REASON       "" where the flags match ATen; otherwise why this build's
#                                   kernels run on the calling thread (clang, whose OpenMP code
#                                   needs LLVM's runtime, against a LibTorch built with libgomp)
# and checks at configure time that a file compiled with those options gets ATen's parallel
# at::parallel_for (src/compat/intra_op_parallel.h checks it again in every file that uses it).
include(CheckCXXSourceCompiles)

function(hp_match_aten_parallel_backend)
  set(config "")
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${dir}/ATen/Config.h")
      set(config "${dir}/ATen/Config.h")
      break()
    endif()
  endforeach()
  if(NOT config)
    message(FATAL_ERROR "ATen/Config.h not found under TORCH_INCLUDE_DIRS (${TORCH_INCLUDE_DIRS}): "
                        "expected a LibTorch found by find_package(Torch)")
  endif()
  file(STRINGS "${config}" openmp_line REGEX "^#define AT_PARALLEL_OPENMP [01]")
  file(STRINGS "${config}" native_line REGEX "^#define AT_PARALLEL_NATIVE [01]")
  if(NOT openmp_line OR NOT native_line)
    message(FATAL_ERROR "${config}: expected '#define AT_PARALLEL_OPENMP 0|1' and '#define AT_PARALLEL_NATIVE 0|1'")
  endif()

  set(options "")
  set(runtime "")
  set(reason "")
  if(openmp_line MATCHES "1$")
    set(backend OpenMP)
    hp_torch_openmp_runtime(runtime)
    get_filename_component(runtime_name "${runtime}" NAME)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      # GCC's OpenMP code calls GOMP_*, which libgomp has and LLVM's / Intel's runtimes provide too.
      set(options -fopenmp)
    elseif(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND NOT runtime_name MATCHES "gomp")
      set(options -fopenmp)
    else()
      # Clang's OpenMP code calls LLVM's runtime only (-fopenmp=libgomp compiles no OpenMP).
      string(CONCAT reason "ATen's parallel backend is OpenMP with ${runtime_name}, and ${CMAKE_CXX_COMPILER_ID} "
                    "cannot compile OpenMP for that runtime: this build's kernels run every row on the "
                    "calling thread (build with GCC for LibTorch's threads)")
      set(runtime "")
    endif()
  elseif(native_line MATCHES "1$")
    set(backend native)
  else()
    message(FATAL_ERROR "${config}: neither AT_PARALLEL_OPENMP nor AT_PARALLEL_NATIVE is 1")
  endif()

  # The check: with these options ATen's header takes its parallel path (INTRA_OP_PARALLEL).
  if(NOT reason)
    string(MD5 key "${backend};${options};${TORCH_INCLUDE_DIRS};${CMAKE_CXX_COMPILER}")
    set(CMAKE_REQUIRED_FLAGS "${options}")
    string(REPLACE ";" " " CMAKE_REQUIRED_FLAGS "${CMAKE_REQUIRED_FLAGS}")
    set(CMAKE_REQUIRED_INCLUDES ${TORCH_INCLUDE_DIRS})
    set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
    set(CMAKE_REQUIRED_QUIET ON)
    check_cxx_source_compiles([[
#include <ATen/Parallel.h>
#ifndef INTRA_OP_PARALLEL
#error "at::parallel_for is ATen's serial fallback with these flags"
#endif
int main() { return 0; }
]] HP_INTRA_OP_PARALLEL_${key})
    if(NOT HP_INTRA_OP_PARALLEL_${key})
      message(FATAL_ERROR "ATen's parallel backend is ${backend} (${config}), but a file compiled with "
                          "'${options}' gets the serial at::parallel_for (INTRA_OP_PARALLEL undefined): "
                          "the kernels would run every row on the calling thread. See "
                          "cmake/aten_parallel_backend.cmake")
    endif()
  endif()
  if(reason)
    message(STATUS "HyperParallel: ${reason}")
  else()
    message(STATUS "HyperParallel: ATen's parallel backend ${backend}; at::parallel_for compiled with "
                   "'${options}', runtime ${runtime}")
  endif()
  set(HP_ATEN_PARALLEL_BACKEND ${backend} PARENT_SCOPE)
  set(HP_INTRA_OP_COMPILE_OPTIONS ${options} PARENT_SCOPE)
  set(HP_INTRA_OP_LINK_LIBRARIES ${runtime} PARENT_SCOPE)
  set(HP_INTRA_OP_SERIAL_REASON "${reason}" PARENT_SCOPE)
endfunction()

# The OpenMP runtime libtorch_cpu loads: the file its DT_NEEDED entry names, looked for where the
# loader finds it for LibTorch (libtorch_cpu's folder, an auditwheel wheel's torch.libs), then in
# the compiler's and the system's folders (a LibTorch built against the system's libgomp).
function(hp_torch_openmp_runtime out)
  find_library(HP_TORCH_CPU_LIBRARY torch_cpu PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH REQUIRED)
  if(NOT CMAKE_OBJDUMP)
    message(FATAL_ERROR "objdump not found: needed to read which OpenMP runtime ${HP_TORCH_CPU_LIBRARY} loads")
  endif()
  execute_process(COMMAND "${CMAKE_OBJDUMP}" -p "${HP_TORCH_CPU_LIBRARY}" OUTPUT_VARIABLE headers
                  RESULT_VARIABLE failed)
  string(REGEX MATCH "NEEDED +(lib(gomp|iomp5|omp)[^ \n]*)" needed "${headers}")
  if(failed OR NOT needed)
    message(FATAL_ERROR "ATen's parallel backend is OpenMP, but ${HP_TORCH_CPU_LIBRARY} names no OpenMP runtime "
                        "(libgomp, libiomp5, libomp) among the libraries it needs")
  endif()
  set(name "${CMAKE_MATCH_1}")
  get_filename_component(torch_lib_dir "${HP_TORCH_CPU_LIBRARY}" DIRECTORY)
  set(found "")
  foreach(dir "${torch_lib_dir}" "${torch_lib_dir}/../../torch.libs" ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES}
          /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE} /usr/lib64 /usr/lib /usr/local/lib)
    if(EXISTS "${dir}/${name}")
      get_filename_component(found "${dir}/${name}" ABSOLUTE)
      break()
    endif()
  endforeach()
  if(NOT found)
    message(FATAL_ERROR "${HP_TORCH_CPU_LIBRARY} loads the OpenMP runtime ${name}, not found beside it nor in "
                        "the compiler's and the system's library folders")
  endif()
  # Linked by its path, its soname is what our libraries need: one runtime in the process.
  set(${out} "${found}" PARENT_SCOPE)
endfunction()
