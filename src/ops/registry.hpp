// Each op family lists its ops here; the registry gathers them (explicit, no static constructors).
#pragma once

#include <vector>

#include "flowlet/op.hpp"

namespace flowlet::detail {

void add_creation_ops(std::vector<Op*>& ops);
void add_elementwise_ops(std::vector<Op*>& ops);
void add_linalg_ops(std::vector<Op*>& ops);
void add_nn_ops(std::vector<Op*>& ops);
void add_reduce_ops(std::vector<Op*>& ops);
void add_shape_ops(std::vector<Op*>& ops);

}  // namespace flowlet::detail
