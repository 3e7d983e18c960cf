// GGUF files (llama.cpp's format, versions 2 and 3): a memory-mapped reader that parses and
// validates the whole header (metadata, tensor infos, alignment, overlaps) before any tensor is
// touched; tensor bytes stay in the mapping until dequantized. Generic: no model names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/quant/block_format.h"
#include "core/tensor.h"

namespace tapegrad::io {

/// GGUF's metadata value types, with their ids in the file.
enum class GgufType : std::uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9, U64 = 10, I64 = 11,
  F64 = 12
};

/// "u8", "string", "array", ...
const char* gguf_type_name(GgufType type);

/// One metadata value: a number, a bool, a string, or an array of one element type (arrays may
/// nest). The accessors check the type and throw std::runtime_error "<path>: metadata key '<key>':
/// <problem>" on a mismatch.
class GgufValue {
 public:
  using Storage = std::variant<std::uint64_t,            // integers (signed ones sign-extended) and bools
                               double,                   // f32, f64
                               std::string,              // string
                               std::vector<std::uint64_t>, std::vector<double>, std::vector<std::string>,
                               std::vector<GgufValue>>;  // arrays of numbers or bools, strings, arrays

  GgufValue(std::string where, GgufType type, GgufType element_type, Storage value);

  GgufType type() const { return type_; }
  /// For an array, the type of its elements.
  GgufType element_type() const { return element_type_; }
  /// For an array, its number of elements.
  std::size_t size() const;

  const std::string& as_string() const;
  /// Any integer type; a u64 past the int64 range is refused.
  std::int64_t as_int() const;
  /// f32 or f64.
  double as_float() const;
  bool as_bool() const;
  const std::vector<std::string>& as_strings() const;
  std::vector<std::int64_t> as_ints() const;
  std::vector<double> as_floats() const;
  std::vector<bool> as_bools() const;
  /// The elements of an array of arrays.
  const std::vector<GgufValue>& as_arrays() const;

 private:
  [[noreturn]] void mismatch(const char* expected) const;
  std::int64_t checked_int(std::uint64_t stored, GgufType type) const;

  std::string where_;  // "<path>: metadata key '<key>'", for messages
  GgufType type_, element_type_;
  Storage value_;
};

/// One tensor: its shape in PyTorch order (ggml's ne reversed, outermost first) and its bytes, a
/// span into the file's mapping (valid while a GgufFile of that file lives).
struct GgufTensor {
  std::string name;
  quant::TensorType type;
  std::vector<std::size_t> shape;
  std::span<const std::byte> data;
};

/// A GGUF file, mapped read-only. Copies share the mapping.
class GgufFile {
 public:
  /// Maps and validates the file; every problem throws std::runtime_error
  /// "<path>: <field>: <problem>" (big-endian files are refused, saying so).
  static GgufFile open(const std::string& path);

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  /// general.alignment, or GGUF's default 32.
  std::size_t alignment() const { return alignment_; }

  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  /// The value of `key`, or null.
  const GgufValue* find(const std::string& key) const;
  /// The value of `key`; throws "<path>: metadata key '<key>' is missing".
  const GgufValue& at(const std::string& key) const;

  /// The tensors in the file's order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  /// The tensor called `name`, or null.
  const GgufTensor* find_tensor(const std::string& name) const;
  /// The tensor as float32 of its shape, dequantized as gguf.quants.dequantize does.
  Tensor dequantize(const GgufTensor& tensor) const;

 private:
  GgufFile() = default;

  std::string path_;
  std::shared_ptr<const void> mapping_;  // unmaps when the last copy goes
  std::uint32_t version_ = 0;
  std::size_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, std::size_t> tensor_index_;
};

/// Limits on what the reader accepts from a header (llama.cpp's are the model).
inline constexpr std::size_t kGgufMaxDims = 4;
inline constexpr std::size_t kGgufMaxTensorNameBytes = 64;
inline constexpr std::size_t kGgufMaxArrayDepth = 8;

}  // namespace tapegrad::io
