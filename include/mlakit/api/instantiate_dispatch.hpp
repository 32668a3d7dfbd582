#pragma once
// Compiles decode()'s dispatch table (every DispatchEntry and its kernels) in the translation
// unit that includes this header: the whole table, or with MLAKIT_DISPATCH_PARTS = N (1 to 4)
// and MLAKIT_DISPATCH_PART = k (0 to N-1) defined before it, part k of N, so that N files
// compile the table in parallel. The table's four groups (api/dispatch.hpp) go to the parts
// round robin: group g to part g % N; 2 and 4 parts are balanced, 3 parts leave part 0 with
// half the table. Include it in exactly one .cu of a program (one per part), whose other files
// define MLAKIT_EXTERN_DISPATCH (see api/dispatch.hpp); it may itself be compiled with
// MLAKIT_EXTERN_DISPATCH defined. Host-only builds (no CUDA or HIP) get nothing.

// A part must leave the other parts' entries to their files: decode() (api/dispatch.hpp) names
// every entry, which instantiates them all unless they are declared extern.
#if (defined(MLAKIT_DISPATCH_PARTS) || defined(MLAKIT_DISPATCH_PART)) && \
    !defined(MLAKIT_EXTERN_DISPATCH)
#if defined(MLAKIT_DETAIL_DISPATCH_INCLUDED)
#error "mlakit: include instantiate_dispatch.hpp first in a part, or define MLAKIT_EXTERN_DISPATCH"
#endif
#define MLAKIT_EXTERN_DISPATCH 1
#endif
#include "dispatch.hpp"

#if defined(MLAKIT_DISPATCH_PARTS) || defined(MLAKIT_DISPATCH_PART)
#if !defined(MLAKIT_DISPATCH_PARTS) || !defined(MLAKIT_DISPATCH_PART)
#error "mlakit: define both MLAKIT_DISPATCH_PARTS and MLAKIT_DISPATCH_PART, or neither"
#elif MLAKIT_DISPATCH_PARTS < 1 || MLAKIT_DISPATCH_PARTS > 4
#error "mlakit: MLAKIT_DISPATCH_PARTS must be 1, 2, 3 or 4 (the table has four groups)"
#elif MLAKIT_DISPATCH_PART < 0 || MLAKIT_DISPATCH_PART >= MLAKIT_DISPATCH_PARTS
#error "mlakit: MLAKIT_DISPATCH_PART must be 0 to MLAKIT_DISPATCH_PARTS - 1"
#endif
#define MLAKIT_DETAIL_PARTS MLAKIT_DISPATCH_PARTS
#define MLAKIT_DETAIL_PART MLAKIT_DISPATCH_PART
#else
#define MLAKIT_DETAIL_PARTS 1
#define MLAKIT_DETAIL_PART 0
#endif

#if defined(MLAKIT_HAS_GPU_BACKEND)
namespace mlakit::detail {
#define MLAKIT_DETAIL_INSTANTIATE_ENTRY(P) template struct DispatchEntry<P>;
#if 0 % MLAKIT_DETAIL_PARTS == MLAKIT_DETAIL_PART
MLAKIT_DETAIL_DISPATCH_GROUP0(MLAKIT_DETAIL_INSTANTIATE_ENTRY)
#endif
#if 1 % MLAKIT_DETAIL_PARTS == MLAKIT_DETAIL_PART
MLAKIT_DETAIL_DISPATCH_GROUP1(MLAKIT_DETAIL_INSTANTIATE_ENTRY)
#endif
#if 2 % MLAKIT_DETAIL_PARTS == MLAKIT_DETAIL_PART
MLAKIT_DETAIL_DISPATCH_GROUP2(MLAKIT_DETAIL_INSTANTIATE_ENTRY)
#endif
#if 3 % MLAKIT_DETAIL_PARTS == MLAKIT_DETAIL_PART
MLAKIT_DETAIL_DISPATCH_GROUP3(MLAKIT_DETAIL_INSTANTIATE_ENTRY)
#endif
#undef MLAKIT_DETAIL_INSTANTIATE_ENTRY
}  // namespace mlakit::detail
#endif
#undef MLAKIT_DETAIL_PARTS
#undef MLAKIT_DETAIL_PART
