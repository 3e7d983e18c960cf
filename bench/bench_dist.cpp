// bench_dist: data-parallel training throughput on configs (a), (b), (c):
// 2 ranks x 1 thread (MPI over shared memory, and over TCP on loopback: two simulated hosts)
// against 1 process x 2 threads, on the same cores in the same run, and the time of the gradient
// exchange (distributed::GradientBuckets::reduce) per step and its share of the step: after
// backward, and overlapped with backward (the time left visible in the step); and 2 ranks with the
// AdamW state sharded (ZeRO-1): its bytes per rank and the parameter gather.
// Usage: bench_dist [--configs a,b,c] [--steps N] [--rounds R] [--out FILE] [--tcp-args ARGS]:
// starts itself as workers (`bench_dist --worker CONFIG ...`, directly or under mpirun) and writes
// bench/results/dist_cpu.json. --tcp-args replaces the TCP variant's mpirun options (e.g. the
// namespace hosts of scripts/netns_hosts.sh: --tcp-args "$NETNS_MPIRUN_ARGS").
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <span>

#include "bench_common.h"
#include "core/kernels.h"
#include "distributed/communicator.h"
#include "distributed/data_parallel.h"
#include "nn/models/rotary_decoder.h"
#include "train_common.h"

using namespace tapegrad;
using namespace tapegrad::bench;
using json = nlohmann::json;

namespace {

/// One worker: rank r computes rows [r B/N, (r+1) B/N) of the fixed batch, the gradients are
/// summed over the ranks in buckets, then clip and AdamW (with shard: each rank updates its ZeRO-1
/// shard, then the parameters are gathered). The steps alternate between the exchange after
/// backward and the exchange overlapped with backward. Rank 0 prints one JSON line.
int worker(int argc, char** argv, const std::string& name, int threads, int steps, bool shard) {
  std::unique_ptr<distributed::Communicator> comm = distributed::make_communicator(argc, argv);
  const TrainConfig c = train_config(name);
  const std::size_t ranks = std::size_t(comm->size()), rows = c.batch / ranks, tokens = rows * c.seq_len;
  if (c.batch % ranks != 0) throw std::invalid_argument("batch of config " + name + " does not divide among ranks");
  set_num_threads(threads);
  nn::RotaryDecoder model(nn::rotary_decoder(c.vocab, c.d_model, c.n_heads, c.n_blocks, c.seq_len, c.d_ff()));
  ParameterList params = model.params();
  optim::AdamW optimizer(params, bench_adamw_options());
  const std::size_t unsharded_state_bytes = optimizer.state_bytes();
  if (shard)
    optimizer.keep_only(distributed::optimizer_shard(optim::flat_size(params), comm->rank(), comm->size()));
  const Batch batch = random_batch(c);
  const auto inputs = std::span(batch.inputs).subspan(std::size_t(comm->rank()) * tokens, tokens);
  const auto targets = std::span(batch.targets).subspan(std::size_t(comm->rank()) * tokens, tokens);
  distributed::GradientBuckets buckets(params);
  // [0]: the exchange after backward; [1]: overlapped with backward.
  std::vector<double> step_ms[2], comm_ms, wait_ms, visible_ms[2], gather_ms, exchange_only_ms;
  const int warmup = 3;
  for (int i = 0; i < 2 * (warmup + steps); ++i) {
    const int overlap = ranks > 1 ? i % 2 : 0;
    double exchange = 0, wait = 0, visible = 0, gather = 0;
    const double total = seconds([&] {
      {
        Tape tape;
        Var loss = model.loss(inputs, targets, rows, c.seq_len);
        tape.backward(loss, overlap ? &buckets.exchange_during_backward(*comm) : nullptr);
      }
      if (ranks > 1 && overlap) {
        visible = buckets.reduce(*comm, ranks);  // what backward did not hide, the slower rank's lag included
      } else if (ranks > 1) {
        buckets.accumulate();
        // The barrier splits waiting for the slower rank (imbalance, a busy core) from the exchange.
        wait = seconds([&] { comm->barrier(); });
        exchange = buckets.reduce(*comm, ranks);
        visible = wait + exchange;
      }
      optim::clip_grad_norm(params, kClipNorm);
      optimizer.step();
      optimizer.zero_grad();
      if (shard) gather = seconds([&] { distributed::allgather_parameters(*comm, params); });
    });
    if (i < 2 * warmup) continue;
    step_ms[overlap].push_back(1e3 * total), visible_ms[overlap].push_back(1e3 * visible);
    if (!overlap) comm_ms.push_back(1e3 * exchange), wait_ms.push_back(1e3 * wait);
    if (shard) gather_ms.push_back(1e3 * gather);
  }
  // The exchange alone, ranks in step: what a faster or slower network changes.
  for (int i = 0; ranks > 1 && i < 30; ++i) {
    buckets.accumulate();
    comm->barrier();
    exchange_only_ms.push_back(1e3 * buckets.reduce(*comm, ranks));
  }
  optimizer.zero_grad();
  // The check before the figures count: every replica holds the same weights.
  distributed::check_same_parameters(*comm, params, "bench_dist");
  if (comm->rank() == 0) {
    const Stats step = stats_of(step_ms[0]), exchange = stats_of(comm_ms);
    json out = {{"tokens_per_s", double(c.tokens()) / (step.median / 1e3)},
                {"step_ms", step.median},
                {"step_ms_min_max", {step.min, step.max}},
                {"ranks", ranks},
                {"threads_per_rank", num_threads()},
                {"gradient_floats", buckets.floats()},
                {"buckets", buckets.bucket_count()},
                {"adamw_state_bytes_per_rank", optimizer.state_bytes()},
                {"adamw_state_bytes_unsharded", unsharded_state_bytes},
                {"sharded_optimizer", shard}};
    if (ranks > 1) {
      const Stats overlapped = stats_of(step_ms[1]);
      out["comm_ms"] = exchange.median;
      out["comm_ms_min_max"] = {exchange.min, exchange.max};
      out["comm_share"] = exchange.median / step.median;
      out["wait_ms"] = stats_of(wait_ms).median;
      out["exchange_only_ms"] = stats_of(exchange_only_ms).median;
      out["exchange_only_ms_min_max"] = {stats_of(exchange_only_ms).min, stats_of(exchange_only_ms).max};
      out["gradient_bytes"] = 4 * buckets.floats();
      out["transport"] = comm->description();
      out["visible_exchange_ms"] = stats_of(visible_ms[0]).median;
      out["overlap"] = {{"tokens_per_s", double(c.tokens()) / (overlapped.median / 1e3)},
                        {"step_ms", overlapped.median},
                        {"step_ms_min_max", {overlapped.min, overlapped.max}},
                        {"visible_exchange_ms", stats_of(visible_ms[1]).median}};
      if (shard) out["parameter_gather_ms"] = stats_of(gather_ms).median;
    }
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

json run_worker(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot start: " + command);
  std::string text;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) text += buffer;
  const int status = ::pclose(pipe);
  auto start = text.rfind("\n{\"");  // the last line, a JSON object (whose values may be objects)
  start = start == std::string::npos ? (text.starts_with("{\"") ? 0 : start) : start + 1;
  if (status != 0 || start == std::string::npos)
    throw std::runtime_error("worker failed (status " + std::to_string(status) + "): " + command + "\n" + text);
  return json::parse(text.substr(start));
}

/// The median-throughput result of several runs (by tokens_per_s).
json median_run(std::vector<json> runs) {
  std::sort(runs.begin(), runs.end(),
            [](const json& a, const json& b) { return a["tokens_per_s"].get<double>() < b["tokens_per_s"].get<double>(); });
  json out = runs[runs.size() / 2];
  out["tokens_per_s_all_rounds"] = json::array();
  for (const json& r : runs) out["tokens_per_s_all_rounds"].push_back(r["tokens_per_s"]);
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string configs = "a,b,c", out_path = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/dist_cpu.json";
  std::string worker_config;
  std::string tcp = "--mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo";
  int steps = 20, rounds = 3, threads = 1;
  bool shard = false;
  try {  // a usage error: exit 2, as the other benches
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const bool has_value = i + 1 < argc;
      if (arg == "--help") {
        fmt::print("usage: bench_dist [--configs a,b,c] [--steps N] [--rounds R] [--out FILE] [--tcp-args ARGS]\n{}",
                   bench::simd_usage_line());
        return 0;
      }
      if (arg == "--worker" && has_value) worker_config = argv[++i];
      else if (arg == "--configs" && has_value) configs = argv[++i];
      else if (arg == "--steps" && has_value) steps = bench::positive_int(arg, argv[++i]);
      else if (arg == "--rounds" && has_value) rounds = bench::positive_int(arg, argv[++i]);
      else if (arg == "--threads" && has_value) threads = bench::positive_int(arg, argv[++i]);
      else if (arg == "--out" && has_value) out_path = argv[++i];
      else if (arg == "--shard-optimizer") shard = true;
      else if (arg == "--tcp-args" && has_value) tcp = argv[++i];
      else throw std::invalid_argument("unknown or incomplete argument " + arg +
                                       " (usage: bench_dist [--configs a,b,c] [--steps N] [--rounds R] [--out FILE] [--tcp-args ARGS])");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dist: bad argument: %s\n", e.what());
    return 2;
  }
  if (!worker_config.empty()) return worker(argc, argv, worker_config, threads, steps, shard);
  if (!distributed::built_with_mpi()) throw std::runtime_error("bench_dist needs a build with MPI (TAPEGRAD_MPI)");

  for (const char* setting : {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                              "OMPI_MCA_rmaps_base_oversubscribe=1", "OMPI_MCA_btl_vader_single_copy_mechanism=none"})
    ::putenv(const_cast<char*>(setting));
  const std::string self = "/proc/self/exe";
  char path[4096];
  const ssize_t length = ::readlink(self.c_str(), path, sizeof path - 1);
  if (length <= 0) throw std::runtime_error("cannot find this program's path");
  const std::string program(path, std::size_t(length));
  const std::string mpirun = std::string(TAPEGRAD_MPIEXEC) + " -np 2 --bind-to none ";
  json results = run_header();
  results["what"] =
      "tokens/s of one training step (forward, backward, gradient exchange, clip, AdamW) on the global batch of "
      "each config; ranks2_threads1: 2 MPI ranks x 1 thread, each B/2 rows, over shared memory; "
      "tcp_ranks2_threads1: the same over TCP with the mpirun options tcp_args (loopback unless told); ranks1_threads2: 1 process x 2 threads, the whole "
      "batch. comm_ms: median time in GradientBuckets::reduce (alltoall + ordered sum + allgather) after a barrier; "
      "wait_ms: the median time in that barrier (waiting for the slower rank); comm_share = comm_ms / step_ms; "
      "exchange_only_ms: the reduce alone, 30 times after the steps, ranks in step. Each worker alternates steps with the "
      "exchange after backward (step_ms, comm_ms) and overlapped with backward (overlap.*); visible_exchange_ms: the "
      "exchange time left in the step (after backward: barrier + reduce; overlapped: the communicator calls during "
      "backward + the wait after it; both include waiting for the slower rank). sharded_ranks2_threads1: the same with "
      "ZeRO-1 (--shard-optimizer): adamw_state_bytes_per_rank against adamw_state_bytes_unsharded, parameter_gather_ms "
      "the allgather of the parameters after the step. Medians of --steps steps of each kind after 3 warm-up "
      "steps each; the variants alternate, --rounds times, and the round of median tokens/s is kept.";
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  results["omp_wait_policy"] = wait_policy ? wait_policy : "default (unset)";
  results["tcp_args"] = tcp;
  results["steps"] = steps;
  results["rounds"] = rounds;
  for (std::size_t at = 0; at < configs.size(); at += 2) {
    const std::string name = configs.substr(at, 1);
    const TrainConfig c = train_config(name);
    const std::string args = " --worker " + name + " --steps " + std::to_string(steps);
    std::vector<json> one, two, two_tcp, two_sharded;
    for (int round = 0; round < rounds; ++round) {
      one.push_back(run_worker(program + args + " --threads 2"));
      two.push_back(run_worker(mpirun + program + args + " --threads 1"));
      two_tcp.push_back(run_worker(mpirun + tcp + " " + program + args + " --threads 1"));
      two_sharded.push_back(run_worker(mpirun + program + args + " --threads 1 --shard-optimizer"));
    }
    json entry = {{"shape", {{"d_model", c.d_model}, {"heads", c.n_heads}, {"blocks", c.n_blocks},
                             {"seq", c.seq_len}, {"batch", c.batch}}},
                  {"ranks1_threads2", median_run(one)},
                  {"ranks2_threads1", median_run(two)},
                  {"tcp_ranks2_threads1", median_run(two_tcp)},
                  {"sharded_ranks2_threads1", median_run(two_sharded)}};
    entry["ratio_ranks2_over_threads2"] =
        entry["ranks2_threads1"]["tokens_per_s"].get<double>() / entry["ranks1_threads2"]["tokens_per_s"].get<double>();
    std::printf("config %s: 1x2 %.0f tok/s; 2x1 %.0f tok/s (ratio %.2f), exchange %.3f ms = %.1f%% of the step "
                "(alone %.3f ms); TCP 2x1 %.0f tok/s, exchange %.3f ms (alone %.3f ms)\n",
                name.c_str(), entry["ranks1_threads2"]["tokens_per_s"].get<double>(),
                entry["ranks2_threads1"]["tokens_per_s"].get<double>(), entry["ratio_ranks2_over_threads2"].get<double>(),
                entry["ranks2_threads1"]["comm_ms"].get<double>(),
                100 * entry["ranks2_threads1"]["comm_share"].get<double>(),
                entry["ranks2_threads1"]["exchange_only_ms"].get<double>(),
                entry["tcp_ranks2_threads1"]["tokens_per_s"].get<double>(),
                entry["tcp_ranks2_threads1"]["comm_ms"].get<double>(),
                entry["tcp_ranks2_threads1"]["exchange_only_ms"].get<double>());
    for (const char* variant : {"ranks2_threads1", "tcp_ranks2_threads1"}) {
      const json& v = entry[variant];
      std::printf("  %s: exchange visible in the step %.3f ms without overlap, %.3f ms with (step %.2f -> %.2f ms)\n",
                  variant, v["visible_exchange_ms"].get<double>(), v["overlap"]["visible_exchange_ms"].get<double>(),
                  v["step_ms"].get<double>(), v["overlap"]["step_ms"].get<double>());
    }
    const json& sharded = entry["sharded_ranks2_threads1"];
    std::printf("  AdamW state per rank: %.3f MB unsharded, %.3f MB with --shard-optimizer (%.1f%%); parameter "
                "gather %.3f ms, %.0f tok/s\n",
                sharded["adamw_state_bytes_unsharded"].get<double>() / 1e6,
                sharded["adamw_state_bytes_per_rank"].get<double>() / 1e6,
                100 * sharded["adamw_state_bytes_per_rank"].get<double>() /
                    sharded["adamw_state_bytes_unsharded"].get<double>(),
                sharded["parameter_gather_ms"].get<double>(), sharded["tokens_per_s"].get<double>());
    std::fflush(stdout);
    results["configs"][name] = entry;
  }
  write_results(out_path, results);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_dist: %s\n", e.what());
  return 1;
}
