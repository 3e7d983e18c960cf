// GGUF metadata values: type names and the checked accessors.
#include "io/gguf_value.h"

#include <fmt/format.h>

#include <limits>
#include <stdexcept>
#include <type_traits>

namespace tapegrad::io {

namespace {

bool is_integer(GgufType type) {
  switch (type) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16: case GgufType::U32: case GgufType::I32:
    case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}

bool is_signed(GgufType type) {
  return type == GgufType::I8 || type == GgufType::I16 || type == GgufType::I32 || type == GgufType::I64;
}

}  // namespace

const char* gguf_type_name(GgufType type) {
  static constexpr const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};
  return std::uint32_t(type) < std::size(kNames) ? kNames[std::uint32_t(type)] : "unknown";
}

GgufValue::GgufValue(std::string where, GgufType type, GgufType element_type, Storage value)
    : where_(std::move(where)), type_(type), element_type_(element_type), value_(std::move(value)) {}

void GgufValue::mismatch(const char* expected) const {
  const std::string actual = type_ == GgufType::Array ? fmt::format("an array of {}", gguf_type_name(element_type_))
                                                      : fmt::format("a {}", gguf_type_name(type_));
  throw std::runtime_error(fmt::format("{}: is {}, expected {}", where_, actual, expected));
}

std::int64_t GgufValue::checked_int(std::uint64_t stored, GgufType type) const {
  if (!is_signed(type) && stored > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
    throw std::runtime_error(fmt::format("{}: {} is past the int64 range", where_, stored));
  return std::int64_t(stored);
}

std::size_t GgufValue::size() const {
  if (type_ != GgufType::Array) mismatch("an array");
  return std::visit(
      [](const auto& v) -> std::size_t {
        if constexpr (requires { v.size(); } && !std::is_same_v<std::decay_t<decltype(v)>, std::string>)
          return v.size();
        else
          return 0;
      },
      value_);
}

const std::string& GgufValue::as_string() const {
  if (type_ != GgufType::String) mismatch("a string");
  return std::get<std::string>(value_);
}

std::int64_t GgufValue::as_int() const {
  if (!is_integer(type_)) mismatch("an integer");
  return checked_int(std::get<std::uint64_t>(value_), type_);
}

double GgufValue::as_float() const {
  if (type_ != GgufType::F32 && type_ != GgufType::F64) mismatch("a float");
  return std::get<double>(value_);
}

bool GgufValue::as_bool() const {
  if (type_ != GgufType::Bool) mismatch("a bool");
  return std::get<std::uint64_t>(value_) != 0;
}

const std::vector<std::string>& GgufValue::as_strings() const {
  if (type_ != GgufType::Array || element_type_ != GgufType::String) mismatch("an array of strings");
  return std::get<std::vector<std::string>>(value_);
}

std::vector<std::int64_t> GgufValue::as_ints() const {
  if (type_ != GgufType::Array || !is_integer(element_type_)) mismatch("an array of integers");
  const auto& stored = std::get<std::vector<std::uint64_t>>(value_);
  std::vector<std::int64_t> out(stored.size());
  for (std::size_t i = 0; i < stored.size(); ++i) out[i] = checked_int(stored[i], element_type_);
  return out;
}

std::vector<double> GgufValue::as_floats() const {
  if (type_ != GgufType::Array || (element_type_ != GgufType::F32 && element_type_ != GgufType::F64))
    mismatch("an array of floats");
  return std::get<std::vector<double>>(value_);
}

std::vector<bool> GgufValue::as_bools() const {
  if (type_ != GgufType::Array || element_type_ != GgufType::Bool) mismatch("an array of bools");
  const auto& stored = std::get<std::vector<std::uint64_t>>(value_);
  return std::vector<bool>(stored.begin(), stored.end());
}

const std::vector<GgufValue>& GgufValue::as_arrays() const {
  if (type_ != GgufType::Array || element_type_ != GgufType::Array) mismatch("an array of arrays");
  return std::get<std::vector<GgufValue>>(value_);
}

}  // namespace tapegrad::io
