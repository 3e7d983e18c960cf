// The HTTP side of bench_serve: build/serve started as a child process on a free loopback port,
// and a client of its OpenAI-style completions (whole answers and server-sent event streams, with
// time to first token and hang-ups on purpose) and of its /metrics.
#pragma once

#include <arpa/inet.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/child_process.h"

namespace tapegrad::bench {

using Clock = std::chrono::steady_clock;

/// Seconds since start.
inline double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// A loopback port nobody listens on now (bound, read, released).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0)
    throw std::runtime_error("cannot find a free loopback port");
  ::close(fd);
  return ntohs(address.sin_port);
}

/// A server program as a child process, its stdout and stderr in one log file; SIGTERM (then a
/// bounded wait) on destruction.
class ServerProcess {
 public:
  ServerProcess(const std::filesystem::path& program, const std::vector<std::string>& args,
                const std::filesystem::path& log) {
    std::vector<std::string> argv = {program.string()};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = test::start_process(std::move(argv), {.out = log, .environment = test::environment_without({})});
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { stop(); }

  pid_t pid() const { return pid_; }
  /// Whether it still runs (when it has ended, stop() returns its status).
  bool running() {
    if (pid_ <= 0) return false;
    if (auto status = test::exited(pid_)) {
      status_ = *status, pid_ = -1;
      return false;
    }
    return true;
  }

  /// SIGTERM, then up to 30 s to drain and exit (SIGKILL after); returns the exit status.
  int stop() {
    if (pid_ > 0) status_ = test::end_process(pid_, std::chrono::seconds(30));
    pid_ = -1;
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

/// One completion as its client saw it.
struct Answer {
  int status = 0;                     // the HTTP status; 0: no answer (the transport failed)
  std::string error;                  // the transport error or the error body
  std::string id;                     // the completion's id
  std::map<std::size_t, std::string> texts;   // by choice index
  std::map<std::size_t, std::string> finish;  // finish_reason by choice index
  std::size_t finishes = 0;           // finish_reasons seen: more than the choices is an answer given twice
  std::size_t done_events = 0;        // "data: [DONE]" lines: a stream has exactly one
  std::size_t completion_tokens = 0;  // usage.completion_tokens
  bool hung_up = false;               // the client closed the connection on purpose
  double ttft = -1, last_token = -1;  // seconds after sending: the first and the last text
  std::size_t tokens_seen = 0;        // characters received
};

/// The number of code points of UTF-8 text (a token is a character).
inline std::size_t code_points(const std::string& text) {
  return std::size_t(std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

/// Reads one completion's JSON (a whole answer or one stream chunk) into answer.
inline void take_completion(const nlohmann::json& body, Answer& answer, Clock::time_point start) {
  if (body.contains("error")) {
    answer.error = body.dump();
    return;
  }
  if (answer.id.empty()) answer.id = body.value("id", "");
  else if (body.value("id", "") != answer.id) answer.error = "chunks of one stream carry different ids";
  for (const nlohmann::json& choice : body.value("choices", nlohmann::json::array())) {
    const std::size_t index = choice.value("index", std::size_t(0));
    const std::string text = choice.value("text", "");
    if (!text.empty()) {
      if (answer.ttft < 0) answer.ttft = since(start);
      answer.last_token = since(start);
      answer.tokens_seen += code_points(text);
      answer.texts[index] += text;
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      answer.finish[index] = choice["finish_reason"];
      ++answer.finishes;
    }
  }
  if (body.contains("usage") && body["usage"].is_object())
    answer.completion_tokens = body["usage"].value("completion_tokens", std::size_t(0));
}

/// Sends one completion request and reads its answer: server-sent events when the body asks
/// for a stream (hanging up after hang_up_after text chunks when that is not 0), else one JSON.
inline Answer complete(httplib::Client& client, const nlohmann::json& body, std::size_t hang_up_after = 0) {
  Answer answer;
  const auto start = Clock::now();
  const bool stream = body.value("stream", false);
  std::string pending, whole;
  std::size_t text_chunks = 0;
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = body.dump();
  request.set_header("Content-Type", "application/json");
  request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
    if (!stream || answer.status != 200) {
      whole.append(data, size);
      return true;
    }
    pending.append(data, size);
    for (std::size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;  // comments and other fields
      const std::string data = event.substr(6);
      if (data == "[DONE]") {
        ++answer.done_events;
        continue;
      }
      const std::size_t before = answer.tokens_seen;
      take_completion(nlohmann::json::parse(data), answer, start);
      if (answer.tokens_seen > before && hang_up_after && ++text_chunks >= hang_up_after) {
        answer.hung_up = true;
        return false;  // httplib closes the connection
      }
    }
    return true;
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  // The status is known before the body's first byte reaches the receiver.
  request.response_handler = [&](const httplib::Response& r) {
    answer.status = r.status;
    return true;
  };
  try {
    if (!client.send(request, response, error) && !answer.hung_up) {
      answer.error = "transport: " + httplib::to_string(error);
      return answer;
    }
    answer.status = response.status ? response.status : answer.status;
    if (answer.status != 200) answer.error = whole.empty() ? response.body : whole;
    else if (!stream) take_completion(nlohmann::json::parse(whole.empty() ? response.body : whole), answer, start);
  } catch (const std::exception& e) {
    answer.error = std::string("bad answer: ") + e.what();
  }
  return answer;
}

/// The metrics lines that are not histogram buckets, as {"name{labels}": value}.
inline nlohmann::json metrics_of(httplib::Client& client) {
  nlohmann::json out = nlohmann::json::object();
  auto result = client.Get("/metrics");
  if (!result || result->status != 200) return out;
  std::istringstream in(result->body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line.find("_bucket") != std::string::npos) continue;
    const std::size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    try {
      out[line.substr(0, space)] = std::stod(line.substr(space + 1));
    } catch (const std::exception&) {
    }
  }
  return out;
}

/// A keep-alive client of host:port with bench_serve's timeouts.
inline httplib::Client make_client(const std::string& host, int port) {
  httplib::Client client(host, port);
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);
  client.set_read_timeout(120, 0);
  client.set_connection_timeout(10, 0);
  return client;
}

}  // namespace tapegrad::bench
