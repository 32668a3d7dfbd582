# The ROCm device libraries (ocml, ockl, oclc_*.bc) for a plain clang++ HIP build.
#
#   mlakit_hip_device_libs(<out_var>)
#
# A ROCm clang (or hipcc) finds its own device libraries; a distribution's clang (Debian 12's
# clang-19) finds none and needs --rocm-device-lib-path. Distribution device libraries can
# also be older than the compiler: Debian 12's ROCm 5.2 bitcode stops at gfx940, so there is
# no oclc_isa_version_942.bc although clang-19 compiles for gfx942. That file holds a single
# constant, __oclc_ISA_version (major * 1000 + minor * 100 + stepping), so for a gfx9 target
# it is generated here, into a build-tree folder of symlinks to the other files.
#
# Sets <out_var> to the compile option to add to HIP sources ("--rocm-device-lib-path=DIR"),
# or to "" when the compiler needs none. MLAKIT_HIP_DEVICE_LIB_PATH (cache) names a device
# library folder explicitly (e.g. /opt/rocm/amdgcn/bitcode); files it lacks for a gfx9 target
# are generated the same way.
include_guard(GLOBAL)

set(MLAKIT_HIP_DEVICE_LIB_PATH "" CACHE PATH
    "ROCm device library folder (ocml.bc, oclc_isa_version_*.bc) for a plain clang++ HIP build; empty: the compiler's own, else a system folder")

# The ISA version a gfx9 target's oclc_isa_version file defines: gfx9XY -> 9000 + 100 X + Y,
# Y a hex digit (gfx90a -> 9010, gfx942 -> 9402, gfx950 -> 9500).
function(_mlakit_gfx9_isa_version arch out)
  set(${out} "" PARENT_SCOPE)
  if(arch MATCHES "^gfx9([0-9])([0-9a-f])$")
    math(EXPR _v "9000 + 100 * ${CMAKE_MATCH_1} + 0x${CMAKE_MATCH_2}")
    set(${out} ${_v} PARENT_SCOPE)
  endif()
endfunction()

# Runs the compiler's driver in -### mode for one offload arch; <ok_var> is TRUE when it
# found every device library, <msg_var> holds its error otherwise.
function(_mlakit_probe_device_libs arch extra ok_var msg_var)
  set(_probe "${CMAKE_BINARY_DIR}/CMakeFiles/mlakit_probe.hip")
  if(NOT EXISTS "${_probe}")
    file(WRITE "${_probe}" "__global__ void mlakit_probe() {}\n")
  endif()
  execute_process(
    COMMAND ${CMAKE_CXX_COMPILER} "-###" -x hip --offload-arch=${arch} ${extra} -c "${_probe}"
            -o "${CMAKE_BINARY_DIR}/CMakeFiles/mlakit_probe.o"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(_rc EQUAL 0 AND NOT _err MATCHES "error:")
    set(${ok_var} TRUE PARENT_SCOPE)
  else()
    set(${ok_var} FALSE PARENT_SCOPE)
    string(REGEX MATCH "error:[^\n]*" _line "${_err}")
    set(${msg_var} "${_line}" PARENT_SCOPE)
  endif()
endfunction()

function(mlakit_hip_device_libs out_var)
  set(${out_var} "" PARENT_SCOPE)
  # Bare target names: target-ID features (gfx942:xnack-) do not change the library files.
  set(_archs "")
  foreach(_a IN LISTS MLAKIT_HIP_ARCHS)
    string(REGEX REPLACE ":.*$" "" _a "${_a}")
    list(APPEND _archs "${_a}")
  endforeach()
  list(REMOVE_DUPLICATES _archs)

  set(_base "${MLAKIT_HIP_DEVICE_LIB_PATH}")
  if(NOT _base)
    # Nothing to do when the compiler finds complete device libraries by itself.
    set(_all_ok TRUE)
    foreach(_a IN LISTS _archs)
      _mlakit_probe_device_libs(${_a} "" _ok _msg)
      if(NOT _ok)
        set(_all_ok FALSE)
      endif()
    endforeach()
    if(_all_ok)
      return()
    endif()
    file(GLOB _rocm_llvm_bitcode "/opt/rocm/lib/llvm/lib/clang/*/lib/amdgcn/bitcode")
    find_path(_mlakit_found_bitcode ocml.bc
      PATHS "$ENV{ROCM_PATH}/amdgcn/bitcode" /opt/rocm/amdgcn/bitcode ${_rocm_llvm_bitcode}
            "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/amdgcn/bitcode" /usr/lib/amdgcn/bitcode
      NO_DEFAULT_PATH NO_CACHE)
    if(NOT _mlakit_found_bitcode)
      message(FATAL_ERROR
        "mlakit: ${CMAKE_CXX_COMPILER} finds no ROCm device libraries for ${_archs} (${_msg}) "
        "and none were found under /opt/rocm or /usr/lib: install them (Debian: "
        "rocm-device-libs) or pass -DMLAKIT_HIP_DEVICE_LIB_PATH=<folder holding ocml.bc>")
    endif()
    string(REGEX REPLACE "/+$" "" _base "${_mlakit_found_bitcode}")
  elseif(NOT EXISTS "${_base}/ocml.bc")
    message(FATAL_ERROR "mlakit: MLAKIT_HIP_DEVICE_LIB_PATH=${_base} holds no ocml.bc")
  endif()

  # ISA-version files the folder lacks: generated for gfx9 targets, an error otherwise.
  set(_missing "")
  foreach(_a IN LISTS _archs)
    string(REGEX REPLACE "^gfx" "" _id "${_a}")
    if(NOT EXISTS "${_base}/oclc_isa_version_${_id}.bc")
      _mlakit_gfx9_isa_version(${_a} _v)
      if(NOT _v)
        message(FATAL_ERROR "mlakit: ${_base} has no oclc_isa_version_${_id}.bc for ${_a}: point "
                            "MLAKIT_HIP_DEVICE_LIB_PATH at device libraries that have it")
      endif()
      list(APPEND _missing "${_id}=${_v}")
    endif()
  endforeach()

  set(_dir "${_base}")
  if(_missing)
    set(_dir "${CMAKE_BINARY_DIR}/mlakit-amdgcn-bitcode")
    file(REMOVE_RECURSE "${_dir}")
    file(MAKE_DIRECTORY "${_dir}")
    file(GLOB _bcs "${_base}/*.bc")
    foreach(_bc IN LISTS _bcs)
      get_filename_component(_name "${_bc}" NAME)
      file(CREATE_LINK "${_bc}" "${_dir}/${_name}" SYMBOLIC)
    endforeach()
    foreach(_m IN LISTS _missing)
      string(REPLACE "=" ";" _m "${_m}")
      list(GET _m 0 _id)
      list(GET _m 1 _v)
      # The same module the device libraries ship, reduced to its one global.
      set(_ll "${_dir}/oclc_isa_version_${_id}.ll")
      file(WRITE "${_ll}"
        "target triple = \"amdgcn-amd-amdhsa\"\n"
        "@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 ${_v}, align 4\n")
      execute_process(
        COMMAND ${CMAKE_CXX_COMPILER} -c -emit-llvm -x ir --target=amdgcn-amd-amdhsa -nogpulib
                "${_ll}" -o "${_dir}/oclc_isa_version_${_id}.bc"
        RESULT_VARIABLE _rc ERROR_VARIABLE _err)
      if(NOT _rc EQUAL 0)
        message(FATAL_ERROR "mlakit: generating oclc_isa_version_${_id}.bc failed: ${_err}")
      endif()
      file(REMOVE "${_ll}")
      message(STATUS "mlakit: generated oclc_isa_version_${_id}.bc (__oclc_ISA_version = ${_v}) "
                     "next to the device libraries of ${_base}")
    endforeach()
  endif()

  foreach(_a IN LISTS _archs)
    _mlakit_probe_device_libs(${_a} "--rocm-device-lib-path=${_dir}" _ok _msg)
    if(NOT _ok)
      message(FATAL_ERROR "mlakit: ${CMAKE_CXX_COMPILER} rejects ${_a} with the device "
                          "libraries of ${_dir}: ${_msg}")
    endif()
  endforeach()
  message(STATUS "mlakit: HIP device libraries ${_dir}")
  set(${out_var} "--rocm-device-lib-path=${_dir}" PARENT_SCOPE)
endfunction()
