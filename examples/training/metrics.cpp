// Metrics CSV and SVG loss-curve writing.
#include "training/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "cli/program.h"

namespace tapegrad::examples {

namespace {

constexpr const char* kCsvHeader = "step,train_loss,val_loss,lr,tokens_per_s,wall_s";

std::string optional_number(const std::optional<double>& v) { return v ? fmt::format("{:.6g}", *v) : std::string(); }

std::optional<double> parse_optional(const std::string& field) {
  if (field.empty()) return std::nullopt;
  return std::stod(field);
}

/// 1, 2 or 5 times a power of ten, so that about `count` ticks cover span.
double nice_step(double span, int count) {
  const double raw = span / count, power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * power >= raw) return m * power;
  return 10 * power;
}

/// The index of the last tick of size step in [0, span] (0 when either is not finite): loops
/// count ticks rather than step through them with +=, since a tick below the float spacing of a
/// huge value (a loss of 3e15 alone in a damaged CSV) would never move such a loop forward.
std::int64_t tick_count(double span, double step) {
  const double n = std::floor(span / step + 1e-9);
  return std::isfinite(n) && n >= 0 && n <= 1000 ? std::int64_t(n) : 0;
}

std::string escape_xml(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

}  // namespace

MetricsLog::MetricsLog(std::string csv_path, std::string svg_path, std::string title)
    : csv_path_(std::move(csv_path)), svg_path_(std::move(svg_path)), title_(std::move(title)) {}

bool MetricsLog::load_until(std::int64_t step) {
  std::error_code ec;
  if (!std::filesystem::exists(csv_path_, ec)) return false;
  std::istringstream in(read_file(csv_path_));
  std::string line;
  if (!std::getline(in, line) || line != kCsvHeader) return false;
  std::vector<MetricsRow> rows;
  try {
    while (std::getline(in, line)) {
      std::vector<std::string> fields;
      std::stringstream cells(line);
      std::string cell;
      while (std::getline(cells, cell, ',')) fields.push_back(cell);
      if (!line.empty() && line.back() == ',') fields.emplace_back();
      if (fields.size() != 6) return false;
      MetricsRow row{std::stoll(fields[0]), parse_optional(fields[1]), parse_optional(fields[2]),
                     std::stod(fields[3]),  std::stod(fields[4]),      std::stod(fields[5])};
      if (row.step > step) break;
      rows.push_back(row);
    }
  } catch (const std::exception&) {
    return false;
  }
  rows_ = std::move(rows);
  return true;
}

void MetricsLog::set_val_loss(std::int64_t step, double loss, double wall_s) {
  if (rows_.empty() || rows_.back().step != step) rows_.push_back(MetricsRow{.step = step, .wall_s = wall_s});
  rows_.back().val_loss = loss;
}

void MetricsLog::write() const {
  write_file_atomically(csv_path_, metrics_csv(rows_));
  write_file_atomically(svg_path_, loss_curve_svg(rows_, title_));
}

std::string metrics_csv(const std::vector<MetricsRow>& rows) {
  std::string out = fmt::format("{}\n", kCsvHeader);
  for (const MetricsRow& r : rows)
    out += fmt::format("{},{},{},{:.6g},{:.1f},{:.3f}\n", r.step, optional_number(r.train_loss),
                       optional_number(r.val_loss), r.lr, r.tokens_per_s, r.wall_s);
  return out;
}

std::string loss_curve_svg(const std::vector<MetricsRow>& rows, const std::string& title) {
  constexpr double width = 800, height = 480, left = 70, right = 20, top = 40, bottom = 60;
  constexpr double plot_w = width - left - right, plot_h = height - top - bottom;
  double x_max = 1, y_min = INFINITY, y_max = -INFINITY;
  for (const MetricsRow& r : rows) {
    x_max = std::max(x_max, double(r.step));
    for (const auto& v : {r.train_loss, r.val_loss})
      if (v && std::isfinite(*v)) y_min = std::min(y_min, *v), y_max = std::max(y_max, *v);
  }
  if (!(y_min <= y_max)) y_min = 0, y_max = 1;
  const double y_pad = std::max(0.05 * (y_max - y_min), 1e-3);
  y_min = std::max(0.0, y_min - y_pad);
  y_max += y_pad;
  auto px = [&](double step) { return left + plot_w * step / x_max; };
  auto py = [&](double loss) { return top + plot_h * (1 - (loss - y_min) / (y_max - y_min)); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">{3}</text>\n",
      width, height, left + plot_w / 2, escape_xml(title));
  // Axes, ticks and grid.
  const double x_tick = nice_step(x_max, 8), y_tick = nice_step(y_max - y_min, 6);
  const std::int64_t x_ticks = tick_count(x_max, x_tick);
  for (std::int64_t i = 0; i <= x_ticks; ++i) {
    const double x = double(i) * x_tick;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e5e5e5\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4:g}</text>\n",
        px(x), top, top + plot_h, top + plot_h + 16, x);
  }
  const double y_first = std::ceil(y_min / y_tick) * y_tick;
  const std::int64_t y_ticks = tick_count(y_max - y_first, y_tick);
  for (std::int64_t i = 0; i <= y_ticks; ++i) {
    const double y = y_first + double(i) * y_tick;
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#e5e5e5\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
        left, py(y), left + plot_w, left - 6, py(y) + 4, std::round(y / y_tick) * y_tick);
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", left, top,
                     plot_w, plot_h);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n", left + plot_w / 2, height - 16);
  svg += fmt::format(
      "<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">cross-entropy loss "
      "(nats per character)</text>\n",
      top + plot_h / 2);
  // The two curves.
  auto polyline = [&](bool val, const char* colour, double stroke) {
    std::string points;
    for (const MetricsRow& r : rows) {
      const auto& v = val ? r.val_loss : r.train_loss;
      if (v && std::isfinite(*v)) points += fmt::format("{:.1f},{:.1f} ", px(double(r.step)), py(*v));
    }
    if (points.empty()) return;
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" points=\"{}\"/>\n", colour, stroke,
                       points);
  };
  polyline(false, "#4c78a8", 1);
  polyline(true, "#e45756", 2);
  for (const MetricsRow& r : rows)
    if (r.val_loss && std::isfinite(*r.val_loss))
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#e45756\"/>\n", px(double(r.step)),
                         py(*r.val_loss));
  // Legend.
  const double lx = left + plot_w - 150, ly = top + 14;
  svg += fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#4c78a8\"/><text x=\"{3}\" y=\"{4}\">train "
      "(batch)</text>\n"
      "<line x1=\"{0}\" y1=\"{5}\" x2=\"{2}\" y2=\"{5}\" stroke=\"#e45756\" stroke-width=\"2\"/><text x=\"{3}\" "
      "y=\"{6}\">validation</text>\n",
      lx, ly, lx + 24, lx + 30, ly + 4, ly + 18, ly + 22);
  svg += "</svg>\n";
  return svg;
}

}  // namespace tapegrad::examples
