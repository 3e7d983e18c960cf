// Data-parallel training and gradient accumulation (--micro-batches):
// the bucketed ordered sum, the launcher checks, and train_char run under mpirun with 2 and 3 ranks
// (shared memory and TCP on loopback): byte-identical to one process with --micro-batches N,
// faults (a rank killed, SIGTERM and SIGUSR1 to mpirun), resume across N, and clear errors.
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>
#include <tuple>

#include "distributed/communicator.h"
#include "core/ops.h"
#include "distributed/data_parallel.h"
#include "nn/checkpoint.h"
#include "support/helpers.h"
#include "support/programs.h"
#include "tests/distributed/mpi_runs.h"

using namespace tapegrad;
using namespace tapegrad::test;
namespace fs = std::filesystem;

namespace {

/// tiny6 at d_model 64 with 2 blocks: about 140,000 parameters, three gradient buckets.
Args small6(const fs::path& data, const fs::path& out, int steps) {
  Args args = tiny6(data, out, steps);
  for (std::size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--d-model") args[i + 1] = "64";
    else if (args[i] == "--blocks") args[i + 1] = "2";
  return args;
}

/// The validation loss of the last row of a metrics CSV.
double last_val_loss(const fs::path& csv) {
  std::istringstream in(read_bytes(csv));
  std::string line, last;
  while (std::getline(in, line)) last = line;
  std::istringstream row(last);
  std::string field;
  for (int i = 0; i < 3; ++i) std::getline(row, field, ',');
  return std::stod(field);
}

/// Whether a process has ended (or is a zombie, ended but not yet reaped) within 5 s.
bool gone_soon(pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string stat;
    if (!std::getline(in, stat)) return true;
    const auto close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

Var parameter(Shape shape) { return Var(Tensor(std::move(shape)), true); }

}  // namespace

TEST_CASE("gradient buckets sum the parts in order and divide by their number, whatever the bucket size") {
  ParameterList params = {{"a", parameter({3, 4})}, {"b", parameter({5})}, {"c", parameter({2, 2})}};
  std::vector<std::vector<Tensor>> grads;  // grads[part][parameter]
  for (std::uint64_t part = 0; part < 3; ++part)
    grads.push_back({random_tensor({3, 4}, 10 + part), random_tensor({5}, 20 + part), random_tensor({2, 2}, 30 + part)});
  for (std::size_t bucket_floats : {1, 6, 100}) {
    CAPTURE(bucket_floats);
    distributed::GradientBuckets buckets(params, bucket_floats);
    CHECK(buckets.floats() == 21);
    CHECK(buckets.bucket_count() == (bucket_floats == 100 ? 1 : bucket_floats == 6 ? 2 : 3));
    for (std::size_t part = 0; part < 3; ++part) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        params[i].var.zero_grad();
        if (!(part == 1 && i == 2)) params[i].var.grad_buffer() = grads[part][i];  // c: no gradient in part 1
      }
      buckets.accumulate();
    }
    distributed::SingleProcess one;
    buckets.reduce(one, 3);
    for (std::size_t i = 0; i < params.size(); ++i)
      for (std::size_t k = 0; k < params[i].var.value().size(); ++k) {
        const float g1 = i == 2 ? 0.0f : grads[1][i][k];
        const float expected = ((grads[0][i][k] + g1) + grads[2][i][k]) / 3.0f;
        CHECK(params[i].var.grad()[k] == expected);
      }
  }
  distributed::GradientBuckets unused(params);
  distributed::SingleProcess one;
  CHECK_THROWS_WITH_AS(unused.reduce(one, 1), doctest::Contains("accumulate() the gradients first"), std::logic_error);
}

TEST_CASE("gradient buckets filled during backward, in reverse parameter order, sum as those filled after it") {
  // a tiny two-layer model: a backward finishes w2's gradient before w1's
  ParameterList params = {{"w1", parameter({3, 4})}, {"b1", parameter({4})}, {"w2", parameter({4, 2})}};
  for (std::size_t i = 0; i < params.size(); ++i) params[i].var.mutable_value() = random_tensor(params[i].var.shape(), 40 + i);
  const Var x(random_tensor({5, 3}, 50));
  auto backward = [&](std::uint64_t part, BackwardObserver* observer) {
    for (NamedParameter& p : params) p.var.zero_grad();
    Tape tape;
    Var h = tanh(add_bias(matmul(scale(x, float(part + 1)), params[0].var), params[1].var));
    tape.backward(sum(matmul(h, params[2].var)), observer);
  };
  distributed::SingleProcess one;
  distributed::GradientBuckets after(params, 8), during(params, 8);
  CHECK(during.bucket_count() == 2);  // w2 alone (8 floats), then b1 and w1
  for (std::uint64_t part = 0; part < 3; ++part) {
    backward(part, nullptr);
    after.accumulate();
    if (part < 2) during.accumulate();
  }
  after.reduce(one, 3);
  std::vector<Tensor> expected;
  for (const NamedParameter& p : params) expected.push_back(p.var.grad());
  backward(2, &during.exchange_during_backward(one));
  during.reduce(one, 3);
  for (std::size_t i = 0; i < params.size(); ++i)
    CHECK(std::equal(expected[i].data(), expected[i].data() + expected[i].size(), params[i].var.grad().data()));
  // A backward that did not run: reduce adds what it left (no gradient: zeros), as accumulate would.
  for (NamedParameter& p : params) p.var.zero_grad();
  during.exchange_during_backward(one);
  during.reduce(one, 1);
  CHECK(params[0].var.grad()[0] == 0.0f);
}

TEST_CASE("ZeRO-1 shards: contiguous, in rank order, covering every element once") {
  CHECK(distributed::optimizer_shard(10, 0, 3).begin == 0);
  CHECK(distributed::optimizer_shard(10, 0, 3).end == 4);
  CHECK(distributed::optimizer_shard(10, 2, 3).begin == 8);
  CHECK(distributed::optimizer_shard(10, 2, 3).end == 10);
  CHECK(distributed::optimizer_shard(2, 2, 3).size() == 0);  // more ranks than elements: empty shards
  distributed::SingleProcess one;
  ParameterList params = {{"a", parameter({3})}};
  const Tensor before = params[0].var.value();
  distributed::allgather_parameters(one, params);  // one rank: its shard is everything
  CHECK(std::equal(before.data(), before.data() + 3, params[0].var.value().data()));
}

TEST_CASE("the replica hash changes with any parameter bit, and one process always agrees with itself") {
  ParameterList params = {{"a", parameter({2, 3})}, {"b", parameter({4})}};
  const std::uint64_t before = distributed::parameters_hash(params);
  params[1].var.mutable_value()[3] = -0.0f;  // differs from +0 in its sign bit only
  CHECK(distributed::parameters_hash(params) != before);
  distributed::SingleProcess one;
  CHECK_NOTHROW(distributed::check_same_parameters(one, params, "step 1"));
  CHECK(distributed::allgather_value(one, 42.5) == std::vector<double>{42.5});
}

TEST_CASE("a launcher reporting N processes that this build cannot join is refused, saying why") {
  const distributed::LaunchSize two{2, "OMPI_COMM_WORLD_SIZE=2"};
  CHECK(!distributed::launch_mismatch(std::nullopt, std::nullopt));
  CHECK(!distributed::launch_mismatch(distributed::LaunchSize{1, "SLURM_NTASKS=1"}, std::nullopt));
  CHECK(!distributed::launch_mismatch(two, 2));
  const std::optional<std::string> no_mpi = distributed::launch_mismatch(two, std::nullopt);
  REQUIRE(no_mpi);
  CHECK(test::contains(*no_mpi, "this build has no MPI"));
  CHECK(test::contains(*no_mpi, "one of 2 processes (OMPI_COMM_WORLD_SIZE=2)"));
  const std::optional<std::string> apart = distributed::launch_mismatch(distributed::LaunchSize{4, "SLURM_NTASKS=4"}, 1);
  REQUIRE(apart);
  CHECK(test::contains(*apart, "but MPI sees 1"));
  CHECK(test::contains(*apart, "srun --mpi=pmix"));

  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) ::unsetenv(name);
  CHECK(!distributed::launch_size_from_environment());
  ::setenv("SLURM_NTASKS", "3", 1);
  ::setenv("PMI_SIZE", "2", 1);
  std::optional<distributed::LaunchSize> launch = distributed::launch_size_from_environment();
  REQUIRE(launch);
  CHECK(launch->size == 2);  // PMI_SIZE comes before SLURM_NTASKS
  CHECK(launch->variable == "PMI_SIZE=2");
  ::setenv("PMI_SIZE", "two", 1);
  CHECK_THROWS_WITH(distributed::launch_size_from_environment(), doctest::Contains("PMI_SIZE=two is not a process count"));
  ::unsetenv("PMI_SIZE");
  ::unsetenv("SLURM_NTASKS");

  // train_char itself, started alone as if it were one of 2 Slurm tasks (srun without PMI).
  fs::path dir = work_dir("dp_refuse"), data = write_corpus(dir), ckpt = dir / "r.safetensors";
  // (With MPI, the refusal comes after MPI_Init, whose allocations LeakSanitizer would report.)
  Result r = run("train_char", tiny6(data, ckpt, 2), {"SLURM_NTASKS=2", "ASAN_OPTIONS=detect_leaks=0"});
  CHECK(r.status == 1);
  CHECK(one_error_line(r, "train_char"));
  CHECK(test::contains(r.err, distributed::built_with_mpi() ? "but MPI sees 1" : "this build has no MPI"));
  CHECK(!fs::exists(ckpt));
}

TEST_CASE("--micro-batches M sums M parts of the batch; a batch that M does not divide is a clear error") {
  fs::path dir = work_dir("micro"), data = write_corpus(dir);
  const fs::path whole = dir / "whole.safetensors", parts = dir / "parts.safetensors";
  REQUIRE(run("train_char", tiny6(data, whole, 20)).status == 0);
  Result r = run("train_char", tiny6(data, parts, 20) + Args{"--micro-batches", "3"});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(test::contains(r.out, "each step sums 3 gradients of 2 windows"));
  CHECK(std::abs(last_val_loss(dir / "parts.metrics.csv") - last_val_loss(dir / "whole.metrics.csv")) < 2e-3);
  nn::LoadedModelCheckpoint a = nn::load_model_checkpoint(whole.string()), b = nn::load_model_checkpoint(parts.string());
  CHECK(a.metadata == b.metadata);  // the checkpoint does not record how the batch was split

  Result bad = run("train_char", tiny6(data, dir / "bad.safetensors", 20) + Args{"--micro-batches", "4"});
  CHECK(bad.status == 2);
  CHECK(one_error_line(bad, "train_char"));
  CHECK(test::contains(bad.err, "--batch 6 does not split into --micro-batches 4 equal parts"));
  CHECK(!fs::exists(dir / "bad.safetensors"));
}

TEST_CASE("2 and 3 ranks write the checkpoint of one process with --micro-batches N, byte for byte") {
  if (!mpi_available()) return;
  fs::path dir = work_dir("dp_equal"), data = write_corpus(dir);
  const fs::path whole = dir / "whole.safetensors";
  REQUIRE(run("train_char", tiny6(data, whole, 20) + Args{"--eval-every", "10"}).status == 0);
  const double whole_val = last_val_loss(dir / "whole.metrics.csv");
  for (int ranks : {2, 3}) {
    CAPTURE(ranks);
    const fs::path micro = dir / fmt::format("micro{}.safetensors", ranks);
    const fs::path ranked = dir / fmt::format("ranks{}.safetensors", ranks);
    REQUIRE(run("train_char", tiny6(data, micro, 20) + Args{"--eval-every", "10", "--micro-batches",
                                                            std::to_string(ranks)})
                .status == 0);
    Result r = run_mpi(ranks, tiny6(data, ranked, 20) + Args{"--eval-every", "10", "--save-every", "7"});
    REQUIRE_MESSAGE(r.status == 0, r.err);
    CHECK(test::contains(r.out, fmt::format("{} ranks; each step sums {} gradients", ranks, ranks)));
    CHECK(test::contains(r.out, "gradient exchange: "));
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') > 20);
    CHECK(!test::contains(r.out + r.err, "rank 1"));  // one rank prints
    check_same_tensors(micro, ranked);
    CHECK(read_bytes(micro) == read_bytes(ranked));
    CHECK(read_bytes(dir / fmt::format("micro{}.metrics.csv", ranks)).size() > 0);
    CHECK(std::abs(last_val_loss(dir / fmt::format("ranks{}.metrics.csv", ranks)) - whole_val) < 2e-3);
    CHECK(!fs::exists(ranked.string() + ".lock"));
  }
  SUBCASE("two simulated hosts: TCP on loopback gives the same bytes") {
    const fs::path tcp = dir / "tcp2.safetensors";
    Result r = run_mpi(2, tiny6(data, tcp, 20) + Args{"--eval-every", "10"}, tcp_loopback());
    REQUIRE_MESSAGE(r.status == 0, r.err);
    CHECK(read_bytes(tcp) == read_bytes(dir / "micro2.safetensors"));
  }
}

TEST_CASE("--shard-optimizer: N ranks write the bytes of --micro-batches N, and a run resumes with another N, with or without it") {
  if (!mpi_available()) return;
  fs::path dir = work_dir("dp_zero"), data = write_corpus(dir);
  // Three gradient buckets (small6), so exchanges overlap backward.
  const Args model = {"--eval-every", "0", "--decay-steps", "20", "--warmup", "2"};
  auto path = [&](const std::string& name, int ranks) { return dir / fmt::format("{}{}.safetensors", name, ranks); };
  for (int ranks : {2, 3}) {
    CAPTURE(ranks);
    const fs::path micro = path("micro", ranks), sharded = path("sharded", ranks);
    REQUIRE(run("train_char", small6(data, micro, 6) + model + Args{"--micro-batches", std::to_string(ranks)}).status == 0);
    Result r = run_mpi(ranks, small6(data, sharded, 6) + model + Args{"--shard-optimizer", "--save-every", "3"});
    REQUIRE_MESSAGE(r.status == 0, r.err);
    CHECK(test::contains(r.out, "in 3 buckets"));
    CHECK(test::contains(r.out, "sharded optimizer state (--shard-optimizer): rank 0 keeps"));
    CHECK(read_bytes(micro) == read_bytes(sharded));
  }
  // 3 sharded ranks' checkpoint continued by 2 sharded ranks, and 2 sharded ranks' by 3 plain
  // ones, as one process continues them with --micro-batches 2 and 3.
  for (const auto& [from, to, flag] : {std::tuple{3, 2, true}, std::tuple{2, 3, false}}) {
    CAPTURE(from);
    const fs::path ranked = path("continued", to), micro = path("micro_continued", to);
    fs::copy_file(path("sharded", from), ranked, fs::copy_options::overwrite_existing);
    fs::copy_file(path("sharded", from), micro, fs::copy_options::overwrite_existing);
    Result r = run_mpi(to, small6(data, ranked, 9) + model + Args{"--resume", ranked.string()} +
                               (flag ? Args{"--shard-optimizer"} : Args{}));
    REQUIRE_MESSAGE(r.status == 0, r.err);
    REQUIRE(run("train_char", small6(data, micro, 9) + model +
                                  Args{"--micro-batches", std::to_string(to), "--resume", micro.string()})
                .status == 0);
    CHECK(saved_step(ranked) == 9);
    CHECK(read_bytes(ranked) == read_bytes(micro));
  }
}

TEST_CASE("under mpirun, a batch that the ranks do not divide is one clear error from rank 0, and nothing is written") {
  if (!mpi_available()) return;
  fs::path dir = work_dir("dp_divide"), data = write_corpus(dir), ckpt = dir / "d.safetensors";
  Result r = run_mpi(4, tiny6(data, ckpt, 5));
  CHECK(r.status != 0);
  CHECK(test::contains(r.err, "train_char: --batch 6 does not split among 4 ranks"));
  const std::string line = "does not split among";
  std::size_t count = 0;
  for (std::size_t at = r.err.find(line); at != std::string::npos; at = r.err.find(line, at + 1)) ++count;
  CHECK(count == 1);  // rank 0 alone prints
  CHECK(!fs::exists(ckpt));
  Result missing = run_mpi(2, tiny6(dir / "no_such.txt", ckpt, 5));
  CHECK(missing.status != 0);
  CHECK(test::contains(missing.err, "no_such.txt: cannot open"));
  CHECK(!fs::exists(ckpt));
}

TEST_CASE("a rank killed with SIGKILL ends every other rank within 30 s, and the last checkpoint is whole") {
  if (!mpi_available()) return;
  fs::path dir = work_dir("dp_kill"), data = write_corpus(dir), ckpt = dir / "k.safetensors";
  const fs::path out = dir / "out.txt", err = dir / "err.txt";
  const pid_t job = start_mpirun(3, tiny6(data, ckpt, 1000000) + Args{"--eval-every", "0", "--save-every", "20"},
                                 out, err);
  const EndJobOnExit end{job};
  REQUIRE(appears(out, "step 20/1000000: saved"));
  const std::vector<pid_t> ranks = children_named(job, "train_char");
  REQUIRE(ranks.size() == 3);
  const auto killed = std::chrono::steady_clock::now();
  REQUIRE(::kill(ranks[1], SIGKILL) == 0);
  const int status = wait_within(job, std::chrono::seconds(30), err);
  CHECK(status != 0);
  CHECK(std::chrono::steady_clock::now() - killed < std::chrono::seconds(30));
  CHECK(children_named(job, "train_char").empty());
  for (pid_t rank : ranks) CHECK_MESSAGE(gone_soon(rank), "rank process " << rank << " is still running");
  CHECK(saved_step(ckpt) >= 20);  // whole and loadable
}

TEST_CASE("SIGTERM or SIGUSR1 to mpirun saves at a step boundary; the run resumes bit-identically, with any N") {
  if (!mpi_available()) return;
  fs::path dir = work_dir("dp_signal"), data = write_corpus(dir);
  const Args schedule = {"--eval-every", "0", "--decay-steps", "2000", "--warmup", "10"};
  for (int signal : {SIGTERM, SIGUSR1}) {
    CAPTURE(signal);
    const fs::path ckpt = dir / fmt::format("s{}.safetensors", signal);
    const fs::path out = dir / "out.txt", err = dir / "err.txt";
    const pid_t job = start_mpirun(2, tiny6(data, ckpt, 1000000) + schedule, out, err);
    const EndJobOnExit end{job};
    REQUIRE(appears(out, "training: "));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    REQUIRE(::kill(job, signal) == 0);
    CHECK(wait_within(job, std::chrono::seconds(60), err) != 0);
    CHECK(test::contains(read_bytes(out), fmt::format("interrupted by signal {} at step ", signal)));
    CHECK(!has_temporary_files(dir));
    const std::int64_t step = saved_step(ckpt);
    REQUIRE(step > 0);
    const int target = int(step) + 4;
    // The interrupted 2-rank run, continued by one process splitting its batch in 2, equals one
    // process with --micro-batches 2 run straight.
    const fs::path straight = dir / "straight.safetensors", continued = dir / "continued.safetensors";
    const fs::path copy3 = dir / "copy3.safetensors", micro3 = dir / "micro3.safetensors";
    fs::copy_file(ckpt, continued, fs::copy_options::overwrite_existing);
    fs::copy_file(ckpt, copy3, fs::copy_options::overwrite_existing);
    fs::copy_file(ckpt, micro3, fs::copy_options::overwrite_existing);
    REQUIRE(run("train_char", tiny6(data, straight, target) + schedule + Args{"--micro-batches", "2"}).status == 0);
    Result resumed = run("train_char", tiny6(data, continued, target) + schedule +
                                           Args{"--micro-batches", "2", "--resume", continued.string()});
    REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
    CHECK(read_bytes(continued) == read_bytes(straight));
    if (signal == SIGTERM) {  // and 3 ranks continue it as one process with --micro-batches 3 does
      Result three = run_mpi(3, tiny6(data, copy3, target) + schedule + Args{"--resume", copy3.string()});
      REQUIRE_MESSAGE(three.status == 0, three.err);
      CHECK(test::contains(three.out, fmt::format("resumed from {} at step {}", copy3.string(), step)));
      REQUIRE(run("train_char",
                  tiny6(data, micro3, target) + schedule + Args{"--micro-batches", "3", "--resume", micro3.string()})
                  .status == 0);
      CHECK(read_bytes(copy3) == read_bytes(micro3));
      CHECK(saved_step(copy3) == target);
    }
  }
}

TEST_CASE("replicas that drift apart are caught at the next save, on every rank, and the last checkpoint is kept") {
  if (!mpi_available()) return;
  fs::path dir = work_dir("dp_drift"), data = write_corpus(dir), ckpt = dir / "h.safetensors";
  Result r = run_mpi(2, tiny6(data, ckpt, 10) + Args{"--eval-every", "0", "--save-every", "2"}, {},
                     {"TAPEGRAD_TEST_PERTURB_LAST_RANK_AT_STEP=3"});
  CHECK(r.status != 0);
  CHECK(test::contains(r.err, "train_char: step 4: the parameters of rank 1 (hash "));
  CHECK(test::contains(r.err, "the replicas diverged"));
  CHECK(saved_step(ckpt) == 2);
  CHECK(!has_temporary_files(dir));
}

TEST_CASE("a NaN in one rank's rows stops every rank at the same step, and the last checkpoint is kept") {
  if (!mpi_available()) return;
  fs::path dir = work_dir("dp_nan"), data = write_corpus(dir), ckpt = dir / "n.safetensors";
  // The poisoned logit is in row 0 of the global batch: rank 0's rows only.
  Result r = run_mpi(3, tiny6(data, ckpt, 10) + Args{"--eval-every", "0", "--save-every", "3"}, {},
                     {"TAPEGRAD_TEST_INJECT_NAN_BATCH_AT_STEP=5"});
  CHECK(r.status != 0);
  CHECK(test::contains(r.err, "train_char: the loss is nan at step 5; stopped without saving (the checkpoint of "
                              "step 3"));
  const std::string line = "the loss is nan";
  CHECK(r.err.find(line) == r.err.rfind(line));  // printed once, by rank 0
  CHECK(!test::contains(r.err, "MPI_ABORT"));    // every rank stopped by itself
  CHECK(saved_step(ckpt) == 3);
}

TEST_CASE("gpt2 with dropout and remat: 2 ranks write the bytes of one process with --micro-batches 2") {
  if (!mpi_available()) return;
  fs::path dir = work_dir("dp_gpt2"), data = write_corpus(dir);
  const fs::path micro = dir / "micro.safetensors", ranked = dir / "ranked.safetensors";
  const Args gpt2 = {"--arch", "gpt2", "--dropout", "0.1", "--remat", "--eval-every", "0"};
  REQUIRE(run("train_char", tiny6(data, micro, 8) + gpt2 + Args{"--micro-batches", "2"}).status == 0);
  Result r = run_mpi(2, tiny6(data, ranked, 8) + gpt2);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(test::contains(r.out, "model: Gpt2("));
  CHECK(read_bytes(micro) == read_bytes(ranked));
}
