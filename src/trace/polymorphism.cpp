// Comparing two traces of one function recorded at different sizes (see polymorphism.hpp).
#include "trace/polymorphism.hpp"

#include <cstring>

#include <fmt/format.h>

#include "flowlet/trace.hpp"

namespace flowlet::detail {

std::optional<std::string> first_structural_difference(const Graph& a, const Graph& b) {
  if (a.nodes().size() != b.nodes().size()) {
    return fmt::format("{} nodes instead of {}", b.nodes().size(), a.nodes().size());
  }
  for (size_t i = 0; i < a.nodes().size(); ++i) {
    const Node& x = a.nodes()[i];
    const Node& y = b.nodes()[i];
    auto differ = [&](std::string_view what) { return fmt::format("{} differs in its {}", x.label(), what); };
    if (x.kind != y.kind || x.op != y.op || x.argument != y.argument) return differ("op");
    if (x.inputs != y.inputs || x.control_inputs != y.control_inputs) return differ("inputs");
    if (static_cast<bool>(x.attributes) != static_cast<bool>(y.attributes)) return differ("attributes");
    if (x.attributes) {
      if (!x.op->describe_attributes) return differ("attributes (they cannot be compared)");
      const std::string da = x.op->describe_attributes(x.attributes.get());
      const std::string db = y.op->describe_attributes(y.attributes.get());
      if (da != db) return fmt::format("{} has attributes {} at one size and {} at the other", x.label(), da, db);
    }
    if (x.kind == NodeKind::constant && x.value.impl_ptr() != y.value.impl_ptr()) {
      // A constant on a GPU is compared through a host copy (never read on the host where it is).
      auto on_host = [](const Tensor& t) {
        EagerScope eager;
        return t.device().kind() == DeviceKind::cpu ? t : t.to(Device(DeviceKind::cpu, 0));
      };
      const bool small = x.value.dtype() == y.value.dtype() && x.value.shape() == y.value.shape() &&
                         x.value.numel() <= 64;
      const Tensor hx = small ? on_host(x.value) : Tensor(), hy = small ? on_host(y.value) : Tensor();
      const bool same = small && hx.is_contiguous() && hy.is_contiguous() &&
                        std::memcmp(hx.raw_data(), hy.raw_data(),
                                    static_cast<size_t>(hx.numel()) * dtype_size(hx.dtype())) == 0;
      if (!same) return fmt::format("constant '{}' differs (a value computed from a size?)", x.name);
    }
  }
  if (a.outputs() != b.outputs() || a.effects() != b.effects()) return std::string("the outputs differ");
  return std::nullopt;
}

}  // namespace flowlet::detail
