# SPDX-License-Identifier: Apache-2.0
# fiar_target_add_toolkit(<target> <with_nccl>): what fiar::fiar needs from the CUDA toolkit found where it is used,
# added to <target> (fiar's own INTERFACE target in a source tree, the imported fiar::fiar of an installed package):
# - CCCL's include directory (CMake 4 lists include/cccl in CUDAToolkit_INCLUDE_DIRS; 3.25 does not);
# - -std=c++20 for nvcc (CMake 3.25 drops CMAKE_CUDA_STANDARD 20 for nvcc 13 and rejects cuda_std_20);
# - NCCL when <with_nccl> and it is found next to the toolkit or on the system: FIAR_HAS_NCCL=1 and the library.
function(fiar_target_add_toolkit target with_nccl)
  set(cccl "")
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    if(EXISTS "${dir}/cccl/cuda/std/version")
      list(APPEND cccl "${dir}/cccl")
    endif()
  endforeach()
  set_property(TARGET ${target} APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${CUDAToolkit_INCLUDE_DIRS} ${cccl})
  set_property(TARGET ${target} APPEND PROPERTY INTERFACE_SYSTEM_INCLUDE_DIRECTORIES ${cccl})
  set_property(TARGET ${target} APPEND PROPERTY INTERFACE_COMPILE_OPTIONS $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  if(with_nccl)
    find_library(FIAR_NCCL_LIBRARY nccl HINTS "${CUDAToolkit_LIBRARY_DIR}")
    find_path(FIAR_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(FIAR_NCCL_LIBRARY AND FIAR_NCCL_INCLUDE_DIR)
      set_property(TARGET ${target} APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS FIAR_HAS_NCCL=1)
      set_property(TARGET ${target} APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${FIAR_NCCL_INCLUDE_DIR}")
      set_property(TARGET ${target} APPEND PROPERTY INTERFACE_LINK_LIBRARIES "${FIAR_NCCL_LIBRARY}")
    endif()
  endif()
endfunction()
