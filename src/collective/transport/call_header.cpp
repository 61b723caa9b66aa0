#include "collective/transport/call_header.hpp"

#include <fmt/format.h>

#include <cstring>

#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"

namespace flowlet::detail {

namespace {

std::string shape_text(const CallHeader& h) {
  std::string text = "[";
  for (int i = 0; i < std::min<int>(h.rank, CallHeader::kInlineDims); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(h.dims[i]);
  }
  if (h.rank > CallHeader::kInlineDims) text += fmt::format(", ... ({} dimensions)", h.rank);
  return text + "]";
}

bool same_shape(const CallHeader& a, const CallHeader& b) {
  return a.rank == b.rank && a.tail_hash == b.tail_hash && std::memcmp(a.dims, b.dims, sizeof(a.dims)) == 0;
}

template <class E>
std::exception_ptr mismatch(const CallHeader& a, const char* what, const std::string& who_a, const std::string& value_a,
                            const std::string& who_b, const std::string& value_b) {
  return std::make_exception_ptr(
      E(fmt::format("{}: participants disagree on the {}; got {} with {} and {} with {}",
                    collective_name(static_cast<CollectiveKind>(a.kind)), what, who_a, value_a, who_b, value_b)));
}

}  // namespace

CallHeader make_header(const CollectiveCall& call) {
  CallHeader h;
  h.kind = static_cast<uint8_t>(call.kind);
  if (call.kind == CollectiveKind::barrier) return h;
  if (call.kind == CollectiveKind::all_reduce || call.kind == CollectiveKind::reduce_scatter) {
    h.op = static_cast<uint8_t>(call.op);
  }
  if (call.kind == CollectiveKind::broadcast) h.root = call.root;
  h.dtype = static_cast<uint8_t>(call.input.dtype());
  const Shape& shape = call.input.shape();
  h.rank = static_cast<uint8_t>(std::min<size_t>(shape.size(), 255));
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the dimensions that do not fit inline
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < CallHeader::kInlineDims) {
      h.dims[i] = shape[i];
    } else {
      hash = (hash ^ static_cast<uint64_t>(shape[i])) * 1099511628211ull;
    }
  }
  if (shape.size() > CallHeader::kInlineDims) h.tail_hash = hash;
  return h;
}

std::exception_ptr compare_process_headers(const std::vector<CallHeader>& headers, const char* name,
                                           const std::string& describe, const std::function<std::string(int)>& who) {
  for (size_t p = 0; p < headers.size(); ++p) {
    if (headers[p].kind == kFailedHere) {
      return std::make_exception_ptr(InvalidArgument(
          fmt::format("{}: the call failed in {} of {} (its participants disagreed or did not all arrive; see its "
                      "error)",
                      name, who(static_cast<int>(p)), describe)));
    }
  }
  for (size_t p = 1; p < headers.size(); ++p) {
    if (auto error = header_mismatch(headers[0], who(0), headers[p], who(static_cast<int>(p)))) return error;
  }
  return nullptr;
}

std::exception_ptr header_mismatch(const CallHeader& a, const std::string& who_a, const CallHeader& b,
                                   const std::string& who_b) {
  if (a.kind != b.kind) {
    return mismatch<InvalidArgument>(a, "collective", who_a, collective_name(static_cast<CollectiveKind>(a.kind)),
                                     who_b, collective_name(static_cast<CollectiveKind>(b.kind)));
  }
  if (a.op != b.op) {
    return mismatch<InvalidArgument>(a, "reduction", who_a, to_string(static_cast<ReduceOp>(a.op)), who_b,
                                     to_string(static_cast<ReduceOp>(b.op)));
  }
  if (a.root != b.root) {
    return mismatch<InvalidArgument>(a, "root", who_a, fmt::format("root {}", a.root), who_b,
                                     fmt::format("root {}", b.root));
  }
  if (a.dtype != b.dtype) {
    return mismatch<DTypeError>(a, "dtype", who_a, std::string(dtype_name(static_cast<DType>(a.dtype))), who_b,
                                std::string(dtype_name(static_cast<DType>(b.dtype))));
  }
  if (!same_shape(a, b)) return mismatch<ShapeError>(a, "shape", who_a, shape_text(a), who_b, shape_text(b));
  return nullptr;
}

}  // namespace flowlet::detail
