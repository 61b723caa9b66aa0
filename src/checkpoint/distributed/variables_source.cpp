// VariablesSource: plain and mirrored variables in a distributed checkpoint (variables_source.hpp).
#include "checkpoint/distributed/variables_source.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/check.hpp"

namespace flowlet::detail::ckpt {

namespace {

// A host copy of `value` that nothing else shares: the training thread goes on updating the
// variable (in place when it is the only holder) while the background thread writes the copy.
Tensor private_host_copy(const Tensor& value) {
  const Tensor host = value.device().kind() == DeviceKind::cpu ? value.contiguous() : value.to(Device()).contiguous();
  Tensor copy = Tensor::empty(host.shape(), host.dtype());
  const size_t bytes = static_cast<size_t>(host.numel()) * dtype_size(host.dtype());
  if (bytes > 0) std::memcpy(copy.raw_data(), host.raw_data(), bytes);
  return copy;
}

}  // namespace

VariablesSource::VariablesSource(std::vector<Variable> variables, std::string op)
    : variables_(std::move(variables)), op_(std::move(op)) {}

void VariablesSource::append(const std::vector<Variable>& variables) {
  variables_.insert(variables_.end(), variables.begin(), variables.end());
}

std::vector<std::string> VariablesSource::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(variables_.size());
  for (const Variable& v : variables_) names.push_back(v.name());
  return names;
}

std::vector<int> VariablesSource::assign_writers(const std::vector<int64_t>& bytes, int processes) {
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Largest first; equal sizes keep their order (stable), so the result depends on the list alone.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::vector<int64_t> load(static_cast<size_t>(processes), 0);
  std::vector<int> writer(bytes.size(), 0);
  for (const size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());  // the first of equal loads
    writer[i] = static_cast<int>(least - load.begin());
    *least += bytes[i];
  }
  return writer;
}

void VariablesSource::snapshot(const ProcessView& view, std::vector<ShardContent>& shards,
                               std::map<std::string, std::string>& attributes) {
  std::vector<int64_t> bytes;
  bytes.reserve(variables_.size());
  for (const Variable& v : variables_) {
    bytes.push_back(v.shape().numel() * static_cast<int64_t>(dtype_size(v.dtype())));
  }
  const std::vector<int> writer = assign_writers(bytes, view.processes);
  ShardContent shard;
  shard.name = fmt::format("variables-p{}", view.process);
  for (size_t i = 0; i < variables_.size(); ++i) {
    if (writer[i] != view.process) continue;
    Piece piece;
    piece.tensor = variables_[i].name();
    piece.value = private_host_copy(variables_[i].value());
    piece.dtype = piece.value.dtype();
    piece.shape = piece.value.shape();
    piece.row_begin = 0;
    piece.row_end = piece.shape.rank() == 0 ? 1 : piece.shape[0];
    shard.pieces.push_back(std::move(piece));
  }
  shards.push_back(std::move(shard));
  attributes["variables.count"] = std::to_string(variables_.size());
}

void VariablesSource::load(const ProcessView& /*view*/, Reader& reader) {
  const std::string manifest = reader.path() + "/manifest.json";
  // Every refusal first, then the reads: nothing is read for a checkpoint that does not fit.
  for (const Variable& v : variables_) {
    const TensorRecord* record = reader.find(v.name());
    if (record == nullptr) {
      detail::fail<InvalidArgument>("{}: variable '{}' is not in checkpoint '{}'; it holds {} tensors", op_, v.name(),
                                    manifest, reader.tensors().size());
    }
    if (record->dtype != v.dtype()) {
      detail::fail<DTypeError>(
          "{}: dtype of variable '{}' differs from checkpoint '{}'; got {} in the file, expected {}", op_, v.name(),
          manifest, record->dtype, v.dtype());
    }
    if (!(record->shape == v.shape())) {
      detail::fail<ShapeError>(
          "{}: shape of variable '{}' differs from checkpoint '{}'; got {} in the file, expected {}", op_, v.name(),
          manifest, record->shape, v.shape());
    }
  }
  std::vector<Tensor> values;
  values.reserve(variables_.size());
  for (const Variable& v : variables_) {
    Tensor value = reader.read(v.name());
    if (v.device() != Device()) value = value.to(v.device());
    values.push_back(std::move(value));
  }
  pending_ = std::move(values);
}

void VariablesSource::commit() {
  std::vector<Tensor> values = std::move(pending_);
  pending_.clear();
  for (size_t i = 0; i < values.size() && i < variables_.size(); ++i) variables_[i].assign(values[i]);
}

}  // namespace flowlet::detail::ckpt
