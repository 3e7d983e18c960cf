// Fault tests of train_char, run as built (docs/testing.md): two runs writing one checkpoint,
// SIGKILL at random moments, a save that fails part-way, a NaN in a batch, forged checkpoints and
// metrics files. After every fault the checkpoint on disk is whole, loadable and where it was.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>

#include "core/random.h"
#include "io/safetensors.h"
#include "nn/checkpoint.h"
#include "support/helpers.h"
#include "support/programs.h"

using namespace tapegrad;
using namespace tapegrad::test;
namespace fs = std::filesystem;

namespace {

using Args = std::vector<std::string>;
using Clock = std::chrono::steady_clock;

/// Runs a program like run(), but kills it and fails the test if it is not done in time (a hang
/// is a bug found, not a stuck suite).
Result run_within(std::chrono::seconds limit, const std::string& program, const Args& args, const Args& env = {}) {
  const fs::path out = programs_dir() / "stdout.txt", err = programs_dir() / "stderr.txt";
  const pid_t pid = start(program, args, out, err, env);
  const auto deadline = Clock::now() + limit;
  int raw = 0;
  while (::waitpid(pid, &raw, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      wait_for(pid);
      FAIL(program << " did not finish within " << limit.count() << " s: " << read_bytes(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw), read_bytes(out), read_bytes(err)};
}

/// Calls done() until it returns true (then returns true at once) or the deadline passes.
template <class F>
bool eventually(F done, std::chrono::seconds limit = std::chrono::seconds(20)) {
  for (const auto deadline = Clock::now() + limit; Clock::now() < deadline;) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

/// Ends a child process still running when the scope exits (a failed REQUIRE leaves no orphan).
struct EndOnExit {
  pid_t pid;
  ~EndOnExit() {
    if (::waitpid(pid, nullptr, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

/// The names in dir, sorted.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// A pid that no process has: that of a child that has ended and been waited for.
pid_t dead_pid() {
  const fs::path log = programs_dir() / "dead.txt";
  const pid_t pid = start("train_char", {"--help"}, log, log);
  wait_for(pid);
  return pid;
}

}  // namespace

TEST_CASE("a second train_char writing the same checkpoint refuses to start, and the first finishes with a loadable one") {
  fs::path dir = work_dir("faults_lock"), data = write_corpus(dir), ckpt = dir / "l.safetensors";
  const std::string lock = ckpt.string() + ".lock";
  // The first run resumes, and reads the metrics CSV it continues from a FIFO: it takes the lock
  // once its inputs are checked, then waits for that CSV, so the second run meets the lock
  // whatever the timing.
  REQUIRE(run("train_char", tiny(data, ckpt, 2)).status == 0);
  const fs::path fifo = dir / "metrics.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  const pid_t first = start("train_char",
                            tiny(data, ckpt, 30) + Args{"--save-every", "5", "--eval-every", "10", "--resume",
                                                        ckpt.string(), "--metrics", fifo.string()},
                            dir / "first.out", dir / "first.err");
  const EndOnExit end_first{first};
  // The holder writes its pid into the lock file once it has the lock.
  REQUIRE(eventually([&] { return read_bytes(lock) == fmt::format("{}\n", first); }));
  const std::vector<std::string> before = listing(dir);

  Result second = run("train_char", tiny(data, ckpt, 30));
  CHECK(second.status == 1);
  CHECK(one_error_line(second, "train_char"));
  CHECK(test::contains(second.err, fmt::format("{}: another train_char (process {}) is writing it", ckpt.string(), first)));
  CHECK(test::contains(second.err, "choose another --out"));
  CHECK(second.out.empty());
  Result respelled = run("train_char", tiny(data, dir / "." / "l.safetensors", 30));
  CHECK(respelled.status == 1);
  CHECK(test::contains(respelled.err, "another train_char"));
  CHECK(listing(dir) == before);  // no file created, and the lock file is as the first run wrote it
  CHECK(read_bytes(lock) == fmt::format("{}\n", first));

  // Give the first run an empty CSV (it starts a new one): it trains and finishes.
  int fd = -1;
  REQUIRE(eventually([&] { return (fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) >= 0; }));
  ::close(fd);
  CHECK(wait_for(first) == 0);
  CHECK(test::contains(read_bytes(dir / "first.out"), "done: step 30"));
  CHECK(nn::load_model_checkpoint(ckpt.string()).metadata.at("step") == "30");
  CHECK(!fs::exists(lock));  // a finished run removes its lock file
  CHECK(!has_temporary_files(dir));
  // The checkpoint is free again.
  Result third = run("train_char", tiny(data, ckpt, 32) + Args{"--resume", ckpt.string()});
  CHECK_MESSAGE(third.status == 0, third.err);
}

TEST_CASE("training killed at random moments always leaves a loadable checkpoint and resumes to an uninterrupted run's bytes") {
  fs::path dir = work_dir("faults_kill"), data = write_corpus(dir);
  const fs::path straight = dir / "straight.safetensors", killed = dir / "killed.safetensors";
  // About a second of steps and saves here, so that the kills land inside the run. Under the
  // sanitizers a step takes 5-10 times as long, and a third of the steps still outlasts every kill.
#if defined(__SANITIZE_ADDRESS__)
  const int steps = 200;
#else
  const int steps = 600;
#endif
  const Args flags = {"--eval-every", "0", "--save-every", "1"};  // a save after every step
  // Saves do not change what training computes: the straight run and the last one, which ends
  // the killed run, save only at the end (every save is an fsync, slow on a busy disk).
  const Args at_the_end = {"--eval-every", "0", "--save-every", "0"};
  REQUIRE(run("train_char", tiny(data, straight, steps) + at_the_end).status == 0);

  Rng delays(2024);  // fixed: the same kill delays on every run of the suite
  std::int64_t last_step = 0;
  bool finished = false;
  for (int round = 0; round < 8 && !finished; ++round) {
    CAPTURE(round);
    const Args resume = fs::exists(killed) ? Args{"--resume", killed.string()} : Args{};
    const pid_t pid = start("train_char", tiny(data, killed, steps) + flags + resume, dir / "round.out",
                            dir / "round.err");
    const EndOnExit end_round{pid};
    std::this_thread::sleep_for(std::chrono::milliseconds(15 + delays.below(120)));
    REQUIRE(::kill(pid, SIGKILL) == 0);
    const int status = wait_for(pid);
    finished = status == 0;  // done before the kill: only on a machine far faster than this one
    CHECK_MESSAGE((status == 128 + SIGKILL || finished), read_bytes(dir / "round.err"));
    if (!fs::exists(killed)) continue;  // killed before its first save: the next round starts afresh
    nn::LoadedModelCheckpoint loaded = nn::load_model_checkpoint(killed.string());  // whole after every kill
    const std::int64_t step = std::stoll(loaded.metadata.at("step"));
    CHECK(step >= last_step);
    last_step = step;
  }
  const bool stale = has_temporary_files(dir);
  Result last = run("train_char", tiny(data, killed, steps) + at_the_end +
                                      (fs::exists(killed) ? Args{"--resume", killed.string()} : Args{}));
  REQUIRE_MESSAGE(last.status == 0, last.err);
  CHECK(test::contains(last.out, "removed ") == stale);  // the killed runs' temporary files
  CHECK(read_bytes(killed) == read_bytes(straight));
  check_same_tensors(straight, killed);
  CHECK(!has_temporary_files(dir));
  CHECK(!fs::exists(killed.string() + ".lock"));
}

TEST_CASE("temporary files of a killed writer are removed by the next run; those of a live process are kept") {
  fs::path dir = work_dir("faults_stale"), data = write_corpus(dir), ckpt = dir / "s.safetensors";
  const pid_t gone = dead_pid();
  const fs::path stale_ckpt = fmt::format("{}.tmp.{}", ckpt.string(), gone);
  const fs::path stale_csv = dir / fmt::format("s.metrics.csv.tmp.{}", gone);
  const fs::path live = fmt::format("{}.tmp.{}", ckpt.string(), ::getpid());  // this test process
  const fs::path other = ckpt.string() + ".tmp.backup";                       // not a pid
  for (const fs::path& file : {stale_ckpt, stale_csv, live, other}) write_bytes(file, "half a checkpoint");
  Result r = run("train_char", tiny(data, ckpt, 3));
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(test::contains(r.out, fmt::format("note: removed {}, left by a run that was killed while writing", stale_ckpt.string())));
  CHECK(!fs::exists(stale_ckpt));
  CHECK(!fs::exists(stale_csv));
  CHECK(read_bytes(live) == "half a checkpoint");
  CHECK(read_bytes(other) == "half a checkpoint");
  CHECK(nn::load_model_checkpoint(ckpt.string()).metadata.at("step") == "3");
}

TEST_CASE("a save that fails part-way stops the run naming the step, and the previous checkpoint stays byte-identical") {
  // The failure is the writer's own test seam (core/safetensors: a full disk after 4096 bytes),
  // set by train_char from TAPEGRAD_TEST_FAIL_SAVE_AT_STEP: the suite runs as root, where a
  // read-only folder still takes writes, and a full file system needs privileges to mount.
  fs::path dir = work_dir("faults_save"), data = write_corpus(dir), ckpt = dir / "f.safetensors";
  const Args schedule = {"--decay-steps", "20", "--eval-every", "0", "--save-every", "5"};
  REQUIRE(run("train_char", tiny(data, ckpt, 5) + schedule).status == 0);
  const std::string good = read_bytes(ckpt);

  Result resumed = run("train_char", tiny(data, ckpt, 20) + schedule + Args{"--resume", ckpt.string()},
                       {"TAPEGRAD_TEST_FAIL_SAVE_AT_STEP=10"});
  CHECK(resumed.status == 1);
  CHECK(one_error_line(resumed, "train_char"));
  CHECK(test::contains(resumed.err, "cannot save the checkpoint of step 10: " + ckpt.string() + ": write failed after 4096 bytes"));
  CHECK(test::contains(resumed.err, "No space left on device"));
  CHECK(test::contains(resumed.err, fmt::format("the checkpoint it resumed from, {}, is kept", ckpt.string())));
  CHECK(read_bytes(ckpt) == good);
  CHECK(nn::load_model_checkpoint(ckpt.string()).metadata.at("step") == "5");
  CHECK(!has_temporary_files(dir));
  CHECK(!fs::exists(ckpt.string() + ".lock"));

  SUBCASE("within one run, the periodic checkpoint before the failed save survives") {
    const fs::path fresh = dir / "fresh.safetensors";
    Result in_run = run("train_char", tiny(data, fresh, 20) + schedule, {"TAPEGRAD_TEST_FAIL_SAVE_AT_STEP=15"});
    CHECK(in_run.status == 1);
    CHECK(one_error_line(in_run, "train_char"));
    CHECK(test::contains(in_run.err, "cannot save the checkpoint of step 15"));
    CHECK(test::contains(in_run.err, fmt::format("the checkpoint of step 10, {}, is kept", fresh.string())));
    CHECK(nn::load_model_checkpoint(fresh.string()).metadata.at("step") == "10");
    CHECK(!has_temporary_files(dir));
  }
  SUBCASE("a failing final save keeps the periodic checkpoint of step 15") {
    const fs::path fresh = dir / "final.safetensors";
    Result in_run = run("train_char", tiny(data, fresh, 20) + schedule, {"TAPEGRAD_TEST_FAIL_SAVE_AT_STEP=20"});
    CHECK(in_run.status == 1);
    CHECK(test::contains(in_run.err, "cannot save the checkpoint of step 20"));
    CHECK(nn::load_model_checkpoint(fresh.string()).metadata.at("step") == "15");
  }
}

TEST_CASE("an --out under a regular file is one clear line naming the path, and touches nothing") {
  // A real failure, root or not: the checkpoint's folder cannot be created.
  fs::path dir = work_dir("faults_folder"), data = write_corpus(dir);
  write_bytes(dir / "notes.txt", "not a folder");
  const fs::path ckpt = dir / "notes.txt" / "c.safetensors";
  Result r = run("train_char", tiny(data, ckpt, 3));
  CHECK(r.status == 1);
  CHECK(one_error_line(r, "train_char"));
  CHECK(test::contains(r.err, (dir / "notes.txt").string() + ": cannot create the folder"));
  CHECK(read_bytes(dir / "notes.txt") == "not a folder");
  CHECK(listing(dir) == std::vector<std::string>{"corpus.txt", "notes.txt"});
}

TEST_CASE("a NaN in one batch stops the run naming the step; the last good checkpoint survives byte-identical") {
  // TAPEGRAD_TEST_INJECT_NAN_BATCH_AT_STEP puts a NaN into that step's batch (its first logit):
  // the parameters stay finite, unlike TAPEGRAD_TEST_INJECT_NAN_AT_STEP's (test_programs.cpp).
  fs::path dir = work_dir("faults_nan_batch"), data = write_corpus(dir);
  const fs::path ckpt = dir / "n.safetensors", straight = dir / "straight.safetensors";
  const Args schedule = {"--decay-steps", "20", "--eval-every", "0", "--save-every", "0"};
  REQUIRE(run("train_char", tiny(data, straight, 20) + schedule).status == 0);
  REQUIRE(run("train_char", tiny(data, ckpt, 10) + schedule).status == 0);
  const std::string good = read_bytes(ckpt);

  Result r = run("train_char", tiny(data, ckpt, 20) + schedule + Args{"--resume", ckpt.string()},
                 {"TAPEGRAD_TEST_INJECT_NAN_BATCH_AT_STEP=13"});
  CHECK(r.status == 1);
  CHECK(one_error_line(r, "train_char"));
  CHECK(test::contains(r.err, "the loss is nan at step 13; stopped without saving"));
  CHECK(test::contains(r.err, fmt::format("the checkpoint it resumed from, {}, is kept", ckpt.string())));
  CHECK(read_bytes(ckpt) == good);
  CHECK(!has_temporary_files(dir));

  // The fault was the batch's alone: resuming without it ends where a straight run does.
  Result again = run("train_char", tiny(data, ckpt, 20) + schedule + Args{"--resume", ckpt.string()});
  REQUIRE_MESSAGE(again.status == 0, again.err);
  CHECK(read_bytes(ckpt) == read_bytes(straight));

  SUBCASE("within one run, the periodic checkpoint before the bad batch survives") {
    const fs::path fresh = dir / "fresh.safetensors";
    Result in_run = run("train_char", tiny(data, fresh, 20) + Args{"--eval-every", "0", "--save-every", "4"},
                        {"TAPEGRAD_TEST_INJECT_NAN_BATCH_AT_STEP=7"});
    CHECK(in_run.status == 1);
    CHECK(test::contains(in_run.err, "the loss is nan at step 7"));
    CHECK(test::contains(in_run.err, fmt::format("the checkpoint of step 4, {}, is kept", fresh.string())));
    CHECK(nn::load_model_checkpoint(fresh.string()).metadata.at("step") == "4");
  }
}

TEST_CASE("forged training checkpoints are refused by --resume with one line naming the file and the problem") {
  fs::path dir = work_dir("faults_forged"), data = write_corpus(dir), ckpt = dir / "g.safetensors";
  REQUIRE(run("train_char", tiny(data, ckpt, 2)).status == 0);
  const SafetensorsFile genuine = read_safetensors(ckpt.string());
  const std::string moment = "optim.embed.weight.m";
  REQUIRE(genuine.tensors.count(moment));
  struct Forgery {
    std::string what, message;
    std::function<void(SafetensorsFile&)> forge;
    int status = 1;
  };
  auto set = [](std::string key, std::string value) {
    return [=](SafetensorsFile& f) { f.metadata[key] = value; };
  };
  auto erase = [](std::string key) { return [=](SafetensorsFile& f) { f.metadata.erase(key); }; };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<Forgery> forgeries = {
      {"a negative step", "metadata 'step' = '-3' is not a non-negative integer", set("step", "-3")},
      {"a step past 2^63", "is not a non-negative integer", set("step", "99999999999999999999")},
      {"a step with trailing text", "metadata 'step' = '2x' is not", set("step", "2x")},
      {"no step", "it is not a training checkpoint", erase("step")},
      {"a step beyond --steps", "--steps 4 is below the step 1000", set("step", "1000"), 2},
      {"no rng_state", "metadata key 'rng_state' is missing", erase("rng_state")},
      {"the all-zero rng_state", "the all-zero state is invalid", set("rng_state", "0 0 0 0")},
      {"three rng words", "malformed state '1 2 3'", set("rng_state", "1 2 3")},
      {"an rng word past 2^64", "malformed state", set("rng_state", "1 2 3 18446744073709551616")},
      {"a negative optimizer_steps", "metadata 'optimizer_steps' = '-1'", set("optimizer_steps", "-1")},
      {"another text's fingerprint", "it was trained on another text", set("data_fingerprint", "fnv1a64:0")},
      {"a missing moment", "missing tensor '" + moment + "'", [&](SafetensorsFile& f) { f.tensors.erase(moment); }},
      {"a misshapen moment", "tensor '" + moment + "' has shape [3]",
       [&](SafetensorsFile& f) { f.tensors[moment] = Tensor({3}); }},
      {"an unknown optim. tensor", "unexpected tensor 'optim.ghost.m'",
       [](SafetensorsFile& f) { f.tensors["optim.ghost.m"] = Tensor({2}); }},
      {"a NaN parameter", "tensor 'head.bias' holds nan at element 1",
       [&](SafetensorsFile& f) { f.tensors["head.bias"][1] = nan; }},
      {"an infinite moment", "tensor '" + moment + "' holds inf at element 0",
       [&](SafetensorsFile& f) { f.tensors[moment][0] = inf; }},
      {"a negative second moment", "tensor 'optim.embed.weight.v' holds -0.25 at element 3: the second moment v must "
       "be >= 0", [&](SafetensorsFile& f) { f.tensors["optim.embed.weight.v"][3] = -0.25f; }},
  };
  for (const Forgery& forgery : forgeries) {
    CAPTURE(forgery.what);
    SafetensorsFile forged = genuine;
    forgery.forge(forged);
    const fs::path path = dir / "forged.safetensors", out = dir / "new_folder" / "out.safetensors";
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    for (const auto& [name, tensor] : forged.tensors) tensors.emplace_back(name, &tensor);
    write_safetensors(path.string(), tensors, forged.metadata);
    Result r = run_within(std::chrono::seconds(20), "train_char", tiny(data, out, 4) + Args{"--resume", path.string()});
    CHECK(r.status == forgery.status);
    CHECK(one_error_line(r, "train_char"));
    CHECK(test::contains(r.err, path.string()));
    CHECK_MESSAGE(test::contains(r.err, forgery.message), r.err);
    CHECK(!fs::exists(out));
    CHECK(!fs::exists(out.parent_path()));  // every input is checked before anything is created
  }
}

TEST_CASE("checkpoints with non-finite weights are refused by generate and evaluate, naming the file and the tensor") {
  fs::path dir = work_dir("faults_nonfinite"), data = write_corpus(dir), ckpt = dir / "w.safetensors";
  REQUIRE(run("train_char", tiny(data, ckpt, 2)).status == 0);
  SafetensorsFile file = read_safetensors(ckpt.string());
  file.tensors["head.bias"][0] = std::numeric_limits<float>::infinity();
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const auto& [name, tensor] : file.tensors) tensors.emplace_back(name, &tensor);
  write_safetensors(ckpt.string(), tensors, file.metadata);
  for (const auto& [program, args] : std::vector<std::pair<std::string, Args>>{
           {"generate", {"--checkpoint", ckpt.string(), "--max-new", "5"}},
           {"evaluate", {"--checkpoint", ckpt.string(), "--data", data.string()}}}) {
    CAPTURE(program);
    Result r = run_within(std::chrono::seconds(20), program, args);
    CHECK(r.status == 1);
    CHECK(one_error_line(r, program));
    CHECK(test::contains(r.err, ckpt.string() + ": tensor 'head.bias' holds inf at element 0"));
    CHECK(r.out.empty());
  }
}

TEST_CASE("a forged metrics CSV beside the checkpoint never hangs or fails a resumed run") {
  fs::path dir = work_dir("faults_metrics"), data = write_corpus(dir), ckpt = dir / "m.safetensors";
  const fs::path csv = dir / "m.metrics.csv";
  const std::string header = "step,train_loss,val_loss,lr,tokens_per_s,wall_s\n";
  REQUIRE(run("train_char", tiny(data, ckpt, 2) + Args{"--decay-steps", "4"}).status == 0);
  const std::string genuine_ckpt = read_bytes(ckpt);
  const std::vector<std::pair<std::string, std::string>> forgeries = {
      {"one huge loss", header + "0,,3e15,0,0,0\n"},
      {"huge losses 1 apart (a tick below their float spacing)", header + "0,,3e15,0,0,0\n1,3000000000000001,,0,0,0\n"},
      {"losses of nan, inf and -inf", header + "0,,nan,0,0,0\n1,inf,,1e-3,1,1\n2,-inf,-inf,1e-3,1,nan\n"},
      {"a number beyond double", header + "0,,1e999,0,0,0\n"},
      {"losses whose range overflows a double", header + "0,,1.7e308,0,0,0\n1,-1.7e308,,0,0,0\n"},
      {"huge and negative steps", header + "-5,1,1,0,0,0\n9223372036854775807,1,1,0,0,0\n"},
      {"steps out of order", header + "2,1,1,0,0,0\n0,,4,0,0,0\n1,3,,0,0,0\n"},
      {"a huge wall time", header + "0,,4,0,0,1e300\n"},
      {"too few columns", header + "0,1\n"},
      {"binary junk", header + std::string{'\0', '\xff', '\x01', ',', '\n'} + ",,,,,,,,\n"},
      {"no header", "0,,4,0,0,0\n"},
      {"empty", ""},
  };
  for (const auto& [what, text] : forgeries) {
    CAPTURE(what);
    write_bytes(ckpt, genuine_ckpt);
    write_bytes(csv, text);
    Result r = run_within(std::chrono::seconds(20), "train_char",
                          tiny(data, ckpt, 4) + Args{"--decay-steps", "4", "--resume", ckpt.string()});
    CHECK_MESSAGE(r.status == 0, r.err);
    CHECK(nn::load_model_checkpoint(ckpt.string()).metadata.at("step") == "4");
    CHECK(read_bytes(csv).starts_with(header));
    CHECK(read_bytes(dir / "m.loss.svg").ends_with("</svg>\n"));
    // A run that stops at its first step draws the forged rows alone (this one hung, filling
    // memory, on the huge losses 1 apart before the SVG's tick loops counted their ticks).
    write_bytes(ckpt, genuine_ckpt);
    write_bytes(csv, text);
    Result stopped = run_within(std::chrono::seconds(20), "train_char",
                                tiny(data, ckpt, 4) + Args{"--decay-steps", "4", "--resume", ckpt.string()},
                                {"TAPEGRAD_TEST_INJECT_NAN_AT_STEP=3"});
    CHECK(stopped.status == 1);
    CHECK(test::contains(stopped.err, "the loss is nan at step 3"));
    CHECK(read_bytes(ckpt) == genuine_ckpt);
  }
}
