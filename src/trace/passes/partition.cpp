// partition: after placement, every edge between nodes on different devices becomes a Send/Recv
// pair, and split_partitions() cuts the graph into one graph per device.
//
// insert_send_recv:
//   - a data edge producer:k (device A) -> consumer (device B) becomes producer:k -> send (on A)
//     and recv (on B) -> consumer; exactly one pair per (value, destination device), however many
//     consumers read the value there;
//   - a control edge c (A) -> n (B) becomes c -> send (on A, control) and recv (on B) -> n, one pair
//     per (c, destination device);
//   - a constant read on another device is not sent at every step: it gets a copy on that device
//     (a zero-copy view between CPU devices);
//   - the recv names its send as a control input: in the whole graph that is the only edge between
//     the pair, and split_partitions() drops it (the rendezvous carries it);
//   - every pair gets a rendezvous slot (0 .. pairs - 1) and a unique readable key.
// Relies on: every node placed (place() ran); graph invariants.
// Keeps: graph invariants (sends and recvs come right before their first consumer); outputs and
// effects; removed nodes are dropped (the result is compacted).
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "core/check.hpp"
#include "ops/transfer.hpp"
#include "trace/passes/passes.hpp"

namespace flowlet::detail {
namespace {

std::string device_key(Device d) { return d.str(); }

class SendRecvInserter {
 public:
  explicit SendRecvInserter(Graph& graph) : graph_(graph), old_(std::move(graph.mutable_nodes())) {}

  void run() {
    new_id_.assign(old_.size(), -1);
    for (size_t i = 0; i < old_.size(); ++i) {
      if (old_[i].removed) continue;
      Node n = old_[i];
      if (n.kind == NodeKind::op) {
        for (ValueRef& in : n.inputs) in = value_on(ValueRef{new_id(in.node), in.output}, n.device);
        // A control input on a removed node is dropped: what it ordered no longer exists.
        std::erase_if(n.control_inputs, [&](int32_t c) { return old_[static_cast<size_t>(c)].removed; });
        for (int32_t& c : n.control_inputs) c = control_on(new_id(c), n.device);
      }
      if (n.gradient_of >= 0) n.gradient_of = new_id_.at(static_cast<size_t>(n.gradient_of));  // -1 if removed
      new_id_[i] = emit(std::move(n));
    }
    std::vector<ValueRef> outputs = graph_.outputs();
    for (ValueRef& out : outputs) out.node = new_id(out.node);
    std::vector<int32_t> effects = graph_.effects();
    for (int32_t& e : effects) e = new_id(e);
    graph_.mutable_nodes() = std::move(nodes_);
    graph_.set_outputs(std::move(outputs));
    graph_.set_effects(std::move(effects));
  }

 private:
  int32_t new_id(int32_t old_id) const {
    const int32_t id = new_id_.at(static_cast<size_t>(old_id));
    if (id < 0) fail<InvalidArgument>("partition: a live node reads removed node {}", old_[static_cast<size_t>(old_id)].name);
    return id;
  }

  int32_t emit(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<int32_t>(nodes_.size()) - 1;
  }

  // `value` (a node id in the new list) as read on `device`.
  ValueRef value_on(ValueRef value, Device device) {
    const Node& producer = nodes_[static_cast<size_t>(value.node)];
    if (producer.device == device) return value;
    const auto key = std::make_tuple(value.node, value.output, device_key(device));
    if (auto found = received_.find(key); found != received_.end()) return found->second;
    ValueRef result;
    if (producer.kind == NodeKind::constant) {
      Node copy;
      copy.kind = NodeKind::constant;
      copy.name = fmt::format("{}@{}", producer.name, device);
      copy.outputs = producer.outputs;
      copy.value = deliver_to(producer.value, device);
      copy.device = device;
      copy.placement_reason = fmt::format("a copy of constant '{}' for {}", producer.name, device);
      result = ValueRef{emit(std::move(copy)), 0};
    } else {
      TransferAttrs attrs;
      attrs.key = fmt::format("edge {}:{} {}->{}", producer.name, value.output, producer.device, device);
      attrs.source = producer.device;
      attrs.destination = device;
      const TensorMeta meta = producer.outputs[static_cast<size_t>(value.output)];
      result = ValueRef{add_pair(std::move(attrs), {value}, {}, {meta}), 0};
    }
    received_.emplace(key, result);
    return result;
  }

  // A control input `id` (new list) for a node on `device`.
  int32_t control_on(int32_t id, Device device) {
    const Node& before = nodes_[static_cast<size_t>(id)];
    if (before.device == device) return id;
    const auto key = std::make_tuple(id, -1, device_key(device));
    if (auto found = received_.find(key); found != received_.end()) return found->second.node;
    TransferAttrs attrs;
    attrs.key = fmt::format("control {} {}->{}", before.name, before.device, device);
    attrs.source = before.device;
    attrs.destination = device;
    attrs.control = true;
    const int32_t recv = add_pair(std::move(attrs), {}, {id}, {});
    received_.emplace(key, ValueRef{recv, 0});
    return recv;
  }

  // Emits send (reading `inputs`, after `controls`) and its recv; returns the recv's id.
  int32_t add_pair(TransferAttrs attrs, std::vector<ValueRef> inputs, std::vector<int32_t> controls,
                   std::vector<TensorMeta> outputs) {
    attrs.slot = slots_++;
    Node send;
    send.op = &send_op;
    send.name = fmt::format("send_{}", attrs.slot);
    send.inputs = std::move(inputs);
    send.control_inputs = std::move(controls);
    send.device = attrs.source;
    send.placement_reason = "sends from its producer's device";
    Node recv;
    recv.op = &recv_op;
    recv.name = fmt::format("recv_{}", attrs.slot);
    recv.outputs = std::move(outputs);
    recv.device = attrs.destination;
    recv.placement_reason = "receives on its consumers' device";
    auto shared = std::make_shared<const TransferAttrs>(std::move(attrs));
    send.attributes = shared;
    recv.attributes = shared;
    const int32_t send_id = emit(std::move(send));
    recv.control_inputs.push_back(send_id);
    return emit(std::move(recv));
  }

  Graph& graph_;
  std::vector<Node> old_;
  std::vector<Node> nodes_;
  std::vector<int32_t> new_id_;
  std::map<std::tuple<int32_t, int32_t, std::string>, ValueRef> received_;
  int32_t slots_ = 0;
};

bool is_transfer(const Node& n) { return n.kind == NodeKind::op && (n.op == &send_op || n.op == &recv_op); }

}  // namespace

void insert_send_recv(Graph& graph) { SendRecvInserter(graph).run(); }

PartitionedGraph split_partitions(const Graph& graph) {
  PartitionedGraph result;
  std::vector<int32_t> partition_of(graph.nodes().size(), -1);
  std::vector<int32_t> local_id(graph.nodes().size(), -1);
  auto partition_for = [&](Device d) {
    for (size_t p = 0; p < result.partitions.size(); ++p) {
      if (result.partitions[p].device == d) return static_cast<int32_t>(p);
    }
    GraphPartition fresh;
    fresh.device = d;
    fresh.graph = std::make_shared<Graph>();
    result.partitions.push_back(std::move(fresh));
    return static_cast<int32_t>(result.partitions.size()) - 1;
  };
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const Node& n = graph.nodes()[i];
    if (n.removed) continue;
    const int32_t p = partition_for(n.device);
    GraphPartition& part = result.partitions[static_cast<size_t>(p)];
    Node copy = n;
    for (ValueRef& in : copy.inputs) {
      if (partition_of[static_cast<size_t>(in.node)] != p) {
        fail<InvalidArgument>("split_partitions: {} on {} reads '{}' on another device; run insert_send_recv first",
                              n.label(), n.device, graph.node(in.node).name);
      }
      in.node = local_id[static_cast<size_t>(in.node)];
    }
    std::vector<int32_t> controls;
    for (int32_t c : copy.control_inputs) {
      if (partition_of[static_cast<size_t>(c)] == p) {
        controls.push_back(local_id[static_cast<size_t>(c)]);
      } else if (!(n.op == &recv_op && is_transfer(graph.node(c)))) {
        fail<InvalidArgument>("split_partitions: {} on {} waits for '{}' on another device; run insert_send_recv first",
                              n.label(), n.device, graph.node(c).name);
      }
    }
    copy.control_inputs = std::move(controls);
    partition_of[i] = p;
    local_id[i] = part.graph->add_node(std::move(copy));
    part.global_ids.push_back(static_cast<int32_t>(i));
    if (n.op == &send_op) part.sends.push_back(local_id[i]);
    if (n.op == &send_op) ++result.slots;
  }
  std::vector<std::vector<ValueRef>> outputs(result.partitions.size());
  for (const ValueRef& out : graph.outputs()) {
    const auto p = static_cast<size_t>(partition_of.at(static_cast<size_t>(out.node)));
    result.outputs.emplace_back(static_cast<int32_t>(p), static_cast<int32_t>(outputs[p].size()));
    outputs[p].push_back(ValueRef{local_id[static_cast<size_t>(out.node)], out.output});
  }
  std::vector<std::vector<int32_t>> effects(result.partitions.size());
  for (int32_t e : graph.effects()) {
    const auto p = static_cast<size_t>(partition_of.at(static_cast<size_t>(e)));
    effects[p].push_back(local_id[static_cast<size_t>(e)]);
  }
  for (size_t p = 0; p < result.partitions.size(); ++p) {
    GraphPartition& part = result.partitions[p];
    effects[p].insert(effects[p].end(), part.sends.begin(), part.sends.end());  // a send always runs
    part.graph->set_outputs(std::move(outputs[p]));
    part.graph->set_effects(std::move(effects[p]));
  }
  return result;
}

}  // namespace flowlet::detail
