// Writes line charts as a standalone SVG file (no plotting dependency): one panel per series
// (write_svg_chart), or several curves of (x, y) points in one panel with a legend (write_svg_xy_chart).
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace examples {

struct Series {
  std::string title;   // e.g. "train loss"
  std::string color;   // any SVG color
  std::vector<double> values;  // one per epoch (x = 1, 2, ...)
};

// Panels side by side, each with its own y range, axes, ticks at every epoch and the values.
inline void write_svg_chart(const std::string& path, const std::string& heading, const std::vector<Series>& series) {
  constexpr double kPanelWidth = 360, kPanelHeight = 240, kMargin = 48, kTop = 40;
  const double width = kPanelWidth * static_cast<double>(series.size());
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">{3}</text>\n",
      width, kPanelHeight + kTop, width / 2, heading);
  for (size_t p = 0; p < series.size(); ++p) {
    const auto& s = series[p];
    if (s.values.empty()) continue;
    const double left = kPanelWidth * static_cast<double>(p) + kMargin;
    const double right = kPanelWidth * static_cast<double>(p + 1) - 16;
    const double top = kTop + 10, bottom = kTop + kPanelHeight - kMargin + 10;
    double lo = *std::min_element(s.values.begin(), s.values.end());
    double hi = *std::max_element(s.values.begin(), s.values.end());
    if (hi - lo < 1e-12) {
      lo -= 0.5;
      hi += 0.5;
    }
    const double pad = (hi - lo) * 0.1;
    lo -= pad;
    hi += pad;
    const size_t n = s.values.size();
    auto x_of = [&](size_t i) { return n == 1 ? (left + right) / 2 : left + (right - left) * static_cast<double>(i) / static_cast<double>(n - 1); };
    auto y_of = [&](double v) { return bottom - (bottom - top) * (v - lo) / (hi - lo); };
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (left + right) / 2, top - 4, s.title);
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", left, top, bottom);
    svg += fmt::format("<line x1=\"{0}\" y1=\"{2}\" x2=\"{1}\" y2=\"{2}\" stroke=\"black\"/>\n", left, right, bottom);
    for (int k = 0; k <= 4; ++k) {  // y ticks
      const double v = lo + (hi - lo) * k / 4.0;
      svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.3g}</text>\n", left - 4, y_of(v) + 4, v);
    }
    std::string points;
    for (size_t i = 0; i < n; ++i) {
      points += fmt::format("{:.1f},{:.1f} ", x_of(i), y_of(s.values[i]));
      svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x_of(i), bottom + 16, i + 1);
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x_of(i), y_of(s.values[i]), s.color);
    }
    svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", points, s.color);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">epoch</text>\n", (left + right) / 2, bottom + 32);
  }
  svg += "</svg>\n";
  std::ofstream(path) << svg;
}

// A curve of (x, y) points for write_svg_xy_chart.
struct XYSeries {
  std::string title;  // the legend's text
  std::string color;
  std::vector<double> x, y;  // the same length
};

// One panel: every curve over shared axes (x and y ranges cover all points), a legend at the right,
// and a dashed horizontal line at `marker_y` (a target) unless it is NaN.
inline void write_svg_xy_chart(const std::string& path, const std::string& heading, const std::string& x_label,
                               const std::string& y_label, const std::vector<XYSeries>& series,
                               double marker_y = std::nan("")) {
  constexpr double kWidth = 720, kHeight = 420, kLeft = 64, kRight = 170, kTop = 40, kBottom = 48;
  double x_lo = 0, x_hi = 0, y_lo = 0, y_hi = 0;
  bool any = false;
  for (const auto& s : series) {
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!any) x_lo = x_hi = s.x[i], y_lo = y_hi = s.y[i], any = true;
      x_lo = std::min(x_lo, s.x[i]), x_hi = std::max(x_hi, s.x[i]);
      y_lo = std::min(y_lo, s.y[i]), y_hi = std::max(y_hi, s.y[i]);
    }
  }
  if (any && !std::isnan(marker_y)) y_lo = std::min(y_lo, marker_y), y_hi = std::max(y_hi, marker_y);
  if (x_hi - x_lo < 1e-12) x_hi = x_lo + 1;
  if (y_hi - y_lo < 1e-12) y_lo -= 0.5, y_hi += 0.5;
  const double y_pad = (y_hi - y_lo) * 0.05;
  y_lo -= y_pad, y_hi += y_pad;
  const double left = kLeft, right = kWidth - kRight, top = kTop, bottom = kHeight - kBottom;
  auto x_of = [&](double v) { return left + (right - left) * (v - x_lo) / (x_hi - x_lo); };
  auto y_of = [&](double v) { return bottom - (bottom - top) * (v - y_lo) / (y_hi - y_lo); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">{3}</text>\n",
      kWidth, kHeight, (left + right) / 2, heading);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", left, top, bottom);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{2}\" x2=\"{1}\" y2=\"{2}\" stroke=\"black\"/>\n", left, right, bottom);
  for (int k = 0; k <= 5; ++k) {
    const double xv = x_lo + (x_hi - x_lo) * k / 5.0, yv = y_lo + (y_hi - y_lo) * k / 5.0;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.3g}</text>\n", x_of(xv), bottom + 16, xv);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:.3g}</text>\n", left - 4, y_of(yv) + 4, yv);
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>\n", left,
                       y_of(yv), right);
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (left + right) / 2, bottom + 36, x_label);
  svg += fmt::format("<text x=\"14\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {0})\">{1}</text>\n",
                     (top + bottom) / 2, y_label);
  if (!std::isnan(marker_y)) {
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#555\" stroke-dasharray=\"6 4\"/>\n"
                       "<text x=\"{2}\" y=\"{3:.1f}\" text-anchor=\"end\" fill=\"#555\">{4:.3g}</text>\n",
                       left, y_of(marker_y), right, y_of(marker_y) - 4, marker_y);
  }
  for (size_t p = 0; p < series.size(); ++p) {
    const auto& s = series[p];
    std::string points;
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      points += fmt::format("{:.1f},{:.1f} ", x_of(s.x[i]), y_of(s.y[i]));
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", x_of(s.x[i]), y_of(s.y[i]), s.color);
    }
    svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", points, s.color);
    const double ly = top + 10 + 20 * static_cast<double>(p);
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"/>\n", right + 16, ly,
                       right + 40, s.color);
    svg += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", right + 46, ly + 4, s.title);
  }
  svg += "</svg>\n";
  std::ofstream(path) << svg;
}

}  // namespace examples
