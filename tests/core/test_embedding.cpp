// embedding: the row gather, the scatter-add of its gradient, and the errors for bad ids.
#include <doctest/doctest.h>

#include "core/ops.h"
#include "support/checks.h"

using namespace tapegrad;

TEST_CASE("embedding gathers rows and its scatter-add sums repeated ids") {
  Tensor table = test::random_tensor({5, 3}, 1);
  std::vector<std::int32_t> ids = {4, 0, 4, 2};
  Var w(table, true);
  Tape tape;
  Var y = embedding(w, ids);
  CHECK(y.shape() == Shape{4, 3});
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t j = 0; j < 3; ++j) CHECK(y.value().at({i, j}) == table.at({std::size_t(ids[i]), j}));
  tape.backward(sum(y));
  CHECK(w.grad().at({4, 1}) == 2.0f);  // used twice
  CHECK(w.grad().at({0, 0}) == 1.0f);
  CHECK(w.grad().at({1, 2}) == 0.0f);  // unused
}

TEST_CASE("embedding backward matches central differences in double and in float") {
  const std::size_t V = 4, D = 3;
  std::vector<std::int32_t> ids = {1, 3, 1, 0, 2};
  auto table = test::random_vector<double>(V * D, 1), R = test::random_vector<double>(ids.size() * D, 2);
  std::vector<double> dtable(V * D);
  kernels::embedding_backward<double>(dtable.data(), R.data(), ids.data(), ids.size(), D);
  test::check_double("embedding", table, [&] {
    std::vector<double> y(ids.size() * D);
    kernels::embedding_forward<double>(y.data(), table.data(), ids.data(), ids.size(), D);
    return y;
  }, R, dtable);
  test::check_float_op("embedding", [&](const std::vector<Var>& v) { return embedding(v[0], ids); },
                       {test::random_tensor({V, D}, 3)});
}

TEST_CASE("an out-of-range id names the id and the vocabulary size") {
  std::vector<std::int32_t> ids = {1, 65};
  CHECK(test::error_of([&] { embedding(Var(Tensor({65, 4})), ids); }) ==
        "embedding: id 65 at index 1 is outside the vocabulary of size 65");
  std::vector<std::int32_t> negative = {-1};
  CHECK(test::contains(test::error_of([&] { embedding(Var(Tensor({65, 4})), negative); }), "id -1"));
}
