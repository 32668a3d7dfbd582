// The emulated AMD device's implementation (one per program, not instrumented).
#include <mlakit/platform/emulated/emulator_impl.hpp>
