// fsdp2/bench/ratio_chart_test.cc
#include "bench/ratio_chart.h"

#include <gtest/gtest.h>

#include <string>

namespace fsdp2 {
namespace bench {
namespace {

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(RatioChart, OneBarPerDrawableValueGroupedWithTheirValues) {
  const std::string svg = RatioChartSvg(
      "save / disk", "bench/checkpoint, 2026-11-28",
      {{"N = 1", "sharded save", 0.92}, {"N = 1", "sharded load", 1.25},
       {"N = 2", "sharded save", -1}, {"N = 2", "sharded load", 0.5}});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  // Two group titles, four labels, three bars (the -1 draws none, prints "-").
  EXPECT_EQ(Count(svg, "font-weight=\"bold\">N = "), 2);
  EXPECT_EQ(Count(svg, ">sharded save<"), 2);
  EXPECT_EQ(Count(svg, "<rect x="), 3);
  EXPECT_NE(svg.find(">0.92<"), std::string::npos);
  EXPECT_NE(svg.find(">1.25<"), std::string::npos);
  EXPECT_NE(svg.find(">-<"), std::string::npos);
  // Parity line and its label; a bar at or past it is green, one short of it blue.
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
  EXPECT_EQ(Count(svg, "fill=\"#2ca02c\""), 1);
  EXPECT_EQ(Count(svg, "fill=\"#1f77b4\""), 2);
}

TEST(RatioChart, TextIsEscaped) {
  const std::string svg =
      RatioChartSvg("a < b & c", "\"quoted\"", {{"<g>", "x > y", 1.0}});
  EXPECT_NE(svg.find("a &lt; b &amp; c"), std::string::npos);
  EXPECT_NE(svg.find("&quot;quoted&quot;"), std::string::npos);
  EXPECT_NE(svg.find("&lt;g&gt;"), std::string::npos);
  EXPECT_NE(svg.find("x &gt; y"), std::string::npos);
  EXPECT_EQ(svg.find("<g>"), std::string::npos);
}

TEST(RatioChart, LongCaptionsWrapAtSpaces) {
  std::string caption;
  for (int i = 0; i < 60; ++i) caption += "word" + std::to_string(i) + " ";
  const std::string svg = RatioChartSvg("t", caption, {{"g", "x", 1.0}});
  // 60 words of 6-7 characters do not fit one 720 px line of 10 px text.
  EXPECT_GE(Count(svg, "font-size=\"10\""), 3);
  EXPECT_NE(svg.find(">word0 word1 "), std::string::npos);
  EXPECT_NE(svg.find("word59</text>"), std::string::npos);
}

TEST(RatioChart, WriteChartNamesAPathItCannotWrite) {
  try {
    WriteChart("/nonexistent-dir/chart.svg", "<svg/>");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/chart.svg"), std::string::npos);
  }
}

}  // namespace
}  // namespace bench
}  // namespace fsdp2
