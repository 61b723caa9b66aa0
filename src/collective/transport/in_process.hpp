// The in-process backend: the participants are local CPU devices of this process, exchanging
// through host memory. The last participant of a call to arrive computes every result on its own
// thread (reducing in participant order, so every participant gets the same bits).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective/communicator.hpp"
#include "collective/transport/local_exchange.hpp"

namespace flowlet::detail {

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::vector<Device> devices, double timeout_seconds);

  int local_size() const override { return static_cast<int>(devices_.size()); }
  int processes() const override { return 1; }
  int process_rank() const override { return 0; }
  Device device(int local) const override;
  void start(int local, CollectiveCall call, CollectiveDone done) override;
  void abort(std::exception_ptr error) override { exchange_.abort(std::move(error)); }
  std::string describe() const override { return describe_; }

 private:
  void complete(std::vector<Arrival>& arrivals);

  const std::vector<Device> devices_;
  const std::string describe_;
  LocalExchange exchange_;
};

// "communicator of 4 participants (2 processes x [cpu:0, cpu:1])"
std::string describe_communicator(int processes, const std::vector<Device>& devices);

// InvalidArgument unless 0 <= local < local_size.
void check_local_index(const Communicator& communicator, int local);

}  // namespace flowlet::detail
