// decode()'s dispatch table in two parts, compiled in parallel: this file is part 0 of 2,
// decode_table_1.cu part 1; every other file of the program declares the table's entries
// (MLAKIT_EXTERN_DISPATCH), so a part left out would fail the link.
#define MLAKIT_DISPATCH_PARTS 2
#define MLAKIT_DISPATCH_PART 0
#include <mlakit/api/instantiate_dispatch.hpp>
