// The completion request parser and its checks against the model: pure functions, no HTTP.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "serve/request.h"
#include "support/helpers.h"

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
  const nn::CharTokenizer tokenizer = nn::CharTokenizer::from_text("abc \xc3\xa9");
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
