// train_char across hosts made on this machine by scripts/netns_hosts.sh (network namespaces on
// a bridge, mpirun over TCP between them): 2 and 3 hosts write the checkpoint of one process with
// --micro-batches N, another host count resumes it, and a host whose link goes down ends every rank
// and mpirun, the lost rank named, the last checkpoint whole.
#include <doctest/doctest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "distributed/communicator.h"
#include "support/helpers.h"
#include "support/programs.h"
#include "tests/distributed/mpi_runs.h"

using namespace tapegrad;
using namespace tapegrad::test;
namespace fs = std::filesystem;

namespace {

const std::string kScript = std::string(TAPEGRAD_SOURCE_DIR) + "/scripts/netns_hosts.sh";

/// A bed name of this test process alone (the script's names are NAME-h0, NAME-v0, NAME-br).
std::string bed_name() {
  static std::atomic<int> count{0};
  return fmt::format("tg{}{}", ::getpid() % 1000000, char('a' + count++ % 26));
}

/// Runs a command to its end within limit; its status.
int run_within(const std::vector<std::string>& command, std::chrono::seconds limit, const fs::path& out,
               const fs::path& err, const std::vector<std::string>& env = {}) {
  return wait_within(start_job(command, out, err, env), limit, err);
}

/// Whether this machine can make the bed (root, iproute2). The tests run at the widest SIMD level
/// only (they test the network, not the arithmetic); they skip with a message elsewhere, and fail
/// under CI (CI=true), where a skip would go unnoticed.
bool hosts_available() {
  if (!mpi_available() || simd_level() != supported_simd_levels().back()) return false;
  static const std::optional<std::string> why = [] () -> std::optional<std::string> {
    const fs::path dir = work_dir("netns_probe");
    const int status = run_within({"bash", kScript, "--hosts", "1", "--name", bed_name(), "true"},
                                  std::chrono::seconds(30), dir / "out.txt", dir / "err.txt");
    if (status == 0) return std::nullopt;
    return fmt::format("NETWORK NAMESPACES CANNOT BE MADE HERE (status {}: {}): the multi-host tests did not run "
                       "(run the suite as root, with iproute2 installed: scripts/deps.sh)",
                       status, read_bytes(dir / "err.txt"));
  }();
  if (!why) return true;
  const char* ci = std::getenv("CI");
  if (ci && std::string(ci) == "true") FAIL(*why);
  MESSAGE(*why);
  return false;
}

/// scripts/netns_hosts.sh making `hosts` hosts, running mpirun with one rank on each.
std::vector<std::string> on_hosts(int hosts, const std::string& name, const Args& args) {
  std::vector<std::string> command = {"bash", kScript, "--hosts", std::to_string(hosts), "--name", name};
  const std::vector<std::string> job = mpirun_command(hosts, args);
  command.insert(command.end(), job.begin(), job.end());
  return command;
}

Result run_on_hosts(int hosts, const Args& args) {
  const fs::path dir = programs_dir();
  const fs::path out = dir / "hosts_stdout.txt", err = dir / "hosts_stderr.txt";
  Result r;
  r.status = run_within(on_hosts(hosts, bed_name(), args), std::chrono::seconds(90), out, err);
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  return r;
}

}  // namespace

TEST_CASE("TAPEGRAD_PEER_TIMEOUT sets how long a rank waits in a collective; a value that is no time is refused") {
  ::unsetenv("TAPEGRAD_PEER_TIMEOUT");
  CHECK(distributed::peer_timeout_from_environment() == std::chrono::minutes(10));
  ::setenv("TAPEGRAD_PEER_TIMEOUT", "2.5", 1);
  CHECK(distributed::peer_timeout_from_environment() == std::chrono::milliseconds(2500));
  ::setenv("TAPEGRAD_PEER_TIMEOUT", "0", 1);
  CHECK(distributed::peer_timeout_from_environment().count() == 0);
  for (const char* bad : {"", "ten", "5s", "-1", "nan"}) {
    CAPTURE(bad);
    ::setenv("TAPEGRAD_PEER_TIMEOUT", bad, 1);
    CHECK_THROWS_WITH_AS(distributed::peer_timeout_from_environment(),
                         doctest::Contains(fmt::format("TAPEGRAD_PEER_TIMEOUT={} is not a number of seconds", bad).c_str()),
                         std::runtime_error);
  }
  ::unsetenv("TAPEGRAD_PEER_TIMEOUT");
}

TEST_CASE("2 and 3 namespace hosts over TCP write the checkpoint of one process with --micro-batches N; another "
          "host count resumes it") {
  if (!hosts_available()) return;
  fs::path dir = work_dir("hosts_equal"), data = write_corpus(dir);
  const Args quiet = {"--eval-every", "0"};
  for (int hosts : {2, 3}) {
    CAPTURE(hosts);
    const fs::path micro = dir / fmt::format("micro{}.safetensors", hosts);
    const fs::path ranked = dir / fmt::format("hosts{}.safetensors", hosts);
    REQUIRE(run("train_char", tiny6(data, micro, 12) + quiet + Args{"--micro-batches", std::to_string(hosts)})
                .status == 0);
    Result r = run_on_hosts(hosts, tiny6(data, ranked, 12) + quiet);
    REQUIRE_MESSAGE(r.status == 0, r.err);
    CHECK(test::contains(r.out, fmt::format("{} ranks; each step sums {} gradients", hosts, hosts)));
    CHECK(read_bytes(micro) == read_bytes(ranked));
    CHECK(!test::contains(r.err, "netns_hosts: ended"));  // nothing was left running
  }
  // The 2-host checkpoint, continued on 3 hosts, as one process with --micro-batches 3 continues it.
  const fs::path three = dir / "three.safetensors", micro = dir / "micro_resumed.safetensors";
  fs::copy_file(dir / "hosts2.safetensors", three);
  fs::copy_file(dir / "hosts2.safetensors", micro);
  Result r = run_on_hosts(3, tiny6(data, three, 16) + quiet + Args{"--resume", three.string()});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(test::contains(r.out, fmt::format("resumed from {} at step 12", three.string())));
  REQUIRE(run("train_char", tiny6(data, micro, 16) + quiet + Args{"--micro-batches", "3", "--resume", micro.string()})
              .status == 0);
  CHECK(saved_step(three) == 16);
  CHECK(read_bytes(three) == read_bytes(micro));
}

TEST_CASE("a host whose link goes down ends every rank and mpirun within 30 s, naming the lost rank; the last "
          "checkpoint is whole") {
  if (!hosts_available()) return;
  fs::path dir = work_dir("hosts_link_down"), data = write_corpus(dir), ckpt = dir / "l.safetensors";
  const fs::path out = dir / "out.txt", err = dir / "err.txt";
  const std::string name = bed_name();
  const pid_t bed = start_job(on_hosts(3, name, tiny6(data, ckpt, 1000000) + Args{"--eval-every", "0", "--save-every",
                                                                                 "20"}),
                              out, err, {"TAPEGRAD_PEER_TIMEOUT=5"});
  const EndJobOnExit end{bed};  // SIGTERM first: the script removes the bed
  REQUIRE_MESSAGE(appears(out, "step 20/1000000: saved"), read_bytes(err));
  const auto cut = std::chrono::steady_clock::now();
  REQUIRE(run_within({"ip", "link", "set", name + "-v2", "down"}, std::chrono::seconds(10), dir / "ip_out.txt",
                     dir / "ip_err.txt") == 0);
  const int status = wait_within(bed, std::chrono::seconds(30), err);
  const auto took = std::chrono::steady_clock::now() - cut;
  const std::string errors = read_bytes(err);
  CHECK(status != 0);
  CHECK(took < std::chrono::seconds(30));
  CHECK_MESSAGE(test::contains(errors, "lost rank 2 (no answer to a roll call"), errors);
  // The bed ends whatever still runs in its hosts and says so: no rank may be among them.
  std::istringstream lines(errors);
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("netns_hosts: ended")) CHECK_MESSAGE(!test::contains(line, "train_char"), line);
  CHECK(saved_step(ckpt) >= 20);  // whole and loadable
  CHECK(!has_temporary_files(dir));
}

TEST_CASE("SIGTERM or SIGINT to the bed reaches its command first as SIGTERM, and it ends by itself; then the hosts "
          "are removed") {
  if (!hosts_available()) return;
  for (const auto& [signal, status] : {std::pair{SIGTERM, 143}, std::pair{SIGINT, 130}}) {
    CAPTURE(signal);
    const fs::path dir = work_dir("netns_stop");
    const std::string name = bed_name();
    // The command says when it runs and when SIGTERM reaches it, and leaves nothing behind.
    const std::string command = "trap 'echo got TERM; kill $!; exit 0' TERM; echo ready; sleep 60 & wait";
    const pid_t bed = start_job({"bash", kScript, "--hosts", "1", "--name", name, "bash", "-c", command},
                                dir / "out.txt", dir / "err.txt");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (read_bytes(dir / "out.txt").find("ready") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (read_bytes(dir / "out.txt").find("ready") == std::string::npos) {
      end_job(bed);
      FAIL("the bed's command did not start: " << read_bytes(dir / "err.txt"));
    }
    ::kill(bed, signal);
    CHECK(wait_within(bed, std::chrono::seconds(40), dir / "err.txt") == status);
    CHECK(read_bytes(dir / "out.txt").find("got TERM") != std::string::npos);
    const std::string err = read_bytes(dir / "err.txt");
    CHECK_MESSAGE(err.find("ended what still ran") == std::string::npos, err);  // nothing left to kill
    CHECK_FALSE(fs::exists("/run/netns/" + name + "-h0"));
    fs::remove_all(dir);
  }
}
