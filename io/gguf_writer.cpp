// The GGUF writer: the header and metadata serialised into one buffer, the tensor infos with
// offsets rounded up to the alignment, then the data, through an AtomicFile.
#include "io/gguf_writer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <set>
#include <stdexcept>
#include <utility>

#include "io/atomic_file.h"
#include "io/gguf.h"

static_assert(std::endian::native == std::endian::little, "the GGUF writer stores host integers and floats as they are");

namespace tapegrad::io {

namespace detail {
std::int64_t gguf_fail_after_bytes = -1;
}  // namespace detail

namespace {

constexpr std::uint32_t kVersion = 3;

std::size_t round_up(std::size_t n, std::size_t alignment) { return (n + alignment - 1) / alignment * alignment; }

// Little-endian fields appended to a buffer.
class Buffer {
 public:
  template <class T> void put(T value) {
    const auto bytes = std::bit_cast<std::array<char, sizeof(T)>>(value);
    text_.append(bytes.data(), bytes.size());
  }
  void put_string(const std::string& s) {
    put(std::uint64_t(s.size()));
    text_ += s;
  }
  std::string& text() { return text_; }

 private:
  std::string text_;
};

std::size_t byte_width(GgufType type) {
  switch (type) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: return 4;
    default: return 8;
  }
}

bool is_signed(GgufType type) {
  return type == GgufType::I8 || type == GgufType::I16 || type == GgufType::I32 || type == GgufType::I64;
}

// Whether an integer (stored sign-extended for the signed types) fits its type.
bool fits(std::uint64_t stored, GgufType type) {
  if (type == GgufType::Bool) return stored <= 1;
  const std::size_t bits = 8 * byte_width(type);
  if (bits == 64) return true;
  if (!is_signed(type)) return stored >> bits == 0;
  const std::int64_t value = std::int64_t(stored), limit = std::int64_t(1) << (bits - 1);
  return value >= -limit && value < limit;
}

void check_fits(std::uint64_t stored, GgufType type, const std::string& key) {
  if (!fits(stored, type))
    throw std::invalid_argument(fmt::format("GgufWriter: metadata key '{}': {} does not fit a {}", key,
                                            is_signed(type) ? fmt::format("{}", std::int64_t(stored))
                                                            : fmt::format("{}", stored),
                                            gguf_type_name(type)));
}

void put_integer(Buffer& out, std::uint64_t stored, GgufType type) {
  switch (byte_width(type)) {
    case 1: out.put(std::uint8_t(stored)); break;
    case 2: out.put(std::uint16_t(stored)); break;
    case 4: out.put(std::uint32_t(stored)); break;
    default: out.put(stored);
  }
}

void put_float(Buffer& out, double value, GgufType type) {
  if (type == GgufType::F32)
    out.put(float(value));
  else
    out.put(value);
}

// Checks a value's storage against its types, the way make_gguf_value promises them.
void check_value(const GgufValue& value, const std::string& key, std::size_t depth) {
  const auto& storage = value.storage();
  const GgufType type = value.type();
  auto wrong = [&](const char* holds) {
    return std::invalid_argument(fmt::format("GgufWriter: metadata key '{}': a {} value holds {}", key,
                                             gguf_type_name(type), holds));
  };
  if (std::uint32_t(type) > std::uint32_t(GgufType::F64)) throw wrong("an unknown type");
  if (type == GgufType::String) {
    if (!std::holds_alternative<std::string>(storage)) throw wrong("no string");
  } else if (type == GgufType::F32 || type == GgufType::F64) {
    if (!std::holds_alternative<double>(storage)) throw wrong("no float");
  } else if (type != GgufType::Array) {
    if (!std::holds_alternative<std::uint64_t>(storage)) throw wrong("no integer");
    check_fits(std::get<std::uint64_t>(storage), type, key);
  } else {
    if (depth >= kGgufMaxArrayDepth)
      throw std::invalid_argument(fmt::format("GgufWriter: metadata key '{}': arrays nest deeper than {} levels", key,
                                              kGgufMaxArrayDepth));
    const GgufType element = value.element_type();
    if (element == GgufType::String) {
      if (!std::holds_alternative<std::vector<std::string>>(storage)) throw wrong("no strings");
    } else if (element == GgufType::F32 || element == GgufType::F64) {
      if (!std::holds_alternative<std::vector<double>>(storage)) throw wrong("no floats");
    } else if (element == GgufType::Array) {
      if (!std::holds_alternative<std::vector<GgufValue>>(storage)) throw wrong("no arrays");
      for (const GgufValue& inner : std::get<std::vector<GgufValue>>(storage)) check_value(inner, key, depth + 1);
    } else if (std::uint32_t(element) <= std::uint32_t(GgufType::F64)) {
      if (!std::holds_alternative<std::vector<std::uint64_t>>(storage)) throw wrong("no integers");
      for (std::uint64_t stored : std::get<std::vector<std::uint64_t>>(storage)) check_fits(stored, element, key);
    } else {
      throw wrong("elements of an unknown type");
    }
  }
}

// The value without its type id (an array: its element type, count and elements).
void put_value(Buffer& out, const GgufValue& value) {
  const auto& storage = value.storage();
  const GgufType type = value.type();
  if (type == GgufType::String) return out.put_string(std::get<std::string>(storage));
  if (type == GgufType::F32 || type == GgufType::F64) return put_float(out, std::get<double>(storage), type);
  if (type != GgufType::Array) return put_integer(out, std::get<std::uint64_t>(storage), type);
  const GgufType element = value.element_type();
  out.put(std::uint32_t(element));
  out.put(std::uint64_t(value.size()));
  if (element == GgufType::String) {
    for (const std::string& s : std::get<std::vector<std::string>>(storage)) out.put_string(s);
  } else if (element == GgufType::F32 || element == GgufType::F64) {
    for (double x : std::get<std::vector<double>>(storage)) put_float(out, x, element);
  } else if (element == GgufType::Array) {
    for (const GgufValue& inner : std::get<std::vector<GgufValue>>(storage)) put_value(out, inner);
  } else {
    for (std::uint64_t x : std::get<std::vector<std::uint64_t>>(storage)) put_integer(out, x, element);
  }
}

}  // namespace

GgufValue make_gguf_value(GgufType type, GgufValue::Storage value, GgufType element_type) {
  return GgufValue("GgufWriter", type, type == GgufType::Array ? element_type : type, std::move(value));
}

GgufWriter::GgufWriter(std::size_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment % 8 != 0)
    throw std::invalid_argument(fmt::format("GgufWriter: alignment {} is not a power of two and a multiple of 8", alignment));
  if (alignment != 32) metadata_.push_back({"general.alignment", make_gguf_value(GgufType::U32, std::uint64_t(alignment))});
}

void GgufWriter::add(const std::string& key, const GgufValue& value) {
  if (key.empty()) throw std::invalid_argument("GgufWriter: a metadata key is empty");
  if (key == "general.alignment")
    throw std::invalid_argument("GgufWriter: general.alignment is the constructor's argument, not a key to add");
  for (const Entry& entry : metadata_)
    if (entry.key == key) throw std::invalid_argument(fmt::format("GgufWriter: metadata key '{}' is given twice", key));
  check_value(value, key, 0);
  metadata_.push_back({key, value});
}

void GgufWriter::add_string(const std::string& key, std::string value) {
  add(key, make_gguf_value(GgufType::String, std::move(value)));
}
void GgufWriter::add_u32(const std::string& key, std::uint32_t value) {
  add(key, make_gguf_value(GgufType::U32, std::uint64_t(value)));
}
void GgufWriter::add_i32(const std::string& key, std::int32_t value) {
  add(key, make_gguf_value(GgufType::I32, std::uint64_t(std::int64_t(value))));
}
void GgufWriter::add_f32(const std::string& key, float value) { add(key, make_gguf_value(GgufType::F32, double(value))); }
void GgufWriter::add_bool(const std::string& key, bool value) {
  add(key, make_gguf_value(GgufType::Bool, std::uint64_t(value)));
}
void GgufWriter::add_strings(const std::string& key, std::vector<std::string> values) {
  add(key, make_gguf_value(GgufType::Array, std::move(values), GgufType::String));
}
void GgufWriter::add_i32s(const std::string& key, std::span<const std::int32_t> values) {
  std::vector<std::uint64_t> stored(values.size());
  std::transform(values.begin(), values.end(), stored.begin(), [](std::int32_t v) { return std::uint64_t(std::int64_t(v)); });
  add(key, make_gguf_value(GgufType::Array, std::move(stored), GgufType::I32));
}

void GgufWriter::add_tensor(std::string name, quant::TensorType type, std::vector<std::size_t> shape,
                            std::vector<std::byte> data) {
  auto fail = [&](const std::string& problem) {
    return std::invalid_argument(fmt::format("GgufWriter: tensor '{}': {}", name, problem));
  };
  if (name.empty()) throw std::invalid_argument("GgufWriter: a tensor name is empty");
  if (name.size() >= kGgufMaxTensorNameBytes)
    throw fail(fmt::format("the name is {} bytes; llama.cpp takes fewer than {}", name.size(), kGgufMaxTensorNameBytes));
  for (const TensorEntry& t : tensors_)
    if (t.name == name) throw fail("is given twice");
  if (shape.empty() || shape.size() > kGgufMaxDims)
    throw fail(fmt::format("has {} dimensions; GGUF takes 1 to {}", shape.size(), kGgufMaxDims));
  const quant::BlockFormat& format = quant::block_format(type);
  std::size_t elements = 1;
  for (std::size_t dim : shape) {
    if (dim == 0) throw fail(fmt::format("shape {} has a zero dimension", fmt::join(shape, "x")));
    if (dim > std::numeric_limits<std::size_t>::max() / 2 / elements)
      throw fail(fmt::format("shape {} has too many elements", fmt::join(shape, "x")));
    elements *= dim;
  }
  if (shape.back() % format.block_elems != 0)
    throw fail(fmt::format("the innermost dimension {} is not a whole number of {}-element {} blocks", shape.back(),
                           format.block_elems, format.name));
  const std::size_t bytes = elements / format.block_elems * format.block_bytes;
  if (data.size() != bytes)
    throw fail(fmt::format("{} bytes given; shape {} as {} takes {}", data.size(), fmt::join(shape, "x"), format.name,
                           bytes));
  tensors_.push_back({std::move(name), type, std::move(shape), std::move(data)});
}

void GgufWriter::add_tensor(std::string name, quant::TensorType type, std::vector<std::size_t> shape,
                            std::span<const float> values) {
  const quant::BlockFormat& format = quant::block_format(type);
  if (!format.quantize)
    throw std::invalid_argument(fmt::format("GgufWriter: tensor '{}': tapegrad does not quantize to {} (f32, f16, "
                                            "bf16 and q8_0 it does)",
                                            name, format.name));
  std::size_t elements = 1;
  for (std::size_t dim : shape) elements *= dim;
  if (values.size() != elements || shape.empty() || shape.back() % format.block_elems != 0)
    return add_tensor(std::move(name), type, std::move(shape), std::vector<std::byte>());  // its message says why
  std::vector<std::byte> data(elements / format.block_elems * format.block_bytes);
  format.quantize(values.data(), data.data(), elements);
  add_tensor(std::move(name), type, std::move(shape), std::move(data));
}

void GgufWriter::write(const std::string& path) const {
  const std::int64_t fail_after = std::exchange(detail::gguf_fail_after_bytes, -1);
  Buffer header;
  header.put(std::uint32_t(0x46554747));  // "GGUF"
  header.put(kVersion);
  header.put(std::uint64_t(tensors_.size()));
  header.put(std::uint64_t(metadata_.size()));
  for (const Entry& entry : metadata_) {
    header.put_string(entry.key);
    header.put(std::uint32_t(entry.value.type()));
    put_value(header, entry.value);
  }
  std::size_t offset = 0;
  for (const TensorEntry& t : tensors_) {
    header.put_string(t.name);
    header.put(std::uint32_t(t.shape.size()));
    for (auto dim = t.shape.rbegin(); dim != t.shape.rend(); ++dim) header.put(std::uint64_t(*dim));
    header.put(std::uint32_t(t.type));
    header.put(std::uint64_t(offset));
    offset += round_up(t.data.size(), alignment_);
  }
  std::string& text = header.text();
  text.resize(round_up(text.size(), alignment_), '\0');

  AtomicFile out(path, fail_after);
  out.write(text.data(), text.size());
  for (const TensorEntry& t : tensors_) {
    out.write(t.data.data(), t.data.size());
    out.write_zeros(round_up(t.data.size(), alignment_) - t.data.size());
  }
  out.commit();
}

}  // namespace tapegrad::io
