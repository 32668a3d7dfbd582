#pragma once
// Selects the warp matrix atom of the compiled target. The mainloop only sees MmaAtom<T>.
#include "../platform/platform.hpp"

#if defined(MLAKIT_PLATFORM_CUDA)
#include "mma_atom_sm80.hpp"
#elif defined(MLAKIT_PLATFORM_HIP)
#include "mma_atom_mfma.hpp"
#endif

namespace mlakit::arch {
#if defined(MLAKIT_PLATFORM_CUDA)
template <class T>
using MmaAtom = MmaAtomSm80<T>;
#elif defined(MLAKIT_PLATFORM_HIP)
template <class T>
using MmaAtom = MmaAtomMfma16<T>;
#endif
}  // namespace mlakit::arch
