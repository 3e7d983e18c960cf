// GGUF metadata values: the value types GGUF stores (numbers, bools, strings, arrays that may
// nest) and their accessors, each checking the type and naming the file and key when it differs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

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
  /// The stored value as it is (what a writer copies).
  const Storage& storage() const { return value_; }

 private:
  [[noreturn]] void mismatch(const char* expected) const;
  std::int64_t checked_int(std::uint64_t stored, GgufType type) const;

  std::string where_;  // "<path>: metadata key '<key>'", for messages
  GgufType type_, element_type_;
  Storage value_;
};

}  // namespace tapegrad::io
