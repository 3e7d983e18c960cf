// Child processes for the tests and the benches that run the built programs: start one with its
// output in files and a given environment (posix_spawn), read how it ended, end it within a grace
// period. The one place that spawns and reaps; no doctest here, so that bench/ can use it too.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace tapegrad::test {

/// How start_process runs a child.
struct ChildOptions {
  std::filesystem::path out;              ///< its stdout, truncated
  std::filesystem::path err;              ///< its stderr; empty: into out
  std::vector<std::string> environment;   ///< its whole environment ("NAME=value" entries)
  bool own_process_group = false;         ///< leads a group of its own, which end_process can signal whole
  bool search_path = false;               ///< argv[0] may be a bare name found on PATH (mpirun)
};

/// This process's environment without the entries that start with any of `prefixes`.
inline std::vector<std::string> environment_without(const std::vector<std::string_view>& prefixes) {
  std::vector<std::string> entries;
  for (char** e = environ; *e; ++e) {
    const std::string_view entry(*e);
    bool dropped = false;
    for (std::string_view prefix : prefixes) dropped = dropped || entry.starts_with(prefix);
    if (!dropped) entries.emplace_back(entry);
  }
  return entries;
}

/// Starts argv[0] with argv; throws std::runtime_error naming the program if it cannot.
inline pid_t start_process(std::vector<std::string> argv_text, const ChildOptions& options) {
  std::vector<char*> argv, envp;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> environment = options.environment;
  for (auto& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, options.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (options.err.empty()) posix_spawn_file_actions_adddup2(&actions, 1, 2);
  else posix_spawn_file_actions_addopen(&actions, 2, options.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  if (options.own_process_group) {
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
  }
  pid_t pid = -1;
  const int rc = options.search_path
                     ? posix_spawnp(&pid, argv_text[0].c_str(), &actions, &attributes, argv.data(), envp.data())
                     : posix_spawn(&pid, argv_text[0].c_str(), &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (rc != 0) throw std::runtime_error("cannot start " + argv_text[0] + ": " + std::strerror(rc));
  return pid;
}

/// A wait status as the shell reports it: the exit status, or 128 + the signal that ended it.
inline int exit_status(int raw) { return WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw); }

/// The child's exit_status if it has ended (reaping it), or nothing while it runs.
inline std::optional<int> exited(pid_t pid) {
  int raw = 0;
  if (::waitpid(pid, &raw, WNOHANG) == 0) return std::nullopt;
  return exit_status(raw);
}

/// Waits for the child to end; returns its exit_status.
inline int wait_for(pid_t pid) {
  int raw = 0;
  if (::waitpid(pid, &raw, 0) != pid) throw std::runtime_error("waitpid " + std::to_string(pid) + " failed");
  return exit_status(raw);
}

/// Ends a child if it still runs: `first` (SIGTERM lets a server drain, mpirun end its ranks),
/// then SIGKILL after `grace` (to its whole group if it leads one); returns its exit_status.
inline int end_process(pid_t pid, std::chrono::milliseconds grace, int first = SIGTERM, bool whole_group = false) {
  if (auto status = exited(pid)) return *status;
  ::kill(pid, first);
  for (const auto deadline = std::chrono::steady_clock::now() + grace;;) {
    if (auto status = exited(pid)) return *status;
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(whole_group ? -pid : pid, SIGKILL);
  return wait_for(pid);
}

}  // namespace tapegrad::test
