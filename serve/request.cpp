// Parsing and checking a completion request, and OpenAI's error body.
#include "serve/request.h"

#include <fmt/format.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace tapegrad::serve {

using nlohmann::json;

std::string message_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

std::string error_body(const ApiError& error) {
  json body = {{"error",
                {{"message", error.message},
                 {"type", error.type},
                 {"param", error.param ? json(*error.param) : json(nullptr)},
                 {"code", error.code ? json(*error.code) : json(nullptr)}}}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// Thrown inside the parser only, and turned into its ApiError result.
struct FieldError {
  ApiError error;
};

[[noreturn]] void fail(const std::string& param, const std::string& message) {
  throw FieldError{{.status = 400, .message = message, .param = param, .code = "invalid_value"}};
}

// A value quoted for a message, cut short when long.
std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 40 ? text.substr(0, 37) + "..." : text;
}

// The field `name` if present and not null.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::uint64_t unsigned_field(const json& value, const std::string& name, std::uint64_t lowest, std::uint64_t highest) {
  if (!value.is_number_integer())
    fail(name, fmt::format("'{}' must be an integer, got {}", name, shown(value)));
  if (value.is_number_unsigned() ? value.get<std::uint64_t>() < lowest : value.get<std::int64_t>() < std::int64_t(lowest))
    fail(name, fmt::format("'{}' must be at least {}, got {}", name, lowest, shown(value)));
  const std::uint64_t v = value.get<std::uint64_t>();
  if (v > highest) fail(name, fmt::format("'{}' must be at most {}, got {}", name, highest, v));
  return v;
}

float number_field(const json& value, const std::string& name, double lowest, double highest, bool open_low = false) {
  if (!value.is_number()) fail(name, fmt::format("'{}' must be a number, got {}", name, shown(value)));
  const double v = value.get<double>();
  if (!(open_low ? v > lowest : v >= lowest) || !(v <= highest))
    fail(name, fmt::format("'{}' must be in {}{}, {}], got {}", name, open_low ? "(" : "[", lowest, highest, v));
  return float(v);
}

bool bool_field(const json& value, const std::string& name) {
  if (!value.is_boolean()) fail(name, fmt::format("'{}' must be true or false, got {}", name, shown(value)));
  return value.get<bool>();
}

std::string string_field(const json& value, const std::string& name) {
  if (!value.is_string()) fail(name, fmt::format("'{}' must be a string, got {}", name, shown(value)));
  return value.get<std::string>();
}

CompletionRequest parse_fields(const json& body) {
  if (!body.is_object()) fail("", fmt::format("the request body must be a JSON object, got {}", shown(body)));
  CompletionRequest r;
  if (const json* v = field(body, "model")) r.model = string_field(*v, "model");
  const json* prompt = field(body, "prompt");
  if (!prompt) fail("prompt", "'prompt' is required: the text to continue");
  r.prompt = string_field(*prompt, "prompt");
  if (r.prompt.empty()) fail("prompt", "'prompt' is empty; give at least one character");
  if (const json* v = field(body, "max_tokens"))
    r.max_tokens = unsigned_field(*v, "max_tokens", 0, std::numeric_limits<std::uint32_t>::max());
  if (const json* v = field(body, "temperature")) r.sampling.temperature = number_field(*v, "temperature", 0, 2);
  if (const json* v = field(body, "top_p")) r.sampling.top_p = number_field(*v, "top_p", 0, 1, true);
  if (const json* v = field(body, "top_k"))
    r.sampling.top_k = unsigned_field(*v, "top_k", 0, std::numeric_limits<std::uint32_t>::max());
  if (const json* v = field(body, "seed"))
    r.seed = unsigned_field(*v, "seed", 0, std::numeric_limits<std::uint64_t>::max());
  if (const json* v = field(body, "stop")) {
    if (v->is_string()) {
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > kMaxStops)
        fail("stop", fmt::format("'stop' may hold at most {} strings, got {}", kMaxStops, v->size()));
      for (const json& s : *v) r.stop.push_back(string_field(s, "stop"));
    } else {
      fail("stop", fmt::format("'stop' must be a string or a list of strings, got {}", shown(*v)));
    }
    for (const std::string& s : r.stop)
      if (s.empty()) fail("stop", "'stop' strings must not be empty");
  }
  if (const json* v = field(body, "stream")) r.stream = bool_field(*v, "stream");
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object())
      fail("stream_options", fmt::format("'stream_options' must be an object, got {}", shown(*v)));
    if (const json* u = field(*v, "include_usage")) r.include_usage = bool_field(*u, "stream_options.include_usage");
    if (!r.stream) fail("stream_options", "'stream_options' is only allowed with 'stream': true");
  }
  if (const json* v = field(body, "n")) r.n = unsigned_field(*v, "n", 1, kMaxSamples);
  if (const json* v = field(body, "echo")) r.echo = bool_field(*v, "echo");
  return r;
}

}  // namespace

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body) {
  json parsed;
  try {
    parsed = json::parse(body);
  } catch (const json::exception& e) {
    return ApiError{.status = 400,
                    .message = fmt::format("the request body is not valid JSON: {}", e.what()),
                    .code = "invalid_json"};
  }
  try {
    return parse_fields(parsed);
  } catch (const FieldError& e) {
    ApiError error = e.error;
    if (error.param && error.param->empty()) error.param.reset();
    return error;
  }
}

std::variant<std::vector<std::int32_t>, ApiError> check_against_model(const CompletionRequest& request,
                                                                     const nn::CharTokenizer& tokenizer,
                                                                     const ModelLimits& limits) {
  auto error = [](std::string param, std::string message, std::string code) {
    return ApiError{.status = 400, .message = std::move(message), .param = std::move(param), .code = std::move(code)};
  };
  std::vector<std::int32_t> ids;
  try {
    ids = tokenizer.encode(request.prompt);
  } catch (const std::invalid_argument&) {
    // Every character the vocabulary lacks, in order of first appearance (the prompt is valid
    // UTF-8: the JSON parser checked it).
    std::vector<char32_t> unknown;
    std::set<char32_t> seen;
    for (char32_t c : nn::decode_utf8(request.prompt)) {
      if (!seen.insert(c).second) continue;
      std::string one;
      nn::append_utf8(one, c);
      try {
        tokenizer.encode(one);
      } catch (const std::invalid_argument&) {
        unknown.push_back(c);
      }
    }
    std::string names;
    for (char32_t c : unknown) names += (names.empty() ? "" : ", ") + nn::describe_char(c);
    return error("prompt",
                 fmt::format("the prompt has {} {} outside the model's vocabulary of {}: {}", unknown.size(),
                             unknown.size() == 1 ? "character" : "characters", tokenizer.size(), names),
                 "unknown_characters");
  }
  if (ids.size() + request.max_tokens > limits.max_len)
    return error("max_tokens",
                 fmt::format("the prompt has {} characters and max_tokens is {}: {} in all, more than the model's "
                             "max_len of {}",
                             ids.size(), request.max_tokens, ids.size() + request.max_tokens, limits.max_len),
                 "context_length_exceeded");
  if (request.max_tokens > limits.max_tokens)
    return error("max_tokens",
                 fmt::format("'max_tokens' is {}, more than this server's limit of {}", request.max_tokens,
                             limits.max_tokens),
                 "max_tokens_too_large");
  if (request.n > limits.parallel)
    return error("n",
                 fmt::format("'n' is {}, more than the {} sequences this server decodes together (--parallel)",
                             request.n, limits.parallel),
                 "too_many_samples");
  return ids;
}

}  // namespace tapegrad::serve
