// libFuzzer target: arbitrary bytes as a checkpoint file, through the safetensors reader and the
// model loader. Every input must end in a loaded model or a std::exception with a message; a
// crash, a sanitizer report, a leak or a huge allocation is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "nn/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/dev/shm/tapegrad_fuzz_checkpoint_" + std::to_string(getpid()) + ".safetensors";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    tapegrad::nn::LoadedModelCheckpoint loaded = tapegrad::nn::load_model_checkpoint(path);
    (void)loaded.model.num_params();
  } catch (const std::exception& e) {
    if (std::string(e.what()).rfind(path, 0) != 0) {  // every error names the file
      std::fprintf(stderr, "error that does not start with the file's name: %s\n", e.what());
      __builtin_trap();
    }
  }
  return 0;
}
