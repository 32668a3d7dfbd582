// Part 1 of 2 of decode()'s dispatch table (decode_table_0.cu says how the parts fit).
#define MLAKIT_DISPATCH_PARTS 2
#define MLAKIT_DISPATCH_PART 1
#include <mlakit/api/instantiate_dispatch.hpp>
