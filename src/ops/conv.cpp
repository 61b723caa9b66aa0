// Placeholder (conv2d, conv2d_backward_input, conv2d_backward_weight): filled by its part of issue 15.
#include "ops/registry.hpp"

namespace flowlet::detail {

void add_conv_ops(std::vector<Op*>& ops) { (void)ops; }

}  // namespace flowlet::detail
