// The Source of variables every process holds whole (plain and mirrored ones: add(variables)).
//
// Save: the variables are assigned to processes by size (largest first, each to the process with
// the fewest bytes so far, ties to the lowest process; the same on every process since every
// process adds the same list), and process k writes its share as shard "variables-p<k>" (one
// entry per variable, all rows). A mirrored variable's value outside run() is replica 0's copy.
// Restore: every process reads every variable (any process count; the checkpoint may have been
// written by another number of processes) and assigns it in commit(); assign() sets every local
// copy of a mirrored variable.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/distributed/source.hpp"
#include "flowlet/variable.hpp"

namespace flowlet::detail::ckpt {

class VariablesSource final : public Source {
 public:
  // `variables`: checked by the caller (defined, named, not server variables).
  explicit VariablesSource(std::vector<Variable> variables, std::string op);

  // More variables (a later add(variables)); names checked by the caller.
  void append(const std::vector<Variable>& variables);

  std::vector<std::string> tensor_names() const override;
  void snapshot(const ProcessView& view, std::vector<ShardContent>& shards,
                std::map<std::string, std::string>& attributes) override;
  void load(const ProcessView& view, Reader& reader) override;
  void commit() override;

  // Which process writes variable i (the assignment described above) for `processes` processes.
  static std::vector<int> assign_writers(const std::vector<int64_t>& bytes, int processes);

 private:
  std::vector<Variable> variables_;
  std::string op_;
  std::vector<Tensor> pending_;  // load()'s values, assigned by commit()
};

}  // namespace flowlet::detail::ckpt
