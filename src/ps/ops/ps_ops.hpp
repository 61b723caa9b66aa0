// The graph ops of a parameter-server worker (ps_pull, ps_lookup, ps_push): their attribute
// structs and the calls that dispatch them, used by ServerVariables (server_variables.cpp). The
// semantics are in ps/ops/server_variables.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "ps/worker/worker_client.hpp"

namespace flowlet::detail::ps {

// ps_pull and ps_lookup: one variable of one worker's client.
struct PsVariableAttrs {
  WorkerClient* client = nullptr;  // valid while WorkerClient::alive(client, serial)
  uint64_t serial = 0;
  int worker = 0;  // for descriptions (which must not reach a client that may be gone)
  int32_t var_id = 0;
  std::string name;
  Shape shape;  // the whole variable's
  DType dtype = DType::f32;
  Device device;  // the worker's: where the results are put
  std::string describe() const;
};

// One gradient of a ps_push: input `grad`, and for a sparse one input `grad + 1` holds its unique ids.
struct PsPushEntry {
  int32_t var_id = 0;
  std::string name;
  bool sparse = false;
};

struct PsPushAttrs {
  WorkerClient* client = nullptr;
  uint64_t serial = 0;
  int worker = 0;
  int server = 0;
  Device device;
  std::vector<PsPushEntry> entries;  // inputs in order: grad, then ids when sparse, per entry
  std::string describe() const;
};

// What ps_lookup gives: rows [n, row shape...] (unique ids' rows first, then zeros), inverse i64
// [n] and unique_ids i64 [n] (-1 after the unique ones).
struct Lookup {
  Tensor rows, inverse, unique_ids;
};

Tensor dispatch_pull(WorkerClient& client, int32_t var_id);
Lookup dispatch_lookup(WorkerClient& client, int32_t var_id, const Tensor& ids);
// `inputs` as PsPushAttrs::entries says.
void dispatch_push(WorkerClient& client, int server, std::vector<PsPushEntry> entries, const std::vector<Tensor>& inputs);

}  // namespace flowlet::detail::ps
