// A timeline of one traced training step: the MLP of the demo (784-256-10, ReLU, Adam) on random
// data, traced with TraceOptions::collect_step_stats, run for a few steps; the last step's node
// timings are written as Chrome/Perfetto trace-event JSON (open it in ui.perfetto.dev or
// chrome://tracing) and drawn as an SVG Gantt chart: one row per executor thread, one bar per node.
//
//   timeline [--out DIR] [--steps N]        (FLOWLET_NUM_THREADS sets the thread pool size)
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "error_text.hpp"

namespace fl = flowlet;

namespace {

struct Options {
  std::string out = "build/demo";
  int steps = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw fl::InvalidArgument("timeline: " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--out") o.out = value();
    else if (arg == "--steps") o.steps = std::stoi(value());
    else throw fl::InvalidArgument("timeline: unknown option " + arg);
  }
  if (o.steps < 1) throw fl::InvalidArgument("timeline: --steps must be >= 1");
  return o;
}

// One node run, as timeline_json() writes it (times in µs since the step began).
struct Event {
  std::string name, cat;
  double ts = 0, dur = 0;
  int tid = 0;
  bool metadata = false;  // "ph":"M" (the name of a device's timeline process)
};

// Reads the flat trace-event objects of timeline_json(): {"key":"string" or number, ...} each.
// Enough for that output, not a general JSON parser.
std::vector<Event> parse_trace_events(std::string_view json) {
  std::vector<Event> events;
  size_t i = json.find("\"traceEvents\"");
  if (i == std::string_view::npos) throw fl::InvalidArgument("timeline: no traceEvents in the JSON");
  i = json.find('[', i);
  auto fail = [&](const char* what) {
    throw fl::InvalidArgument(fmt::format("timeline: bad trace JSON at offset {}: {}", i, what));
  };
  auto skip_space = [&] {
    while (i < json.size() && std::isspace(static_cast<unsigned char>(json[i]))) ++i;
  };
  auto read_string = [&] {
    if (i >= json.size() || json[i] != '"') fail("expected a string");
    std::string s;
    for (++i; i < json.size() && json[i] != '"'; ++i) {
      if (json[i] == '\\' && i + 1 < json.size()) {
        ++i;
        const char c = json[i];
        s += c == 'n' ? '\n' : c == 't' ? '\t' : c;  // \" \\ \/ and the rest literally
      } else {
        s += json[i];
      }
    }
    if (i >= json.size()) fail("unterminated string");
    ++i;
    return s;
  };
  for (++i;;) {
    skip_space();
    if (i >= json.size()) fail("unterminated array");
    if (json[i] == ']') break;
    if (json[i] == ',') {
      ++i;
      continue;
    }
    if (json[i] != '{') fail("expected an object");
    ++i;
    Event e;
    for (;;) {
      skip_space();
      if (i < json.size() && json[i] == ',') ++i, skip_space();
      if (i < json.size() && json[i] == '}') {
        ++i;
        break;
      }
      const std::string key = read_string();
      skip_space();
      if (i >= json.size() || json[i] != ':') fail("expected ':'");
      ++i;
      skip_space();
      if (i < json.size() && json[i] == '"') {
        std::string value = read_string();
        if (key == "name") e.name = std::move(value);
        else if (key == "cat") e.cat = std::move(value);
        else if (key == "ph") e.metadata = value == "M";
      } else if (i < json.size() && json[i] == '{') {  // a metadata event's args: {"name":"cpu:1"}
        i = json.find('}', i);
        if (i == std::string_view::npos) fail("unterminated object");
        ++i;
      } else {
        const size_t end = json.find_first_of(",}", i);
        if (end == std::string_view::npos) fail("unterminated number");
        const double value = std::stod(std::string(json.substr(i, end - i)));
        if (key == "ts") e.ts = value;
        else if (key == "dur") e.dur = value;
        else if (key == "tid") e.tid = static_cast<int>(value);
        i = end;
      }
    }
    if (!e.metadata) events.push_back(std::move(e));  // device names label nothing in this chart
  }
  return events;
}

// Colour groups of the chart, by op name (the event's category).
struct Group {
  const char* label;
  const char* color;
};
constexpr Group kGroups[] = {
    {"matmul", "#4e79a7"},
    {"elementwise / fused", "#f28e2b"},
    {"reductions / softmax", "#59a14f"},
    {"variable read / update", "#b07aa1"},
    {"other", "#9d9d9d"},
};

int group_of(const Event& e) {
  const std::string_view op = e.cat;
  auto starts = [](std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; };
  if (starts(op, "assign_") || starts(op, "read_") || starts(e.name, "assign_") || starts(e.name, "read_")) return 3;
  if (op == "matmul") return 0;
  static const std::vector<std::string_view> elementwise{
      "add",  "sub",  "mul",     "div",  "pow", "maximum", "minimum", "neg",       "exp",   "log",      "sqrt",
      "tanh", "sigmoid", "relu", "abs",  "square", "equal", "not_equal", "less", "less_equal", "greater",
      "greater_equal", "where", "cast"};
  if (starts(op, "fused") || std::find(elementwise.begin(), elementwise.end(), op) != elementwise.end()) return 1;
  static const std::vector<std::string_view> reductions{"sum", "mean", "max", "argmax", "softmax", "log_softmax",
                                                        "softmax_cross_entropy"};
  if (std::find(reductions.begin(), reductions.end(), op) != reductions.end()) return 2;
  return 4;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// 1, 2 or 5 times a power of ten, so that `span` holds about `target` ticks.
double nice_step(double span, int target) {
  const double raw = span / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10.0 * power;
}

// The Gantt chart: a row per thread, a bar per node, the time axis in µs, a legend below.
void write_timeline_svg(const std::string& path, const std::string& heading, const std::vector<Event>& events) {
  constexpr double kWidth = 1200, kLeft = 80, kRight = 20, kTop = 44, kRow = 30, kBar = 22;
  std::vector<int> threads;
  for (const Event& e : events) threads.push_back(e.tid);
  std::sort(threads.begin(), threads.end());
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
  std::map<int, size_t> row_of;
  for (size_t r = 0; r < threads.size(); ++r) row_of[threads[r]] = r;

  const double t0 = 0;  // times count from the start of the step
  double t1 = 0;
  for (const Event& e : events) t1 = std::max(t1, e.ts + e.dur);
  const double step = nice_step(std::max(t1 - t0, 1e-3), 10);
  const double axis_end = std::ceil((t1 - t0) / step) * step;
  const double plot = kWidth - kLeft - kRight;
  auto x_of = [&](double us) { return kLeft + plot * (us - t0) / axis_end; };
  const double rows_bottom = kTop + kRow * static_cast<double>(threads.size());
  const double legend_y = rows_bottom + 52;
  const double height = legend_y + 28;

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">{3}</text>\n",
      kWidth, height, kWidth / 2, xml_escape(heading));
  // Grid lines and tick labels of the time axis.
  for (double t = 0; t <= axis_end + step * 1e-6; t += step) {
    const double x = kLeft + plot * t / axis_end;
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e0e0e0\"/>\n", x, kTop - 4,
                       rows_bottom);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>\n", x, rows_bottom + 16, t);
  }
  svg += fmt::format("<line x1=\"{0}\" y1=\"{2}\" x2=\"{1}\" y2=\"{2}\" stroke=\"black\"/>\n", kLeft, kLeft + plot,
                     rows_bottom);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">time since the step began (µs)</text>\n",
                     kLeft + plot / 2, rows_bottom + 34);
  for (size_t r = 0; r < threads.size(); ++r) {
    const double y = kTop + kRow * static_cast<double>(r);
    if (r % 2 == 1) {
      svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f6f6f6\"/>\n", kLeft, y, plot, kRow);
    }
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">thread {}</text>\n", kLeft - 8, y + kRow / 2 + 4,
                       threads[r]);
  }
  // The bars; a name is written on its bar when it fits (about 6.5 px per character at 11 px).
  for (const Event& e : events) {
    const double y = kTop + kRow * static_cast<double>(row_of[e.tid]) + (kRow - kBar) / 2;
    const double x = x_of(e.ts), w = std::max(plot * e.dur / axis_end, 0.8);
    svg += fmt::format(
        "<g><title>{} ({}): {:.1f} µs at {:.1f} µs, thread {}</title><rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" "
        "height=\"{}\" fill=\"{}\" stroke=\"white\" stroke-width=\"0.5\"/>",
        xml_escape(e.name), xml_escape(e.cat), e.dur, e.ts - t0, e.tid, x, y, w, kBar, kGroups[group_of(e)].color);
    if (w >= 6.5 * static_cast<double>(e.name.size()) + 6) {
      svg += fmt::format("<text x=\"{:.2f}\" y=\"{}\" text-anchor=\"middle\" font-size=\"11\" fill=\"white\">{}</text>",
                         x + w / 2, y + kBar / 2 + 4, xml_escape(e.name));
    }
    svg += "</g>\n";
  }
  double lx = kLeft;
  for (const Group& g : kGroups) {
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\"/>\n", lx, legend_y - 11, g.color);
    svg += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", lx + 20, legend_y, g.label);
    lx += 40 + 7.0 * static_cast<double>(std::string_view(g.label).size());
  }
  svg += "</svg>\n";
  std::ofstream(path) << svg;
}

int run(const Options& o) {
  fl::nn::Sequential model;
  model.add<fl::nn::Linear>(784, 256, /*seed=*/1, "hidden");
  model.add([](const fl::Tensor& x) { return fl::relu(x); });
  model.add<fl::nn::Linear>(256, 10, /*seed=*/2, "logits");
  const std::vector<fl::Variable> params = model.parameters();
  fl::optim::Adam optimizer(1e-3);

  fl::TraceOptions trace_options;
  trace_options.name = "training step";
  trace_options.collect_step_stats = true;  // every call records each node's start, end and thread
  auto step = fl::trace(
      [&](fl::Tensor x, fl::Tensor y) {
        fl::GradientTape tape;
        fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(model(x), y));
        optimizer.apply(tape.gradient(loss, params), params);
        return loss;
      },
      trace_options);

  constexpr int64_t kBatch = 256;
  const fl::Tensor x = fl::randn({kBatch, 784}, /*seed=*/7);
  const fl::Tensor i = fl::arange(kBatch);  // i64
  const fl::Tensor y = i - (i / 10) * 10;    // labels 0..9
  float first_loss = 0, last_loss = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < o.steps; ++s) {  // the first call traces; the timeline is the last one's
    last_loss = step(x, y).item<float>();
    if (s == 0) first_loss = last_loss;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const std::string json = step.timeline_json();
  const std::vector<Event> events = parse_trace_events(json);
  if (events.empty()) throw fl::InvalidArgument("timeline: the step recorded no nodes");
  double step_us = 0, busy_us = 0;  // ts counts from the start of the step
  std::vector<int> threads;
  for (const Event& e : events) {
    step_us = std::max(step_us, e.ts + e.dur);
    busy_us += e.dur;
    if (std::find(threads.begin(), threads.end(), e.tid) == threads.end()) threads.push_back(e.tid);
  }

  std::filesystem::create_directories(o.out);
  const std::string json_path = o.out + "/timeline.json", svg_path = o.out + "/timeline.svg";
  std::ofstream(json_path) << json << '\n';
  write_timeline_svg(svg_path,
                     fmt::format("flowlet: one traced training step (MLP 784-256-10, Adam, batch {}), {} nodes, {:.0f} µs",
                                 kBatch, events.size(), step_us),
                     events);
  fmt::print("{} steps in {:.3f} s (the first traces), loss {:.4f} -> {:.4f}\n", o.steps, seconds, first_loss, last_loss);
  fmt::print("last step: {} nodes on {} thread(s), step time {:.1f} µs (node time summed {:.1f} µs)\n", events.size(),
             threads.size(), step_us, busy_us);
  fmt::print("wrote {} (open in ui.perfetto.dev or chrome://tracing) and {}\n", json_path, svg_path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_reporting_errors("timeline", [&] { return run(parse(argc, argv)); }, /*progress_bar=*/false);
}
