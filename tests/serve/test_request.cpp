// The completion request parser and its checks against the model: pure functions, no HTTP.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "serve/request.h"
#include "support/helpers.h"
#include "tokenizers/char_tokenizer.h"

using namespace tapegrad;
using namespace tapegrad::serve;

namespace {

CompletionRequest parsed(const std::string& body) {
  auto result = parse_completion_request(body);
  if (auto* error = std::get_if<ApiError>(&result)) FAIL_CHECK(body << " was refused: " << error->message);
  REQUIRE(std::holds_alternative<CompletionRequest>(result));
  return std::get<CompletionRequest>(result);
}

ApiError refused(const std::string& body) {
  auto result = parse_completion_request(body);
  REQUIRE_MESSAGE(std::holds_alternative<ApiError>(result), body << " was accepted");
  return std::get<ApiError>(result);
}

}  // namespace

TEST_CASE("a completion request takes OpenAI's fields and defaults; unknown fields and nulls are ignored") {
  CompletionRequest defaults = parsed(R"({"prompt": "The"})");
  CHECK(defaults.prompt == "The");
  CHECK(defaults.max_tokens == 16);
  CHECK(defaults.sampling.temperature == 1.0f);
  CHECK(defaults.sampling.top_p == 1.0f);
  CHECK(defaults.sampling.top_k == 0);
  CHECK(!defaults.seed);
  CHECK(defaults.stop.empty());
  CHECK(!defaults.stream);
  CHECK(!defaults.include_usage);
  CHECK(defaults.n == 1);
  CHECK(!defaults.echo);

  CompletionRequest full = parsed(
      R"({"model": "tiny", "prompt": "caf\u00e9", "max_tokens": 20, "temperature": 0, "top_p": 0.5, "top_k": 3,
          "seed": 18446744073709551615, "stop": ["\n", "."], "stream": true, "stream_options": {"include_usage": true},
          "n": 3, "echo": true, "user": "someone", "logit_bias": {}, "suffix": null})");
  CHECK(full.model == "tiny");
  CHECK(full.prompt == "caf\xc3\xa9");
  CHECK(full.max_tokens == 20);
  CHECK(full.sampling.temperature == 0.0f);
  CHECK(full.sampling.top_p == 0.5f);
  CHECK(full.sampling.top_k == 3);
  CHECK(*full.seed == 18446744073709551615ull);
  CHECK(full.stop == std::vector<std::string>{"\n", "."});
  CHECK(full.stream);
  CHECK(full.include_usage);
  CHECK(full.n == 3);
  CHECK(full.echo);
  CHECK(parsed(R"({"prompt": "a", "stop": "x", "temperature": null, "max_tokens": null})").stop ==
        std::vector<std::string>{"x"});
}

TEST_CASE("malformed JSON, wrong types and out-of-range values are 400 errors naming the field and value") {
  ApiError not_json = refused(R"({"prompt": "a")");
  CHECK(not_json.status == 400);
  CHECK(test::contains(not_json.message, "not valid JSON"));
  CHECK(test::contains(refused("[1, 2]").message, "must be a JSON object"));
  CHECK(test::contains(refused("").message, "not valid JSON"));
  CHECK(test::contains(refused("{\"prompt\": \"\xff\"}").message, "not valid JSON"));  // invalid UTF-8

  struct Case {
    const char* body;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {R"({})", "prompt", "'prompt' is required"},
      {R"({"prompt": ""})", "prompt", "'prompt' is empty"},
      {R"({"prompt": ["a", "b"]})", "prompt", "'prompt' must be a string, got [\"a\",\"b\"]"},
      {R"({"prompt": "a", "max_tokens": "5"})", "max_tokens", "'max_tokens' must be an integer, got \"5\""},
      {R"({"prompt": "a", "max_tokens": -1})", "max_tokens", "'max_tokens' must be at least 0, got -1"},
      {R"({"prompt": "a", "max_tokens": 2.5})", "max_tokens", "must be an integer, got 2.5"},
      {R"({"prompt": "a", "temperature": 3})", "temperature", "'temperature' must be in [0, 2], got 3"},
      {R"({"prompt": "a", "temperature": -0.5})", "temperature", "got -0.5"},
      {R"({"prompt": "a", "top_p": 0})", "top_p", "'top_p' must be in (0, 1], got 0"},
      {R"({"prompt": "a", "top_k": -2})", "top_k", "'top_k' must be at least 0, got -2"},
      {R"({"prompt": "a", "seed": -1})", "seed", "'seed' must be at least 0, got -1"},
      {R"({"prompt": "a", "seed": "7"})", "seed", "must be an integer"},
      {R"({"prompt": "a", "stop": 5})", "stop", "'stop' must be a string or a list of strings, got 5"},
      {R"({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})", "stop", "at most 4 strings, got 5"},
      {R"({"prompt": "a", "stop": [""]})", "stop", "must not be empty"},
      {R"({"prompt": "a", "stop": [1]})", "stop", "'stop' must be a string, got 1"},
      {R"({"prompt": "a", "stream": "yes"})", "stream", "'stream' must be true or false, got \"yes\""},
      {R"({"prompt": "a", "stream_options": {"include_usage": true}})", "stream_options", "only allowed with"},
      {R"({"prompt": "a", "stream": true, "stream_options": 1})", "stream_options", "must be an object"},
      {R"({"prompt": "a", "n": 0})", "n", "'n' must be at least 1, got 0"},
      {R"({"prompt": "a", "n": 1000})", "n", "'n' must be at most 128, got 1000"},
      {R"({"prompt": "a", "echo": 1})", "echo", "'echo' must be true or false"},
      {R"({"prompt": "a", "model": 7})", "model", "'model' must be a string"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.body);
    ApiError error = refused(c.body);
    CHECK(error.status == 400);
    CHECK(error.type == "invalid_request_error");
    CHECK(error.param == std::optional<std::string>(c.param));
    CHECK_MESSAGE(test::contains(error.message, c.says), error.message);
  }
}

TEST_CASE("OpenAI's error body has message, type, param and code, null where absent") {
  const nlohmann::json body = nlohmann::json::parse(
      error_body({.status = 400, .message = "bad \"x\"", .param = "prompt", .code = "invalid_value"}));
  CHECK(body == nlohmann::json::parse(
                    R"({"error": {"message": "bad \"x\"", "type": "invalid_request_error", "param": "prompt",
                                  "code": "invalid_value"}})"));
  const nlohmann::json bare = nlohmann::json::parse(error_body({.status = 503, .message = "m", .type = "server_error"}));
  CHECK(bare["error"]["param"].is_null());
  CHECK(bare["error"]["code"].is_null());
}

TEST_CASE("a request is checked against the model: unknown characters, max_len, the max_tokens cap, n") {
  const tokenizers::CharTokenizer tokenizer = tokenizers::CharTokenizer::from_text("abc \xc3\xa9");
  const ModelLimits limits{.max_len = 10, .max_tokens = 8, .parallel = 2};
  auto check = [&](const std::string& body) {
    return check_against_model(parsed(body), tokenizer, limits);
  };
  auto ok = check(R"({"prompt": "ab\u00e9", "max_tokens": 7})");
  REQUIRE(std::holds_alternative<std::vector<std::int32_t>>(ok));
  CHECK(std::get<std::vector<std::int32_t>>(ok).size() == 3);

  auto error = [&](const std::string& body) {
    auto result = check(body);
    REQUIRE_MESSAGE(std::holds_alternative<ApiError>(result), body << " was accepted");
    return std::get<ApiError>(result);
  };
  ApiError unknown = error(R"({"prompt": "axbyx\u20ac"})");
  CHECK(unknown.status == 400);
  CHECK(unknown.param == std::optional<std::string>("prompt"));
  CHECK(unknown.message == "the prompt has 3 characters outside the model's vocabulary of 5: 'x', 'y', "
                           "'\xe2\x82\xac' (U+20AC)");
  ApiError too_long = error(R"({"prompt": "abcab", "max_tokens": 6})");
  CHECK(too_long.code == std::optional<std::string>("context_length_exceeded"));
  CHECK(too_long.message ==
        "the prompt has 5 characters and max_tokens is 6: 11 in all, more than the model's max_len of 10");
  CHECK(test::contains(error(R"({"prompt": "a", "max_tokens": 9})").message, "more than this server's limit of 8"));
  CHECK(test::contains(error(R"({"prompt": "a", "max_tokens": 2, "n": 3})").message, "'n' is 3, more than the 2 sequences"));
}

namespace {

ChatRequest parsed_chat(const std::string& body) {
  auto result = parse_chat_request(body);
  if (auto* error = std::get_if<ApiError>(&result)) FAIL_CHECK(body << " was refused: " << error->message);
  REQUIRE(std::holds_alternative<ChatRequest>(result));
  return std::get<ChatRequest>(result);
}

}  // namespace

TEST_CASE("a chat request takes OpenAI's chat fields: messages of three roles, text parts, max_completion_tokens") {
  const ChatRequest defaults = parsed_chat(R"({"messages": [{"role": "user", "content": "Hi"}]})");
  REQUIRE(defaults.messages.size() == 1);
  CHECK(defaults.messages[0].role == "user");
  CHECK(defaults.messages[0].content == "Hi");
  CHECK(!defaults.max_tokens);
  CHECK(defaults.settings.sampling.temperature == 1.0f);
  CHECK(defaults.settings.n == 1);
  CHECK(!defaults.settings.stream);

  const ChatRequest full = parsed_chat(
      R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                                   {"type": "text", "text": "there"}]},
                                      {"role": "assistant", "content": "Hi!", "name": "bot"},
                                      {"role": "user", "content": "Bye"}],
          "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 3, "n": 2, "seed": 9,
          "stop": "\n", "stream": true, "stream_options": {"include_usage": true}, "logprobs": false})");
  REQUIRE(full.messages.size() == 4);
  CHECK(full.messages[0].role == "system");
  CHECK(full.messages[1].content == "Hello\nthere");  // text parts joined by newlines
  CHECK(full.messages[2].role == "assistant");
  CHECK(full.max_tokens == std::optional<std::size_t>(7));
  CHECK(full.settings.model == "m");
  CHECK(full.settings.sampling.temperature == 0.0f);
  CHECK(full.settings.sampling.top_p == 0.5f);
  CHECK(full.settings.sampling.top_k == 3);
  CHECK(full.settings.n == 2);
  CHECK(full.settings.seed == std::optional<std::uint64_t>(9));
  CHECK(full.settings.stop == std::vector<std::string>{"\n"});
  CHECK(full.settings.include_usage);
  CHECK(parsed_chat(R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 5})").max_tokens ==
        std::optional<std::size_t>(5));
  CHECK(parsed_chat(R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 5, "max_completion_tokens": 5})")
            .max_tokens == std::optional<std::size_t>(5));
}

TEST_CASE("every chat request error is a 400 naming its field, a message's by its index") {
  CHECK(test::contains(std::get<ApiError>(parse_chat_request("{")).message, "not valid JSON"));
  struct Case {
    const char* body;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {R"({})", "messages", "'messages' is required"},
      {R"({"messages": "hi"})", "messages", "'messages' must be a list"},
      {R"({"messages": []})", "messages", "'messages' is empty"},
      {R"({"messages": ["hi"]})", "messages[0]", "'messages[0]' must be an object"},
      {R"({"messages": [{"content": "hi"}]})", "messages[0].role", "'messages[0].role' is required"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]})", "messages[1].role",
       "'messages[1].role' must be system, user or assistant, got \"tool\""},
      {R"({"messages": [{"role": 3, "content": "a"}]})", "messages[0].role", "must be a string, got 3"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content", "'messages[0].content' is required"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "must be a string or a list of text parts, got 5"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[0].type", "must be \"text\""},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages[0].content[0].text",
       "'messages[0].content[0].text' is required"},
      {R"({"messages": [{"role": "user", "content": [7]}]})", "messages[0].content[0]", "must be an object"},
      {R"({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 0})", "max_completion_tokens",
       "must be at least 1, got 0"},
      {R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": "9"})", "max_tokens", "must be an integer"},
      {R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 4, "max_completion_tokens": 5})",
       "max_completion_tokens", "give one of them"},
      {R"({"messages": [{"role": "user", "content": "a"}], "temperature": 5})", "temperature", "must be in [0, 2]"},
      {R"({"messages": [{"role": "user", "content": "a"}], "n": 0})", "n", "'n' must be at least 1"},
      {R"({"messages": [{"role": "user", "content": "a"}], "stop": [""]})", "stop", "must not be empty"},
      {R"({"messages": [{"role": "user", "content": "a"}], "stream_options": {}})", "stream_options",
       "only allowed with"},
      {R"({"messages": [{"role": "user", "content": "a"}], "seed": -3})", "seed", "at least 0"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.body);
    auto result = parse_chat_request(c.body);
    REQUIRE_MESSAGE(std::holds_alternative<ApiError>(result), c.body << " was accepted");
    const ApiError& error = std::get<ApiError>(result);
    CHECK(error.status == 400);
    CHECK(error.param == std::optional<std::string>(c.param));
    CHECK_MESSAGE(test::contains(error.message, c.says), error.message);
  }
}

TEST_CASE("a chat request becomes a completion of its rendered messages, or a 400 naming --chat-template") {
  const tokenizers::CharTokenizer tokenizer =
      tokenizers::CharTokenizer::from_text("abcdefghijklmnopqrstuvwxyz<|>_\n .");
  const ModelLimits limits{.max_len = 100, .max_tokens = 60, .parallel = 2};
  const ChatRequest request = parsed_chat(R"({"messages": [{"role": "user", "content": "hi"}], "seed": 3})");
  const auto refused =
      chat_completion_request(request, nullptr, "the checkpoint x has no chat template", tokenizer, limits);
  REQUIRE(std::holds_alternative<ApiError>(refused));
  const ApiError& no_template = std::get<ApiError>(refused);
  CHECK(no_template.status == 400);
  CHECK(no_template.param == std::optional<std::string>("messages"));
  CHECK(no_template.code == std::optional<std::string>("no_chat_template"));
  CHECK(test::contains(no_template.message, "the checkpoint x has no chat template"));
  CHECK(test::contains(no_template.message, "--chat-template chatml|llama3|FILE"));

  const tokenizers::ChatTemplate chatml = tokenizers::ChatTemplate::named("chatml");
  const auto made = chat_completion_request(request, &chatml, "", tokenizer, limits);
  REQUIRE(std::holds_alternative<CompletionRequest>(made));
  const CompletionRequest& completion = std::get<CompletionRequest>(made);
  const std::string rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  CHECK(completion.prompt == rendered);
  CHECK(completion.rendered_chat);
  CHECK(completion.seed == std::optional<std::uint64_t>(3));
  // Without max_tokens the reply may take the rest of the context, up to the server's cap.
  CHECK(completion.max_tokens == std::min<std::size_t>(60, 100 - rendered.size()));
  const ModelLimits short_context{.max_len = rendered.size() + 5, .max_tokens = 60, .parallel = 2};
  const auto shorter = chat_completion_request(request, &chatml, "", tokenizer, short_context);
  CHECK(std::get<CompletionRequest>(shorter).max_tokens == 5);
  const ModelLimits no_room{.max_len = rendered.size(), .max_tokens = 60, .parallel = 2};
  const auto full = chat_completion_request(request, &chatml, "", tokenizer, no_room);
  REQUIRE(std::holds_alternative<ApiError>(full));
  CHECK(std::get<ApiError>(full).code == std::optional<std::string>("context_length_exceeded"));
  CHECK(test::contains(std::get<ApiError>(full).message, "no room for a reply"));

  // A character the vocabulary lacks is named, and blamed on the messages.
  const ChatRequest unknown = parsed_chat(R"({"messages": [{"role": "user", "content": "hi!"}], "max_tokens": 2})");
  const auto unknown_chat = chat_completion_request(unknown, &chatml, "", tokenizer, limits);
  auto checked = check_against_model(std::get<CompletionRequest>(unknown_chat), tokenizer, limits);
  REQUIRE(std::holds_alternative<ApiError>(checked));
  CHECK(std::get<ApiError>(checked).param == std::optional<std::string>("messages"));
  CHECK(test::contains(std::get<ApiError>(checked).message, "1 character outside the model's vocabulary"));
}

namespace {

// Characters with a BOS that the tokenizer asks to be put before a prompt (as Llama 2's does).
class BosTokenizer : public tokenizers::CharTokenizer {
 public:
  BosTokenizer() : CharTokenizer(from_text("abc")) {}
  std::optional<std::int32_t> bos_id() const override { return 2; }
  bool add_bos() const override { return true; }
};

}  // namespace

TEST_CASE("a completion's prompt gets the BOS when the tokenizer asks for it; a rendered chat carries its own") {
  const BosTokenizer tokenizer;
  const ModelLimits limits{.max_len = 10, .max_tokens = 8, .parallel = 1};
  CompletionRequest request = parsed(R"({"prompt": "ab", "max_tokens": 2})");
  CHECK(std::get<std::vector<std::int32_t>>(check_against_model(request, tokenizer, limits)) ==
        std::vector<std::int32_t>{2, 0, 1});
  request.rendered_chat = true;
  CHECK(std::get<std::vector<std::int32_t>>(check_against_model(request, tokenizer, limits)) ==
        std::vector<std::int32_t>{0, 1});
  // The BOS counts toward the context.
  request.rendered_chat = false;
  request.max_tokens = 8;
  CHECK(std::get<ApiError>(check_against_model(request, tokenizer, limits)).message ==
        "the prompt has 3 characters and max_tokens is 8: 11 in all, more than the model's max_len of 10");
}
