// Helpers of the serve tests: a tiny checkpoint written in process, a server on an ephemeral
// loopback port started and stopped in process (with a gate that holds its decoding loop at step
// boundaries), a raw socket to hang up mid-stream, the parsing of a server-sent event stream,
// and the text `generate` gives for the same settings (the reference of every determinism check).
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "nn/architecture.h"
#include "nn/checkpoint.h"
#include "nn/generate.h"
#include "nn/language_model.h"
#include "serve/server.h"
#include "support/programs.h"

namespace tapegrad::test {

namespace fs = std::filesystem;

/// The vocabulary of the tiny checkpoints: ASCII letters, and characters of 2, 3 and 4 bytes in UTF-8.
inline const std::string kServeVocab = "abcdefghijklmnopqrstuvwxyz ABC.,\n\xc3\xa9\xe2\x86\x92\xf0\x9f\x98\x80";

/// A folder of its own for one serve test, removed when it goes.
struct ServeDir {
  fs::path path;
  explicit ServeDir(const std::string& name)
      : path(fs::temp_directory_path() / fmt::format("tapegrad_test_serve_{}_{}", ::getpid(), name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ServeDir() { fs::remove_all(path); }
};

/// Writes (atomically) a tiny untrained model of architecture arch, its weights drawn from seed,
/// with metadata step = step; max_len 64; the characters of vocab.
inline void write_tiny_checkpoint(const fs::path& path, std::uint64_t seed, const std::string& arch = "rotary",
                                  std::uint64_t step = 0, const std::string& vocab = kServeVocab) {
  const tokenizers::CharTokenizer tokenizer = tokenizers::CharTokenizer::from_text(vocab);
  const nn::ModelShape shape{.vocab = tokenizer.size(), .d_model = 16, .n_heads = 2, .n_blocks = 1, .max_len = 64,
                             .seed = seed};
  const nn::LanguageModel model = nn::find_architecture(arch).make(shape);
  nn::CheckpointExtras extras;
  extras.metadata["step"] = std::to_string(step);
  nn::save_model_checkpoint(path.string(), model, tokenizer, extras);
}

/// The generated text of `generate` for each sample i (seed + i, decoded alone), cut at the first
/// stop string: what the server must answer.
inline std::vector<std::string> reference_texts(const fs::path& checkpoint, const std::string& prompt,
                                                const nn::SamplingOptions& sampling, std::size_t max_tokens,
                                                std::uint64_t seed, std::size_t n = 1,
                                                const std::vector<std::string>& stop = {}) {
  nn::LoadedModelCheckpoint loaded = nn::load_model_checkpoint(checkpoint.string());
  loaded.model.set_training(false);
  const std::vector<std::int32_t> ids = loaded.tokenizer->encode(prompt);
  std::vector<std::string> texts;
  for (std::size_t i = 0; i < n; ++i) {
    const nn::GenerateOptions options{.max_new = max_tokens, .sampling = sampling, .seed = seed + i};
    std::string text = loaded.tokenizer->decode(nn::generate(loaded.model, ids, options).tokens);
    std::size_t cut = std::string::npos;
    for (const std::string& s : stop) cut = std::min(cut, text.find(s));
    if (cut != std::string::npos) text.resize(cut);
    texts.push_back(text);
  }
  return texts;
}

/// Holds a decoding loop before its passes: open, every pass goes; closed, only the passes
/// allowed go (each waits at most 20 s, so a failing test cannot hang).
class StepGate {
 public:
  void close() {
    std::lock_guard lock(mutex_);
    open_ = false, allowed_ = 0;
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    changed_.notify_all();
  }
  /// Lets `steps` more passes go while closed.
  void allow(std::size_t steps) {
    {
      std::lock_guard lock(mutex_);
      allowed_ += steps;
    }
    changed_.notify_all();
  }
  /// Passes that have gone through the gate.
  std::size_t passed() const {
    std::lock_guard lock(mutex_);
    return passed_;
  }
  /// Whether the loop waits at the gate now.
  bool holding() const {
    std::lock_guard lock(mutex_);
    return holding_;
  }
  /// The hook for SchedulerOptions::before_step.
  void wait() {
    std::unique_lock lock(mutex_);
    holding_ = true;
    changed_.wait_for(lock, std::chrono::seconds(20), [&] { return open_ || allowed_ > 0; });
    holding_ = false;
    if (!open_ && allowed_ > 0) --allowed_;
    ++passed_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = true, holding_ = false;
  std::size_t allowed_ = 0, passed_ = 0;
};

/// Options for a test server: an ephemeral loopback port, 4 sequences, short drain and poll.
inline serve::ServerOptions test_options(const fs::path& checkpoint) {
  serve::ServerOptions options;
  options.checkpoint = checkpoint.string();
  options.port = 0;
  options.scheduler.parallel = 4;
  options.scheduler.queue = 16;
  options.scheduler.poll = std::chrono::milliseconds(5);
  options.drain_timeout = std::chrono::seconds(5);
  return options;
}

/// A server running in this process on its own thread, its weights loaded unless told not to
/// wait for them, shut down (drained) when it goes. Its decoding loop passes through `gate` (open
/// unless a test closes it).
struct TestServer {
  StepGate gate;
  serve::Server server;
  std::thread thread;

  explicit TestServer(serve::ServerOptions options, bool wait_loaded = true)
      : server(with_gate(std::move(options), gate)) {
    thread = std::thread([this] { server.run(); });
    if (!wait_loaded) return;
    try {
      server.scheduler().wait_loaded();
    } catch (...) {  // a joinable thread must not be destroyed: stop it before the error goes on
      gate.open();
      server.shutdown();
      thread.join();
      throw;
    }
  }
  ~TestServer() {
    gate.open();
    server.shutdown();
    thread.join();
  }
  int port() const { return const_cast<serve::Server&>(server).port(); }
  /// A client of this server (timeouts of 20 s: a failing test cannot hang).
  httplib::Client client() const {
    httplib::Client client("127.0.0.1", port());
    client.set_read_timeout(20);
    client.set_write_timeout(20);
    client.set_connection_timeout(5);
    return client;
  }

 private:
  static serve::ServerOptions with_gate(serve::ServerOptions options, StepGate& gate) {
    options.scheduler.before_step = [&gate] { gate.wait(); };
    return options;
  }
};

/// Polls condition every millisecond for up to `limit`; returns whether it became true.
template <class Condition>
bool eventually(Condition condition, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// The port a started serve program listens on, from its first line on stderr ("... on
/// http://host:port/"), waited for with its weights loaded ("serve: ready").
inline int port_of(const fs::path& err) {
  int port = 0;
  eventually([&] {
    std::smatch m;
    const std::string text = read_bytes(err);
    if (text.find("serve: ready") != std::string::npos &&
        std::regex_search(text, m, std::regex("http://127\\.0\\.0\\.1:([0-9]+)/")))
      port = std::stoi(m[1]);
    return port != 0;
  });
  REQUIRE_MESSAGE(port != 0, "serve printed no address, or never got ready: " << read_bytes(err));
  return port;
}

/// A POST /v1/completions over a plain socket, to read part of a stream and hang up.
class RawStream {
 public:
  RawStream(int port, const std::string& body) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    timeval timeout{.tv_sec = 10, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(std::uint16_t(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    const std::string request = fmt::format(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: {}\r\nConnection: close\r\n\r\n{}",
        body.size(), body);
    REQUIRE(::send(fd_, request.data(), request.size(), MSG_NOSIGNAL) == ssize_t(request.size()));
  }
  ~RawStream() { hang_up(); }
  /// Reads until the body contains marker (or 10 s pass, or the server closes); returns the
  /// body so far, its HTTP chunks put together.
  std::string read_until(const std::string& marker) {
    char buffer[4096];
    while (body().find(marker) == std::string::npos) {
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      received_.append(buffer, std::size_t(n));
    }
    return body();
  }
  /// The status line and headers received.
  std::string head() const { return received_.substr(0, received_.find("\r\n\r\n")); }
  /// The body received so far: the data of the whole chunks (chunked transfer encoding).
  std::string body() const {
    std::string out;
    std::size_t at = received_.find("\r\n\r\n");
    if (at == std::string::npos) return out;
    at += 4;
    for (;;) {
      const std::size_t line_end = received_.find("\r\n", at);
      if (line_end == std::string::npos) break;
      const std::size_t size = std::stoul(received_.substr(at, line_end - at), nullptr, 16);
      if (size == 0 || line_end + 2 + size > received_.size()) break;
      out += received_.substr(line_end + 2, size);
      at = line_end + 2 + size + 2;
    }
    return out;
  }
  /// Closes the connection, as a client that goes away does.
  void hang_up() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string received_;
};

/// A server-sent event stream of completion chunks, put back together.
struct StreamedCompletion {
  std::map<std::size_t, std::string> text;           ///< per choice index
  std::map<std::size_t, std::string> finish_reason;  ///< per choice index
  std::set<std::string> ids, fingerprints;
  std::vector<std::string> pieces;  ///< every chunk's text, in order
  nlohmann::json usage;             ///< the last chunk's, if any
  nlohmann::json error;             ///< an error event, if any
  bool done = false;                ///< ended with data: [DONE]
  std::size_t events = 0;
};

inline StreamedCompletion parse_stream(const std::string& body) {
  StreamedCompletion out;
  std::size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const std::size_t end = body.find("\n\n", at);
    REQUIRE_MESSAGE(end != std::string::npos, "an event without its blank line: " << body.substr(at));
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end + 2;
    ++out.events;
    if (data == "[DONE]") {
      out.done = true;
      continue;
    }
    const nlohmann::json chunk = nlohmann::json::parse(data);
    if (chunk.contains("error")) {
      out.error = chunk["error"];
      continue;
    }
    out.ids.insert(chunk.at("id").get<std::string>());
    out.fingerprints.insert(chunk.at("system_fingerprint").get<std::string>());
    if (chunk.contains("usage") && !chunk["usage"].is_null()) out.usage = chunk["usage"];
    for (const auto& choice : chunk.at("choices")) {
      const std::size_t index = choice.at("index").get<std::size_t>();
      out.text[index] += choice.at("text").get<std::string>();
      out.pieces.push_back(choice.at("text").get<std::string>());
      if (!choice.at("finish_reason").is_null()) out.finish_reason[index] = choice["finish_reason"].get<std::string>();
    }
  }
  return out;
}

/// A number from Prometheus text: the value of the line that starts with `series` and a space.
inline double metric(const std::string& text, const std::string& series) {
  const std::size_t at = text.find("\n" + series + " ");
  REQUIRE_MESSAGE(at != std::string::npos, series << " is not in the metrics:\n" << text);
  return std::stod(text.substr(at + series.size() + 2));
}

/// The /metrics text once `series` reads `value` (waited for up to 5 s; then the text as it is):
/// a request is counted just after its answer is sent (httplib's logger), and the decoding loop
/// updates its counts after the token that ends a request, so a client that has its answer may
/// otherwise read /metrics a moment early.
inline std::string metrics_with(httplib::Client& client, const std::string& series, double value) {
  std::string text;
  eventually(
      [&] {
        auto response = client.Get("/metrics");
        if (!response) return false;
        text = response->body;
        const std::size_t at = text.find("\n" + series + " ");
        return at != std::string::npos && std::stod(text.substr(at + series.size() + 2)) == value;
      },
      std::chrono::seconds(5));
  return text;
}

}  // namespace tapegrad::test
