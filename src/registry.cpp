// The table of every op (all_ops, find_op): each layer's list of ops, then each device backend.
#include "ops/registry.hpp"

#include "core/backend.hpp"

namespace flowlet {
namespace {

// Registers backend `kind`'s kernels, and gives every kAnyDevice op its CPU kernel on `kind` too.
// A backend this build does not have registers nothing, so no op claims to run there.
void register_backend(const std::vector<Op*>& ops, DeviceKind kind) {
  const detail::DeviceBackend& backend = detail::backend(kind);
  if (!backend.built) return;
  backend.add_kernels(ops);
  const auto cpu = static_cast<size_t>(DeviceKind::cpu);
  const auto slot = static_cast<size_t>(kind);
  for (Op* op : ops) {
    if (!op->has_flag(kAnyDevice)) continue;
    op->kernels[slot] = op->kernels[cpu];
    op->async_kernels[slot] = op->async_kernels[cpu];
  }
}

}  // namespace

const std::vector<Op*>& all_ops() {
  static const std::vector<Op*> ops = [] {
    std::vector<Op*> list;
    detail::add_creation_ops(list);
    detail::add_elementwise_ops(list);
    detail::add_linalg_ops(list);
    detail::add_nn_ops(list);
    detail::add_reduce_ops(list);
    detail::add_shape_ops(list);
    detail::add_host_ops(list);
    detail::add_conv_ops(list);
    detail::add_pool_ops(list);
    detail::add_normalization_ops(list);
    detail::add_dropout_ops(list);
    detail::add_state_ops(list);
    detail::add_transfer_ops(list);
    detail::add_fused_ops(list);
    detail::add_matmul_bias_ops(list);
    detail::add_relu_bias_grad_ops(list);
    detail::add_cross_entropy_grad_ops(list);
    detail::add_queue_ops(list);
    detail::add_collective_ops(list);
    detail::add_ps_ops(list);
    // The CPU kernels are part of each Op value; every other backend registers here, one line each.
    register_backend(list, DeviceKind::cuda);
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
