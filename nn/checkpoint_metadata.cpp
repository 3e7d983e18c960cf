// Parsing checkpoint metadata values: whole strings only, in range, or an error naming the key.
#include "nn/checkpoint_metadata.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace tapegrad::nn {

const std::string& metadata_text(const Metadata& metadata, const std::string& key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) throw std::runtime_error(fmt::format("metadata key '{}' is missing", key));
  return it->second;
}

std::size_t metadata_size(const Metadata& metadata, const std::string& key) {
  const std::string& text = metadata_text(metadata, key);
  std::size_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  constexpr std::size_t limit = std::size_t(1) << 31;  // far above any model this library trains
  if (ec != std::errc() || end != text.data() + text.size() || value > limit)
    throw std::runtime_error(fmt::format("metadata '{}' = '{}' is not an integer in [0, {}]", key, text, limit));
  return value;
}

std::uint64_t metadata_seed(const Metadata& metadata, const std::string& key) {
  const std::string& text = metadata_text(metadata, key);
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw std::runtime_error(fmt::format("metadata '{}' = '{}' is not an unsigned 64-bit integer", key, text));
  return value;
}

std::int64_t metadata_count(const Metadata& metadata, const std::string& key) {
  const std::string& text = metadata_text(metadata, key);
  std::int64_t value = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0)
    throw std::runtime_error(fmt::format("metadata '{}' = '{}' is not a non-negative integer", key, text));
  return value;
}

// The whole text as a double, or NaN (which every range check refuses).
static double parse_number(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  return used == text.size() ? value : std::nan("");
}

double metadata_positive(const Metadata& metadata, const std::string& key) {
  const std::string& text = metadata_text(metadata, key);
  const double value = parse_number(text);
  if (!(value > 0) || !std::isfinite(value))
    throw std::runtime_error(fmt::format("metadata '{}' = '{}' is not a positive number", key, text));
  return value;
}

double metadata_probability(const Metadata& metadata, const std::string& key) {
  const std::string& text = metadata_text(metadata, key);
  const double value = parse_number(text);
  if (!(value >= 0 && value < 1))
    throw std::runtime_error(fmt::format("metadata '{}' = '{}' is not a number in [0, 1)", key, text));
  return value;
}

void check_format_version(const Metadata& metadata, const std::string& expected) {
  const std::string& version = metadata_text(metadata, "format_version");
  if (version != expected)
    throw std::runtime_error(fmt::format("format_version '{}' is not supported (this build reads '{}')", version, expected));
}

}  // namespace tapegrad::nn
