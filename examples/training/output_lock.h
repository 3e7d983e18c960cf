// An exclusive advisory lock (flock) on "<checkpoint>.lock", held by train for its whole run,
// so that two runs pointed at the same checkpoint refuse to start instead of interleaving saves.
#pragma once

#include <string>

namespace tapegrad::examples {

/// Holds flock(LOCK_EX) on path + ".lock" from construction to destruction. The lock file is
/// created if missing (O_CLOEXEC, so programs started meanwhile do not inherit it), holds the
/// holder's pid as text, and is removed by the holder before it lets go; one left behind by a
/// killed run is simply locked again (the kernel released its lock). Note [Lock file].
class OutputLock {
 public:
  /// Takes the lock, or throws std::runtime_error naming path when another process holds it
  /// ("<path>: another train_char (process N) is writing it; ...") or when it cannot be taken.
  explicit OutputLock(const std::string& path);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  const std::string& lock_path() const { return lock_path_; }

 private:
  std::string path_, lock_path_;
  int fd_ = -1;
};

}  // namespace tapegrad::examples
