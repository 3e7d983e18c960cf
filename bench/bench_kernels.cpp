// Kernel throughput: the sgemm peak and memcpy bandwidth as references, then tapegrad::kernels matmuls
// and attention (GFLOP/s, % of the sgemm peak and of the FMA peak, the latter sampled in alternation
// with the kernel) and elementwise/row kernels (GB/s, % of the same-size memcpy), at 1 and 2
// threads. Every kernel is checked against a naive reference before it is timed. Writes
// bench/results/kernels_cpu.json (or --out); a partial run (--only, --quick) only to an --out it names.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>

#include "bench/bench_common.h"
#include "bench/fma_peak.h"
#include "core/bf16.h"
#include "core/kernels.h"
#include "core/random.h"

#ifdef TAPEGRAD_BENCH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kernels = tapegrad::kernels;
using namespace tapegrad::bench;

namespace {

using Buffer = std::vector<float>;

/// Times one callable in samples of as many calls as fill min_sample_s (so the clock's resolution
/// and call overhead stay out of short kernels), after two warm-up calls.
class Sampler {
 public:
  Sampler(std::function<void()> call, double min_sample_s) : call_(std::move(call)) {
    seconds_of(1);
    calls_ = std::clamp(int(std::ceil(min_sample_s / seconds_of(1))), 1, 10000);
  }
  double per_call() { return seconds_of(calls_) / calls_; }  ///< One sample: seconds per call.

 private:
  double seconds_of(int calls) {
    return seconds([&] {
      for (int i = 0; i < calls; ++i) call_();
    });
  }
  std::function<void()> call_;
  int calls_ = 1;
};

struct Timing {
  double median_s, min_s, max_s;  // per call
  double fma_fraction = 0;        // the median over samples of rate / the FMA peak sampled next to it
};

/// `samples` samples of `call`. With `peak` (the FMA loop and its flops per call), each sample is
/// followed by one of the loop's, and fma_fraction is the median ratio of the call's rate (`work`
/// flops per call) to the loop's in the sample after it: this host's speed moves by up to 60%
/// within minutes, and a change between two samples taken back to back hits both.
Timing time_calls(const std::function<void()>& call, int samples, double min_sample_s, double work = 0,
                  const std::function<void()>& peak = {}, double peak_work = 0) {
  Sampler kernel(call, min_sample_s);
  std::optional<Sampler> fma;
  if (peak) fma.emplace(peak, min_sample_s);
  std::vector<double> per_call, fractions;
  for (int r = 0; r < samples; ++r) {
    per_call.push_back(kernel.per_call());
    if (fma) fractions.push_back(work / per_call.back() / (peak_work / fma->per_call()));
  }
  Stats st = stats_of(per_call);
  return {st.median, st.min, st.max, fma ? stats_of(fractions).median : 0.0};
}

std::string format_seconds(double s) {
  return s >= 1e-3 ? fmt::format("{:.3f} ms", s * 1e3) : fmt::format("{:.1f} us", s * 1e6);
}

/// n standard-normal floats from a fixed seed.
Buffer random_buffer(std::size_t n, std::uint64_t seed) {
  tapegrad::Rng rng(seed);
  Buffer v(n);
  for (auto& x : v) x = rng.normal();
  return v;
}

/// Throws, naming what and where, unless |got - want| <= tol (1 + |want|).
void expect_close(const std::string& what, std::size_t index, double got, double want, double tol) {
  if (!(std::abs(got - want) <= tol * (1 + std::abs(want))))
    throw std::runtime_error(fmt::format("{}: mismatch at {}: got {}, reference {}", what, index, got, want));
}

/// Compares got[i] with want(i) at 17 indices spread over [0, n), the last one included.
void verify_samples(const std::string& what, const float* got, std::size_t n,
                    const std::function<double(std::size_t)>& want, double tol) {
  for (std::size_t k = 0; k <= 16; ++k) {
    std::size_t i = k == 16 ? n - 1 : (k * (n / 16) + k * 37) % n;
    expect_close(what, i, got[i], want(i), tol);
  }
}

struct Options {
  std::vector<int> threads{1, 2};
  int repeats = 20;
  double min_sample_s = 2e-3;  // calls are batched into samples this long, so the timer adds no noise
  std::string out = (std::filesystem::path(__FILE__).parent_path() / "results" / "kernels_cpu.json").string();
  bool out_named = false;  // --out given: a partial run (--only, --quick) writes only there
  bool partial = false;    // --only or --quick: not the full run the committed results file holds
  std::string only;  // a group (matmul, attention, rows) to run alone, with the references
};

struct Operand {  // a row-major matrix used as op(X) in a product
  const float* data;
  std::size_t ld;
  bool transposed;
  double at(std::size_t r, std::size_t c) const { return transposed ? data[c * ld + r] : data[r * ld + c]; }
};

/// Checks sampled entries of C (M, N) against initial + sum_k a(i, k) b(k, j) in double.
void verify_product(const std::string& what, const float* C, std::size_t M, std::size_t N, std::size_t K,
                    Operand a, Operand b, double initial = 0) {
  verify_samples(what, C, M * N, [&](std::size_t index) {
    double sum = initial;
    for (std::size_t k = 0; k < K; ++k) sum += a.at(index / N, k) * b.at(k, index % N);
    return sum;
  }, 1e-4);
}

// References in double for the checks.
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

double logsumexp(const float* row, std::size_t n) {
  double m = *std::max_element(row, row + n), sum = 0;
  for (std::size_t j = 0; j < n; ++j) sum += std::exp(row[j] - m);
  return m + std::log(sum);
}

// ---- cases ----

enum class Unit { flops, bytes };

struct Case {
  std::string group, name, shape;
  Unit unit;
  double work;                   // flops, or bytes read + written, per call
  std::function<void()> verify;  // runs on fresh outputs and throws on a mismatch with the reference
  std::function<void()> call;    // the timed call (accumulated gradients keep growing; harmless)
  bool work_per_thread = false;  // the peak: one independent sgemm per thread
};

std::string dims(std::size_t r, std::size_t c) { return fmt::format("({}x{})", r, c); }

/// The machine's sgemm peak: a single-threaded cblas_sgemm (n^3) on each thread, each on its own data.
Case peak_case(std::size_t n, int max_threads) {
  struct Data { std::vector<Buffer> a, b, c; };
  auto d = std::make_shared<Data>();
  for (int t = 0; t < max_threads; ++t)
    d->a.push_back(random_buffer(n * n, 10 + t)), d->b.push_back(random_buffer(n * n, 20 + t)), d->c.emplace_back(n * n);
  auto run = [d, n] {
#pragma omp parallel num_threads(tapegrad::num_threads())
    {
      int t = omp_get_thread_num(), m = int(n);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1.0f, d->a[t].data(), m, d->b[t].data(), m,
                  0.0f, d->c[t].data(), m);
    }
  };
  auto verify = [d, n, run] {
    run();
    verify_product("cblas_sgemm", d->c[0].data(), n, n, n, {d->a[0].data(), n, false}, {d->b[0].data(), n, false});
  };
  return {"reference", "cblas_sgemm peak", fmt::format("{}^3 per thread", n), Unit::flops, 2.0 * n * n * n, verify, run,
          true};
}

// ---- the FMA peak: the physical limit (the register-only loops of bench/fma_peak.h) ----

/// The FMA peak of one SIMD level in float: the level's loop on every kernel thread, flops counted per thread.
Case fma_peak_case(tapegrad::SimdLevel level) {
  FmaLoop fma = fma_loop(level);
  auto sink = std::make_shared<std::vector<float>>();
  auto run = [fma, sink] { run_fma_loop(fma, tapegrad::num_threads(), *sink); };  // throws on a non-finite sum
  return {"reference", fmt::format("fma peak {}", tapegrad::simd_level_name(level)), "registers only", Unit::flops,
          fma.flops, run, run, true};
}

/// memcpy of n floats split over the kernel threads: the memory-bandwidth reference (bytes = 2 n 4).
Case copy_case(std::size_t n, const std::string& label) {
  auto src = std::make_shared<Buffer>(random_buffer(n, 3)), dst = std::make_shared<Buffer>(n);
  auto run = [src, dst, n] {
    int threads = tapegrad::num_threads();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int p = 0; p < threads; ++p) {
      std::size_t begin = n * p / threads, end = n * (p + 1) / threads;
      std::memcpy(dst->data() + begin, src->data() + begin, (end - begin) * sizeof(float));
    }
  };
  auto verify = [src, dst, run] {
    run();
    if (*src != *dst) throw std::runtime_error("memcpy: the copy differs from its source");
  };
  return {"reference", fmt::format("memcpy {}", label), fmt::format("{} MiB", n * 4 >> 20), Unit::bytes, 8.0 * n,
          verify, run};
}

// Outputs are filled with ones before a checked call, so that overwriting where the kernel should
// accumulate (or the reverse) fails the check.
void fill_ones(Buffer& x) { std::fill(x.begin(), x.end(), 1.0f); }

/// C (M, N) = op(A) op(B) + beta C, computed by product(A, B, C); with bf16_operands, A and B hold
/// bfloat16 values (so that a bf16 product checks against the same reference).
Case product_case(std::string name, bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, float beta,
                  std::function<void(const float*, const float*, float*)> product, bool bf16_operands = false) {
  auto a = std::make_shared<Buffer>(random_buffer(M * K, 1)), b = std::make_shared<Buffer>(random_buffer(K * N, 2));
  if (bf16_operands)
    for (auto* operand : {a.get(), b.get()}) std::transform(operand->begin(), operand->end(), operand->begin(), tapegrad::round_to_bf16);
  auto c = std::make_shared<Buffer>(M * N);
  auto run = [=] { product(a->data(), b->data(), c->data()); };
  auto verify = [=] {
    fill_ones(*c);
    run();
    Operand op_a{a->data(), transpose_a ? M : K, transpose_a}, op_b{b->data(), transpose_b ? K : N, transpose_b};
    verify_product(name, c->data(), M, N, K, op_a, op_b, beta);
  };
  std::string shape = fmt::format("{}{}{}{}", transpose_a ? dims(K, M) : dims(M, K), transpose_a ? "^T" : "",
                                  transpose_b ? dims(N, K) : dims(K, N), transpose_b ? "^T" : "");
  return {"matmul", std::move(name), shape, Unit::flops, 2.0 * M * N * K, verify, run};
}

/// matmul_backward of y = x w, x (M, K), w (K, N): dx += dy w^T and dw += x^T dy.
Case matmul_backward_case(std::size_t M, std::size_t K, std::size_t N) {
  struct Data { Buffer x, w, dy, dx, dw; };
  auto d = std::make_shared<Data>(Data{random_buffer(M * K, 4), random_buffer(K * N, 5), random_buffer(M * N, 6),
                                       Buffer(M * K), Buffer(K * N)});
  auto run = [=] { kernels::matmul_backward(d->dx.data(), d->dw.data(), d->dy.data(), d->x.data(), d->w.data(), M, K, N); };
  auto verify = [=] {
    fill_ones(d->dx), fill_ones(d->dw);
    run();
    verify_product("matmul_backward dx", d->dx.data(), M, K, N, {d->dy.data(), N, false}, {d->w.data(), N, true}, 1);
    verify_product("matmul_backward dw", d->dw.data(), K, N, M, {d->x.data(), K, true}, {d->dy.data(), N, false}, 1);
  };
  return {"matmul", "matmul_backward", fmt::format("x{} w{}", dims(M, K), dims(K, N)), Unit::flops, 4.0 * M * N * K,
          verify, run};
}

/// C = op(A) op(B) + beta C through single-threaded cblas_sgemm calls, split over the kernel
/// threads by output rows as kernels::gemm splits its products: OpenBLAS as gemm would run it.
void cblas_sgemm_split(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t lda,
                       const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  int threads = tapegrad::num_threads();
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int p = 0; p < threads; ++p) {
    std::size_t begin = M * p / threads, end = M * (p + 1) / threads;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(end - begin), int(N),
                int(K), 1.0f, A + (ta ? begin : begin * lda), int(lda), B, int(ldb), beta, C + begin * ldc, int(ldc));
  }
}

#ifdef TAPEGRAD_BENCH_ONEDNN
/// C = op(A) op(B) + beta C by oneDNN's matmul primitive, which picks its JIT kernel by the CPU's
/// instruction sets (its name, for example brg:avx512_core, is printed with the case), on
/// tapegrad's kernel threads. A peer at gemm's shapes: the library a provider per shape would be.
Case onednn_case(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float beta) {
  using dnnl::memory;
  struct Primitive {
    dnnl::engine engine{dnnl::engine::kind::cpu, 0};
    dnnl::stream stream{engine};
    dnnl::matmul::primitive_desc desc;
    dnnl::matmul matmul;
  };
  auto p = std::make_shared<Primitive>();
  const auto m = memory::dim(M), n = memory::dim(N), k = memory::dim(K);
  const memory::desc a({m, k}, memory::data_type::f32, ta ? memory::dims{1, m} : memory::dims{k, 1});
  const memory::desc b({k, n}, memory::data_type::f32, tb ? memory::dims{1, k} : memory::dims{n, 1});
  const memory::desc c({m, n}, memory::data_type::f32, memory::dims{n, 1});
  dnnl::primitive_attr attr;
  if (beta != 0) {
    dnnl::post_ops sum;
    sum.append_sum(beta);
    attr.set_post_ops(sum);
  }
  p->desc = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, p->engine);
  p->matmul = dnnl::matmul(p->desc);
  const char* form = ta ? "TN" : tb ? "NT" : "NN";
  return product_case(fmt::format("oneDNN {} {} b={}", p->desc.impl_info_str(), form, beta), ta, tb, M, N, K, beta,
                      [=](const float* x, const float* y, float* z) {
                        omp_set_num_threads(tapegrad::num_threads());  // its OpenMP runtime's team size
                        memory am(a, p->engine, const_cast<float*>(x)), bm(b, p->engine, const_cast<float*>(y)),
                            cm(c, p->engine, z);
                        p->matmul.execute(p->stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
                        p->stream.wait();
                      });
}
#endif

std::vector<Case> matmul_cases() {
  auto forward = [](std::size_t M, std::size_t K, std::size_t N) {
    return product_case("matmul_forward", false, false, M, N, K, 0.0f,
                        [=](const float* x, const float* w, float* y) { kernels::matmul_forward(y, x, w, M, K, N); });
  };
  auto gemm = [](std::string name, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float beta) {
    return product_case(std::move(name), ta, tb, M, N, K, beta, [=](const float* a, const float* b, float* c) {
      kernels::gemm(ta, tb, M, N, K, 1.0f, a, ta ? M : K, b, tb ? K : N, beta, c, N);
    });
  };
  std::vector<Case> cases = {
      gemm("gemm NN", false, false, 1024, 1024, 1024, 0.0f), forward(2048, 128, 512), forward(2048, 512, 128),
      gemm("gemm TN b=1 (dW = X^T dY)", true, false, 128, 512, 2048, 1.0f),
      gemm("gemm NT b=1 (dX = dY W^T)", false, true, 2048, 128, 512, 1.0f), matmul_backward_case(2048, 128, 512),
      matmul_backward_case(2048, 512, 128)};
  // The two candidates for gemm, side by side at the training configs' shapes (rows B*T = 2048 or
  // 768, inner and outer sizes d and 4d), each form with the beta training gives it: forward NN
  // and dX = dY W^T (NT) write a fresh output (beta 0: OpenBLAS then zeroes C in a pass of its
  // own first), dW = X^T dY (TN) adds into the parameter's gradient (beta 1). gemm picks
  // packed_gemm or OpenBLAS per CPU and shape from figures like these.
  auto candidates = [&](bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K) {
    const char* form = ta ? "TN" : tb ? "NT" : "NN";
    const float beta = ta ? 1.0f : 0.0f;
    cases.push_back(product_case(fmt::format("packed_gemm {} b={}", form, beta), ta, tb, M, N, K, beta,
                                 [=](const float* a, const float* b, float* c) {
                                   kernels::packed_gemm(ta, tb, M, N, K, 1.0f, a, ta ? M : K, b, tb ? K : N, beta, c, N);
                                 }));
    cases.push_back(product_case(fmt::format("cblas_sgemm {} b={}", form, beta), ta, tb, M, N, K, beta,
                                 [=](const float* a, const float* b, float* c) {
                                   cblas_sgemm_split(ta, tb, M, N, K, a, ta ? M : K, b, tb ? K : N, beta, c, N);
                                 }));
#ifdef TAPEGRAD_BENCH_ONEDNN
    cases.push_back(onednn_case(ta, tb, M, N, K, beta));
#endif
  };
  for (auto [rows, d] : {std::pair<std::size_t, std::size_t>{2048, 64}, {768, 128}, {2048, 256}}) {
    const std::size_t R = rows, D = d;  // named: lambdas cannot capture bindings in clang 14
    for (auto [in, out] : {std::pair{D, D}, {D, 4 * D}, {4 * D, D}}) {
      const std::size_t K = in, N = out;
      candidates(false, false, R, N, K);  // y = x w
      candidates(false, true, R, K, N);   // dx = dy w^T
      candidates(true, false, K, N, R);   // dw = x^T dy
    }
  }
  // Decoding's products (the seed model, d 64, d_ff 256, one row per sequence): the row-stable
  // kernel the cache pass uses against matmul_forward (BLAS above two rows) at the same shapes.
  for (std::size_t M : {std::size_t(1), std::size_t(8), std::size_t(64)})
    for (auto shape : {std::pair<std::size_t, std::size_t>{64, 64}, {64, 256}, {256, 64}}) {
      const std::size_t K = shape.first, N = shape.second;  // named: lambdas cannot capture bindings in clang 14
      cases.push_back(product_case("row_stable_matmul (decoding)", false, false, M, N, K, 0.0f,
                                   [=](const float* x, const float* w, float* y) {
                                     kernels::row_stable_matmul(y, x, w, M, K, N, false);
                                   }));
      cases.push_back(forward(M, K, N));
    }
  return cases;
}

// ---- bf16 products ----

/// bf16_gemm's paths (AMX tiles, the AVX512_BF16 instruction, the FMA chain: each where the CPU
/// has it, else the next one down; the same bits) and float32 gemm side by side at SmolLM2-135M's
/// training products (B 4 x T 256 = 1024 rows, d 576, KV 192, d_ff 1536, vocab 49152): forward,
/// dX = dY W^T and dW = X^T dY. The operands are rounded to bf16 first, so that every result
/// checks against the same double reference.
std::vector<Case> bf16_cases() {
  std::vector<Case> cases;
  auto add = [&](std::string what, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K) {
    const float beta = ta ? 1.0f : 0.0f;  // dW adds into the gradient
    for (auto [path, name] : {std::pair{kernels::Bf16Path::amx_tiles, "bf16 amx_tiles"},
                              std::pair{kernels::Bf16Path::dot_product_instruction, "bf16 dot_product_instruction"},
                              std::pair{kernels::Bf16Path::fma_chain, "bf16 fma_chain"}})
      cases.push_back(product_case(
          fmt::format("{} {}", name, what), ta, tb, M, N, K, beta,
          [=](const float* a, const float* b, float* c) {
            kernels::bf16_gemm_via<float>(path, ta, tb, M, N, K, a, ta ? M : K, b, tb ? K : N, beta != 0, c, N);
          },
          true));
    cases.push_back(product_case(
        fmt::format("gemm {}", what), ta, tb, M, N, K, beta,
        [=](const float* a, const float* b, float* c) {
          kernels::gemm(ta, tb, M, N, K, 1.0f, a, ta ? M : K, b, tb ? K : N, beta, c, N);
        },
        true));
    for (int last = 1; last <= 4; ++last) cases.end()[-last].group = "bf16";
  };
  add("NN q,o", false, false, 1024, 576, 576);
  add("NN k,v", false, false, 1024, 192, 576);
  add("NN gate,up", false, false, 1024, 1536, 576);
  add("NN down", false, false, 1024, 576, 1536);
  add("NT dX down", false, true, 1024, 1536, 576);
  add("TN dW gate", true, false, 576, 1536, 1024);
  add("NT head", false, true, 1024, 49152, 576);
  return cases;
}

// ---- attention ----

struct AttentionData {
  kernels::AttentionShape s;
  Buffer q, k, v, dout, out, lse, dq, dk, dv;
  double at(const Buffer& x, std::size_t b, std::size_t t, std::size_t h, std::size_t d) const {
    return x[(b * s.q_len + t) * s.model_dim() + h * s.head_dim + d];
  }
  /// Reference probabilities of query i over keys 0..i of (b, h), and dS_ij = P_ij (dP_ij - sum_l
  /// P_il dP_il) / sqrt(Dh) with dP_ij = dout_i . v_j.
  void reference_row(std::size_t b, std::size_t h, std::size_t i, std::vector<double>& p, std::vector<double>& ds) const {
    p.assign(i + 1, 0.0), ds.assign(i + 1, 0.0);
    double scale = 1 / std::sqrt(double(s.head_dim)), sum = 0, centre = 0;
    for (std::size_t j = 0; j <= i; ++j)
      for (std::size_t d = 0; d < s.head_dim; ++d)
        p[j] += at(q, b, i, h, d) * at(k, b, j, h, d) * scale, ds[j] += at(dout, b, i, h, d) * at(v, b, j, h, d);
    double m = *std::max_element(p.begin(), p.end());
    for (auto& x : p) sum += (x = std::exp(x - m));
    for (std::size_t j = 0; j <= i; ++j) p[j] /= sum, centre += p[j] * ds[j];
    for (std::size_t j = 0; j <= i; ++j) ds[j] = p[j] * (ds[j] - centre) * scale;
  }
  double reference_lse(std::size_t b, std::size_t h, std::size_t i) const {
    std::vector<double> scores(i + 1);
    for (std::size_t j = 0; j <= i; ++j)
      for (std::size_t d = 0; d < s.head_dim; ++d) scores[j] += at(q, b, i, h, d) * at(k, b, j, h, d);
    double m = *std::max_element(scores.begin(), scores.end()), sum = 0;
    for (double x : scores) sum += std::exp((x - m) / std::sqrt(double(s.head_dim)));
    return m / std::sqrt(double(s.head_dim)) + std::log(sum);
  }
  void forward() { kernels::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s); }
  void backward() {
    kernels::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                                k.data(), v.data(), s, false);
  }
  /// Runs forward and backward on fresh outputs and checks out, lse, dq, dk and dv on one (b, h).
  void verify() {
    for (Buffer* g : {&out, &dq, &dk, &dv}) fill_ones(*g);  // out is overwritten, the gradients accumulate
    forward();
    backward();
    const std::size_t T = s.q_len, b = s.batch - 1, h = s.n_heads / 2;
    std::vector<std::vector<double>> p(T), ds(T);
    for (std::size_t i = 0; i < T; ++i) reference_row(b, h, i, p[i], ds[i]);
    for (std::size_t t : {std::size_t(0), T / 3, T - 1}) {
      expect_close("attention_forward lse", t, lse[(b * s.n_heads + h) * T + t], reference_lse(b, h, t), 1e-5);
      for (std::size_t d = 0; d < s.head_dim; ++d) {
        double o = 0, dq_ref = 1, dk_ref = 1, dv_ref = 1;
        for (std::size_t j = 0; j <= t; ++j) o += p[t][j] * at(v, b, j, h, d), dq_ref += ds[t][j] * at(k, b, j, h, d);
        for (std::size_t i = t; i < T; ++i) dk_ref += ds[i][t] * at(q, b, i, h, d), dv_ref += p[i][t] * at(dout, b, i, h, d);
        expect_close("attention_forward out", t, at(out, b, t, h, d), o, 1e-4);
        expect_close("attention_backward dq", t, at(dq, b, t, h, d), dq_ref, 1e-4);
        expect_close("attention_backward dk", t, at(dk, b, t, h, d), dk_ref, 1e-4);
        expect_close("attention_backward dv", t, at(dv, b, t, h, d), dv_ref, 1e-4);
      }
    }
  }
};

/// Flops of the causal half only: forward = QK^T and PV over the T(T+1)/2 visible (query, key)
/// pairs, 2 flops per multiply-add: 2 * 2 * B*H*Dh * T(T+1)/2; backward (dV, dP, dQ, dK) is twice that.
std::vector<Case> attention_cases(std::size_t B, std::size_t T, std::size_t H, std::size_t Dh) {
  std::size_t n = B * T * H * Dh;
  auto a = std::make_shared<AttentionData>(AttentionData{{B, T, T, H, Dh, 0}, random_buffer(n, 7), random_buffer(n, 8),
                                                         random_buffer(n, 9), random_buffer(n, 11), Buffer(n),
                                                         Buffer(B * H * T), Buffer(n), Buffer(n), Buffer(n)});
  double forward_flops = 2.0 * 2.0 * double(B * H * Dh) * double(T * (T + 1) / 2);
  std::string shape = fmt::format("B{} T{} H{} Dh{}", B, T, H, Dh);
  return {{"attention", "attention_forward", shape, Unit::flops, forward_flops, [a] { a->verify(); }, [a] { a->forward(); }},
          {"attention", "attention_backward", shape, Unit::flops, 2 * forward_flops, [a] { a->verify(); },
           [a] { a->backward(); }}};
}

// ---- elementwise and row kernels on (rows, dim) ----

/// Bytes are the compulsory traffic: every input read once, every output written once (an
/// accumulated output read and written), 4 bytes a float. Like memcpy's 2 bytes per byte copied, this
/// leaves out the read a store miss costs, so kernels that read more than they write can pass 100%.
std::vector<Case> row_cases(std::size_t rows, std::size_t dim) {
  const std::size_t n = rows * dim, vocab = 65, seq_len = 256, head_dim = 32;
  struct Data { Buffer a, b, c, dy, w, logits65, table, y, da, db, dw, rstd, lse, loss; std::vector<std::int32_t> ids; };
  auto d = std::make_shared<Data>(Data{random_buffer(n, 12), random_buffer(n, 13), random_buffer(n, 14),
                                       random_buffer(n, 15), random_buffer(dim, 16), random_buffer(rows * vocab, 17),
                                       random_buffer(vocab * dim, 18), Buffer(n), Buffer(n), Buffer(n), Buffer(dim),
                                       Buffer(rows), Buffer(rows), Buffer(1), {}});
  tapegrad::Rng rng(19);
  for (std::size_t r = 0; r < rows; ++r) d->ids.push_back(std::int32_t(rng.below(vocab)));  // also the targets
  auto rope = std::make_shared<kernels::RopeTable<float>>(kernels::make_rope_table<float>(seq_len, head_dim));
  auto rstd = [d, dim](std::size_t r) {  // 1 / sqrt(mean(x^2) + eps) of row r of a
    double sum = 0;
    for (std::size_t j = 0; j < dim; ++j) sum += double(d->a[r * dim + j]) * d->a[r * dim + j];
    return 1 / std::sqrt(sum / double(dim) + 1e-5);
  };
  struct Expected {
    const Buffer* output;
    std::function<double(std::size_t)> want;
    std::size_t size = 0;  // elements checked; 0 = the whole buffer
  };
  std::vector<Case> cases;
  // prepare() sets the outputs up (default: y filled with ones); after one call every output must
  // match its reference.
  auto add = [&](std::string name, std::string shape, double floats, std::function<void()> run,
                 std::vector<Expected> expected, std::function<void()> prepare = nullptr) {
    auto verify = [=] {
      prepare ? prepare() : fill_ones(d->y);
      run();
      for (const Expected& e : expected)
        verify_samples(name, e.output->data(), e.size ? e.size : e.output->size(), e.want, 1e-4);
    };
    cases.push_back({"rows", std::move(name), std::move(shape), Unit::bytes, 4 * floats, verify, run});
  };
  const std::string shape = dims(rows, dim);
  const float *a = d->a.data(), *b = d->b.data(), *c = d->c.data(), *dy = d->dy.data(), *w = d->w.data();
  float *y = d->y.data(), *da = d->da.data();
  add("add_forward", shape, 3.0 * n, [=] { kernels::add_forward(y, a, b, n); },
      {{&d->y, [=](auto i) { return double(a[i]) + b[i]; }}});
  add("accumulate", shape, 3.0 * n, [=] { kernels::accumulate(y, a, n); },
      {{&d->y, [=](auto i) { return double(c[i]) + a[i]; }}}, [=] { std::copy_n(c, n, y); });
  add("mul_forward", shape, 3.0 * n, [=] { kernels::mul_forward(y, a, b, n); },
      {{&d->y, [=](auto i) { return double(a[i]) * b[i]; }}});
  add("silu_forward", shape, 2.0 * n, [=] { kernels::silu_forward(y, a, n); },
      {{&d->y, [=](auto i) { return a[i] * sigmoid(a[i]); }}});
  add("swiglu_forward", shape, 3.0 * n, [=] { kernels::swiglu_forward(y, a, b, n); },
      {{&d->y, [=](auto i) { return a[i] * sigmoid(a[i]) * b[i]; }}});
  add("swiglu_backward", shape, 7.0 * n, [=] { kernels::swiglu_backward(da, d->db.data(), dy, a, b, n, false); },
      {{&d->da, [=](auto i) { return 1 + dy[i] * b[i] * sigmoid(a[i]) * (1 + a[i] * (1 - sigmoid(a[i]))); }},
       {&d->db, [=](auto i) { return 1 + dy[i] * a[i] * sigmoid(a[i]); }}},
      [=] { fill_ones(d->da), fill_ones(d->db); });
  add("rms_norm_forward", shape, 2.0 * n + dim + rows,
      [=] { kernels::rms_norm_forward(y, d->rstd.data(), a, w, rows, dim, 1e-5f); },
      {{&d->y, [=](auto i) { return a[i] * rstd(i / dim) * w[i % dim]; }}, {&d->rstd, rstd}});
  // dx_j = r g_j - x_j r^3 sum_k(g_k x_k) / D with g = dy w; dw_j = sum over rows of dy_j x_j r.
  auto rms_dx = [=](std::size_t i) {
    std::size_t row = i / dim;
    double r = rstd(row), gx = 0;
    for (std::size_t k = 0; k < dim; ++k) gx += double(dy[row * dim + k]) * w[k] * a[row * dim + k];
    return 1 + r * dy[i] * w[i % dim] - a[i] * r * r * r * gx / double(dim);
  };
  auto rms_dw = [=](std::size_t j) {
    double sum = 1;
    for (std::size_t row = 0; row < rows; ++row) sum += double(dy[row * dim + j]) * a[row * dim + j] * rstd(row);
    return sum;
  };
  add("rms_norm_backward", shape, 4.0 * n + 3.0 * dim + rows,
      [=] { kernels::rms_norm_backward(da, d->dw.data(), dy, a, w, d->rstd.data(), rows, dim); },
      {{&d->da, rms_dx}, {&d->dw, rms_dw}}, [=] { fill_ones(d->da), fill_ones(d->dw); });
  add("rope_forward", fmt::format("{} H{} Dh{}", shape, dim / head_dim, head_dim), 2.0 * n + 2.0 * rope->cos.size(),
      [=] { kernels::rope_forward(y, a, *rope, rows / seq_len, seq_len, dim / head_dim, head_dim, 0); },
      {{&d->y, [=](std::size_t i) {
          std::size_t pos = i / dim % seq_len, pair = i % head_dim / 2, even = i & ~std::size_t(1);
          double angle = double(pos) * std::pow(10000.0, -2.0 * double(pair) / double(head_dim));
          double x0 = a[even], x1 = a[even + 1];
          return i % 2 ? x0 * std::sin(angle) + x1 * std::cos(angle) : x0 * std::cos(angle) - x1 * std::sin(angle);
        }}});
  for (std::size_t cols : {vocab, dim}) {
    const float* logits = cols == vocab ? d->logits65.data() : a;
    const std::int32_t* targets = d->ids.data();
    auto lse = [=](std::size_t r) { return logsumexp(logits + r * cols, cols); };
    auto mean_loss = [=](std::size_t) {
      double sum = 0;
      for (std::size_t r = 0; r < rows; ++r) sum += lse(r) - logits[r * cols + targets[r]];
      return sum / double(rows);
    };
    add("cross_entropy_forward", dims(rows, cols), double(rows * cols) + 2.0 * rows,
        [=] { d->loss[0] = kernels::cross_entropy_forward(d->lse.data(), logits, targets, rows, cols); },
        {{&d->lse, lse}, {&d->loss, mean_loss}});
    // dloss = N, so dlogits += softmax - onehot(targets).
    add("cross_entropy_backward", dims(rows, cols), 3.0 * double(rows * cols) + 2.0 * rows,
        [=] { kernels::cross_entropy_backward(da, float(rows), logits, d->lse.data(), targets, rows, cols); },
        {{&d->da, [=](std::size_t i) {
            return 1 + std::exp(logits[i] - lse(i / cols)) - (std::size_t(targets[i / cols]) == i % cols ? 1.0 : 0.0);
          }, rows * cols}},
        [=] { fill_ones(d->da), kernels::cross_entropy_forward(d->lse.data(), logits, targets, rows, cols); });
  }
  add("embedding_forward", fmt::format("{} V{}", shape, vocab), 2.0 * n + rows,
      [=] { kernels::embedding_forward(y, d->table.data(), d->ids.data(), rows, dim); },
      {{&d->y, [=](auto i) { return d->table[d->ids[i / dim] * dim + i % dim]; }}});
  return cases;
}

// ---- report ----

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
      return std::string(argv[++i]);
    };
    if (flag == "--threads") {  // a comma-separated list
      options.threads = positive_list(flag, value());
    } else if (flag == "--repeats") {
      options.repeats = positive_int(flag, value());
    } else if (flag == "--quick") {
      options.repeats = 3, options.min_sample_s = 2e-4, options.partial = true;
    } else if (flag == "--out") {
      options.out = value(), options.out_named = true;
    } else if (flag == "--only") {
      options.only = value(), options.partial = true;
    } else if (flag == "--help") {
      fmt::print("usage: bench_kernels [--threads 1,2] [--repeats N] [--quick] [--out PATH] [--only GROUP]\n{}",
                 simd_usage_line());
      std::exit(0);
    } else {
      throw std::invalid_argument(fmt::format("unknown flag {}; flags: --threads 1,2 --repeats N --quick --out PATH --only GROUP", flag));
    }
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) try {
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const std::exception& e) {  // a usage error: exit 2, as the other benches
    fmt::print(stderr, "bench_kernels: bad argument: {}\n", e.what());
    return 2;
  }
  tapegrad::set_num_threads(1);  // also pins OpenBLAS to one thread before its first call
  std::vector<Case> cases{peak_case(1024, *std::max_element(options.threads.begin(), options.threads.end())),
                          copy_case(2048 * 512, "(= one row operand)"), copy_case(std::size_t(16) << 20, "(> L3)")};
  for (tapegrad::SimdLevel level : tapegrad::supported_simd_levels()) cases.push_back(fma_peak_case(level));
  // Attention at head sizes Dh 32 and 64 and lengths T 256 and 1024 (B*H chosen for calls of a few
  // ms) and at the shapes of configs (b) and (a) / a-gpt2.
  for (auto more : {matmul_cases(), bf16_cases(), attention_cases(4, 256, 8, 32), attention_cases(4, 256, 4, 64),
                    attention_cases(1, 1024, 8, 32), attention_cases(1, 1024, 4, 64), attention_cases(12, 64, 4, 32),
                    attention_cases(16, 128, 4, 16), row_cases(2048, 512)})
    for (Case& c : more)
      if (options.only.empty() || c.group == options.only) cases.push_back(std::move(c));

  nlohmann::json json = run_header();
  fmt::print("tapegrad kernels on {} ({} cpus, SIMD level {}, OpenBLAS core {}); {} samples, median per call\n",
             json["machine"]["cpu"].get<std::string>(), omp_get_num_procs(), tapegrad::simd_level_name(tapegrad::simd_level()),
             openblas_get_corename(), options.repeats);
  print_blas_warning();
#ifndef TAPEGRAD_BENCH_ONEDNN
  if (options.only.empty() || options.only == "matmul")
    fmt::print("  oneDNN's matmul is not among the products: install libdnnl-dev and configure again to add it\n");
#endif
  nlohmann::json results = nlohmann::json::array(), peak, copy;  // references by thread count: median and best rate
  // The FMA peak of every level by thread count, and of the level the kernels run at (% fma).
  nlohmann::json fma_peaks;
  const std::string fma_in_use = fmt::format("fma peak {}", tapegrad::simd_level_name(tapegrad::simd_level()));
  const auto fma_case = std::find_if(cases.begin(), cases.end(), [&](const Case& c) { return c.name == fma_in_use; });
  if (fma_case == cases.end())
    throw std::runtime_error(fmt::format("SIMD level {} is a test level with no FMA peak to measure; time sse2, avx2 "
                                         "or avx512",
                                         tapegrad::simd_level_name(tapegrad::simd_level())));
  for (int threads : options.threads) {
    tapegrad::set_num_threads(threads);
    fmt::print("\n{:<27} {:<27} {:>3} {:>11} {:>23} {:>14} {:>6} {:>6} {:>6}\n", "kernel", "shape", "thr", "median",
               "min - max", "rate (median)", "% ref", "best", "% fma");
    for (const Case& c : cases) {
      c.verify();
      bool flops = c.unit == Unit::flops, paired = flops && c.group != "reference";
      double work = c.work * (c.work_per_thread ? threads : 1);
      Timing timing = paired ? time_calls(c.call, options.repeats, options.min_sample_s, work, fma_case->call,
                                          fma_case->work * threads)
                             : time_calls(c.call, options.repeats, options.min_sample_s);
      double rate = work / timing.median_s / 1e9, best_rate = work / timing.min_s / 1e9;
      nlohmann::json& reference = (flops ? peak : copy)[std::to_string(threads)];
      if (reference.is_null()) reference = {{"median", rate}, {"best", best_rate}};  // each unit's first reference
      double fraction = rate / reference["median"].get<double>(), best = best_rate / reference["best"].get<double>();
      if (c.name.starts_with("fma peak ")) fma_peaks[c.name.substr(9)][std::to_string(threads)] = rate;
      const double fma_fraction = timing.fma_fraction;
      fmt::print("{:<27} {:<27} {:>3} {:>11} {:>23} {:>7.1f} {:<6} {:>5.0f}% {:>5.0f}% {:>6}\n", c.name, c.shape, threads,
                 format_seconds(timing.median_s), format_seconds(timing.min_s) + " - " + format_seconds(timing.max_s),
                 rate, flops ? "GF/s" : "GB/s", 100 * fraction, 100 * best,
                 fma_fraction > 0 ? fmt::format("{:.0f}%", 100 * fma_fraction) : "");
      results.push_back({{"group", c.group}, {"kernel", c.name}, {"shape", c.shape}, {"threads", threads},
                         {"median_s", timing.median_s}, {"min_s", timing.min_s}, {"max_s", timing.max_s},
                         {flops ? "flops_per_call" : "bytes_per_call", work}, {flops ? "gflops" : "gbytes_per_s", rate},
                         {"fraction_of_reference", fraction}, {"fraction_of_reference_best", best}});
      if (fma_fraction > 0) results.back()["fraction_of_fma_peak"] = fma_fraction;
    }
  }
  json.update({
      {"samples", options.repeats},
      {"loadavg_after", command_output("cat /proc/loadavg")},
      {"fractions", "fraction_of_reference: median rate / the reference's median rate (sgemm peak for GF/s, the "
                    "4 MiB memcpy for GB/s); _best: the same from the fastest samples (less sensitive to neighbours)"},
      {"flop_count", "matmul 2MNK (matmul_backward 4MNK); attention causal half only: forward 4*B*H*Dh*T(T+1)/2, "
                     "backward twice that"},
      {"byte_count", "compulsory traffic: inputs read once, outputs written once, accumulated outputs read and "
                     "written; memcpy counts 2 bytes per byte copied; neither counts write-allocate reads, so a "
                     "kernel reading more than it writes can exceed 100% of memcpy"},
      {"fraction_of_fma_peak", "median over samples of rate / the FMA peak of the SIMD level in use on as many "
                                "threads, sampled right after each sample of the kernel"},
      {"sgemm_peak_gflops", peak}, {"fma_peak_gflops", fma_peaks}, {"memcpy_gbytes_per_s", copy},
      {"results", results}});
  if (options.partial && !options.out_named)
    fmt::print("  results not written: --only and --quick write to a file --out names, not over {}\n", options.out);
  else
    write_results(options.out, json);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_kernels: {}\n", e.what());
  return 1;
}
