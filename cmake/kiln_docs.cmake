# The API reference: Doxygen over the public headers (docs/api/Doxyfile.in), as the target `docs`
# (build/docs/api/html/index.html). Doxygen is the Debian package doxygen, which scripts/setup.sh installs with the
# test dependencies. The same configuration without output (Doxyfile.check) is what the test docs.undocumented runs
# (tests/CMakeLists.txt).
find_program(KILN_DOXYGEN doxygen)
set(KILN_DOCS_OUT ${PROJECT_BINARY_DIR}/docs/api)
set(KILN_DOCS_EXCLUDE "")
foreach(_dir IN LISTS KILN_PRIVATE_HEADER_DIRS)
  string(APPEND KILN_DOCS_EXCLUDE " \"${PROJECT_SOURCE_DIR}/${_dir}\"")
endforeach()
set(KILN_DOCS_HTML YES)
set(KILN_DOCS_WARNINGS ${KILN_DOCS_OUT}/warnings.txt)
configure_file(${PROJECT_SOURCE_DIR}/docs/api/Doxyfile.in ${KILN_DOCS_OUT}/Doxyfile @ONLY)
set(KILN_DOCS_HTML NO)
set(KILN_DOCS_WARNINGS ${KILN_DOCS_OUT}/check/warnings.txt)
configure_file(${PROJECT_SOURCE_DIR}/docs/api/Doxyfile.in ${KILN_DOCS_OUT}/Doxyfile.check @ONLY)
file(MAKE_DIRECTORY ${KILN_DOCS_OUT}/check)
if(KILN_DOXYGEN)
  add_custom_target(docs COMMAND ${KILN_DOXYGEN} ${KILN_DOCS_OUT}/Doxyfile
                    COMMAND ${CMAKE_COMMAND} -E echo "the API reference: ${KILN_DOCS_OUT}/html/index.html"
                    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} VERBATIM
                    COMMENT "Doxygen: the API reference of kiln's public headers")
else()
  add_custom_target(docs COMMAND ${CMAKE_COMMAND} -E echo
                    "doxygen not found: install it (scripts/setup.sh does, or apt-get install doxygen), then reconfigure"
                    COMMAND ${CMAKE_COMMAND} -E false VERBATIM)
endif()
