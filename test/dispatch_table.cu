// decode()'s dispatch table, compiled once for the GPU test binary: the gpu_*.cu files are
// built with MLAKIT_EXTERN_DISPATCH and only declare its entries (test/CMakeLists.txt).
#include <mlakit/api/instantiate_dispatch.hpp>
