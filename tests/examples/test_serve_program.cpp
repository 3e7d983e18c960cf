// End-to-end tests of the built `serve` program: started on a free port, queried over HTTP, then
// SIGTERM (exit 0); and serving while a real train_char run replaces its checkpoint.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "../serve/serve_helpers.h"
#include "support/helpers.h"
#include "support/programs.h"

using namespace tapegrad;
using namespace tapegrad::test;
using nlohmann::json;

TEST_CASE("serve answers as generate does, refuses a bad flag or a port in use, and exits 0 on SIGTERM") {
  fs::path dir = work_dir("serve_program"), data = write_corpus(dir), ckpt = dir / "tiny.safetensors";
  REQUIRE(run("train_char", tiny(data, ckpt, 10)).status == 0);

  Result bad = run("serve", {"--checkpoint", ckpt.string(), "--parallel", "0"});
  CHECK(bad.status == 2);
  CHECK(one_error_line(bad, "serve"));
  Result missing = run("serve", {"--checkpoint", (dir / "none.safetensors").string()});
  CHECK(missing.status == 1);
  CHECK(one_error_line(missing, "serve"));
  // A file there but not loadable fails on the decoding loop's thread, after the server listens.
  const fs::path broken = dir / "broken.safetensors";
  std::ofstream(broken, std::ios::binary) << "not a checkpoint";
  Result unloadable = run("serve", {"--checkpoint", broken.string(), "--port", "0"});
  CHECK(unloadable.status == 1);
  CHECK(contains(unloadable.err, ", loading\nserve: "));
  CHECK(contains(unloadable.err, broken.string() + ": header length"));
  // A load that does not end (a FIFO nobody writes to: opening it waits), then SIGINT: serve stops
  // at once, status 0, rather than after the load.
  const fs::path endless = dir / "endless.safetensors";
  REQUIRE(::mkfifo(endless.c_str(), 0600) == 0);
  const fs::path loading_err = dir / "loading.err";
  const pid_t loading = start("serve", {"--checkpoint", endless.string(), "--port", "0"}, dir / "loading.out", loading_err);
  if (!eventually([&] { return contains(read_bytes(loading_err), ", loading\n"); })) {
    ::kill(loading, SIGKILL), ::waitpid(loading, nullptr, 0);
    FAIL("serve did not start loading: " << read_bytes(loading_err));
  }
  REQUIRE(::kill(loading, SIGINT) == 0);
  int raw = 0;
  const bool ended = eventually([&] { return ::waitpid(loading, &raw, WNOHANG) == loading; });
  if (!ended) ::kill(loading, SIGKILL), ::waitpid(loading, &raw, 0);
  CHECK_MESSAGE(ended, "serve did not stop within 10 s of SIGINT while loading");
  CHECK((ended && WIFEXITED(raw) && WEXITSTATUS(raw) == 0));
  CHECK(contains(read_bytes(loading_err), "serve: SIGINT while loading the checkpoint: stopped"));

  const fs::path out = dir / "serve.out", err = dir / "serve.err";
  const pid_t pid = start("serve", {"--checkpoint", ckpt.string(), "--port", "0", "--parallel", "4", "--threads", "1"},
                          out, err);
  const int port = port_of(err);
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(20);
  auto health = client.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  auto r = client.Post("/v1/completions", R"({"prompt": "The ", "max_tokens": 20, "seed": 7, "temperature": 0.8})",
                       "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  Result generated = run("generate", {"--checkpoint", ckpt.string(), "--prompt", "The ", "--max-new", "20", "--seed",
                                      "7", "--temperature", "0.8"});
  REQUIRE(generated.status == 0);
  CHECK("The " + json::parse(r->body)["choices"][0]["text"].get<std::string>() == generated.out);
  Result taken = run("serve", {"--checkpoint", ckpt.string(), "--port", std::to_string(port)});
  CHECK(taken.status == 1);  // a port in use is an error, never a second server sharing it
  CHECK(one_error_line(taken, "serve"));
  CHECK(contains(taken.err, "cannot listen on 127.0.0.1:"));

  REQUIRE(::kill(pid, SIGTERM) == 0);
  CHECK(wait_for(pid) == 0);
  CHECK(contains(read_bytes(err), "serve: SIGTERM: draining"));
}

TEST_CASE("serve picks up the checkpoints of a train_char run saving every few steps while a client generates") {
  // About a second: train_char's tiny run of 400 steps saves 20 times while requests go on.
  fs::path dir = work_dir("serve_training"), data = write_corpus(dir), ckpt = dir / "tiny.safetensors";
  REQUIRE(run("train_char", tiny(data, ckpt, 1)).status == 0);
  const fs::path out = dir / "serve.out", err = dir / "serve.err";
  const pid_t server = start("serve", {"--checkpoint", ckpt.string(), "--port", "0", "--threads", "1"}, out, err);
  const int port = port_of(err);
  const pid_t trainer = start("train_char",
                              tiny(data, ckpt, 400) + std::vector<std::string>{"--save-every", "20", "--eval-every", "0"},
                              dir / "train.out", dir / "train.err");
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(20);
  std::set<std::string> fingerprints;
  int answered = 0, failed = 0, training_status = -1;
  for (int i = 0; i < 5000; ++i) {  // bounded: train_char ends long before
    auto r = client.Post("/v1/completions", R"({"prompt": "The ", "max_tokens": 10, "seed": 1, "stream": true})",
                         "application/json");
    if (!r || r->status != 200) {
      ++failed;
    } else {
      StreamedCompletion c = parse_stream(r->body);
      ++answered;
      failed += !c.done || c.text[0].size() != 10;
      fingerprints.insert(c.fingerprints.begin(), c.fingerprints.end());
    }
    int raw = 0;
    if (::waitpid(trainer, &raw, WNOHANG) == trainer) {
      training_status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
      break;
    }
  }
  if (training_status == -1) training_status = wait_for(trainer);
  CHECK(training_status == 0);
  CHECK(failed == 0);
  CHECK(answered > 0);
  // The final checkpoint is served once the server has seen it; its text is generate's.
  std::string last;
  eventually([&] {
    auto models = client.Get("/v1/models");
    return models && json::parse(models->body)["data"][0]["step"] == 400;
  });
  auto r = client.Post("/v1/completions", R"({"prompt": "The ", "max_tokens": 10, "seed": 1})", "application/json");
  REQUIRE(r);
  const json body = json::parse(r->body);
  CHECK(body["system_fingerprint"].get<std::string>().starts_with("fp_400_"));
  fingerprints.insert(body["system_fingerprint"].get<std::string>());
  CHECK(fingerprints.size() >= 2);  // the weights changed under the client
  CHECK(body["choices"][0]["text"] == reference_texts(ckpt, "The ", {}, 10, 1)[0]);
  MESSAGE(answered << " requests answered during training, " << fingerprints.size() << " weights seen");
  REQUIRE(::kill(server, SIGTERM) == 0);
  CHECK(wait_for(server) == 0);
  CHECK(!contains(read_bytes(err), "could not be loaded"));  // atomic saves: never a half-written file
}
