// bench_train: ms/step and tokens/s of one full training step (forward, backward, clip 1.0, AdamW,
// zero_grad) for configs (a)-(d) and a-gpt2 (bench/train_common.h) at 1 and 2 threads, model FLOP/s as
// a fraction of the sgemm peak and of the FMA peak, both measured here, and each config's peak memory
// (resident set of a fresh process running two steps, with and without remat). Writes
// bench/results/train_cpu.json.
#include <cblas.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "bench/bench_common.h"
#include "bench/fma_peak.h"
#include "bench/train_common.h"
#include "core/kernels.h"
#include "nn/checkpoint.h"
#include "nn/models/rotary_decoder.h"
#include "nn/generate.h"
#include "tokenizers/char_tokenizer.h"

using namespace tapegrad;

namespace {

struct SgemmPeak {
  double best_gflops = 0, median_gflops = 0;
};

/// C (n, n) = A B with uniform inputs: one cblas_sgemm call at 1 thread, tapegrad's kernels::gemm
/// (which splits C across the OpenMP threads, each calling single-threaded BLAS) above that.
/// Checked against a double-precision dot product on a few elements before timing.
SgemmPeak measure_sgemm(std::size_t n, int threads, int repeats) {
  set_num_threads(threads);
  Rng rng(7);
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (float& x : a) x = rng.uniform() - 0.5f;
  for (float& x : b) x = rng.uniform() - 0.5f;
  auto run = [&] {
    if (threads == 1)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(n), int(n), 1.0f, a.data(), int(n), b.data(),
                  int(n), 0.0f, c.data(), int(n));
    else
      kernels::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  run();  // warm-up, and the result checked below
  for (std::size_t k = 0; k < 16; ++k) {
    std::size_t i = rng.below(n), j = rng.below(n);
    double ref = 0;
    for (std::size_t p = 0; p < n; ++p) ref += double(a[i * n + p]) * double(b[p * n + j]);
    if (std::abs(ref - c[i * n + j]) > 1e-3 * (1 + std::abs(ref)))
      throw std::runtime_error(fmt::format("sgemm check failed at ({}, {}): {} vs {}", i, j, c[i * n + j], ref));
  }
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) times.push_back(bench::seconds(run));
  bench::Stats s = bench::stats_of(times);
  double flops = 2.0 * double(n) * double(n) * double(n);
  return {flops / s.min * 1e-9, flops / s.median * 1e-9};
}

struct RunResult {
  bench::Stats ms;
  std::array<double, 5> phase_ms{};  // medians of forward, backward, clip, adamw, zero_grad
  float first_loss = 0, last_loss = 0;
};

/// A fresh model (seed 0) at the given thread count: one warm-up step, then `steps` timed steps.
RunResult time_training(const bench::TrainConfig& config, int threads, int steps) {
  set_num_threads(threads);
  bench::Trainer trainer(config);
  RunResult result;
  result.first_loss = trainer.step();  // warm-up
  std::vector<double> ms;
  std::array<std::vector<double>, 5> phases;
  for (int s = 0; s < steps; ++s) {
    ms.push_back(1e3 * bench::seconds([&] { result.last_loss = trainer.step(); }));
    for (std::size_t p = 0; p < phases.size(); ++p) phases[p].push_back(trainer.last_phase_ms[p]);
  }
  result.ms = bench::stats_of(ms);
  for (std::size_t p = 0; p < phases.size(); ++p) result.phase_ms[p] = bench::stats_of(phases[p]).median;
  return result;
}

/// The peak resident set (MiB) of this process after a warm-up and one more training step of
/// `config`: run by measure_peak_memory in a fresh process, so no other config's buffers count.
double peak_memory_here(const bench::TrainConfig& config, bool remat) {
  set_num_threads(1);
  bench::Trainer trainer(config, remat);
  trainer.step();
  trainer.step();
  // VmHWM rather than ru_maxrss, which a process started by fork and exec may inherit from its parent.
  return double(bench::proc_status_kib("VmHWM")) / 1024.0;
}

/// Runs `bench_train --peak-memory NAME [--remat]` (this program, fresh) and reads its MiB.
double measure_peak_memory(const std::string& name, bool remat) {
  std::string command = fmt::format("'{}' --peak-memory {}{}", std::filesystem::read_symlink("/proc/self/exe").string(),
                                    name, remat ? " --remat" : "");
  std::string output = bench::command_output(command);
  try {
    return std::stod(output);
  } catch (const std::exception&) {
    throw std::runtime_error(fmt::format("peak memory of config {}: `{}` printed '{}'", name, command, output));
  }
}

/// 0.1f as 0.1, not 0.10000000149011612: the shortest decimal that reads back as the same float.
double as_double(float x) { return std::stod(fmt::format("{}", x)); }

/// The 65 characters of tiny-Shakespeare, so agreement checkpoints carry a real vocabulary.
const char* kVocab = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// For each config: DIR/agreement_<name>.safetensors (the seed-0 model) and DIR/agreement_<name>.json
/// (the batch, tapegrad's loss, gradient norm before clipping, and the loss after one full step);
/// and DIR/agreement_decode.* for bench_kv_cache's model: the prompt's prefill logits and the
/// 100 greedy tokens of the cached path.
void write_agreement(const std::string& dir, const std::vector<std::string>& names) {
  std::filesystem::create_directories(dir);
  set_num_threads(1);
  tokenizers::CharTokenizer tokenizer = tokenizers::CharTokenizer::from_vocab(kVocab);
  for (const std::string& name : names) {
    bench::TrainConfig config = bench::train_config(name);
    bench::Trainer trainer(config);
    std::string checkpoint = fmt::format("{}/agreement_{}.safetensors", dir, name);
    nn::save_model_checkpoint(checkpoint, trainer.model, tokenizer);
    float loss = trainer.step();
    float grad_norm = trainer.last_grad_norm;
    float loss_after = trainer.loss();
    optim::AdamWOptions o = bench::bench_adamw_options();
    nlohmann::json j;
    j["config"] = {{"name", name},         {"vocab", config.vocab},       {"d_model", config.d_model},
                   {"n_heads", config.n_heads}, {"n_blocks", config.n_blocks}, {"max_len", config.seq_len},
                   {"d_ff", config.d_ff()}, {"arch", config.arch}};
    j["batch"] = config.batch;
    j["seq_len"] = config.seq_len;
    j["inputs"] = trainer.batch.inputs;
    j["targets"] = trainer.batch.targets;
    j["adamw"] = {{"lr", as_double(o.lr)},   {"beta1", as_double(o.beta1)}, {"beta2", as_double(o.beta2)},
                  {"eps", as_double(o.eps)}, {"weight_decay", as_double(o.weight_decay)}};
    j["clip"] = bench::kClipNorm;
    j["loss"] = loss;
    j["grad_norm"] = grad_norm;
    j["loss_after_step"] = loss_after;
    std::ofstream(fmt::format("{}/agreement_{}.json", dir, name)) << j.dump() << "\n";
    fmt::print("config {}: loss {:.6f}, grad norm {:.6f}, loss after one step {:.6f} -> {}\n", name, loss, grad_norm,
               loss_after, checkpoint);
  }

  nn::RotaryDecoder model = nn::rotary_decoder(65, 64, 4, 2, 256);  // bench_kv_cache's model
  std::vector<std::int32_t> prompt = {18, 47, 56, 57, 58, 1, 15, 47};
  std::string checkpoint = dir + "/agreement_decode.safetensors";
  nn::save_model_checkpoint(checkpoint, nn::LanguageModel(model), tokenizer);  // the copy shares the weights
  nn::KVCache cache = model.make_cache();
  Tensor prefill = model.prefill(prompt, cache);  // (8, 65)
  nn::GenerateOptions greedy{.max_new = 100, .sampling = {.temperature = 0.0f}};
  nlohmann::json j;
  j["model"] = {{"vocab", 65}, {"d_model", 64}, {"n_heads", 4}, {"n_blocks", 2}, {"max_len", 256}};
  j["prompt"] = prompt;
  j["prefill_logits"] = std::vector<float>(prefill.data(), prefill.data() + prefill.size());
  j["tokens"] = nn::generate(model, prompt, greedy).tokens;
  std::ofstream(dir + "/agreement_decode.json") << j.dump() << "\n";
  fmt::print("decode model: prefill logits and 100 greedy tokens -> {}\n", checkpoint);
}

int usage(std::FILE* to = stderr, int status = 2) {
  fmt::print(to,
             "usage: bench_train [--configs a,b,c,d,a-gpt2] [--threads 1,2] [--steps N] [--out PATH]\n"
             "       bench_train --write-agreement DIR [--configs a,b,c,d,a-gpt2]\n"
             "       bench_train --peak-memory CONFIG [--remat]   (prints MiB; run by bench_train itself)\n{}",
             bench::simd_usage_line());
  return status;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> config_names = {"a", "b", "c", "d"};
  std::vector<int> thread_counts = {1, 2};
  int steps = 30;
  std::string out_path = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/train_cpu.json";
  std::string agreement_dir, peak_memory_config;
  bool remat = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help") return usage(stdout, 0);
      bool has_value = i + 1 < argc;
      if (arg == "--configs" && has_value) config_names = bench::split_list(argv[++i]);
      else if (arg == "--threads" && has_value) thread_counts = bench::positive_list(arg, argv[++i]);
      else if (arg == "--steps" && has_value) steps = bench::positive_int(arg, argv[++i]);
      else if (arg == "--out" && has_value) out_path = argv[++i];
      else if (arg == "--write-agreement" && has_value) agreement_dir = argv[++i];
      else if (arg == "--peak-memory" && has_value) peak_memory_config = argv[++i];
      else if (arg == "--remat") remat = true;
      else return usage();
    }
    for (const std::string& name : config_names) bench::train_config(name);  // rejects unknown names
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_train: bad argument: {}\n", e.what());
    return 2;
  }
  if (config_names.empty()) return usage();  // counts were checked as they were parsed

  if (!agreement_dir.empty()) {
    write_agreement(agreement_dir, config_names);
    return 0;
  }
  if (!peak_memory_config.empty()) {
    fmt::print("{:.1f}\n", peak_memory_here(bench::train_config(peak_memory_config), remat));
    return 0;
  }

  fmt::print("bench_train on {}, OpenBLAS core {}, commit {}, {}\n", bench::machine(), openblas_get_corename(),
             bench::commit(), bench::today());
  bench::print_blas_warning();
  fmt::print("  step = forward + backward + clip_grad_norm(1.0) + AdamW(lr 1e-3, betas 0.9/0.95, wd 0.1) + zero_grad;\n"
             "  1 warm-up step, then {} timed steps; fixed random ids (seeded)\n", steps);
  fmt::print("  model FLOPs/step = {}\n", bench::kFlopsFormula);
  const nlohmann::json header = bench::run_header();  // before the runs: the load average it records is the starting one

  // The peak is measured before and after the training runs and the best is kept: on a shared
  // machine a single measurement can catch a busy moment, which would flatter the fractions.
  constexpr std::size_t sgemm_size = 2048;
  constexpr int sgemm_repeats = 5;
  std::map<int, std::vector<SgemmPeak>> sgemm;
  auto measure_all_sgemm = [&](const char* when) {
    for (int t : thread_counts) {
      SgemmPeak p = measure_sgemm(sgemm_size, t, sgemm_repeats);
      sgemm[t].push_back(p);
      fmt::print("  sgemm {0}x{0}x{0} {1}, {2} thread(s): best {3:.1f} GFLOP/s, median {4:.1f}\n", sgemm_size, when, t,
                 p.best_gflops, p.median_gflops);
      std::fflush(stdout);
    }
  };
  // The FMA peak of the widest instruction set the CPU has, whatever level tapegrad's own kernels
  // run at: most model FLOPs are OpenBLAS's, which uses the widest. Also the best of before and after.
  const SimdLevel fma_level = supported_simd_levels().back();
  std::map<int, std::vector<bench::FmaPeak>> fma;
  auto measure_all_fma = [&](const char* when) {
    for (int t : thread_counts) {
      bench::FmaPeak p = bench::measure_fma_peak(fma_level, t);
      fma[t].push_back(p);
      fmt::print("  FMA peak {} (registers only) {}, {} thread(s): best {:.1f} GFLOP/s, median {:.1f}\n",
                 simd_level_name(fma_level), when, t, p.best_gflops, p.median_gflops);
      std::fflush(stdout);
    }
  };
  measure_all_sgemm("before");
  measure_all_fma("before");

  std::map<std::pair<std::string, int>, RunResult> runs;
  for (const std::string& name : config_names) {
    bench::TrainConfig c = bench::train_config(name);
    std::optional<float> reference_loss;
    for (int t : thread_counts) {
      RunResult r = time_training(c, t, steps);
      // Checks before trusting the timings: a fresh model starts near ln(vocab), every thread count
      // computes the same first loss, and the loss falls on the fixed batch.
      if (!std::isfinite(r.first_loss) || std::abs(r.first_loss - std::log(float(c.vocab))) > 0.5f)
        throw std::runtime_error(fmt::format("config {}: initial loss {} is not near ln({})", name, r.first_loss, c.vocab));
      if (!reference_loss) reference_loss = r.first_loss;
      if (std::abs(*reference_loss - r.first_loss) > 1e-5f * *reference_loss)
        throw std::runtime_error(fmt::format("config {}: first loss {} at {} threads differs from {}", name,
                                             r.first_loss, t, *reference_loss));
      if (!(r.last_loss < r.first_loss))
        throw std::runtime_error(fmt::format("config {}: loss did not fall ({} -> {})", name, r.first_loss, r.last_loss));
      fmt::print("  config {} at {} thread(s): {:.1f} ms/step median; phases (ms): forward {:.1f}, backward {:.1f}, "
                 "clip {:.2f}, AdamW {:.2f}, zero_grad {:.2f}\n",
                 name, t, r.ms.median, r.phase_ms[0], r.phase_ms[1], r.phase_ms[2], r.phase_ms[3], r.phase_ms[4]);
      std::fflush(stdout);
      runs[{name, t}] = r;
    }
  }
  measure_all_sgemm("after");
  measure_all_fma("after");
  std::map<std::string, std::pair<double, double>> peak_memory;  // MiB without and with remat
  for (const std::string& name : config_names) {
    peak_memory[name] = {measure_peak_memory(name, false), measure_peak_memory(name, true)};
    fmt::print("  config {} peak memory (fresh process, 2 steps): {:.1f} MiB, with remat {:.1f} MiB\n", name,
               peak_memory[name].first, peak_memory[name].second);
  }

  nlohmann::json j = header;
  j["loadavg_after"] = bench::command_output("cat /proc/loadavg");
  j["steps"] = steps;
  j["flops_formula"] = bench::kFlopsFormula;
  j["peak_memory_is"] = "VmHWM of a fresh `bench_train --peak-memory CONFIG [--remat]` process after two steps at 1 "
                        "thread: the whole process (model, AdamW state, tape, buffers, libraries)";
  j["sgemm"] = {{"m", sgemm_size}, {"n", sgemm_size}, {"k", sgemm_size}, {"repeats", sgemm_repeats},
                {"peak_is", "best of the repeats, measured before and after the training runs"},
                {"how", "1 thread: one cblas_sgemm call; more: tapegrad kernels::gemm split over OpenMP threads"}};
  std::map<int, double> peak;
  for (int t : thread_counts) {
    std::string key = std::to_string(t);
    for (const SgemmPeak& p : sgemm[t]) {
      peak[t] = std::max(peak[t], p.best_gflops);
      j["sgemm_runs"][key].push_back({{"best_gflops", p.best_gflops}, {"median_gflops", p.median_gflops}});
    }
    j["sgemm_peak_gflops"][key] = peak[t];
  }
  j["fma"] = {{"level", simd_level_name(fma_level)}, {"chains", bench::fma_chains}, {"iterations", bench::fma_iterations},
              {"how", "register-only multiply-add loop of the widest instruction set, on every thread at once, flops "
                      "of every thread counted (bench/fma_peak.h, as bench_kernels)"},
              {"peak_is", "best sample, measured before and after the training runs"}};
  std::map<int, double> fma_peak;
  for (int t : thread_counts) {
    std::string key = std::to_string(t);
    for (const bench::FmaPeak& p : fma[t]) {
      fma_peak[t] = std::max(fma_peak[t], p.best_gflops);
      j["fma_runs"][key].push_back({{"best_gflops", p.best_gflops}, {"median_gflops", p.median_gflops}});
    }
    j["fma_peak_gflops"][key] = fma_peak[t];
  }

  fmt::print("\n| config | shape | threads | ms/step median (min-max) | tokens/s | model GFLOP/s | of sgemm peak | of FMA peak |\n");
  fmt::print("|---|---|---|---|---|---|---|---|\n");
  for (const std::string& name : config_names) {
    bench::TrainConfig c = bench::train_config(name);
    std::string shape = fmt::format("d{} h{} L{} seq{} batch{}", c.d_model, c.n_heads, c.n_blocks, c.seq_len, c.batch);
    nlohmann::json& jc = j["configs"][name];
    jc["shape"] = {{"arch", c.arch}, {"vocab", c.vocab}, {"d_model", c.d_model}, {"n_heads", c.n_heads}, {"n_blocks", c.n_blocks},
                   {"seq_len", c.seq_len}, {"max_len", c.seq_len}, {"batch", c.batch}, {"d_ff", c.d_ff()}};
    jc["matmul_params"] = bench::matmul_params(c);
    jc["flops_per_step"] = bench::step_flops(c);
    jc["attention_flops_per_step"] = bench::attention_flops(c);
    jc["peak_memory_mib"] = peak_memory[name].first;
    jc["peak_memory_mib_remat"] = peak_memory[name].second;
    for (int t : thread_counts) {
      const RunResult& r = runs[{name, t}];
      double seconds = r.ms.median * 1e-3;
      double tokens_per_s = double(c.tokens()) / seconds;
      double gflops = bench::step_flops(c) / seconds * 1e-9;
      double fraction = gflops / peak[t], fma_fraction = gflops / fma_peak[t];
      nlohmann::json& jt = jc["threads"][std::to_string(t)];
      jt = {{"ms_per_step_median", r.ms.median}, {"ms_per_step_min", r.ms.min},
            {"ms_per_step_max", r.ms.max},       {"tokens_per_s_median", tokens_per_s},
            {"model_gflops", gflops},            {"fraction_of_peak", fraction},
            {"fraction_of_fma_peak", fma_fraction},
            {"loss_first", r.first_loss},        {"loss_last", r.last_loss}};
      for (std::size_t p = 0; p < r.phase_ms.size(); ++p) jt["phase_ms_median"][bench::kPhaseNames[p]] = r.phase_ms[p];
      fmt::print("| {} | {} | {} | {:.1f} ({:.1f}-{:.1f}) | {:.0f} | {:.1f} | {:.0f}% | {:.0f}% |\n", name, shape, t,
                 r.ms.median, r.ms.min, r.ms.max, tokens_per_s, gflops, 100 * fraction, 100 * fma_fraction);
    }
  }
  fmt::print("  sgemm peak (GFLOP/s, best of before/after):");
  for (int t : thread_counts) fmt::print(" {} thread(s) {:.1f};", t, peak[t]);
  fmt::print("\n  FMA peak {} (GFLOP/s, best of before/after):", simd_level_name(fma_level));
  for (int t : thread_counts) fmt::print(" {} thread(s) {:.1f};", t, fma_peak[t]);
  fmt::print("\n");
  bench::write_results(out_path, j);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_train: {}\n", e.what());
  return 1;
}
