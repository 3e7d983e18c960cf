// safetensors I/O: the atomic writer (io/atomic_file.h) and the distrustful reader
// (every header value is checked against the real file size before anything is allocated).
#include "io/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "core/quant/block_format.h"
#include "io/atomic_file.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this build writes and reads host floats as they are");

namespace tapegrad {

namespace detail {
std::int64_t safetensors_fail_after_bytes = -1;
}  // namespace detail

namespace {

using json = nlohmann::json;

// A file descriptor closed when it goes out of scope (the reader's: close errors do not matter).
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// ---- writer ------------------------------------------------------------------------------------

// The JSON header, padded with spaces to a multiple of 8 bytes.
std::string make_header(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__")
      throw std::invalid_argument(fmt::format("{}: invalid tensor name '{}'", path, name));
    if (!names.insert(name).second)
      throw std::invalid_argument(fmt::format("{}: tensor '{}' is given twice", path, name));
    if (!tensor || tensor->size() != numel(tensor->shape()))
      throw std::invalid_argument(fmt::format("{}: tensor '{}' has no storage (null or default-constructed)", path, name));
    const std::uint64_t end = offset + tensor->bytes();
    header[name] = {{"dtype", "F32"}, {"shape", tensor->shape()}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format("{}: a tensor name or metadata string is not valid UTF-8 ({})", path,
                                            e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// ---- reader ------------------------------------------------------------------------------------

// The stored element types the reader accepts, each read into float32.
enum class Dtype { F32, F16, BF16 };

struct Entry {
  std::string name;
  Dtype dtype = Dtype::F32;
  Shape shape;
  std::uint64_t begin = 0, end = 0;
};

std::uint64_t element_bytes(Dtype dtype) { return dtype == Dtype::F32 ? 4 : 2; }

// Reads exactly n bytes at offset, or throws naming the file.
void read_exactly(int fd, void* out, std::size_t n, std::uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw std::runtime_error(fmt::format("{}: read failed at byte {}: {}", path, offset, std::strerror(errno)));
    if (got == 0) throw std::runtime_error(fmt::format("{}: unexpected end of file at byte {} (did it shrink while being read?)", path, offset));
    p += got;
    n -= std::size_t(got);
    offset += std::uint64_t(got);
  }
}

// "a number", "an array", ...: the JSON type of a value, for messages.
std::string kind_of(const json& j) {
  const std::string type = j.is_number_float() ? "non-integer number" : j.type_name();
  return (type[0] == 'a' || type[0] == 'o' ? "an " : "a ") + type;
}

// One tensor entry of the header, checked against the data section of data_size bytes.
Entry parse_entry(const std::string& name, const json& j, std::uint64_t data_size, const std::string& path) {
  auto fail = [&](const std::string& problem) {
    return std::runtime_error(fmt::format("{}: tensor '{}': {}", path, name, problem));
  };
  if (!j.is_object()) throw fail(fmt::format("entry is {}, expected an object with dtype, shape and data_offsets", kind_of(j)));
  for (const auto& [key, value] : j.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets") throw fail(fmt::format("unknown field '{}'", key));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) throw fail(fmt::format("missing field '{}'", key));

  const json& dtype = j["dtype"];
  if (!dtype.is_string()) throw fail(fmt::format("dtype is {}, expected a string", kind_of(dtype)));
  Entry e{name, Dtype::F32, {}, 0, 0};
  const std::string& dtype_name = dtype.get_ref<const std::string&>();
  if (dtype_name == "F16")
    e.dtype = Dtype::F16;
  else if (dtype_name == "BF16")
    e.dtype = Dtype::BF16;
  else if (dtype_name != "F32")
    throw fail(fmt::format("dtype '{}' is not supported (F32, F16 or BF16)", dtype_name));

  const json& shape = j["shape"];
  if (!shape.is_array()) throw fail(fmt::format("shape is {}, expected a list of non-negative integers", kind_of(shape)));
  std::uint64_t count = 1;
  for (const json& d : shape) {
    if (!d.is_number_unsigned())  // nlohmann stores every non-negative integer literal as unsigned
      throw fail(fmt::format("shape {} has {} dimension ({}), expected non-negative integers", shape.dump(),
                             d.is_number_integer() ? "a negative" : kind_of(d) + " as a", d.dump()));
    const std::uint64_t dim = d.get<std::uint64_t>();
    if (dim != 0 && count > (std::uint64_t(-1) / 4) / dim)
      throw fail(fmt::format("shape {} has more elements than any file can hold", shape.dump()));
    count *= dim;
    e.shape.push_back(std::size_t(dim));
  }

  const json& offsets = j["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
    throw fail(fmt::format("data_offsets {} must be two non-negative integers [begin, end]", offsets.dump()));
  e.begin = offsets[0].get<std::uint64_t>();
  e.end = offsets[1].get<std::uint64_t>();
  if (e.begin > e.end) throw fail(fmt::format("data_offsets [{}, {}] begin after they end", e.begin, e.end));
  if (e.end > data_size)
    throw fail(fmt::format("data_offsets [{}, {}] run past the end of the {}-byte data section", e.begin, e.end, data_size));
  const std::uint64_t bytes = element_bytes(e.dtype) * count;
  if (e.end - e.begin != bytes)
    throw fail(fmt::format("data_offsets [{}, {}] hold {} bytes but shape {} needs {} as {}", e.begin, e.end,
                           e.end - e.begin, to_string(e.shape), bytes, dtype_name));
  return e;
}

// The "__metadata__" object: strings to strings.
std::map<std::string, std::string> parse_metadata(const json& j, const std::string& path) {
  if (!j.is_object())
    throw std::runtime_error(fmt::format("{}: __metadata__ is {}, expected an object of strings", path, kind_of(j)));
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string())
      throw std::runtime_error(fmt::format("{}: __metadata__ entry '{}' is {}, expected a string", path, key,
                                           kind_of(value)));
    out[key] = value.get<std::string>();
  }
  return out;
}

// Requires the sorted byte ranges to tile [0, data_size) exactly.
void check_coverage(std::vector<Entry>& entries, std::uint64_t data_size, const std::string& path) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name); });
  std::uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered)
      throw std::runtime_error(fmt::format("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", path, previous->name,
                                           previous->begin, previous->end, e.name, e.begin, e.end));
    if (e.begin > covered)
      throw std::runtime_error(
          previous ? fmt::format("{}: gap of {} bytes between tensor '{}' (ends at {}) and tensor '{}' (begins at {})",
                                 path, e.begin - covered, previous->name, covered, e.name, e.begin)
                   : fmt::format("{}: gap of {} bytes before the first tensor '{}' (begins at {})", path, e.begin,
                                 e.name, e.begin));
    covered = e.end;
    previous = &e;
  }
  if (covered != data_size)
    throw std::runtime_error(fmt::format("{}: {} trailing bytes after the last tensor{} (the tensors end at byte {} of "
                                         "the {}-byte data section)",
                                         path, data_size - covered,
                                         previous ? fmt::format(" '{}'", previous->name) : std::string(), covered,
                                         data_size));
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::int64_t fail_after = std::exchange(detail::safetensors_fail_after_bytes, -1);
  const std::string header = make_header(path, tensors, metadata);
  io::AtomicFile out(path, fail_after);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(std::uint64_t(header.size()) >> (8 * i));
  out.write(length, 8);
  out.write(header.data(), header.size());
  for (const auto& entry : tensors) out.write(entry.second->data(), entry.second->bytes());
  out.commit();
}

SafetensorsFile read_safetensors(const std::string& path) {
  auto fail = [&](const std::string& problem) { return std::runtime_error(fmt::format("{}: {}", path, problem)); };
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw fail(fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throw fail(fmt::format("cannot stat: {}", std::strerror(errno)));
  if (!S_ISREG(info.st_mode)) throw fail("not a regular file");
  const std::uint64_t file_size = std::uint64_t(info.st_size);
  if (file_size < 8)
    throw fail(fmt::format("file is {} bytes, too short for the 8-byte header length", file_size));

  unsigned char length[8];
  read_exactly(fd.get(), length, 8, 0, path);
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length[i];
  if (header_size > file_size - 8)
    throw fail(fmt::format("header length {} runs past the end of the file ({} bytes after the 8-byte length)",
                           header_size, file_size - 8));
  if (header_size > kSafetensorsMaxHeaderBytes)
    throw fail(fmt::format("header length {} exceeds the limit of {} bytes", header_size, kSafetensorsMaxHeaderBytes));

  std::string text(std::size_t(header_size), '\0');  // bounded by the real file size and the limit
  read_exactly(fd.get(), text.data(), text.size(), 8, path);
  // Duplicate names would silently replace each other in the parsed object: catch them here.
  std::set<std::string> keys;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json header;
  try {
    header = json::parse(text, on_event);  // trailing spaces (the padding) are whitespace to the parser
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number such as 1e999
    throw fail(fmt::format("invalid JSON header: {}", e.what()));
  }
  if (!header.is_object()) throw fail(fmt::format("header is {}, expected a JSON object", kind_of(header)));
  if (!duplicate.empty()) throw fail(fmt::format("'{}' appears twice in the header", duplicate));

  const std::uint64_t data_start = 8 + header_size, data_size = file_size - data_start;
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__")
      out.metadata = parse_metadata(value, path);
    else
      entries.push_back(parse_entry(name, value, data_size, path));
  }
  check_coverage(entries, data_size, path);

  // Every size below is now bounded by the data section, which the file really holds.
  std::vector<std::byte> half_bytes;
  for (const Entry& e : entries) {
    Tensor t = Tensor::uninitialized(e.shape);
    if (e.dtype == Dtype::F32) {
      if (t.bytes() > 0) read_exactly(fd.get(), t.data(), t.bytes(), data_start + e.begin, path);
    } else {
      half_bytes.resize(std::size_t(e.end - e.begin));
      if (!half_bytes.empty()) read_exactly(fd.get(), half_bytes.data(), half_bytes.size(), data_start + e.begin, path);
      const quant::BlockFormat& format = quant::block_format(e.dtype == Dtype::F16 ? quant::TensorType::F16
                                                                                  : quant::TensorType::BF16);
      format.dequantize(half_bytes.data(), t.data(), t.size());
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace tapegrad
