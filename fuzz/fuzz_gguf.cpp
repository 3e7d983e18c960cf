// libFuzzer target: arbitrary bytes as a GGUF file, opened, every metadata value read through its
// accessor and every tensor dequantized. Every input must end in a file read whole or a
// std::exception whose message starts with the file's name; a crash, a sanitizer report (an out-of-
// bounds read of the mapping included), a leak or a huge allocation is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "io/gguf.h"

namespace {

// Reads a value through the accessor its type calls for, nested arrays included.
void touch(const tapegrad::io::GgufValue& value) {
  using tapegrad::io::GgufType;
  switch (value.type()) {
    case GgufType::String: (void)value.as_string().size(); return;
    case GgufType::Bool: (void)value.as_bool(); return;
    case GgufType::F32: case GgufType::F64: (void)value.as_float(); return;
    case GgufType::Array: break;
    default: (void)value.as_int(); return;  // may refuse a u64 past int64, naming the file
  }
  switch (value.element_type()) {
    case GgufType::String: (void)value.as_strings().size(); return;
    case GgufType::Bool: (void)value.as_bools().size(); return;
    case GgufType::F32: case GgufType::F64: (void)value.as_floats().size(); return;
    case GgufType::Array:
      for (const auto& element : value.as_arrays()) touch(element);
      return;
    default: (void)value.as_ints().size(); return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/dev/shm/tapegrad_fuzz_gguf_" + std::to_string(getpid()) + ".gguf";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    const tapegrad::io::GgufFile file = tapegrad::io::GgufFile::open(path);
    for (const auto& [key, value] : file.metadata()) touch(value);
    for (const auto& tensor : file.tensors()) (void)file.dequantize(tensor).size();
  } catch (const std::exception& e) {
    if (std::string(e.what()).rfind(path, 0) != 0) {  // every error names the file
      std::fprintf(stderr, "error that does not start with the file's name: %s\n", e.what());
      __builtin_trap();
    }
  }
  return 0;
}
