// SourceTrace: return addresses now, "file:line" later. Resolving is slow (it runs addr2line), so it
// happens only when a message or a dump needs it, and the answer is cached on the node (and each
// address's lookup for the process).
//
// The user's frame is the first one outside flowlet: frames in flowlet's own shared object are
// skipped by address, and (for static builds) frames whose function is in namespace flowlet by name.
#include "trace/source_trace.hpp"

#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

namespace flowlet {
namespace {

// The base address of flowlet's shared object, or null when flowlet is linked into the program.
const void* flowlet_shared_object() {
  static const void* base = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&detail::capture_source), &info) == 0 || info.dli_fname == nullptr) return static_cast<void*>(nullptr);
    return std::string_view(info.dli_fname).find("libflowlet") != std::string_view::npos ? info.dli_fbase : nullptr;
  }();
  return base;
}

// "function\nfile:line" for `address` in `module`, by addr2line (part of binutils, which g++ needs).
std::pair<std::string, std::string> run_addr2line(const char* module, uintptr_t offset) {
  const std::string command = fmt::format("addr2line -C -f -e '{}' {:#x} 2>/dev/null", module, offset);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) return {};
  std::array<char, 1024> line{};
  std::string function, location;
  if (fgets(line.data(), line.size(), pipe.get())) function = line.data();
  if (fgets(line.data(), line.size(), pipe.get())) location = line.data();
  auto chomp = [](std::string& s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  };
  chomp(function);
  chomp(location);
  if (const auto space = location.find(" (discriminator"); space != std::string::npos) location.resize(space);
  return {function, location};
}

// run_addr2line, remembered per (module, offset) for the process: the nodes of one graph share
// most of their frames (one call site records many nodes), and each lookup starts a process.
std::pair<std::string, std::string> addr2line(const char* module, uintptr_t offset) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::pair<std::string, std::string>> known;
  const std::string key = fmt::format("{}@{:x}", module, offset);
  {
    std::lock_guard lock(mutex);
    if (auto found = known.find(key); found != known.end()) return found->second;
  }
  auto answer = run_addr2line(module, offset);  // outside the lock: slow, and safe to repeat
  std::lock_guard lock(mutex);
  return known.emplace(key, std::move(answer)).first->second;
}

// "auto flowlet::TracedFunction<...>::operator()(...)" -> true: the qualified name (after any
// return type, before template arguments) is in namespace flowlet or std.
bool is_library_function(std::string_view function) {
  function = function.substr(0, std::min(function.find('('), function.find('<')));
  if (const auto space = function.rfind(' '); space != std::string_view::npos) function.remove_prefix(space + 1);
  return function.starts_with("flowlet::") || function.starts_with("std::") || function.starts_with("__gnu_cxx::");
}

std::string resolve(const std::vector<void*>& frames) {
  std::string fallback;
  for (void* frame : frames) {
    Dl_info info{};
    if (dladdr(frame, &info) == 0 || info.dli_fname == nullptr) continue;
    if (info.dli_fbase == flowlet_shared_object()) continue;  // inside flowlet itself
    // A return address points after the call; look up the call instruction itself.
    const auto offset = reinterpret_cast<uintptr_t>(frame) - reinterpret_cast<uintptr_t>(info.dli_fbase) - 1;
    auto [function, location] = addr2line(info.dli_fname, offset);
    if (is_library_function(function)) continue;  // flowlet's templates, a static flowlet, the standard library
    // "main::{lambda(flowlet::Tensor)#1}::operator()(flowlet::Tensor) const" -> "main": the
    // named function around the line is what a reader needs.
    if (const auto lambda = function.find("::{lambda"); lambda != std::string::npos) function.resize(lambda);
    if (const auto paren = function.find('('); paren != std::string::npos) function.resize(paren);
    if (location.ends_with(":?")) location.resize(location.size() - 2);  // a file without line tables
    const bool has_line = !location.empty() && !location.starts_with("??");
    if (has_line) {
      if (const auto slash = location.rfind('/'); slash != std::string::npos) location.erase(0, slash + 1);
      return function.empty() || function == "??" ? location : fmt::format("{} ({})", location, function);
    }
    if (fallback.empty()) {
      fallback = function.empty() || function == "??"
                     ? fmt::format("{}+{:#x}", info.dli_sname ? info.dli_sname : info.dli_fname, offset)
                     : function;
    }
    if (!fallback.empty()) return fallback;
  }
  return fallback;
}

}  // namespace

const std::string& SourceTrace::describe() const {
  if (!resolved_) resolved_ = std::make_shared<const std::string>(resolve(frames));
  return *resolved_;
}

namespace detail {

SourceTrace capture_source() {
  std::array<void*, 24> buffer{};
  const int depth = backtrace(buffer.data(), static_cast<int>(buffer.size()));
  SourceTrace trace;
  // Frame 0 is this function; keep the rest for resolve() to search.
  trace.frames.assign(buffer.begin() + 1, buffer.begin() + std::max(depth, 1));
  return trace;
}

}  // namespace detail
}  // namespace flowlet
