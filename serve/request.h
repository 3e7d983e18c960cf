// The bodies of POST /v1/completions and /v1/chat/completions, parsed and checked as pure
// functions of their bytes (so they are fuzzed without HTTP), their checks against the loaded
// model, and OpenAI's error body.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "nn/sampling.h"
#include "tokenizers/chat_template.h"
#include "tokenizers/tokenizer.h"

namespace tapegrad::serve {

/// An error answered with OpenAI's body {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;                   ///< the HTTP status
  std::string message;                ///< what went wrong, naming the values involved
  std::string type = "invalid_request_error";  ///< OpenAI's error type
  std::optional<std::string> param;   ///< the request field at fault, if one is
  std::optional<std::string> code;    ///< a machine-readable code, if any
};

/// The JSON text of OpenAI's error body for an error.
std::string error_body(const ApiError& error);

/// What an exception says (its what(), or "unknown error" for one that is not a std::exception),
/// for an error body.
std::string message_of(std::exception_ptr error);

/// A completion request: OpenAI's fields (top_k is an extension); absent fields take OpenAI's
/// defaults. Unknown fields are ignored, as OpenAI clients send fields this server has no use for.
struct CompletionRequest {
  std::string model;                    ///< ignored: the server has one model
  std::string prompt;                   ///< the text to continue (UTF-8, not empty)
  std::size_t max_tokens = 16;          ///< the most new tokens per sample
  nn::SamplingOptions sampling;         ///< temperature, top_k, top_p
  std::optional<std::uint64_t> seed;    ///< sample i draws with seed + i; absent: the server picks one
  std::vector<std::string> stop;        ///< up to 4 strings that end a sample (not included in its text)
  bool stream = false;                  ///< answer with server-sent events
  bool include_usage = false;           ///< stream_options.include_usage: a last chunk with the usage
  std::size_t n = 1;                    ///< samples
  bool echo = false;                    ///< each text starts with the prompt
  /// Not a field of the body: the prompt is a rendered chat, which carries its own BOS (the
  /// template's bos_token), so none is added before it.
  bool rendered_chat = false;
};

/// The most samples one request may ask for, and the most stop strings (OpenAI's limit).
inline constexpr std::size_t kMaxSamples = 128, kMaxStops = 4;

/// Parses a request body: malformed JSON, a body that is not an object, a field of the wrong
/// type or out of range is a 400 ApiError naming the field and the value. Never throws.
std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body);

/// A chat request: OpenAI's chat fields. The sampling and streaming fields are a completion's
/// (its prompt is the rendered conversation); max_tokens is absent unless given.
struct ChatRequest {
  std::vector<tokenizers::ChatMessage> messages;  ///< role system, user or assistant; text content
  /// max_completion_tokens, or the older max_tokens; absent: the rest of the context.
  std::optional<std::size_t> max_tokens;
  /// model, temperature, top_p, top_k, seed, stop, stream, stream_options and n (prompt and
  /// max_tokens are set by chat_completion_request).
  CompletionRequest settings;
};

/// Parses a chat request body as parse_completion_request does: every error names its field, a
/// message's as messages[i].role or messages[i].content. Content is a string or a list of
/// {"type": "text", "text"} parts, joined. Never throws.
std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body);

/// What a request may ask of the loaded model.
struct ModelLimits {
  std::size_t max_len = 0;     ///< the longest text a sequence holds (prompt + new tokens)
  bool cut_by_ctx = false;     ///< max_len is --ctx, shorter than the model's own
  std::size_t max_tokens = 0;  ///< the server's cap on max_tokens
  std::size_t parallel = 0;    ///< the sequences decoded together: the most samples a request can have
};

/// The prompt's token ids (after the BOS when the tokenizer asks for one and the prompt is not a
/// rendered chat), or a 400 ApiError: a character outside a character vocabulary (named), the
/// prompt plus max_tokens past max_len (both numbers given), max_tokens over the server's cap, or
/// more samples than sequences.
std::variant<std::vector<std::int32_t>, ApiError> check_against_model(const CompletionRequest& request,
                                                                     const tokenizers::Tokenizer& tokenizer,
                                                                     const ModelLimits& limits);

/// The completion a chat request asks for: its messages rendered by chat_template with the
/// generation prompt (bos_token: the tokenizer's BOS text), max_tokens the rest of the context
/// when not given. A 400 ApiError when there is no template (naming why, and --chat-template) or
/// the conversation leaves no room for a reply.
std::variant<CompletionRequest, ApiError> chat_completion_request(
    const ChatRequest& request, const tokenizers::ChatTemplate* chat_template, const std::string& no_chat_template,
    const tokenizers::Tokenizer& tokenizer, const ModelLimits& limits);

}  // namespace tapegrad::serve
