// End-to-end tests of the example programs: train_char, generate and evaluate run as built
// (from TAPEGRAD_BINARY_DIR) on a small generated corpus in a temporary folder; the tests check
// their output, exit status and files, including resume, Ctrl-C and NaN handling.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/random.h"
#include "io/safetensors.h"
#include "nn/checkpoint.h"
#include "nn/models/rotary_decoder.h"
#include "support/helpers.h"
#include "support/programs.h"
#include "tokenizers/utf8.h"

using namespace tapegrad;
using namespace tapegrad::test;
namespace fs = std::filesystem;

TEST_CASE("train_char trains a tiny model and writes its checkpoint, metrics CSV and loss curve") {
  fs::path dir = work_dir("train"), data = write_corpus(dir), ckpt = dir / "run" / "tiny.safetensors";
  Result r = run("train_char", tiny(data, ckpt, 20) + std::vector<std::string>{"--eval-every", "10"});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(r.err.empty());  // stderr is not a terminal: no live line, plain lines on stdout
  CHECK(test::contains(r.out, "model: RotaryDecoder(vocab="));
  CHECK(test::contains(r.out, "parameters: "));
  CHECK(test::contains(r.out, "step 20/20 | loss "));
  CHECK(test::contains(r.out, " tok/s recent | "));  // the live line's rate is labelled as recent
  CHECK(test::contains(r.out, "final val loss"));
  nn::LoadedModelCheckpoint loaded = nn::load_model_checkpoint(ckpt.string());
  CHECK(loaded.model.as<nn::RotaryDecoder>()->config().d_model == 16);
  CHECK(loaded.metadata.at("step") == "20");
  CHECK(loaded.metadata.at("train.seq") == "16");
  CHECK(loaded.metadata.at("data_position") == "80");
  CHECK(!loaded.extra_tensors.empty());
  std::istringstream csv(read_bytes(dir / "run" / "tiny.metrics.csv"));
  std::string line;
  std::getline(csv, line);
  CHECK(line == "step,train_loss,val_loss,lr,tokens_per_s,wall_s");
  int rows = 0, val_rows = 0;
  while (std::getline(csv, line)) {
    ++rows;
    val_rows += !test::contains(line, ",,");
  }
  CHECK(rows == 21);     // step 0 (validation only) and steps 1..20
  CHECK(val_rows == 2);  // steps 10 and 20 have both losses; step 0 has no train loss
  std::string svg = read_bytes(dir / "run" / "tiny.loss.svg");
  CHECK(svg.starts_with("<svg"));
  CHECK(test::contains(svg, "validation"));
  CHECK(test::contains(svg, ">step</text>"));
  CHECK(!has_temporary_files(dir / "run"));
  CHECK(!fs::exists(ckpt.string() + ".lock"));  // removed by the run that held it
}

TEST_CASE("train_char --threads 0 runs on OMP_NUM_THREADS threads when it is set") {
  fs::path dir = work_dir("threads"), data = write_corpus(dir);
  std::vector<std::string> args = tiny(data, dir / "t.safetensors", 2);
  *(std::find(args.begin(), args.end(), "--threads") + 1) = "0";
  for (const char* threads : {"1", "2"}) {
    Result r = run("train_char", args, {std::string("OMP_NUM_THREADS=") + threads});
    REQUIRE_MESSAGE(r.status == 0, r.err);
    CHECK(test::contains(r.out, fmt::format("; {} threads", threads)));
  }
}

TEST_CASE("a run stopped halfway and resumed ends bit-identical to a straight run") {
  fs::path dir = work_dir("resume"), data = write_corpus(dir);
  fs::path straight = dir / "straight.safetensors", halves = dir / "halves.safetensors";
  const std::vector<std::string> common = {"--eval-every", "4", "--save-every", "3"};
  REQUIRE(run("train_char", tiny(data, straight, 12) + common).status == 0);
  REQUIRE(run("train_char", tiny(data, halves, 6) + common + std::vector<std::string>{"--decay-steps", "12"}).status ==
          0);
  CHECK(nn::load_model_checkpoint(halves.string()).metadata.at("step") == "6");
  Result resumed =
      run("train_char", tiny(data, halves, 12) + common + std::vector<std::string>{"--resume", halves.string()});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  CHECK(test::contains(resumed.out, "resumed from"));
  check_same_tensors(straight, halves);
  CHECK(read_bytes(straight) == read_bytes(halves));
  // The metrics of the resumed run continue those of the first half.
  std::string csv = read_bytes(dir / "halves.metrics.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 14);  // header, step 0, steps 1..12
}

// "done: step 12 in 0:01 (384 tokens in 0.53 s, 725 tokens/s on average); final val loss ..."
struct Summary {
  long step = 0, tokens = 0;
  double seconds = 0, tokens_per_s = 0;
};
Summary summary_line(const std::string& out) {
  std::smatch m;
  const std::regex line(R"(done: step (\d+) in \S+ \((\d+) tokens in ([0-9.]+) s, (\d+) tokens/s on average\); final val loss)");
  REQUIRE_MESSAGE(std::regex_search(out, m, line), out);
  return {std::stol(m[1]), std::stol(m[2]), std::stod(m[3]), std::stod(m[4])};
}

TEST_CASE("the summary line reports the run's average tokens/s: its tokens over its wall time") {
  fs::path dir = work_dir("summary"), data = write_corpus(dir), ckpt = dir / "summary.safetensors";
  Result first = run("train_char", tiny(data, ckpt, 6) + std::vector<std::string>{"--decay-steps", "12"});
  REQUIRE_MESSAGE(first.status == 0, first.err);
  Result resumed = run("train_char", tiny(data, ckpt, 12) + std::vector<std::string>{"--resume", ckpt.string()});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  for (const auto& [result, steps] : {std::pair{&first, 6}, {&resumed, 6}}) {
    const Summary s = summary_line(result->out);
    CHECK(s.tokens == steps * 4 * 16);  // this run's steps x --batch 4 x --seq 16, not the resumed ones
    // The seconds are printed to 0.01 s (0.00 for a run under 5 ms, as 6 tiny steps can be on a fast
    // core): the rate lies between tokens / (s + 0.005) and tokens / (s - 0.005).
    CHECK(s.tokens_per_s >= std::floor(double(s.tokens) / (s.seconds + 0.005)));
    if (s.seconds > 0.005) CHECK(s.tokens_per_s <= std::ceil(double(s.tokens) / (s.seconds - 0.005)));
  }
  CHECK(summary_line(resumed.out).step == 12);
}

TEST_CASE("train_char --remat writes the same checkpoint as without") {
  fs::path dir = work_dir("remat"), data = write_corpus(dir);
  fs::path plain = dir / "plain.safetensors", remat = dir / "remat.safetensors";
  REQUIRE(run("train_char", tiny(data, plain, 8)).status == 0);
  REQUIRE(run("train_char", tiny(data, remat, 8) + std::vector<std::string>{"--remat"}).status == 0);
  check_same_tensors(plain, remat);
}

TEST_CASE("generate streams exactly the prompt and the new characters, the same with and without the cache") {
  fs::path dir = work_dir("generate"), data = write_corpus(dir), ckpt = dir / "g.safetensors";
  REQUIRE(run("train_char", tiny(data, ckpt, 10)).status == 0);
  const std::vector<std::string> args = {"--checkpoint", ckpt.string(), "--prompt", "The café",
                                         "--max-new",    "20",          "--seed",   "3"};
  Result cached = run("generate", args);
  REQUIRE_MESSAGE(cached.status == 0, cached.err);
  CHECK(cached.err.empty());
  CHECK(cached.out.starts_with("The café"));
  CHECK(tokenizers::decode_utf8(cached.out).size() == 8 + 20);
  Result uncached = run("generate", args + std::vector<std::string>{"--no-cache"});
  REQUIRE(uncached.status == 0);
  CHECK(uncached.out == cached.out);
  SUBCASE("--num-samples N decodes N samples as a batch: sample i is the text --seed 3+i gives alone") {
    const std::vector<std::string> sampled = {"--checkpoint", ckpt.string(), "--prompt", "The café", "--max-new", "20",
                                              "--temperature", "1.2"};
    std::string expected, expected_jsonl;
    for (int i = 0; i < 4; ++i) {
      Result alone = run("generate", sampled + std::vector<std::string>{"--seed", std::to_string(3 + i)});
      REQUIRE(alone.status == 0);
      expected += alone.out + "\n---\n";
      // The line one sample prints with --jsonl (its ids too), whose text is what it streams.
      Result line = run("generate", sampled + std::vector<std::string>{"--seed", std::to_string(3 + i), "--jsonl"});
      REQUIRE(line.status == 0);
      nlohmann::json object = nlohmann::json::parse(line.out);
      CHECK(object["text"] == alone.out);
      CHECK(object["ids"].size() == 20);
      object["sample"] = i;
      expected_jsonl += object.dump() + "\n";
    }
    Result batch = run("generate", sampled + std::vector<std::string>{"--seed", "3", "--num-samples", "4"});
    REQUIRE_MESSAGE(batch.status == 0, batch.err);
    CHECK(batch.out == expected);
    Result jsonl = run("generate", sampled + std::vector<std::string>{"--seed", "3", "--num-samples", "4", "--jsonl"});
    REQUIRE(jsonl.status == 0);
    CHECK(jsonl.out == expected_jsonl);
    std::istringstream lines(jsonl.out);
    std::string line;
    for (int i = 0; std::getline(lines, line); ++i) CHECK(nlohmann::json::parse(line)["sample"] == i);
    CHECK(run("generate", sampled + std::vector<std::string>{"--num-samples", "0"}).status == 2);
  }
  SUBCASE("the default prompt is a newline (the corpus has one)") {
    Result r = run("generate", {"--checkpoint", ckpt.string(), "--max-new", "5"});
    REQUIRE(r.status == 0);
    CHECK(r.out.starts_with("\n"));
    CHECK(tokenizers::decode_utf8(r.out).size() == 6);
  }
  SUBCASE("reaching max_len stops early with a note on stderr only") {
    Result r = run("generate", {"--checkpoint", ckpt.string(), "--prompt", "The", "--max-new", "100"});
    REQUIRE(r.status == 0);
    CHECK(tokenizers::decode_utf8(r.out).size() == 32);
    CHECK(test::contains(r.err, "stopped at max_len 32"));
  }
}

TEST_CASE("evaluate prints one JSON line whose loss matches a direct windowed computation") {
  fs::path dir = work_dir("evaluate"), data = write_corpus(dir), ckpt = dir / "e.safetensors";
  REQUIRE(run("train_char", tiny(data, ckpt, 10)).status == 0);
  Result r = run("evaluate", {"--checkpoint", ckpt.string(), "--data", data.string(), "--limit", "1000"});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  REQUIRE(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  nlohmann::json line = nlohmann::json::parse(r.out);
  CHECK(line.size() == 4);
  REQUIRE(line.contains("loss"));
  REQUIRE(line.contains("perplexity"));
  REQUIRE(line.contains("bits_per_char"));
  REQUIRE(line.contains("tokens"));
  CHECK(line["perplexity"].get<double>() == doctest::Approx(std::exp(line["loss"].get<double>())));
  CHECK(line["tokens"].get<int>() == 999);
  // evaluate's windows by hand: L = min(max_len, n-1-s) at s = 0, L, 2L, ..., one at a
  // time, weighted by length. The program batches full windows, so float32 means may round
  // differently: 1e-5 relative is far above that rounding (~1e-7) and far below any real error.
  nn::LoadedModelCheckpoint loaded = nn::load_model_checkpoint(ckpt.string());
  std::u32string chars = tokenizers::decode_utf8(read_bytes(data)).substr(0, 1000);
  std::string text;
  for (char32_t c : chars) tokenizers::append_utf8(text, c);
  std::vector<std::int32_t> ids = loaded.tokenizer->encode(text);
  double sum = 0;
  std::size_t tokens = 0;
  NoGradScope no_grad;
  for (std::size_t s = 0; s + 1 < ids.size();) {
    std::size_t L = std::min<std::size_t>(32, ids.size() - 1 - s);
    std::vector<std::int32_t> in(ids.begin() + s, ids.begin() + s + L),
        target(ids.begin() + s + 1, ids.begin() + s + L + 1);
    sum += double(loaded.model.loss(in, target, 1, L).value().item()) * double(L);
    tokens += L;
    s += L;
  }
  const double expected = sum / double(tokens);
  CHECK(tokens == 999);
  CHECK(line["loss"].get<double>() == doctest::Approx(expected).epsilon(1e-5));
  CHECK(line["bits_per_char"].get<double>() == doctest::Approx(expected / std::log(2.0)).epsilon(1e-5));
}

TEST_CASE("bad arguments exit with status 2 and one line on stderr; --help exits 0") {
  fs::path dir = work_dir("arguments"), data = write_corpus(dir), ckpt = dir / "a.safetensors";
  for (std::string program : {"train_char", "generate", "evaluate"}) {
    CAPTURE(program);
    Result unknown = run(program, {"--no-such-flag"});
    CHECK(unknown.status == 2);
    CHECK(one_error_line(unknown, program));
    CHECK(test::contains(unknown.err, "--no-such-flag"));
    Result help = run(program, {"--help"});
    CHECK(help.status == 0);
    CHECK(test::contains(help.out, "Usage:"));
  }
  for (const auto& bad : std::vector<std::vector<std::string>>{{"--seq", "0"},
                                                               {"--seq", "-3"},
                                                               {"--batch", "x"},
                                                               {"--lr", "nan"},
                                                               {"--heads", "3"},
                                                               {"--seq", "64"},
                                                               {"--warmup", "50"},
                                                               {"--clip", "-1"}}) {
    CAPTURE(bad[0] + " " + bad[1]);
    Result r = run("train_char", tiny(data, ckpt, 10) + bad);
    CHECK(r.status == 2);
    CHECK(one_error_line(r, "train_char"));
    CHECK(test::contains(r.err, bad[0]));
    CHECK(!fs::exists(ckpt));
  }
  Result no_data = run("train_char", {"--steps", "1"});
  CHECK(no_data.status == 2);
  CHECK(test::contains(no_data.err, "--data"));
  Result from_env = run("train_char", tiny(data, ckpt, 2), {"DATA=" + data.string()});
  CHECK(from_env.status == 0);
}

TEST_CASE("a missing, empty or invalid UTF-8 corpus is one clear error naming the file, and writes nothing") {
  fs::path dir = work_dir("corpus"), ckpt = dir / "new_folder" / "c.safetensors";
  write_bytes(dir / "empty.txt", "");
  write_bytes(dir / "latin1.txt", "caf\xe9 au lait");
  for (const auto& [file, message] : std::vector<std::pair<std::string, std::string>>{
           {"missing.txt", "cannot open"}, {"empty.txt", "empty"}, {"latin1.txt", "invalid UTF-8 at byte offset 3"}}) {
    CAPTURE(file);
    Result r = run("train_char", tiny(dir / file, ckpt, 2));
    CHECK(r.status == 1);
    CHECK(one_error_line(r, "train_char"));
    CHECK(test::contains(r.err, (dir / file).string()));
    CHECK(test::contains(r.err, message));
    CHECK(!fs::exists(ckpt.parent_path()));  // not even the folder of --out
  }
}

TEST_CASE("generate refuses a prompt outside the vocabulary or longer than max_len") {
  fs::path dir = work_dir("prompt"), data = write_corpus(dir), ckpt = dir / "p.safetensors";
  REQUIRE(run("train_char", tiny(data, ckpt, 2)).status == 0);
  Result outside = run("generate", {"--checkpoint", ckpt.string(), "--prompt", "The cat#"});
  CHECK(outside.status == 2);
  CHECK(one_error_line(outside, "generate"));
  CHECK(test::contains(outside.err, "'#'"));
  CHECK(test::contains(outside.err, "position 7"));
  CHECK(test::contains(outside.err, "the tokenizer of " + ckpt.string()));
  CHECK(outside.out.empty());
  Result not_utf8 = run("generate", {"--checkpoint", ckpt.string(), "--prompt", "The cat\xFF"});
  CHECK(not_utf8.status == 2);
  CHECK(one_error_line(not_utf8, "generate"));
  CHECK(test::contains(not_utf8.err, "invalid UTF-8 at byte offset 7"));
  CHECK(not_utf8.out.empty());
  Result too_long = run("generate", {"--checkpoint", ckpt.string(), "--prompt", std::string(33, 'a')});
  CHECK(too_long.status == 2);
  CHECK(one_error_line(too_long, "generate"));
  CHECK(test::contains(too_long.err, "33 tokens, more than the model's max_len 32"));
  CHECK(too_long.out.empty());
  write_bytes(dir / "other.txt", "The cat#");
  Result evaluate_outside = run("evaluate", {"--checkpoint", ckpt.string(), "--data", (dir / "other.txt").string()});
  CHECK(evaluate_outside.status == 1);
  CHECK(one_error_line(evaluate_outside, "evaluate"));
  CHECK(test::contains(evaluate_outside.err, "'#'"));
  CHECK(evaluate_outside.out.empty());
}

TEST_CASE("a truncated checkpoint is refused by generate, evaluate and train_char --resume") {
  fs::path dir = work_dir("truncated"), data = write_corpus(dir), ckpt = dir / "t.safetensors";
  REQUIRE(run("train_char", tiny(data, ckpt, 2)).status == 0);
  const std::string bytes = read_bytes(ckpt);
  fs::path damaged = dir / "damaged.safetensors";
  write_bytes(damaged, bytes.substr(0, bytes.size() - 100));
  std::vector<Result> results = {run("generate", {"--checkpoint", damaged.string()}),
                                 run("evaluate", {"--checkpoint", damaged.string(), "--data", data.string()}),
                                 run("train_char", tiny(data, dir / "next.safetensors", 4) +
                                                       std::vector<std::string>{"--resume", damaged.string()})};
  for (const Result& r : results) {
    CHECK(r.status == 1);
    CHECK(r.err.find(": " + damaged.string() + ": ") != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.out.empty());
  }
  CHECK(!fs::exists(dir / "next.safetensors"));
  CHECK(read_bytes(damaged) == bytes.substr(0, bytes.size() - 100));
}

TEST_CASE("Ctrl-C saves a checkpoint that resumes, and exits with status 130") {
  fs::path dir = work_dir("interrupt"), data = write_corpus(dir), ckpt = dir / "i.safetensors";
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  pid_t pid = start("train_char", tiny(data, ckpt, 1000000) + std::vector<std::string>{"--eval-every", "0"}, out, err);
  // Wait until the run has made progress: its first periodic save (step 500) is printed after the
  // signal handler is installed and after steps have been taken.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!test::contains(read_bytes(out), ": saved ") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE_MESSAGE(test::contains(read_bytes(out), ": saved "), read_bytes(out));
  REQUIRE(::kill(pid, SIGINT) == 0);
  CHECK(wait_for(pid) == 130);
  CHECK(test::contains(read_bytes(out), "interrupted by signal 2 at step "));
  nn::LoadedModelCheckpoint saved = nn::load_model_checkpoint(ckpt.string());
  const long step = std::stol(saved.metadata.at("step"));
  CHECK(step > 0);
  Result resumed =
      run("train_char", tiny(data, ckpt, int(step) + 3) +
                            std::vector<std::string>{"--resume", ckpt.string(), "--decay-steps", "1000000"});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  CHECK(nn::load_model_checkpoint(ckpt.string()).metadata.at("step") == std::to_string(step + 3));
  CHECK(!has_temporary_files(dir));
}

TEST_CASE("a NaN loss stops the run naming the step and keeps the last good checkpoint byte for byte") {
  fs::path dir = work_dir("nan"), data = write_corpus(dir), ckpt = dir / "n.safetensors";
  const std::vector<std::string> schedule = {"--decay-steps", "20", "--save-every", "0"};
  REQUIRE(run("train_char", tiny(data, ckpt, 5) + schedule).status == 0);
  const std::string good = read_bytes(ckpt);
  Result r = run("train_char", tiny(data, ckpt, 20) + schedule + std::vector<std::string>{"--resume", ckpt.string()},
                 {"TAPEGRAD_TEST_INJECT_NAN_AT_STEP=8"});
  CHECK(r.status == 1);
  CHECK(one_error_line(r, "train_char"));
  CHECK(test::contains(r.err, "the loss is nan at step 8"));
  CHECK(test::contains(r.err, "is kept"));
  CHECK(read_bytes(ckpt) == good);
  SUBCASE("within one run, the periodic checkpoint before the NaN survives") {
    fs::path fresh = dir / "fresh.safetensors";
    Result in_run = run("train_char", tiny(data, fresh, 20) + std::vector<std::string>{"--save-every", "5"},
                        {"TAPEGRAD_TEST_INJECT_NAN_AT_STEP=12"});
    CHECK(in_run.status == 1);
    CHECK(test::contains(in_run.err, "at step 12"));
    CHECK(nn::load_model_checkpoint(fresh.string()).metadata.at("step") == "10");
    CHECK(!has_temporary_files(dir));
  }
}
