# Tests of the library as a downstream user sees it: exports and SONAME of the built .so, and
# consumers built against an installed copy (C99 program, find_package, pkg-config).
add_test(NAME library_exports
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/check_exports.sh $<TARGET_FILE:fvattn>
                 ${PROJECT_SOURCE_DIR}/include/fvattn/fvattn.h)
add_test(NAME installed_consumers
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run_consumers.sh ${PROJECT_BINARY_DIR}
                 ${CMAKE_CURRENT_SOURCE_DIR}/consumer ${CMAKE_C_COMPILER})

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME header_cffi_parse
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/consumer/cffi_parse.py
                   ${PROJECT_SOURCE_DIR}/include/fvattn/fvattn.h $<TARGET_FILE:fvattn> ${CMAKE_C_COMPILER})
  set_tests_properties(header_cffi_parse PROPERTIES SKIP_RETURN_CODE 77)
endif()
