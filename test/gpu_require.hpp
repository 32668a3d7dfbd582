#pragma once
// Skips a [gpu] test case, with a printed reason, on a machine without a GPU.
#include <catch2/catch.hpp>

#include "gpu_harness.hpp"

#define MLAKIT_REQUIRE_GPU()                      \
  do {                                            \
    if (!mlakit::testing::gpu_present()) {        \
      WARN("no GPU present: [gpu] test skipped"); \
      return;                                     \
    }                                             \
  } while (0)
