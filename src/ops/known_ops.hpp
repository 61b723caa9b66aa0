// The Op values that passes recognise by identity (their address), never by name: a pass that
// rewrites a pattern of particular ops declares what it needs here.
#pragma once

#include "flowlet/op.hpp"

namespace flowlet::detail {

extern Op matmul_op;  // src/ops/linalg.cpp (fuse_variable_updates absorbs it into assign_matmul)

}  // namespace flowlet::detail
