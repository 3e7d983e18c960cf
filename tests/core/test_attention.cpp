// Flash attention against a plain triple loop: values, the KV-cache form with a query offset (over
// floats and over halves), and gradients by central differences.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "core/kernels.h"
#include "core/ops.h"
#include "core/quant/block_format.h"
#include "core/random.h"
#include "support/checks.h"

using namespace tapegrad;

namespace {

// The sizes the flash kernel's 64 x 64 tiles make interesting: one query, one short of a tile, a
// whole tile, one past it, and several tiles with a partial last one; head sizes of 2 to 8 vectors.
const std::size_t lengths[] = {1, 63, 64, 65, 200};
const std::size_t head_sizes[] = {16, 32, 64};

struct Reference {
  std::vector<double> out, lse;  // (B, Tq, H*Dh), (B, H, Tq)
};

// Plain triple loop in double: scores with -inf where key j > q_offset + i, softmax, weighted sum;
// head h reads KV head h / group.
template <class T>
Reference naive_attention(const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v,
                          const kernels::AttentionShape& s) {
  const std::size_t D = s.model_dim(), Dkv = s.kv_dim(), Dh = s.head_dim, Tq = s.q_len, Tk = s.kv_len;
  Reference r{std::vector<double>(s.batch * Tq * D), std::vector<double>(s.batch * s.n_heads * Tq)};
  for (std::size_t b = 0; b < s.batch; ++b)
    for (std::size_t h = 0; h < s.n_heads; ++h)
      for (std::size_t i = 0; i < Tq; ++i) {
        const std::size_t kv_col = h / s.group() * Dh;
        std::vector<double> p(Tk);
        double m = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < Tk; ++j) {
          double dot = 0;
          for (std::size_t d = 0; d < Dh; ++d)
            dot += double(q[(b * Tq + i) * D + h * Dh + d]) * double(k[(b * Tk + j) * Dkv + kv_col + d]);
          p[j] = j <= s.q_offset + i ? dot / std::sqrt(double(Dh)) : -std::numeric_limits<double>::infinity();
          m = std::max(m, p[j]);
        }
        double z = 0;
        for (double& e : p) z += (e = std::exp(e - m));
        r.lse[(b * s.n_heads + h) * Tq + i] = m + std::log(z);
        for (std::size_t d = 0; d < Dh; ++d) {
          double acc = 0;
          for (std::size_t j = 0; j < Tk; ++j) acc += p[j] / z * double(v[(b * Tk + j) * Dkv + kv_col + d]);
          r.out[(b * Tq + i) * D + h * Dh + d] = acc;
        }
      }
  return r;
}

struct Inputs {
  std::vector<double> q, k, v, R;  // R: the fixed weights of the gradient-check loss sum(out * R)
};

Inputs random_inputs(const kernels::AttentionShape& s) {
  std::size_t nq = s.batch * s.q_len * s.model_dim(), nk = s.batch * s.kv_len * s.kv_dim();
  return {test::random_vector<double>(nq, 1), test::random_vector<double>(nk, 2), test::random_vector<double>(nk, 3),
          test::random_vector<double>(nq, 4)};
}

// eps = 1e-5 for the central differences, not the usual 1e-6: a key reaches every later output,
// so the loss sums up to B*T*H*Dh rounded terms; at 51,200 of them (T = 200) their noise (about
// 2e-13) divided by 2 eps gave errors of 2e-7 at eps = 1e-6 (the analytic dk matched a plain
// double loop to 1e-15); at 1e-5 that noise is 2e-8, and the truncation error, O(eps^2) times a
// third derivative of order 1, about 1e-10.
constexpr double kAttentionEps = 1e-5;

// Runs the enclosing scope's kernels on one thread: the gradient checks make thousands of short
// calls, and a parallel region per call costs more than it saves on a loaded machine.
struct OneThread {
  int saved = num_threads();
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(saved); }
};

// Forward against the triple loop, then dq, dk and dv against central differences, all in double.
void check_attention(const kernels::AttentionShape& s) {
  OneThread one_thread;
  CAPTURE(s.batch);
  CAPTURE(s.q_len);
  CAPTURE(s.kv_len);
  CAPTURE(s.n_heads);
  CAPTURE(s.n_kv_heads);
  CAPTURE(s.head_dim);
  CAPTURE(s.q_offset);
  Inputs in = random_inputs(s);
  std::size_t nq = in.q.size(), nk = in.k.size();
  std::vector<double> out(nq), lse(s.batch * s.n_heads * s.q_len), dq(nq), dk(nk), dv(nk);
  kernels::attention_forward<double>(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), s);
  Reference ref = naive_attention(in.q, in.k, in.v, s);
  for (std::size_t i = 0; i < nq; ++i) REQUIRE(out[i] == doctest::Approx(ref.out[i]).epsilon(1e-12).scale(1));
  for (std::size_t i = 0; i < lse.size(); ++i) REQUIRE(lse[i] == doctest::Approx(ref.lse[i]).epsilon(1e-12).scale(1));
  kernels::attention_backward<double>(dq.data(), dk.data(), dv.data(), in.R.data(), out.data(), lse.data(),
                                      in.q.data(), in.k.data(), in.v.data(), s, false);
  auto forward = [&] {
    std::vector<double> y(nq);
    kernels::attention_forward<double>(y.data(), nullptr, in.q.data(), in.k.data(), in.v.data(), s);
    return y;
  };
  test::check_double("attention dq", in.q, forward, in.R, dq, kAttentionEps);
  test::check_double("attention dk", in.k, forward, in.R, dk, kAttentionEps);
  test::check_double("attention dv", in.v, forward, in.R, dv, kAttentionEps);
}

}  // namespace

TEST_CASE("flash attention matches a plain triple loop, in float, with a -inf causal mask") {
  // Past the usual lengths, 256 and 1024 keys: their transposed keys get a padded leading
  // dimension (rows a power of two apart would share a few L1 sets); and heads of 64 floats in
  // rows of 128 are copied rather than read in place.
  std::vector<std::pair<std::size_t, std::size_t>> shapes;  // (T, Dh)
  for (std::size_t T : lengths)
    for (std::size_t Dh : head_sizes) shapes.emplace_back(T, Dh);
  shapes.emplace_back(256, 32);
  shapes.emplace_back(1024, 16);
  for (auto [T, Dh] : shapes) {
    CAPTURE(T);
    CAPTURE(Dh);
    const std::size_t B = 2, H = 2, D = H * Dh;
    Tensor q = test::random_tensor({B, T, D}, 1), k = test::random_tensor({B, T, D}, 2);
    Tensor v = test::random_tensor({B, T, D}, 3);
    Tensor out = attention(Var(q), Var(k), Var(v), H).value();
    auto as_vector = [](const Tensor& t) { return std::vector<float>(t.data(), t.data() + t.size()); };
    Reference ref = naive_attention(as_vector(q), as_vector(k), as_vector(v), {B, T, T, H, Dh, 0});
    for (std::size_t i = 0; i < ref.out.size(); ++i)
      REQUIRE(out[i] == doctest::Approx(ref.out[i]).epsilon(1e-5).scale(1));
  }
}

TEST_CASE("flash attention forward matches the triple loop and its gradients match central differences in double") {
  // One query, one short of a 64-row tile, a whole tile (two sequences), one past it, and three
  // tiles with a last of 2 rows. The cost grows as B T^2 Dh: T = 200 at every head size took half
  // of the sanitized suite, so the longest shapes run once each; the float test covers T = 200.
  for (std::size_t Dh : head_sizes) {
    check_attention({2, 1, 1, 2, Dh, 0});
    check_attention({1, 63, 63, 2, Dh, 0});
    check_attention({2, 64, 64, 2, Dh, 0});
    check_attention({1, 65, 65, 2, Dh, 0});
  }
  check_attention({1, 130, 130, 2, 16, 0});
  check_attention({1, 130, 130, 2, 64, 0});
  check_attention({1, 67, 67, 1, 2, 0});  // a head of 2: every column is padding of a SIMD vector
}

TEST_CASE("flash attention with a query offset (the KV-cache form) matches the triple loop and central differences") {
  // A prefill continuing a cached sequence (queries 65..69 of 70 keys), a chunk that leaves the
  // last keys unseen (their gradients are 0), and one decoding query.
  for (std::size_t Dh : head_sizes) {
    check_attention({1, 5, 70, 2, Dh, 65});
    check_attention({2, 3, 70, 2, Dh, 60});
    check_attention({1, 1, 130, 2, Dh, 129});
  }
}

TEST_CASE("attention with a query offset equals the matching rows of the full pass") {
  const std::size_t T = 131, H = 2, Dh = 16, D = H * Dh;
  auto q = test::random_vector<float>(T * D, 1), k = test::random_vector<float>(T * D, 2), v = test::random_vector<float>(T * D, 3);
  std::vector<float> full(T * D), lse(H * T);
  kernels::attention_forward<float>(full.data(), lse.data(), q.data(), k.data(), v.data(), {1, T, T, H, Dh, 0});
  for (std::size_t start : {std::size_t(6), std::size_t(64), std::size_t(129), T - 1}) {
    CAPTURE(start);
    std::vector<float> tail((T - start) * D), tail_lse(H * (T - start));
    kernels::attention_forward<float>(tail.data(), tail_lse.data(), q.data() + start * D, k.data(), v.data(),
                                      {1, T - start, T, H, Dh, start});
    // The tiles start at a different query, so sums run in a different order: float rounding.
    for (std::size_t i = 0; i < tail.size(); ++i)
      REQUIRE(tail[i] == doctest::Approx(full[start * D + i]).epsilon(1e-5).scale(1));
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T - start; ++i)
        REQUIRE(tail_lse[h * (T - start) + i] == doctest::Approx(lse[h * T + start + i]).epsilon(1e-5));
  }
}

namespace {
// Keys (T, D) in a KV cache's layout: blocks of key_block positions, each (D, key_block); the
// block's columns past T are NaN, as stale or unwritten positions may hold anything.
std::vector<float> key_blocks(const std::vector<float>& k, std::size_t T, std::size_t D) {
  const std::size_t blocks = (T + kernels::key_block - 1) / kernels::key_block;
  std::vector<float> out(blocks * D * kernels::key_block, std::numeric_limits<float>::quiet_NaN());
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t c = 0; c < D; ++c)
      out[t / kernels::key_block * D * kernels::key_block + c * kernels::key_block + t % kernels::key_block] = k[t * D + c];
  return out;
}

// Values (T, KVH * Dh) in a KV cache's layout: a plane of `capacity` rows of Dh per KV head; the
// rows past T are NaN, as a cache's unwritten positions may hold anything.
std::vector<float> value_planes(const std::vector<float>& v, std::size_t T, std::size_t KVH, std::size_t Dh,
                                std::size_t capacity = 0) {
  if (capacity == 0) capacity = T;
  std::vector<float> out(KVH * capacity * Dh, std::numeric_limits<float>::quiet_NaN());
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t g = 0; g < KVH; ++g)
      std::copy_n(v.begin() + (t * KVH + g) * Dh, Dh, out.begin() + (g * capacity + t) * Dh);
  return out;
}
}  // namespace

TEST_CASE("cached attention over transposed key blocks matches the triple loop, each query row as if alone") {
  // Head sizes of whole vectors and not (8 and 6 split a 16-lane vector, 2 is all padding), single
  // queries on and around the block boundaries, and prefills that start at 0 or continue a sequence.
  struct Case {
    std::size_t n_heads, head_dim, q_len, q_offset;
  };
  for (Case c : {Case{2, 16, 1, 0}, Case{2, 16, 1, 15}, Case{2, 16, 1, 16}, Case{4, 16, 5, 40}, Case{3, 8, 33, 0},
                 Case{3, 8, 1, 70}, Case{4, 6, 7, 9}, Case{1, 2, 3, 17}, Case{5, 32, 2, 30}}) {
    const std::size_t H = c.n_heads, Dh = c.head_dim, D = H * Dh, T = c.q_offset + c.q_len;
    CAPTURE(H);
    CAPTURE(Dh);
    CAPTURE(c.q_len);
    CAPTURE(c.q_offset);
    kernels::AttentionShape shape{1, c.q_len, T, H, Dh, c.q_offset};
    shape.kv_capacity = T + 3;  // planes of values with room for more positions, as a cache's
    auto q = test::random_vector<float>(c.q_len * D, 1), k = test::random_vector<float>(T * D, 2);
    auto v = test::random_vector<float>(T * D, 3);
    std::vector<float> blocks = key_blocks(k, T, D), planes = value_planes(v, T, H, Dh, T + 3), out(c.q_len * D);
    std::vector<float> scratch(H * ((T + kernels::key_block - 1) / kernels::key_block * kernels::key_block + 1));
    kernels::cached_attention_forward(out.data(), q.data(), blocks.data(), planes.data(), shape, scratch.data());
    Reference want = naive_attention(q, k, v, shape);
    for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == doctest::Approx(want.out[i]).epsilon(1e-5).scale(1));
    for (std::size_t i = 0; i < c.q_len; ++i) {  // row i alone: the same bits
      std::vector<float> alone(D);
      kernels::AttentionShape row = shape;
      row.q_len = 1, row.q_offset = c.q_offset + i;
      kernels::cached_attention_forward(alone.data(), q.data() + i * D, blocks.data(), planes.data(), row,
                                        scratch.data());
      CHECK(std::equal(alone.begin(), alone.end(), out.begin() + i * D));
    }
  }
  std::vector<float> none(16);
  CHECK(test::error_of([&] {
    kernels::cached_attention_forward(none.data(), none.data(), none.data(), none.data(), {1, 2, 5, 1, 8, 4}, none.data());
  }) == "cached_attention: one sequence with q_offset + q_len <= kv_len <= kv_capacity; got batch 1, q_offset 4, "
          "q_len 2, kv_len 5, kv_capacity 0");
  kernels::AttentionShape short_planes{1, 1, 5, 1, 8, 4};
  short_planes.kv_capacity = 4;
  CHECK(test::error_of([&] {
    kernels::cached_attention_forward(none.data(), none.data(), none.data(), none.data(), short_planes, none.data());
  }) == "cached_attention: one sequence with q_offset + q_len <= kv_len <= kv_capacity; got batch 1, q_offset 4, "
          "q_len 1, kv_len 5, kv_capacity 4");
}

TEST_CASE("flash attention gives bit-identical results on 1 and 2 threads, and writing equals adding to zeros") {
  const kernels::AttentionShape s{2, 130, 130, 4, 32, 0};
  const std::size_t n = s.batch * s.q_len * s.model_dim();
  auto q = test::random_vector<float>(n, 1), k = test::random_vector<float>(n, 2), v = test::random_vector<float>(n, 3);
  auto dout = test::random_vector<float>(n, 4);
  auto run = [&](int threads, bool overwrite) {
    int saved = num_threads();
    set_num_threads(threads);
    // Written gradients start as NaN: an element the kernel failed to write would show.
    const float start = overwrite ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    std::vector<float> out(n), lse(s.batch * s.n_heads * s.q_len), dq(n, start), dk(n, start), dv(n, start);
    kernels::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    kernels::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                                k.data(), v.data(), s, overwrite);
    set_num_threads(saved);
    for (auto* part : {&lse, &dq, &dk, &dv}) out.insert(out.end(), part->begin(), part->end());
    return out;
  };
  CHECK(run(1, false) == run(2, false));
  CHECK(run(1, true) == run(1, false));
  CHECK(run(2, true) == run(1, false));
}

TEST_CASE("the attention op's gradients match central differences in float") {
  test::check_float_op("attention", [](const std::vector<Var>& v) { return attention(v[0], v[1], v[2], 2); },
                       {test::random_tensor({2, 3, 4}, 5), test::random_tensor({2, 3, 4}, 6),
                        test::random_tensor({2, 3, 4}, 7)});
  test::check_float_op("attention", [](const std::vector<Var>& v) { return attention(v[0], v[1], v[2], 1); },
                       {test::random_tensor({1, 66, 2}, 8), test::random_tensor({1, 66, 2}, 9),
                        test::random_tensor({1, 66, 2}, 10)});
  // One Var as q, k and v: its gradient is the sum of three, none of them written over another.
  test::check_float_op("attention", [](const std::vector<Var>& v) { return attention(v[0], v[0], v[0], 2); },
                       {test::random_tensor({2, 5, 4}, 11)});
}

TEST_CASE("attention names the shapes it was given") {
  CHECK(test::error_of([] { attention(Var(Tensor({1, 2, 6})), Var(Tensor({1, 2, 6})), Var(Tensor({1, 2, 6})), 4); }) ==
        "attention: expected q (B, T, H*Dh) with 4 heads, got [1, 2, 6]");
  CHECK(test::error_of([] { attention(Var(Tensor({1, 2, 8})), Var(Tensor({1, 3, 8})), Var(Tensor({1, 2, 8})), 4); }) ==
        "attention: expected k to be [1, 2, 8], got [1, 3, 8]");
}

// ---- grouped-query attention: fewer KV heads than heads ------------------------------------

namespace {
const std::pair<std::size_t, std::size_t> head_groups[] = {{4, 4}, {4, 2}, {6, 2}, {4, 1}};  // (heads, KV heads)

// Each KV head's columns repeated for its query heads: (rows, KVH*Dh) -> (rows, H*Dh).
template <class T>
std::vector<T> repeat_heads(const std::vector<T>& x, std::size_t rows, std::size_t H, std::size_t KVH, std::size_t Dh) {
  std::vector<T> out(rows * H * Dh);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t h = 0; h < H; ++h)
      std::copy_n(x.begin() + (r * KVH + h / (H / KVH)) * Dh, Dh, out.begin() + (r * H + h) * Dh);
  return out;
}
}  // namespace

TEST_CASE("grouped-query attention's forward and gradients match the triple loop and central differences in double") {
  // A KV head's dk and dv sum over its query heads: checked as any other gradient.
  for (auto [H, KVH] : head_groups) {
    check_attention({2, 3, 3, H, 16, 0, KVH});
    check_attention({1, 65, 65, H, 16, 0, KVH});
    check_attention({1, 5, 70, H, 8, 65, KVH});
  }
}

TEST_CASE("grouped-query attention equals multi-head attention over K and V heads repeated, and its KV gradients "
          "are the repeated heads' summed") {
  for (auto [H, KVH] : head_groups) {
    CAPTURE(H);
    CAPTURE(KVH);
    const std::size_t B = 2, T = 70, Dh = 16, rows = B * T;
    const kernels::AttentionShape grouped{B, T, T, H, Dh, 0, KVH}, full{B, T, T, H, Dh, 0};
    auto q = test::random_vector<float>(rows * H * Dh, 1), k = test::random_vector<float>(rows * KVH * Dh, 2);
    auto v = test::random_vector<float>(rows * KVH * Dh, 3), dout = test::random_vector<float>(rows * H * Dh, 4);
    const auto k_wide = repeat_heads(k, rows, H, KVH, Dh), v_wide = repeat_heads(v, rows, H, KVH, Dh);
    std::vector<float> out(q.size()), lse(B * H * T), out_wide(q.size()), lse_wide(lse.size());
    kernels::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), grouped);
    kernels::attention_forward(out_wide.data(), lse_wide.data(), q.data(), k_wide.data(), v_wide.data(), full);
    CHECK(out == out_wide);  // the same operations on the same values
    CHECK(lse == lse_wide);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dq_wide(q.size()), dk_wide(k_wide.size()),
        dv_wide(v_wide.size());
    kernels::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                                v.data(), grouped, true);
    kernels::attention_backward(dq_wide.data(), dk_wide.data(), dv_wide.data(), dout.data(), out.data(), lse.data(),
                                q.data(), k_wide.data(), v_wide.data(), full, true);
    CHECK(dq == dq_wide);
    for (std::size_t r = 0; r < rows; ++r)  // a KV head's gradient: its query heads' in head order
      for (std::size_t c = 0; c < KVH; ++c)
        for (std::size_t d = 0; d < Dh; ++d) {
          float sum_k = 0, sum_v = 0;
          for (std::size_t h = c * (H / KVH); h < (c + 1) * (H / KVH); ++h) {
            sum_k += dk_wide[(r * H + h) * Dh + d];
            sum_v += dv_wide[(r * H + h) * Dh + d];
          }
          REQUIRE(dk[(r * KVH + c) * Dh + d] == sum_k);
          REQUIRE(dv[(r * KVH + c) * Dh + d] == sum_v);
        }
  }
}

TEST_CASE("grouped-query attention's gradients are bit-identical on 1 and 2 threads and across batch sizes") {
  const std::size_t H = 6, KVH = 2, T = 130, Dh = 32, B = 3;
  const kernels::AttentionShape s{B, T, T, H, Dh, 0, KVH};
  const std::size_t nq = B * T * H * Dh, nk = B * T * KVH * Dh;
  auto q = test::random_vector<float>(nq, 1), k = test::random_vector<float>(nk, 2), v = test::random_vector<float>(nk, 3);
  auto dout = test::random_vector<float>(nq, 4);
  auto run = [&](int threads, std::size_t first, std::size_t batch) {
    int saved = num_threads();
    set_num_threads(threads);
    kernels::AttentionShape part = s;
    part.batch = batch;
    const std::size_t q0 = first * T * H * Dh, k0 = first * T * KVH * Dh;
    std::vector<float> out(batch * T * H * Dh), lse(batch * H * T), dq(out.size()), dk(batch * T * KVH * Dh),
        dv(dk.size());
    kernels::attention_forward(out.data(), lse.data(), q.data() + q0, k.data() + k0, v.data() + k0, part);
    kernels::attention_backward(dq.data(), dk.data(), dv.data(), dout.data() + q0, out.data(), lse.data(),
                                q.data() + q0, k.data() + k0, v.data() + k0, part, true);
    set_num_threads(saved);
    for (auto* x : {&lse, &dq, &dk, &dv}) out.insert(out.end(), x->begin(), x->end());
    return out;
  };
  CHECK(run(1, 0, B) == run(2, 0, B));
  const auto alone = run(2, 1, 1), batched = run(1, 0, B);  // sequence 1 alone against within the batch
  const std::size_t n_out = T * H * Dh, n_lse = H * T, n_k = T * KVH * Dh;
  std::size_t at = 0, at_alone = 0;  // each part (out, lse, dq, dk, dv): sequence 1's n elements
  for (std::size_t n : {n_out, n_lse, n_out, n_k, n_k}) {
    CHECK(std::equal(alone.begin() + at_alone, alone.begin() + at_alone + n, batched.begin() + at + n));
    at += B * n, at_alone += n;
  }
}

TEST_CASE("cached grouped-query attention matches the triple loop, each query row as if alone") {
  for (auto [H, KVH] : head_groups)
    for (std::size_t Dh : {std::size_t(16), std::size_t(6)}) {
      const std::size_t q_len = 5, q_offset = 30, T = q_offset + q_len, D = H * Dh, Dkv = KVH * Dh;
      CAPTURE(H);
      CAPTURE(KVH);
      CAPTURE(Dh);
      kernels::AttentionShape shape{1, q_len, T, H, Dh, q_offset, KVH};
      auto q = test::random_vector<float>(q_len * D, 1), k = test::random_vector<float>(T * Dkv, 2);
      auto v = test::random_vector<float>(T * Dkv, 3);
      std::vector<float> blocks = key_blocks(k, T, Dkv), planes = value_planes(v, T, KVH, Dh), out(q_len * D);
      std::vector<float> scratch(H * ((T + kernels::key_block - 1) / kernels::key_block * kernels::key_block + 1));
      kernels::cached_attention_forward(out.data(), q.data(), blocks.data(), planes.data(), shape, scratch.data());
      Reference want = naive_attention(q, k, v, shape);
      for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == doctest::Approx(want.out[i]).epsilon(1e-5).scale(1));
      for (std::size_t i = 0; i < q_len; ++i) {
        std::vector<float> alone(D);
        kernels::cached_attention_forward(alone.data(), q.data() + i * D, blocks.data(), planes.data(),
                                          {1, 1, T, H, Dh, q_offset + i, KVH}, scratch.data());
        CHECK(std::equal(alone.begin(), alone.end(), out.begin() + i * D));
      }
    }
}

TEST_CASE("cached grouped-query attention gives every head the bits it gets attending alone over its KV head") {
  // Groups of 2, 3, 4 and 9 heads (run side by side in twos, threes, fours and eights), head sizes
  // of whole vectors and not.
  for (auto [H, KVH] : {std::pair<std::size_t, std::size_t>{4, 2}, {9, 3}, {8, 2}, {9, 1}, {12, 3}})
    for (std::size_t Dh : {std::size_t(64), std::size_t(16), std::size_t(6)}) {
      const std::size_t T = 45, D = H * Dh, Dkv = KVH * Dh, group = H / KVH;
      CAPTURE(H);
      CAPTURE(KVH);
      CAPTURE(Dh);
      auto q = test::random_vector<float>(D, 1), k = test::random_vector<float>(T * Dkv, 2);
      auto v = test::random_vector<float>(T * Dkv, 3);
      std::vector<float> out(D), scratch(H * ((T + kernels::key_block - 1) / kernels::key_block * kernels::key_block + 1));
      const std::vector<float> blocks = key_blocks(k, T, Dkv), planes = value_planes(v, T, KVH, Dh);
      kernels::cached_attention_forward(out.data(), q.data(), blocks.data(), planes.data(),
                                        {1, 1, T, H, Dh, T - 1, KVH}, scratch.data());
      for (std::size_t h = 0; h < H; ++h) {
        std::vector<float> head_k(T * Dh), head_v(T * Dh), alone(Dh);
        for (std::size_t t = 0; t < T; ++t)
          for (std::size_t d = 0; d < Dh; ++d) {
            head_k[t * Dh + d] = k[t * Dkv + h / group * Dh + d];
            head_v[t * Dh + d] = v[t * Dkv + h / group * Dh + d];
          }
        const std::vector<float> head_blocks = key_blocks(head_k, T, Dh);
        kernels::cached_attention_forward(alone.data(), q.data() + h * Dh, head_blocks.data(), head_v.data(),
                                          {1, 1, T, 1, Dh, T - 1, 1}, scratch.data());
        CHECK_MESSAGE(std::equal(alone.begin(), alone.end(), out.begin() + h * Dh), "head ", h);
      }
    }
}

TEST_CASE("cached attention over a range of heads gives those heads the whole call's bits and writes no other") {
  // Ranges that start and end inside a group, as two threads splitting a sequence's heads do.
  for (auto [H, KVH] : {std::pair<std::size_t, std::size_t>{4, 4}, {9, 3}, {8, 2}, {9, 1}})
    for (std::size_t Dh : {std::size_t(64), std::size_t(16), std::size_t(6)}) {
      const std::size_t q_len = 3, T = 40, D = H * Dh, Dkv = KVH * Dh;
      CAPTURE(H);
      CAPTURE(KVH);
      CAPTURE(Dh);
      auto q = test::random_vector<float>(q_len * D, 1), k = test::random_vector<float>(T * Dkv, 2);
      auto v = test::random_vector<float>(T * Dkv, 3);
      const std::vector<float> blocks = key_blocks(k, T, Dkv), planes = value_planes(v, T, KVH, Dh);
      std::vector<float> whole(q_len * D), scratch(H * ((T + kernels::key_block - 1) / kernels::key_block * kernels::key_block + 1));
      const kernels::AttentionShape shape{1, q_len, T, H, Dh, T - q_len, KVH};
      kernels::cached_attention_forward(whole.data(), q.data(), blocks.data(), planes.data(), shape, scratch.data());
      for (std::size_t first = 0; first < H; ++first)
        for (std::size_t count = 1; first + count <= H; ++count) {
          kernels::AttentionShape part = shape;
          part.first_head = first, part.head_count = count;
          std::vector<float> out(q_len * D, -7.0f);
          kernels::cached_attention_forward(out.data(), q.data(), blocks.data(), planes.data(), part, scratch.data());
          for (std::size_t i = 0; i < out.size(); ++i) {
            const std::size_t h = i % D / Dh;
            const bool in_range = h >= first && h < first + count;
            REQUIRE_MESSAGE(out[i] == (in_range ? whole[i] : -7.0f), "heads ", first, "..", first + count - 1, " i ", i);
          }
        }
      kernels::AttentionShape past = shape;
      past.first_head = H - 1, past.head_count = 2;
      CHECK_THROWS_AS(kernels::cached_attention_forward(whole.data(), q.data(), blocks.data(), planes.data(), past,
                                                        scratch.data()),
                      std::invalid_argument);
    }
}

TEST_CASE("the grouped-query attention op's gradients match central differences in float, and it names bad heads") {
  test::check_float_op("attention", [](const std::vector<Var>& v) { return attention(v[0], v[1], v[2], {4, 2}); },
                       {test::random_tensor({2, 3, 8}, 5), test::random_tensor({2, 3, 4}, 6),
                        test::random_tensor({2, 3, 4}, 7)});
  // One Var as k and v: its gradient is the sum of two, neither written over the other.
  test::check_float_op("attention", [](const std::vector<Var>& v) { return attention(v[0], v[1], v[1], {4, 1}); },
                       {test::random_tensor({1, 5, 8}, 8), test::random_tensor({1, 5, 2}, 9)});
  CHECK(test::error_of([] { attention(Var(Tensor({1, 2, 8})), Var(Tensor({1, 2, 4})), Var(Tensor({1, 2, 4})), {4, 3}); }) ==
        "attention: n_kv_heads 3 must divide n_heads 4");
  CHECK(test::error_of([] { attention(Var(Tensor({1, 2, 8})), Var(Tensor({1, 2, 8})), Var(Tensor({1, 2, 8})), {4, 2}); }) ==
        "attention: expected k to be [1, 2, 4], got [1, 2, 8]");
}

TEST_CASE("round_to_halves rounds to nearest even as the gguf package's f16 and F16C do, whatever a value's place") {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 70000.0f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-24f, 0x1.8p-25f, 0x3p-26f, 0x1p-130f, -0x1.fffffep-15f,
                          1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 1.0f + 0x1p-11f + 0x1p-20f, 2047.5f, 4097.0f};
  Rng rng(11);
  while (x.size() < 20000) {  // every exponent, NaN bit patterns left to the next check
    const float f = std::bit_cast<float>(std::uint32_t(rng.next_u64()));
    if (!std::isnan(f)) x.push_back(f);
  }
  for (std::size_t offset : {std::size_t(0), std::size_t(5)}) {  // whole vectors and the scalar tail
    std::vector<std::uint16_t> h(x.size() - offset);
    kernels::round_to_halves(h.data(), x.data() + offset, h.size());
    for (std::size_t i = 0; i < h.size(); ++i)
      REQUIRE_MESSAGE(h[i] == quant::f32_to_f16(x[offset + i]), "x ", x[offset + i], " offset ", offset);
  }
  // A NaN stays one, of its sign, made quiet, its top 9 payload bits kept (F16C's rule; the gguf
  // package's differs).
  const std::vector<std::uint32_t> nans = {0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA00000, 0xFFBFFFFF, 0x7FFFE000};
  std::vector<float> nan_values;
  for (std::uint32_t bits : nans) nan_values.push_back(std::bit_cast<float>(bits));
  nan_values.resize(32, std::bit_cast<float>(0x7F800001u));  // some in a whole vector
  std::vector<std::uint16_t> h(nan_values.size());
  kernels::round_to_halves(h.data(), nan_values.data(), h.size());
  for (std::size_t i = 0; i < h.size(); ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(nan_values[i]);
    CHECK(h[i] == std::uint16_t(((bits >> 16) & 0x8000) | 0x7E00 | ((bits >> 13) & 0x3FF)));
  }
}

TEST_CASE("cached attention over a 16-bit cache gives the bits of a float cache holding the halves' values") {
  // Head sizes of whole vectors (64, 16) and not (8 and 6: one element at a time at some levels),
  // grouped and not, every range of heads, several queries.
  for (auto [H, KVH] : {std::pair<std::size_t, std::size_t>{4, 4}, {9, 3}, {8, 2}, {9, 1}})
    for (std::size_t Dh : {std::size_t(64), std::size_t(16), std::size_t(8), std::size_t(6)}) {
      const std::size_t q_len = 3, T = 40, capacity = 43, D = H * Dh, Dkv = KVH * Dh;
      CAPTURE(H);
      CAPTURE(KVH);
      CAPTURE(Dh);
      auto q = test::random_vector<float>(q_len * D, 1), k = test::random_vector<float>(T * Dkv, 2);
      auto v = test::random_vector<float>(T * Dkv, 3);
      for (auto& x : k) x *= 40.0f;  // past f16's precision and into its large values
      std::vector<std::uint16_t> k_half(k.size()), v_half(v.size());
      kernels::round_to_halves(k_half.data(), k.data(), k.size());
      kernels::round_to_halves(v_half.data(), v.data(), v.size());
      std::vector<float> k_rounded(k.size()), v_rounded(v.size());
      for (std::size_t i = 0; i < k.size(); ++i) k_rounded[i] = quant::f16_to_f32(k_half[i]);
      for (std::size_t i = 0; i < v.size(); ++i) v_rounded[i] = quant::f16_to_f32(v_half[i]);
      CHECK(k_rounded != k);
      const std::vector<float> blocks = key_blocks(k_rounded, T, Dkv);
      const std::vector<float> planes = value_planes(v_rounded, T, KVH, Dh, capacity);
      // The same layouts of halves, NaN past the written positions.
      auto halves_of = [](const std::vector<float>& floats) {
        std::vector<std::uint16_t> out(floats.size());
        for (std::size_t i = 0; i < floats.size(); ++i) out[i] = quant::f32_to_f16(floats[i]);
        return out;
      };
      const std::vector<std::uint16_t> half_blocks = halves_of(blocks), half_planes = halves_of(planes);
      std::vector<float> scratch(H * ((T + kernels::key_block - 1) / kernels::key_block * kernels::key_block + 1));
      kernels::AttentionShape shape{1, q_len, T, H, Dh, T - q_len, KVH};
      shape.kv_capacity = capacity;
      for (std::size_t first = 0; first < H; first += 2) {
        kernels::AttentionShape part = shape;
        part.first_head = first, part.head_count = std::min<std::size_t>(3, H - first);
        std::vector<float> want(q_len * D, -7.0f), got(q_len * D, -7.0f);
        kernels::cached_attention_forward(want.data(), q.data(), blocks.data(), planes.data(), part, scratch.data());
        kernels::cached_attention_forward_f16(got.data(), q.data(), half_blocks.data(), half_planes.data(), part,
                                              scratch.data());
        REQUIRE_MESSAGE(got == want, "heads from ", first);  // bit for bit
      }
    }
}
