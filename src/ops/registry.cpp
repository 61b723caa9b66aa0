// The table of every op, built once from the family lists.
#include "ops/registry.hpp"

#include "core/backend.hpp"

namespace flowlet {

const std::vector<Op*>& all_ops() {
  static const std::vector<Op*> ops = [] {
    std::vector<Op*> list;
    detail::add_creation_ops(list);
    detail::add_elementwise_ops(list);
    detail::add_linalg_ops(list);
    detail::add_nn_ops(list);
    detail::add_reduce_ops(list);
    detail::add_shape_ops(list);
    detail::add_cuda_kernels(list);  // fills kernels[cuda] (nothing in a build without CUDA)
    return list;
  }();
  return ops;
}

Op* find_op(std::string_view name) {
  for (Op* op : all_ops()) {
    if (op->name == name) return op;
  }
  return nullptr;
}

}  // namespace flowlet
