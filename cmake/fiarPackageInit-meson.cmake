# SPDX-License-Identifier: Apache-2.0
# What CMake's configure_package_config_file puts at @PACKAGE_INIT@, for the package `meson install` installs.
macro(check_required_components _fiar_name)
  foreach(_fiar_component ${${_fiar_name}_FIND_COMPONENTS})
    if(NOT ${_fiar_name}_${_fiar_component}_FOUND AND ${_fiar_name}_FIND_REQUIRED_${_fiar_component})
      set(${_fiar_name}_FOUND FALSE)
    endif()
  endforeach()
endmacro()
