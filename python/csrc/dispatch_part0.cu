// Part 0 of 4 of decode()'s dispatch table for the extension (csrc/kernels.cu declares it).
#define MLAKIT_DISPATCH_PARTS 4
#define MLAKIT_DISPATCH_PART 0
#include <mlakit/api/instantiate_dispatch.hpp>
