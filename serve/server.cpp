// The HTTP routes of `serve` on cpp-httplib, the server-sent event stream, and the error bodies.
#include "serve/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "core/kernels.h"
#include "serve/cpus.h"
#include "serve/hangup_watch.h"

namespace tapegrad::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

void reply_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  if (error.status == 503) res.set_header("Retry-After", "1");
  res.set_content(error_body(error), "application/json");
}

// How often a stream's thread wakes: it writes what has come at most this often, and when nothing
// has come it looks at its connection (a client that closed it is noticed at once by HangupWatch;
// this catches a peer that reset it). The streams' wake-ups and writes share the cores with the
// clients, whose next requests keep the sequences busy: 10 ms served 64 streams better than 5 and
// as well as 20 (docs/benchmarks.md, "Measurements behind choices in the code").
constexpr auto kStreamPoll = std::chrono::milliseconds(10);

}  // namespace

struct Server::Impl {
  ServerOptions options;
  CpuSplit cpus;  // empty unless options.pin_cpus and a CPU is left over
  Metrics metrics;
  Scheduler scheduler;
  HangupWatch hangups;  // before http: the workers' watches end before it does
  httplib::Server http;
  std::string model_name;
  int port = 0;
  std::atomic<std::uint64_t> next_id{0};
  std::atomic<bool> shut{false}, running{false};
  std::mutex shutdown_mutex, run_mutex;
  bool stopping = false;  // guarded by run_mutex

  explicit Impl(ServerOptions o)
      : options(std::move(o)),
        cpus(options.pin_cpus ? split_cpus(allowed_cpus(), std::size_t(num_threads())) : CpuSplit{}),
        metrics(options.scheduler.parallel),
        scheduler(served_path(options), scheduler_options(options, cpus.decoding), metrics),
        model_name(name_of(served_path(options))) {
    routes();
    // A connection holds a worker while it streams: enough for every sequence, every queued
    // request and a few quick requests (/health, /metrics) besides.
    const std::size_t workers = options.scheduler.parallel + options.scheduler.queue + 8;
    http.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
    http.set_payload_max_length(options.body_limit);
    http.set_keep_alive_timeout(1);  // an idle connection holds up shutdown for at most this
    // httplib closes a connection after 5 requests by default: each new one costs an accept, a
    // worker task and the search for its socket (connection_socket), which took 3% of the HTTP
    // side's CPU at C = 64.
    http.set_keep_alive_max_count(1000);
    // Without it a stream's small writes wait for the client's delayed ACK (Nagle): 40 ms stalls.
    http.set_tcp_nodelay(true);
    // httplib's own socket options set SO_REUSEPORT, which lets a second server bind the same
    // port and take half its connections: SO_REUSEADDR alone (a restart may rebind at once), so
    // that a port in use is an error. And httplib listens with a backlog of 5 connections: many
    // clients connecting at once would see theirs dropped; listening again raises it.
    int socket_fd = -1;
    http.set_socket_options([&socket_fd](int fd) {
      const int yes = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      socket_fd = fd;
    });
    port = options.port == 0 ? http.bind_to_any_port(options.host) : options.port;
    if (options.port != 0 && !http.bind_to_port(options.host, options.port)) port = -1;
    if (port <= 0)
      throw std::runtime_error(fmt::format("cannot listen on {}:{} (the port is in use, or the address is not this machine's)",
                                           options.host, options.port));
    if (socket_fd >= 0) ::listen(socket_fd, SOMAXCONN);
    http.set_socket_options([](int) {});  // the lambda above refers to this constructor's frame
  }

  static const std::string& served_path(const ServerOptions& options) {
    if (options.checkpoint.empty() == options.model.empty())
      throw std::invalid_argument(options.model.empty() ? "serve: give a checkpoint (--checkpoint) or a model (--model)"
                                                         : "serve: give --checkpoint or --model, not both");
    if (!options.checkpoint.empty() && options.weights != "f32")
      throw std::invalid_argument(fmt::format("serve: --weights {} applies to a published model (--model), not to "
                                              "--checkpoint",
                                              options.weights));
    return options.model.empty() ? options.checkpoint : options.model;
  }

  // A model's name: its file's stem, or its folder's name.
  static std::string name_of(const std::string& path) {
    const std::filesystem::path p = std::filesystem::path(path).lexically_normal();
    return (p.has_filename() ? p : p.parent_path()).stem().string();
  }

  // The decoding loop's options: the loader of a checkpoint (watched) or a published model (loaded
  // once), with --chat-template's template; the decoding CPUs.
  static SchedulerOptions scheduler_options(const ServerOptions& options, std::vector<int> cpus) {
    SchedulerOptions scheduler = options.scheduler;
    if (!cpus.empty()) scheduler.cpus = std::move(cpus);
    if (!options.model.empty()) {
      scheduler.watch = false;
      scheduler.load = [name = options.chat_template, lora = options.lora,
                        weights = options.weights](const std::string& path) {
        return load_pretrained_weights(path, name, lora, weights);
      };
    } else if (!options.chat_template.empty() || !options.lora.empty()) {
      scheduler.load = [name = options.chat_template, lora = options.lora](const std::string& path) {
        return load_weights(path, name, lora);
      };
    }
    return scheduler;
  }

  // The fields every answer and every chunk of a stream share.
  json base_object(const Job& job, const std::string& id, const char* object) {
    return {{"id", id},
            {"object", object},
            {"created", std::int64_t(std::time(nullptr))},
            {"model", model_name},
            {"system_fingerprint", job.fingerprint}};
  }

  static json usage(const Job& job) {
    std::size_t completion = 0;
    for (const auto& choice : job.choices) completion += choice.tokens;
    return {{"prompt_tokens", job.prompt_ids.size()},
            {"completion_tokens", completion},
            {"total_tokens", job.prompt_ids.size() + completion}};
  }

  void routes() {
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(playground_html()), "text/html; charset=utf-8");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const bool draining = scheduler.draining(), ready = scheduler.weights() != nullptr;
      const std::string status = draining ? "draining" : ready ? "ok" : scheduler.not_ready().code.value_or("loading");
      res.status = status == "ok" ? 200 : 503;
      res.set_content(dump({{"status", status}}), "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.prometheus_text(), "text/plain; version=0.0.4; charset=utf-8");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const std::shared_ptr<const Weights> weights = scheduler.weights();
      if (!weights) return reply_error(res, scheduler.not_ready());
      json model = {{"id", model_name},
                    {"object", "model"},
                    {"created", std::int64_t(std::time(nullptr))},
                    {"owned_by", "tapegrad"},
                    {"arch", weights->model.arch()},
                    {"vocab_size", weights->model.config().vocab},
                    {"max_len", weights->model.config().max_len},
                    {"context", scheduler.context(*weights)},
                    {"format", weights->format},
                    // The playground offers its chat mode when there is one.
                    {"chat_template", weights->chat_template ? json(weights->chat_template->name()) : json(nullptr)},
                    {"parameters", weights->model.num_params()},
                    {"step", weights->step},
                    {"system_fingerprint", weights->fingerprint}};
      for (const char* key : {"d_model", "n_heads", "n_blocks", "d_ff"})
        if (auto it = weights->metadata.find(key); it != weights->metadata.end()) {
          try {
            model[key] = std::stoull(it->second);
          } catch (const std::exception&) {
            model[key] = it->second;
          }
        }
      res.set_content(dump({{"object", "list"}, {"data", json::array({model})}}), "application/json");
    });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, Api::completion); });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, Api::chat); });

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      settle_worker(cpus.others);
      if (options.api_key.empty() || !req.path.starts_with("/v1/")) return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + options.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      reply_error(res, {.status = 401,
                        .message = req.has_header("Authorization")
                                       ? "the API key is wrong: give 'Authorization: Bearer <key>' with the "
                                         "server's --api-key"
                                       : "an API key is required: give 'Authorization: Bearer <key>'",
                        .type = "invalid_request_error",
                        .code = "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    });
    // httplib calls this before it writes any answer of status 400 or more: the completion errors
    // are counted here (the successes where they are answered), and the errors httplib answers by
    // itself get OpenAI's body too.
    http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                        httplib::Response& res) {
      if (req.path == "/v1/completions" || req.path == "/v1/chat/completions") metrics.request_done(res.status);
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      ApiError error{.status = res.status, .message = fmt::format("{} {}: HTTP {}", req.method, req.path, res.status)};
      if (res.status == 404) {
        error.message = fmt::format("no route for {} {}", req.method, req.path);
        error.code = "not_found";
      } else if (res.status == 413) {
        error.message = fmt::format("the request body is larger than this server's limit of {} bytes",
                                    options.body_limit);
        error.code = "request_too_large";
      }
      reply_error(res, error);
      return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      reply_error(res, {.status = 500, .message = "internal error: " + message_of(ep), .type = "server_error"});
    });
  }

  // The two endpoints' shapes: OpenAI's completion ("text") and chat ("message" and "delta").
  enum class Api { completion, chat };

  static const char* object_name(Api api, bool chunk) {
    if (api == Api::completion) return "text_completion";
    return chunk ? "chat.completion.chunk" : "chat.completion";
  }

  std::string next_request_id(Api api) {
    return fmt::format("{}-{}", api == Api::completion ? "cmpl" : "chatcmpl", next_id++);
  }

  std::variant<std::shared_ptr<Job>, ApiError> submit(const httplib::Request& req, Api api) {
    if (api == Api::completion) {
      auto parsed = parse_completion_request(req.body);
      if (auto* error = std::get_if<ApiError>(&parsed)) return *error;
      return scheduler.submit(std::get<CompletionRequest>(parsed));
    }
    auto parsed = parse_chat_request(req.body);
    if (auto* error = std::get_if<ApiError>(&parsed)) return *error;
    return scheduler.submit_chat(std::get<ChatRequest>(parsed));
  }

  void complete(const httplib::Request& req, httplib::Response& res, Api api) {
    auto submitted = submit(req, api);
    if (auto* error = std::get_if<ApiError>(&submitted)) return reply_error(res, *error);
    std::shared_ptr<Job> job = std::get<std::shared_ptr<Job>>(submitted);
    HangupWatch::Watch watch = hangups.watch(connection_socket(req.remote_addr, req.remote_port), job);
    const CompletionRequest& request = job->request;
    std::unique_lock lock(job->mutex);
    if (!request.stream) {
      job->changed.wait(lock, [&] { return job->done; });
      if (job->error) return reply_error(res, *job->error);
      json body = base_object(*job, next_request_id(api), object_name(api, false));
      body["choices"] = json::array();
      for (std::size_t i = 0; i < job->choices.size(); ++i) {
        json choice = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", *job->choices[i].finish_reason}};
        if (api == Api::completion) choice["text"] = job->choices[i].text;
        else choice["message"] = {{"role", "assistant"}, {"content", job->choices[i].text}};
        body["choices"].push_back(std::move(choice));
      }
      body["usage"] = usage(*job);
      res.set_content(dump(body), "application/json");
      metrics.request_done(200);
      return;
    }
    // A stream starts with its first token, so that an error found at admission is still an HTTP
    // error status; the decoding thread wakes this one once for both (a wake-up of another thread
    // cost it about 15 us on a 2-vCPU virtual machine).
    job->changed.wait(lock, [&] {
      return job->done || std::any_of(job->choices.begin(), job->choices.end(),
                                      [](const Job::Choice& choice) { return choice.tokens > 0; });
    });
    if (job->error) return reply_error(res, *job->error);
    lock.unlock();
    metrics.request_done(200);
    res.set_header("Cache-Control", "no-cache");
    auto state = std::make_shared<StreamState>(api, next_request_id(api), job->choices.size(), std::move(watch));
    res.set_chunked_content_provider("text/event-stream", [this, job, state](
                                                              std::size_t, httplib::DataSink& sink) {
      return stream_step(*job, *state, sink);
    });
  }

  // Where a stream is: how much of each choice's text it has sent, and whether its finish.
  struct StreamState {
    StreamState(Api a, std::string i, std::size_t choices, HangupWatch::Watch w)
        : api(a), id(std::move(i)), sent(choices, 0), finished(choices, false), watch(std::move(w)) {}
    Api api;
    std::string id;
    std::vector<std::size_t> sent;
    std::vector<bool> finished;
    std::optional<Clock::time_point> last_send;  // when it last wrote events
    HangupWatch::Watch watch;                    // for as long as the stream lives
  };

  // One call of the stream's content provider: waits briefly for news, sends it as events, and
  // ends the stream once the job is done. Returns false (ending the connection) when the client
  // has gone, after cancelling the job so that its sequences are freed at the next step.
  bool stream_step(Job& job, StreamState& state, httplib::DataSink& sink) {
    // After its first events a stream writes at most once per kStreamPoll, whatever has come
    // meanwhile: a write (and a wake-up of this thread and of the client) per character, at
    // thousands of characters a second per stream, would take the cores the decoding needs. It
    // waits on `ended`, not `changed`, so that new tokens do not wake it and its end does.
    if (state.last_send) {
      std::unique_lock lock(job.mutex);
      job.ended.wait_until(lock, *state.last_send + kStreamPoll, [&] { return job.done || job.cancelled; });
    }
    // What is new is copied under the job's lock and formatted after it: the decoding thread takes
    // that lock at every token, and a worker that held it while it built JSON (and lost its core
    // meanwhile) put the decoding to sleep for up to milliseconds.
    struct ChoiceNews {
      std::size_t index;
      std::string text;
      std::optional<std::string> finish_reason;
    };
    std::vector<ChoiceNews> news;
    bool done = false;
    std::optional<ApiError> error;
    std::optional<json> usage_at_end;
    {
      std::unique_lock lock(job.mutex);
      auto any_news = [&] {
        if (job.done || job.cancelled) return true;
        for (std::size_t i = 0; i < job.choices.size(); ++i)
          if (job.choices[i].text.size() > state.sent[i] || (job.choices[i].finish_reason && !state.finished[i]))
            return true;
        return false;
      };
      job.changed.wait_for(lock, kStreamPoll, any_news);
      if (job.cancelled) return false;  // its client has gone: nothing more to send
      for (std::size_t i = 0; i < job.choices.size(); ++i) {
        const Job::Choice& choice = job.choices[i];
        const bool finishing = choice.finish_reason && !state.finished[i];
        if (choice.text.size() == state.sent[i] && !finishing) continue;
        news.push_back({i, choice.text.substr(state.sent[i]), finishing ? choice.finish_reason : std::nullopt});
        state.sent[i] = choice.text.size();
        state.finished[i] = state.finished[i] || finishing;
      }
      done = job.done;
      error = job.error;
      if (done && !error && job.request.include_usage) usage_at_end = usage(job);
    }
    std::vector<std::string> events;
    // The fingerprint was set before the first token.
    const json base = base_object(job, state.id, object_name(state.api, true));
    auto chunk = [&](std::size_t index, json delta_or_text, const std::optional<std::string>& finish_reason) {
      json event = base;
      json choice = {{"index", index},
                     {"logprobs", nullptr},
                     {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}};
      choice[state.api == Api::completion ? "text" : "delta"] = std::move(delta_or_text);
      event["choices"] = json::array({std::move(choice)});
      if (job.request.include_usage) event["usage"] = nullptr;
      events.push_back(dump(event));
    };
    // A chat stream opens each choice with the assistant's role, as OpenAI's does.
    if (state.api == Api::chat && state.last_send == std::nullopt)
      for (std::size_t i = 0; i < state.sent.size(); ++i)
        chunk(i, {{"role", "assistant"}, {"content", ""}}, std::nullopt);
    for (ChoiceNews& choice : news) {
      if (state.api == Api::completion) {
        chunk(choice.index, std::move(choice.text), choice.finish_reason);
        continue;
      }
      // A chat choice's text comes in content deltas; its finish in a last chunk with an empty delta.
      if (!choice.text.empty()) chunk(choice.index, {{"content", std::move(choice.text)}}, std::nullopt);
      if (choice.finish_reason) chunk(choice.index, json::object(), choice.finish_reason);
    }
    if (done && error) {
      events.push_back(error_body(*error));
    } else if (usage_at_end) {
      json event = base;
      event["choices"] = json::array();
      event["usage"] = std::move(*usage_at_end);
      events.push_back(dump(event));
    }
    // One write for all of it: each write is an HTTP chunk and a system call. A write to a peer
    // that has gone fails; with nothing to write, the socket is looked at instead.
    std::string text;
    for (const std::string& event : events) text += "data: " + event + "\n\n";
    if (done) text += "data: [DONE]\n\n";
    if (text.empty()) return sink.is_writable() || cancel(job);
    if (!sink.write(text.data(), text.size())) return cancel(job);
    state.last_send = Clock::now();
    if (done) sink.done();
    return true;
  }

  static bool cancel(Job& job) {
    job.cancelled = true;
    return false;
  }
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() { shutdown(); }

int Server::port() const { return impl_->port; }

void Server::run() {
  {
    std::lock_guard guard(impl_->run_mutex);
    if (impl_->stopping) return;
    impl_->running = true;
  }
  impl_->http.listen_after_bind();
  impl_->running = false;
}

void Server::shutdown() {
  std::lock_guard guard(impl_->shutdown_mutex);
  if (impl_->shut.exchange(true)) return;
  Scheduler& scheduler = impl_->scheduler;
  scheduler.drain();
  const Clock::time_point deadline = Clock::now() + impl_->options.drain_timeout;
  while (!scheduler.idle() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  scheduler.stop();  // what is left ends with a 503 error
  // Let the streams send their last events before the connections close.
  std::this_thread::sleep_for(2 * kStreamPoll);
  {
    std::lock_guard guard(impl_->run_mutex);
    impl_->stopping = true;  // a run() not yet started returns at once
  }
  // httplib's stop() works only once its loop has started.
  while (impl_->running && !impl_->http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (impl_->running) impl_->http.stop();
  while (impl_->running) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

Scheduler& Server::scheduler() { return impl_->scheduler; }

Metrics& Server::metrics() { return impl_->metrics; }

}  // namespace tapegrad::serve
