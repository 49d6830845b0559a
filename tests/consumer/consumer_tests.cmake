# Tests of the library as a downstream user sees it: exports and SONAME of the built .so, and
# consumers built against an installed copy (C99 program, find_package, pkg-config).
#
# In a sanitized build (FVATTN_SANITIZE) the library needs the sanitizer runtimes, so the consumers
# are built with the same -fsanitize flags (the runtime must come first in the process), the export
# check accepts exactly those runtimes as extra dependencies, and Python gets the ASan runtime
# preloaded.
set(FVA_CONSUMER_SANITIZE "")
if(FVATTN_SANITIZE)
  set(FVA_CONSUMER_SANITIZE "-fsanitize=${FVATTN_SANITIZE}")
endif()
add_test(NAME library_exports
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/check_exports.sh $<TARGET_FILE:fvattn>
                 ${PROJECT_SOURCE_DIR}/include/fvattn/fvattn.h "${FVATTN_SANITIZE}")
add_test(NAME installed_consumers
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run_consumers.sh ${PROJECT_BINARY_DIR}
                 ${CMAKE_CURRENT_SOURCE_DIR}/consumer ${CMAKE_C_COMPILER} "${FVA_CONSUMER_SANITIZE}")
set_tests_properties(installed_consumers PROPERTIES FIXTURES_SETUP c99_consumer RESOURCE_LOCK fvattn_install)

# The installed command-line tool runs from its prefix (its install RPATH finds the installed library).
# RESOURCE_LOCK: every `cmake --install` of this build writes the build's install_manifest.txt.
if(FVATTN_BUILD_TOOLS)
  add_test(NAME installed_tool
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/installed_tool.sh ${PROJECT_BINARY_DIR}
                   ${PROJECT_BINARY_DIR}/installed-tool-prefix ${PROJECT_VERSION})
  set_tests_properties(installed_tool PROPERTIES RESOURCE_LOCK fvattn_install)
endif()

# valgrind memcheck over the installed C99 consumer that installed_consumers built: no invalid
# access, no use of uninitialized memory, no leak, through the public API from plain C. Not in a
# sanitized build (valgrind and ASan exclude each other). Exit 77 (skipped) without valgrind, unless
# FVATTN_REQUIRE_VALGRIND=1 (CI), where a missing valgrind fails.
if(NOT FVATTN_SANITIZE)
  add_test(NAME c99_consumer_valgrind
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/valgrind_consumer.sh ${PROJECT_BINARY_DIR}/c99_consumer)
  set_tests_properties(c99_consumer_valgrind PROPERTIES FIXTURES_REQUIRED c99_consumer SKIP_RETURN_CODE 77)
endif()

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME header_cffi_parse
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/consumer/cffi_parse.py
                   ${PROJECT_SOURCE_DIR}/include/fvattn/fvattn.h $<TARGET_FILE:fvattn> ${CMAKE_C_COMPILER})
  set_tests_properties(header_cffi_parse PROPERTIES SKIP_RETURN_CODE 77)
  if(FVATTN_SANITIZE MATCHES "address")
    # The interpreter is not instrumented: preload the runtime the library was linked with. Python
    # keeps its own objects alive at exit, so leak checking would only report the interpreter.
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so
                    OUTPUT_VARIABLE FVA_LIBASAN OUTPUT_STRIP_TRAILING_WHITESPACE)
    set_tests_properties(header_cffi_parse PROPERTIES
                         ENVIRONMENT "LD_PRELOAD=${FVA_LIBASAN};ASAN_OPTIONS=detect_leaks=0")
  endif()
endif()
