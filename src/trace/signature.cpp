// Signature matching, hashing and differences for the trace cache (see signature.hpp).
#include "trace/signature.hpp"

#include <functional>

#include "core/check.hpp"
#include "core/device_scope_state.hpp"

namespace flowlet::detail {
namespace {

std::string argument_text(const ArgSignature& s) {
  if (!s.is_tensor) return s.value;
  if (!s.value.empty() || s.tensor_count != 1) return fmt::format("a list of {} tensors", s.tensor_count);
  return fmt::format("{} {} on {}", dtype_name(s.dtype), signature_shape_text(s.shape), s.device.str());
}

// A single tensor argument compares dtype, shape and device; lists and other values compare text.
bool is_single_tensor(const ArgSignature& s) { return s.is_tensor && s.value.empty(); }

void mix(size_t& seed, size_t value) { seed ^= value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2); }

}  // namespace

std::string signature_shape_text(const Shape& shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) text += ", ";
    text += shape[d] < 0 ? std::string("?") : std::to_string(shape[d]);
  }
  return text + "]";
}

void describe_device_scope(Signature& signature) {
  ArgSignature scope;
  scope.is_scope = true;
  if (const ScopeFrame* frame = innermost_scope) {
    scope.value = frame->requested ? frame->requested->str() : "none";
    if (frame->colocate_with != nullptr) scope.value += fmt::format(" (colocated with {})", frame->colocate_with);
  } else {
    scope.value = "none";
  }
  signature.push_back(std::move(scope));
}

bool matches(const Signature& cached, const Signature& call) {
  if (cached.size() != call.size()) return false;
  for (size_t i = 0; i < cached.size(); ++i) {
    const ArgSignature& x = cached[i];
    const ArgSignature& y = call[i];
    if (x.is_tensor != y.is_tensor || x.tensor_count != y.tensor_count || x.value != y.value) return false;
    if (!is_single_tensor(x)) continue;
    if (x.dtype != y.dtype || x.device != y.device || x.shape.size() != y.shape.size()) return false;
    for (size_t d = 0; d < x.shape.size(); ++d) {
      if (x.shape[d] < 0 ? y.shape[d] < 2 : x.shape[d] != y.shape[d]) return false;
    }
  }
  return true;
}

size_t signature_hash(const Signature& signature) {
  size_t seed = signature.size();
  for (const ArgSignature& s : signature) {
    mix(seed, std::hash<std::string>{}(s.value));
    mix(seed, static_cast<size_t>(s.tensor_count) * 2 + (s.is_tensor ? 1 : 0));
    if (!is_single_tensor(s)) continue;
    mix(seed, static_cast<size_t>(s.dtype));
    mix(seed, static_cast<size_t>(s.device.kind()) * 4099 + static_cast<size_t>(s.device.index()));
    for (size_t d = 0; d < s.shape.size(); ++d) mix(seed, static_cast<size_t>(s.shape[d]));
  }
  return seed;
}

std::vector<std::pair<size_t, size_t>> unknown_dimensions(const TraceOptions& options, const Signature& signature) {
  std::vector<std::pair<size_t, size_t>> dims;
  for (const UnknownDim& u : options.unknown_dims) {
    const auto arg = static_cast<size_t>(u.argument);
    if (u.argument < 0 || arg >= signature.size() || !is_single_tensor(signature[arg]) ||
        signature[arg].tensor_count != 1) {
      const size_t arguments = signature.size() - (!signature.empty() && signature.back().is_scope ? 1 : 0);
      fail<InvalidArgument>("{}: unknown_dims names argument {}, which is not a Tensor argument; got {} arguments",
                            options.name, u.argument, arguments);
    }
    const Shape& shape = signature[arg].shape;
    const auto rank = static_cast<int64_t>(shape.size());
    const int64_t d = u.dimension < 0 ? u.dimension + rank : u.dimension;
    if (d < 0 || d >= rank) {
      fail<InvalidArgument>("{}: unknown_dims names dimension {} of argument {}, which has shape {}", options.name,
                            u.dimension, u.argument, signature_shape_text(shape));
    }
    dims.emplace_back(arg, static_cast<size_t>(d));
  }
  return dims;
}

bool generalize(Signature& signature, const std::vector<std::pair<size_t, size_t>>& dims) {
  if (dims.empty()) return false;
  for (const auto& [arg, dim] : dims) {
    if (signature[arg].shape[dim] < 2) return false;
  }
  for (const auto& [arg, dim] : dims) signature[arg].shape[dim] = -1;
  return true;
}

std::vector<std::string> signature_differences(const Signature& before, const Signature& now) {
  std::vector<std::string> found;
  if (before.size() != now.size()) {
    found.push_back(fmt::format("{} arguments -> {}", before.size(), now.size()));
    return found;
  }
  for (size_t i = 0; i < now.size(); ++i) {
    const ArgSignature& a = before[i];
    const ArgSignature& b = now[i];
    if (a.is_scope || b.is_scope) {
      if (a.value != b.value) found.push_back(fmt::format("device scope {} -> {}", a.value, b.value));
    } else if (a.is_tensor != b.is_tensor || a.tensor_count != b.tensor_count) {
      found.push_back(fmt::format("argument {}: {} -> {}", i, argument_text(a), argument_text(b)));
    } else if (!is_single_tensor(a)) {
      if (a.value != b.value) found.push_back(fmt::format("argument {}: value {} -> {}", i, a.value, b.value));
    } else {
      if (a.dtype != b.dtype) {
        found.push_back(fmt::format("argument {}: dtype {} -> {}", i, dtype_name(a.dtype), dtype_name(b.dtype)));
      }
      if (!(a.shape == b.shape)) {
        found.push_back(fmt::format("argument {}: shape {} -> {}", i, signature_shape_text(a.shape),
                                    signature_shape_text(b.shape)));
      }
      if (a.device != b.device) {
        found.push_back(fmt::format("argument {}: device {} -> {}", i, a.device.str(), b.device.str()));
      }
    }
  }
  return found;
}

}  // namespace flowlet::detail
