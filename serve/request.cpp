// Parsing and checking a completion request, and OpenAI's error body.
#include "serve/request.h"

#include <fmt/format.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "tokenizers/utf8.h"

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

// The fields completions and chats share: model, sampling, seed, stop, streaming and n.
void parse_settings(const json& body, CompletionRequest& r) {
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
}

void require_object(const json& body) {
  if (!body.is_object()) fail("", fmt::format("the request body must be a JSON object, got {}", shown(body)));
}

CompletionRequest parse_completion_fields(const json& body) {
  require_object(body);
  CompletionRequest r;
  if (const json* v = field(body, "model")) r.model = string_field(*v, "model");
  const json* prompt = field(body, "prompt");
  if (!prompt) fail("prompt", "'prompt' is required: the text to continue");
  r.prompt = string_field(*prompt, "prompt");
  if (r.prompt.empty()) fail("prompt", "'prompt' is empty; give at least one character");
  if (const json* v = field(body, "max_tokens"))
    r.max_tokens = unsigned_field(*v, "max_tokens", 0, std::numeric_limits<std::uint32_t>::max());
  parse_settings(body, r);
  if (const json* v = field(body, "echo")) r.echo = bool_field(*v, "echo");
  return r;
}

// A message's content: a string, or text parts joined by newlines (as vLLM joins them).
std::string message_content(const json& content, const std::string& name) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    fail(name, fmt::format("'{}' must be a string or a list of text parts, got {}", name, shown(content)));
  std::string text;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const std::string part_name = fmt::format("{}[{}]", name, i);
    const json& part = content[i];
    if (!part.is_object())
      fail(part_name, fmt::format("'{}' must be an object {{\"type\": \"text\", \"text\": ...}}, got {}", part_name,
                                  shown(part)));
    const json* type = field(part, "type");
    if (!type || *type != "text")
      fail(part_name + ".type", fmt::format("'{}.type' must be \"text\" (this server reads text only), got {}",
                                            part_name, type ? shown(*type) : "nothing"));
    const json* part_text = field(part, "text");
    if (!part_text) fail(part_name + ".text", fmt::format("'{}.text' is required", part_name));
    text += (i == 0 ? "" : "\n") + string_field(*part_text, part_name + ".text");
  }
  return text;
}

ChatRequest parse_chat_fields(const json& body) {
  require_object(body);
  ChatRequest r;
  if (const json* v = field(body, "model")) r.settings.model = string_field(*v, "model");
  const json* messages = field(body, "messages");
  if (!messages) fail("messages", "'messages' is required: a list of {\"role\", \"content\"} objects");
  if (!messages->is_array())
    fail("messages", fmt::format("'messages' must be a list of {{\"role\", \"content\"}} objects, got {}",
                                 shown(*messages)));
  if (messages->empty()) fail("messages", "'messages' is empty; give at least one message");
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const std::string name = fmt::format("messages[{}]", i);
    const json& message = (*messages)[i];
    if (!message.is_object())
      fail(name, fmt::format("'{}' must be an object {{\"role\", \"content\"}}, got {}", name, shown(message)));
    const json* role = field(message, "role");
    if (!role) fail(name + ".role", fmt::format("'{}.role' is required: system, user or assistant", name));
    const std::string role_text = string_field(*role, name + ".role");
    if (role_text != "system" && role_text != "user" && role_text != "assistant")
      fail(name + ".role", fmt::format("'{}.role' must be system, user or assistant, got {}", name, shown(*role)));
    const json* content = field(message, "content");
    if (!content) fail(name + ".content", fmt::format("'{}.content' is required: the message's text", name));
    r.messages.push_back({role_text, message_content(*content, name + ".content")});
  }
  const json* max_tokens = field(body, "max_tokens");
  const json* max_completion_tokens = field(body, "max_completion_tokens");
  if (max_tokens && max_completion_tokens && *max_tokens != *max_completion_tokens)
    fail("max_completion_tokens", fmt::format("'max_completion_tokens' is {} and 'max_tokens' is {}: give one of them",
                                              shown(*max_completion_tokens), shown(*max_tokens)));
  if (max_completion_tokens)
    r.max_tokens = unsigned_field(*max_completion_tokens, "max_completion_tokens", 1,
                                  std::numeric_limits<std::uint32_t>::max());
  else if (max_tokens)
    r.max_tokens = unsigned_field(*max_tokens, "max_tokens", 1, std::numeric_limits<std::uint32_t>::max());
  parse_settings(body, r.settings);
  return r;
}

// A parser's result: its request, or the ApiError of malformed JSON or a field at fault.
template <class Request>
std::variant<Request, ApiError> parse_body(std::string_view body, Request (*parse_fields)(const json&)) {
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

}  // namespace

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body) {
  return parse_body(body, parse_completion_fields);
}

std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body) {
  return parse_body(body, parse_chat_fields);
}

namespace {

ApiError request_error(std::string param, std::string message, std::string code) {
  return ApiError{.status = 400, .message = std::move(message), .param = std::move(param), .code = std::move(code)};
}

// The error of a prompt a character vocabulary cannot encode: every character it lacks, in order
// of first appearance (the prompt is valid UTF-8: the JSON parser checked it).
ApiError unknown_characters(const CompletionRequest& request, const tokenizers::Tokenizer& tokenizer) {
  std::vector<char32_t> unknown;
  std::set<char32_t> seen;
  for (char32_t c : tokenizers::decode_utf8(request.prompt)) {
    if (!seen.insert(c).second) continue;
    std::string one;
    tokenizers::append_utf8(one, c);
    try {
      tokenizer.encode(one);
    } catch (const std::invalid_argument&) {
      unknown.push_back(c);
    }
  }
  std::string names;
  for (char32_t c : unknown) names += (names.empty() ? "" : ", ") + tokenizers::describe_char(c);
  return request_error(request.rendered_chat ? "messages" : "prompt",
                       fmt::format("the {} has {} {} outside the model's vocabulary of {}: {}",
                                   request.rendered_chat ? "conversation (rendered by the chat template)" : "prompt",
                                   unknown.size(), unknown.size() == 1 ? "character" : "characters",
                                   tokenizer.vocab_size(), names),
                       "unknown_characters");
}

std::string context_name(const ModelLimits& limits) {
  return limits.cut_by_ctx ? fmt::format("this server's context of {} (--ctx)", limits.max_len)
                           : fmt::format("the model's max_len of {}", limits.max_len);
}

}  // namespace

std::variant<std::vector<std::int32_t>, ApiError> check_against_model(const CompletionRequest& request,
                                                                     const tokenizers::Tokenizer& tokenizer,
                                                                     const ModelLimits& limits) {
  std::vector<std::int32_t> ids;
  try {
    ids = tokenizer.encode(request.prompt);
  } catch (const std::invalid_argument&) {
    return unknown_characters(request, tokenizer);
  }
  if (!request.rendered_chat && tokenizer.add_bos() && tokenizer.bos_id()) ids.insert(ids.begin(), *tokenizer.bos_id());
  const char* unit = tokenizer.kind() == "char" ? "characters" : "tokens";
  if (ids.size() + request.max_tokens > limits.max_len)
    return request_error("max_tokens",
                         fmt::format("the prompt has {} {} and max_tokens is {}: {} in all, more than {}", ids.size(),
                                     unit, request.max_tokens, ids.size() + request.max_tokens, context_name(limits)),
                         "context_length_exceeded");
  if (request.max_tokens > limits.max_tokens)
    return request_error("max_tokens",
                         fmt::format("'max_tokens' is {}, more than this server's limit of {}", request.max_tokens,
                                     limits.max_tokens),
                         "max_tokens_too_large");
  if (request.n > limits.parallel)
    return request_error("n",
                         fmt::format("'n' is {}, more than the {} sequences this server decodes together (--parallel)",
                                     request.n, limits.parallel),
                         "too_many_samples");
  return ids;
}

std::variant<CompletionRequest, ApiError> chat_completion_request(
    const ChatRequest& request, const tokenizers::ChatTemplate* chat_template, const std::string& no_chat_template,
    const tokenizers::Tokenizer& tokenizer, const ModelLimits& limits) {
  if (!chat_template)
    return request_error("messages",
                         fmt::format("{}: start the server with --chat-template chatml|llama3|FILE to chat with it, "
                                     "or use /v1/completions",
                                     no_chat_template),
                         "no_chat_template");
  CompletionRequest completion = request.settings;
  completion.rendered_chat = true;
  const std::optional<std::int32_t> bos = tokenizer.bos_id();
  try {
    completion.prompt = chat_template->render(request.messages, /*add_generation_prompt=*/true,
                                              bos ? tokenizer.token_bytes(*bos) : std::string());
  } catch (const std::exception& e) {
    return request_error("messages", fmt::format("the chat template cannot render the messages: {}", e.what()),
                         "invalid_messages");
  }
  if (request.max_tokens) {
    completion.max_tokens = *request.max_tokens;
    return completion;
  }
  // The reply may take the rest of the context, up to the server's cap.
  std::size_t prompt_tokens = 0;
  try {
    prompt_tokens = tokenizer.encode(completion.prompt).size();
  } catch (const std::invalid_argument&) {
    return unknown_characters(completion, tokenizer);
  }
  if (prompt_tokens >= limits.max_len)
    return request_error("messages",
                         fmt::format("the conversation (rendered by the chat template) has {} tokens: no room for a "
                                     "reply within {}",
                                     prompt_tokens, context_name(limits)),
                         "context_length_exceeded");
  completion.max_tokens = std::min(limits.max_tokens, limits.max_len - prompt_tokens);
  return completion;
}

}  // namespace tapegrad::serve
