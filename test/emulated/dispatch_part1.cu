// Part 1 of 2 of decode()'s dispatch table for the emulated AMD tests: the table compiled in
// two translation units, as a program that builds it in parallel would (api/dispatch.hpp); the
// test files declare its entries (MLAKIT_EXTERN_DISPATCH), so a part left out fails the link.
#define MLAKIT_DISPATCH_PARTS 2
#define MLAKIT_DISPATCH_PART 1
#include <mlakit/api/instantiate_dispatch.hpp>
