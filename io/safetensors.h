// safetensors files (a u64 header length, a JSON header, raw little-endian data): an atomic
// float32 writer and a reader of F32, F16 and BF16 that checks every header value against the real
// file before trusting it. Generic: names and metadata are the caller's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tapegrad {

/// The contents of a safetensors file: its tensors by name and its "__metadata__" strings.
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;        ///< by name
  std::map<std::string, std::string> metadata;  ///< the "__metadata__" strings
};

/// Writes the tensors (F32, in the given order, contiguous) and metadata to path atomically:
/// u64 little-endian header length N, N bytes of JSON padded with spaces to a multiple of 8, then
/// the raw little-endian row-major data. The bytes go to path + ".tmp.<pid>" in the same folder,
/// are flushed and fsync'ed, then renamed over path; on any failure the temporary file is removed,
/// an existing file at path is left untouched, and std::runtime_error names the path and the OS
/// error. Names must be distinct, non-empty and not "__metadata__"; metadata must be valid UTF-8.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata);

/// Reads a safetensors file of F32, F16 and BF16 tensors (the last two converted exactly to
/// float32), validating the header length against the file size, the JSON, every entry's dtype,
/// shape and data_offsets, and that the byte ranges tile the data section exactly (no overlap, gap
/// or trailing byte) before allocating anything. Every problem throws std::runtime_error
/// "<path>: <tensor>: <problem>".
SafetensorsFile read_safetensors(const std::string& path);

/// The largest JSON header the reader accepts (100 MB; a real header is a few kilobytes).
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

namespace detail {
/// Test seam: when >= 0, the next write_safetensors call resets it to -1 and fails as a full disk
/// would (ENOSPC) once it has written this many bytes of the temporary file. Tests only (a plain
/// global: set it on the thread that writes, with no other write in flight).
extern std::int64_t safetensors_fail_after_bytes;
}  // namespace detail

}  // namespace tapegrad
