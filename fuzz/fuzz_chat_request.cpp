// libFuzzer target: arbitrary bytes as the body of POST /v1/chat/completions. The parser must never
// crash or throw: it returns a request whose messages and fields are in range, or a 400 error
// whose body is valid JSON.
#include <cstdint>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "serve/request.h"

using namespace tapegrad::serve;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto parsed = parse_chat_request(std::string_view(reinterpret_cast<const char*>(data), size));
  if (const auto* error = std::get_if<ApiError>(&parsed)) {
    if (error->status != 400 || error->message.empty()) __builtin_trap();
    if (!nlohmann::json::accept(error_body(*error))) __builtin_trap();
    return 0;
  }
  const ChatRequest& r = std::get<ChatRequest>(parsed);
  if (r.messages.empty()) __builtin_trap();
  for (const auto& message : r.messages)
    if (message.role != "system" && message.role != "user" && message.role != "assistant") __builtin_trap();
  if (r.max_tokens && *r.max_tokens == 0) __builtin_trap();
  const CompletionRequest& s = r.settings;
  if (s.n < 1 || s.n > kMaxSamples || s.stop.size() > kMaxStops) __builtin_trap();
  if (!(s.sampling.temperature >= 0 && s.sampling.temperature <= 2)) __builtin_trap();
  if (!(s.sampling.top_p > 0 && s.sampling.top_p <= 1)) __builtin_trap();
  for (const auto& stop : s.stop)
    if (stop.empty()) __builtin_trap();
  if (s.include_usage && !s.stream) __builtin_trap();
  return 0;
}
