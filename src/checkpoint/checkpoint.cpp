// save_checkpoint / restore_checkpoint: one safetensors file per checkpoint (written and read by
// checkpoint/safetensors_file.*), restores that check everything before assigning.
#include "flowlet/checkpoint.hpp"

#include <fmt/ranges.h>

#include <map>
#include <optional>

#include "checkpoint/header_json.hpp"
#include "checkpoint/safetensors_file.hpp"
#include "core/check.hpp"
#include "core/user_text.hpp"

namespace flowlet {

namespace {

constexpr std::string_view kSave = "save_checkpoint";
constexpr std::string_view kRestore = "restore_checkpoint";
constexpr std::string_view kMetadataKey = "__metadata__";

void check_names(std::string_view op, const std::vector<Variable>& vars) {
  std::map<std::string_view, size_t> seen;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!vars[i].defined()) {
      detail::fail<InvalidArgument>("{}: variable {} is an empty Variable handle; got Variable()", op, i);
    }
    const std::string& name = vars[i].name();
    if (name.empty()) {
      detail::fail<InvalidArgument>(
          "{}: variable {} has an empty name; got a {} {} variable; give every variable a unique name", op, i,
          vars[i].dtype(), vars[i].shape());
    }
    if (name == kMetadataKey) {
      detail::fail<InvalidArgument>("{}: variable {} is named '__metadata__', which safetensors reserves; rename it",
                                    op, i);
    }
    if (!checkpoint::is_valid_utf8(name)) {
      detail::fail<InvalidArgument>("{}: variable {} has a name that is not valid UTF-8; got {} bytes", op, i,
                                    name.size());
    }
    const auto [it, inserted] = seen.emplace(name, i);
    if (!inserted) {
      detail::fail<InvalidArgument>("{}: duplicate variable name '{}'; got it at positions {} and {}", op, name,
                                    it->second, i);
    }
  }
}

}  // namespace

void save_checkpoint(std::string path, std::vector<Variable> vars, int64_t step) {
  detail::check_path(kSave, "path", path);
  check_names(kSave, vars);
  // Snapshot every value first (a consistent set even if another thread updates a variable later).
  std::vector<checkpoint::NamedTensor> values;
  values.reserve(vars.size());
  for (const Variable& var : vars) {
    const Tensor value = var.value();
    Tensor host = value.device().kind() == DeviceKind::cpu ? value.contiguous() : value.to(Device()).contiguous();
    values.push_back({var.name(), std::move(host)});
  }
  checkpoint::write_safetensors_file(path, values, step, {}, kSave);
}

int64_t restore_checkpoint(std::string path, std::vector<Variable> vars) {
  detail::check_path(kRestore, "path", path);
  check_names(kRestore, vars);
  const checkpoint::SafetensorsFile file(path, kRestore);
  const checkpoint::SafetensorsHeader& header = file.header();

  // Match every requested variable before reading the data.
  std::map<std::string_view, size_t> by_name;
  for (size_t i = 0; i < header.entries.size(); ++i) by_name.emplace(header.entries[i].name, i);
  std::vector<std::optional<size_t>> requested_by(header.entries.size());  // entry -> variable index
  std::vector<Device> devices(vars.size());
  for (size_t i = 0; i < vars.size(); ++i) {
    const std::string& name = vars[i].name();
    const Tensor current = vars[i].value();
    devices[i] = current.device();
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::vector<std::string_view> names;
      for (size_t k = 0; k < header.entries.size() && k < 10; ++k) names.push_back(header.entries[k].name);
      detail::fail<InvalidArgument>("{}: variable '{}' is not in checkpoint '{}'; got {} entries: {}{}", kRestore, name,
                                    path, header.entries.size(), fmt::join(names, ", "),
                                    header.entries.size() > 10 ? ", ..." : "");
    }
    const checkpoint::SafetensorsEntry& entry = header.entries[it->second];
    if (entry.dtype != current.dtype()) {
      detail::fail<DTypeError>(
          "{}: dtype of variable '{}' differs from checkpoint '{}'; got {} in the file, expected {}", kRestore, name,
          path, entry.dtype, current.dtype());
    }
    if (!(entry.shape == current.shape())) {
      detail::fail<ShapeError>(
          "{}: shape of variable '{}' differs from checkpoint '{}'; got {} in the file, expected {}", kRestore, name,
          path, entry.shape, current.shape());
    }
    requested_by[it->second] = i;
  }

  // Read the data section in file order into new host tensors, checksumming everything.
  std::vector<Tensor> loaded(vars.size());
  for (size_t k = 0; k < header.entries.size(); ++k) {
    if (requested_by[k]) loaded[*requested_by[k]] = Tensor::empty(header.entries[k].shape, header.entries[k].dtype);
  }
  const uint32_t crc = file.read_data([&](size_t k) { return requested_by[k] ? &loaded[*requested_by[k]] : nullptr; });
  if (crc != header.data_crc) {
    detail::fail<InvalidArgument>(
        "{}: '{}' is not a valid flowlet checkpoint: the data checksum does not match (the data is corrupt); got crc32 "
        "{} but the file records {}",
        kRestore, path, checkpoint::hex32(crc), checkpoint::hex32(header.data_crc));
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    if (loaded[i].dtype() != b8) continue;
    const auto* bytes = static_cast<const uint8_t*>(loaded[i].raw_data());
    for (int64_t j = 0; j < loaded[i].numel(); ++j) {
      if (bytes[j] > 1) {
        detail::fail<InvalidArgument>(
            "{}: variable '{}' in '{}' holds a BOOL byte that is neither 0 nor 1; got {} at element {}", kRestore,
            vars[i].name(), path, bytes[j], j);
      }
    }
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    if (devices[i] != Device()) loaded[i] = loaded[i].to(devices[i]);
  }

  // Everything checked: assign.
  for (size_t i = 0; i < vars.size(); ++i) vars[i].assign(loaded[i]);
  return header.step;
}

}  // namespace flowlet
