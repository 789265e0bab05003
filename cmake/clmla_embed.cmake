# clmla_embed(OUTPUT file.c SOURCES files... EMBED ON|OFF HEADER x.h TYPE type TABLE name
#             [HEADER_OUTPUT dir/x.h] COMMENT text): a build step that runs cmake/embed_kernels.cmake
# over SOURCES into OUTPUT (and, with HEADER_OUTPUT, the header that declares the table).
function(clmla_embed)
  cmake_parse_arguments(E "" "OUTPUT;EMBED;HEADER;TYPE;TABLE;HEADER_OUTPUT;COMMENT" "SOURCES" ${ARGN})
  set(outputs ${E_OUTPUT})
  set(header_arg "")
  if(E_HEADER_OUTPUT)
    list(APPEND outputs ${E_HEADER_OUTPUT})
    set(header_arg -DHEADER_OUTPUT=${E_HEADER_OUTPUT})
  endif()
  set(script ${PROJECT_SOURCE_DIR}/cmake/embed_kernels.cmake)
  add_custom_command(
    OUTPUT ${outputs}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${E_OUTPUT} "-DSOURCES=${E_SOURCES}" -DEMBED=${E_EMBED}
            -DHEADER=${E_HEADER} -DTYPE=${E_TYPE} -DTABLE=${E_TABLE} ${header_arg} -P ${script}
    DEPENDS ${E_SOURCES} ${script}
    COMMENT "${E_COMMENT}"
    VERBATIM)
endfunction()
