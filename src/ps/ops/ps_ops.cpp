// ps_pull, ps_lookup and ps_push: a parameter-server worker's reads and pushes as ops of the one
// table (semantics: ps/ops/server_variables.hpp).
//
// Each has a synchronous kernel, which eager calls run (it waits for the client's Done), and an
// asynchronous one, which a traced step runs, so that a node waiting for a server holds no executor
// thread. They are stateful and ordered on their WorkerClient (pulls and lookups read it, pushes
// write it): a step's pushes come after the reads recorded before them and the next step's reads
// after the pushes, while the nodes still overlap with the compute around them. Like the collective
// ops, they run on the worker's device whatever the device scope (kPlacesOutput, kRunsAtResource):
// the client puts its results there, and the kernels only move handles (kView, kAnyDevice).
#include "ps/ops/ps_ops.hpp"

#include <cstring>
#include <future>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.hpp"
#include "flowlet/core/format.hpp"
#include "flowlet/dispatch.hpp"
#include "ops/registry.hpp"

namespace flowlet::detail::ps {

std::string PsVariableAttrs::describe() const {
  return fmt::format("worker={}, variable='{}', var_id={}, shape={}, dtype={}, device={}", worker, name,
                     var_id, shape, dtype, device);
}

std::string PsPushAttrs::describe() const {
  std::string text = fmt::format("worker={}, server={}, device={}, gradients=[", worker, server, device);
  for (size_t i = 0; i < entries.size(); ++i) {
    text += fmt::format("{}'{}'{}", i > 0 ? ", " : "", entries[i].name, entries[i].sparse ? " sparse" : "");
  }
  return text + "]";
}

namespace {

// A node traced in one run() and run in a later one would hold a client that is gone.
void check_alive(const char* op, const WorkerClient* client, uint64_t serial) {
  if (!WorkerClient::alive(client, serial)) {
    fail<InvalidArgument>(
        "{}: the worker client this node was recorded with has finished (a step traced in an earlier "
        "ParameterServerStrategy::run); trace the step inside the worker function",
        op);
  }
}

// Eagerly: the kernel waits for the client's Done, with a deadline past the client's own timeout
// (which fails the pull first).
template <class Start>
Tensor wait_for_client(const char* op, const WorkerClient& client, const std::string& name, Start start) {
  auto promise = std::make_shared<std::promise<Tensor>>();
  std::future<Tensor> result = promise->get_future();
  start([promise](Tensor value, std::exception_ptr error) {
    if (error) {
      promise->set_exception(std::move(error));
    } else {
      promise->set_value(std::move(value));
    }
  });
  const auto limit = client.config().timeout + std::chrono::seconds(10);
  if (result.wait_for(limit) != std::future_status::ready) {
    fail<DeadlineExceeded>("{} of '{}' (worker {}): the client gave no answer within {} s", op, name,
                           client.config().worker, limit.count());
  }
  return result.get();
}

// ---- ps_pull ----

void pull_infer(const OpCall& call, OutputSpec& spec) {
  const auto& attrs = call.attrs<PsVariableAttrs>();
  spec.device = attrs.device;
  spec.outputs[0] = TensorMeta{attrs.shape, attrs.dtype};
}

// The pulled value must be what the node was traced for (the client checks the replies' shapes).
void pull_kernel(const OpCall& call, std::span<Tensor> outputs) {
  const auto& attrs = call.attrs<PsVariableAttrs>();
  check_alive("ps_pull", attrs.client, attrs.serial);
  outputs[0] = wait_for_client("ps_pull", *attrs.client, attrs.name,
                               [&](WorkerClient::Done done) { attrs.client->pull(attrs.var_id, std::move(done)); });
}

void pull_async_kernel(const OpCall& call, std::span<Tensor> outputs, AsyncDone done) {
  const auto& attrs = call.attrs<PsVariableAttrs>();  // the node's: it outlives the step
  check_alive("ps_pull", attrs.client, attrs.serial);
  attrs.client->pull(attrs.var_id, [outputs, done](Tensor value, std::exception_ptr error) {
    if (!error) outputs[0] = std::move(value);
    done(std::move(error));
  });
}

// ---- ps_lookup ----

// The ids flattened to int64 (any integer dtype).
std::vector<int64_t> ids_of(const Tensor& ids) {
  switch (ids.dtype()) {
    case DType::i64:
      return ids.to_vector<int64_t>();
    case DType::i32: {
      const std::vector<int32_t> v = ids.to_vector<int32_t>();
      return {v.begin(), v.end()};
    }
    case DType::u8: {
      const std::vector<uint8_t> v = ids.to_vector<uint8_t>();
      return {v.begin(), v.end()};
    }
    default:
      fail<DTypeError>("ps_lookup: ids must have an integer dtype (i32, i64, u8); got {}", ids.dtype());
  }
}

Shape lookup_rows_shape(const PsVariableAttrs& attrs, int64_t n) {
  Shape shape{n};
  for (int64_t d = 1; d < attrs.shape.rank(); ++d) shape.push_back(attrs.shape[static_cast<size_t>(d)]);
  return shape;
}

void lookup_infer(const OpCall& call, OutputSpec& spec) {
  const auto& attrs = call.attrs<PsVariableAttrs>();
  const Tensor& ids = call.inputs[0];
  if (!is_integral(ids.dtype())) {
    fail<DTypeError>("ps_lookup: ids of '{}' must have an integer dtype (i32, i64, u8); got {} {}", attrs.name,
                     ids.dtype(), ids.shape());
  }
  if (attrs.shape.rank() == 0) {
    fail<ShapeError>("ps_lookup: '{}' is a scalar; gather needs a variable of rank >= 1", attrs.name);
  }
  const int64_t n = ids.numel();
  spec.count = 3;
  spec.device = attrs.device;
  spec.outputs[0] = TensorMeta{lookup_rows_shape(attrs, n), attrs.dtype};
  spec.outputs[1] = TensorMeta{Shape{n}, DType::i64};
  spec.outputs[2] = TensorMeta{Shape{n}, DType::i64};
}

// The unique ids in order of first appearance and each id's entry among them, on the host.
struct UniqueIds {
  std::vector<int64_t> unique;
  std::vector<int64_t> inverse;
};

UniqueIds unique_ids(const PsVariableAttrs& attrs, const Tensor& ids) {
  const std::vector<int64_t> flat = ids_of(ids);
  const int64_t rows = attrs.shape[0];
  UniqueIds u;
  u.inverse.reserve(flat.size());
  std::unordered_map<int64_t, int64_t> seen;
  for (size_t i = 0; i < flat.size(); ++i) {
    const int64_t id = flat[i];
    if (id < 0 || id >= rows) {
      fail<OutOfRange>("ps_lookup: id {} at position {} is outside [0, {}) (the rows of '{}')", id, i, rows, attrs.name);
    }
    const auto [it, fresh] = seen.try_emplace(id, static_cast<int64_t>(u.unique.size()));
    if (fresh) u.unique.push_back(id);
    u.inverse.push_back(it->second);
  }
  return u;
}

Tensor i64_tensor(const std::vector<int64_t>& values, int64_t size, int64_t fill, Device device) {
  Tensor t = Tensor::empty(Shape{size}, DType::i64, device.kind() == DeviceKind::cpu ? device : Device());
  auto* out = static_cast<int64_t*>(t.raw_data());
  std::copy(values.begin(), values.end(), out);
  std::fill(out + values.size(), out + size, fill);
  return t.device() == device ? t : t.to(device);
}

// rows [n, row shape...]: the pulled rows, then zero rows.
Tensor padded_rows(const PsVariableAttrs& attrs, Tensor pulled, int64_t n) {
  if (pulled.shape()[0] == n) return pulled;
  const Device device = attrs.device;
  Tensor host = pulled.device().kind() == DeviceKind::cpu ? pulled : pulled.to(Device());
  Tensor rows = Tensor::empty(lookup_rows_shape(attrs, n), attrs.dtype, device.kind() == DeviceKind::cpu ? device : Device());
  const size_t bytes = static_cast<size_t>(rows.numel()) * dtype_size(attrs.dtype);
  const size_t used = static_cast<size_t>(host.numel()) * dtype_size(attrs.dtype);
  auto* out = static_cast<char*>(rows.raw_data());
  if (used > 0) std::memcpy(out, host.contiguous().raw_data(), used);
  std::memset(out + used, 0, bytes - used);  // all-zero bits are 0.0 in every floating dtype
  return rows.device() == device ? rows : rows.to(device);
}

// Sets the inverse and unique_ids outputs and starts the row pull; `done` gets the rows, padded.
void start_lookup(const OpCall& call, std::span<Tensor> outputs, WorkerClient::Done done) {
  const auto& attrs = call.attrs<PsVariableAttrs>();
  check_alive("ps_lookup", attrs.client, attrs.serial);
  const Tensor& ids = call.inputs[0];
  const int64_t n = ids.numel();
  UniqueIds u = unique_ids(attrs, ids);
  outputs[1] = i64_tensor(u.inverse, n, 0, attrs.device);
  outputs[2] = i64_tensor(u.unique, n, -1, attrs.device);
  const Tensor wanted = i64_tensor(u.unique, static_cast<int64_t>(u.unique.size()), 0, Device());
  // A copy of the attributes: an eager call that gave up waiting must leave the callback valid.
  attrs.client->pull_rows(attrs.var_id, wanted,
                          [attrs, n, done = std::move(done)](Tensor rows, std::exception_ptr error) {
                            Tensor padded;
                            if (!error) {
                              try {
                                padded = padded_rows(attrs, std::move(rows), n);
                              } catch (...) {
                                error = std::current_exception();
                              }
                            }
                            done(std::move(padded), std::move(error));
                          });
}

void lookup_kernel(const OpCall& call, std::span<Tensor> outputs) {
  const auto& attrs = call.attrs<PsVariableAttrs>();
  outputs[0] = wait_for_client("ps_lookup", *attrs.client, attrs.name,
                               [&](WorkerClient::Done done) { start_lookup(call, outputs, std::move(done)); });
}

void lookup_async_kernel(const OpCall& call, std::span<Tensor> outputs, AsyncDone done) {
  start_lookup(call, outputs, [outputs, done](Tensor rows, std::exception_ptr error) {
    if (!error) outputs[0] = std::move(rows);
    done(std::move(error));
  });
}

// ---- ps_push ----

size_t expected_inputs(const PsPushAttrs& attrs) {
  size_t n = 0;
  for (const PsPushEntry& e : attrs.entries) n += e.sparse ? 2 : 1;
  return n;
}

void push_infer(const OpCall& call, OutputSpec& spec) {
  const auto& attrs = call.attrs<PsPushAttrs>();
  if (call.inputs.size() != expected_inputs(attrs)) {
    fail<InvalidArgument>("ps_push: to server {} with {} gradients ({} sparse) needs {} inputs; got {}", attrs.server,
                          attrs.entries.size(), expected_inputs(attrs) - attrs.entries.size(), expected_inputs(attrs),
                          call.inputs.size());
  }
  spec.count = 0;
  spec.device = attrs.device;
}

std::vector<VariableGradient> push_gradients(const OpCall& call) {
  const auto& attrs = call.attrs<PsPushAttrs>();
  check_alive("ps_push", attrs.client, attrs.serial);
  std::vector<VariableGradient> grads;
  size_t input = 0;
  for (const PsPushEntry& e : attrs.entries) {
    VariableGradient g{e.var_id, call.inputs[input++], Tensor()};
    if (e.sparse) g.ids = call.inputs[input++];
    grads.push_back(std::move(g));
  }
  return grads;
}

// Eagerly an injected step delay is waited for on the caller's thread: the worker's own.
void push_kernel(const OpCall& call, std::span<Tensor>) {
  const auto& attrs = call.attrs<PsPushAttrs>();
  attrs.client->push(attrs.server, push_gradients(call));
}

// In a graph step the node runs on the shared thread pool: an injected step delay (this worker's
// computing time) must not hold that thread, so the client's timer sends the push when the delay
// ends and only then completes the node. The next step's pulls, ordered after this node on the
// client, therefore leave after the push.
void push_async_kernel(const OpCall& call, std::span<Tensor>, AsyncDone done) {
  const auto& attrs = call.attrs<PsPushAttrs>();
  std::vector<VariableGradient> grads;
  try {
    grads = push_gradients(call);
  } catch (...) {
    done(std::current_exception());
    return;
  }
  attrs.client->push_async(attrs.server, std::move(grads), [done](std::exception_ptr error) { done(std::move(error)); });
}

ResourceAccess reads_client(const void* attributes) {
  return {static_cast<const PsVariableAttrs*>(attributes)->client, /*writes=*/false};
}
ResourceAccess writes_client(const void* attributes) {
  return {static_cast<const PsPushAttrs*>(attributes)->client, /*writes=*/true};
}

const std::string& variable_name(const void* attributes) {
  static const std::string unnamed = "variable";
  const std::string& name = static_cast<const PsVariableAttrs*>(attributes)->name;
  return name.empty() ? unnamed : name;
}
std::string pull_node_name(const void* attributes) { return "pull_" + variable_name(attributes); }
std::string lookup_node_name(const void* attributes) { return "lookup_" + variable_name(attributes); }
std::string push_node_name(const void* attributes) {
  return fmt::format("push_server{}", static_cast<const PsPushAttrs*>(attributes)->server);
}

constexpr uint32_t kPsFlags = kStateful | kView | kPlacesOutput | kRunsAtResource | kAnyDevice;

constinit Op ps_pull_op{.name = "ps_pull",
                        .flags = kPsFlags,
                        .infer = &pull_infer,
                        .kernels = {&pull_kernel},
                        .copy_attributes = &copy_attributes<PsVariableAttrs>,
                        .describe_attributes = &describe_attributes<PsVariableAttrs>,
                        .async_kernels = {&pull_async_kernel},
                        .resource = &reads_client,
                        .node_name = &pull_node_name};
constinit Op ps_lookup_op{.name = "ps_lookup",
                          .min_inputs = 1,
                          .max_inputs = 1,
                          .flags = kPsFlags,
                          .infer = &lookup_infer,
                          .kernels = {&lookup_kernel},
                          .copy_attributes = &copy_attributes<PsVariableAttrs>,
                          .describe_attributes = &describe_attributes<PsVariableAttrs>,
                          .async_kernels = {&lookup_async_kernel},
                          .resource = &reads_client,
                          .node_name = &lookup_node_name};
constinit Op ps_push_op{.name = "ps_push",
                        .max_inputs = -1,
                        .flags = kPsFlags,
                        .infer = &push_infer,
                        .kernels = {&push_kernel},
                        .copy_attributes = &copy_attributes<PsPushAttrs>,
                        .describe_attributes = &describe_attributes<PsPushAttrs>,
                        .async_kernels = {&push_async_kernel},
                        .resource = &writes_client,
                        .node_name = &push_node_name};

PsVariableAttrs variable_attrs(WorkerClient& client, int32_t var_id) {
  const VariablePlacement& p = client.placement(var_id);
  return PsVariableAttrs{&client,  client.serial(), client.config().worker, var_id, p.name, p.shape, p.dtype,
                         client.config().device};
}

}  // namespace

Tensor dispatch_pull(WorkerClient& client, int32_t var_id) {
  const PsVariableAttrs attrs = variable_attrs(client, var_id);
  return dispatch(ps_pull_op, std::span<const Tensor>(), &attrs);
}

Lookup dispatch_lookup(WorkerClient& client, int32_t var_id, const Tensor& ids) {
  const PsVariableAttrs attrs = variable_attrs(client, var_id);
  std::vector<Tensor> out = dispatch_all(ps_lookup_op, std::span<const Tensor>(&ids, 1), &attrs);
  return Lookup{std::move(out[0]), std::move(out[1]), std::move(out[2])};
}

void dispatch_push(WorkerClient& client, int server, std::vector<PsPushEntry> entries, const std::vector<Tensor>& inputs) {
  const PsPushAttrs attrs{&client, client.serial(), client.config().worker, server, client.config().device,
                          std::move(entries)};
  dispatch_all(ps_push_op, inputs, &attrs);
}

}  // namespace flowlet::detail::ps

namespace flowlet::detail {
void add_ps_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(), {&ps::ps_pull_op, &ps::ps_lookup_op, &ps::ps_push_op});
}
}  // namespace flowlet::detail
