// bench_finetune: fine-tuning a published model (SmolLM2-135M from its GGUF, dequantized to float32
// master weights) on Shakespeare, tapegrad beside PyTorch + transformers (bench/finetune_reference.py:
// eager, torch.compile, bf16 autocast) on the same batches, file and threads, in one run. Per thread
// count: tapegrad's step (forward, backward, clip_grad_norm 1.0, AdamW, zero_grad) with and without
// remat, tokens/s, model FLOP/s as a fraction of the FMA peak (bench/fma_peak.h), then the reference;
// and the peak memory of each, a fresh process apiece. Writes bench/results/finetune_cpu.json.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "bench/bench_common.h"
#include "bench/fma_peak.h"
#include "bench/train_common.h"
#include "core/kernels.h"
#include "core/tape.h"
#include "nn/models/llama.h"
#include "nn/pretrained.h"
#include "optim/adamw.h"
#include "optim/clip.h"

using namespace tapegrad;

namespace {

constexpr float kClipNorm = 1.0f;
// As finetune_reference.py's ADAMW.
const optim::AdamWOptions kAdamW{.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
constexpr std::array<const char*, 5> kPhases = {"forward", "backward", "clip", "adamw", "zero_grad"};

struct Options {
  std::string model, data = bench::default_shakespeare_path(), python, reference_modes = "eager,compile,bf16";
  std::string out = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/finetune_cpu.json";
  std::size_t batch = 4, seq_len = 256;
  std::vector<int> threads = {1, 2};
  int steps = 3;
};

/// Batches of `batch` windows of seq_len + 1 tokens from the start of the text, one after another.
struct Batch {
  std::vector<std::int32_t> inputs, targets;  // (B*T) each
};
std::vector<Batch> shakespeare_batches(const tokenizers::Tokenizer& tokenizer, const Options& o, std::size_t count) {
  std::ifstream in(o.data, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot read the text", o.data));
  const std::size_t need = count * o.batch * o.seq_len + 1;
  std::string text(8 * need, '\0');  // ~4 characters a token: twice what is needed
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(std::size_t(in.gcount()));
  const std::vector<std::int32_t> ids = tokenizer.encode(text);
  if (ids.size() < need) throw std::runtime_error(fmt::format("{}: {} tokens, {} needed", o.data, ids.size(), need));
  std::vector<Batch> batches(count);
  for (std::size_t b = 0; b < count; ++b)
    for (std::size_t r = 0; r < o.batch; ++r) {
      const auto window = ids.begin() + std::ptrdiff_t((b * o.batch + r) * o.seq_len);
      batches[b].inputs.insert(batches[b].inputs.end(), window, window + std::ptrdiff_t(o.seq_len));
      batches[b].targets.insert(batches[b].targets.end(), window + 1, window + 1 + std::ptrdiff_t(o.seq_len));
    }
  return batches;
}

/// The file's model; with remat, the same weights in a Llama whose blocks rematerialise (its
/// config decides, and a loaded model's says no).
nn::PretrainedModel load(const std::string& path, bool remat) {
  nn::PretrainedModel loaded = nn::load_pretrained(path);
  if (!remat) return loaded;
  const nn::Llama* llama = loaded.model.as<nn::Llama>();
  if (!llama) throw std::runtime_error(fmt::format("{}: --remat needs a Llama; this is {}", path, loaded.model.arch()));
  nn::LlamaConfig config = llama->config();
  config.remat = true;
  nn::Llama with_remat(config);
  ParameterList from = loaded.model.params(), to = with_remat.params();
  for (std::size_t i = 0; i < from.size(); ++i) std::swap(to[i].var.mutable_value(), from[i].var.mutable_value());
  loaded.model = nn::LanguageModel(std::move(with_remat));
  return loaded;
}

/// A model, its AdamW, and the step of the benchmark.
struct FineTune {
  nn::PretrainedModel loaded;
  ParameterList params;
  optim::AdamW optimizer;
  std::array<double, 5> phase_ms{};

  FineTune(const std::string& path, bool remat)
      : loaded(load(path, remat)), params(loaded.model.params()), optimizer(params, kAdamW) {}

  /// The loss of the batch with no tape.
  float loss(const Batch& b, const Options& o) const {
    NoGradScope no_grad;
    return loaded.model.loss(b.inputs, b.targets, o.batch, o.seq_len).value().item();
  }
  /// Forward, backward, clip, AdamW, zero_grad; returns the loss before the step.
  float step(const Batch& b, const Options& o) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    float loss_value;
    Clock::time_point t1;
    {
      Tape tape;
      Var loss = loaded.model.loss(b.inputs, b.targets, o.batch, o.seq_len);
      loss_value = loss.value().item();
      t1 = Clock::now();
      tape.backward(loss);
    }
    const auto t2 = Clock::now();
    optim::clip_grad_norm(params, kClipNorm);
    const auto t3 = Clock::now();
    optimizer.step();
    const auto t4 = Clock::now();
    optimizer.zero_grad();
    const auto t5 = Clock::now();
    auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    phase_ms = {ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t3, t4), ms(t4, t5)};
    return loss_value;
  }
};

/// Model FLOPs of one step: 6 x the matmul parameters (the head included) x tokens, plus the
/// attention's, 3 (forward + backward) x 2 products x 2 x B x H x T^2 x Dh x n_blocks / 2 (causal).
double step_flops(const nn::LlamaConfig& c, std::size_t batch, std::size_t seq_len) {
  const double d = double(c.d_model), q = double(c.q_width()), kv = double(c.kv_width()), ff = double(c.ffn_dim());
  const double matmul_params = double(c.n_blocks) * (d * (q + 2 * kv) + q * d + 3 * d * ff) + d * double(c.vocab);
  const double attention = 3.0 * 2.0 * 2.0 * double(batch) * double(c.n_heads) * double(seq_len) * double(seq_len) *
                           double(c.head_size()) * double(c.n_blocks) / 2.0;
  return 6.0 * matmul_params * double(batch * seq_len) + attention;
}

struct Timing {
  bench::Stats ms;
  std::array<double, 5> phase_ms{};  // medians
  std::vector<float> losses;
};

/// A fresh model at `threads`: one warm-up step, then `steps` timed steps over the batches in turn.
Timing time_tapegrad(const Options& o, const std::vector<Batch>& batches, int threads, bool remat) {
  set_num_threads(threads);
  FineTune run(o.model, remat);
  Timing t;
  std::vector<double> ms;
  std::array<std::vector<double>, 5> phases;
  for (int s = 0; s <= o.steps; ++s) {
    const double seconds = bench::seconds([&] { t.losses.push_back(run.step(batches[std::size_t(s) % batches.size()], o)); });
    if (s == 0) continue;  // the warm-up
    ms.push_back(1e3 * seconds);
    for (std::size_t p = 0; p < phases.size(); ++p) phases[p].push_back(run.phase_ms[p]);
  }
  t.ms = bench::stats_of(ms);
  for (std::size_t p = 0; p < phases.size(); ++p) t.phase_ms[p] = bench::stats_of(phases[p]).median;
  return t;
}

std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

/// Peak memory (MiB) of a fresh `bench_finetune --peak-memory` process: load, two steps at 1 thread.
double measure_peak_memory(const Options& o, bool remat) {
  const std::string command = fmt::format("'{}' --peak-memory --model '{}' --data '{}' --batch {} --seq {}{}", self_path(),
                                          o.model, o.data, o.batch, o.seq_len, remat ? " --remat" : "");
  const std::string output = bench::command_output(command);
  try {
    return std::stod(output);
  } catch (const std::exception&) {
    throw std::runtime_error(fmt::format("peak memory: `{}` printed '{}'", command, output));
  }
}

double peak_memory_here(const Options& o, bool remat) {
  set_num_threads(1);
  FineTune run(o.model, remat);
  const std::vector<Batch> batches = shakespeare_batches(*run.loaded.tokenizer, o, 2);
  run.step(batches[0], o);
  run.step(batches[1], o);
  return double(bench::proc_status_kib("VmHWM")) / 1024.0;
}

/// finetune_reference.py at `threads`, every mode, on the batches file; its JSON.
nlohmann::json run_reference(const Options& o, const std::string& batches_file, int threads) {
  const std::string out = fmt::format("{}/finetune_reference_{}.json", std::filesystem::temp_directory_path().string(),
                                      ::getpid());
  const std::string command = fmt::format(
      "OMP_NUM_THREADS={} '{}' '{}/bench/finetune_reference.py' --gguf '{}' --batches '{}' --threads {} --modes {} "
      "--steps {} --out '{}'",
      threads, o.python, TAPEGRAD_SOURCE_DIR, o.model, batches_file, threads, o.reference_modes, o.steps, out);
  bench::command_output(command);
  std::ifstream in(out);
  const nlohmann::json result = nlohmann::json::parse(in, nullptr, false);
  std::filesystem::remove(out);
  if (result.is_discarded()) throw std::runtime_error(fmt::format("the reference gave no results: {}", command));
  return result;
}

std::string usage() {
  return "usage: bench_finetune --model FILE.gguf [--data TEXT] [--batch B] [--seq T] [--threads 1,2] [--steps N]\n"
         "                      [--python PATH (bench/.venv/bin/python)] [--reference-modes eager,compile,bf16|none]\n"
         "                      [--out PATH]\n"
         "       bench_finetune --peak-memory --model FILE.gguf [--remat]   (prints MiB; run by bench_finetune itself)\n" +
         bench::simd_usage_line();
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  o.python = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/.venv/bin/python";
  bool peak_memory = false, remat = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help") {
      fmt::print("{}", usage());
      return 0;
    }
    if (arg == "--peak-memory") {
      peak_memory = true;
      continue;
    }
    if (arg == "--remat") {
      remat = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value\n{}", arg, usage()));
    const std::string value = argv[++i];
    if (arg == "--model") o.model = value;
    else if (arg == "--data") o.data = value;
    else if (arg == "--batch") o.batch = std::size_t(bench::positive_int(arg, value));
    else if (arg == "--seq") o.seq_len = std::size_t(bench::positive_int(arg, value));
    else if (arg == "--threads") o.threads = bench::positive_list(arg, value);
    else if (arg == "--steps") o.steps = bench::positive_int(arg, value);
    else if (arg == "--python") o.python = value;
    else if (arg == "--reference-modes") o.reference_modes = value;
    else if (arg == "--out") o.out = value;
    else throw std::invalid_argument(fmt::format("unknown argument '{}'\n{}", arg, usage()));
  }
  if (o.model.empty()) throw std::invalid_argument("--model is required\n" + usage());
  if (peak_memory) {
    fmt::print("{:.1f}\n", peak_memory_here(o, remat));
    return 0;
  }
  const bool with_reference = o.reference_modes != "none";

  fmt::print("bench_finetune: {} on {}, OpenBLAS core {}, commit {}\n", o.model, bench::machine(),
             openblas_get_corename(), bench::commit());
  bench::print_blas_warning();
  nlohmann::json results = bench::run_header();

  // The batches, tokenized by tapegrad, are the reference's too (a file it reads).
  std::optional<FineTune> probe;
  probe.emplace(o.model, false);
  const nn::Llama* llama = probe->loaded.model.as<nn::Llama>();
  if (!llama) throw std::runtime_error(fmt::format("{}: a Llama is needed, this is {}", o.model, probe->loaded.model.arch()));
  const nn::LlamaConfig config = llama->config();
  const std::string arch = probe->loaded.model.arch();
  const std::vector<Batch> batches = shakespeare_batches(*probe->loaded.tokenizer, o, 4);
  const float first_loss = probe->loss(batches[0], o);
  probe.reset();
  const std::string batches_file =
      fmt::format("{}/finetune_batches_{}.json", std::filesystem::temp_directory_path().string(), ::getpid());
  {
    nlohmann::json j = {{"batch", o.batch}, {"seq_len", o.seq_len}, {"batches", nlohmann::json::array()}};
    for (const Batch& b : batches) {
      nlohmann::json inputs = nlohmann::json::array(), targets = nlohmann::json::array();
      for (std::size_t r = 0; r < o.batch; ++r) {
        const auto at = std::ptrdiff_t(r * o.seq_len), end = std::ptrdiff_t((r + 1) * o.seq_len);
        inputs.push_back(std::vector<std::int32_t>(b.inputs.begin() + at, b.inputs.begin() + end));
        targets.push_back(std::vector<std::int32_t>(b.targets.begin() + at, b.targets.begin() + end));
      }
      j["batches"].push_back({{"inputs", inputs}, {"targets", targets}});
    }
    std::ofstream(batches_file) << j.dump() << "\n";
  }
  const double flops = step_flops(config, o.batch, o.seq_len);
  fmt::print("  {} (d {}, d_ff {}, {} blocks, {} heads / {} KV heads, vocab {}); B {} x T {}; {:.1f} GFLOP/step; "
             "first loss {:.5f}\n  step = forward + backward + clip_grad_norm(1.0) + AdamW + zero_grad; 1 warm-up, {} "
             "timed steps\n",
             arch, config.d_model, config.ffn_dim(), config.n_blocks, config.n_heads, config.kv_heads(),
             config.vocab, o.batch, o.seq_len, flops * 1e-9, first_loss, o.steps);
  std::fflush(stdout);

  const SimdLevel fma_level = supported_simd_levels().back();
  std::map<int, double> fma_peak;
  auto measure_fma = [&] {
    for (int t : o.threads) fma_peak[t] = std::max(fma_peak[t], bench::measure_fma_peak(fma_level, t).best_gflops);
  };
  measure_fma();

  results["model"] = o.model;
  results["shape"] = {{"d_model", config.d_model}, {"d_ff", config.ffn_dim()}, {"n_blocks", config.n_blocks},
                      {"n_heads", config.n_heads}, {"n_kv_heads", config.kv_heads()}, {"vocab", config.vocab},
                      {"batch", o.batch},          {"seq_len", o.seq_len}};
  results["flops_per_step"] = flops;
  results["first_loss"] = first_loss;
  results["steps"] = o.steps;
  results["runs"] = nlohmann::json::array();
  for (int threads : o.threads) {
    nlohmann::json run = {{"threads", threads}};
    for (bool with_remat : {false, true}) {
      const Timing t = time_tapegrad(o, batches, threads, with_remat);
      if (!(t.losses[0] == first_loss))
        throw std::runtime_error(fmt::format("tapegrad's first step at {} thread(s){} has loss {}, not {}", threads,
                                             with_remat ? " with remat" : "", t.losses[0], first_loss));
      const double seconds = t.ms.median * 1e-3;
      nlohmann::json& j = run[with_remat ? "tapegrad_remat" : "tapegrad"];
      j = {{"ms_per_step_median", t.ms.median}, {"ms_per_step_min_max", {t.ms.min, t.ms.max}},
           {"tokens_per_s", double(o.batch * o.seq_len) / seconds}, {"model_gflops", flops / seconds * 1e-9},
           {"losses", t.losses}};
      for (std::size_t p = 0; p < kPhases.size(); ++p) j["phase_ms_median"][kPhases[p]] = t.phase_ms[p];
      fmt::print("  tapegrad{} at {} thread(s): {:.0f} ms/step ({:.0f}-{:.0f}), {:.1f} tokens/s, {:.1f} GFLOP/s; "
                 "forward {:.0f}, backward {:.0f}, clip {:.0f}, AdamW {:.0f}, zero_grad {:.0f} ms\n",
                 with_remat ? " (remat)" : "", threads, t.ms.median, t.ms.min, t.ms.max,
                 double(o.batch * o.seq_len) / seconds, flops / seconds * 1e-9, t.phase_ms[0], t.phase_ms[1],
                 t.phase_ms[2], t.phase_ms[3], t.phase_ms[4]);
      std::fflush(stdout);
    }
    if (with_reference) {
      run["pytorch"] = run_reference(o, batches_file, threads);
      for (const auto& r : run["pytorch"]["runs"]) {
        if (r.contains("error")) {
          fmt::print("  PyTorch {} at {} thread(s): failed: {}\n", r.value("mode", "?"), threads, r["error"].dump());
          continue;
        }
        const double loss = r["losses"][0].get<double>();
        if (std::abs(loss - first_loss) > 2e-3 * std::abs(first_loss))
          throw std::runtime_error(fmt::format("PyTorch {}'s first loss {} is not tapegrad's {}",
                                               r["mode"].get<std::string>(), loss, first_loss));
        fmt::print("  PyTorch {} at {} thread(s): {:.0f} ms/step, {:.1f} tokens/s, first loss {:.5f}, peak {:.0f} MiB\n",
                   r["mode"].get<std::string>(), threads, 1e3 * r["seconds_per_step_median"].get<double>(),
                   r["tokens_per_s"].get<double>(), loss, r["peak_memory_mib"].get<double>());
      }
      std::fflush(stdout);
    }
    results["runs"].push_back(run);
  }
  std::filesystem::remove(batches_file);
  measure_fma();
  for (auto& run : results["runs"]) {
    const int t = run["threads"].get<int>();
    run["fma_peak_gflops"] = fma_peak[t];
    for (const char* key : {"tapegrad", "tapegrad_remat"})
      run[key]["fraction_of_fma_peak"] = run[key]["model_gflops"].get<double>() / fma_peak[t];
  }
  results["fma"] = {{"level", simd_level_name(fma_level)},
                    {"peak_is", "best sample before and after the runs (bench/fma_peak.h), flops of every thread"}};
  results["peak_memory_mib"] = {{"tapegrad", measure_peak_memory(o, false)},
                                {"tapegrad_remat", measure_peak_memory(o, true)}};
  results["peak_memory_is"] = "VmHWM of a fresh process: load, then two steps at 1 thread (tapegrad); PyTorch's runs "
                              "report their own processes' VmHWM";
  results["loadavg_after"] = bench::command_output("cat /proc/loadavg");
  fmt::print("  peak memory: tapegrad {:.0f} MiB, with remat {:.0f} MiB\n",
             results["peak_memory_mib"]["tapegrad"].get<double>(), results["peak_memory_mib"]["tapegrad_remat"].get<double>());
  for (const auto& run : results["runs"]) {
    const int t = run["threads"].get<int>();
    fmt::print("  {} thread(s): FMA peak {:.1f} GFLOP/s; tapegrad {:.0f}% of it, with remat {:.0f}%\n", t, fma_peak[t],
               100 * run["tapegrad"]["fraction_of_fma_peak"].get<double>(),
               100 * run["tapegrad_remat"]["fraction_of_fma_peak"].get<double>());
  }
  bench::write_results(o.out, results);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_finetune: {}\n", e.what());
  return 1;
}
