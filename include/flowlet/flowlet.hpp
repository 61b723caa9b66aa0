// The umbrella header: every public name of flowlet. Light on purpose: no xtensor, no kernels.
#pragma once

#include "flowlet/core/device.hpp"
#include "flowlet/core/dtype.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"
#include "flowlet/core/half.hpp"
#include "flowlet/core/shape.hpp"
#include "flowlet/core/tensor.hpp"
#include "flowlet/dispatch.hpp"
#include "flowlet/op.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/linalg.hpp"
#include "flowlet/ops/nn.hpp"
#include "flowlet/ops/reduce.hpp"
#include "flowlet/ops/shape.hpp"
