// Helpers for the tests that start train_char under mpirun (tests/distributed/): the tiny model's
// arguments, the launch with the environment a container needs, a deadline on every run (a hang
// fails instead of stalling the suite), the ranks of a running job, and the loud refusal to skip
// silently in CI.
#pragma once

#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/simd.h"
#include "nn/checkpoint.h"
#include "support/programs.h"

namespace tapegrad::test {

using Args = std::vector<std::string>;

/// The tiny model of tests/examples with a batch that 1, 2, 3 and 6 ranks or micro-batches divide.
inline Args tiny6(const std::filesystem::path& data, const std::filesystem::path& out, int steps, int batch = 6) {
  return {"--data",    data.string(), "--out",     out.string(), "--d-model",      "16", "--heads",
          "2",         "--blocks",    "1",         "--max-len",  "32",             "--seq",
          "16",        "--batch",     std::to_string(batch),     "--threads",      "1",
          "--eval-batches", "2",      "--steps",   std::to_string(steps)};
}

/// The step a training checkpoint was saved at (loading it checks that it is whole).
inline std::int64_t saved_step(const std::filesystem::path& ckpt) {
  return std::stoll(nn::load_model_checkpoint(ckpt.string()).metadata.at("step"));
}

/// Waits until text appears in a file (at most 30 s).
inline bool appears(const std::filesystem::path& file, const std::string& text) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (read_bytes(file).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

/// Whether train_char was built with MPI. Without it, the MPI tests pass with a loud message, but
/// fail under CI (CI=true), where a build that silently lost MPI would otherwise go unnoticed.
/// They run at the widest SIMD level and at emulated16 only (the suite runs once per level): they
/// test the exchange, and each compares runs made at one level.
inline bool mpi_available() {
#if TAPEGRAD_HAVE_MPI
  const SimdLevel widest = supported_simd_levels().back();
  if (simd_level() != widest && simd_level() != SimdLevel::emulated16) {
    static bool said = false;
    if (!std::exchange(said, true))
      MESSAGE("the tests under mpirun run at SIMD levels " << simd_level_name(widest) << " and emulated16 only");
    return false;
  }
  return true;
#else
  const char* ci = std::getenv("CI");
  const std::string why =
      "MPI IS NOT BUILT: the data-parallel tests under mpirun did not run (install libopenmpi-dev and "
      "openmpi-bin, e.g. scripts/deps.sh, and reconfigure with TAPEGRAD_MPI=AUTO or ON)";
  if (ci && std::string(ci) == "true") FAIL(why);
  MESSAGE(why);
  return false;
#endif
}

/// What Open MPI needs here: to run as root (containers), more ranks than cores, and no
/// cross-memory attach (often forbidden in containers).
inline std::vector<std::string> mpi_environment() {
  // Under AddressSanitizer, Open MPI's own allocations that live until exit are no leak of ours.
  return {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rmaps_base_oversubscribe=1",
          "OMPI_MCA_btl_vader_single_copy_mechanism=none", "ASAN_OPTIONS=detect_leaks=0"};
}

/// A simulated two-host run: TCP over loopback only, for both the messages and the launcher.
inline std::vector<std::string> tcp_loopback() {
  return {"--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"};
}

/// `mpirun -np ranks --bind-to none [mpirun_args] train_char args`, as an argument list.
inline std::vector<std::string> mpirun_command(int ranks, const std::vector<std::string>& args,
                                               const std::vector<std::string>& mpirun_args = {}) {
  std::vector<std::string> argv_text = {TAPEGRAD_MPIEXEC, "-np", std::to_string(ranks), "--bind-to", "none"};
  argv_text.insert(argv_text.end(), mpirun_args.begin(), mpirun_args.end());
  argv_text.push_back((std::filesystem::path(TAPEGRAD_BINARY_DIR) / "train_char").string());
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  return argv_text;
}

/// Starts a job (mpirun, or a launcher around it) in its own process group (so that a deadline can
/// end the launcher and every rank), with the environment MPI needs, stdout and stderr to files.
inline pid_t start_job(std::vector<std::string> argv_text, const std::filesystem::path& out,
                       const std::filesystem::path& err, const std::vector<std::string>& env = {}) {
  std::vector<std::string> environment = mpi_environment();
  environment.insert(environment.end(), env.begin(), env.end());
  for (std::string& entry : environment_without({"DATA=", "TAPEGRAD_TEST_", "OMPI_", "ASAN_OPTIONS="}))
    environment.push_back(std::move(entry));
  return start_process(std::move(argv_text), {.out = out,
                                              .err = err,
                                              .environment = std::move(environment),
                                              .own_process_group = true,
                                              .search_path = true});
}

/// Starts `mpirun -np ranks [mpirun_args] train_char args` (start_job).
inline pid_t start_mpirun(int ranks, const std::vector<std::string>& args, const std::filesystem::path& out,
                          const std::filesystem::path& err, const std::vector<std::string>& mpirun_args = {},
                          const std::vector<std::string>& env = {}) {
  return start_job(mpirun_command(ranks, args, mpirun_args), out, err, env);
}

/// Ends a job (start_job) if it still runs: SIGTERM to its launcher, which ends what it started
/// (mpirun its ranks; scripts/netns_hosts.sh its hosts, namespaces and links), then after 10 s
/// SIGKILL to its whole process group.
inline void end_job(pid_t pid) { end_process(pid, std::chrono::seconds(10), SIGTERM, /*whole_group=*/true); }

/// Waits for a job started by start_job; past the deadline, ends it (end_job) and fails.
inline int wait_within(pid_t pid, std::chrono::seconds limit, const std::filesystem::path& err) {
  for (const auto deadline = std::chrono::steady_clock::now() + limit;;) {
    if (auto status = exited(pid)) return *status;
    if (std::chrono::steady_clock::now() > deadline) {
      end_job(pid);
      FAIL("the job did not finish within " << limit.count() << " s: " << read_bytes(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

/// Runs train_char under mpirun to its end (at most 90 s).
inline Result run_mpi(int ranks, const std::vector<std::string>& args, const std::vector<std::string>& mpirun_args = {},
                      const std::vector<std::string>& env = {}) {
  const std::filesystem::path dir = programs_dir();
  std::filesystem::create_directories(dir);
  const std::filesystem::path out = dir / "mpi_stdout.txt", err = dir / "mpi_stderr.txt";
  Result r;
  r.status = wait_within(start_mpirun(ranks, args, out, err, mpirun_args, env), std::chrono::seconds(90), err);
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  return r;
}

/// Ends a job still running when the scope exits (end_job), also when a check fails.
struct EndJobOnExit {
  pid_t pid;
  ~EndJobOnExit() { end_job(pid); }
};

/// The pids of the running processes named `name` whose parent is `parent` (mpirun's ranks).
inline std::vector<pid_t> children_named(pid_t parent, const std::string& name) {
  std::vector<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid_text = entry.path().filename().string();
    if (pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    const auto open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    const std::string comm = stat.substr(open + 1, close - open - 1);
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (comm == name && ppid == parent && state != "Z") pids.push_back(pid_t(std::stol(pid_text)));
  }
  std::sort(pids.begin(), pids.end());
  return pids;
}

}  // namespace tapegrad::test
