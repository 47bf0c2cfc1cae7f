# osprey_module(NAME dir DEPS ...): a static library from every .cpp under
# src/<dir>/ (recursively). Modules list their own dependencies only.
function(osprey_module name dir)
  cmake_parse_arguments(M "" "" "DEPS" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/src/${dir}/*.cpp)
  if(NOT srcs)
    set(srcs ${PROJECT_SOURCE_DIR}/cmake/empty.cpp)
  endif()
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src
                                            ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${name} PUBLIC ${M_DEPS})
endfunction()

# osprey_unit_test(NAME dir DEPS ...): one GoogleTest binary from every .cpp
# under tests/unit/<dir>/, registered with CTest.
function(osprey_unit_test name dir)
  cmake_parse_arguments(T "" "" "DEPS" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/tests/unit/${dir}/*.cpp)
  if(NOT srcs)
    return()
  endif()
  add_executable(${name} ${srcs})
  target_link_libraries(${name} PRIVATE ${T_DEPS} GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    OSPREY_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS unit)
endfunction()
