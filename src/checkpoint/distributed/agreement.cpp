// Strings and errors exchanged between processes for the checkpoint manager (agreement.hpp).
#include "checkpoint/distributed/agreement.hpp"

#include <algorithm>
#include <cstring>

#include "core/check.hpp"

namespace flowlet::detail::ckpt {

namespace {

Tensor gather(Communicator& comm, const Tensor& input) {
  CollectiveCall call;
  call.kind = CollectiveKind::all_gather;
  call.input = input;
  return comm.run(0, std::move(call));
}

}  // namespace

std::vector<std::string> all_gather_strings(Communicator* comm, const std::string& mine) {
  if (comm == nullptr) return {mine};
  const int processes = comm->processes();
  // Lengths first, then every string padded to the longest.
  Tensor length = Tensor::empty(Shape({1}), i64);
  *length.data<int64_t>() = static_cast<int64_t>(mine.size());
  const Tensor lengths = gather(*comm, length);
  const std::vector<int64_t> sizes = lengths.to_vector<int64_t>();
  const int64_t longest = std::max<int64_t>(1, *std::max_element(sizes.begin(), sizes.end()));
  Tensor padded = Tensor::empty(Shape({longest}), u8);
  std::memset(padded.raw_data(), 0, static_cast<size_t>(longest));
  std::memcpy(padded.raw_data(), mine.data(), mine.size());
  const Tensor all = gather(*comm, padded);
  std::vector<std::string> out(static_cast<size_t>(processes));
  const char* bytes = static_cast<const char*>(all.raw_data());
  for (int p = 0; p < processes; ++p)
    out[static_cast<size_t>(p)].assign(bytes + p * longest, static_cast<size_t>(sizes[static_cast<size_t>(p)]));
  return out;
}

bool any_process(Communicator* comm, bool mine) {
  if (comm == nullptr) return mine;
  Tensor flag = Tensor::empty(Shape({1}), i32);
  *flag.data<int32_t>() = mine ? 1 : 0;
  CollectiveCall call;
  call.kind = CollectiveKind::all_reduce;
  call.op = ReduceOp::max;
  call.input = flag;
  return comm->run(0, std::move(call)).to_vector<int32_t>().at(0) != 0;
}

std::string encode_error(const std::exception_ptr& error) {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const ShapeError& e) {
    return std::string("S") + e.what();
  } catch (const DTypeError& e) {
    return std::string("D") + e.what();
  } catch (const DeadlineExceeded& e) {
    return std::string("T") + e.what();
  } catch (const std::exception& e) {
    return std::string("I") + e.what();
  } catch (...) {
    return "Ian unknown exception";
  }
}

void throw_encoded(const std::string& encoded, const std::string& prefix) {
  const std::string message = prefix + encoded.substr(1);
  switch (encoded[0]) {
    case 'S':
      throw ShapeError(message);
    case 'D':
      throw DTypeError(message);
    case 'T':
      throw DeadlineExceeded(message);
    default:
      throw InvalidArgument(message);
  }
}

void agree_on_outcome(Communicator* comm, const std::exception_ptr& mine) {
  if (comm == nullptr) {
    if (mine) std::rethrow_exception(mine);
    return;
  }
  const std::vector<std::string> outcomes = all_gather_strings(comm, encode_error(mine));
  for (size_t p = 0; p < outcomes.size(); ++p) {
    if (!outcomes[p].empty()) throw_encoded(outcomes[p], fmt::format("process {}: ", p));
  }
}

}  // namespace flowlet::detail::ckpt
