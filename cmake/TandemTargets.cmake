# Helpers shared by every folder's CMakeLists.

# tandem_library(NAME SOURCES... [DEPS ...]): one static library per folder,
# with the project's warning flags and include root.
function(tandem_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  tandem_warnings(${name})
endfunction()

function(tandem_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor>)
  if(TANDEM_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# Collects every library reachable from target through its link interface.
function(_tandem_link_closure target out)
  set(seen "")
  set(todo ${target})
  while(todo)
    list(POP_FRONT todo t)
    if(t IN_LIST seen OR NOT TARGET ${t})
      continue()
    endif()
    list(APPEND seen ${t})
    get_target_property(type ${t} TYPE)
    set(libs "")
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(direct ${t} LINK_LIBRARIES)
      if(direct)
        list(APPEND libs ${direct})
      endif()
    endif()
    get_target_property(iface ${t} INTERFACE_LINK_LIBRARIES)
    if(iface)
      list(APPEND libs ${iface})
    endif()
    foreach(l IN LISTS libs)
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" l "${l}")
      list(APPEND todo ${l})
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

# tandem_forbid_link(FORBIDDEN TARGETS...): stop the configure step when one of
# TARGETS reaches FORBIDDEN through its link graph.
function(tandem_forbid_link forbidden)
  foreach(t IN LISTS ARGN)
    _tandem_link_closure(${t} closure)
    if(forbidden IN_LIST closure)
      message(FATAL_ERROR "${t} links ${forbidden} (via: ${closure}); "
        "the design keeps it out of ${t} — move that code to mpi_transport/ or launcher/")
    endif()
  endforeach()
endfunction()
