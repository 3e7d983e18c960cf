// SIMD levels: the primitives and helpers at every level the CPU runs and at emulated widths, the
// level choice itself, and the kernels agreeing across levels.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/kernels/kernel_table.h"
#include "core/kernels.h"
#include "core/simd.h"
#include "support/helpers.h"
#include "core/kernels/emulated_batch.h"
#include "tests/core/simd_checks.h"

using namespace tapegrad;

namespace tapegrad::simd_checks {
namespace sse2 { std::vector<std::string> run(); std::size_t float_lanes(); }
namespace avx2 { std::vector<std::string> run(); std::size_t float_lanes(); }
namespace avx512 { std::vector<std::string> run(); std::size_t float_lanes(); }
}  // namespace tapegrad::simd_checks

namespace {

struct LevelChecks {
  SimdLevel level;
  std::vector<std::string> (*run)();
  std::size_t (*float_lanes)();
};
const LevelChecks level_checks[] = {
    {SimdLevel::sse2, simd_checks::sse2::run, simd_checks::sse2::float_lanes},
    {SimdLevel::avx2, simd_checks::avx2::run, simd_checks::avx2::float_lanes},
    {SimdLevel::avx512, simd_checks::avx512::run, simd_checks::avx512::float_lanes},
};

void require_no_failures(const std::vector<std::string>& failures) {
  for (const auto& message : failures) FAIL_CHECK(message);
  REQUIRE(failures.empty());
}

// Restores the level in use when a test that switches levels ends.
struct LevelGuard {
  SimdLevel saved = simd_level();
  ~LevelGuard() { set_simd_level(saved); }
};

}  // namespace

TEST_CASE("the xsimd primitives and the SIMD helpers match scalar loops at every level this CPU runs") {
  auto supported = supported_simd_levels();
  REQUIRE(!supported.empty());
  CHECK(supported.front() == SimdLevel::sse2);
  for (const auto& checks : level_checks) {
    bool runs = std::find(supported.begin(), supported.end(), checks.level) != supported.end();
    if (!runs) {
      MESSAGE("this CPU cannot run " << simd_level_name(checks.level) << "; its 16-lane code is checked emulated below");
      continue;
    }
    CAPTURE(simd_level_name(checks.level));
    CHECK(checks.float_lanes() == std::size_t(checks.level == SimdLevel::sse2 ? 4 : checks.level == SimdLevel::avx2 ? 8 : 16));
    require_no_failures(checks.run());
  }
}

TEST_CASE("the SIMD helpers match scalar loops on emulated batches of 2 to 32 lanes") {
  using kernels::EmulatedBatch;
  simd_checks::Failures f;
  simd_checks::check_helpers<EmulatedBatch<float, 16>>(f, "float x16");  // AVX-512's width
  simd_checks::check_helpers<EmulatedBatch<double, 8>>(f, "double x8");
  simd_checks::check_helpers<EmulatedBatch<float, 32>>(f, "float x32");
  simd_checks::check_helpers<EmulatedBatch<float, 2>>(f, "float x2");
  require_no_failures(f.messages);
}

TEST_CASE("the SIMD level is the widest the CPU supports unless TAPEGRAD_SIMD names one") {
  CHECK(simd_level_name(SimdLevel::sse2) == "sse2");
  CHECK(simd_level_name(SimdLevel::avx2) == "avx2");
  CHECK(simd_level_name(SimdLevel::avx512) == "avx512");
  auto supported = supported_simd_levels();
  const char* forced = std::getenv("TAPEGRAD_SIMD");
  if (forced && *forced)
    CHECK(simd_level_name(simd_level()) == forced);
  else
    CHECK(simd_level() == supported.back());
  LevelGuard guard;
  for (SimdLevel level : supported) {
    set_simd_level(level);
    CHECK(simd_level() == level);
  }
  if (supported.back() != SimdLevel::avx512) {
    std::string message = test::error_of<std::runtime_error>([] { set_simd_level(SimdLevel::avx512); });
    CHECK(test::contains(message, "this CPU does not support avx512"));
    CHECK(simd_level() == supported.back());  // unchanged by the refused switch
  }
}

namespace {

// Runs f with the kernel table of every level the CPU supports and of emulated16 (the AVX-512
// width, on any AVX2 CPU), and checks each result against the SSE2 one element by element,
// within rtol of max(1, |value|): different widths add partial sums in different orders.
template <class F> void check_levels_agree(const char* what, double rtol, F f) {
  using Table = kernels::KernelTable<float>;
  std::vector<std::pair<std::string, const Table*>> tables;
  for (SimdLevel level : testable_simd_levels()) {
    LevelGuard guard;
    set_simd_level(level);
    tables.emplace_back(simd_level_name(level), &kernels::active_table<float>());
  }
  std::vector<double> reference = f(*tables.front().second);
  for (const auto& [name, table] : tables) {
    std::vector<double> got = f(*table);
    REQUIRE(got.size() == reference.size());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(got[i] - reference[i]) / std::max(1.0, std::fabs(reference[i])));
    std::string kernels = what, level = name;
    CAPTURE(kernels);
    CAPTURE(level);
    CHECK(worst <= rtol);
  }
}

template <class T> std::vector<double> widen(const std::vector<T>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("every kernel gives the same results at every level and at 16 emulated lanes, within float rounding") {
  // Odd sizes, so every level runs its SIMD body and its padded last vector. Tolerance: float rounding of
  // sums of a few hundred terms, 1e-5 relative (of max(1, |value|)).
  using Table = kernels::KernelTable<float>;
  const std::size_t rows = 37, dim = 83, heads = 3, head_dim = 16, seq = 37, vocab = 67;
  const double rtol = 1e-5;
  auto x = test::random_vector<float>(rows * dim, 1), w = test::random_vector<float>(dim, 2);
  auto dy = test::random_vector<float>(rows * dim, 3), b = test::random_vector<float>(rows * dim, 4);
  check_levels_agree("gemm: BLAS, and one or two rows in row loops (both transposes)", rtol, [&](const Table& k) {
    std::vector<float> c(rows * rows, 0.5f), c1(2 * rows, 0.5f), c2(2 * dim, 0.5f);
    k.gemm(false, true, rows, rows, dim, 1.0f, x.data(), dim, dy.data(), dim, 1.0f, c.data(), rows);
    k.gemm(false, true, 2, rows, dim, 1.0f, x.data(), dim, dy.data(), dim, 1.0f, c1.data(), rows);
    k.gemm(false, false, 2, dim, rows, 0.5f, x.data(), rows, dy.data(), dim, 0.0f, c2.data(), dim);
    k.gemm(false, true, 2, rows, 16, 1.0f, x.data(), 16, dy.data(), 32, 1.0f, c1.data(), rows);  // K = 16 lanes
    c.insert(c.end(), c1.begin(), c1.end());
    c.insert(c.end(), c2.begin(), c2.end());
    return widen(c);
  });
  check_levels_agree("packed gemm, every transpose", rtol, [&](const Table& k) {
    std::vector<float> c(4 * rows * rows, 0.5f);
    for (int form = 0; form < 4; ++form)
      k.packed_gemm(form & 1, form & 2, rows, rows, dim, 1.0f, x.data(), form & 1 ? rows : dim, dy.data(),
                    form & 2 ? dim : rows, 1.0f, c.data() + form * rows * rows, rows);
    return widen(c);
  });
  check_levels_agree("row-stable matmul (decoding), many rows and one", rtol, [&](const Table& k) {
    std::vector<float> c(rows * rows, 0.5f), c1(rows, 0.5f);
    k.row_stable_matmul(c.data(), x.data(), dy.data(), rows, dim, rows, true);
    k.row_stable_matmul(c1.data(), x.data(), dy.data(), 1, dim, rows, false);
    c.insert(c.end(), c1.begin(), c1.end());
    return widen(c);
  });
  check_levels_agree("elementwise, SiLU and SwiGLU", rtol, [&](const Table& k) {
    std::vector<float> out(9 * rows * dim, 0.25f);
    float* o = out.data();
    std::size_t n = rows * dim;
    std::vector<float> written(2 * n, std::numeric_limits<float>::quiet_NaN());  // every element written
    k.add_forward(o, x.data(), b.data(), n);
    k.mul_backward(o + n, o + 2 * n, dy.data(), x.data(), b.data(), n);
    k.swiglu_forward(o + 3 * n, x.data(), b.data(), n);
    k.swiglu_backward(o + 4 * n, o + 5 * n, dy.data(), x.data(), b.data(), n, false);
    k.swiglu_backward(written.data(), written.data() + n, dy.data(), x.data(), b.data(), n, true);
    k.add_bias_backward(o, o + n, dy.data(), rows, dim);
    k.silu_forward(o + 6 * n, x.data(), n);
    k.silu_backward(o + 7 * n, dy.data(), x.data(), n);
    k.scale_backward(o + 8 * n, dy.data(), 0.3f, n);
    k.add_bias_forward(o + 8 * n, x.data(), w.data(), rows, dim);
    out.insert(out.end(), written.begin(), written.end());
    return widen(out);
  });
  check_levels_agree("the sum of squares of gradient clipping: the same bits", 0.0, [&](const Table& k) {
    const std::size_t n = 3 * 4096 + 77;  // blocks of 4096, and a last one with a tail past 8 chains
    auto g = test::random_vector<float>(n, 11, 4.0);
    return std::vector<double>{k.sum_squares(g.data(), n), k.sum_squares(g.data(), 4096 + 5)};
  });
  check_levels_agree("RMSNorm forward and backward", rtol, [&](const Table& k) {
    std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim), dw(dim);
    k.rms_norm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5f);
    k.rms_norm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, dim);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return widen(y);
  });
  check_levels_agree("LayerNorm forward and backward", rtol, [&](const Table& k) {
    std::vector<float> y(rows * dim), mean(rows), rstd(rows), dx(rows * dim), dw(dim), db(dim);
    k.layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, dim, 1e-5f);
    k.layer_norm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                          rows, dim);
    for (auto* part : {&mean, &rstd, &dx, &dw, &db}) y.insert(y.end(), part->begin(), part->end());
    return widen(y);
  });
  check_levels_agree("GELU (tanh) forward and backward", rtol, [&](const Table& k) {
    const std::size_t n = rows * dim;
    std::vector<float> y(n), s(n), dx(n, 0.5f), written(n, std::numeric_limits<float>::quiet_NaN());
    k.gelu_tanh_forward(y.data(), s.data(), x.data(), n);
    k.gelu_tanh_backward(dx.data(), dy.data(), x.data(), s.data(), n, false);
    k.gelu_tanh_backward(written.data(), dy.data(), x.data(), s.data(), n, true);  // every element written
    for (auto* part : {&s, &dx, &written}) y.insert(y.end(), part->begin(), part->end());
    return widen(y);
  });
  check_levels_agree("cross-entropy forward and backward", rtol, [&](const Table& k) {
    auto logits = test::random_vector<float>(rows * vocab, 5, 3.0);
    auto targets = test::random_ids(rows, vocab, 6);
    std::vector<float> lse(rows), dlogits(rows * vocab);
    float loss = k.cross_entropy_forward(lse.data(), logits.data(), targets.data(), rows, vocab);
    k.cross_entropy_backward(dlogits.data(), 1.0f, logits.data(), lse.data(), targets.data(), rows, vocab);
    dlogits.push_back(loss);
    return widen(dlogits);
  });
  // Flash attention: seq 37 (one partial tile) and 70 (crosses the 64-query and 64-key tiles; head
  // size 32 runs whole register blocks), with the log-sum-exp and all three gradients; then the
  // KV-cache forms: a prefill of 5 queries at offset 65 and one query (the decoding kernel).
  for (auto [length, n_heads, size] : {std::tuple{seq, heads, head_dim}, std::tuple{std::size_t(70), std::size_t(2), std::size_t(32)}})
    check_levels_agree("attention forward and backward, the prefill and the one-query (decoding) forms", rtol,
                       [&](const Table& kt) {
      const std::size_t T = length, H = n_heads, Dh = size, D = H * Dh;
      auto q = test::random_vector<float>(T * D, 7), k = test::random_vector<float>(T * D, 8);
      auto v = test::random_vector<float>(T * D, 9), dout = test::random_vector<float>(T * D, 10);
      std::vector<float> out(T * D), lse(H * T), dq(T * D), dk(T * D), dv(T * D);
      kernels::AttentionShape shape{1, T, T, H, Dh, 0};
      kt.attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), shape);
      kt.attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                            v.data(), shape, false);
      std::vector<float> tail(5 * D), tail_lse(5 * H), last(D), last_lse(H);
      kt.attention_forward(tail.data(), tail_lse.data(), q.data() + (T - 5) * D, k.data(), v.data(),
                           {1, 5, T, H, Dh, T - 5});
      kt.attention_forward(last.data(), last_lse.data(), q.data() + (T - 1) * D, k.data(), v.data(),
                           {1, 1, T, H, Dh, T - 1});
      for (auto* part : {&lse, &dq, &dk, &dv, &tail, &tail_lse, &last, &last_lse})
        out.insert(out.end(), part->begin(), part->end());
      // The cached form over keys in transposed blocks: the same 5 queries and the last one.
      const std::size_t blocks = (T + kernels::key_block - 1) / kernels::key_block;
      std::vector<float> key_blocks(blocks * D * kernels::key_block, 0.0f), value_planes(T * D), cached(5 * D),
          cached_last(D);
      std::vector<float> scratch(H * (blocks * kernels::key_block + 1));
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t c = 0; c < D; ++c) {
          key_blocks[t / kernels::key_block * D * kernels::key_block + c * kernels::key_block + t % kernels::key_block] =
              k[t * D + c];
          value_planes[(c / Dh * T + t) * Dh + c % Dh] = v[t * D + c];  // a plane of T rows per head
        }
      kt.cached_attention_forward(cached.data(), q.data() + (T - 5) * D, key_blocks.data(), value_planes.data(),
                                  {1, 5, T, H, Dh, T - 5}, scratch.data());
      kt.cached_attention_forward(cached_last.data(), q.data() + (T - 1) * D, key_blocks.data(), value_planes.data(),
                                  {1, 1, T, H, Dh, T - 1}, scratch.data());
      out.insert(out.end(), cached.begin(), cached.end());
      out.insert(out.end(), cached_last.begin(), cached_last.end());
      return widen(out);
    });
}

TEST_CASE("every level's table has every kernel of core/kernel_list.h") {
  for (SimdLevel level : testable_simd_levels()) {
    LevelGuard guard;
    set_simd_level(level);
    std::string level_name(simd_level_name(level));
    CAPTURE(level_name);
    const kernels::KernelTable<float>& table = kernels::active_table<float>();
#define TAPEGRAD_KERNEL(Return, name, parameters, arguments) CHECK_MESSAGE((table.name != nullptr), #name);
#include "core/kernel_list.h"
    CHECK(kernels::has_every_kernel(kernels::active_table<double>()));
  }
}

TEST_CASE("the kernels' folder includes only core/ headers, never a test's") {
  // Its files are compiled into the library at every level: a test header there would ship in it.
  const std::regex quoted_include(R"re(^\s*#\s*include\s*"([^"]*)")re");
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TAPEGRAD_SOURCE_DIR "/core/kernels")) {
    std::ifstream in(entry.path());
    ++files;
    for (std::string line; std::getline(in, line);)
      if (std::smatch m; std::regex_search(line, m, quoted_include))
        CHECK_MESSAGE(m[1].str().starts_with("core/"), entry.path().filename().string() << ": " << line);
  }
  CHECK(files > 0);
}

TEST_CASE("each level's prelinked objects define global symbols only in that level's namespace") {
  // Anything else (an inline std:: or xsimd function compiled with AVX-512 flags, say) could be
  // picked by the linker for code that runs on every CPU.
  for (const char* group : {"tapegrad_kernels", "tapegrad_simd_checks"})
    for (const char* level : {"sse2", "avx2", "avx512"}) {
      std::string object = fmt::format("{}/{}_{}.o", TAPEGRAD_BINARY_DIR, group, level);
      CAPTURE(object);
      REQUIRE(std::filesystem::exists(object));
      std::string command = fmt::format("nm --defined-only --extern-only '{}'", object);
      FILE* pipe = popen(command.c_str(), "r");
      REQUIRE(pipe != nullptr);
      char line[4096];
      std::size_t symbols = 0;
      // "N8tapegrad7kernels4avx2": the mangled namespace. Function-local statics of its functions
      // (_ZZN..., and their guards _ZGVZN...) stay global as GCC's unique symbols; they are its own.
      std::string_view namespace_name = std::string_view(group).substr(std::strlen("tapegrad_"));
      std::string prefix = fmt::format("N8tapegrad{}{}{}{}", namespace_name.size(), namespace_name, std::strlen(level), level);
      while (fgets(line, sizeof line, pipe)) {
        std::string_view text(line);
        std::string_view name = text.substr(text.rfind(' ') + 1);
        name.remove_suffix(name.ends_with('\n') ? 1 : 0);
        std::string_view rest = name.substr(name.starts_with("_ZGV") ? 4 : 2);
        while (rest.starts_with('Z')) rest.remove_prefix(1);
        CHECK_MESSAGE(rest.starts_with(prefix), name);
        ++symbols;
      }
      CHECK(pclose(pipe) == 0);
      CHECK(symbols > 0);
    }
}
