// train --init under mpirun: 2 ranks fine-tuning the committed tiny Llama write the bytes of one
// process with --micro-batches 2 (rank 0 alone reads the model and sends its config and weights),
// a full fine-tune and LoRA's adapters alike.
#include <doctest/doctest.h>

#include "distributed/mpi_runs.h"

using namespace tapegrad;
using namespace tapegrad::test;
namespace fs = std::filesystem;

TEST_CASE("2 ranks training the tiny Llama from --init write the checkpoint of --micro-batches 2, byte for byte") {
  if (!mpi_available()) return;
  fs::path dir = work_dir("dp_init"), data = write_corpus(dir);
  const fs::path micro = dir / "micro.safetensors", ranked = dir / "ranks.safetensors";
  auto args = [&](const fs::path& out, int steps) {
    return Args{"--data", data.string(), "--out",   out.string(),          "--seq",     "16", "--batch",
                "4",      "--steps",     std::to_string(steps), "--threads", "1",   "--eval-batches", "2",
                "--eval-every", "3", "--decay-steps", "6"};
  };
  const Args init = {"--init", (fs::path(TAPEGRAD_SOURCE_DIR) / "tests/data/models/tiny_llama").string()};
  Result one = run("train", args(micro, 6) + init + Args{"--micro-batches", "2"});
  REQUIRE_MESSAGE(one.status == 0, one.err);
  Result r = run_mpi(2, args(ranked, 6) + init);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(contains(r.out, "2 ranks; each step sums 2 gradients"));
  check_same_tensors(micro, ranked);
  CHECK(read_bytes(micro) == read_bytes(ranked));
  // Resumed under mpirun from a checkpoint of the Llama (rank 0 reads it, the others build the
  // model from its metadata): the bytes of the run that went straight through.
  const fs::path halves = dir / "halves.safetensors";
  Result first = run_mpi(2, args(halves, 3) + init);
  REQUIRE_MESSAGE(first.status == 0, first.err);
  Result resumed = run_mpi(2, args(halves, 6) + Args{"--resume", halves.string()});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  CHECK(read_bytes(halves) == read_bytes(ranked));
}

TEST_CASE("2 ranks training LoRA adapters on the tiny Llama write the checkpoint and adapters of --micro-batches 2") {
  if (!mpi_available()) return;
  fs::path dir = work_dir("dp_lora"), data = write_corpus(dir);
  auto args = [&](const fs::path& out) {
    return Args{"--data", data.string(), "--out", out.string(), "--seq", "16", "--batch", "4", "--steps", "4",
                "--threads", "1", "--eval-batches", "2", "--eval-every", "2", "--lora", "4", "--lora-targets",
                "q,v,down", "--init", (fs::path(TAPEGRAD_SOURCE_DIR) / "tests/data/models/tiny_llama").string()};
  };
  const fs::path micro = dir / "micro.safetensors", ranked = dir / "ranks.safetensors";
  Result one = run("train", args(micro) + Args{"--micro-batches", "2"});
  REQUIRE_MESSAGE(one.status == 0, one.err);
  Result r = run_mpi(2, args(ranked));
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(contains(r.out, "2 ranks; each step sums 2 gradients"));
  check_same_tensors(micro, ranked);
  CHECK(read_bytes(micro) == read_bytes(ranked));
  for (const char* file : {"adapter_model.safetensors", "adapter_config.json"}) {
    CAPTURE(file);
    CHECK(read_bytes(dir / "micro.lora" / file) == read_bytes(dir / "ranks.lora" / file));
  }
}
