#pragma once
// mlakit: MLA decode attention for multi-token queries (speculative-decoding verify), one
// header-only source for CUDA and HIP. See README.md and docs/.
#include "api/decode.hpp"
#include "api/dispatch.hpp"
#include "api/merge_states.hpp"
#include "core/attention_math.hpp"
#include "core/decode_args.hpp"
#include "core/dtype.hpp"
#include "core/merge_args.hpp"
#include "core/numeric.hpp"
#include "core/plan.hpp"
#include "core/status.hpp"
#include "core/validate.hpp"
#include "core/validate_merge.hpp"
#include "platform/runtime.hpp"
