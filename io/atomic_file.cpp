// AtomicFile and write_folder_atomically: temporaries beside the target, fsync, rename.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace tapegrad::io {

namespace {

// Makes a rename durable; best effort, since some file systems cannot fsync a directory.
void sync_directory_of(const std::string& path) {
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::int64_t fail_after_bytes)
    : path_(std::move(path)), temp_path_(fmt::format("{}.tmp.{}", path_, ::getpid())), fail_after_(fail_after_bytes) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error(fmt::format("{}: cannot create the temporary file {}: {}", path_, temp_path_,
                                         std::strerror(errno)));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::fail(int error) const {
  throw std::runtime_error(fmt::format("{}: write failed after {} bytes of the temporary file {}: {}", path_, written_,
                                       temp_path_, std::strerror(error)));
}

void AtomicFile::write(const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  std::size_t allowed = n;
  const bool inject = fail_after_ >= 0 && written_ + n > std::uint64_t(fail_after_);
  if (inject) allowed = std::size_t(std::uint64_t(fail_after_) - written_);
  while (allowed > 0) {
    const ssize_t got = ::write(fd_, p, allowed);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(errno);
    p += got;
    allowed -= std::size_t(got);
    written_ += std::size_t(got);
  }
  if (inject) fail(ENOSPC);
}

void AtomicFile::write_zeros(std::size_t n) {
  static constexpr char kZeros[256] = {};
  for (std::size_t left = n; left > 0;) {
    const std::size_t chunk = std::min(left, sizeof(kZeros));
    write(kZeros, chunk);
    left -= chunk;
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail(errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(errno);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
    throw std::runtime_error(fmt::format("{}: cannot rename the temporary file {} over it: {}", path_, temp_path_,
                                         std::strerror(errno)));
  committed_ = true;
  sync_directory_of(path_);
}

void write_folder_atomically(const std::string& dir, const std::function<void(const std::string& temp_dir)>& fill) {
  namespace fs = std::filesystem;
  std::string target = dir;
  while (target.size() > 1 && target.back() == '/') target.pop_back();  // "out/" renames as "out"
  if (fs::exists(target) && !fs::is_directory(target))
    throw std::runtime_error(fmt::format("{}: exists and is not a folder", dir));
  const std::string temp = fmt::format("{}.tmp.{}", target, ::getpid());
  const std::string old = fmt::format("{}.old.{}", target, ::getpid());
  std::error_code ignored;
  fs::remove_all(temp, ignored);  // a leftover of a crashed run of this pid
  if (!fs::create_directory(temp, ignored) || ignored)
    throw std::runtime_error(fmt::format("{}: cannot create the temporary folder {}: {}", dir, temp,
                                         ignored ? ignored.message() : "it exists"));
  try {
    fill(temp);
    const bool replacing = fs::exists(target);
    if (replacing && ::rename(target.c_str(), old.c_str()) != 0)
      throw std::runtime_error(fmt::format("{}: cannot move the existing folder aside to {}: {}", dir, old,
                                           std::strerror(errno)));
    if (::rename(temp.c_str(), target.c_str()) != 0) {
      const int error = errno;
      if (replacing) ::rename(old.c_str(), target.c_str());
      throw std::runtime_error(fmt::format("{}: cannot rename the temporary folder {} to it: {}", dir, temp,
                                           std::strerror(error)));
    }
    if (replacing) fs::remove_all(old, ignored);
  } catch (...) {
    fs::remove_all(temp, ignored);
    throw;
  }
  sync_directory_of(target);
}

}  // namespace tapegrad::io
