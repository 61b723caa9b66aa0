// Agreement between the job's processes for the checkpoint manager: strings exchanged over a
// communicator of the manager's own, and errors carried across processes with their type.
//
// Every function is collective over `comm` (every process calls it at the same point); a null
// `comm` means a job of one process, where each is a local no-op.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "collective/communicator.hpp"

namespace flowlet::detail::ckpt {

// Every process's `mine`, in process order.
std::vector<std::string> all_gather_strings(Communicator* comm, const std::string& mine);

// True on every process when `mine` is true on any (one small all-reduce).
bool any_process(Communicator* comm, bool mine);

// An error as a string that crosses processes: "" for none, else a type letter and the message.
std::string encode_error(const std::exception_ptr& error);
// Rethrows `encoded` (non-empty) as its type (InvalidArgument, ShapeError, DTypeError, DeadlineExceeded;
// anything else as InvalidArgument), its message prefixed by `prefix`.
[[noreturn]] void throw_encoded(const std::string& encoded, const std::string& prefix);

// Every process passes its outcome (null: success). When any failed, every process throws the
// first failing process's error, prefixed "process k: " in a job of several processes.
void agree_on_outcome(Communicator* comm, const std::exception_ptr& mine);

}  // namespace flowlet::detail::ckpt
