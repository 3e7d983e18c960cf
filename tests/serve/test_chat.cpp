// POST /v1/chat/completions over HTTP, in process: the tiny Llama of tests/data/models served with
// --model (its BPE tokenizer and ChatML template), replies equal to the model decoding alone,
// OpenAI's chat chunks, finish reasons, characters split across tokens, and SmolLM2's answer.
#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <thread>

#include "core/simd.h"
#include "nn/architecture.h"
#include "nn/generate.h"
#include "nn/pretrained.h"
#include "serve/server.h"
#include "serve_helpers.h"
#include "support/helpers.h"
#include "support/real_model.h"
#include "tokenizers/utf8.h"
#include "tokenizers/utf8_stream.h"

using namespace tapegrad;
using namespace tapegrad::test;
using nlohmann::json;

namespace {

const std::string kTinyLlama = std::string(TAPEGRAD_SOURCE_DIR) + "/tests/data/models/tiny_llama";

/// Options serving a published model.
serve::ServerOptions model_options(const std::string& model) {
  serve::ServerOptions options = test_options("");
  options.checkpoint.clear();
  options.model = model;
  return options;
}

/// What the server must answer for one sample: the model decoding the prompt alone with the
/// sample's seed, ended at the first end id (finish "stop") or after max_tokens ("length"), its
/// bytes decoded as the UTF-8 stream decodes them, cut at the first stop string.
struct Reply {
  std::string text, finish_reason;
  std::size_t tokens = 0;
};

Reply reference_reply(const serve::Weights& weights, const std::vector<std::int32_t>& prompt,
                      const nn::SamplingOptions& sampling, std::size_t max_tokens, std::uint64_t seed,
                      const std::vector<std::string>& stop = {},
                      nn::KVCacheType cache_type = nn::KVCacheType::f32) {
  const nn::GenerateOptions options{.max_new = max_tokens, .sampling = sampling, .seed = seed,
                                    .cache_type = cache_type};
  const std::vector<std::int32_t> tokens = nn::generate(weights.model, prompt, options).tokens;
  Reply reply{.finish_reason = "length"};
  std::string bytes;
  for (std::int32_t token : tokens) {
    ++reply.tokens;
    if (std::find(weights.end_ids.begin(), weights.end_ids.end(), token) != weights.end_ids.end()) {
      reply.finish_reason = "stop";
      break;
    }
    bytes += weights.tokenizer->token_bytes(token);
  }
  reply.text = tokenizers::replace_invalid_utf8(bytes);
  std::size_t cut = std::string::npos;
  for (const std::string& s : stop) cut = std::min(cut, reply.text.find(s));
  if (cut != std::string::npos) {
    reply.text.resize(cut);
    reply.finish_reason = "stop";
  }
  return reply;
}

/// The prompt ids of a conversation, rendered by the weights' chat template.
std::vector<std::int32_t> chat_prompt(const serve::Weights& weights,
                                      const std::vector<tokenizers::ChatMessage>& messages) {
  REQUIRE(weights.chat_template);
  return weights.tokenizer->encode(weights.chat_template->render(messages, true));
}

/// A chat stream put back together, its chunks' shapes checked on the way.
struct ChatStream {
  std::map<std::size_t, std::string> content, finish_reason;
  std::map<std::size_t, std::size_t> roles;  ///< chunks carrying the role, per choice
  std::vector<std::string> pieces;           ///< every content delta, in order
  std::set<std::string> ids;
  json usage;
  bool done = false;
};

ChatStream parse_chat_stream(const std::string& body) {
  ChatStream out;
  std::size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const std::size_t end = body.find("\n\n", at);
    REQUIRE_MESSAGE(end != std::string::npos, "an event without its blank line: " << body.substr(at));
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end + 2;
    if (data == "[DONE]") {
      CHECK_MESSAGE(!out.done, "two [DONE]");
      out.done = true;
      continue;
    }
    CHECK_MESSAGE(!out.done, "an event after [DONE]: " << data);
    const json chunk = json::parse(data);
    REQUIRE_MESSAGE(!chunk.contains("error"), data);
    CHECK(chunk["object"] == "chat.completion.chunk");
    out.ids.insert(chunk.at("id").get<std::string>());
    if (chunk.contains("usage") && !chunk["usage"].is_null()) {
      CHECK(chunk["choices"].empty());
      out.usage = chunk["usage"];
    }
    for (const auto& choice : chunk.at("choices")) {
      const std::size_t index = choice.at("index").get<std::size_t>();
      const json& delta = choice.at("delta");
      CHECK_MESSAGE(!out.finish_reason.contains(index), "a chunk after choice " << index << "'s finish: " << data);
      if (delta.contains("role")) {
        CHECK(delta["role"] == "assistant");
        CHECK_MESSAGE(out.content[index].empty(), "the role after content: " << data);
        ++out.roles[index];
      }
      if (!choice.at("finish_reason").is_null()) {
        CHECK_MESSAGE(delta == json::object(), "the finishing chunk's delta is not empty: " << data);
        out.finish_reason[index] = choice["finish_reason"].get<std::string>();
      } else if (delta.contains("content") && !delta.contains("role")) {
        const std::string piece = delta["content"].get<std::string>();
        CHECK_NOTHROW(tokenizers::decode_utf8(piece));  // whole characters only
        out.content[index] += piece;
        out.pieces.push_back(piece);
      }
    }
  }
  return out;
}

json post(TestServer& s, const std::string& path, const json& body) {
  httplib::Client client = s.client();
  auto r = client.Post(path, body.dump(), "application/json");
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  return body.value("stream", false) ? json(r->body) : json::parse(r->body);
}

}  // namespace

TEST_CASE("serve --model: a chat completion of the tiny Llama in OpenAI's shape, equal to the model decoding alone") {
  TestServer s(model_options(kTinyLlama));
  const std::shared_ptr<const serve::Weights> weights = s.server.scheduler().weights();
  REQUIRE(weights);
  CHECK(weights->format == "hf");
  REQUIRE(weights->chat_template);

  httplib::Client client = s.client();
  auto models = client.Get("/v1/models");
  REQUIRE(models);
  const json model = json::parse(models->body)["data"][0];
  CHECK(model["id"] == "tiny_llama");
  CHECK(model["arch"] == "llama");
  CHECK(model["format"] == "hf");
  CHECK(model["chat_template"] == "chatml");
  CHECK(model["context"] == 128);  // the model's max_len, under the default of 2048

  const std::vector<tokenizers::ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hello there"}};
  const json body = {{"messages", {{{"role", "system"}, {"content", "Be brief."}},
                                   {{"role", "user"}, {"content", "Hello there"}}}},
                     {"max_tokens", 12}, {"temperature", 0.8}, {"seed", 5}, {"n", 2}};
  const json answer = post(s, "/v1/chat/completions", body);
  const std::vector<std::int32_t> prompt = chat_prompt(*weights, messages);
  CHECK(answer["object"] == "chat.completion");
  CHECK(answer["id"].get<std::string>().starts_with("chatcmpl-"));
  CHECK(answer["model"] == "tiny_llama");
  CHECK(answer["system_fingerprint"] == weights->fingerprint);
  CHECK(answer["created"].is_number_integer());
  REQUIRE(answer["choices"].size() == 2);
  std::size_t completion_tokens = 0;
  for (std::size_t i = 0; i < 2; ++i) {
    const json& choice = answer["choices"][i];
    const Reply expected = reference_reply(*weights, prompt, {.temperature = 0.8f}, 12, 5 + i);
    CHECK(choice["index"] == i);
    CHECK(choice["message"] == json{{"role", "assistant"}, {"content", expected.text}});
    CHECK(choice["finish_reason"] == expected.finish_reason);
    completion_tokens += expected.tokens;
  }
  CHECK(answer["usage"] == json{{"prompt_tokens", prompt.size()},
                                {"completion_tokens", completion_tokens},
                                {"total_tokens", prompt.size() + completion_tokens}});

  // A completion of the same model: its BPE ids, its text through the UTF-8 stream, its end ids.
  const json completion = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"seed", 4}});
  const Reply continued = reference_reply(*weights, weights->tokenizer->encode("Once upon a time"), {}, 10, 4);
  CHECK(completion["choices"][0]["text"] == continued.text);
  CHECK(completion["choices"][0]["finish_reason"] == continued.finish_reason);
  CHECK(completion["usage"]["prompt_tokens"] == weights->tokenizer->encode("Once upon a time").size());

  // The same through a GGUF file of the same model: its template, tokenizer and replies.
  TestServer gguf(model_options(kTinyLlama + "/tiny_llama.f32.gguf"));
  CHECK(gguf.server.scheduler().weights()->format == "gguf");
  const json from_gguf = post(gguf, "/v1/chat/completions", body);
  CHECK(from_gguf["choices"][0]["message"] == answer["choices"][0]["message"]);
  CHECK(from_gguf["usage"]["prompt_tokens"] == prompt.size());
}

TEST_CASE("serve --weights file decodes a GGUF's own blocks, each reply the packed model's alone; a checkpoint refuses it") {
  serve::ServerOptions options = model_options(kTinyLlama + "/tiny_llama.q4_1.gguf");
  options.weights = "file";
  TestServer s(options);
  const std::shared_ptr<const serve::Weights> served = s.server.scheduler().weights();
  REQUIRE(served);
  const std::vector<std::int32_t> ids = {1, 2, 3};
  CHECK_THROWS_WITH(served->model.forward(ids, 1, 3), doctest::Contains("packed for inference"));  // not float32
  const std::shared_ptr<const serve::Weights> alone =
      serve::load_pretrained_weights(kTinyLlama + "/tiny_llama.q4_1.gguf", "", "", "file");
  const std::vector<tokenizers::ChatMessage> messages = {{"user", "Hello there"}};
  const json answer = post(s, "/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", "Hello there"}}}},
                            {"max_tokens", 12}, {"temperature", 0.8}, {"seed", 5}, {"n", 3}});
  REQUIRE(answer["choices"].size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    const Reply expected = reference_reply(*alone, chat_prompt(*alone, messages), {.temperature = 0.8f}, 12, 5 + i);
    CHECK(answer["choices"][i]["message"]["content"] == expected.text);
  }

  serve::ServerOptions checkpoint = test_options("");
  checkpoint.checkpoint = kTinyLlama;
  checkpoint.weights = "q8_0";
  CHECK_THROWS_WITH(serve::Server{checkpoint}, doctest::Contains("--weights q8_0 applies to a published model"));
}

TEST_CASE("a chat stream: the role first, content deltas, an empty delta with finish_reason, usage, [DONE]") {
  TestServer s(model_options(kTinyLlama));
  const std::shared_ptr<const serve::Weights> weights = s.server.scheduler().weights();
  const json messages = {{{"role", "user"}, {"content", [] {
                            json parts = json::array();
                            parts.push_back({{"type", "text"}, {"text", "Caf\u00e9 \u2192"}});
                            parts.push_back({{"type", "text"}, {"text", "\U0001F600 ok"}});
                            return parts;
                          }()}}};
  const std::vector<std::int32_t> prompt =
      chat_prompt(*weights, {{"user", "Caf\u00e9 \u2192\n\U0001F600 ok"}});
  for (std::uint64_t seed : {1, 2, 3}) {
    CAPTURE(seed);
    const json body = {{"messages", messages}, {"max_completion_tokens", 30}, {"seed", seed}, {"n", 2},
                       {"stream", true}, {"stream_options", {{"include_usage", true}}}};
    const ChatStream stream = parse_chat_stream(post(s, "/v1/chat/completions", body).get<std::string>());
    CHECK(stream.done);
    CHECK(stream.ids.size() == 1);
    CHECK((*stream.ids.begin()).starts_with("chatcmpl-"));
    std::size_t completion_tokens = 0;
    for (std::size_t i = 0; i < 2; ++i) {
      const Reply expected = reference_reply(*weights, prompt, {}, 30, seed + i);
      CHECK(stream.roles.at(i) == 1);
      CHECK(stream.content.at(i) == expected.text);  // random bytes: characters split across tokens, and broken ones
      CHECK(stream.finish_reason.at(i) == expected.finish_reason);
      completion_tokens += expected.tokens;
    }
    CHECK(stream.usage == json{{"prompt_tokens", prompt.size()},
                               {"completion_tokens", completion_tokens},
                               {"total_tokens", prompt.size() + completion_tokens}});
  }
}

TEST_CASE("finish_reason is \"stop\" at an end id (its text not included) and \"length\" at max_tokens") {
  // The tiny Llama's weights are random: an end id chosen as the token its greedy reply draws
  // fourth makes that reply end there.
  const std::shared_ptr<const serve::Weights> plain = serve::load_pretrained_weights(kTinyLlama);
  const std::vector<std::int32_t> prompt = chat_prompt(*plain, {{"user", "Hello"}});
  const nn::SamplingOptions greedy{.temperature = 0};
  const std::vector<std::int32_t> tokens =
      nn::generate(plain->model, prompt, {.max_new = 8, .sampling = greedy}).tokens;
  REQUIRE(tokens.size() == 8);
  const std::int32_t end = tokens[3];
  const std::size_t first_end = std::find(tokens.begin(), tokens.end(), end) - tokens.begin();

  serve::ServerOptions options = model_options(kTinyLlama);
  options.model.clear();
  options.checkpoint = kTinyLlama;  // with a loader of its own, which gives the model that end id
  options.scheduler.watch = false;
  options.scheduler.load = [end](const std::string& path) {
    nn::PretrainedModel loaded = nn::load_pretrained(path);
    loaded.model.set_training(false);
    std::shared_ptr<const tokenizers::Tokenizer> tokenizer = std::move(loaded.tokenizer);
    return std::make_shared<const serve::Weights>(
        serve::Weights{.model = std::move(loaded.model),
                       .tokenizer = tokenizer,
                       .end_ids = {end},
                       .chat_template = tokenizers::ChatTemplate::recognise(loaded.chat_template.value(), path),
                       .format = "hf"});
  };
  TestServer s(options);
  const json ended = post(s, "/v1/chat/completions",
                          {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}, {"max_tokens", 8},
                           {"temperature", 0}});
  const std::string expected = tokenizers::replace_invalid_utf8(
      plain->tokenizer->decode(std::span(tokens.data(), first_end)));
  CHECK(ended["choices"][0]["message"]["content"] == expected);
  CHECK(ended["choices"][0]["finish_reason"] == "stop");
  CHECK(ended["usage"]["completion_tokens"] == first_end + 1);  // the end id counts as generated

  TestServer unchanged(model_options(kTinyLlama));
  const json cut = post(unchanged, "/v1/chat/completions",
                        {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}, {"max_tokens", 3},
                         {"temperature", 0}});
  CHECK(cut["choices"][0]["finish_reason"] == "length");
  CHECK(cut["usage"]["completion_tokens"] == 3);
  CHECK(cut["choices"][0]["message"]["content"] ==
        tokenizers::replace_invalid_utf8(plain->tokenizer->decode(std::span(tokens.data(), 3))));
}

TEST_CASE("16 concurrent chat requests, streamed or not, each get the reply the model gives them alone") {
  serve::ServerOptions options = model_options(kTinyLlama);
  options.scheduler.parallel = 6;
  options.scheduler.queue = 16;
  options.scheduler.prefill_chunk = 7;
  options.scheduler.ctx = 96;  // shorter than the model's 128: the cache holds 96 positions
  TestServer s(options);
  const std::shared_ptr<const serve::Weights> weights = s.server.scheduler().weights();
  struct Case {
    std::vector<tokenizers::ChatMessage> messages;
    json body;
    std::vector<Reply> expected;
    std::vector<std::string> got;
  };
  std::vector<Case> cases(16);
  const float temperatures[] = {0.0f, 0.7f, 1.0f, 1.5f};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Case& c = cases[i];
    // A system message of its own: SmolLM2's default one would take most of the context.
    c.messages = {{"system", i % 3 == 0 ? "You answer." : "Be brief."},
                  {"user", std::string("Tell me about ") + std::string(1 + i % 5, char('a' + i))}};
    const std::size_t n = i % 5 == 0 ? 2 : 1, max_tokens = 2 + (i * 7) % 20;
    const nn::SamplingOptions sampling{.temperature = temperatures[i % 4], .top_k = i % 2 ? 9u : 0u};
    json messages = json::array();
    for (const auto& m : c.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
    c.body = {{"messages", messages}, {"max_tokens", max_tokens}, {"seed", 100 + i}, {"n", n},
              {"temperature", sampling.temperature}, {"top_k", sampling.top_k}, {"stream", i % 2 == 1}};
    for (std::size_t k = 0; k < n; ++k)
      c.expected.push_back(
          reference_reply(*weights, chat_prompt(*weights, c.messages), sampling, max_tokens, 100 + i + k));
  }
  std::vector<std::thread> clients;
  for (Case& c : cases)
    clients.emplace_back([&s, &c] {
      httplib::Client client = s.client();
      auto r = client.Post("/v1/chat/completions", c.body.dump(), "application/json");
      if (!r || r->status != 200) {
        c.got.push_back(r ? r->body : "no answer");
        return;
      }
      if (c.body["stream"].get<bool>()) {
        std::map<std::size_t, std::string> content;
        std::size_t at = 0;
        while ((at = r->body.find("data: {", at)) != std::string::npos) {
          const json chunk = json::parse(r->body.substr(at + 6, r->body.find("\n\n", at) - at - 6));
          for (const auto& choice : chunk["choices"])
            content[choice["index"]] += choice["delta"].value("content", "");
          ++at;
        }
        for (const auto& [index, text] : content) c.got.push_back(text);
      } else {
        const json answer = json::parse(r->body);
        for (const auto& choice : answer["choices"]) c.got.push_back(choice["message"]["content"]);
      }
    });
  for (auto& t : clients) t.join();
  for (const Case& c : cases) {
    CAPTURE(c.body.dump());
    std::vector<std::string> expected;
    for (const Reply& reply : c.expected) expected.push_back(reply.text);
    CHECK_MESSAGE(c.got == expected, fmt::format("{} != {}", fmt::join(c.got, " | "), fmt::join(expected, " | ")));
  }
}

TEST_CASE("chat errors: a checkpoint without a template names --chat-template; with chatml it chats") {
  ServeDir dir("chat_errors");
  const fs::path ckpt = dir.path / "tiny.safetensors";
  // ChatML's markers are characters of the vocabulary.
  write_tiny_checkpoint(ckpt, 3, "rotary", 0, kServeVocab + "<|>_");
  const json hello = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}, {"seed", 1}};
  {
    TestServer s(test_options(ckpt));
    httplib::Client client = s.client();
    auto r = client.Post("/v1/chat/completions", hello.dump(), "application/json");
    REQUIRE(r);
    CHECK(r->status == 400);
    const json error = json::parse(r->body)["error"];
    CHECK(error["param"] == "messages");
    CHECK(error["code"] == "no_chat_template");
    CHECK(contains(error["message"], "has no chat template"));
    CHECK(contains(error["message"], "--chat-template"));
    auto models = client.Get("/v1/models");
    REQUIRE(models);
    CHECK(json::parse(models->body)["data"][0]["chat_template"].is_null());
    const std::pair<const char*, const char*> refused[] = {
        {R"({"max_tokens": 3})", "messages"},
        {R"({"messages": []})", "messages"},
        {R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role"},
        {R"({"messages": [{"role": "user", "content": null}]})", "messages[0].content"},
    };
    for (const auto& [body, param] : refused) {
      CAPTURE(body);
      auto bad = client.Post("/v1/chat/completions", body, "application/json");
      REQUIRE(bad);
      CHECK(bad->status == 400);
      CHECK(json::parse(bad->body)["error"]["param"] == param);
      CHECK(json::parse(bad->body)["error"]["type"] == "invalid_request_error");
    }
  }
  serve::ServerOptions options = test_options(ckpt);
  options.chat_template = "chatml";
  TestServer s(options);
  const json answer = post(s, "/v1/chat/completions", hello);
  const std::string prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  CHECK(answer["choices"][0]["message"]["content"] ==
        reference_texts(ckpt, prompt, {}, 4, 1)[0]);
  CHECK(answer["usage"]["prompt_tokens"] == prompt.size());
  // A conversation the context cannot hold with the reply.
  httplib::Client client = s.client();
  const json too_long = {{"messages", {{{"role", "user"}, {"content", std::string(60, 'a')}}}}};
  auto r = client.Post("/v1/chat/completions", too_long.dump(), "application/json");
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(json::parse(r->body)["error"]["code"] == "context_length_exceeded");
}

TEST_CASE("serve --model with SmolLM2: \"What is the capital of France?\" greedy, the reply names Paris") {
  // It tests the model through the server, not the kernels: once, at the widest SIMD level.
  if (simd_level() != supported_simd_levels().back()) return;
  const std::optional<std::string> path = smollm2_path();
  if (!path) return;
  serve::ServerOptions options = model_options(*path);
  options.scheduler.parallel = 1;
  options.scheduler.ctx = 256;
  TestServer s(options);
  const json answer = post(s, "/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
                            {"max_tokens", 24}, {"temperature", 0}});
  const std::string reply = answer["choices"][0]["message"]["content"];
  MESSAGE("SmolLM2: ", reply);
  CHECK_MESSAGE(contains(reply, "Paris"), reply);
  CHECK(answer["model"] == "SmolLM2-135M-Instruct.Q4_1");
}

TEST_CASE("the serve program: --model with --ctx, --chat-template and --kv-cache chats; --model excludes "
          "--checkpoint") {
  const fs::path dir = work_dir("serve_chat_program");
  Result both = run("serve", {"--checkpoint", "x.safetensors", "--model", kTinyLlama});
  CHECK(both.status == 2);
  CHECK(one_error_line(both, "serve"));
  Result neither = run("serve", {"--port", "0"});
  CHECK(neither.status == 2);
  CHECK(contains(neither.err, "--checkpoint FILE"));
  CHECK(contains(neither.err, "--model PATH"));
  Result help = run("serve", {"--help"});
  CHECK(contains(help.out, "loaded once"));
  Result too_long = run("serve", {"--model", kTinyLlama, "--port", "0", "--ctx", "200"});
  CHECK(too_long.status == 1);
  CHECK(contains(too_long.err, "--ctx 200 is more than the model's max_len of 128"));
  Result unknown_template = run("serve", {"--model", kTinyLlama, "--port", "0", "--chat-template", "vicuna"});
  CHECK(unknown_template.status == 1);
  CHECK(contains(unknown_template.err, "neither chatml, llama3 nor a file"));
  Result unknown_weights = run("serve", {"--model", kTinyLlama, "--port", "0", "--weights", "q5_0"});
  CHECK(unknown_weights.status == 2);
  CHECK(contains(unknown_weights.err, "--weights"));
  Result unknown_cache = run("serve", {"--model", kTinyLlama, "--port", "0", "--kv-cache", "q8_0"});
  CHECK(unknown_cache.status == 2);
  CHECK(contains(unknown_cache.err, "--kv-cache"));

  const fs::path out = dir / "serve.out", err = dir / "serve.err";
  const pid_t pid = start("serve",
                          {"--model", kTinyLlama + "/tiny_llama.q8_0.gguf", "--weights", "file", "--port", "0", "--ctx",
                           "100", "--chat-template", "chatml", "--threads", "1", "--kv-cache", "f16"},
                          out, err);
  httplib::Client client("127.0.0.1", port_of(err));
  client.set_read_timeout(20);
  auto models = client.Get("/v1/models");
  REQUIRE(models);
  const json model = json::parse(models->body)["data"][0];
  CHECK(model["context"] == 100);
  CHECK(model["format"] == "gguf");
  CHECK(model["chat_template"] == "chatml");
  // Plain ChatML in place of the file's own: no default system message.
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"seed", 2}};
  auto r = client.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  const json answer = json::parse(r->body);
  const std::shared_ptr<const serve::Weights> weights =
      serve::load_pretrained_weights(kTinyLlama + "/tiny_llama.q8_0.gguf", "chatml", "", "file");
  const std::vector<std::int32_t> prompt = chat_prompt(*weights, {{"user", "Hi"}});
  CHECK(answer["usage"]["prompt_tokens"] == prompt.size());
  // Without max_tokens the reply may fill the context.
  const Reply expected = reference_reply(*weights, prompt, {}, 100 - prompt.size(), 2, {}, nn::KVCacheType::f16);
  CHECK(answer["choices"][0]["message"]["content"] == expected.text);
  CHECK(answer["choices"][0]["finish_reason"] == expected.finish_reason);
  REQUIRE(::kill(pid, SIGTERM) == 0);
  CHECK(wait_for(pid) == 0);
  fs::remove_all(dir);
}
