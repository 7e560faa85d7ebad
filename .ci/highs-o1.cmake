# CMake toolchain file for CI only (.ci/run passes it through the cmake crate's
# CMAKE_TOOLCHAIN_FILE): HiGHS's Release build at -O1 instead of -O3. Compiling HiGHS is the
# largest single part of a cold CI run on two cores; the tests solve small models, and
# optimization does not change what HiGHS computes. Release builds elsewhere are unaffected.
set(CMAKE_C_FLAGS_RELEASE "-O1 -DNDEBUG" CACHE STRING "" FORCE)
set(CMAKE_CXX_FLAGS_RELEASE "-O1 -DNDEBUG" CACHE STRING "" FORCE)
