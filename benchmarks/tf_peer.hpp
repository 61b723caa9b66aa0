// TensorFlow 2 as an optional peer, measured in a subprocess: benchmarks/peers/tf_peer.py run by
// the Python of the venv that benchmarks/peers/setup_tf_venv.sh makes (build/tf-venv under the
// source root; `make bench` sets it up). TensorFlow is never a dependency of the library or the
// tests: without the venv, the script or a working TensorFlow, every call here returns nullopt
// with the reason, and the benchmark prints "TensorFlow peer: not available (reason)".
//
// Example:
//   namespace bench = flowlet_bench;
//   std::string why;
//   if (auto tf = bench::run_tf_peer({"mlp_step", "--batch", "64"}, &why)) {
//     bench::Result peer = bench::tf_result(*tf, "function", "TensorFlow tf.function");
//     bench::print_peer_row(peer);
//     section.compare(ours, peer, bench::Target::at_most(0.8));
//   } else {
//     bench::print_tf_unavailable(why);
//   }
//
// The script prints one flat JSON object per run (numbers and strings; see tf_peer.py for the
// cases and keys); times are seconds per call, <mode>_s (median), <mode>_p10, <mode>_p90 and
// <mode>_iters, for the modes eager, function and xla.
//
// Where things are looked up, first found wins:
//   python: $FLOWLET_TF_PYTHON, else ROOT/build/tf-venv/bin/python
//   script: $FLOWLET_TF_PEER_SCRIPT, else ROOT/benchmarks/peers/tf_peer.py
// for ROOT = the `source_root` argument when given, FLOWLET_BENCH_SOURCE_DIR (the project source
// root, defined by benchmarks/meson.build), then the current directory (make runs the benchmarks
// from the source root).
#pragma once

#include <sys/wait.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "harness.hpp"

namespace flowlet_bench {

// One line of tf_peer.py's output: its numbers (true/false as 1/0) and its strings.
struct TfRecord {
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> strings;

  std::optional<double> number(const std::string& key) const {
    auto found = numbers.find(key);
    if (found == numbers.end()) return std::nullopt;
    return found->second;
  }
  // The string under `key`, or "" when there is none.
  std::string string(const std::string& key) const {
    auto found = strings.find(key);
    return found == strings.end() ? std::string() : found->second;
  }
};

// Where the peer's interpreter and script are.
struct TfPeerPaths {
  std::string python;
  std::string script;
};

namespace tf_detail {

// A flat JSON object of strings, numbers, true/false and null (skipped); nothing nested.
class FlatJsonParser {
 public:
  explicit FlatJsonParser(const std::string& text) : text_(text) {}

  bool parse(TfRecord& record, std::string& error) {
    skip_space();
    if (!eat('{')) return fail(error, "expected '{'");
    skip_space();
    if (eat('}')) return at_end(error);
    while (true) {
      skip_space();
      std::string key;
      if (!parse_string(key)) return fail(error, "expected a string key");
      skip_space();
      if (!eat(':')) return fail(error, "expected ':'");
      skip_space();
      if (peek() == '"') {
        std::string value;
        if (!parse_string(value)) return fail(error, "bad string value");
        record.strings[key] = std::move(value);
      } else if (literal("true")) {
        record.numbers[key] = 1;
      } else if (literal("false")) {
        record.numbers[key] = 0;
      } else if (literal("null")) {
        // no value: the key is left out
      } else {
        double value = 0;
        if (!parse_number(value)) return fail(error, "bad value (only flat numbers and strings are read)");
        record.numbers[key] = value;
      }
      skip_space();
      if (eat(',')) continue;
      if (eat('}')) return at_end(error);
      return fail(error, "expected ',' or '}'");
    }
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool eat(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool literal(const char* word) {
    std::string w(word);
    if (text_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }
  bool fail(std::string& error, const char* what) const {
    error = fmt::format("JSON at offset {}: {}", pos_, what);
    return false;
  }
  bool at_end(std::string& error) {
    skip_space();
    return pos_ == text_.size() || fail(error, "text after the object");
  }

  static void append_utf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  bool parse_hex4(uint32_t& code) {
    if (pos_ + 4 > text_.size()) return false;
    auto [end, ec] = std::from_chars(text_.data() + pos_, text_.data() + pos_ + 4, code, 16);
    if (ec != std::errc() || end != text_.data() + pos_ + 4) return false;
    pos_ += 4;
    return true;
  }

  bool parse_string(std::string& out) {
    if (!eat('"')) return false;
    while (pos_ < text_.size()) {
      char c = text_[pos_++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) return false;
      char escape = text_[pos_++];
      switch (escape) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t code = 0;
          if (!parse_hex4(code)) return false;
          if (code >= 0xD800 && code < 0xDC00 && literal("\\u")) {  // a surrogate pair
            uint32_t low = 0;
            if (!parse_hex4(low) || low < 0xDC00 || low >= 0xE000) return false;
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, code);
          break;
        }
        default: return false;
      }
    }
    return false;  // no closing quote
  }

  bool parse_number(double& value) {
    char first = peek();
    if (first != '-' && (first < '0' || first > '9')) return false;  // no inf, nan or hex
    size_t end = pos_;
    while (end < text_.size() && std::string_view("+-.eE0123456789").find(text_[end]) != std::string_view::npos) {
      ++end;
    }
    auto [stop, ec] = std::from_chars(text_.data() + pos_, text_.data() + end, value);
    if (ec != std::errc() || stop != text_.data() + end) return false;
    pos_ = end;
    return true;
  }

  const std::string& text_;
  size_t pos_ = 0;
};

// 'text' for the shell, with any ' inside kept.
inline std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

inline std::vector<std::filesystem::path> candidate_roots(const std::string& source_root) {
  std::vector<std::filesystem::path> roots;
  if (!source_root.empty()) roots.emplace_back(source_root);
#ifdef FLOWLET_BENCH_SOURCE_DIR
  roots.emplace_back(FLOWLET_BENCH_SOURCE_DIR);
#endif
  roots.emplace_back(".");
  return roots;
}

// The first ROOT/relative that exists, or the environment variable's value when it is set.
inline std::optional<std::string> locate(const char* env_name, const std::string& relative,
                                         const std::string& source_root, std::string& why) {
  if (const char* from_env = std::getenv(env_name); from_env && *from_env) {
    std::error_code ec;
    if (std::filesystem::exists(from_env, ec)) return std::string(from_env);
    why = fmt::format("{}={} does not exist", env_name, from_env);
    return std::nullopt;
  }
  std::vector<std::string> tried;
  for (const auto& root : candidate_roots(source_root)) {
    std::filesystem::path path = root / relative;
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) return path.string();
    tried.push_back(path.string());
  }
  why = fmt::format("no {} (tried {}", relative, tried.front());
  for (size_t i = 1; i < tried.size(); ++i) why += ", " + tried[i];
  why += ")";
  return std::nullopt;
}

inline std::string last_nonempty_line(const std::string& text) {
  size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return {};
  size_t start = text.rfind('\n', end);
  start = start == std::string::npos ? 0 : start + 1;
  std::string line = text.substr(start, end + 1 - start);
  return line.size() > 200 ? line.substr(0, 200) + "..." : line;
}

}  // namespace tf_detail

// Parses one flat JSON object; nullopt (and the reason in *why) if it is not one.
inline std::optional<TfRecord> parse_flat_json(const std::string& text, std::string* why = nullptr) {
  TfRecord record;
  std::string error;
  if (!tf_detail::FlatJsonParser(text).parse(record, error)) {
    if (why) *why = error;
    return std::nullopt;
  }
  return record;
}

// The venv's python and tf_peer.py, or nullopt with the reason in *why.
inline std::optional<TfPeerPaths> find_tf_peer(std::string* why = nullptr, const std::string& source_root = "") {
  std::string reason;
  auto python = tf_detail::locate("FLOWLET_TF_PYTHON", "build/tf-venv/bin/python", source_root, reason);
  if (!python) {
    if (why) *why = reason + "; run benchmarks/peers/setup_tf_venv.sh";
    return std::nullopt;
  }
  auto script = tf_detail::locate("FLOWLET_TF_PEER_SCRIPT", "benchmarks/peers/tf_peer.py", source_root, reason);
  if (!script) {
    if (why) *why = reason;
    return std::nullopt;
  }
  return TfPeerPaths{*python, *script};
}

// Runs `tf_peer.py args...` and returns its JSON line, or nullopt with the reason in *why (no
// venv, no script, TensorFlow missing or failing, no JSON line). Blocks while TensorFlow measures:
// a few seconds to a minute per case.
inline std::optional<TfRecord> run_tf_peer(const std::vector<std::string>& args, std::string* why = nullptr,
                                           const std::string& source_root = "") {
  auto paths = find_tf_peer(why, source_root);
  if (!paths) return std::nullopt;
  std::string command = tf_detail::shell_quote(paths->python) + " " + tf_detail::shell_quote(paths->script);
  for (const auto& arg : args) command += " " + tf_detail::shell_quote(arg);
  command += " 2>&1";  // TensorFlow's stderr comes back too, to explain a failure

  std::fflush(nullptr);  // nothing of ours is printed twice by the child
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    if (why) *why = "popen failed";
    return std::nullopt;
  }
  std::string output;
  char buffer[4096];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, got);
  int status = pclose(pipe);

  // The script's one JSON line is the last line that starts with '{'.
  std::optional<TfRecord> record;
  std::string parse_error = "no JSON line in its output";
  for (size_t start = 0; start < output.size();) {
    size_t end = output.find('\n', start);
    if (end == std::string::npos) end = output.size();
    if (output.compare(start, 1, "{") == 0) {
      auto parsed = parse_flat_json(output.substr(start, end - start), &parse_error);
      if (parsed) record = std::move(parsed);
    }
    start = end + 1;
  }
  if (record && record->strings.count("error")) {
    if (why) *why = "tf_peer.py: " + record->string("error");
    return std::nullopt;
  }
  bool exited_ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!record || !exited_ok) {
    if (why) {
      std::string how = status == -1           ? std::string("could not be waited for")
                        : WIFEXITED(status)    ? fmt::format("exit {}", WEXITSTATUS(status))
                        : WIFSIGNALED(status) ? fmt::format("signal {}", WTERMSIG(status))
                                               : std::string("stopped");
      std::string last = tf_detail::last_nonempty_line(output);
      *why = fmt::format("tf_peer.py {}: {}{}{}", args.empty() ? "" : args.front(), exited_ok ? parse_error : how,
                         last.empty() ? "" : ": ", last);
    }
    return std::nullopt;
  }
  return record;
}

// A harness Result from one mode ("eager", "function", "xla") of a record: the median, p10 and
// p90 in seconds become nanoseconds. Missing mode: a Result with the reason ("xla: ..." when the
// script said why XLA failed).
inline Result tf_result(const TfRecord& record, const std::string& mode, std::string name) {
  auto median = record.number(mode + "_s");
  if (!median) {
    std::string error = record.string(mode + "_error");
    return unavailable(std::move(name), error.empty() ? "not reported by tf_peer.py" : "failed: " + error);
  }
  Stats stats;
  stats.median_ns = *median * 1e9;
  stats.p10_ns = record.number(mode + "_p10").value_or(*median) * 1e9;
  stats.p90_ns = record.number(mode + "_p90").value_or(*median) * 1e9;
  stats.iterations = static_cast<int64_t>(record.number(mode + "_iters").value_or(0));
  stats.samples = static_cast<int>(record.number("samples").value_or(0));
  return Result{std::move(name), stats, {}};
}

// A row for a result measured outside the harness (a time), in Section's layout.
inline void print_peer_row(const Result& result) {
  if (!result.stats) {
    fmt::print("   {:<32} {}\n", result.name, result.missing);
    return;
  }
  const Stats& s = *result.stats;
  fmt::print("   {:<32} {:>12}  [{}, {}]  ({} calls x {} samples, in tf_peer.py)\n", result.name,
             format_time_ns(s.median_ns), format_time_ns(s.p10_ns), format_time_ns(s.p90_ns), s.iterations,
             s.samples);
}

inline void print_tf_unavailable(const std::string& why) {
  fmt::print("   TensorFlow peer: not available ({})\n", why);
}

// "   TensorFlow 2.20.0 (Python 3.11.7, numpy 2.2.6), run as a subprocess: ..." or the reason it is
// not available. Returns whether the peer works, so a benchmark can skip its TensorFlow rows.
inline bool print_tf_setup(const std::string& source_root = "") {
  std::string why;
  auto versions = run_tf_peer({"versions"}, &why, source_root);
  if (!versions) {
    print_tf_unavailable(why);
    return false;
  }
  auto paths = find_tf_peer(nullptr, source_root);
  fmt::print("   TensorFlow {} (Python {}, numpy {}), run as a subprocess: {}\n", versions->string("tensorflow"),
             versions->string("python"), versions->string("numpy"), paths ? paths->python : "?");
  return true;
}

}  // namespace flowlet_bench
