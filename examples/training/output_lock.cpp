// The checkpoint's lock file: flock on "<checkpoint>.lock", with the holder's pid for messages.
#include "training/output_lock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace tapegrad::examples {

// Note [Lock file]
// The holder removes the lock file before it lets go, so that a finished run leaves no file
// behind. Removing a lock file races with a process that opened it just before: that process may
// lock the removed file once the holder lets go, while a third one creates and locks a new file
// under the same name, and both would think they hold the lock. So whoever gets the lock checks
// that the name still leads to the file it locked, and starts over when it does not. Only the
// holder ever removes the file; a run killed while holding it leaves it in place, unlocked.

namespace {

/// The pid written in a lock file by its holder, or "" when it cannot be read (yet).
std::string holder_of(int fd) {
  char text[32] = {};
  const ssize_t got = ::pread(fd, text, sizeof text - 1, 0);
  if (got <= 0) return "";
  std::string pid(text, std::size_t(got));
  while (!pid.empty() && std::isspace(static_cast<unsigned char>(pid.back()))) pid.pop_back();
  for (char c : pid)
    if (!std::isdigit(static_cast<unsigned char>(c))) return "";
  return pid;
}

}  // namespace

OutputLock::OutputLock(const std::string& path) : path_(path), lock_path_(path + ".lock") {
  // A few rounds are plenty: starting over needs another run to remove the file in between.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      throw std::runtime_error(
          fmt::format("{}: cannot open the lock file {}: {}", path_, lock_path_, std::strerror(errno)));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      const std::string holder = error == EWOULDBLOCK ? holder_of(fd) : "";
      ::close(fd);
      if (error == EWOULDBLOCK)
        throw std::runtime_error(
            fmt::format("{}: another train_char{} is writing it (it holds the lock {}); wait for it to finish or "
                        "choose another --out",
                        path_, holder.empty() ? "" : fmt::format(" (process {})", holder), lock_path_));
      throw std::runtime_error(
          fmt::format("{}: cannot lock {}: {}", path_, lock_path_, std::strerror(error)));
    }
    struct stat locked {}, named {};
    if (::fstat(fd, &locked) == 0 && ::stat(lock_path_.c_str(), &named) == 0 && locked.st_dev == named.st_dev &&
        locked.st_ino == named.st_ino) {
      // Ours. The pid only improves the message of a run refused meanwhile: best effort.
      const std::string pid = fmt::format("{}\n", ::getpid());
      [[maybe_unused]] const bool recorded =
          ::ftruncate(fd, 0) == 0 && ::pwrite(fd, pid.data(), pid.size(), 0) == ssize_t(pid.size());
      fd_ = fd;
      return;
    }
    ::close(fd);  // the file was removed or replaced after we opened it: Note [Lock file]
  }
  throw std::runtime_error(fmt::format("{}: cannot lock {}: it keeps being removed and recreated", path_, lock_path_));
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(lock_path_.c_str());  // while still holding it: Note [Lock file]
  ::close(fd_);
}

}  // namespace tapegrad::examples
