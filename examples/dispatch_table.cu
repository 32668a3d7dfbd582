// decode()'s dispatch table, compiled once for all the examples: they are built with
// MLAKIT_EXTERN_DISPATCH, so their own files only declare the table's entries and each
// compiles in seconds instead of compiling every kernel again (examples/CMakeLists.txt).
// A program of several files does the same: this include in one .cu, the macro in the others.
#include <mlakit/api/instantiate_dispatch.hpp>
