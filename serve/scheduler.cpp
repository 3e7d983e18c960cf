// The decoding loop: admission, chunked prefill, one step for every running sequence, stop
// strings, cancellation and live weights.
#include "serve/scheduler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>

#include "core/tape.h"
#include "nn/sampling.h"
#include "serve/cpus.h"
#include "tokenizers/utf8_stream.h"

namespace tapegrad::serve {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Job::Job(CompletionRequest r, std::vector<std::int32_t> ids, std::uint64_t s)
    : request(std::move(r)), prompt_ids(std::move(ids)), seed(s), arrival(Clock::now()), choices(request.n) {}

// A sequence of a generation's cache in use: one sample of a job.
struct Scheduler::Slot {
  std::shared_ptr<Job> job;
  std::size_t choice = 0;
  std::size_t prefilled = 0;  // prompt tokens written to the cache so far
  nn::Sampler sampler;
  std::int32_t last = 0;      // the token the next step feeds
  std::size_t generated = 0;
  tokenizers::Utf8Stream utf8;  // the bytes of a character that a token left unfinished
  std::string pending;        // generated text held back: it may be the start of a stop string
  Clock::time_point last_token;
};

// The cache of one set of weights. The newest generation has the current weights; older ones
// live until their last sequence finishes, so requests in flight finish on their own weights.
struct Scheduler::Generation {
  std::shared_ptr<const Weights> weights;
  nn::KVCache cache;
  std::vector<std::optional<Slot>> slots;  // per sequence of the cache
  std::size_t used = 0;

  Generation(std::shared_ptr<const Weights> w, std::size_t sequences, std::size_t context, nn::KVCacheType type)
      : weights(std::move(w)), cache(weights->model.make_cache(sequences, context, type)), slots(sequences) {
    for (std::size_t s = 0; s < sequences; ++s) cache.drop(s);  // free until a request takes it
  }
};

Scheduler::Scheduler(std::string path, SchedulerOptions options, Metrics& metrics)
    : path_(std::move(path)), options_(options), metrics_(metrics) {
  if (options_.parallel == 0) throw std::invalid_argument("Scheduler: parallel (the sequences decoded together) must be at least 1");
  if (options_.prefill_chunk == 0) throw std::invalid_argument("Scheduler: prefill_chunk must be at least 1");
  // The weights load on the loop's thread (see loop()); a missing file is refused here, before
  // the server listens.
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0)
    throw std::runtime_error(fmt::format("{}: cannot open: {}", path_, std::strerror(errno)));
  signature_ = FileSignature{std::uint64_t(st.st_ino), std::uint64_t(st.st_size),
                             std::int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  draining_ = true;
  {
    std::lock_guard lock(mutex_);
    if (stop_) return;
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  ApiError gone{.status = 503, .message = "the server stopped before the request finished", .type = "server_error",
                .code = "shutting_down"};
  std::deque<std::shared_ptr<Job>> waiting;
  {
    std::lock_guard lock(mutex_);
    waiting.swap(waiting_);
    used_ = 0;
  }
  for (auto& job : waiting) end_job(*job, gone);
  for (auto& generation : generations_)
    for (std::size_t s = 0; s < generation.slots.size(); ++s)
      if (generation.slots[s]) {
        end_job(*generation.slots[s]->job, gone);
        generation.slots[s].reset();
      }
}

ApiError Scheduler::not_ready() const {
  std::lock_guard lock(mutex_);
  if (!load_error_)
    return {.status = 503, .message = "the model is loading; retry shortly", .type = "server_error", .code = "loading"};
  return {.status = 500, .message = "the model could not be loaded: " + message_of(load_error_), .type = "server_error",
          .code = "load_failed"};
}

std::size_t Scheduler::context(const Weights& weights) const {
  const std::size_t max_len = weights.model.config().max_len;
  return options_.ctx ? options_.ctx : std::min(max_len, kDefaultContext);
}

ModelLimits Scheduler::limits(const Weights& weights) const {
  const std::size_t context = this->context(weights);
  return {.max_len = context,
          .cut_by_ctx = context < weights.model.config().max_len,
          .max_tokens = options_.max_tokens ? options_.max_tokens : context,
          .parallel = options_.parallel};
}

// options.load, and a context the model can hold.
std::shared_ptr<const Weights> Scheduler::load() const {
  std::shared_ptr<const Weights> weights = options_.load(path_);
  if (options_.ctx > weights->model.config().max_len)
    throw std::invalid_argument(fmt::format("{}: --ctx {} is more than the model's max_len of {}", path_,
                                            options_.ctx, weights->model.config().max_len));
  return weights;
}

// From one engine seeded once by std::random_device: constructing a random_device for every
// request took about a tenth of the request threads' time under load (perf, 64 streaming clients).
static std::uint64_t random_seed() {
  static std::mutex mutex;
  static std::mt19937_64 engine{(std::uint64_t(std::random_device{}()) << 32) | std::random_device{}()};
  std::lock_guard lock(mutex);
  return engine();
}

std::variant<std::shared_ptr<Job>, ApiError> Scheduler::submit(const CompletionRequest& request) {
  const ApiError draining{.status = 503, .message = "the server is shutting down and admits no new requests",
                         .type = "server_error", .code = "draining"};
  if (draining_) return draining;
  const std::shared_ptr<const Weights> weights = this->weights();
  if (!weights) return not_ready();
  auto checked = check_against_model(request, *weights->tokenizer, limits(*weights));
  if (auto* error = std::get_if<ApiError>(&checked)) return *error;
  // A request without a seed gets a random one: its samples still differ from each other.
  const std::uint64_t seed = request.seed ? *request.seed : random_seed();
  auto job = std::make_shared<Job>(request, std::move(std::get<std::vector<std::int32_t>>(checked)), seed);
  {
    std::lock_guard lock(mutex_);
    if (stop_) return draining;  // stop() has taken the queue: nothing would answer this one
    const bool fits_now = waiting_.empty() && used_ + request.n <= options_.parallel;
    if (!fits_now && waiting_.size() >= options_.queue)
      return ApiError{.status = 503,
                      .message = fmt::format("the server is busy: {} requests are already waiting (--queue {}); "
                                             "retry later",
                                             waiting_.size(), options_.queue),
                      .type = "server_error", .code = "queue_full"};
    waiting_.push_back(job);
  }
  wake_.notify_all();
  return job;
}

std::variant<std::shared_ptr<Job>, ApiError> Scheduler::submit_chat(const ChatRequest& request) {
  const std::shared_ptr<const Weights> weights = this->weights();
  if (!weights) return not_ready();
  auto completion = chat_completion_request(request, weights->chat_template ? &*weights->chat_template : nullptr,
                                            weights->no_chat_template, *weights->tokenizer, limits(*weights));
  if (auto* error = std::get_if<ApiError>(&completion)) return *error;
  return submit(std::get<CompletionRequest>(completion));
}

std::shared_ptr<const Weights> Scheduler::weights() const {
  std::lock_guard lock(mutex_);
  return current_;
}

std::shared_ptr<const Weights> Scheduler::wait_loaded() {
  std::unique_lock lock(mutex_);
  loaded_.wait(lock, [&] { return current_ || load_error_; });
  if (load_error_) std::rethrow_exception(load_error_);
  return current_;
}

std::shared_ptr<const Weights> Scheduler::wait_loaded_for(std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  loaded_.wait_for(lock, limit, [&] { return current_ || load_error_; });
  if (load_error_) std::rethrow_exception(load_error_);
  return current_;
}

void Scheduler::drain() {
  draining_ = true;
  wake_.notify_all();
}

bool Scheduler::idle() const {
  std::lock_guard lock(mutex_);
  return used_ == 0 && waiting_.empty();
}

std::size_t Scheduler::running() const {
  std::lock_guard lock(mutex_);
  return used_;
}

std::size_t Scheduler::waiting() const {
  std::lock_guard lock(mutex_);
  return waiting_.size();
}

void Scheduler::end_job(Job& job, std::optional<ApiError> error) {
  {
    std::lock_guard lock(job.mutex);
    if (job.done) return;
    job.done = true;
    job.error = std::move(error);
  }
  job.changed.notify_all();
  job.ended.notify_all();
}

void Scheduler::loop() {
  ::pthread_setname_np(::pthread_self(), "serve-decode");  // as top -H and perf name it
  // Before the first pass: the kernel threads that pass starts inherit these CPUs.
  if (!run_on(options_.cpus))
    fmt::print(stderr, "serve: could not keep the decoding loop on CPUs {}; it runs on any\n",
               fmt::join(options_.cpus, ","));
  NoGradScope no_grad;
  // The first load happens here, not in the constructor, so that the server listens meanwhile and
  // answers 503 "loading" rather than refusing connections (as llama.cpp's server does).
  try {
    std::shared_ptr<const Weights> weights = load();
    generations_.emplace_back(weights, options_.parallel, context(*weights), options_.cache_type);
    metrics_.weights(weights->fingerprint);
    std::lock_guard lock(mutex_);
    current_ = std::move(weights);
  } catch (...) {
    std::lock_guard lock(mutex_);
    load_error_ = std::current_exception();
  }
  loaded_.notify_all();
  if (generations_.empty()) return;
  last_poll_ = Clock::now();
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (stop_) return;
    }
    reload_if_changed();
    finish_cancelled();
    admit();
    bool worked = false;
    if (options_.before_step && std::any_of(generations_.begin(), generations_.end(),
                                            [](const Generation& g) { return g.used > 0; }))
      options_.before_step();
    for (auto& generation : generations_)
      if (generation.used > 0) {
        try {
          advance(generation);
        } catch (const std::exception& e) {  // a bug, not a request's fault: fail its requests, go on
          fail_generation(generation, e.what());
        }
        worked = true;
      }
    // An old generation goes once its last sequence has finished (the current one stays).
    for (auto it = generations_.begin(); std::next(it) != generations_.end();)
      it = it->used == 0 ? generations_.erase(it) : std::next(it);
    std::unique_lock lock(mutex_);
    metrics_.set_queue(used_, waiting_.size());
    if (!worked && !stop_)
      wake_.wait_for(lock, options_.poll, [&] { return stop_ || !waiting_.empty(); });
  }
}

void Scheduler::fail_generation(Generation& generation, const std::string& message) {
  fmt::print(stderr, "serve: decoding failed, ending its {} sequences: {}\n", generation.used, message);
  const ApiError error{.status = 500, .message = "decoding failed: " + message, .type = "server_error"};
  for (std::size_t s = 0; s < generation.slots.size(); ++s) {
    if (!generation.slots[s]) continue;
    end_job(*generation.slots[s]->job, error);
    generation.slots[s].reset();
    generation.cache.drop(s);
    --generation.used;
    std::lock_guard lock(mutex_);
    --used_;
  }
}

void Scheduler::reload_if_changed() {
  if (!options_.watch) return;
  const Clock::time_point now = Clock::now();
  if (now - last_poll_ < options_.poll) return;
  last_poll_ = now;
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return;  // between a rename's unlink and link, or gone: keep serving
  const FileSignature signature{std::uint64_t(st.st_ino), std::uint64_t(st.st_size),
                                std::int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  if (signature_ == signature) return;
  signature_ = signature;  // a broken file is tried once, not at every poll
  std::shared_ptr<const Weights> weights;
  try {
    weights = load();
    generations_.emplace_back(weights, options_.parallel, context(*weights), options_.cache_type);
  } catch (const std::exception& e) {
    fmt::print(stderr, "serve: the changed checkpoint could not be loaded, still serving {}: {}\n",
               generations_.back().weights->fingerprint, e.what());
    metrics_.reload_failed();
    return;
  }
  fmt::print(stderr, "serve: loaded new weights {} (step {}) from {}\n", weights->fingerprint, weights->step, path_);
  metrics_.weights(weights->fingerprint, /*reloaded=*/true);
  std::lock_guard lock(mutex_);
  current_ = std::move(weights);
}

void Scheduler::finish_cancelled() {
  for (auto& generation : generations_)
    for (std::size_t s = 0; s < generation.slots.size(); ++s)
      if (generation.slots[s] && generation.slots[s]->job->cancelled) finish(generation, s, nullptr);
  std::vector<std::shared_ptr<Job>> gone;
  {
    std::lock_guard lock(mutex_);
    for (auto it = waiting_.begin(); it != waiting_.end();)
      if ((*it)->cancelled) {
        gone.push_back(*it);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
  }
  for (auto& job : gone) {
    metrics_.request_cancelled();
    end_job(*job, std::nullopt);
  }
}

void Scheduler::admit() {
  Generation& generation = generations_.back();
  const Weights& weights = *generation.weights;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::lock_guard lock(mutex_);
      if (waiting_.empty() || used_ + waiting_.front()->request.n > options_.parallel) return;
      job = waiting_.front();
      waiting_.pop_front();
      used_ += job->request.n;
    }
    const CompletionRequest& request = job->request;
    {
      std::lock_guard lock(job->mutex);
      job->fingerprint = weights.fingerprint;
      if (request.echo)
        for (auto& choice : job->choices) choice.text = request.prompt;
    }
    // The weights may have changed since the request was checked: check it again on these.
    auto checked = check_against_model(request, *weights.tokenizer, limits(weights));
    const ApiError* error = std::get_if<ApiError>(&checked);
    if (error || request.max_tokens == 0) {
      {
        std::lock_guard lock(mutex_);
        used_ -= request.n;
      }
      if (!error) {
        std::lock_guard lock(job->mutex);
        for (auto& choice : job->choices) choice.finish_reason = "length";
        metrics_.tokens(job->prompt_ids.size(), 0);
      }
      end_job(*job, error ? std::optional(*error) : std::nullopt);
      continue;
    }
    job->prompt_ids = std::move(std::get<std::vector<std::int32_t>>(checked));  // of the weights that decode it
    for (std::size_t i = 0, s = 0; i < request.n; ++i) {
      while (generation.slots[s]) ++s;
      generation.cache.restart(s);
      generation.slots[s].emplace(Slot{.job = job, .choice = i, .sampler = nn::Sampler(request.sampling, job->seed + i)});
      ++generation.used;
    }
  }
}

void Scheduler::advance(Generation& generation) {
  const nn::LanguageModel& model = generation.weights->model;
  const std::size_t vocab = model.config().vocab, sequences = generation.slots.size();
  bool prefilling = false;
  for (const auto& slot : generation.slots)
    if (slot && slot->prefilled < slot->job->prompt_ids.size()) prefilling = true;
  std::size_t stepped = 0;
  if (!prefilling) {  // every sequence in use takes one token: the plain step
    std::vector<std::int32_t> tokens(sequences, 0);
    for (std::size_t s = 0; s < sequences; ++s)
      if (generation.slots[s]) tokens[s] = generation.slots[s]->last, ++stepped;
    std::span<const float> logits = model.step(tokens, generation.cache);  // (sequences, vocab)
    for (std::size_t s = 0; s < sequences; ++s)
      if (generation.slots[s]) emit(generation, s, logits.subspan(s * vocab, vocab));
  } else {
    // One pass of runs: the next chunk of each prompt still prefilling, one token for each
    // sequence decoding. A row's bits do not depend on the rows beside it, so a prompt prefilled
    // in chunks next to other sequences gets the logits it gets alone in one piece.
    std::vector<std::vector<std::int32_t>> runs(sequences);
    for (std::size_t s = 0; s < sequences; ++s) {
      if (!generation.slots[s]) continue;
      Slot& slot = *generation.slots[s];
      const auto& prompt = slot.job->prompt_ids;
      if (slot.prefilled < prompt.size()) {
        const std::size_t count = std::min(options_.prefill_chunk, prompt.size() - slot.prefilled);
        runs[s].assign(prompt.begin() + std::ptrdiff_t(slot.prefilled),
                       prompt.begin() + std::ptrdiff_t(slot.prefilled + count));
      } else {
        runs[s] = {slot.last};
        ++stepped;
      }
    }
    // Only each run's last row is sampled from: (non-empty runs, vocab).
    Tensor logits = model.prefill(runs, generation.cache, nn::PrefillLogits::last_token);
    std::size_t row = 0;
    for (std::size_t s = 0; s < sequences; ++s) {
      if (runs[s].empty()) continue;
      ++row;
      Slot& slot = *generation.slots[s];
      const bool decoding = slot.prefilled == slot.job->prompt_ids.size();
      if (!decoding) slot.prefilled += runs[s].size();
      if (decoding || slot.prefilled == slot.job->prompt_ids.size())
        emit(generation, s, std::span<const float>(logits.data() + (row - 1) * vocab, vocab));
    }
  }
  if (stepped > 0) metrics_.step(stepped);
}

void Scheduler::emit(Generation& generation, std::size_t sequence, std::span<const float> logits) {
  Slot& slot = *generation.slots[sequence];
  Job& job = *slot.job;
  const Clock::time_point now = Clock::now();
  const std::int32_t token = slot.sampler.next(logits);
  slot.last = token;
  ++slot.generated;
  if (slot.generated == 1) metrics_.first_token(seconds_between(job.arrival, now));
  else metrics_.token_interval(seconds_between(slot.last_token, now));
  slot.last_token = now;
  // A token may end mid-character: its bytes pass through the UTF-8 stream, which releases whole
  // characters only. An end id adds no text; the sample's last token flushes what is held.
  const Weights& weights = *generation.weights;
  const bool at_end = std::find(weights.end_ids.begin(), weights.end_ids.end(), token) != weights.end_ids.end();
  const bool last = at_end || slot.generated == job.request.max_tokens;
  if (!at_end) slot.pending += slot.utf8.push(weights.tokenizer->token_bytes(token));
  if (last) slot.pending += slot.utf8.flush();

  // Release the pending text up to a stop string (and finish), or up to where a stop string could
  // begin. The pending text is whole characters and stop strings start with a character's first
  // byte, so what is released is always whole characters.
  const auto& stops = job.request.stop;
  std::size_t stop_at = std::string::npos;
  for (const std::string& stop : stops) stop_at = std::min(stop_at, slot.pending.find(stop));
  std::size_t release = slot.pending.size();
  if (stop_at != std::string::npos) {
    release = stop_at;
  } else if (!last) {
    for (std::size_t keep = slot.pending.size(); keep > 0 && release == slot.pending.size(); --keep)
      for (const std::string& stop : stops)
        if (stop.size() > keep && stop.compare(0, keep, slot.pending, slot.pending.size() - keep, keep) == 0) {
          release = slot.pending.size() - keep;
          break;
        }
  }
  {
    std::lock_guard lock(job.mutex);
    Job::Choice& choice = job.choices[slot.choice];
    choice.text.append(slot.pending, 0, release);
    choice.tokens = slot.generated;
  }
  slot.pending.erase(0, release);
  if (job.request.stream) job.changed.notify_all();  // a whole answer waits for done only
  if (stop_at != std::string::npos || at_end) finish(generation, sequence, "stop");
  else if (last) finish(generation, sequence, "length");
}

void Scheduler::finish(Generation& generation, std::size_t sequence, const char* reason) {
  Slot slot = std::move(*generation.slots[sequence]);
  generation.slots[sequence].reset();
  generation.cache.drop(sequence);
  --generation.used;
  {
    std::lock_guard lock(mutex_);
    --used_;
  }
  Job& job = *slot.job;
  if (!reason) {  // cancelled: the job ends with its first sample freed (the others follow in the same pass)
    bool first;
    {
      std::lock_guard lock(job.mutex);
      first = !job.done;
    }
    if (first) {
      metrics_.request_cancelled();
      end_job(job, std::nullopt);
    }
    return;
  }
  bool all_finished = true;
  std::size_t completion = 0;
  {
    std::lock_guard lock(job.mutex);
    job.choices[slot.choice].finish_reason = reason;
    for (const auto& choice : job.choices) {
      all_finished = all_finished && choice.finish_reason.has_value();
      completion += choice.tokens;
    }
  }
  if (all_finished) {
    metrics_.tokens(job.prompt_ids.size(), completion);
    end_job(job, std::nullopt);
  }
}

}  // namespace tapegrad::serve
