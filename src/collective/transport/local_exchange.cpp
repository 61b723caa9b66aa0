#include "collective/transport/local_exchange.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>

#include "collective/transport/owned_thread.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"

namespace flowlet::detail {

double resolve_timeout(double requested) {
  if (requested > 0) return requested;
  const char* text = std::getenv("FLOWLET_COLLECTIVE_TIMEOUT");
  if (text == nullptr || *text == '\0') return 300;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0)) {
    throw InvalidArgument(
        fmt::format("collective: FLOWLET_COLLECTIVE_TIMEOUT must be a positive number of seconds; got '{}'", text));
  }
  return seconds;
}

LocalExchange::LocalExchange(std::vector<Device> devices, int first_rank, double timeout_seconds, std::string describe,
                             Complete complete, Failed failed)
    : devices_(std::move(devices)),
      first_rank_(first_rank),
      timeout_seconds_(timeout_seconds),
      timeout_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(timeout_seconds))),
      describe_(std::move(describe)),
      complete_(std::move(complete)),
      failed_(std::move(failed)),
      next_call_(devices_.size(), 0) {}

LocalExchange::~LocalExchange() {
  std::vector<CollectiveDone> orphans;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (auto& [number, group] : groups_) {
      for (size_t i = 0; i < group.arrivals.size(); ++i) {
        if (group.arrived[i] && group.error == nullptr) orphans.push_back(std::move(group.arrivals[i].done));
      }
    }
    groups_.clear();
  }
  wake_.notify_all();
  join_or_release(watchdog_);
  for (auto& done : orphans) {
    done(Tensor(), std::make_exception_ptr(Cancelled(fmt::format(
                       "collective: {} was destroyed while the call waited for its other participants", describe_))));
  }
}

void LocalExchange::set_identity(int first_rank, std::string describe) {
  std::lock_guard lock(mutex_);
  first_rank_ = first_rank;
  describe_ = std::move(describe);
}

std::string LocalExchange::who(int local) const {
  return fmt::format("participant {} ({})", first_rank_ + local, devices_[static_cast<size_t>(local)].str());
}

bool LocalExchange::has_waiting_groups() {
  std::lock_guard lock(mutex_);
  for (auto& [number, group] : groups_) {
    if (group.error == nullptr) return true;
  }
  return false;
}

void LocalExchange::arrive(int local, CollectiveCall call, CollectiveDone done) {
  const auto participants = static_cast<int>(devices_.size());
  // Compared with the group's first arrival; a lone participant has nobody to compare with.
  const CallHeader header = participants > 1 ? make_header(call) : CallHeader{};
  std::vector<CollectiveDone> failed;  // dones to call with `error`, outside the lock
  std::exception_ptr error;
  std::vector<Arrival> complete;
  uint64_t number = 0;
  bool newly_failed = false;  // this arrival made the group fail: tell failed_
  CallHeader failed_header;
  bool failed_check = true;
  {
    std::unique_lock lock(mutex_);
    number = next_call_[static_cast<size_t>(local)]++;
    if (aborted_ != nullptr) {
      error = aborted_;
      failed.push_back(std::move(done));
    } else if (participants == 1) {
      complete.push_back(Arrival{std::move(call), std::move(done)});
    } else {
      auto [it, fresh] = groups_.try_emplace(number);
      Group& group = it->second;
      if (fresh) {
        group.arrivals.resize(static_cast<size_t>(participants));
        group.arrived.assign(static_cast<size_t>(participants), false);
        group.first = local;
        group.header = header;
        group.check_header = call.check_header;
        group.deadline = std::chrono::steady_clock::now() + timeout_;
      }
      group.arrived[static_cast<size_t>(local)] = true;
      ++group.count;
      if (group.error != nullptr) {
        error = group.error;
        failed.push_back(std::move(done));
      } else {
        group.arrivals[static_cast<size_t>(local)] = Arrival{std::move(call), std::move(done)};
        if (!fresh) {
          group.error = header_mismatch(group.header, who(group.first), header, who(local));
          if (group.error != nullptr) {
            error = group.error;
            newly_failed = true;
            failed_header = group.header;
            failed_check = group.check_header;
            for (size_t i = 0; i < group.arrivals.size(); ++i) {
              if (group.arrived[i]) failed.push_back(std::move(group.arrivals[i].done));
            }
          }
        }
      }
      if (group.count == participants) {
        if (group.error == nullptr) complete = std::move(group.arrivals);
        groups_.erase(it);
      } else if (fresh) {
        // No wake-up needed: the watchdog sleeps at most one timeout, and a group made now expires
        // after whatever it sleeps toward (see watch()).
        start_watchdog_locked();
      }
    }
  }
  for (auto& d : failed) d(Tensor(), error);
  if (newly_failed && failed_) failed_(number, failed_header, failed_check, error);
  if (!complete.empty()) complete_(number, complete);
}

void LocalExchange::abort(std::exception_ptr error) {
  struct FailedGroup {
    uint64_t number;
    CallHeader header;
    bool check_header;
  };
  std::vector<CollectiveDone> failed;
  std::vector<FailedGroup> groups;
  {
    std::lock_guard lock(mutex_);
    if (aborted_ != nullptr) return;
    aborted_ = error;
    for (auto& [number, group] : groups_) {
      if (group.error != nullptr) continue;
      group.error = error;
      groups.push_back(FailedGroup{number, group.header, group.check_header});
      for (size_t i = 0; i < group.arrivals.size(); ++i) {
        if (group.arrived[i]) failed.push_back(std::move(group.arrivals[i].done));
      }
    }
  }
  for (auto& d : failed) d(Tensor(), error);
  if (failed_) {
    for (const FailedGroup& g : groups) failed_(g.number, g.header, g.check_header, error);
  }
}

void LocalExchange::start_watchdog_locked() {
  if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watch(); });
}

void LocalExchange::watch() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    auto next = std::chrono::steady_clock::time_point::max();
    const auto now = std::chrono::steady_clock::now();
    std::vector<CollectiveDone> expired;
    std::exception_ptr error;
    uint64_t expired_number = 0;
    CallHeader expired_header;
    bool expired_check = true;
    for (auto& [number, group] : groups_) {
      if (group.error != nullptr) continue;
      if (group.deadline > now) {
        next = std::min(next, group.deadline);
        continue;
      }
      std::vector<int> missing;
      for (size_t i = 0; i < group.arrived.size(); ++i) {
        if (!group.arrived[i]) missing.push_back(first_rank_ + static_cast<int>(i));
      }
      group.error = std::make_exception_ptr(
          DeadlineExceeded(fmt::format("{}: participants [{}] of {} did not arrive within {:g} s",
                                       collective_name(static_cast<CollectiveKind>(group.header.kind)),
                                       fmt::join(missing, ", "), describe_, timeout_seconds_)));
      error = group.error;
      expired_number = number;
      expired_header = group.header;
      expired_check = group.check_header;
      for (size_t i = 0; i < group.arrivals.size(); ++i) {
        if (group.arrived[i]) expired.push_back(std::move(group.arrivals[i].done));
      }
      break;  // one group at a time: the dones run without the lock
    }
    if (!expired.empty()) {
      lock.unlock();
      for (auto& d : expired) {
        d(Tensor(), error);
        if (object_released_here()) return;  // a callback destroyed this exchange's owner
      }
      if (failed_) failed_(expired_number, expired_header, expired_check, error);
      if (object_released_here()) return;
      lock.lock();
      continue;
    }
    // Never longer than one timeout from now: every group made later expires after that, so
    // arrive() need not wake this thread for each new group.
    wake_.wait_until(lock, std::min(next, now + timeout_));
  }
}

}  // namespace flowlet::detail
