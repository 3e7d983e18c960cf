// The GGUF writer (version 3, little-endian): metadata of every value type the reader reads,
// tensors of every block type it reads, each at an aligned offset; written atomically
// (io/atomic_file.h). Generic: keys, names and shapes are the caller's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/quant/block_format.h"
#include "io/gguf_value.h"

namespace tapegrad::io {

/// A metadata value for GgufWriter::add: one of `type` (integers and bools as std::uint64_t,
/// signed ones sign-extended; floats as double) or an array of element_type.
GgufValue make_gguf_value(GgufType type, GgufValue::Storage value, GgufType element_type = GgufType::U8);

/// Collects metadata and tensors, then writes them as one GGUF v3 file: the header, the key/values
/// in the order added, the tensor infos, and each tensor's bytes at a multiple of the alignment,
/// the last one padded too (llama.cpp reads the padded data section whole).
class GgufWriter {
 public:
  /// alignment: a power of two, a multiple of 8; other than GGUF's default 32, it is written as
  /// general.alignment.
  explicit GgufWriter(std::size_t alignment = 32);

  /// Adds a key; throws std::invalid_argument naming it when it is empty, given twice, or
  /// general.alignment (the constructor's), or when an integer does not fit its type.
  void add(const std::string& key, const GgufValue& value);
  /// @{ Shorthands for add() of one type.
  void add_string(const std::string& key, std::string value);
  void add_u32(const std::string& key, std::uint32_t value);
  void add_i32(const std::string& key, std::int32_t value);
  void add_f32(const std::string& key, float value);
  void add_bool(const std::string& key, bool value);
  void add_strings(const std::string& key, std::vector<std::string> values);
  void add_i32s(const std::string& key, std::span<const std::int32_t> values);
  /// @}

  /// Adds a tensor of `shape` (PyTorch order, outermost first; ggml's ne is it reversed) whose
  /// bytes are `data` in `type`'s blocks. Throws std::invalid_argument naming the tensor when the
  /// name is empty, taken, or 64 bytes or longer (llama.cpp's limit), the shape has no or more than
  /// four dimensions or a zero one, the innermost dimension is not a whole number of blocks, or
  /// data's size is not the shape's.
  void add_tensor(std::string name, quant::TensorType type, std::vector<std::size_t> shape, std::vector<std::byte> data);
  /// add_tensor of float32 values quantized to `type` (its BlockFormat::quantize; a type without
  /// one is refused).
  void add_tensor(std::string name, quant::TensorType type, std::vector<std::size_t> shape, std::span<const float> values);

  /// Writes the file atomically; on any failure std::runtime_error names path and the file at path
  /// is left as it was.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string key;
    GgufValue value;
  };
  struct TensorEntry {
    std::string name;
    quant::TensorType type;
    std::vector<std::size_t> shape;
    std::vector<std::byte> data;
  };

  std::size_t alignment_;
  std::vector<Entry> metadata_;
  std::vector<TensorEntry> tensors_;
};

namespace detail {
/// Test seam: when >= 0, the next GgufWriter::write resets it to -1 and fails as a full disk
/// would once it has written this many bytes. Tests only (set it on the writing thread).
extern std::int64_t gguf_fail_after_bytes;
}  // namespace detail

}  // namespace tapegrad::io
