// CausalAttention on grouped KV heads: equal to it on the heads repeated, dropout masks included.
#include <doctest/doctest.h>

#include "core/ops.h"
#include "core/random.h"
#include "nn/causal_attention.h"
#include "support/checks.h"

using namespace tapegrad;
using namespace tapegrad::nn;

using test::values;

namespace {

// Each KV head's columns repeated for its query heads: (B, T, KVH*Dh) -> (B, T, H*Dh).
Tensor repeat_heads(const Tensor& x, std::size_t H, std::size_t KVH, std::size_t Dh) {
  const std::size_t rows = x.dim(0) * x.dim(1);
  Tensor out({x.dim(0), x.dim(1), H * Dh});
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t h = 0; h < H; ++h)
      std::copy_n(x.data() + (r * KVH + h / (H / KVH)) * Dh, Dh, out.data() + (r * H + h) * Dh);
  return out;
}

}  // namespace

TEST_CASE("attention with dropout on grouped KV heads equals it on the heads repeated, the same masks drawn") {
  const std::size_t B = 2, T = 5, H = 6, KVH = 2, Dh = 4;
  Dropout drop(0.3f);
  REQUIRE(drop.active());
  const Tensor q = test::random_tensor({B, T, H * Dh}, 1), k = test::random_tensor({B, T, KVH * Dh}, 2);
  const Tensor v = test::random_tensor({B, T, KVH * Dh}, 3), dout = test::random_tensor({B, T, H * Dh}, 4);
  auto run = [&](const Tensor& kk, const Tensor& vv, AttentionHeads heads) {
    Var qv(q, true), kv(kk, true), vv_(vv, true);
    Rng rng(9);
    Tape tape;
    Var out = causal_attention(qv, kv, vv_, heads, drop, rng);
    tape.backward(sum(out * Var(dout)));
    return std::vector<Tensor>{out.value(), qv.grad(), kv.grad(), vv_.grad()};
  };
  const auto grouped = run(k, v, {H, KVH}), full = run(repeat_heads(k, H, KVH, Dh), repeat_heads(v, H, KVH, Dh), H);
  CHECK(values(grouped[0]) == values(full[0]));
  CHECK(values(grouped[1]) == values(full[1]));
  for (std::size_t g : {2, 3}) {  // a KV head's gradient: its query heads' summed
    const Tensor& narrow = grouped[g];
    for (std::size_t r = 0; r < B * T; ++r)
      for (std::size_t c = 0; c < KVH; ++c)
        for (std::size_t d = 0; d < Dh; ++d) {
          float want = 0;
          for (std::size_t h = c * (H / KVH); h < (c + 1) * (H / KVH); ++h) want += full[g].data()[(r * H + h) * Dh + d];
          CHECK(narrow.data()[(r * KVH + c) * Dh + d] == doctest::Approx(want).epsilon(1e-6));
        }
  }
  Rng rng(1);
  CHECK(test::contains(test::error_of([&] { causal_attention(Var(q), Var(k), Var(v), {H, 4}, drop, rng); }),
                       "with 6 heads and 4 KV heads dividing them"));
}
