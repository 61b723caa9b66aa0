// How parameter-server messages move between endpoints: the only part that differs between the
// in-process cluster and processes under mpirun.
//
// Endpoints are numbered 0 .. endpoints - 1: servers first (endpoint s is server s), then workers
// (endpoint num_servers + w is worker w). A process hosts some of them (the in-process transport
// all, the MPI transport one per process) and attaches a handler to each it hosts.
//
// Contract, both transports:
//   - send() never waits for the receiver's handler; it may be called from any thread, also from a
//     handler. Messages from one sender endpoint to one receiver endpoint arrive in the order sent,
//     each exactly once (no loss, no duplication) while both ends are attached.
//   - A handler is called with one message at a time per endpoint (never concurrently with itself),
//     on a thread of the transport; it should return quickly (a server queues the message for its
//     own thread). An exception from a handler is a bug in the endpoint: the transport ends the
//     process (std::terminate, which under mpirun aborts the job).
//   - A message that arrives for an endpoint with no handler yet is kept until one is attached.
//   - Counters count what each hosted endpoint sent and received (messages and bytes, the encoded
//     message's size).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ps/wire/messages.hpp"

namespace flowlet::detail::ps {

struct TransportCounters {
  int64_t messages_sent = 0, bytes_sent = 0;
  int64_t messages_received = 0, bytes_received = 0;
};

class Transport {
 public:
  using Handler = std::function<void(int from, Bytes message)>;

  virtual ~Transport() = default;

  int endpoints() const { return endpoints_; }
  virtual bool hosts(int endpoint) const = 0;

  // Calls `handler` for every message to `endpoint` (hosted here) from now on, pending ones first.
  // InvalidArgument for an endpoint not hosted here or already attached.
  virtual void attach(int endpoint, Handler handler) = 0;
  // Stops delivering to `endpoint`; returns once no call of its handler runs. Later messages to it
  // are counted and dropped.
  virtual void detach(int endpoint) = 0;

  // Sends `message` from `from` (hosted here) to `to`. InvalidArgument for endpoints out of range.
  virtual void send(int from, int to, Bytes message) = 0;

  virtual TransportCounters counters(int endpoint) const = 0;
  virtual void reset_counters() = 0;
  virtual std::string describe() const = 0;  // "in-process transport (6 endpoints)", "MPI ..."

 protected:
  explicit Transport(int endpoints) : endpoints_(endpoints) {}

 private:
  int endpoints_;
};

// All endpoints in this process. With message_delay > 0 each message is delivered that long after
// it was sent (a delivery thread per endpoint keeps the per-sender order); with 0 the handler runs
// on the sender's thread inside send() (still one call at a time per endpoint).
std::unique_ptr<Transport> make_in_memory_transport(int endpoints, std::chrono::duration<double> message_delay = {});

// One endpoint per process of the job: endpoint_process[e] is the process index (flowlet's
// process_index()) hosting endpoint e, every process exactly one. Collective over the job's
// processes (each duplicates MPI_COMM_WORLD into a communicator of its own, so these messages never
// meet the collectives'); starts MPI if needed. Each process runs one progress thread that receives
// (MPI_Improbe / MPI_Mrecv, any size) and calls the handler; sends are MPI_Isend, completed by the
// progress thread, so send() returns at once. The destructor is collective too: it waits until
// every process's sends completed (a barrier on the duplicated communicator), then stops the thread.
// InvalidArgument when built without MPI.
std::unique_ptr<Transport> make_mpi_transport(const std::vector<int>& endpoint_process);

}  // namespace flowlet::detail::ps
