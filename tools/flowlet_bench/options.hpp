// flowlet-bench's command line: what to run (op, shapes or a sweep, dtypes, devices, attributes,
// modes) parsed from argv; Google Benchmark's own --benchmark_* flags are left for it.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowlet/flowlet.hpp"

namespace flowlet_bench {

// A command-line mistake: printed with the usage hint, exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --attr key=value pairs, read by the op's table entry (op_table.cpp).
class Attributes {
 public:
  void set(const std::string& key, const std::string& value) { values_[key] = value; }
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  // "1:0:2" (':' separated, since ',' separates shapes) or one number.
  std::vector<int64_t> get_ints(const std::string& key, std::vector<int64_t> fallback) const;
  std::string get_string(const std::string& key, std::string fallback) const;
  // UsageError naming the keys the op did not read, and those it takes.
  void check_all_read(const std::string& op, const std::vector<std::string>& known) const;
  // "axes=1,keepdims=true" (sorted), for benchmark names; empty without attributes.
  std::string text() const;
  bool empty() const { return values_.empty(); }

 private:
  const std::string* find(const std::string& key) const;
  std::map<std::string, std::string> values_;
};

enum class Mode { eager, traced, fused, torch };
const char* mode_name(Mode mode);

struct Options {
  std::string op;
  // One entry per benchmarked case: the input shapes of one call.
  std::vector<std::vector<flowlet::Shape>> shape_groups;
  std::vector<std::string> shape_texts;  // as written (after sweep substitution), for names
  std::vector<flowlet::DType> dtypes{flowlet::f32};
  std::vector<flowlet::Device> devices{flowlet::Device()};
  std::vector<Mode> modes{Mode::eager, Mode::traced, Mode::fused, Mode::torch};
  bool modes_given = false;  // torch is skipped silently unless asked for by --modes
  Attributes attributes;
  bool list = false;
  bool help = false;
  bool recalibrate = false;
};

// Parses argv, removing what it consumed so that Google Benchmark sees only its own flags.
// UsageError on anything malformed.
Options parse_options(int& argc, char** argv);

std::string usage_text();

// "1024x1024" -> [1024, 1024]; "scalar" -> []. UsageError otherwise.
flowlet::Shape parse_shape(const std::string& text);

}  // namespace flowlet_bench
