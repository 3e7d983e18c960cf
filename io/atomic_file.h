// Atomic writes: a file's bytes go to a temporary beside it, are fsync'ed and renamed over it; a
// folder is filled beside its place and renamed into it. A failure leaves the target as it was
// and no temporary behind; every error names the target's path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace tapegrad::io {

/// One file written atomically: write() its bytes, then commit(). Destroyed uncommitted (an
/// exception on the way), it removes its temporary and leaves `path` untouched.
class AtomicFile {
 public:
  /// Creates the temporary path + ".tmp.<pid>" in the same folder; throws std::runtime_error
  /// "<path>: cannot create the temporary file <temp>: <OS error>". fail_after_bytes >= 0 is a
  /// test seam: the write that would pass that many bytes fails as a full disk would (ENOSPC).
  explicit AtomicFile(std::string path, std::int64_t fail_after_bytes = -1);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends n bytes; throws "<path>: write failed after <n> bytes of the temporary file <temp>:
  /// <OS error>".
  void write(const void* data, std::size_t n);
  /// Appends n zero bytes.
  void write_zeros(std::size_t n);
  /// Flushes and fsyncs the temporary, renames it over path, and fsyncs the folder (best effort).
  void commit();
  /// The bytes written so far.
  std::uint64_t written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(int error) const;

  std::string path_, temp_path_;
  int fd_ = -1;
  std::int64_t fail_after_;
  std::uint64_t written_ = 0;
  bool committed_ = false;
};

/// Makes the folder `dir` atomically: fill(temp) writes its files into the fresh, empty folder
/// temp = dir + ".tmp.<pid>", which then takes dir's place (an existing dir is replaced only once
/// the new folder is complete, and is restored if the swap fails). On any failure the temporary
/// folder is removed, dir is left as it was, and the exception propagates; errors of this function
/// itself name dir. `dir` must not be an existing file.
void write_folder_atomically(const std::string& dir, const std::function<void(const std::string& temp_dir)>& fill);

}  // namespace tapegrad::io
