// flowlet-bench's command line (options.hpp): shapes, the sweep syntax, dtypes, devices, --attr,
// --modes, and the help text that documents them.
#include "options.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

namespace flowlet_bench {
namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

int64_t parse_int(const std::string& text, const std::string& what) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || ptr != end || text.empty()) {
    throw UsageError(fmt::format("{}: expected an integer, got '{}'", what, text));
  }
  return value;
}

flowlet::DType parse_dtype(const std::string& text) {
  for (int i = 0; i < flowlet::kNumDTypes; ++i) {
    const auto dtype = static_cast<flowlet::DType>(i);
    if (flowlet::dtype_name(dtype) == text) return dtype;
  }
  throw UsageError(fmt::format("--dtype: unknown dtype '{}'; flowlet has f32, f64, i32, i64, u8, b8, f16, bf16", text));
}

// "64:4096:x2" (multiply) or "64:512:+64" (add): the values of the sweep, first to last inclusive.
std::vector<int64_t> parse_sweep(const std::string& text) {
  const auto parts = split(text, ':');
  if (parts.size() != 3 || parts[2].size() < 2 || (parts[2][0] != 'x' && parts[2][0] != '+')) {
    throw UsageError(fmt::format("--sweep: expected FIRST:LAST:xFACTOR or FIRST:LAST:+STEP, got '{}'", text));
  }
  const int64_t first = parse_int(parts[0], "--sweep first");
  const int64_t last = parse_int(parts[1], "--sweep last");
  const int64_t step = parse_int(parts[2].substr(1), "--sweep step");
  const bool multiply = parts[2][0] == 'x';
  if (first < 1 || last < first || (multiply ? step < 2 : step < 1)) {
    throw UsageError(fmt::format("--sweep: need 1 <= FIRST <= LAST and a factor >= 2 or a step >= 1, got '{}'", text));
  }
  std::vector<int64_t> values;
  for (int64_t v = first; v <= last; v = multiply ? v * step : v + step) values.push_back(v);
  return values;
}

std::string replace_all(std::string text, char from, const std::string& to) {
  std::string out;
  for (char c : text) {
    if (c == from) {
      out += to;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

flowlet::Shape parse_shape(const std::string& text) {
  if (text == "scalar") return flowlet::Shape{};
  flowlet::Shape shape;
  for (const std::string& dim : split(text, 'x')) shape.push_back(parse_int(dim, fmt::format("--shapes '{}'", text)));
  return shape;
}

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::eager: return "eager";
    case Mode::traced: return "traced";
    case Mode::fused: return "fused";
    case Mode::torch: return "torch";
  }
  return "?";
}

const std::string* Attributes::find(const std::string& key) const {
  const auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

int64_t Attributes::get_int(const std::string& key, int64_t fallback) const {
  const std::string* v = find(key);
  return v == nullptr ? fallback : parse_int(*v, "--attr " + key);
}

double Attributes::get_double(const std::string& key, double fallback) const {
  const std::string* v = find(key);
  if (v == nullptr) return fallback;
  try {
    size_t used = 0;
    const double value = std::stod(*v, &used);
    if (used == v->size()) return value;
  } catch (const std::exception&) {
  }
  throw UsageError(fmt::format("--attr {}: expected a number, got '{}'", key, *v));
}

bool Attributes::get_bool(const std::string& key, bool fallback) const {
  const std::string* v = find(key);
  if (v == nullptr) return fallback;
  if (*v == "true" || *v == "1") return true;
  if (*v == "false" || *v == "0") return false;
  throw UsageError(fmt::format("--attr {}: expected true or false, got '{}'", key, *v));
}

std::vector<int64_t> Attributes::get_ints(const std::string& key, std::vector<int64_t> fallback) const {
  const std::string* v = find(key);
  if (v == nullptr) return fallback;
  std::vector<int64_t> values;
  for (const std::string& part : split(*v, ':')) values.push_back(parse_int(part, "--attr " + key));
  return values;
}

std::string Attributes::get_string(const std::string& key, std::string fallback) const {
  const std::string* v = find(key);
  return v == nullptr ? fallback : *v;
}

void Attributes::check_all_read(const std::string& op, const std::vector<std::string>& known) const {
  for (const auto& [key, value] : values_) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      throw UsageError(fmt::format("--attr {}: {} takes no such attribute; it takes: {}", key, op,
                                   known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", "))));
    }
  }
}

std::string Attributes::text() const {
  std::vector<std::string> parts;
  for (const auto& [key, value] : values_) parts.push_back(key + "=" + value);
  return fmt::format("{}", fmt::join(parts, ","));
}

std::string usage_text() {
  return R"(flowlet-bench: time one op of flowlet's registry (Google Benchmark rows)

usage: flowlet-bench OP [--shapes S] [--sweep FIRST:LAST:xF|+S] [--dtype D[,D..]] [--device DEV[,DEV..]]
                     [--attr KEY=VALUE].. [--modes eager,traced,fused,torch] [--recalibrate]
                     [--benchmark_* flags of Google Benchmark]
       flowlet-bench --list | --help

  --shapes S     input shapes of one call, ',' between inputs, 'x' between dimensions, ';' between
                 cases: --shapes "1024x1024,1024x1024;512x512,512x512". 'scalar' is rank 0.
                 The letter N stands for the swept size.
  --sweep R      repeat the case for N = FIRST, FIRST*F, ... <= LAST (xF) or FIRST, FIRST+S, ... (+S):
                 --shapes NxN,NxN --sweep 64:4096:x2
  --dtype D      f32 (default), f64, i32, i64, u8, b8, f16, bf16; a list runs each
  --device DEV   cpu (default), cuda:0, ...; a list runs each
  --attr K=V     an attribute of the op, lists ':' separated (--attr axes=0:1). Ops and their keys:
                 sum/max: axes, keepdims   argmax: axis   softmax/log_softmax: axis   cast: dtype
                 reshape: shape (2x8)   permute: perm   slice: axis,start,length   concat: axis
                 one_hot: depth   scatter_add: rows   conv2d: stride, padding (or same), dilation, groups
                 max_pool2d/avg_pool2d: kernel, stride, padding, count_include_pad
                 layer_norm: eps, normalized_dims   batch_norm_training/_inference: eps   dropout: rate
  --modes M      which rows: eager (one call per iteration), traced (trace(), graph passes off),
                 fused (trace() with the passes, fusion included), torch (libtorch, when built with it).
                 Default: all (torch only where the op maps to libtorch and it was found).
  --list         every op with the dtypes it runs on cpu (probed) and its device kinds
  --recalibrate  measure this machine's roofline again (cached per CPU model and thread count in
                 $XDG_CACHE_HOME/flowlet/roofline.json, else ~/.cache/flowlet/roofline.json)

Each row reports time, bytes_per_second (inputs + outputs once), flops (the op's FLOP count per
second, where it has one) and roofline_pct: the time the roofline allows (max of bytes / peak
bandwidth, flops / peak FLOP/s) over the time measured, in percent. Threads: FLOWLET_NUM_THREADS
(libtorch gets the same count). Bad ops, shapes, dtypes and attributes exit with status 2 and the
op's own error message. Examples:
  flowlet-bench matmul --shapes 1024x1024,1024x1024 --dtype f32 --device cpu
  flowlet-bench add --shapes N,N --sweep 1024:1048576:x4 --benchmark_format=json
  flowlet-bench conv2d --shapes 32x64x56x56,64x64x3x3 --attr padding=1
)";
}

Options parse_options(int& argc, char** argv) {
  Options options;
  std::vector<char*> rest{argv[0]};
  std::string shapes_text;
  std::string sweep_text;
  auto value_of = [&](int& i, const char* flag) -> std::string {
    const size_t length = std::strlen(flag);
    if (std::strncmp(argv[i], flag, length) == 0 && argv[i][length] == '=') return argv[i] + length + 1;
    if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", flag));
    return argv[++i];
  };
  auto is = [&](int i, const char* flag) {
    const size_t length = std::strlen(flag);
    return std::strncmp(argv[i], flag, length) == 0 && (argv[i][length] == '\0' || argv[i][length] == '=');
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--benchmark_", 0) == 0) {
      rest.push_back(argv[i]);
    } else if (arg == "--list") {
      options.list = true;
    } else if (arg == "--help" || arg == "-h") {
      options.help = true;
    } else if (arg == "--recalibrate") {
      options.recalibrate = true;
    } else if (is(i, "--shapes")) {
      shapes_text = value_of(i, "--shapes");
    } else if (is(i, "--sweep")) {
      sweep_text = value_of(i, "--sweep");
    } else if (is(i, "--dtype")) {
      options.dtypes.clear();
      for (const std::string& d : split(value_of(i, "--dtype"), ',')) options.dtypes.push_back(parse_dtype(d));
    } else if (is(i, "--device")) {
      options.devices.clear();
      for (const std::string& d : split(value_of(i, "--device"), ',')) {
        try {
          options.devices.push_back(flowlet::Device(d));
        } catch (const flowlet::Error& e) {
          throw UsageError(fmt::format("--device: {}", e.what()));
        }
      }
    } else if (is(i, "--attr")) {
      const std::string kv = value_of(i, "--attr");
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) throw UsageError(fmt::format("--attr: expected KEY=VALUE, got '{}'", kv));
      options.attributes.set(kv.substr(0, eq), kv.substr(eq + 1));
    } else if (is(i, "--modes")) {
      options.modes.clear();
      options.modes_given = true;
      for (const std::string& m : split(value_of(i, "--modes"), ',')) {
        if (m == "eager") options.modes.push_back(Mode::eager);
        else if (m == "traced") options.modes.push_back(Mode::traced);
        else if (m == "fused") options.modes.push_back(Mode::fused);
        else if (m == "torch") options.modes.push_back(Mode::torch);
        else throw UsageError(fmt::format("--modes: unknown mode '{}'; modes: eager, traced, fused, torch", m));
      }
    } else if (arg.rfind("-", 0) == 0) {
      throw UsageError(fmt::format("unknown option '{}'", arg));
    } else if (options.op.empty()) {
      options.op = arg;
    } else {
      throw UsageError(fmt::format("one op per run; got '{}' and '{}'", options.op, arg));
    }
  }
  if (!options.list && !options.help && options.op.empty()) throw UsageError("name an op (--list shows them)");

  // Cases: each ';' group, once per sweep value when it contains N.
  std::vector<int64_t> sweep;
  if (!sweep_text.empty()) {
    sweep = parse_sweep(sweep_text);
    if (shapes_text.find('N') == std::string::npos) {
      throw UsageError(fmt::format("--sweep needs the letter N in --shapes to stand for the swept size; got --shapes '{}'",
                                   shapes_text));
    }
  } else if (shapes_text.find('N') != std::string::npos) {
    throw UsageError(fmt::format("--shapes '{}' uses N but no --sweep gives its values", shapes_text));
  }
  if (!shapes_text.empty()) {
    for (const std::string& group : split(shapes_text, ';')) {
      const std::vector<std::string> texts =
          sweep.empty() ? std::vector<std::string>{group} : std::vector<std::string>{};
      std::vector<std::string> expanded = texts;
      for (int64_t n : sweep) expanded.push_back(replace_all(group, 'N', std::to_string(n)));
      for (const std::string& text : expanded) {
        std::vector<flowlet::Shape> shapes;
        for (const std::string& s : split(text, ',')) shapes.push_back(parse_shape(s));
        options.shape_groups.push_back(std::move(shapes));
        options.shape_texts.push_back(text);
      }
    }
  }
  argc = static_cast<int>(rest.size());
  for (size_t i = 0; i < rest.size(); ++i) argv[i] = rest[i];
  return options;
}

}  // namespace flowlet_bench
