// The one translation unit of the program that compiles decode()'s dispatch table.
#include <mlakit/api/instantiate_dispatch.hpp>
