// The custom op example of docs/custom-ops.md (tests/consumer/custom_op.h, which the installed
// package also builds): every check it makes passes in the suite, at every SIMD level.
#include <doctest/doctest.h>

#include "tests/consumer/custom_op.h"

TEST_CASE("a custom op defined outside the library passes gradcheck, remats, trains and reports bad shapes") {
  for (const std::string& failure : custom_op_example::check_cubic()) FAIL_CHECK(failure);
}
