// bench_serve: build/serve under load on loopback, beside bench_kv_cache's batched decoding.
//  - Load: C = 1, 8, 64 concurrent streaming clients sharing 32 C requests (at least 128), each
//    client sending the next as soon as its last has ended (prompts of 8 random characters, 50 to
//    150 new tokens, 100 on average, greedy, so that the requests do bench_kv_cache's work on
//    average); completion tokens/s of the whole round, and per request the time to first token
//    and the time per token after it (p50, p99).
//    Errors and lost requests (an answer without all its tokens, its finish_reason or its [DONE])
//    must be 0.
//  - --pairs P (default 3) pairs of bench_kv_cache --sizes 64 and a C = 64 round, in alternation:
//    the server's tokens/s as a share of the batched decoding of 64 sequences it is built on, at
//    the same thread count (the median of the pairs' shares, so that a shared host's changes in
//    speed reach both sides of each).
//  - --mixed N: N requests from 64 clients, streaming and not, some with n = 2 or echo, some
//    clients hanging up early; none may be lost or answered twice, none may fail, and every text
//    must equal the single-sequence reference (what `generate` prints for that seed and settings).
// The server is started on the bench model (bench_kv_cache's rotary_decoder(65, 64, 4, 2, 256),
// random weights) unless --checkpoint names another. At the end its /metrics must count every
// request sent as answered once, and none running or waiting; its peak memory (VmHWM) is read.
// Writes bench/results/serve_cpu.json; exits 1 when a check fails.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <httplib.h>
#include <pthread.h>
#include <sched.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "bench/bench_common.h"
#include "bench/serve_client.h"
#include "core/random.h"
#include "nn/checkpoint.h"
#include "nn/generate.h"
#include "nn/language_model.h"
#include "nn/models/rotary_decoder.h"
#include "serve/cpus.h"

using namespace tapegrad;
using namespace tapegrad::bench;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

/// The folder of this program: build/serve and build/bench_kv_cache are its neighbours.
fs::path own_dir() { return fs::read_symlink("/proc/self/exe").parent_path(); }

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, std::size_t(p / 100 * double(values.size())))];
}

/// What the load rounds and the mixed run share: the server's address and the checkpoint.
struct Target {
  std::string host;
  int port = 0;
  nn::LoadedModelCheckpoint checkpoint;
  std::vector<int> client_cpus;  // the CPUs serve leaves to its HTTP workers (none: every CPU)
};

/// Puts the calling client thread on the CPUs serve leaves to its HTTP workers, and under
/// SCHED_IDLE there: it runs only when no other thread wants the core. The server is measured, not
/// the load generator, whose 64 threads would otherwise take the cores from the server as clients
/// on other machines would not (64 SCHED_IDLE threads on the decoding's core took 8% of it).
void idle_priority_client(const std::vector<int>& cpus) {
  static std::atomic<bool> warned{false};
  const sched_param none{};
  if ((!serve::run_on(cpus) || pthread_setschedparam(pthread_self(), SCHED_IDLE, &none) != 0) &&
      !warned.exchange(true))
    fmt::print(stderr, "bench_serve: could not put the client threads under SCHED_IDLE on CPUs {}; they compete "
                       "with the server\n", fmt::join(cpus, ","));
}

/// n random characters of the checkpoint's vocabulary.
std::string random_prompt(const tokenizers::CharTokenizer& tokenizer, std::size_t n, Rng& rng) {
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i < n; ++i) ids.push_back(std::int32_t(rng.below(tokenizer.size())));
  return tokenizer.decode(ids);
}

/// The new tokens request i asks for: from new_tokens / 2 to 3 new_tokens / 2, new_tokens on
/// average. Requests of one length, started together, would finish together: every sequence
/// would free at the same step and the decoding loop would wait, empty, for the clients' next
/// requests, a lockstep that no server's traffic has.
std::size_t request_tokens(std::size_t i, std::size_t new_tokens) { return new_tokens / 2 + (i * 37) % (new_tokens + 1); }

/// Requests per client in a load round (at least 128 requests in all).
constexpr int kRequestsPerClient = 32;

/// One load round: C clients sharing a list of `requests` streaming greedy requests
/// (request_tokens), each client taking the next one as soon as its last has ended, as a serving
/// benchmark with a concurrency limit does. The round ends in a tail of about one request's
/// length in which ever fewer clients are left: at C = 64 it caps the busy sequences at 82% of
/// the server's 64 over 256 requests, at 95% over 1,024 and at 97% over 2,048 (kRequestsPerClient).
json load_round(const Target& target, int clients, int requests, std::size_t new_tokens, bool& ok) {
  auto answers = std::vector<Answer>(std::size_t(requests));
  std::vector<std::string> prompts;
  Rng rng{std::uint64_t(clients)};
  for (int i = 0; i < requests; ++i) prompts.push_back(random_prompt(target.checkpoint.char_tokenizer(), 8, rng));
  std::atomic<int> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&] {
      idle_priority_client(target.client_cpus);
      httplib::Client client = make_client(target.host, target.port);
      for (int i = next++; i < requests; i = next++) {
        json body = {{"prompt", prompts[std::size_t(i)]}, {"max_tokens", request_tokens(std::size_t(i), new_tokens)},
                     {"temperature", 0}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
        answers[std::size_t(i)] = complete(client, body);
      }
    });
  for (auto& t : threads) t.join();
  const double wall = since(start);
  std::vector<double> ttft, tpot;
  std::size_t tokens = 0, errors = 0, lost = 0;
  std::string first_problem;
  for (std::size_t i = 0; i < answers.size(); ++i) {
    const Answer& a = answers[i];
    const std::size_t want = request_tokens(i, new_tokens);
    if (a.status != 200 || !a.error.empty()) {
      ++errors;
      if (first_problem.empty()) first_problem = fmt::format("status {}: {}", a.status, a.error);
      continue;
    }
    const bool whole = a.done_events == 1 && a.finishes == 1 && a.completion_tokens == want &&
                       a.tokens_seen == want && a.finish.count(0) && a.finish.at(0) == "length";
    if (!whole) {
      ++lost;
      if (first_problem.empty())
        first_problem = fmt::format("incomplete answer: {} [DONE], {} finish_reasons, {} of {} tokens", a.done_events,
                                    a.finishes, a.tokens_seen, want);
      continue;
    }
    tokens += a.tokens_seen;
    ttft.push_back(a.ttft);
    tpot.push_back((a.last_token - a.ttft) / double(a.tokens_seen - 1));
  }
  if (errors || lost) {
    ok = false;
    fmt::print(stderr, "bench_serve: C={}: {} errors, {} lost; the first: {}\n", clients, errors, lost, first_problem);
  }
  const double tokens_per_s = double(tokens) / wall;
  json out = {{"clients", clients},
              {"requests", requests},
              {"completion_tokens", tokens},
              {"seconds", wall},
              {"tokens_per_s", tokens_per_s},
              {"ttft_s", {{"p50", percentile(ttft, 50)}, {"p99", percentile(ttft, 99)}}},
              {"time_per_token_s", {{"p50", percentile(tpot, 50)}, {"p99", percentile(tpot, 99)}}},
              {"errors", errors},
              {"lost", lost}};
  fmt::print("  C={:<3} {:4} requests  {:9.0f} tokens/s  first token p50 {:7.2f} ms p99 {:7.2f} ms  "
             "per token p50 {:6.3f} ms p99 {:6.3f} ms  errors {} lost {}\n",
             clients, requests, tokens_per_s, percentile(ttft, 50) * 1e3, percentile(ttft, 99) * 1e3,
             percentile(tpot, 50) * 1e3, percentile(tpot, 99) * 1e3, errors, lost);
  return out;
}

/// One kind of request in the mixed run, and the texts it must get (sample i: seed + i).
struct Case {
  json body;
  std::vector<std::string> expected;  // by choice index, the prompt first when echo
};

std::vector<Case> mixed_cases(const nn::LoadedModelCheckpoint& checkpoint, std::size_t count) {
  Rng rng(2024);
  const std::size_t max_len = checkpoint.model.config().max_len;
  const float temperatures[] = {0.0f, 0.7f, 1.0f, 1.3f};
  const std::size_t top_ks[] = {0, 5, 20};
  const float top_ps[] = {1.0f, 0.9f, 0.5f};
  std::vector<Case> cases;
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t prompt_len = 1 + rng.below(std::min<std::size_t>(24, max_len - 1));
    const std::string prompt = random_prompt(checkpoint.char_tokenizer(), prompt_len, rng);
    const std::size_t max_tokens = 1 + rng.below(std::min<std::size_t>(64, max_len - prompt_len));
    nn::GenerateOptions options{.max_new = max_tokens,
                                .sampling = {.temperature = temperatures[rng.below(4)],
                                             .top_k = top_ks[rng.below(3)],
                                             .top_p = top_ps[rng.below(3)]},
                                .seed = rng.below(1u << 30)};
    const std::size_t n = rng.below(5) == 0 ? 2 : 1;
    const bool echo = rng.below(10) == 0;
    Case c;
    c.body = {{"prompt", prompt},         {"max_tokens", max_tokens},         {"temperature", options.sampling.temperature},
              {"top_p", options.sampling.top_p}, {"seed", options.seed}, {"n", n}, {"echo", echo}};
    if (options.sampling.top_k) c.body["top_k"] = options.sampling.top_k;
    const std::vector<std::int32_t> ids = checkpoint.tokenizer->encode(prompt);
    for (std::size_t i = 0; i < n; ++i) {
      nn::GenerateOptions sample = options;
      sample.seed = options.seed + i;
      c.expected.push_back((echo ? prompt : "") +
                           checkpoint.tokenizer->decode(nn::generate(checkpoint.model, ids, sample).tokens));
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

/// The mixed run: `total` requests from `clients` clients; returns its figures and checks.
json mixed_run(const Target& target, std::size_t total, int clients, bool& ok) {
  const std::vector<Case> cases = mixed_cases(target.checkpoint, 64);
  struct Sent {
    std::size_t case_index;
    bool stream;
    std::size_t hang_up_after;
    Answer answer;
  };
  std::vector<Sent> sent(total);
  Rng rng(99);
  for (Sent& s : sent) {
    s.case_index = rng.below(cases.size());
    s.stream = rng.below(2) == 0;
    s.hang_up_after = s.stream && rng.below(8) == 0 ? 1 + rng.below(3) : 0;
  }
  std::atomic<std::size_t> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&] {
      idle_priority_client(target.client_cpus);
      httplib::Client client = make_client(target.host, target.port);
      for (std::size_t i; (i = next++) < total;) {
        json body = cases[sent[i].case_index].body;
        if (sent[i].stream) body["stream"] = true;
        sent[i].answer = complete(client, body, sent[i].hang_up_after);
        if (sent[i].answer.hung_up) client.stop();  // a new connection for the next request
      }
    });
  for (auto& t : threads) t.join();
  const double wall = since(start);

  std::size_t errors = 0, lost = 0, twice = 0, mismatched = 0, hung_up = 0, streamed = 0, tokens = 0;
  std::set<std::string> ids;
  std::vector<std::string> problems;
  auto problem = [&](std::size_t i, const std::string& what) {
    if (problems.size() < 5) problems.push_back(fmt::format("request {} ({}): {}", i, cases[sent[i].case_index].body.dump(), what));
  };
  for (std::size_t i = 0; i < total; ++i) {
    const Sent& s = sent[i];
    const Answer& a = s.answer;
    const std::vector<std::string>& expected = cases[s.case_index].expected;
    streamed += s.stream;
    if (a.status != 200 || !a.error.empty()) {
      ++errors;
      problem(i, fmt::format("status {}: {}", a.status, a.error));
      continue;
    }
    if (!a.id.empty() && !ids.insert(a.id).second) {
      ++twice;
      problem(i, "an id answered before: " + a.id);
    }
    if (a.hung_up) {  // what arrived before the hang-up is the start of the reference
      ++hung_up;
      for (const auto& [index, text] : a.texts)
        if (index >= expected.size() || expected[index].rfind(text, 0) != 0) {
          ++mismatched;
          problem(i, fmt::format("sample {} before the hang-up: '{}' is not how '{}' starts", index, text,
                                 index < expected.size() ? expected[index] : ""));
        }
      continue;
    }
    if ((s.stream && a.done_events != 1) || a.finishes != expected.size() || a.finish.size() != expected.size()) {
      if (a.done_events > 1 || a.finishes > expected.size()) {
        ++twice;
        problem(i, fmt::format("{} [DONE], {} finish_reasons for {} samples", a.done_events, a.finishes, expected.size()));
      } else {
        ++lost;
        problem(i, fmt::format("incomplete: {} [DONE], {} finish_reasons for {} samples", a.done_events, a.finishes,
                               expected.size()));
      }
      continue;
    }
    for (std::size_t index = 0; index < expected.size(); ++index) {
      const std::string text = a.texts.count(index) ? a.texts.at(index) : "";
      if (text != expected[index]) {
        ++mismatched;
        problem(i, fmt::format("sample {}: '{}', the reference '{}'", index, text, expected[index]));
      }
      tokens += code_points(text);
    }
  }
  httplib::Client client = make_client(target.host, target.port);
  json metrics = metrics_of(client);
  if (errors || lost || twice || mismatched) {
    ok = false;
    fmt::print(stderr, "bench_serve: mixed run: {} errors, {} lost, {} answered twice, {} texts unlike the reference\n",
               errors, lost, twice, mismatched);
    for (const std::string& p : problems) fmt::print(stderr, "  {}\n", p);
  }
  fmt::print("  mixed: {} requests ({} streamed, {} hung up early) from {} clients in {:.1f} s: errors {}, lost {}, "
             "answered twice {}, texts unlike the reference {}\n",
             total, streamed, hung_up, clients, wall, errors, lost, twice, mismatched);
  return {{"requests", total},
          {"clients", clients},
          {"streamed", streamed},
          {"hung_up_early", hung_up},
          {"distinct_cases", cases.size()},
          {"seconds", wall},
          {"text_characters_checked", tokens},
          {"errors", errors},
          {"lost", lost},
          {"answered_twice", twice},
          {"texts_unlike_reference", mismatched},
          {"server_metrics_after", metrics}};
}

/// bench_kv_cache --sizes 64 --threads T in a temporary file: its batched tokens/s at S = 64.
json kv_cache_figure(int threads) {
  const fs::path out = fs::temp_directory_path() / fmt::format("bench_serve_kv_cache_{}.json", ::getpid());
  const std::string command =
      fmt::format("'{}' --sizes 64 --threads {} --out '{}' >/dev/null", (own_dir() / "bench_kv_cache").string(), threads,
                  out.string());
  if (std::system(command.c_str()) != 0) throw std::runtime_error("bench_kv_cache failed: " + command);
  json results = json::parse(std::ifstream(out));
  fs::remove(out);
  return results["batched"]["64"]["threads"][std::to_string(threads)];
}

/// The bench model: bench_kv_cache's rotary_decoder(65, 64, 4, 2, 256), random weights, with
/// tiny-Shakespeare's 65 characters as its vocabulary.
void write_bench_checkpoint(const fs::path& path) {
  const std::string vocab = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  nn::save_model_checkpoint(path.string(), nn::LanguageModel(nn::rotary_decoder(65, 64, 4, 2, 256)),
                            tokenizers::CharTokenizer::from_vocab(vocab));
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<int> client_counts = {1, 8, 64};
  int threads = 1, parallel = 64, mixed = 0, pairs = 3;
  std::string checkpoint_path, out_path = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/serve_cpu.json";
  const std::string usage =
      "usage: bench_serve [--clients C,C,...] [--threads T] [--parallel S] [--mixed N] [--pairs P] [--checkpoint CKPT]\n"
      "                   [--out PATH]\n"
      "  starts build/serve --parallel S --threads T on loopback (on the bench model unless --checkpoint names one),\n"
      "  runs C concurrent streaming clients per round, then P pairs (default 3) of bench_kv_cache --sizes 64\n"
      "  --threads T and a C = 64 round in alternation;\n"
      "  --mixed N adds N mixed requests checked against the single-sequence reference\n" +
      bench::simd_usage_line();
  try {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help") {
        fmt::print("{}", usage);
        return 0;
      }
      if (arg == "--clients" && i + 1 < argc) {
        client_counts = bench::positive_list(arg, argv[++i]);
      } else if (arg == "--threads" && i + 1 < argc) {
        threads = bench::positive_int(arg, argv[++i]);
      } else if (arg == "--parallel" && i + 1 < argc) {
        parallel = bench::positive_int(arg, argv[++i]);
      } else if (arg == "--pairs" && i + 1 < argc) {
        pairs = bench::int_at_least(arg, argv[++i], 0);
      } else if (arg == "--mixed" && i + 1 < argc) {
        mixed = bench::positive_int(arg, argv[++i]);
      } else if (arg == "--checkpoint" && i + 1 < argc) {
        checkpoint_path = argv[++i];
      } else if (arg == "--out" && i + 1 < argc) {
        out_path = argv[++i];
      } else {
        fmt::print(stderr, "{}", usage);
        return 2;
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_serve: bad argument: {}\n", e.what());
    return 2;
  }
  set_num_threads(1);  // the references are single sequences
  const fs::path work = fs::temp_directory_path() / fmt::format("bench_serve_{}", ::getpid());
  fs::create_directories(work);
  const bool checkpoint_given = !checkpoint_path.empty();
  if (checkpoint_path.empty()) {
    checkpoint_path = (work / "bench_model.safetensors").string();
    write_bench_checkpoint(checkpoint_path);
  }
  Target target{"127.0.0.1", free_port(), nn::load_model_checkpoint(checkpoint_path),
                serve::split_cpus(serve::allowed_cpus(), std::size_t(threads)).others};
  target.checkpoint.model.set_training(false);
  // Requests ask for up to 3/2 of new_tokens after a prompt of 8 (request_tokens).
  const std::size_t max_len = target.checkpoint.model.config().max_len;
  const std::size_t new_tokens = std::min<std::size_t>(100, max_len > 8 ? (max_len - 8) * 2 / 3 : 0);
  if (new_tokens < 4)  // the shortest request then has 2 tokens: a time per token
    throw std::invalid_argument(fmt::format("the checkpoint's max_len {} is too short for bench_serve's requests (a "
                                            "prompt of 8, then 2 to 6 new tokens at least: max_len 14 or more)",
                                            max_len));
  // bench_kv_cache decodes its own model at S = 64: the pairs compare like with like only then.
  if (pairs > 0 && (checkpoint_given || parallel != 64)) {
    fmt::print("bench_serve: no pairs with bench_kv_cache (it runs the bench model at S = 64; this run has {})\n",
               checkpoint_given ? "--checkpoint" : fmt::format("--parallel {}", parallel));
    pairs = 0;
  }

  const int most_clients = *std::max_element(client_counts.begin(), client_counts.end());
  ServerProcess server(own_dir() / "serve",
                       {"--checkpoint", checkpoint_path, "--port", std::to_string(target.port), "--parallel",
                        std::to_string(parallel), "--threads", std::to_string(threads), "--queue",
                        std::to_string(std::max(most_clients, 64) * 2)},
                       work / "serve.log");
  {
    httplib::Client probe = make_client(target.host, target.port);
    const auto start = Clock::now();
    for (;;) {
      auto health = probe.Get("/health");
      if (health && health->status == 200) break;
      if (!server.running() || since(start) > 60)
        throw std::runtime_error("serve did not become healthy within 60 s; its log: " + (work / "serve.log").string());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    json warm = {{"prompt", "a"}, {"max_tokens", 8}, {"stream", true}};
    complete(probe, warm);
  }
  fmt::print("bench_serve: serve --parallel {} --threads {}, {} new tokens per request on average, greedy; {}\n", parallel, threads,
             new_tokens, bench::machine());
  bool ok = true;
  json rounds = json::array();
  for (int clients : client_counts)
    rounds.push_back(load_round(target, clients, kRequestsPerClient * std::max(clients, 4), new_tokens, ok));
  json mixed_results;
  if (mixed) mixed_results = mixed_run(target, std::size_t(mixed), 64, ok);
  // The comparison: bench_kv_cache's S = 64 and the C = 64 round in alternation, so that a
  // change in the machine's speed (a shared host) reaches both sides of each pair.
  std::vector<double> kv_samples, server_samples, shares;
  json pair_rounds = json::array(), kv_runs = json::array();
  for (int p = 0; p < pairs; ++p) {
    kv_runs.push_back(kv_cache_figure(threads));
    pair_rounds.push_back(load_round(target, 64, kRequestsPerClient * 64, new_tokens, ok));
    kv_samples.push_back(kv_runs.back()["tokens_per_s"].get<double>());
    server_samples.push_back(pair_rounds.back()["tokens_per_s"].get<double>());
    shares.push_back(server_samples.back() / kv_samples.back());
    fmt::print("  pair {}: bench_kv_cache S=64, {} thread{}: {:9.0f} tokens/s; serve at C=64 {:.0f}% of it\n", p + 1,
               threads, threads > 1 ? "s" : "", kv_samples.back(), shares.back() * 100);
  }
  httplib::Client client = make_client(target.host, target.port);
  json metrics = metrics_of(client);
  // The server's own count: every request answered once (the warm-up's too), none left behind.
  std::size_t sent = 1 + std::size_t(mixed);
  for (const json& round : rounds) sent += round["requests"].get<std::size_t>();
  for (const json& round : pair_rounds) sent += round["requests"].get<std::size_t>();
  double answered = 0;
  for (const auto& [name, value] : metrics.items())
    if (name.starts_with("tapegrad_requests_total{")) answered += value.get<double>();
  const double left = metrics.value("tapegrad_requests_running", 0.0) + metrics.value("tapegrad_requests_waiting", 0.0);
  if (answered != double(sent) || left != 0) {
    ok = false;
    fmt::print(stderr, "bench_serve: the server counts {} requests answered of {} sent, and {} still running or waiting\n",
               answered, sent, left);
  }
  const long peak_kib = proc_status_kib("VmHWM", std::to_string(server.pid()));
  const double peak_mib = peak_kib < 0 ? -1 : double(peak_kib) / 1024;
  const int exit_status = server.stop();
  fmt::print("  server peak memory (VmHWM) {:.1f} MiB; exit status after SIGTERM {}\n", peak_mib, exit_status);

  json at64;
  if (pairs > 0) {
    const double share = bench::stats_of(shares).median;
    std::vector<double> spreads;
    for (const json& round : pair_rounds)
      spreads.push_back(round["time_per_token_s"]["p99"].get<double>() / round["time_per_token_s"]["p50"].get<double>());
    const double spread = bench::stats_of(spreads).median;
    at64 = {{"pairs", pairs},
            {"kv_cache_s64_tokens_per_s", kv_samples},
            {"server_c64_tokens_per_s", server_samples},
            {"shares", shares},
            {"share_median", share},
            {"time_per_token_p99_over_p50_median", spread},
            {"target_share", 0.8},
            {"target_spread", 3.0},
            {"kv_cache_runs", kv_runs},
            {"server_rounds", pair_rounds}};
    fmt::print("  C=64: {:.0f}% of bench_kv_cache's S=64 (median of {} pairs; target 80%); per token p99/p50 {:.2f} "
               "(target 3)\n", share * 100, pairs, spread);
  }

  json j;
  j["benchmark"] = "serve";
  j["model"] = target.checkpoint.model.describe();
  j["checkpoint"] = fs::path(checkpoint_path).parent_path() == work ? "the bench model (random weights)" : checkpoint_path;
  j["server"] = {{"parallel", parallel}, {"threads", threads}, {"peak_rss_mib", peak_mib}, {"exit_status", exit_status},
                 {"metrics_at_end", metrics}};
  j["new_tokens"] = new_tokens;
  j["prompt_chars"] = 8;
  j["rounds"] = rounds;
  j["rounds_note"] = "C streaming clients sharing a list of 32 C requests (at least 128), each taking the next one "
                     "when its last has ended (greedy, new_tokens / 2 to 3 new_tokens / 2 new tokens, new_tokens on average, "
                     "prompts of 8 random characters); tokens_per_s = completion tokens / wall time of the round; "
                     "time_per_token = (last token - first token) / (tokens - 1) per request";
  if (!at64.is_null()) j["c64_against_kv_cache"] = at64;
  if (mixed) j["mixed"] = mixed_results;
  j["checks_passed"] = ok && exit_status == 0;
  j.update(bench::run_header());
  if (ok && exit_status == 0) bench::write_results(out_path, j);  // a failed run leaves the last results
  if (ok && exit_status == 0) fs::remove_all(work);
  else fmt::print(stderr, "bench_serve: the server's log: {}\n", (work / "serve.log").string());
  if (exit_status != 0) fmt::print(stderr, "bench_serve: serve exited with status {} after SIGTERM\n", exit_status);
  return ok && exit_status == 0 ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_serve: {}\n", e.what());
  return 1;
}
