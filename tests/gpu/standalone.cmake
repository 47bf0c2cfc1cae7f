# CMAKE_PROJECT_INCLUDE hook used by run.sh while tests/CMakeLists.txt does
# not yet add this folder itself: runs right after project(), and target
# names used here are resolved when the build is generated.
add_subdirectory(${CMAKE_SOURCE_DIR}/tests/gpu ${CMAKE_BINARY_DIR}/tests/gpu_standalone)
