// The decoding loop seen through HTTP: determinism under concurrency, the bounded queue,
// cancellation of a client that hangs up, draining, and live weights.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "nn/architecture.h"
#include "serve/hangup_watch.h"
#include "tokenizers/utf8.h"
#include "tokenizers/utf8_stream.h"
#include "serve_helpers.h"
#include "support/helpers.h"

using namespace tapegrad;
using namespace tapegrad::test;
using nlohmann::json;

TEST_CASE("32 concurrent requests of different lengths and settings each get generate's text, both architectures") {
  for (const char* arch : {"rotary", "gpt2"}) {
    CAPTURE(arch);
    ServeDir dir(std::string("determinism_") + arch);
    const fs::path ckpt = dir.path / "tiny.safetensors";
    write_tiny_checkpoint(ckpt, 5, arch);
    serve::ServerOptions options = test_options(ckpt);
    options.scheduler.parallel = 8;
    options.scheduler.queue = 32;
    options.scheduler.prefill_chunk = 5;  // prompts of up to 30 characters prefill in up to 6 chunks
    TestServer s(options);

    struct Case {
      std::string prompt;
      nn::SamplingOptions sampling;
      std::size_t max_tokens, n;
      std::uint64_t seed;
      bool stream;
      std::vector<std::string> expected;
      std::vector<std::string> got;
    };
    std::vector<Case> cases;
    const std::string letters = "the cat sat on a mat and ran to the dog";
    const float temperatures[] = {0.0f, 0.7f, 1.0f, 1.6f};
    for (std::size_t i = 0; i < 32; ++i) {
      Case c;
      c.prompt = letters.substr(i % 7, 1 + (i * 7) % 30);
      c.sampling = {.temperature = temperatures[i % 4], .top_k = i % 3 == 0 ? 5u : 0u, .top_p = i % 5 == 0 ? 0.9f : 1.0f};
      c.max_tokens = 3 + (i * 11) % 30;
      c.n = i % 6 == 0 ? 2 : 1;
      c.seed = 1000 + i;
      c.stream = i % 2 == 1;
      c.expected = reference_texts(ckpt, c.prompt, c.sampling, c.max_tokens, c.seed, c.n);
      cases.push_back(c);
    }
    std::vector<std::thread> clients;
    for (Case& c : cases)
      clients.emplace_back([&s, &c] {
        httplib::Client client = s.client();
        const json body = {{"prompt", c.prompt}, {"max_tokens", c.max_tokens}, {"seed", c.seed},
                           {"temperature", c.sampling.temperature}, {"top_k", c.sampling.top_k},
                           {"top_p", c.sampling.top_p}, {"n", c.n}, {"stream", c.stream}};
        auto r = client.Post("/v1/completions", body.dump(), "application/json");
        if (!r || r->status != 200) {
          c.got.push_back(r ? r->body : "no answer: " + httplib::to_string(r.error()));
          return;
        }
        if (c.stream) {
          StreamedCompletion streamed = parse_stream(r->body);
          for (std::size_t i = 0; i < c.n; ++i) c.got.push_back(streamed.text[i]);
        } else {
          const json body = json::parse(r->body);
          for (const auto& choice : body["choices"]) c.got.push_back(choice["text"]);
        }
      });
    for (auto& t : clients) t.join();
    for (const Case& c : cases) {
      CAPTURE(c.prompt);
      CAPTURE(c.seed);
      CHECK_MESSAGE(c.got == c.expected, fmt::format("{} != {}", fmt::join(c.got, " | "), fmt::join(c.expected, " | ")));
    }
    // The requests did share their steps.
    auto metrics = s.client().Get("/metrics");
    REQUIRE(metrics);
    const double steps = metric(metrics->body, "tapegrad_decode_steps_total");
    const double sequences = metric(metrics->body, "tapegrad_sequences_per_step_sum");
    CHECK(sequences > steps);
  }
}

TEST_CASE("a full queue answers 503 with Retry-After; the waiting request runs when a sequence frees") {
  ServeDir dir("queue");
  const fs::path ckpt = dir.path / "tiny.safetensors";
  write_tiny_checkpoint(ckpt, 6);
  serve::ServerOptions options = test_options(ckpt);
  options.scheduler.parallel = 1;
  options.scheduler.queue = 1;
  TestServer s(options);
  s.gate.close();
  const std::string body = R"({"prompt": "ab", "max_tokens": 10, "seed": 1, "stream": true})";
  RawStream running(s.port(), body);
  REQUIRE(eventually([&] { return s.server.scheduler().running() == 1; }));
  RawStream waiting(s.port(), body);
  REQUIRE(eventually([&] { return s.server.scheduler().waiting() == 1; }));
  auto refused = s.client().Post("/v1/completions", body, "application/json");
  REQUIRE(refused);
  CHECK(refused->status == 503);
  CHECK(refused->get_header_value("Retry-After") == "1");
  const json error = json::parse(refused->body)["error"];
  CHECK(error["code"] == "queue_full");
  CHECK(contains(error["message"], "1 requests are already waiting (--queue 1)"));
  s.gate.open();
  CHECK(parse_stream(running.read_until("[DONE]")).text[0].size() == 10);
  CHECK(parse_stream(waiting.read_until("[DONE]")).text[0].size() == 10);
}

TEST_CASE("a client that hangs up, streaming or not, is cancelled and its sequence freed at the next step") {
  for (const bool stream : {true, false}) {
    CAPTURE(stream);
    ServeDir dir(stream ? "cancel_stream" : "cancel_whole");
    const fs::path ckpt = dir.path / "tiny.safetensors";
    write_tiny_checkpoint(ckpt, 7);
    TestServer s(test_options(ckpt));
    s.gate.close();
    {
      RawStream request(s.port(), fmt::format(R"({{"prompt": "ab", "max_tokens": 60, "seed": 1, "stream": {}}})", stream));
      REQUIRE(eventually([&] { return s.server.scheduler().running() == 1; }));
      s.gate.allow(3);
      if (stream) request.read_until("\"finish_reason\":null");
      REQUIRE(eventually([&] { return s.gate.passed() == 3 && s.gate.holding(); }));
      request.hang_up();
    }
    // The hang-up watch cancels the request at once (a whole answer's handler only waits, and a
    // stream would look at its socket only 10 ms later); the loop, held before its fourth pass,
    // frees the sequence when that pass ends.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    s.gate.allow(1);
    CHECK(eventually([&] { return s.server.scheduler().running() == 0; }, std::chrono::seconds(5)));
    CHECK(s.gate.passed() == 4);
    s.gate.open();
    auto client = s.client();
    const std::string metrics = metrics_with(client, "tapegrad_requests_running", 0);
    CHECK(metric(metrics, "tapegrad_requests_cancelled_total") == 1);
    CHECK(metric(metrics, "tapegrad_completion_tokens_total") == 0);  // it never finished
  }
}

TEST_CASE("HangupWatch cancels a watched job once its peer closes, wakes its waiters, and forgets unwatched sockets") {
  serve::HangupWatch hangups;
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
  auto job = std::make_shared<serve::Job>(serve::CompletionRequest{.prompt = "ab"}, std::vector<std::int32_t>{1, 2}, 0);
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    std::unique_lock lock(job->mutex);
    job->ended.wait_for(lock, std::chrono::seconds(10), [&] { return job->cancelled.load(); });
    woke = job->cancelled.load();
  });
  {
    serve::HangupWatch::Watch watch = hangups.watch(pair[0], job);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(!job->cancelled);  // nothing happened to the connection yet
    ::close(pair[1]);
    CHECK(eventually([&] { return job->cancelled.load(); }));
    waiter.join();
    CHECK(woke);
  }
  ::close(pair[0]);

  // A watch that has ended leaves its job alone, and a socket it cannot watch gives an idle one.
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
  auto other = std::make_shared<serve::Job>(serve::CompletionRequest{.prompt = "ab"}, std::vector<std::int32_t>{1, 2}, 0);
  { serve::HangupWatch::Watch watch = hangups.watch(pair[0], other); }
  { serve::HangupWatch::Watch none = hangups.watch(-1, other); }
  ::close(pair[1]);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(!other->cancelled);
  ::close(pair[0]);
}

TEST_CASE("connection_socket finds the socket connected to a request's peer, and -1 for a peer not connected") {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in address{.sin_family = AF_INET, .sin_port = 0, .sin_addr = {htonl(INADDR_LOOPBACK)}, .sin_zero = {}};
  socklen_t size = sizeof address;
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), size) == 0);
  REQUIRE(::listen(listener, 1) == 0);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size) == 0);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  sockaddr_in peer{};
  socklen_t peer_size = sizeof peer;
  const int served = ::accept(listener, reinterpret_cast<sockaddr*>(&peer), &peer_size);
  REQUIRE(served >= 0);
  // The server's side of the connection, as the HTTP library names its request's peer.
  CHECK(serve::connection_socket("127.0.0.1", ntohs(peer.sin_port)) == served);
  CHECK(serve::connection_socket("127.0.0.1", ntohs(peer.sin_port)) == served);  // the thread's last one, again
  CHECK(serve::connection_socket("127.0.0.2", ntohs(peer.sin_port)) == -1);
  for (int fd : {served, client, listener}) ::close(fd);
}

TEST_CASE("shutdown drains: no new requests, /health 503, the running stream finishes, then run returns") {
  ServeDir dir("drain");
  const fs::path ckpt = dir.path / "tiny.safetensors";
  write_tiny_checkpoint(ckpt, 8);
  TestServer s(test_options(ckpt));
  s.gate.close();
  RawStream stream(s.port(), R"({"prompt": "ab", "max_tokens": 20, "seed": 9, "stream": true})");
  REQUIRE(eventually([&] { return s.server.scheduler().running() == 1; }));
  std::jthread shutdown([&] { s.server.shutdown(); });
  REQUIRE(eventually([&] { return s.server.scheduler().draining(); }));
  httplib::Client client = s.client();
  auto health = client.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 503);
  auto refused = client.Post("/v1/completions", R"({"prompt": "ab"})", "application/json");
  REQUIRE(refused);
  CHECK(refused->status == 503);
  CHECK(json::parse(refused->body)["error"]["code"] == "draining");
  s.gate.open();
  StreamedCompletion finished = parse_stream(stream.read_until("[DONE]"));
  CHECK(finished.done);
  CHECK(finished.text[0] == reference_texts(ckpt, "ab", {}, 20, 9)[0]);
}

TEST_CASE("live weights: a replaced checkpoint serves new requests; a stream in flight finishes on its own") {
  ServeDir dir("live");
  const fs::path ckpt = dir.path / "tiny.safetensors", old_copy = dir.path / "old.safetensors",
                 next = dir.path / "next.safetensors";
  write_tiny_checkpoint(ckpt, 10, "rotary", 100);
  fs::copy_file(ckpt, old_copy);
  write_tiny_checkpoint(next, 11, "rotary", 200);
  TestServer s(test_options(ckpt));
  const std::string old_fingerprint = s.server.scheduler().weights()->fingerprint;
  CHECK(old_fingerprint.starts_with("fp_100_"));

  s.gate.close();
  RawStream stream(s.port(), R"({"prompt": "the", "max_tokens": 40, "seed": 4, "stream": true})");
  REQUIRE(eventually([&] { return s.server.scheduler().running() == 1; }));
  s.gate.allow(5);
  REQUIRE(eventually([&] { return s.gate.passed() == 5 && s.gate.holding(); }));
  fs::rename(next, ckpt);  // train_char's atomic save
  s.gate.open();
  REQUIRE(eventually([&] { return s.server.scheduler().weights()->fingerprint != old_fingerprint; }));
  const std::string new_fingerprint = s.server.scheduler().weights()->fingerprint;
  CHECK(new_fingerprint.starts_with("fp_200_"));

  StreamedCompletion in_flight = parse_stream(stream.read_until("[DONE]"));
  CHECK(in_flight.fingerprints == std::set<std::string>{old_fingerprint});
  CHECK(in_flight.text[0] == reference_texts(old_copy, "the", {}, 40, 4)[0]);

  auto fresh = s.client().Post("/v1/completions", R"({"prompt": "the", "max_tokens": 40, "seed": 4})",
                               "application/json");
  REQUIRE(fresh);
  const json body = json::parse(fresh->body);
  CHECK(body["system_fingerprint"] == new_fingerprint);
  CHECK(body["choices"][0]["text"] == reference_texts(ckpt, "the", {}, 40, 4)[0]);
  CHECK(body["choices"][0]["text"] != in_flight.text[0]);

  // A broken file keeps the current weights serving, reported in the metrics.
  {
    const fs::path broken = dir.path / "broken.tmp";
    std::ofstream(broken, std::ios::binary) << "not a checkpoint";
    fs::rename(broken, ckpt);
    REQUIRE(eventually([&] { return s.server.metrics().reload_failures() == 1; }));
    auto still = s.client().Post("/v1/completions", R"({"prompt": "the", "max_tokens": 5, "seed": 4})",
                                 "application/json");
    REQUIRE(still);
    CHECK(still->status == 200);
    CHECK(json::parse(still->body)["system_fingerprint"] == new_fingerprint);
    auto metrics = s.client().Get("/metrics");
    REQUIRE(metrics);
    CHECK(metric(metrics->body, "tapegrad_checkpoint_reload_failures_total") == 1);
    CHECK(metric(metrics->body, "tapegrad_checkpoint_reloads_total") == 1);
    CHECK(contains(metrics->body, "tapegrad_weights_info{system_fingerprint=\"" + new_fingerprint + "\"} 1"));
  }
}

namespace {

// A tokenizer whose tokens are pieces of characters: a character's bytes may come in two tokens,
// and a lone piece is a broken character.
class FragmentTokenizer : public tokenizers::Tokenizer {
 public:
  std::string kind() const override { return "fragments"; }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids;
    while (!text.empty()) {
      std::size_t best = kPieces.size();
      for (std::size_t i = 0; i < kPieces.size(); ++i)
        if (text.starts_with(kPieces[i]) && (best == kPieces.size() || kPieces[i].size() > kPieces[best].size()))
          best = i;
      if (best == kPieces.size()) throw std::invalid_argument("FragmentTokenizer: no piece for the text");
      ids.push_back(std::int32_t(best));
      text.remove_prefix(kPieces[best].size());
    }
    return ids;
  }
  std::string token_bytes(std::int32_t id) const override { return kPieces.at(std::size_t(id)); }
  std::size_t vocab_size() const override { return kPieces.size(); }
  std::map<std::string, std::string> to_metadata() const override { return {{"tokenizer", kind()}}; }

  inline static const std::vector<std::string> kPieces = {
      "a", "b", " ", "\xc3", "\xa9", "\xc3\xa9", "\xe2\x86", "\x92", "\xf0\x9f", "\x98\x80", "\xe2"};
};

}  // namespace

TEST_CASE("a token may end mid-character: the text holds its bytes back, never sends a broken character, and stop "
          "strings apply to whole characters") {
  const FragmentTokenizer fragments;
  const nn::ModelShape shape{.vocab = fragments.vocab_size(), .d_model = 16, .n_heads = 2, .n_blocks = 1,
                             .max_len = 64, .seed = 4};
  auto weights = std::make_shared<const serve::Weights>(
      serve::Weights{.model = nn::find_architecture("rotary").make(shape),
                     .tokenizer = std::make_shared<FragmentTokenizer>(),
                     .format = "test",
                     .fingerprint = "fp_fragments"});
  ServeDir dir("fragments");
  write_tiny_checkpoint(dir.path / "unused.safetensors", 1);  // the path the scheduler watches
  serve::ServerOptions options = test_options(dir.path / "unused.safetensors");
  options.scheduler.load = [weights](const std::string&) { return weights; };
  TestServer s(options);
  const std::vector<std::int32_t> prompt = fragments.encode("ab\xc3\xa9");
  std::size_t split_characters = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed)
    for (const std::vector<std::string>& stop : {std::vector<std::string>{}, {"\xc3\xa9"}, {"\xe2\x86\x92", "b"}}) {
      CAPTURE(seed);
      CAPTURE(stop.size());
      const std::vector<std::int32_t> tokens =
          nn::generate(weights->model, prompt, {.max_new = 40, .seed = seed}).tokens;
      std::string bytes;
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        bytes += fragments.token_bytes(tokens[i]);
        // A character whose bytes came in two tokens.
        if (i > 0 && (tokens[i - 1] == 3 && tokens[i] == 4)) ++split_characters;
      }
      std::string expected = tokenizers::replace_invalid_utf8(bytes);
      std::size_t cut = std::string::npos;
      for (const std::string& s : stop) cut = std::min(cut, expected.find(s));
      if (cut != std::string::npos) expected.resize(cut);
      const json body = {{"prompt", "ab\u00e9"}, {"max_tokens", 40}, {"seed", seed}, {"stop", stop}};
      httplib::Client client = s.client();
      auto whole = client.Post("/v1/completions", body.dump(), "application/json");
      REQUIRE(whole);
      REQUIRE_MESSAGE(whole->status == 200, whole->body);
      CHECK(json::parse(whole->body)["choices"][0]["text"] == expected);
      json streamed_body = body;
      streamed_body["stream"] = true;
      auto streamed = client.Post("/v1/completions", streamed_body.dump(), "application/json");
      REQUIRE(streamed);
      const StreamedCompletion stream = parse_stream(streamed->body);
      CHECK(stream.text.at(0) == expected);
      for (const std::string& piece : stream.pieces) CHECK_NOTHROW(tokenizers::decode_utf8(piece));
    }
  CHECK(split_characters > 0);  // the case the test is for did occur
}
