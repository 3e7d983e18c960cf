// bench_finetune: fine-tuning a published model (SmolLM2-135M from its GGUF, dequantized to float32
// master weights) on Shakespeare, tapegrad beside PyTorch + transformers (bench/finetune_reference.py:
// eager, torch.compile, bf16 autocast) on the same batches, file and threads, in one run, and with
// --llama-finetune beside llama.cpp's llama-finetune on the model's float32 export. Each run
// (tapegrad float32, float32 with remat, bf16 mixed precision; each PyTorch mode) at each thread count
// is a fresh process: tokens/s, model FLOP/s as a fraction of the measured FMA peak of the level in
// use (bench/fma_peak.h), its own peak resident memory; then the targets of issue 41, met or not.
// With --rounds N the runs at a thread count repeat N times in turn, and each target is the median
// of its rounds' (a VM whose speed drifts over minutes then moves both programs alike).
// Writes bench/results/finetune_cpu.json.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>

#include "bench/bench_common.h"
#include "bench/fma_peak.h"
#include "bench/train_common.h"
#include "core/precision.h"
#include "core/tape.h"
#include "nn/export.h"
#include "nn/models/llama.h"
#include "nn/pretrained.h"
#include "optim/adamw.h"
#include "optim/clip.h"

using namespace tapegrad;

namespace {

constexpr float kClipNorm = 1.0f;
// As finetune_reference.py's ADAMW.
const optim::AdamWOptions kAdamW{.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
constexpr std::array<const char*, 4> kPhases = {"forward", "backward", "clip_adamw", "zero_grad"};

/// A tapegrad run: its name in flags and results, the matmul precision, remat or not.
struct Mode {
  const char* name;
  Precision precision;
  bool remat;
  const char* label;
};
constexpr std::array<Mode, 3> kModes = {{{"f32", Precision::f32, false, "tapegrad f32"},
                                         {"f32_remat", Precision::f32, true, "tapegrad f32 + remat"},
                                         {"bf16", Precision::bf16, false, "tapegrad bf16"}}};

const Mode& mode_named(const std::string& name) {
  for (const Mode& m : kModes)
    if (name == m.name) return m;
  throw std::invalid_argument(fmt::format("--modes: unknown '{}' (modes: f32, f32_remat, bf16)", name));
}

struct Options {
  std::string model, data = bench::default_shakespeare_path(), python, reference_modes = "eager,compile,bf16";
  std::string modes = "f32,f32_remat,bf16";
  std::string llama_finetune;  // llama.cpp's llama-finetune, if it is to run too
  std::string out = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/finetune_cpu.json";
  std::size_t batch = 4, seq_len = 256;
  std::vector<int> threads = {1, 2};
  int steps = 3;
  int rounds = 1;  // runs of every mode at a thread count, in turn
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

/// The batches file every run reads (finetune_reference.py's --batches format): per batch, B rows
/// of T inputs and of T targets.
void write_batches(const std::string& path, const std::vector<Batch>& batches, const Options& o) {
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
  std::ofstream(path) << j.dump() << "\n";
}

std::vector<Batch> read_batches(const std::string& path, const Options& o) {
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || j.value("batch", 0u) != o.batch || j.value("seq_len", 0u) != o.seq_len)
    throw std::runtime_error(fmt::format("{}: not a batches file of B {} x T {}", path, o.batch, o.seq_len));
  std::vector<Batch> batches;
  for (const auto& b : j["batches"]) {
    Batch batch;
    for (const auto& row : b["inputs"]) for (std::int32_t id : row) batch.inputs.push_back(id);
    for (const auto& row : b["targets"]) for (std::int32_t id : row) batch.targets.push_back(id);
    batches.push_back(std::move(batch));
  }
  return batches;
}

/// A model, its AdamW, and the step of the benchmark.
struct FineTune {
  nn::PretrainedModel loaded;
  ParameterList params;
  optim::AdamW optimizer;
  Precision precision;
  std::array<double, kPhases.size()> phase_ms{};

  FineTune(const std::string& path, const Mode& mode)
      : loaded(nn::load_pretrained(path, {.remat = mode.remat})), params(loaded.model.params()), optimizer(params, kAdamW),
        precision(mode.precision) {}

  /// Forward, backward, clip + AdamW (one pass: clip_grad_norm_and_step), zero_grad; returns the
  /// loss before the step.
  float step(const Batch& b, const Options& o) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    float loss_value;
    Clock::time_point t1;
    {
      PrecisionScope scope(precision);  // around backward too: remat re-runs forwards there
      Tape tape;
      Var loss = loaded.model.loss(b.inputs, b.targets, o.batch, o.seq_len);
      loss_value = loss.value().item();
      t1 = Clock::now();
      tape.backward(loss);
    }
    const auto t2 = Clock::now();
    optim::clip_grad_norm_and_step(optimizer, kClipNorm);
    const auto t3 = Clock::now();
    optimizer.zero_grad();
    const auto t4 = Clock::now();
    auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    phase_ms = {ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t3, t4)};
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

/// Minor page faults of this process so far (the kernel zeroing a fresh page on first touch).
double minor_page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_minflt);
}

/// One run in this process (a child of the main run): load, one warm-up step, then `steps` timed
/// steps over the batches in turn; the JSON of its times, losses and peak memory (VmHWM).
nlohmann::json run_here(const Options& o, const Mode& mode, const std::string& batches_file) {
  const std::vector<Batch> batches = read_batches(batches_file, o);
  set_num_threads(o.threads.front());
  FineTune run(o.model, mode);
  std::vector<float> losses;
  std::vector<double> ms, faults;
  std::array<std::vector<double>, kPhases.size()> phases;
  for (int s = 0; s <= o.steps; ++s) {
    const double faults_before = minor_page_faults();
    const double seconds = bench::seconds([&] { losses.push_back(run.step(batches[std::size_t(s) % batches.size()], o)); });
    if (s == 0) continue;  // the warm-up
    ms.push_back(1e3 * seconds);
    faults.push_back(minor_page_faults() - faults_before);
    for (std::size_t p = 0; p < phases.size(); ++p) phases[p].push_back(run.phase_ms[p]);
  }
  const bench::Stats t = bench::stats_of(ms);
  nlohmann::json j = {{"mode", mode.name}, {"threads", o.threads.front()}, {"ms_per_step_median", t.median},
                      {"ms_per_step_min_max", {t.min, t.max}}, {"tokens_per_s", double(o.batch * o.seq_len) / t.median * 1e3},
                      {"losses", losses}, {"peak_memory_mib", double(bench::proc_status_kib("VmHWM")) / 1024.0},
                      {"page_faults_per_step_median", bench::stats_of(faults).median}};
  for (std::size_t p = 0; p < kPhases.size(); ++p) j["phase_ms_median"][kPhases[p]] = bench::stats_of(phases[p]).median;
  return j;
}

std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

/// The last line of a command's output that is a JSON object; throws naming the command otherwise.
nlohmann::json json_line_of(const std::string& command) {
  const std::string output = bench::command_output(command);
  const std::size_t at = output.rfind("\n{");
  const nlohmann::json j =
      nlohmann::json::parse(at == std::string::npos ? output : output.substr(at + 1), nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw std::runtime_error(fmt::format("`{}` printed '{}'", command, output));
  return j;
}

/// `mode` at `threads` in a fresh process (run_here), so that its peak memory is its own.
nlohmann::json run_tapegrad(const Options& o, const Mode& mode, int threads, const std::string& batches_file) {
  return json_line_of(fmt::format("'{}' --run {} --model '{}' --batches '{}' --batch {} --seq {} --threads {} --steps {}",
                                  self_path(), mode.name, o.model, batches_file, o.batch, o.seq_len, threads, o.steps));
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

/// Files this run writes for its children, removed however it ends (a failed run included: the
/// float32 export for llama.cpp is 540 MB).
struct TemporaryFiles {
  std::vector<std::string> paths;
  std::string add(std::string path) { return paths.emplace_back(std::move(path)); }
  ~TemporaryFiles() {
    std::error_code ignored;
    for (const std::string& path : paths) std::filesystem::remove(path, ignored);
  }
};

/// What llama-finetune reads: SmolLM2 exported to float32 (it trains float32 models only) and the
/// text of the first tokens of --data.
struct LlamaCppFiles {
  std::string model, text;
};

/// llama.cpp's llama-finetune (examples/training) at `threads` for one epoch of the text, no
/// validation, AdamW at kAdamW's rate and decay: windows of seq_len tokens, half a window apart, one
/// a step (its step takes one context, where tapegrad's and PyTorch's take B). Its progress
/// line after each step is timed as it arrives; the first step (the graph's set-up) is the
/// warm-up. Peak memory: its VmHWM at its last progress line, before it saves the model.
nlohmann::json run_llama_finetune(const Options& o, const LlamaCppFiles& files, int threads) {
  const std::string saved = files.model + ".trained.gguf";
  // `exec` keeps the shell's pid, printed first, for /proc; stderr (the progress) to the pipe.
  const std::string command = fmt::format(
      "echo $$; exec '{}' -m '{}' -f '{}' -c {} -b {} -ub {} -t {} -lr {} -wd {} -epochs 1 -val-split 0 -o '{}' 2>&1 "
      ">/dev/null",
      o.llama_finetune, files.model, files.text, o.seq_len, o.seq_len, o.seq_len, threads, kAdamW.lr,
      kAdamW.weight_decay, saved);
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error(fmt::format("cannot start `{}`", command));
  char pid_line[32] = {};
  const int pid = fgets(pid_line, sizeof pid_line, pipe) ? std::atoi(pid_line) : 0;
  std::vector<double> at;  // seconds at each progress line
  double peak_mib = 0, first_loss = 0;
  std::string output, line;
  const auto start = std::chrono::steady_clock::now();
  for (int c; (c = std::fgetc(pipe)) != EOF;) {
    output += char(c);
    if (c != '\r' && c != '\n') {
      line += char(c);
      continue;
    }
    if (line.rfind("train: [", 0) == 0 && line.find(" loss=") != std::string::npos) {
      at.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      peak_mib = std::max(peak_mib, double(bench::proc_status_kib("VmHWM", std::to_string(pid))) / 1024.0);
      if (at.size() == 1) first_loss = std::stod(line.substr(line.find(" loss=") + 6));
    }
    line.clear();
  }
  const int wait_status = pclose(pipe);
  const int status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  std::filesystem::remove(saved);
  if (status != 0 || at.size() < std::size_t(o.steps) + 1)
    throw std::runtime_error(fmt::format("`{}` exited with status {} after {} steps ({} needed); its last output: {}", command,
                                         status, at.size(), o.steps + 1,
                                         output.substr(output.size() - std::min<std::size_t>(output.size(), 1500))));
  std::vector<double> ms;
  for (std::size_t i = 1; i <= std::size_t(o.steps); ++i) ms.push_back(1e3 * (at[i] - at[i - 1]));
  const bench::Stats t = bench::stats_of(ms);
  return {{"threads", threads},
          {"tokens_per_step", o.seq_len},
          {"ms_per_step_median", t.median},
          {"ms_per_step_min_max", {t.min, t.max}},
          {"tokens_per_s", double(o.seq_len) / t.median * 1e3},
          {"peak_memory_mib", peak_mib},
          {"first_loss", first_loss},
          {"command", command}};
}

/// A run's row of the table: tokens/s, ms per step, % of the FMA peak, peak memory.
void print_row(const std::string& label, int threads, const nlohmann::json& r, double flops_per_token,
               double fma_peak) {
  const double tokens_per_s = r["tokens_per_s"].get<double>();
  fmt::print("  {:>7}  {:<32} {:>8.1f} {:>9.0f} {:>9.0f}% {:>9.0f}\n", threads, label, tokens_per_s,
             r["ms_per_step_median"].get<double>(), 100 * flops_per_token * tokens_per_s * 1e-9 / fma_peak,
             r["peak_memory_mib"].get<double>());
}

/// Issue 41's targets at one thread count, from the run's rows: each ratio and whether it is met.
nlohmann::json targets_of(const nlohmann::json& run) {
  nlohmann::json out = nlohmann::json::object();
  const nlohmann::json& ours = run["tapegrad"];
  double best_f32 = 0, autocast = 0, eager_memory = 0;
  if (run.contains("pytorch"))
    for (const auto& r : run["pytorch"]["runs"]) {
      if (r.contains("error")) continue;
      const std::string mode = r["mode"];
      if (mode == "bf16") autocast = r["tokens_per_s"];
      else best_f32 = std::max(best_f32, r["tokens_per_s"].get<double>());
      if (mode == "eager") eager_memory = r["peak_memory_mib"];
    }
  auto target = [&](const char* name, double value, double goal, bool at_most) {
    out[name] = {{"value", value}, {"goal", goal}, {"met", at_most ? value <= goal : value >= goal}};
  };
  if (ours.contains("f32")) target("f32_fraction_of_fma_peak", ours["f32"]["fraction_of_fma_peak"], 0.6, false);
  if (ours.contains("f32") && best_f32 > 0)
    target("f32_vs_pytorch_best_f32", ours["f32"]["tokens_per_s"].get<double>() / best_f32, 1.3, false);
  if (ours.contains("bf16") && autocast > 0)
    target("bf16_vs_pytorch_autocast", ours["bf16"]["tokens_per_s"].get<double>() / autocast, 1.5, false);
  if (ours.contains("f32_remat") && eager_memory > 0)
    target("remat_memory_vs_pytorch_eager", ours["f32_remat"]["peak_memory_mib"].get<double>() / eager_memory, 0.5,
           true);
  return out;
}

std::string usage() {
  return "usage: bench_finetune --model FILE.gguf [--data TEXT] [--batch B] [--seq T] [--threads 1,2] [--steps N]\n"
         "                      [--modes f32,f32_remat,bf16] [--python PATH (bench/.venv/bin/python)] [--rounds N]\n"
         "                      [--reference-modes eager,compile,bf16|none] [--llama-finetune PATH] [--out PATH]\n"
         "       bench_finetune --run MODE --batches FILE --model FILE.gguf --threads T [--batch B --seq T --steps N]\n"
         "                      (one run in this process, one JSON line; run by bench_finetune itself)\n" +
         bench::simd_usage_line();
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  o.python = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/.venv/bin/python";
  std::string run_mode, batches_file;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help") {
      fmt::print("{}", usage());
      return 0;
    }
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value\n{}", arg, usage()));
    const std::string value = argv[++i];
    if (arg == "--model") o.model = value;
    else if (arg == "--data") o.data = value;
    else if (arg == "--batch") o.batch = std::size_t(bench::positive_int(arg, value));
    else if (arg == "--seq") o.seq_len = std::size_t(bench::positive_int(arg, value));
    else if (arg == "--threads") o.threads = bench::positive_list(arg, value);
    else if (arg == "--steps") o.steps = bench::positive_int(arg, value);
    else if (arg == "--rounds") o.rounds = bench::positive_int(arg, value);
    else if (arg == "--modes") o.modes = value;
    else if (arg == "--python") o.python = value;
    else if (arg == "--reference-modes") o.reference_modes = value;
    else if (arg == "--llama-finetune") o.llama_finetune = value;
    else if (arg == "--out") o.out = value;
    else if (arg == "--run") run_mode = value;
    else if (arg == "--batches") batches_file = value;
    else throw std::invalid_argument(fmt::format("unknown argument '{}'\n{}", arg, usage()));
  }
  if (o.model.empty()) throw std::invalid_argument("--model is required\n" + usage());
  if (!o.llama_finetune.empty() && ::access(o.llama_finetune.c_str(), X_OK) != 0)
    throw std::invalid_argument(fmt::format("--llama-finetune {}: not an executable file", o.llama_finetune));
  if (!run_mode.empty()) {
    if (batches_file.empty()) throw std::invalid_argument("--run needs --batches\n" + usage());
    fmt::print("{}\n", run_here(o, mode_named(run_mode), batches_file).dump());
    return 0;
  }
  std::vector<const Mode*> modes;
  for (const std::string& name : bench::split_list(o.modes)) modes.push_back(&mode_named(name));
  const bool with_reference = o.reference_modes != "none";

  fmt::print("bench_finetune: {} on {}, OpenBLAS core {}, commit {}\n", o.model, bench::machine(),
             openblas_get_corename(), bench::commit());
  bench::print_blas_warning();
  nlohmann::json results = bench::run_header();

  // The batches, tokenized by tapegrad, are every run's (a file they read).
  nn::LlamaConfig config;
  std::vector<Batch> batches;
  LlamaCppFiles llama_files;
  TemporaryFiles temporary;
  const std::string stem = fmt::format("{}/finetune_{}", std::filesystem::temp_directory_path().string(), ::getpid());
  {
    const nn::PretrainedModel probe = nn::load_pretrained(o.model);
    const nn::Llama* llama = probe.model.as<nn::Llama>();
    if (!llama) throw std::runtime_error(fmt::format("{}: a Llama is needed, this is {}", o.model, probe.model.arch()));
    config = llama->config();
    batches = shakespeare_batches(*probe.tokenizer, o, 4);
    if (!o.llama_finetune.empty()) {
      // Windows half a window apart: the warm-up, the timed steps and one to spare.
      const std::size_t tokens = o.seq_len + 1 + o.seq_len / 2 * std::size_t(o.steps + 2);
      std::vector<std::int32_t> ids;
      for (const Batch& b : batches) ids.insert(ids.end(), b.inputs.begin(), b.inputs.end());
      if (ids.size() < tokens)
        throw std::runtime_error(fmt::format("--llama-finetune: {} tokens, {} needed", ids.size(), tokens));
      llama_files = {temporary.add(stem + "_llama_cpp.f32.gguf"), temporary.add(stem + "_llama_cpp.txt")};
      nn::export_gguf({probe.model, *probe.tokenizer, probe.chat_template}, llama_files.model, nn::GgufExportType::F32);
      std::ofstream(llama_files.text, std::ios::binary) << probe.tokenizer->decode(std::span(ids).first(tokens));
    }
  }
  batches_file = temporary.add(stem + "_batches.json");
  write_batches(batches_file, batches, o);
  const double flops = step_flops(config, o.batch, o.seq_len), flops_per_token = flops / double(o.batch * o.seq_len);
  fmt::print("  llama (d {}, d_ff {}, {} blocks, {} heads / {} KV heads, vocab {}); B {} x T {}; {:.1f} GFLOP/step\n"
             "  step = forward + backward + clip_grad_norm(1.0) folded into AdamW + zero_grad; each run a fresh process: load, 1 "
             "warm-up step, {} timed steps\n",
             config.d_model, config.ffn_dim(), config.n_blocks, config.n_heads, config.kv_heads(), config.vocab,
             o.batch, o.seq_len, flops * 1e-9, o.steps);
  std::fflush(stdout);

  // The peak of the level in use (emulated16 and sse2: the SSE2 loop), best before and after the runs.
  const SimdLevel fma_level = simd_level();
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
  results["steps"] = o.steps;
  results["runs"] = nlohmann::json::array();
  std::optional<double> first_loss;  // float32's, which every float32 run must match
  // One round at `threads`: every tapegrad mode, then the reference's modes, each a fresh process.
  auto run_round = [&](int threads, int round) {
    nlohmann::json run = {{"threads", threads}, {"round", round}};
    for (const Mode* mode : modes) {
      nlohmann::json r = run_tapegrad(o, *mode, threads, batches_file);
      const double loss = r["losses"][0].get<double>();
      if (mode->precision == Precision::f32 && first_loss && loss != *first_loss)
        throw std::runtime_error(fmt::format("{} at {} thread(s): first loss {}, not {}", mode->label, threads, loss,
                                             *first_loss));
      if (mode->precision == Precision::f32) first_loss = loss;
      const nlohmann::json& p = r["phase_ms_median"];
      fmt::print("  {} at {} thread(s): {:.0f} ms/step, {:.1f} tokens/s, peak {:.0f} MiB, first loss {:.5f}; forward "
                 "{:.0f}, backward {:.0f}, clip + AdamW {:.0f}, zero_grad {:.0f} ms; {:.0f} page faults/step\n",
                 mode->label, threads, r["ms_per_step_median"].get<double>(), r["tokens_per_s"].get<double>(),
                 r["peak_memory_mib"].get<double>(), loss, p["forward"].get<double>(), p["backward"].get<double>(),
                 p["clip_adamw"].get<double>(), p["zero_grad"].get<double>(),
                 r["page_faults_per_step_median"].get<double>());
      std::fflush(stdout);
      r["model_gflops"] = flops / (r["ms_per_step_median"].get<double>() * 1e-3) * 1e-9;
      run["tapegrad"][mode->name] = r;
    }
    if (with_reference) {
      run["pytorch"] = run_reference(o, batches_file, threads);
      for (const auto& r : run["pytorch"]["runs"]) {
        if (r.contains("error")) {
          fmt::print("  PyTorch {} at {} thread(s): failed: {}\n", r.value("mode", "?"), threads, r["error"].dump());
          continue;
        }
        const double loss = r["losses"][0].get<double>();
        if (first_loss && std::abs(loss - *first_loss) > 2e-3 * std::abs(*first_loss))
          throw std::runtime_error(fmt::format("PyTorch {}'s first loss {} is not tapegrad's {}",
                                               r["mode"].get<std::string>(), loss, *first_loss));
        fmt::print("  PyTorch {} at {} thread(s): {:.0f} ms/step, {:.1f} tokens/s, peak {:.0f} MiB, first loss {:.5f}\n",
                   r["mode"].get<std::string>(), threads, 1e3 * r["seconds_per_step_median"].get<double>(),
                   r["tokens_per_s"].get<double>(), r["peak_memory_mib"].get<double>(), loss);
      }
      std::fflush(stdout);
    }
    if (!o.llama_finetune.empty()) {
      const nlohmann::json& r = run["llama_cpp"] = run_llama_finetune(o, llama_files, threads);
      fmt::print("  llama.cpp finetune at {} thread(s): {:.0f} ms/step of {} tokens, {:.1f} tokens/s, peak {:.0f} MiB, "
                 "first loss {:.5f} (its own windows)\n",
                 threads, r["ms_per_step_median"].get<double>(), o.seq_len, r["tokens_per_s"].get<double>(),
                 r["peak_memory_mib"].get<double>(), r["first_loss"].get<double>());
      std::fflush(stdout);
    }
    return run;
  };
  for (int threads : o.threads)
    for (int round = 1; round <= o.rounds; ++round) results["runs"].push_back(run_round(threads, round));
  measure_fma();

  fmt::print("\n  {:>7}  {:<32} {:>8} {:>9} {:>10} {:>9}\n", "threads", "run", "tokens/s", "ms/step", "FMA peak",
             "peak MiB");
  // Each round's rows and targets; then per thread count each target's median over the rounds.
  std::map<int, std::map<std::string, std::vector<double>>> round_values;
  std::map<std::string, double> goals;
  for (auto& run : results["runs"]) {
    const int t = run["threads"].get<int>();
    const std::string round = o.rounds > 1 ? fmt::format(", round {}", run["round"].get<int>()) : "";
    run["fma_peak_gflops"] = fma_peak[t];
    for (const Mode* mode : modes) {
      nlohmann::json& r = run["tapegrad"][mode->name];
      r["fraction_of_fma_peak"] = r["model_gflops"].get<double>() / fma_peak[t];
      print_row(mode->label + round, t, r, flops_per_token, fma_peak[t]);
    }
    if (run.contains("pytorch"))
      for (auto& r : run["pytorch"]["runs"]) {
        if (r.contains("error")) continue;
        r["ms_per_step_median"] = 1e3 * r["seconds_per_step_median"].get<double>();
        print_row("PyTorch " + r["mode"].get<std::string>() + round, t, r, flops_per_token, fma_peak[t]);
      }
    if (run.contains("llama_cpp")) print_row("llama.cpp finetune" + round, t, run["llama_cpp"], flops_per_token, fma_peak[t]);
    run["targets"] = targets_of(run);
    for (const auto& target : run["targets"].items()) {
      round_values[t][target.key()].push_back(target.value()["value"].get<double>());
      goals[target.key()] = target.value()["goal"].get<double>();
    }
  }
  for (const auto& [t, targets] : round_values)
    for (const auto& [name, values] : targets) {
      const bool at_most = name.find("memory") != std::string::npos;
      const double goal = goals[name], median = bench::stats_of(values).median;
      const bool met = at_most ? median <= goal : median >= goal;
      results["targets"][std::to_string(t)][name] = {{"median", median}, {"rounds", values}, {"goal", goal}, {"met", met}};
      fmt::print("  {:>7}  target {}: {:.2f}{} ({} {}): {}\n", t, name, median,
                 values.size() > 1 ? fmt::format(" (median of {} rounds, {:.2f}-{:.2f})", values.size(),
                                                 *std::min_element(values.begin(), values.end()),
                                                 *std::max_element(values.begin(), values.end()))
                                   : "",
                 at_most ? "at most" : "at least", goal, met ? "met" : "NOT met");
    }
  results["fma"] = {{"level", simd_level_name(fma_level)},
                    {"peak_is", "best sample before and after the runs (bench/fma_peak.h), flops of every thread; "
                                "bf16 runs are measured against the float32 FMA peak too"}};
  results["peak_memory_is"] = "VmHWM of each run's fresh process (load, warm-up, timed steps), tapegrad's and PyTorch's";
  results["loadavg_after"] = bench::command_output("cat /proc/loadavg");
  bench::write_results(o.out, results);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_finetune: {}\n", e.what());
  return 1;
}
