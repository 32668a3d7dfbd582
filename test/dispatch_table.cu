// decode()'s dispatch table, compiled once for the GPU test binary (and mlakit_bench) when the
// examples' table is not built: the gpu_*.cu files and bench/mlakit_bench.cu are built with
// MLAKIT_EXTERN_DISPATCH and only declare its entries (test/CMakeLists.txt, bench/).
#include <mlakit/api/instantiate_dispatch.hpp>
