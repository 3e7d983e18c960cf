// bench_remat: what per-block rematerialisation (Note [Remat], core/remat.h) saves and costs on
// d256 h8 L4 batch 8 at seq 256 and 512: ms per training step, and peak resident memory measured
// in a fresh child process per setting. Writes bench/results/remat_cpu.json.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "bench/bench_common.h"
#include "bench/train_common.h"
#include "core/kernels.h"

using namespace tapegrad;

namespace {

bench::TrainConfig remat_config(std::size_t seq_len) {
  bench::TrainConfig c = bench::train_config("c");  // d256 h8 L4 batch 8
  c.name = fmt::format("seq{}", seq_len);
  c.seq_len = seq_len;
  return c;
}

/// The child: one setting in a fresh process. RSS is read after the model, optimizer and batch
/// exist and before the first step; VmHWM (the peak RSS) after the last. Prints one JSON line.
int run_child(std::size_t seq_len, bool remat, int steps, int threads) {
  set_num_threads(threads);
  bench::TrainConfig c = remat_config(seq_len);
  bench::Trainer trainer(c, remat);
  long rss_before = bench::proc_status_kib("VmRSS");
  float first = trainer.step();  // warm-up
  std::size_t tape_bytes = trainer.last_tape_bytes;
  std::vector<double> ms, forward_ms, backward_ms;
  float last = first;
  for (int s = 0; s < steps; ++s) {
    ms.push_back(1e3 * bench::seconds([&] { last = trainer.step(); }));
    forward_ms.push_back(trainer.last_phase_ms[0]);
    backward_ms.push_back(trainer.last_phase_ms[1]);
  }
  long hwm = bench::proc_status_kib("VmHWM");
  bench::Stats st = bench::stats_of(ms);
  std::size_t param_bytes = 4 * trainer.model.num_params();
  nlohmann::json j = {{"seq_len", seq_len},       {"remat", remat},         {"ms_median", st.median},
                      {"ms_min", st.min},         {"ms_max", st.max},       {"rss_before_kib", rss_before},
                      {"forward_ms_median", bench::stats_of(forward_ms).median},
                      {"backward_ms_median", bench::stats_of(backward_ms).median},
                      {"hwm_kib", hwm},           {"tape_bytes", tape_bytes}, {"param_bytes", param_bytes},
                      {"loss_first", first},      {"loss_last", last},      {"ms_samples", ms}};
  fmt::print("{}\n", j.dump());
  return 0;
}

/// Runs this program again with --child for one setting and parses its JSON line.
nlohmann::json spawn_child(std::size_t seq_len, bool remat, int steps, int threads) {
  std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string command = fmt::format("'{}' --child --seq {} --remat {} --steps {} --threads {}", exe, seq_len,
                                    remat ? 1 : 0, steps, threads);
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + command);
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe)) out += buffer;
  int status = pclose(pipe);
  if (status != 0) throw std::runtime_error(fmt::format("child failed (status {}): {}", status, command));
  return nlohmann::json::parse(out);
}

/// Before timing: remat changes memory, not numbers. One step of a short sequence with and without
/// remat gives the same loss and the same gradient norm (bit-identical is the aim; 1e-6 relative allowed).
void check_remat_matches() {
  set_num_threads(1);
  bench::TrainConfig c = remat_config(64);
  bench::Trainer plain(c, false), remat(c, true);
  float loss_plain = plain.step(), loss_remat = remat.step();
  float norm_plain = plain.last_grad_norm, norm_remat = remat.last_grad_norm;
  if (std::abs(loss_plain - loss_remat) > 1e-6f * loss_plain || std::abs(norm_plain - norm_remat) > 1e-6f * norm_plain)
    throw std::runtime_error(fmt::format("remat check failed: loss {} vs {}, grad norm {} vs {}", loss_plain, loss_remat,
                                         norm_plain, norm_remat));
  fmt::print("  check: seq 64, remat off/on: loss {} / {}, grad norm {} / {} ({})\n", loss_plain, loss_remat,
             norm_plain, norm_remat, loss_plain == loss_remat && norm_plain == norm_remat ? "bit-identical" : "within 1e-6");
}

int usage(std::FILE* to = stderr, int status = 2) {
  fmt::print(to, "usage: bench_remat [--seqs 256,512] [--steps N] [--rounds N] [--threads N] [--out PATH]\n{}",
             bench::simd_usage_line());
  return status;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::size_t> seqs = {256, 512};
  int steps = 10, threads = 1, rounds = 3;
  bool child = false, remat = false;
  std::size_t child_seq = 0;
  std::string out_path = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/remat_cpu.json";
  try {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help") return usage(stdout, 0);
      bool has_value = i + 1 < argc;
      if (arg == "--child") child = true;
      else if (arg == "--seq" && has_value) child_seq = std::size_t(bench::positive_int(arg, argv[++i]));
      else if (arg == "--remat" && has_value) remat = std::stoi(argv[++i]) != 0;
      else if (arg == "--seqs" && has_value) {
        seqs.clear();
        for (int seq : bench::positive_list(arg, argv[++i])) seqs.push_back(std::size_t(seq));
      } else if (arg == "--steps" && has_value) steps = bench::positive_int(arg, argv[++i]);
      else if (arg == "--threads" && has_value) threads = bench::positive_int(arg, argv[++i]);
      else if (arg == "--rounds" && has_value) rounds = bench::positive_int(arg, argv[++i]);
      else if (arg == "--out" && has_value) out_path = argv[++i];
      else return usage();
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_remat: bad argument: {}\n", e.what());
    return 2;
  }
  if (child) return run_child(child_seq, remat, steps, threads);

  fmt::print("bench_remat on {}, commit {}, {}\n", bench::machine(), bench::commit(), bench::today());
  fmt::print("  d256 h8 L4 batch 8, max_len = seq; full training step; {} thread(s); per setting {} round(s) of a fresh\n"
             "  process with 1 warm-up + {} timed steps, the settings alternating (off, on, off, on, ...) so that a change\n"
             "  in load hits both; time = median over all rounds' steps; peak = VmHWM, activation = peak - VmRSS before\n"
             "  the first step (activations, gradients and transient buffers; gradients are the same in both settings),\n"
             "  from the first round\n",
             threads, rounds, steps);
  check_remat_matches();

  nlohmann::json j = bench::run_header();
  j["model"] = {{"vocab", 65}, {"d_model", 256}, {"n_heads", 8}, {"n_blocks", 4}, {"batch", 8}, {"d_ff", 1024}};
  j["threads"] = threads;
  j["steps"] = steps;
  j["rounds"] = rounds;
  j["memory_note"] = "peak = VmHWM of a fresh child per setting; activation = peak - VmRSS before the first step";
  fmt::print("\n| setting | ms/step median (min-max) | peak MiB | activation MiB | tape MiB | saving % | time overhead % |\n");
  fmt::print("|---|---|---|---|---|---|---|\n");
  for (std::size_t seq : seqs) {
    std::vector<nlohmann::json> off_runs, on_runs;
    for (int r = 0; r < rounds; ++r) {
      off_runs.push_back(spawn_child(seq, false, steps, threads));
      on_runs.push_back(spawn_child(seq, true, steps, threads));
    }
    // The first round's record, with the timing statistics over every round's steps.
    auto combine = [](const std::vector<nlohmann::json>& runs) {
      nlohmann::json out = runs.front();
      std::vector<double> all;
      for (const nlohmann::json& r : runs)
        for (double v : r["ms_samples"]) all.push_back(v);
      bench::Stats st = bench::stats_of(all);
      out["ms_median"] = st.median;
      out["ms_min"] = st.min;
      out["ms_max"] = st.max;
      out["ms_samples"] = all;
      out["round_medians_ms"] = nlohmann::json::array();
      out["hwm_kib_rounds"] = nlohmann::json::array();
      for (const nlohmann::json& r : runs) {
        out["round_medians_ms"].push_back(r["ms_median"]);
        out["hwm_kib_rounds"].push_back(r["hwm_kib"]);
      }
      return out;
    };
    nlohmann::json off = combine(off_runs), on = combine(on_runs);
    auto mib = [](double kib) { return kib / 1024.0; };
    double act_off = mib(off["hwm_kib"].get<double>() - off["rss_before_kib"].get<double>());
    double act_on = mib(on["hwm_kib"].get<double>() - on["rss_before_kib"].get<double>());
    double saving = 100.0 * (1.0 - act_on / act_off);
    double overhead = 100.0 * (on["ms_median"].get<double>() / off["ms_median"].get<double>() - 1.0);
    for (const nlohmann::json* r : {&off, &on}) {
      bool is_on = (*r)["remat"].get<bool>();
      double act = is_on ? act_on : act_off;
      fmt::print("| seq {} remat {} | {:.0f} ({:.0f}-{:.0f}) | {:.0f} | {:.0f} | {:.1f} | {} | {} |\n", seq,
                 is_on ? "on" : "off", (*r)["ms_median"].get<double>(), (*r)["ms_min"].get<double>(),
                 (*r)["ms_max"].get<double>(), mib((*r)["hwm_kib"].get<double>()), act,
                 (*r)["tape_bytes"].get<double>() / (1 << 20), is_on ? fmt::format("{:.1f}", saving) : "-",
                 is_on ? fmt::format("{:+.1f}", overhead) : "-");
    }
    std::fflush(stdout);
    std::string key = fmt::format("seq{}", seq);
    j["settings"][key] = {{"off", off}, {"on", on}};
    j["settings"][key]["activation_mib"] = {{"off", act_off}, {"on", act_on}};
    j["settings"][key]["activation_saving_percent"] = saving;
    j["settings"][key]["time_overhead_percent"] = overhead;
  }
  bench::write_results(out_path, j);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_remat: {}\n", e.what());
  return 1;
}
