// Learning-rate schedules: constant, warmup then cosine decay, and argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

#include "optim/schedule.h"
#include "support/helpers.h"

using namespace tapegrad;

TEST_CASE("warmup-cosine gives the documented lr at step 0, the warmup end, midway, the end and after") {
  const auto s = optim::LrSchedule::warmup_cosine(1e-3f, 100, 1100, 1e-4f);
  // Expected values are computed here in double from the formulas (on the float inputs, as the
  // schedule sees them) and rounded to float once, so the comparisons are exact.
  const double lr = 1e-3f, min_lr = 1e-4f;
  CHECK(s.at(0) == float(lr * 1.0 / 101.0));
  CHECK(s.at(99) == float(lr * 100.0 / 101.0));
  CHECK(s.at(100) == 1e-3f);                                    // warmup ends at the peak
  CHECK(s.at(600) == float(min_lr + (lr - min_lr) * 0.5));      // halfway: cos(pi/2) = 0
  CHECK(s.at(600) == doctest::Approx(5.5e-4).epsilon(1e-6));
  CHECK(s.at(350) == float(min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * 0.25))));
  CHECK(s.at(1099) > 1e-4f);
  CHECK(s.at(1100) == 1e-4f);  // the end
  CHECK(s.at(5000) == 1e-4f);  // after the end
  for (std::int64_t step = 100; step < 1100; ++step) CHECK(s.at(step + 1) <= s.at(step));  // monotone decay
}

TEST_CASE("a schedule without warmup starts at the peak and one with decay_steps == warmup ends there") {
  const auto no_warmup = optim::LrSchedule::warmup_cosine(2e-3f, 0, 10, 0.0f);
  CHECK(no_warmup.at(0) == 2e-3f);
  CHECK(no_warmup.at(10) == 0.0f);
  const auto warmup_only = optim::LrSchedule::warmup_cosine(2e-3f, 4, 4, 1e-5f);
  CHECK(warmup_only.at(3) == float(double(2e-3f) * 4.0 / 5.0));
  CHECK(warmup_only.at(4) == 1e-5f);
}

TEST_CASE("a constant schedule gives its lr at every step") {
  const auto s = optim::LrSchedule::constant(3e-4f);
  CHECK(s.at(0) == 3e-4f);
  CHECK(s.at(1'000'000'000'000) == 3e-4f);
  CHECK(s.is_constant());
}

TEST_CASE("schedules refuse negative steps, warmup beyond decay and non-finite rates, naming the values") {
  CHECK(test::error_of([] { optim::LrSchedule::warmup_cosine(1e-3f, 200, 100, 0.0f); }) ==
        "LrSchedule: need 0 <= warmup_steps <= decay_steps, got warmup_steps 200 and decay_steps 100");
  CHECK(test::error_of([] { optim::LrSchedule::constant(-1.0f); }) == "LrSchedule: lr must be finite and >= 0, got -1");
  CHECK(test::contains(test::error_of([] { optim::LrSchedule::warmup_cosine(1e-3f, 0, 10, NAN); }), "min_lr"));
  CHECK(test::error_of([] { optim::LrSchedule::constant(1.0f).at(-1); }) == "LrSchedule::at: step must be >= 0, got -1");
}
