// The server's endpoints and errors over HTTP, in process on an ephemeral loopback port: OpenAI's
// shapes, streams that never split a character, and every error of the contract with its body.
#include <doctest/doctest.h>

#include <sched.h>

#include <filesystem>
#include <fstream>
#include <future>

#include "core/kernels.h"
#include "serve/cpus.h"
#include "serve/server.h"
#include "serve_helpers.h"
#include "support/helpers.h"
#include "tokenizers/char_tokenizer.h"
#include "tokenizers/utf8.h"

using namespace tapegrad;
using namespace tapegrad::test;
using nlohmann::json;

namespace {

json error_of(const httplib::Result& r, int status) {
  REQUIRE(r);
  CHECK(r->status == status);
  CHECK(r->get_header_value("Content-Type") == "application/json");
  const json body = json::parse(r->body);
  REQUIRE(body.contains("error"));
  for (const char* key : {"message", "type", "param", "code"}) CHECK_MESSAGE(body["error"].contains(key), key);
  return body["error"];
}

// This process's threads: their ids and names.
std::vector<std::pair<pid_t, std::string>> process_threads() {
  std::vector<std::pair<pid_t, std::string>> threads;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm_file(task.path() / "comm");
    std::string comm;
    std::getline(comm_file, comm);
    threads.emplace_back(std::stoi(task.path().filename().string()), comm);
  }
  return threads;
}

}  // namespace

TEST_CASE("serve answers /health, /v1/models, /metrics and the playground page") {
  ServeDir dir("endpoints");
  write_tiny_checkpoint(dir.path / "tiny.safetensors", 1, "rotary", 42);
  TestServer s(test_options(dir.path / "tiny.safetensors"));
  httplib::Client client = s.client();

  auto health = client.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(json::parse(health->body) == json{{"status", "ok"}});

  auto models = client.Get("/v1/models");
  REQUIRE(models);
  CHECK(models->status == 200);
  const json list = json::parse(models->body);
  CHECK(list["object"] == "list");
  REQUIRE(list["data"].size() == 1);
  const json& model = list["data"][0];
  CHECK(model["id"] == "tiny");
  CHECK(model["object"] == "model");
  CHECK(model["arch"] == "rotary");
  CHECK(model["vocab_size"] == tokenizers::CharTokenizer::from_text(kServeVocab).size());
  CHECK(model["max_len"] == 64);
  CHECK(model["d_model"] == 16);
  CHECK(model["n_blocks"] == 1);
  CHECK(model["step"] == 42);
  CHECK(model["parameters"].get<std::size_t>() > 0);
  CHECK(model["system_fingerprint"].get<std::string>().starts_with("fp_42_"));

  auto page = client.Get("/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK(page->get_header_value("Content-Type") == "text/html; charset=utf-8");
  CHECK(page->body == serve::playground_html());
  CHECK(contains(page->body, "/v1/completions"));

  REQUIRE(client.Post("/v1/completions", R"({"prompt": "ab", "max_tokens": 5, "seed": 1})", "application/json"));
  auto metrics = client.Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->status == 200);
  CHECK(metrics->get_header_value("Content-Type").starts_with("text/plain; version=0.0.4"));
  metrics_with(client, "tapegrad_requests_running", 0);
  const std::string text = metrics_with(client, "tapegrad_requests_total{status=\"200\"}", 1);
  CHECK(metric(text, "tapegrad_requests_total{status=\"200\"}") == 1);
  CHECK(metric(text, "tapegrad_prompt_tokens_total") == 2);
  CHECK(metric(text, "tapegrad_completion_tokens_total") == 5);
  CHECK(metric(text, "tapegrad_requests_running") == 0);
  CHECK(metric(text, "tapegrad_requests_waiting") == 0);
  CHECK(metric(text, "tapegrad_decode_steps_total") >= 4);  // the first token comes from the prefill
  CHECK(metric(text, "tapegrad_sequences_per_step_count") == metric(text, "tapegrad_decode_steps_total"));
  CHECK(metric(text, "tapegrad_time_to_first_token_seconds_count") == 1);
  CHECK(metric(text, "tapegrad_time_per_token_seconds_count") == 4);
  CHECK(metric(text, "tapegrad_checkpoint_reload_failures_total") == 0);
  CHECK(contains(text, "# TYPE tapegrad_time_per_token_seconds histogram\n"));
  CHECK(contains(text, "tapegrad_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n"));
}

TEST_CASE("the HTTP workers run under SCHED_BATCH, so that their wake-ups never preempt the decoding thread") {
  ServeDir dir("batch");
  write_tiny_checkpoint(dir.path / "tiny.safetensors", 1, "rotary", 1);
  TestServer s(test_options(dir.path / "tiny.safetensors"));
  httplib::Client client = s.client();
  REQUIRE(client.Post("/v1/completions", R"({"prompt": "ab", "max_tokens": 2})", "application/json"));
  std::size_t batch = 0, decoding = 0;
  for (const auto& [thread, comm] : process_threads()) {
    const int policy = sched_getscheduler(thread);
    if (comm == "serve-decode") {
      ++decoding;
      CHECK(policy == sched_getscheduler(0));  // the test's own policy, which it inherited
    }
    if (policy == SCHED_BATCH) ++batch;
  }
  CHECK(decoding == 1);
  CHECK(batch >= 1);  // the worker that answered, at least
}

namespace {

std::vector<int> cpus_of(pid_t thread) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  REQUIRE(sched_getaffinity(thread, sizeof set, &set) == 0);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

}  // namespace

TEST_CASE("split_cpus: the decoding gets the first CPUs when one is left over for the rest, else nothing changes") {
  const serve::CpuSplit two = serve::split_cpus({0, 1}, 1);
  CHECK(two.decoding == std::vector{0});
  CHECK(two.others == std::vector{1});
  const serve::CpuSplit four = serve::split_cpus({2, 5, 7, 9}, 2);
  CHECK(four.decoding == std::vector{2, 5});
  CHECK(four.others == std::vector{7, 9});
  for (std::size_t threads : {0, 2, 3}) {
    const serve::CpuSplit none = serve::split_cpus({0, 1}, threads);
    CHECK(none.decoding.empty());
    CHECK(none.others.empty());
  }
  CHECK(serve::allowed_cpus() == cpus_of(0));
}

TEST_CASE("pin_cpus: the decoding thread runs on CPUs of its own and the HTTP workers on the others") {
  const std::vector<int> allowed = serve::allowed_cpus();
  REQUIRE(!allowed.empty());
  struct OneThread {  // one decoding thread, so that a CPU is left over wherever there are two
    int saved = num_threads();
    OneThread() { set_num_threads(1); }
    ~OneThread() { set_num_threads(saved); }
  } one_thread;
  const serve::CpuSplit split = serve::split_cpus(allowed, 1);
  INFO("allowed CPUs: ", allowed.size(), " (on one CPU nothing is pinned and every thread keeps it)");
  ServeDir dir("pinned");
  write_tiny_checkpoint(dir.path / "tiny.safetensors", 1, "rotary", 1);
  serve::ServerOptions options = test_options(dir.path / "tiny.safetensors");
  options.pin_cpus = true;
  TestServer s(options);
  httplib::Client client = s.client();
  REQUIRE(client.Post("/v1/completions", R"({"prompt": "ab", "max_tokens": 2})", "application/json"));
  std::size_t decoding = 0, workers = 0;
  for (const auto& [thread, comm] : process_threads()) {
    if (comm == "serve-decode") {
      ++decoding;
      CHECK(cpus_of(thread) == (split.decoding.empty() ? allowed : split.decoding));
    } else if (sched_getscheduler(thread) == SCHED_BATCH) {
      ++workers;
      CHECK(cpus_of(thread) == (split.others.empty() ? allowed : split.others));
    }
  }
  CHECK(decoding == 1);
  CHECK(workers >= 1);  // the worker that answered, at least
}

TEST_CASE("/health is 503 while the checkpoint loads, after the server listens, and 200 once it has") {
  ServeDir dir("loading");
  const fs::path ckpt = dir.path / "tiny.safetensors";
  write_tiny_checkpoint(ckpt, 5);
  serve::ServerOptions options = test_options(ckpt);
  std::promise<void> release;
  options.scheduler.load = [loadable = release.get_future().share()](const std::string& path) {
    loadable.wait_for(std::chrono::seconds(20));  // bounded: a failing test cannot hang
    return serve::load_weights(path);
  };
  TestServer s(options, /*wait_loaded=*/false);
  httplib::Client client = s.client();

  auto health = client.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 503);
  CHECK(json::parse(health->body) == json{{"status", "loading"}});
  auto check_loading = [](const httplib::Result& r) {
    const json e = error_of(r, 503);
    CHECK(r->get_header_value("Retry-After") == "1");
    CHECK(e["code"] == "loading");
    CHECK(contains(e["message"], "the model is loading"));
  };
  check_loading(client.Post("/v1/completions", R"({"prompt": "ab", "max_tokens": 5})", "application/json"));
  check_loading(client.Get("/v1/models"));
  auto metrics = client.Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->status == 200);
  auto page = client.Get("/");
  REQUIRE(page);
  CHECK(page->status == 200);

  release.set_value();
  CHECK(s.server.scheduler().wait_loaded()->fingerprint.starts_with("fp_0_"));
  health = client.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(json::parse(health->body) == json{{"status", "ok"}});
  auto r = client.Post("/v1/completions", R"({"prompt": "ab", "max_tokens": 5, "seed": 3, "temperature": 0})",
                       "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(json::parse(r->body)["choices"][0]["text"] == reference_texts(ckpt, "ab", {.temperature = 0}, 5, 3)[0]);
}

TEST_CASE("a first load that fails: /health 503 load_failed and requests 500 naming the error, not 'loading'") {
  ServeDir dir("load_failed");
  const fs::path ckpt = dir.path / "tiny.safetensors";
  write_tiny_checkpoint(ckpt, 5);
  serve::ServerOptions options = test_options(ckpt);
  options.scheduler.load = [](const std::string& path) -> std::shared_ptr<const serve::Weights> {
    throw std::runtime_error(path + ": a forged header");
  };
  TestServer s(options, /*wait_loaded=*/false);
  CHECK_THROWS_WITH(s.server.scheduler().wait_loaded(), doctest::Contains("a forged header"));
  httplib::Client client = s.client();
  auto health = client.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 503);
  CHECK(json::parse(health->body) == json{{"status", "load_failed"}});
  auto check_failed = [](const httplib::Result& r) {
    const json e = error_of(r, 500);
    CHECK(e["code"] == "load_failed");
    CHECK(contains(e["message"], "the model could not be loaded: "));
    CHECK(contains(e["message"], "a forged header"));
    CHECK(!r->has_header("Retry-After"));
  };
  check_failed(client.Post("/v1/completions", R"({"prompt": "ab", "max_tokens": 5})", "application/json"));
  check_failed(client.Get("/v1/models"));
}

TEST_CASE("/v1/completions answers OpenAI's shape, with usage, stop strings, echo and n samples") {
  ServeDir dir("completions");
  const fs::path ckpt = dir.path / "tiny.safetensors";
  write_tiny_checkpoint(ckpt, 2);
  TestServer s(test_options(ckpt));
  httplib::Client client = s.client();
  const nn::SamplingOptions warm{.temperature = 1.5f};

  auto r = client.Post("/v1/completions", R"({"prompt": "the ", "max_tokens": 12, "seed": 5, "temperature": 1.5})",
                       "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  const json body = json::parse(r->body);
  CHECK(body["object"] == "text_completion");
  CHECK(body["id"].get<std::string>().starts_with("cmpl-"));
  CHECK(body["model"] == "tiny");
  CHECK(body["created"].is_number_integer());
  CHECK(body["system_fingerprint"].get<std::string>().starts_with("fp_0_"));
  REQUIRE(body["choices"].size() == 1);
  CHECK(body["choices"][0]["index"] == 0);
  CHECK(body["choices"][0]["finish_reason"] == "length");
  CHECK(body["choices"][0]["text"] == reference_texts(ckpt, "the ", warm, 12, 5)[0]);
  CHECK(body["usage"] == json{{"prompt_tokens", 4}, {"completion_tokens", 12}, {"total_tokens", 16}});

  SUBCASE("n samples: sample i is seed + i's text") {
    auto many = client.Post("/v1/completions", R"({"prompt": "ab", "max_tokens": 9, "seed": 3, "n": 3,
                                                   "temperature": 1.5})",
                            "application/json");
    REQUIRE(many);
    const json b = json::parse(many->body);
    const auto expected = reference_texts(ckpt, "ab", warm, 9, 3, 3);
    REQUIRE(b["choices"].size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(b["choices"][i]["index"] == i);
      CHECK(b["choices"][i]["text"] == expected[i]);
    }
    CHECK(b["usage"]["completion_tokens"] == 27);
  }
  SUBCASE("echo puts the prompt first") {
    auto echoed = client.Post("/v1/completions", R"({"prompt": "ab", "max_tokens": 6, "seed": 4, "echo": true,
                                                     "temperature": 1.5})",
                              "application/json");
    REQUIRE(echoed);
    CHECK(json::parse(echoed->body)["choices"][0]["text"] == "ab" + reference_texts(ckpt, "ab", warm, 6, 4)[0]);
  }
  SUBCASE("a stop string ends the text before it, with finish_reason stop") {
    // Find a seed whose text holds a character to stop at, then stop at it.
    std::string full;
    std::uint64_t seed = 0;
    for (; seed < 50; ++seed) {
      full = reference_texts(ckpt, "ab", warm, 20, seed)[0];
      if (full.find(' ') != std::string::npos && full.find(' ') > 0) break;
    }
    REQUIRE(full.find(' ') != std::string::npos);
    for (bool stream : {false, true}) {
      const json request = {{"prompt", "ab"}, {"max_tokens", 20}, {"seed", seed}, {"temperature", 1.5},
                            {"stop", json::array({" ", "zzz"})}, {"stream", stream}};
      auto stopped = client.Post("/v1/completions", request.dump(), "application/json");
      REQUIRE(stopped);
      if (!stream) {
        const json b = json::parse(stopped->body);
        CHECK(b["choices"][0]["text"] == full.substr(0, full.find(' ')));
        CHECK(b["choices"][0]["finish_reason"] == "stop");
      } else {
        StreamedCompletion c = parse_stream(stopped->body);
        CHECK(c.text[0] == full.substr(0, full.find(' ')));
        CHECK(c.finish_reason[0] == "stop");
      }
    }
  }
}

TEST_CASE("a stream sends the text as server-sent events, never splitting a character, then [DONE]") {
  ServeDir dir("stream");
  const fs::path ckpt = dir.path / "tiny.safetensors";
  write_tiny_checkpoint(ckpt, 3, "gpt2");
  TestServer s(test_options(ckpt));
  httplib::Client client = s.client();
  // Greedy, a token a character: the characters of 2, 3 and 4 bytes come up at a high temperature.
  auto r = client.Post("/v1/completions", R"({"prompt": "\u00e9a", "max_tokens": 60, "seed": 11, "temperature": 2,
                                             "stream": true, "stream_options": {"include_usage": true}, "n": 2})",
                       "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->get_header_value("Content-Type") == "text/event-stream");
  StreamedCompletion c = parse_stream(r->body);
  CHECK(c.done);
  CHECK(c.ids.size() == 1);  // every chunk of one completion has its id
  CHECK(c.fingerprints.size() == 1);
  const auto expected = reference_texts(ckpt, "\xc3\xa9" "a", {.temperature = 2}, 60, 11, 2);
  CHECK(c.text[0] == expected[0]);
  CHECK(c.text[1] == expected[1]);
  CHECK(c.finish_reason[0] == "length");
  CHECK(c.finish_reason[1] == "length");
  CHECK(c.usage == json{{"prompt_tokens", 2}, {"completion_tokens", 120}, {"total_tokens", 122}});
  bool multibyte = false;
  for (const std::string& piece : c.pieces) {
    CHECK_NOTHROW(tokenizers::decode_utf8(piece));  // whole characters in every chunk
    for (char byte : piece) multibyte = multibyte || (byte & 0x80);
  }
  CHECK(multibyte);
  // The last event before [DONE] carries the usage and no choices; the body ends with [DONE].
  CHECK(r->body.ends_with("data: [DONE]\n\n"));
}

TEST_CASE("every error of the contract has its status and OpenAI's error body") {
  ServeDir dir("errors");
  const fs::path ckpt = dir.path / "tiny.safetensors";
  write_tiny_checkpoint(ckpt, 4);
  serve::ServerOptions options = test_options(ckpt);
  options.body_limit = 2000;
  options.api_key = "secret";
  TestServer s(options);
  httplib::Client client = s.client();
  httplib::Client authorized = s.client();
  authorized.set_default_headers({{"Authorization", "Bearer secret"}});
  auto post = [&](httplib::Client& c, const std::string& body) {
    return c.Post("/v1/completions", body, "application/json");
  };

  json e = error_of(post(client, R"({"prompt": "ab"})"), 401);
  CHECK(e["code"] == "invalid_api_key");
  CHECK(contains(e["message"], "an API key is required"));
  httplib::Client wrong = s.client();
  wrong.set_default_headers({{"Authorization", "Bearer guess"}});
  CHECK(contains(error_of(post(wrong, R"({"prompt": "ab"})"), 401)["message"], "the API key is wrong"));
  error_of(wrong.Get("/v1/models"), 401);
  auto health = client.Get("/health");  // outside /v1/: no key needed
  REQUIRE(health);
  CHECK(health->status == 200);

  e = error_of(post(authorized, R"({"prompt": "ab")"), 400);
  CHECK(contains(e["message"], "not valid JSON"));
  e = error_of(post(authorized, R"({"prompt": "ab", "max_tokens": "many"})"), 400);
  CHECK(e["param"] == "max_tokens");
  e = error_of(post(authorized, R"({"prompt": "ab", "top_p": 1.5})"), 400);
  CHECK(e["param"] == "top_p");
  e = error_of(post(authorized, R"({"prompt": "ab\u00fc#\u00fc"})"), 400);
  CHECK(e["code"] == "unknown_characters");
  CHECK(contains(e["message"], "'\xc3\xbc' (U+00FC), '#'"));
  e = error_of(post(authorized, R"({"prompt": "abcdefghij", "max_tokens": 60})"), 400);
  CHECK(e["code"] == "context_length_exceeded");
  CHECK(contains(e["message"], "the prompt has 10 characters and max_tokens is 60: 70 in all, more than the "
                               "model's max_len of 64"));
  e = error_of(post(authorized, R"({"prompt": "ab", "n": 5})"), 400);
  CHECK(e["param"] == "n");
  e = error_of(post(authorized, fmt::format(R"({{"prompt": "{}"}})", std::string(3000, 'a'))), 413);
  CHECK(e["code"] == "request_too_large");
  CHECK(contains(e["message"], "limit of 2000 bytes"));
  e = error_of(authorized.Get("/v1/nothing"), 404);
  CHECK(e["code"] == "not_found");

  metrics_with(client, "tapegrad_requests_total{status=\"400\"}", 6);
  metrics_with(client, "tapegrad_requests_total{status=\"401\"}", 2);
  const std::string text = metrics_with(client, "tapegrad_requests_total{status=\"413\"}", 1);
  CHECK(metric(text, "tapegrad_requests_total{status=\"400\"}") == 6);
  CHECK(metric(text, "tapegrad_requests_total{status=\"401\"}") == 2);
  CHECK(metric(text, "tapegrad_requests_total{status=\"413\"}") == 1);
  // The errors disturbed nothing: a good request still gets generate's text.
  auto fine = post(authorized, R"({"prompt": "ab", "max_tokens": 5, "seed": 2, "temperature": 0})");
  REQUIRE(fine);
  CHECK(fine->status == 200);
  CHECK(json::parse(fine->body)["choices"][0]["text"] == reference_texts(ckpt, "ab", {.temperature = 0}, 5, 2)[0]);
}
