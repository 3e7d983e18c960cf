// spirals, as built: a few progress lines, then "test accuracy: X" on its own line with X >= 0.95.
#include <doctest/doctest.h>

#include <sstream>

#include "support/helpers.h"
#include "support/programs.h"

using namespace tapegrad;

TEST_CASE("spirals separates two interleaved spirals with test accuracy at least 0.95") {
  test::Result r = test::run("spirals", {}, {"OMP_NUM_THREADS=1"});
  REQUIRE(r.status == 0);
  std::istringstream lines(r.out);
  std::string line, last;
  int progress = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("step", 0) == 0) ++progress;
    last = line;
  }
  CHECK(progress >= 3);
  REQUIRE(last.rfind("test accuracy: ", 0) == 0);
  double accuracy = std::stod(last.substr(15));
  MESSAGE("spirals: " << last);
  CHECK(accuracy >= 0.95);
}
