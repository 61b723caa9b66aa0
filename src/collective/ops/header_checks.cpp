#include "collective/ops/header_checks.hpp"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"

namespace flowlet::detail {
namespace {

// The eager signatures each participant of each live communicator has verified. Keyed by address,
// with a weak pointer so that a new communicator at a freed one's address starts unverified.
struct VerifiedSignatures {
  std::weak_ptr<Communicator> owner;
  std::map<int, std::set<std::string>> by_local;
};

std::mutex verified_mutex;
std::map<const Communicator*, VerifiedSignatures>& verified() {
  static auto* table = new std::map<const Communicator*, VerifiedSignatures>();  // outlives static destruction
  return *table;
}

std::string signature(const CollectiveAttrs& attrs, const Tensor& input) {
  if (!input.defined()) return collective_name(attrs.kind);
  return fmt::format("{} {} {} {} {}", collective_name(attrs.kind), to_string(attrs.op), attrs.root, input.dtype(),
                     input.shape());
}

// This participant's verified signatures (the caller holds verified_mutex).
std::set<std::string>& signatures_of(const CollectiveAttrs& attrs) {
  auto& table = verified();
  if (auto found = table.find(attrs.communicator.get()); found != table.end() && !found->second.owner.expired()) {
    return found->second.by_local[attrs.local];
  }
  // A communicator seen for the first time: forget those that are gone, so the table stays as small
  // as the live ones (an entry at a freed communicator's address is gone too and starts anew).
  for (auto it = table.begin(); it != table.end();) {
    it = it->second.owner.expired() ? table.erase(it) : std::next(it);
  }
  VerifiedSignatures& entry = table[attrs.communicator.get()];
  entry = VerifiedSignatures{attrs.communicator, {}};
  return entry.by_local[attrs.local];
}

}  // namespace

bool always_check_headers() {
  // A typo must not silently turn the checks it asked for off: only the two documented values pass.
  static const bool always = [] {
    const char* value = std::getenv("FLOWLET_COLLECTIVE_CHECKS");
    if (value == nullptr || *value == 0 || std::strcmp(value, "first") == 0) return false;
    if (std::strcmp(value, "always") == 0) return true;
    throw InvalidArgument(fmt::format(
        "FLOWLET_COLLECTIVE_CHECKS: expected 'first' (check a call's header on its first use, the default) or "
        "'always'; got '{}'",
        value));
  }();
  return always;
}

bool should_check_header(const CollectiveAttrs& attrs, const Tensor& input, bool traced) {
  if (always_check_headers()) return true;
  if (traced) return !attrs.node_has_run->load(std::memory_order_acquire);
  const std::string key = signature(attrs, input);
  std::lock_guard lock(verified_mutex);
  return signatures_of(attrs).count(key) == 0;
}

void mark_verified(const CollectiveAttrs& attrs, const Tensor& input, bool traced) {
  if (traced) {
    attrs.node_has_run->store(true, std::memory_order_release);
    return;
  }
  std::string key = signature(attrs, input);
  std::lock_guard lock(verified_mutex);
  signatures_of(attrs).insert(std::move(key));
}

}  // namespace flowlet::detail
