// safetensors: round trip, atomic writes under a simulated full disk, one test per forged input
// (each error names the file and the problem), and reading our file from Python with numpy.
#include <doctest/doctest.h>

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/safetensors.h"
#include "support/helpers.h"

using namespace tapegrad;
using test::contains;
using test::error_of;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the system temp folder, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("tapegrad_safetensors_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::string u64_le(std::uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  return out;
}

// A file with the given header text and `data_bytes` bytes of data (zeros).
std::string forge(const TempDir& dir, const std::string& header, std::size_t data_bytes) {
  const std::string path = dir.file("forged.safetensors");
  write_bytes(path, u64_le(header.size()) + header + std::string(data_bytes, '\0'));
  return path;
}

// The message of read_safetensors(path), which must start with the path and contain `problem`.
void check_refused(const std::string& path, const std::string& problem) {
  const std::string message = error_of<std::runtime_error>([&] { read_safetensors(path); });
  CHECK_MESSAGE(message.rfind(path + ": ", 0) == 0, message);
  CHECK_MESSAGE(contains(message, problem), message, "\n  does not contain: ", problem);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

}  // namespace

TEST_CASE("a safetensors round trip keeps every bit, the shapes and the metadata, with an 8-byte aligned header") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  Tensor matrix = test::random_tensor({2, 3}, 1);
  Tensor special({5}, {-0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                       std::numeric_limits<float>::quiet_NaN(), 1e-30f});
  Tensor scalar = Tensor::scalar(7.5f), none = Tensor({0, 4});
  const std::map<std::string, std::string> metadata = {{"vocab", "\n !é…z"}, {"step", "12"}};
  write_safetensors(path, {{"head.weight", &matrix}, {"special", &special}, {"scalar", &scalar}, {"none", &none}},
                    metadata);

  SafetensorsFile file = read_safetensors(path);
  CHECK(file.metadata == metadata);
  REQUIRE(file.tensors.size() == 4);
  CHECK(same_bits(file.tensors.at("head.weight"), matrix));
  CHECK(same_bits(file.tensors.at("special"), special));
  CHECK(same_bits(file.tensors.at("scalar"), scalar));
  CHECK(file.tensors.at("none").shape() == Shape{0, 4});

  const std::string bytes = slurp(path);
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | std::uint8_t(bytes[i]);
  CHECK(header_size % 8 == 0);
  CHECK(bytes.size() == 8 + header_size + (6 + 5 + 1) * 4);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_size));
  CHECK(header["head.weight"]["dtype"] == "F32");
  CHECK(header["head.weight"]["shape"] == nlohmann::json::array({2, 3}));
  CHECK(header["head.weight"]["data_offsets"] == nlohmann::json::array({0, 24}));
  CHECK(header["special"]["data_offsets"] == nlohmann::json::array({24, 44}));  // in the given order
  CHECK(header["none"]["data_offsets"] == nlohmann::json::array({48, 48}));
  CHECK(header["__metadata__"]["vocab"] == "\n !é…z");
  CHECK(!fs::exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST_CASE("a write that fails part-way leaves the previous file intact and loadable, and no temporary file") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  Tensor old_values = test::random_tensor({16, 16}, 2), new_values = test::random_tensor({16, 16}, 3);
  write_safetensors(path, {{"w", &old_values}}, {{"step", "100"}});
  const std::string before = slurp(path);

  for (std::int64_t fail_after : {0, 5, 40, 600}) {  // in the length, the header, the data
    detail::safetensors_fail_after_bytes = fail_after;
    const std::string message =
        error_of<std::runtime_error>([&] { write_safetensors(path, {{"w", &new_values}}, {{"step", "200"}}); });
    CHECK(message.rfind(path + ": write failed after " + std::to_string(fail_after) + " bytes", 0) == 0);
    CHECK_MESSAGE(contains(message, "No space left on device"), message);
    CHECK(detail::safetensors_fail_after_bytes == -1);  // the seam fires once

    CHECK(slurp(path) == before);
    SafetensorsFile file = read_safetensors(path);
    CHECK(same_bits(file.tensors.at("w"), old_values));
    CHECK(file.metadata.at("step") == "100");
    CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
  }
  write_safetensors(path, {{"w", &new_values}}, {{"step", "200"}});  // the next write goes through
  CHECK(same_bits(read_safetensors(path).tensors.at("w"), new_values));
}

TEST_CASE("writing into a missing folder names the path and the OS error") {
  TempDir dir;
  const std::string path = dir.file("no/such/folder/ckpt.safetensors");
  Tensor t({2});
  const std::string message = error_of<std::runtime_error>([&] { write_safetensors(path, {{"t", &t}}, {}); });
  CHECK(message.rfind(path + ": cannot create the temporary file", 0) == 0);
  CHECK(contains(message, "No such file or directory"));
}

TEST_CASE("the writer refuses repeated, empty or reserved names and tensors without storage") {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  Tensor t({2}), empty;
  CHECK(error_of([&] { write_safetensors(path, {{"a", &t}, {"a", &t}}, {}); }) == path + ": tensor 'a' is given twice");
  CHECK(error_of([&] { write_safetensors(path, {{"__metadata__", &t}}, {}); }) ==
        path + ": invalid tensor name '__metadata__'");
  CHECK(contains(error_of([&] { write_safetensors(path, {{"e", &empty}}, {}); }), "tensor 'e' has no storage"));
  CHECK(contains(error_of([&] { write_safetensors(path, {{"a", &t}}, {{"bad", "\xff"}}); }), "not valid UTF-8"));
  CHECK(!fs::exists(path));
}

TEST_CASE("the reader refuses a missing file, an empty file and a 5-byte file") {
  TempDir dir;
  check_refused(dir.file("absent.safetensors"), "cannot open: No such file or directory");
  const std::string path = dir.file("short.safetensors");
  write_bytes(path, "");
  check_refused(path, "file is 0 bytes, too short for the 8-byte header length");
  write_bytes(path, std::string("\x10\0\0\0\0", 5));
  check_refused(path, "file is 5 bytes, too short");
}

TEST_CASE("the reader refuses a header length beyond the file, of 2^63, or above the limit, before allocating") {
  TempDir dir;
  const std::string path = dir.file("long.safetensors");
  write_bytes(path, u64_le(100) + "{}");
  check_refused(path, "header length 100 runs past the end of the file (2 bytes after the 8-byte length)");
  write_bytes(path, u64_le(std::uint64_t(1) << 63) + "{}      ");
  check_refused(path, "header length 9223372036854775808 runs past the end of the file");
  // A sparse 200 MB file whose header length (150 MB) fits in it but exceeds the 100 MB limit.
  write_bytes(path, u64_le(150'000'000));
  fs::resize_file(path, 200'000'000);
  check_refused(path, "header length 150000000 exceeds the limit of 100000000 bytes");
}

TEST_CASE("the reader refuses invalid JSON, a header that is not an object, and a name given twice") {
  TempDir dir;
  check_refused(forge(dir, "{\"w\": {\"dtype\": ", 0), "invalid JSON header");
  // The JSON library reports a number too large for a double as out of range, not as a parse error.
  check_refused(forge(dir, R"({"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}})", 4),
                "invalid JSON header: [json.exception.out_of_range.406] number overflow parsing '1e999'");
  check_refused(forge(dir, "[1, 2, 3]", 0), "header is an array, expected a JSON object");
  check_refused(forge(dir,
                      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      8),
                "'w' appears twice in the header");
}

TEST_CASE("the reader refuses an entry that is not an object, an unknown dtype, or a missing or unknown field") {
  TempDir dir;
  check_refused(forge(dir, R"({"w": [0, 4]})", 4), "tensor 'w': entry is an array, expected an object");
  check_refused(forge(dir, R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8),
                "tensor 'w': dtype 'F64' is not supported (F32, F16 or BF16)");
  check_refused(forge(dir, R"({"w":{"dtype":"F32","shape":[1]}})", 4), "tensor 'w': missing field 'data_offsets'");
  check_refused(forge(dir, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4),
                "tensor 'w': unknown field 'x'");
}

TEST_CASE("the reader refuses a shape with a negative or non-integer dimension, or too many elements") {
  TempDir dir;
  check_refused(forge(dir, R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})", 8),
                "tensor 'w': shape [2,-1] has a negative dimension (-1)");
  check_refused(forge(dir, R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
                "tensor 'w': shape [2.5] has a non-integer number as a dimension (2.5)");
  check_refused(forge(dir, R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8),
                "tensor 'w': shape is a string, expected a list of non-negative integers");
  check_refused(forge(dir, R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
                "tensor 'w': shape [4294967296,4294967296] has more elements than any file can hold");
}

TEST_CASE("the reader refuses offsets out of range, begin after end, and a byte range that does not fit the shape") {
  TempDir dir;
  check_refused(forge(dir, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
                "tensor 'w': data_offsets [0, 16] run past the end of the 8-byte data section");
  check_refused(forge(dir, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8),
                "tensor 'w': data_offsets [8, 4] begin after they end");
  check_refused(forge(dir, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})", 8),
                "tensor 'w': data_offsets [0,-4] must be two non-negative integers");
  check_refused(forge(dir, R"({"head.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12]}})", 12),
                "tensor 'head.weight': data_offsets [0, 12] hold 12 bytes but shape [2, 3] needs 24");
}

TEST_CASE("F16 and BF16 tensors read as the exact float32 values of their bits, and their sizes are checked") {
  TempDir dir;
  // F16: 1, -2, the smallest subnormal 2^-24, infinity, the largest finite 65504, -0.
  // BF16: 1, -3, the smallest subnormal (float32 bits 0x00010000), -infinity.
  const std::vector<std::uint16_t> halves{0x3C00, 0xC000, 0x0001, 0x7C00, 0x7BFF, 0x8000, 0x3F80, 0xC040, 0x0001, 0xFF80};
  std::string data;
  for (std::uint16_t h : halves) data += std::string{char(h & 0xFF), char(h >> 8)};
  const std::string header = R"({"h":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},)"
                             R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[12,20]}})";
  const std::string path = dir.file("halves.safetensors");
  write_bytes(path, u64_le(header.size()) + header + data);
  const SafetensorsFile file = read_safetensors(path);
  const Tensor& h = file.tensors.at("h");
  const Tensor& b = file.tensors.at("b");
  REQUIRE(h.shape() == Shape{2, 3});
  REQUIRE(b.shape() == Shape{4});
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> expected_h{1.0f, -2.0f, std::ldexp(1.0f, -24), inf, 65504.0f, -0.0f};
  for (std::size_t i = 0; i < 6; ++i) CHECK(std::bit_cast<std::uint32_t>(h[i]) == std::bit_cast<std::uint32_t>(expected_h[i]));
  CHECK(b[0] == 1.0f);
  CHECK(b[1] == -3.0f);
  CHECK(std::bit_cast<std::uint32_t>(b[2]) == 0x00010000u);
  CHECK(b[3] == -inf);

  check_refused(forge(dir, R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,12]}})", 12),
                "tensor 'w': data_offsets [0, 12] hold 12 bytes but shape [3] needs 6 as BF16");
}

TEST_CASE("the reader refuses overlapping ranges, a gap between ranges, and trailing bytes after the last tensor") {
  TempDir dir;
  check_refused(forge(dir,
                      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                      20),
                "tensors 'a' [0, 16] and 'b' [12, 20] overlap");
  check_refused(forge(dir,
                      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                      20),
                "gap of 4 bytes between tensor 'a' (ends at 8) and tensor 'b' (begins at 12)");
  check_refused(forge(dir, R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                "gap of 4 bytes before the first tensor 'b'");
  check_refused(forge(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 11),
                "3 trailing bytes after the last tensor 'a'");
}

TEST_CASE("the reader refuses metadata that is not an object of strings, and accepts any padding of spaces") {
  TempDir dir;
  check_refused(forge(dir, R"({"__metadata__":{"d_model":64}})", 0),
                "__metadata__ entry 'd_model' is a number, expected a string");
  check_refused(forge(dir, R"({"__metadata__":["x"]})", 0), "__metadata__ is an array, expected an object");
  const std::string path = forge(dir, R"({"__metadata__":{"k":"v"}})" + std::string(13, ' '), 0);
  CHECK(read_safetensors(path).metadata.at("k") == "v");
}

TEST_CASE("a file written here reads in Python with json, struct and numpy alone (scripts/read_checkpoint.py)") {
  // The python3 on PATH may be a separate install (pyenv, venv) without numpy; the system's may have it.
  std::string python;
  for (const char* candidate : {"python3", "/usr/bin/python3"})
    if (std::system((std::string(candidate) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0) {
      python = candidate;
      break;
    }
  if (python.empty()) {
    // scripts/deps.sh installs python3-numpy, so under CI a missing numpy is a failure.
    const char* ci = std::getenv("CI");
    if (ci != nullptr && std::string(ci) == "true") FAIL("no python3 with numpy (tried python3 and /usr/bin/python3)");
    MESSAGE("skipped: no python3 with numpy (tried python3 and /usr/bin/python3)");
    return;
  }
  TempDir dir;
  const std::string path = dir.file("interop.safetensors"), out = dir.file("out.txt");
  Tensor w = test::random_tensor({3, 4}, 9), other = test::random_tensor({5}, 10);
  write_safetensors(path, {{"other", &other}, {"blocks.0.attn.wq.weight", &w}}, {{"vocab", "ab\u00e9"}});
  const std::string reader = python + " '" + TAPEGRAD_SOURCE_DIR + "/scripts/read_checkpoint.py' '" + path + "'";
  REQUIRE(std::system((reader + " > '" + out + "' 2>&1").c_str()) == 0);
  std::istringstream listing(slurp(out));
  std::string metadata, line;
  std::getline(listing, metadata);
  CHECK(metadata == "{\"vocab\": \"ab\u00e9\"}");  // UTF-8 kept as it is
  std::set<std::string> shapes;
  while (std::getline(listing, line)) shapes.insert(line);
  CHECK(shapes == std::set<std::string>{"other 5", "blocks.0.attn.wq.weight 3 4"});
  REQUIRE(std::system((reader + " blocks.0.attn.wq.weight > '" + out + "' 2>&1").c_str()) == 0);
  std::istringstream values(slurp(out));
  for (std::size_t i = 0; i < w.size(); ++i) {
    std::string value;
    values >> value;
    CHECK(float(std::stod(value)) == w[i]);  // repr of the float32 widened to double is exact
  }
}
