// fsdp2/bench/ratio_chart.h
//
// The benchmarks' charts: an SVG bar chart of ratios, written by the
// benchmark that measured them (`--svg FILE`), as the main job writes its
// loss curve. docs/benchmarks.md shows the ones the shipped numbers came from.
#ifndef FSDP2_BENCH_RATIO_CHART_H_
#define FSDP2_BENCH_RATIO_CHART_H_

#include <string>
#include <vector>

namespace fsdp2 {
namespace bench {

// One bar: `label` beside it, `value` its length. Bars of one `group` are
// drawn together under the group's name, in the order given.
struct ChartBar {
  std::string group;
  std::string label;
  double value = 0;
};

// A horizontal bar chart: `title` on top, `caption` (the command, machine
// and date) below, wrapped to the chart's width, a vertical line at `reference` (1.0: parity) and each
// bar's value printed at its end. Text is XML-escaped. Values <= 0 or not
// finite draw no bar and print "-".
std::string RatioChartSvg(const std::string& title, const std::string& caption,
                          const std::vector<ChartBar>& bars, double reference = 1.0);

// Writes `svg` to `path` (replacing it; a relative path under `bazel run`
// is taken from the directory bazel was run in); throws std::runtime_error
// naming the path if it cannot.
void WriteChart(const std::string& path, const std::string& svg);

}  // namespace bench
}  // namespace fsdp2

#endif  // FSDP2_BENCH_RATIO_CHART_H_
