// serve: an OpenAI-compatible HTTP server for a checkpoint of any architecture or a published model
// (.gguf, Hugging Face folder), decoding many requests together (serve/). SIGTERM or SIGINT drains
// it: no new requests, the running ones finish (within --drain-timeout), then it exits 0; while
// the model is still loading it exits 0 at once.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "cli/loaded_model.h"
#include "cli/program.h"
#include "core/kernels.h"
#include "serve/server.h"

using namespace tapegrad;
using namespace tapegrad::examples;

int main(int argc, char** argv) {
  CLI::App app{"Serves a checkpoint or a published model over HTTP: OpenAI's /v1/completions and "
               "/v1/chat/completions (streamed or not), /v1/models, /health, /metrics and a playground page at /. "
               "A replaced checkpoint file is picked up while serving; a --model file is read once (it is not "
               "expected to change under a running server).",
               "serve"};
  serve::ServerOptions options;
  int threads = 0;
  double drain_seconds = 30;
  bool share_cores = false;
  auto* checkpoint =
      app.add_option("--checkpoint", options.checkpoint, "A checkpoint from train; watched for changes");
  app.add_option("--model", options.model,
                 "A published model: a .gguf file or a Hugging Face folder; loaded once, never reloaded")
      ->excludes(checkpoint);
  ModelSource weights_option;  // --weights, as generate and evaluate have it
  weights_option.add_weights_option(app);
  weights_option.add_cache_option(app);
  app.add_option("--lora", options.lora,
                 "A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) applied on top of the "
                 "model");
  app.add_option("--ctx", options.scheduler.ctx,
                 "Tokens a sequence holds, prompt and reply (0: the model's max_len, at most 2048)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--chat-template", options.chat_template,
                 "The chat template of /v1/chat/completions: chatml, llama3 or a file, in place of the model's own "
                 "(a checkpoint has none)");
  app.add_option("--host", options.host, "The address to listen on")->capture_default_str();
  app.add_option("--port", options.port, "The port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--parallel", options.scheduler.parallel, "Sequences decoded together (the cache's S)")
      ->check(CLI::Range(std::size_t(1), std::size_t(4096)))
      ->capture_default_str();
  app.add_option("--queue", options.scheduler.queue, "Requests that may wait for a free sequence (more get 503)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--max-tokens", options.scheduler.max_tokens,
                 "The most max_tokens a request may ask for (0: the model's max_len)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--api-key", options.api_key, "Require 'Authorization: Bearer KEY' on /v1/ requests");
  app.add_option("--threads", threads, "Threads of the decoding passes (0: OMP_NUM_THREADS, else all cores)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  app.add_flag("--share-cores", share_cores,
               "Let the HTTP threads run on the decoding's cores (by default, when the process may use more "
               "cores than --threads, the decoding runs on the first --threads of them and the HTTP threads "
               "on the rest)");
  app.add_option("--drain-timeout", drain_seconds,
                 "Seconds that running requests get to finish after SIGTERM or SIGINT")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();

  return run_program(app, argc, argv, [&] {
    if (options.checkpoint.empty() && options.model.empty())
      throw UsageError("give a checkpoint (--checkpoint FILE) or a published model (--model PATH)");
    options.weights = weights_option.weights;
    options.scheduler.cache_type = weights_option.cache_type();
    options.drain_timeout = std::chrono::milliseconds(std::int64_t(drain_seconds * 1000));
    options.pin_cpus = !share_cores;
    set_num_threads(threads);
    // SIGTERM and SIGINT are taken by sigwait below, on this thread: blocked here, before any
    // other thread starts, so that every thread inherits the mask.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    serve::Server server(options);
    fmt::print(stderr, "serve: {} on http://{}:{}/ ({} sequences, queue {}), loading\n",
               options.model.empty() ? options.checkpoint : options.model,
               options.host, server.port(), options.scheduler.parallel, options.scheduler.queue);
    std::thread http([&] { server.run(); });
    // Clients get 503 "loading" meanwhile; weights that fail to load at start end the program. A
    // signal meanwhile ends it at once: nothing is served yet, so there is nothing to drain, and
    // a large checkpoint may take long to load (the loading thread cannot be joined before then).
    std::shared_ptr<const serve::Weights> weights;
    try {
      while (!(weights = server.scheduler().wait_loaded_for(std::chrono::milliseconds(50)))) {
        const timespec now{};
        if (const int caught = sigtimedwait(&signals, nullptr, &now); caught > 0) {
          fmt::print(stderr, "serve: {} while loading the {}: stopped\n", caught == SIGTERM ? "SIGTERM" : "SIGINT",
                     options.model.empty() ? "checkpoint" : "model");
          std::_Exit(0);
        }
      }
    } catch (...) {
      server.shutdown();
      http.join();
      throw;
    }
    fmt::print(stderr, "serve: ready: weights {} (step {})\n", weights->fingerprint, weights->step);
    int signal = 0;
    sigwait(&signals, &signal);
    fmt::print(stderr, "serve: {}: draining ({} running, {} waiting)\n", signal == SIGTERM ? "SIGTERM" : "SIGINT",
               server.scheduler().running(), server.scheduler().waiting());
    server.shutdown();
    http.join();
    fmt::print(stderr, "serve: stopped\n");
    return 0;
  });
}
