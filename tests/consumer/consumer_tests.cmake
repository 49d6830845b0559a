# Tests of the library as a downstream user sees it: exports and SONAME of the built .so, and
# consumers built against an installed copy (C99 program, find_package, pkg-config).
add_test(NAME library_exports
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/check_exports.sh $<TARGET_FILE:fvattn>
                 ${PROJECT_SOURCE_DIR}/include/fvattn/fvattn.h)
add_test(NAME installed_consumers
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run_consumers.sh ${PROJECT_BINARY_DIR}
                 ${CMAKE_CURRENT_SOURCE_DIR}/consumer ${CMAKE_C_COMPILER})
