// What one process tells the others at the end of a run() under mpirun, so that every process
// returns the same ParameterServerStats and throws the same error: its server's or its worker's
// counters, its run's wall time, and the errors it saw (by kind, so another process can rethrow
// the same class). Serialized to bytes for an all_gather of u8 tensors.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>

#include "flowlet/ps_options.hpp"
#include "ps/wire/messages.hpp"

namespace flowlet::detail::ps {

// Which flowlet::Error subclass an error was (other: not a flowlet::Error).
enum class ErrorKind : uint8_t {
  none,
  error,
  shape,
  dtype,
  device,
  invalid_argument,
  out_of_range,
  resource_exhausted,
  cancelled,
  deadline_exceeded,
  data_loss,
  other,
};
ErrorKind error_kind(const std::exception_ptr& error);
// Throws the class `kind` names with `message` (kind other: flowlet::Error).
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);

struct ProcessReport {
  double wall_seconds = 0;
  std::optional<ServerStats> server;
  std::optional<WorkerStats> worker;
  ErrorKind worker_error = ErrorKind::none;  // the message is worker->error
  ErrorKind server_error = ErrorKind::none;
  std::string server_message;
};

Bytes encode_report(const ProcessReport& report);
// DataLoss naming the problem for bytes that are not a report (truncated, trailing bytes).
ProcessReport decode_report(std::span<const std::byte> bytes);

}  // namespace flowlet::detail::ps
