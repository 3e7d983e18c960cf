// Server: the HTTP side of `serve` (cpp-httplib): OpenAI's /v1/completions and
// /v1/chat/completions (JSON or server-sent events), /v1/models, /health, /metrics in Prometheus
// text, and the playground page at /, in front of the decoding loop (serve/scheduler.h). httplib
// stays inside server.cpp.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "serve/metrics.h"
#include "serve/scheduler.h"

namespace tapegrad::serve {

/// The playground page (serve/playground.html, embedded at build time).
std::string_view playground_html();

/// What `serve` is started with.
struct ServerOptions {
  std::string checkpoint;              ///< a checkpoint file to serve (and watch for changes), or
  std::string model;                   ///< a published model (.gguf or a Hugging Face folder), loaded once
  /// "chatml", "llama3" or a template file, in place of the model's own (or for one without any).
  /// With it, or with a model, scheduler.load is load_weights or load_pretrained_weights.
  std::string chat_template;
  std::string lora;                    ///< a PEFT LoRA adapter folder applied on top of the model (nn/lora.h)
  std::string weights = "f32";         ///< how a model's matrices are held: nn::LoadOptions::weights
  std::string host = "127.0.0.1";      ///< the address to bind: loopback unless told otherwise
  int port = 8080;                     ///< 0: any free port (see Server::port())
  SchedulerOptions scheduler;          ///< sequences, queue, max_tokens cap
  std::string api_key;                 ///< if set, /v1/ requests need "Authorization: Bearer <key>"
  std::size_t body_limit = 1 << 20;    ///< the largest request body (bytes); larger is a 413
  std::chrono::milliseconds drain_timeout{30000};  ///< how long shutdown() lets requests finish
  /// Gives the decoding cores of its own when the process may run on more CPUs than the kernel
  /// threads (num_threads()): the decoding loop on the first of them, the HTTP workers on the
  /// rest (serve/cpus.h). Otherwise everything shares every CPU.
  bool pin_cpus = false;
};

/// An HTTP server bound to its port, serving a checkpoint or a published model.
class Server {
 public:
  /// Starts the decoding loop, which loads the checkpoint or model (/health says 503 "loading" until
  /// it has: Scheduler::wait_loaded), and binds the port; throws std::invalid_argument unless
  /// exactly one of options.checkpoint and options.model is given, std::runtime_error naming the
  /// file (if it does not exist) or the address.
  explicit Server(ServerOptions options);
  ~Server();  ///< shutdown(), then waits for run() to return if it runs on another thread.

  int port() const;  ///< The bound port.
  /// Serves until shutdown(); returns once every connection has been closed.
  void run();
  /// Drains: new requests get 503 and /health says 503; requests queued or running get up to
  /// options.drain_timeout to finish (then they end with a 503 error); then run() returns.
  void shutdown();

  Scheduler& scheduler();  ///< The decoding loop.
  Metrics& metrics();      ///< What /metrics reports.

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tapegrad::serve
