// train --precision: bf16 products in a whole run (remat and resume included), recorded in the
// checkpoint; float32 stays the default.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "support/helpers.h"
#include "support/programs.h"

using namespace tapegrad;
using namespace tapegrad::test;
namespace fs = std::filesystem;

TEST_CASE("train --precision bf16 trains with bf16 products, records it, and remat and resume keep its bits") {
  fs::path dir = work_dir("train_precision"), data = write_corpus(dir);
  fs::path f32 = dir / "f32.safetensors", bf16 = dir / "bf16.safetensors", remat = dir / "remat.safetensors";
  fs::path halves = dir / "halves.safetensors";
  const std::vector<std::string> in_bf16 = {"--precision", "bf16", "--eval-every", "3"};
  REQUIRE(run("train", tiny(data, f32, 6) + std::vector<std::string>{"--eval-every", "3"}).status == 0);
  Result r = run("train", tiny(data, bf16, 6) + in_bf16);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(contains(r.out, "precision: bf16 matrix products"));
  CHECK(nn::load_model_checkpoint(f32.string()).metadata.at("train.precision") == "f32");
  CHECK(nn::load_model_checkpoint(bf16.string()).metadata.at("train.precision") == "bf16");
  CHECK(read_bytes(f32) != read_bytes(bf16));  // the rounding shows in the weights
  REQUIRE(run("train", tiny(data, remat, 6) + in_bf16 + std::vector<std::string>{"--remat"}).status == 0);
  check_same_tensors(bf16, remat);
  // Half the steps, then a resume to the end: the same file as the uninterrupted run.
  REQUIRE(run("train", tiny(data, halves, 3) + in_bf16 + std::vector<std::string>{"--decay-steps", "6"}).status == 0);
  r = run("train", tiny(data, halves, 6) + in_bf16 + std::vector<std::string>{"--resume", halves.string()});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(read_bytes(bf16) == read_bytes(halves));
  r = run("train", tiny(data, dir / "bad.safetensors", 2) + std::vector<std::string>{"--precision", "fp16"});
  CHECK(r.status != 0);
  CHECK(contains(r.err, "--precision"));
}
