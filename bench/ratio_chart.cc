// fsdp2/bench/ratio_chart.cc
#include "bench/ratio_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace fsdp2 {
namespace bench {
namespace {

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
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

bool Drawable(double v) { return std::isfinite(v) && v > 0; }

// `text` cut at spaces into lines of at most `width` characters (a longer
// word stays whole on a line of its own).
std::vector<std::string> Wrap(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::istringstream words(text);
  std::string word, line;
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

std::string RatioChartSvg(const std::string& title, const std::string& caption,
                          const std::vector<ChartBar>& bars, double reference) {
  // Wide enough for the title at 14 px (about 7.5 px a character).
  const double width = std::max(720.0, 7.5 * title.size() + 40), label_w = 300, right = 60, bar_h = 18, gap = 6, group_h = 22;
  const double top = 40;
  double hi = reference;
  for (const auto& b : bars) {
    if (Drawable(b.value)) hi = std::max(hi, b.value);
  }
  hi *= 1.1;
  const double plot_w = width - label_w - right;
  auto x = [&](double v) { return label_w + plot_w * v / hi; };

  std::ostringstream body;
  body << std::fixed << std::setprecision(1);
  double y = top;
  std::string group;
  bool first = true;
  for (const auto& b : bars) {
    if (first || b.group != group) {
      group = b.group;
      first = false;
      y += 4;
      body << "<text x=\"8\" y=\"" << y + 14 << "\" font-weight=\"bold\">" << Escape(group)
           << "</text>\n";
      y += group_h;
    }
    body << "<text x=\"" << label_w - 8 << "\" y=\"" << y + 13 << "\" text-anchor=\"end\">"
         << Escape(b.label) << "</text>\n";
    if (Drawable(b.value)) {
      body << "<rect x=\"" << label_w << "\" y=\"" << y << "\" width=\""
           << x(b.value) - label_w << "\" height=\"" << bar_h << "\" fill=\""
           << (b.value >= reference ? "#2ca02c" : "#1f77b4") << "\"/>\n";
      std::ostringstream value;
      value << std::fixed << std::setprecision(2) << b.value;
      body << "<text x=\"" << x(b.value) + 4 << "\" y=\"" << y + 13 << "\">" << value.str()
           << "</text>\n";
    } else {
      body << "<text x=\"" << label_w + 4 << "\" y=\"" << y + 13 << "\">-</text>\n";
    }
    y += bar_h + gap;
  }
  // The caption at 10 px (about 5.5 px a character), wrapped to the width.
  const std::vector<std::string> caption_lines =
      Wrap(caption, static_cast<size_t>((width - 16) / 5.5));
  const double height = y + 28 + 13 * caption_lines.size();
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\""
    << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">"
    << Escape(title) << "</text>\n"
    << body.str()
    << "<line x1=\"" << x(reference) << "\" y1=\"" << top << "\" x2=\"" << x(reference)
    << "\" y2=\"" << y << "\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/>\n"
    << "<text x=\"" << x(reference) << "\" y=\"" << y + 14
    << "\" text-anchor=\"middle\" fill=\"#d62728\">" << std::setprecision(2) << reference
    << "</text>\n"
    ;
  for (size_t i = 0; i < caption_lines.size(); ++i) {
    s << "<text x=\"8\" y=\"" << y + 34 + 13 * i << "\" font-size=\"10\" fill=\"#555\">"
      << Escape(caption_lines[i]) << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

void WriteChart(const std::string& path, const std::string& svg) {
  // Under `bazel run` a relative path means the caller's directory, not the
  // runfiles tree the benchmark runs in.
  const char* caller = std::getenv("BUILD_WORKING_DIRECTORY");
  const std::string where =
      !path.empty() && path[0] != '/' && caller && *caller ? std::string(caller) + "/" + path
                                                           : path;
  std::ofstream f(where, std::ios::trunc);
  f << svg;
  f.close();
  if (!f) throw std::runtime_error("cannot write the chart " + where);
}

}  // namespace bench
}  // namespace fsdp2
