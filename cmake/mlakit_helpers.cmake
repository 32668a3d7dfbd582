# Build helpers for mlakit's own executables (tests, examples, benchmarks).
#
#   mlakit_select_backend()                     resolve MLAKIT_BACKEND -> MLAKIT_GPU_BACKEND
#   mlakit_add_gpu_executable(name SOURCES...)  .cu sources for the chosen backend
#   mlakit_add_gpu_object_library(name SOURCES...)  the same, as an OBJECT library (e.g. the
#                                               one translation unit that compiles decode()'s
#                                               dispatch table for several executables)
#   mlakit_add_host_executable(name SOURCES...) plain C++ (host only) sources
#   mlakit_configure_host_target(target)        the host flags, for a library/object target
#
# Backends:
#   CUDA  .cu compiled by nvcc as CUDA, -std=c++17 and no other flag a user would need, archs
#         from MLAKIT_CUDA_ARCHS (CUDA_ARCHITECTURES: "90a" -> sm_90a), linked to CUDA::cudart_static.
#   HIP   the C++ compiler is hipcc or a HIP-capable clang++ (CXX=clang++-19 cmake ...): .cu
#         compiled as CXX with -xhip and --offload-arch=<each of MLAKIT_HIP_ARCHS>, linked to
#         hip::device (+ roc::rocprim); plain clang++ also gets the device-library folder
#         (mlakit_hip_device_libs.cmake).
#   NONE  .cu compiled as plain C++ (-xc++) so the host-only paths of the headers build.
# GPU executables get MLAKIT_BACKEND_CUDA=1 or MLAKIT_BACKEND_HIP=1 (nothing for NONE);
# host executables get neither: they are host code whatever the backend.
include_guard(GLOBAL)

# True when CMAKE_CXX_COMPILER is (a path to) hipcc.
function(_mlakit_cxx_is_hipcc out)
  get_filename_component(_name "${CMAKE_CXX_COMPILER}" NAME)
  if(_name MATCHES "^hipcc")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# A macro, not a function: enable_language() must run at directory scope, and the variables
# it sets (MLAKIT_GPU_BACKEND, MLAKIT_CXX_IS_HIPCC) are read by the functions below.
macro(mlakit_select_backend)
  string(TOUPPER "${MLAKIT_BACKEND}" _mlakit_requested)
  if(NOT _mlakit_requested MATCHES "^(AUTO|CUDA|HIP|NONE)$")
    message(FATAL_ERROR "MLAKIT_BACKEND='${MLAKIT_BACKEND}': allowed values are AUTO, CUDA, HIP, NONE")
  endif()
  _mlakit_cxx_is_hipcc(MLAKIT_CXX_IS_HIPCC)

  set(MLAKIT_GPU_BACKEND NONE)
  if(_mlakit_requested STREQUAL "AUTO")
    # CXX=hipcc is an explicit request for AMD, so it wins over an nvcc found on PATH.
    if(MLAKIT_CXX_IS_HIPCC)
      set(MLAKIT_GPU_BACKEND HIP)
    else()
      include(CheckLanguage)
      check_language(CUDA)
      if(CMAKE_CUDA_COMPILER)
        set(MLAKIT_GPU_BACKEND CUDA)
      elseif(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
        # Plain clang++ can compile HIP when the HIP package is installed.
        find_package(hip CONFIG QUIET)
        if(hip_FOUND)
          set(MLAKIT_GPU_BACKEND HIP)
        endif()
      endif()
    endif()
  else()
    set(MLAKIT_GPU_BACKEND "${_mlakit_requested}")
  endif()

  if(MLAKIT_GPU_BACKEND STREQUAL "CUDA")
    include(CheckLanguage)
    check_language(CUDA)
    if(NOT CMAKE_CUDA_COMPILER)
      message(FATAL_ERROR "MLAKIT_BACKEND=CUDA but no CUDA compiler was found: put nvcc on PATH "
                          "(e.g. /usr/local/cuda/bin) or pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc")
    endif()
    # Set before enable_language so CMake does not test-compile for its own default arch.
    # CMake accepts arch-specific values such as 90a (-> compute_90a / sm_90a).
    set(CMAKE_CUDA_ARCHITECTURES "${MLAKIT_CUDA_ARCHS}")
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
  elseif(MLAKIT_GPU_BACKEND STREQUAL "HIP")
    if(NOT MLAKIT_CXX_IS_HIPCC AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      message(FATAL_ERROR "MLAKIT_BACKEND=HIP needs hipcc (or a HIP-capable clang++) as the C++ "
                          "compiler: configure with CXX=hipcc cmake ... (found ${CMAKE_CXX_COMPILER})")
    endif()
    # hip-config.cmake globs <prefix>/lib/clang/*/include for the compiler's resource headers
    # (added to hip::device as -isystem) and the clang_rt.builtins library; with two clangs
    # installed (Debian: clang 14 from the base system, clang 15 for hipcc) it takes the
    # first, the wrong one. Point both at the resource directory of the compiler in use.
    if(NOT DEFINED CACHE{HIP_CLANG_INCLUDE_PATH})
      execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-resource-dir
                      OUTPUT_VARIABLE _mlakit_clang_res OUTPUT_STRIP_TRAILING_WHITESPACE
                      ERROR_QUIET RESULT_VARIABLE _mlakit_res_rc)
      if(_mlakit_res_rc EQUAL 0 AND EXISTS "${_mlakit_clang_res}/include/stddef.h")
        set(HIP_CLANG_INCLUDE_PATH "${_mlakit_clang_res}/include" CACHE PATH
            "Resource headers of the HIP compiler (set by mlakit)")
        set(_mlakit_builtins
            "${_mlakit_clang_res}/lib/linux/libclang_rt.builtins-${CMAKE_SYSTEM_PROCESSOR}.a")
        if(EXISTS "${_mlakit_builtins}" AND NOT DEFINED CACHE{CLANGRT_BUILTINS})
          set(CLANGRT_BUILTINS "${_mlakit_builtins}" CACHE FILEPATH
              "clang_rt.builtins of the HIP compiler (set by mlakit)")
        endif()
      endif()
    endif()
    find_package(hip CONFIG REQUIRED)
    # rocPRIM serves the planner's block scan; without it (or with MLAKIT_HIP_USE_ROCPRIM=OFF,
    # e.g. a rocPRIM older than the HIP headers) a plain shared-memory scan is compiled.
    option(MLAKIT_HIP_USE_ROCPRIM "Use rocPRIM's block scan in the HIP planner kernel" ON)
    if(MLAKIT_HIP_USE_ROCPRIM)
      find_package(rocprim CONFIG QUIET)
    endif()
    if(NOT MLAKIT_HIP_ARCHS)
      message(FATAL_ERROR "MLAKIT_HIP_ARCHS is empty: name at least one gfx target")
    endif()
    # A plain clang++ (e.g. Debian's clang-19) may need the device libraries named, and
    # Debian's lack gfx942's ISA-version file (mlakit_hip_device_libs.cmake says why).
    set(MLAKIT_HIP_DEVICE_LIB_OPTION "")
    if(NOT MLAKIT_CXX_IS_HIPCC)
      include(mlakit_hip_device_libs)
      mlakit_hip_device_libs(MLAKIT_HIP_DEVICE_LIB_OPTION)
    endif()
    if(MLAKIT_CXX_IS_HIPCC)
      # hipcc asks rocm_agent_enumerator for the local GPU on every call (compile and link,
      # host-only files too) unless an --offload-arch is given; on a machine without a GPU
      # that prints a Python traceback. Giving the archs to every call keeps it quiet; for
      # host-only (-xc++) compiles hipcc uses them at link time only.
      foreach(_mlakit_arch IN LISTS MLAKIT_HIP_ARCHS)
        add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:--offload-arch=${_mlakit_arch}>")
        add_link_options("$<$<LINK_LANGUAGE:CXX>:--offload-arch=${_mlakit_arch}>")
      endforeach()
    endif()
  elseif(NOT MLAKIT_GPU_BACKEND STREQUAL "NONE")
    message(FATAL_ERROR "internal: unknown backend ${MLAKIT_GPU_BACKEND}")
  endif()

  if(MLAKIT_GPU_BACKEND STREQUAL "CUDA")
    message(STATUS "mlakit: CUDA backend, ${CMAKE_CUDA_COMPILER} "
                   "${CMAKE_CUDA_COMPILER_VERSION}, archs ${MLAKIT_CUDA_ARCHS}")
  elseif(MLAKIT_GPU_BACKEND STREQUAL "HIP")
    message(STATUS "mlakit: HIP backend, ${CMAKE_CXX_COMPILER}, archs ${MLAKIT_HIP_ARCHS}, "
                   "rocPRIM ${rocprim_FOUND} (MLAKIT_HIP_USE_ROCPRIM ${MLAKIT_HIP_USE_ROCPRIM})")
  else()
    message(STATUS "mlakit: no GPU backend (host-only build)")
  endif()
endmacro()

# Standard, warnings and the library, for every target built here. Warnings apply to C++
# compiles (host sources; under HIP and NONE the .cu files too), not to nvcc's.
function(_mlakit_common_setup target)
  target_link_libraries(${target} PRIVATE mlakit::mlakit)
  # An explicit CXX_STANDARD makes CMake always pass -std=c++17; hipcc would otherwise
  # inject its own -std=c++11.
  set_target_properties(${target} PROPERTIES
    CXX_STANDARD 17
    CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF)
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra>")
  if(MLAKIT_WERROR)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Werror>")
  endif()
endfunction()

# Host flags for a target of plain C++ sources (an executable, or an object library such as
# the Catch2 main). Under hipcc, .cpp files are compiled as HIP unless -xc++ is given.
function(mlakit_configure_host_target target)
  _mlakit_common_setup(${target})
  if(MLAKIT_CXX_IS_HIPCC)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-xc++>")
  endif()
endfunction()

function(mlakit_add_host_executable name)
  if(ARGC LESS 2)
    message(FATAL_ERROR "mlakit_add_host_executable(${name}): no sources")
  endif()
  add_executable(${name} ${ARGN})
  mlakit_configure_host_target(${name})
endfunction()

function(mlakit_add_gpu_executable name)
  if(ARGC LESS 2)
    message(FATAL_ERROR "mlakit_add_gpu_executable(${name}): no sources")
  endif()
  add_executable(${name} ${ARGN})
  _mlakit_gpu_setup(${name} ${ARGN})
endfunction()

function(mlakit_add_gpu_object_library name)
  if(ARGC LESS 2)
    message(FATAL_ERROR "mlakit_add_gpu_object_library(${name}): no sources")
  endif()
  add_library(${name} OBJECT ${ARGN})
  _mlakit_gpu_setup(${name} ${ARGN})
endfunction()

# Backend flags of a target whose .cu sources are GPU code.
function(_mlakit_gpu_setup name)
  set(_sources ${ARGN})
  set(_cu_sources ${_sources})
  list(FILTER _cu_sources INCLUDE REGEX "\\.cu$")
  _mlakit_common_setup(${name})

  if(MLAKIT_GPU_BACKEND STREQUAL "CUDA")
    if(_cu_sources)
      set_source_files_properties(${_cu_sources} TARGET_DIRECTORY ${name}
                                  PROPERTIES LANGUAGE CUDA)
    endif()
    set_target_properties(${name} PROPERTIES
      CUDA_ARCHITECTURES "${MLAKIT_CUDA_ARCHS}"
      CUDA_STANDARD 17
      CUDA_STANDARD_REQUIRED ON
      CUDA_EXTENSIONS OFF
      CUDA_RUNTIME_LIBRARY Static)
    target_compile_definitions(${name} PRIVATE MLAKIT_BACKEND_CUDA=1)
    target_link_libraries(${name} PRIVATE CUDA::cudart_static)

  elseif(MLAKIT_GPU_BACKEND STREQUAL "HIP")
    if(_cu_sources)
      set_source_files_properties(${_cu_sources} TARGET_DIRECTORY ${name}
                                  PROPERTIES LANGUAGE CXX)
      set_property(SOURCE ${_cu_sources} TARGET_DIRECTORY ${name}
                   APPEND PROPERTY COMPILE_OPTIONS "-xhip")
      # Device compiles only: on host-only (-xc++) files clang warns that it is unused.
      if(MLAKIT_HIP_DEVICE_LIB_OPTION)
        set_property(SOURCE ${_cu_sources} TARGET_DIRECTORY ${name}
                     APPEND PROPERTY COMPILE_OPTIONS "${MLAKIT_HIP_DEVICE_LIB_OPTION}")
      endif()
    endif()
    if(NOT MLAKIT_CXX_IS_HIPCC)
      # hipcc gets the archs from mlakit_select_backend(); plain clang++ needs them here.
      foreach(_arch IN LISTS MLAKIT_HIP_ARCHS)
        target_compile_options(${name} PRIVATE "--offload-arch=${_arch}")
        target_link_options(${name} PRIVATE "--offload-arch=${_arch}")
      endforeach()
    endif()
    target_compile_definitions(${name} PRIVATE MLAKIT_BACKEND_HIP=1)
    target_link_libraries(${name} PRIVATE hip::device)
    if(MLAKIT_HIP_USE_ROCPRIM AND TARGET roc::rocprim)
      target_link_libraries(${name} PRIVATE roc::rocprim)
    else()
      target_compile_definitions(${name} PRIVATE MLAKIT_NO_ROCPRIM=1)
    endif()

  else()  # NONE: the .cu files are host C++ here.
    if(_cu_sources)
      set_source_files_properties(${_cu_sources} TARGET_DIRECTORY ${name}
                                  PROPERTIES LANGUAGE CXX)
      set_property(SOURCE ${_cu_sources} TARGET_DIRECTORY ${name}
                   APPEND PROPERTY COMPILE_OPTIONS "-xc++")
    endif()
  endif()
endfunction()
