// The GGUF reader: maps the file, walks the header with a cursor that checks every length against
// the bytes left before reading or allocating, then validates the tensor list whole (types, shapes,
// alignment, bounds, overlaps), as llama.cpp's gguf.cpp does, before handing out any tensor.
#include "io/gguf.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace tapegrad::io {

namespace {

constexpr std::size_t kHeaderBytes = 24;  // magic, version, tensor count, metadata count
constexpr std::uint32_t kVersionsRead[] = {2, 3};

std::runtime_error format_error(const std::string& path, const std::string& field, const std::string& problem) {
  return std::runtime_error(fmt::format("{}: {}: {}", path, field, problem));
}

// Reads little-endian fields from the mapped bytes, each read checked against the bytes left.
class Cursor {
 public:
  Cursor(const std::byte* bytes, std::size_t size, const std::string& path) : bytes_(bytes), size_(size), path_(path) {}

  std::size_t position() const { return position_; }
  std::size_t left() const { return size_ - position_; }

  // Requires n more bytes for `field` (what) or throws.
  void need(std::size_t n, const std::string& field, const char* what) const {
    if (n > left())
      throw format_error(path_, field, fmt::format("{} needs {} bytes at byte {}, but the {}-byte file has {} left", what,
                                                   n, position_, size_, left()));
  }

  template <class Unsigned>
  Unsigned read(const std::string& field, const char* what) {
    need(sizeof(Unsigned), field, what);
    Unsigned value = 0;
    for (std::size_t i = 0; i < sizeof(Unsigned); ++i) value |= Unsigned(Unsigned(bytes_[position_ + i]) << (8 * i));
    position_ += sizeof(Unsigned);
    return value;
  }

  std::string read_string(const std::string& field, const char* what) {
    const std::uint64_t length = read<std::uint64_t>(field, what);
    if (length > left())
      throw format_error(path_, field, fmt::format("{} of {} bytes at byte {} runs past the end of the file ({} bytes left)",
                                                   what, length, position_ - 8, left()));
    std::string text(reinterpret_cast<const char*>(bytes_ + position_), std::size_t(length));
    position_ += std::size_t(length);
    return text;
  }

 private:
  const std::byte* bytes_;
  std::size_t size_;
  std::size_t position_ = 0;
  const std::string& path_;
};

// The fewest bytes one element of `type` takes in the file (a string: its length; an array: its
// element type and count), to bound a count by the bytes left before allocating.
std::size_t min_bytes(GgufType type) {
  switch (type) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: case GgufType::String: return 8;
    case GgufType::Array: return 12;
  }
  return 1;
}

bool is_known(std::uint32_t type) { return type <= std::uint32_t(GgufType::F64); }

// One number or bool of `type`; integers are kept as 64 bits, signed ones sign-extended.
std::uint64_t read_integer(Cursor& in, GgufType type, const std::string& field, const std::string& path) {
  switch (type) {
    case GgufType::U8: return in.read<std::uint8_t>(field, "a u8");
    case GgufType::I8: return std::uint64_t(std::int64_t(std::int8_t(in.read<std::uint8_t>(field, "an i8"))));
    case GgufType::U16: return in.read<std::uint16_t>(field, "a u16");
    case GgufType::I16: return std::uint64_t(std::int64_t(std::int16_t(in.read<std::uint16_t>(field, "an i16"))));
    case GgufType::U32: return in.read<std::uint32_t>(field, "a u32");
    case GgufType::I32: return std::uint64_t(std::int64_t(std::int32_t(in.read<std::uint32_t>(field, "an i32"))));
    case GgufType::U64: case GgufType::I64: return in.read<std::uint64_t>(field, "a 64-bit integer");
    case GgufType::Bool: {
      const std::uint8_t byte = in.read<std::uint8_t>(field, "a bool");
      if (byte > 1) throw format_error(path, field, fmt::format("bool byte is {}, expected 0 or 1", byte));
      return byte;
    }
    default: throw std::logic_error("read_integer: not an integer type");
  }
}

double read_float(Cursor& in, GgufType type, const std::string& field) {
  if (type == GgufType::F32) return std::bit_cast<float>(in.read<std::uint32_t>(field, "an f32"));
  return std::bit_cast<double>(in.read<std::uint64_t>(field, "an f64"));
}

GgufType read_type(Cursor& in, const std::string& field, const std::string& path, const char* what) {
  const std::uint32_t type = in.read<std::uint32_t>(field, what);
  if (!is_known(type)) throw format_error(path, field, fmt::format("{} {} is not a GGUF value type (0-12)", what, type));
  return GgufType(type);
}

// A value of `type`; `where` names it for messages ("metadata key 'k'", "... [3]" inside arrays).
GgufValue read_value(Cursor& in, GgufType type, const std::string& field, const std::string& path, std::size_t depth) {
  const std::string where = fmt::format("{}: {}", path, field);
  if (type == GgufType::String) return GgufValue(where, type, type, in.read_string(field, "string"));
  if (type == GgufType::F32 || type == GgufType::F64) return GgufValue(where, type, type, read_float(in, type, field));
  if (type != GgufType::Array) return GgufValue(where, type, type, read_integer(in, type, field, path));

  if (depth >= kGgufMaxArrayDepth)
    throw format_error(path, field, fmt::format("arrays nest deeper than {} levels", kGgufMaxArrayDepth));
  const GgufType element = read_type(in, field, path, "array element type");
  const std::uint64_t count = in.read<std::uint64_t>(field, "array count");
  if (count > in.left() / min_bytes(element))
    throw format_error(path, field,
                       fmt::format("array of {} {} elements runs past the end of the file ({} bytes left)", count,
                                   gguf_type_name(element), in.left()));
  const std::size_t n = std::size_t(count);
  if (element == GgufType::String) {
    std::vector<std::string> strings;
    strings.reserve(n);
    for (std::size_t i = 0; i < n; ++i) strings.push_back(in.read_string(fmt::format("{}[{}]", field, i), "string"));
    return GgufValue(where, type, element, std::move(strings));
  }
  if (element == GgufType::F32 || element == GgufType::F64) {
    std::vector<double> floats(n);
    for (std::size_t i = 0; i < n; ++i) floats[i] = read_float(in, element, field);
    return GgufValue(where, type, element, std::move(floats));
  }
  if (element == GgufType::Array) {
    std::vector<GgufValue> arrays;
    arrays.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      arrays.push_back(read_value(in, element, fmt::format("{}[{}]", field, i), path, depth + 1));
    return GgufValue(where, type, element, std::move(arrays));
  }
  std::vector<std::uint64_t> integers(n);
  for (std::size_t i = 0; i < n; ++i) integers[i] = read_integer(in, element, fmt::format("{}[{}]", field, i), path);
  return GgufValue(where, type, element, std::move(integers));
}

// The file's bytes, mapped read-only; unmapped when the last GgufFile copy goes.
std::shared_ptr<const void> map_file(const std::string& path, std::size_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat info {};
  const bool stat_ok = ::fstat(fd, &info) == 0;
  const int stat_errno = errno;
  if (!stat_ok || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw std::runtime_error(stat_ok ? fmt::format("{}: not a regular file", path)
                                     : fmt::format("{}: cannot stat: {}", path, std::strerror(stat_errno)));
  }
  size = std::size_t(info.st_size);
  if (size < kHeaderBytes) {
    ::close(fd);
    throw std::runtime_error(fmt::format("{}: header: the file is {} bytes, too short for GGUF's {}-byte header", path,
                                         size, kHeaderBytes));
  }
  void* bytes = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file
  if (bytes == MAP_FAILED) throw std::runtime_error(fmt::format("{}: cannot map: {}", path, std::strerror(map_errno)));
  return std::shared_ptr<const void>(bytes, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
}

std::uint32_t check_magic_and_version(Cursor& in, const std::string& path) {
  const std::uint32_t magic = in.read<std::uint32_t>("magic", "the magic");
  if (magic != 0x46554747u)  // the bytes "GGUF"
    throw format_error(path, "magic", fmt::format("bytes {:02x} {:02x} {:02x} {:02x} are not \"GGUF\" (47 47 55 46): not a GGUF file",
                                                  magic & 0xFF, (magic >> 8) & 0xFF, (magic >> 16) & 0xFF, magic >> 24));
  const std::uint32_t version = in.read<std::uint32_t>("version", "the version");
  if (std::find(std::begin(kVersionsRead), std::end(kVersionsRead), version) != std::end(kVersionsRead)) return version;
  const std::uint32_t swapped = __builtin_bswap32(version);
  if (swapped >= 1 && swapped <= 3)
    throw format_error(path, "version", fmt::format("reads as {} (0x{:08x}): the file is big-endian (version {}), and "
                                                    "only little-endian GGUF files are supported", version, version, swapped));
  throw format_error(path, "version", fmt::format("{} is not supported (GGUF versions 2 and 3 are)", version));
}

std::size_t read_alignment(const GgufValue& value, const std::string& path) {
  const std::string field = "metadata key 'general.alignment'";
  if (value.type() != GgufType::U32)
    throw format_error(path, field, fmt::format("is a {}, expected a u32", gguf_type_name(value.type())));
  const std::int64_t alignment = value.as_int();
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment % 8 != 0)
    throw format_error(path, field, fmt::format("{} is not a power of two and a multiple of 8", alignment));
  return std::size_t(alignment);
}

struct TensorInfo {
  GgufTensor tensor;
  std::uint64_t offset = 0, bytes = 0;
};

TensorInfo read_tensor_info(Cursor& in, std::size_t index, std::size_t alignment, const std::string& path) {
  TensorInfo info;
  info.tensor.name = in.read_string(fmt::format("tensor info {} name", index), "string");
  const std::string field = fmt::format("tensor '{}'", info.tensor.name);
  if (info.tensor.name.size() > kGgufMaxTensorNameBytes)
    throw format_error(path, field, fmt::format("the name is {} bytes, longer than GGUF's {}", info.tensor.name.size(),
                                                kGgufMaxTensorNameBytes));
  const std::uint32_t n_dims = in.read<std::uint32_t>(field, "n_dims");
  if (n_dims > kGgufMaxDims)
    throw format_error(path, field, fmt::format("has {} dimensions, more than ggml's {}", n_dims, kGgufMaxDims));
  std::vector<std::uint64_t> ne(n_dims);
  std::uint64_t elements = 1;
  for (std::uint32_t j = 0; j < n_dims; ++j) {
    ne[j] = in.read<std::uint64_t>(field, "a dimension");
    if (ne[j] == 0) throw format_error(path, field, fmt::format("dimension ne[{}] is 0", j));
    if (ne[j] > std::uint64_t(std::numeric_limits<std::int64_t>::max()) / elements)
      throw format_error(path, field, fmt::format("the element count overflows (ne[{}] = {} after {} elements)", j,
                                                  ne[j], elements));
    elements *= ne[j];
  }
  const std::uint32_t type = in.read<std::uint32_t>(field, "the type");
  const quant::BlockFormat* format = quant::find_block_format(type);
  if (!format)
    throw format_error(path, field, fmt::format("type {} is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, q4_K, q6_K)",
                                                type));
  const std::uint64_t row = n_dims > 0 ? ne[0] : 1;
  if (row % format->block_elems != 0)
    throw format_error(path, field, fmt::format("ne[0] = {} is not a whole number of {}-element {} blocks", row,
                                                format->block_elems, format->name));
  const std::uint64_t blocks = elements / format->block_elems;
  if (blocks > std::numeric_limits<std::uint64_t>::max() / format->block_bytes)
    throw format_error(path, field, fmt::format("the byte count overflows ({} blocks of {} bytes)", blocks,
                                                format->block_bytes));
  info.bytes = blocks * format->block_bytes;
  info.offset = in.read<std::uint64_t>(field, "the offset");
  if (info.offset % alignment != 0)
    throw format_error(path, field, fmt::format("offset {} is not a multiple of the alignment {}", info.offset, alignment));
  info.tensor.type = format->type;
  info.tensor.shape.assign(ne.rbegin(), ne.rend());
  return info;
}

// Places every tensor in the data section of data_size bytes at `data`, refusing one that runs
// past it or overlaps another.
void place_tensors(std::vector<TensorInfo>& infos, const std::byte* data, std::uint64_t data_size,
                   const std::string& path) {
  for (TensorInfo& info : infos) {
    if (info.offset > data_size || info.bytes > data_size - info.offset)
      throw format_error(path, fmt::format("tensor '{}'", info.tensor.name),
                         fmt::format("bytes [{}, {}) run past the end of the {}-byte data section", info.offset,
                                     info.offset + info.bytes, data_size));
    info.tensor.data = std::span<const std::byte>(data + info.offset, std::size_t(info.bytes));
  }
  std::vector<const TensorInfo*> by_offset(infos.size());
  std::transform(infos.begin(), infos.end(), by_offset.begin(), [](const TensorInfo& info) { return &info; });
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& before = *by_offset[i - 1];
    const TensorInfo& after = *by_offset[i];
    if (after.offset < before.offset + before.bytes)
      throw format_error(path, fmt::format("tensor '{}'", after.tensor.name),
                         fmt::format("bytes [{}, {}) overlap tensor '{}' at [{}, {})", after.offset,
                                     after.offset + after.bytes, before.tensor.name, before.offset,
                                     before.offset + before.bytes));
  }
}

}  // namespace

GgufFile GgufFile::open(const std::string& path) {
  GgufFile file;
  file.path_ = path;
  std::size_t size = 0;
  file.mapping_ = map_file(path, size);
  const auto* bytes = static_cast<const std::byte*>(file.mapping_.get());
  Cursor in(bytes, size, path);
  file.version_ = check_magic_and_version(in, path);
  const std::uint64_t n_tensors = in.read<std::uint64_t>("tensor_count", "the tensor count");
  const std::uint64_t n_metadata = in.read<std::uint64_t>("metadata_kv_count", "the metadata count");
  // A key takes at least 8 + 4 + 1 bytes and a tensor info 8 + 4 + 4 + 8.
  if (n_metadata > in.left() / 13)
    throw format_error(path, "metadata_kv_count", fmt::format("{} entries cannot fit in the {} bytes left", n_metadata,
                                                              in.left()));
  if (n_tensors > in.left() / 24)
    throw format_error(path, "tensor_count", fmt::format("{} tensor infos cannot fit in the {} bytes left", n_tensors,
                                                         in.left()));

  for (std::uint64_t i = 0; i < n_metadata; ++i) {
    std::string key = in.read_string(fmt::format("metadata entry {} key", i), "string");
    const std::string field = fmt::format("metadata key '{}'", key);
    if (file.metadata_.count(key)) throw format_error(path, field, "appears twice");
    const GgufType type = read_type(in, field, path, "value type");
    file.metadata_.emplace(std::move(key), read_value(in, type, field, path, 0));
  }
  if (const GgufValue* alignment = file.find("general.alignment")) file.alignment_ = read_alignment(*alignment, path);

  std::vector<TensorInfo> infos;
  infos.reserve(std::size_t(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    infos.push_back(read_tensor_info(in, std::size_t(i), file.alignment_, path));
    if (!file.tensor_index_.emplace(infos.back().tensor.name, infos.size() - 1).second)
      throw format_error(path, fmt::format("tensor '{}'", infos.back().tensor.name), "appears twice");
  }
  // The data section starts at the next multiple of the alignment (position <= size, no overflow).
  const std::size_t data_start = (in.position() + file.alignment_ - 1) / file.alignment_ * file.alignment_;
  if (!infos.empty() && data_start > size)
    throw format_error(path, "tensor data", fmt::format("would start at byte {}, past the end of the {}-byte file",
                                                        data_start, size));
  const std::size_t data_size = data_start <= size ? size - data_start : 0;
  place_tensors(infos, bytes + std::min(data_start, size), data_size, path);
  file.tensors_.reserve(infos.size());
  for (TensorInfo& info : infos) file.tensors_.push_back(std::move(info.tensor));
  return file;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufValue& GgufFile::at(const std::string& key) const {
  if (const GgufValue* value = find(key)) return *value;
  throw std::runtime_error(fmt::format("{}: metadata key '{}' is missing", path_, key));
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::release(const GgufTensor& tensor) const {
  const auto page = std::uintptr_t(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(tensor.data.data());
  const std::uintptr_t first = (begin + page - 1) / page * page, last = (begin + tensor.data.size()) / page * page;
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // a hint: failure is harmless
}

Tensor GgufFile::dequantize(const GgufTensor& tensor) const {
  const quant::BlockFormat& format = quant::block_format(tensor.type);
  const std::size_t elements = numel(tensor.shape);
  if (elements % format.block_elems != 0 || tensor.data.size() != elements / format.block_elems * format.block_bytes)
    throw std::invalid_argument(fmt::format("{}: tensor '{}': {} bytes of {} do not hold shape {}", path_, tensor.name,
                                            tensor.data.size(), format.name, to_string(tensor.shape)));
  Tensor out = Tensor::uninitialized(tensor.shape);
  format.dequantize(tensor.data.data(), out.data(), elements);
  return out;
}

}  // namespace tapegrad::io
