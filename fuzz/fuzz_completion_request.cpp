// libFuzzer target: arbitrary bytes as the body of POST /v1/completions. The parser must never
// crash or throw: it returns a request whose fields are in range, or a 400 error whose body is
// valid JSON.
#include <cstdint>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "serve/request.h"

using namespace tapegrad::serve;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto parsed = parse_completion_request(std::string_view(reinterpret_cast<const char*>(data), size));
  if (const auto* error = std::get_if<ApiError>(&parsed)) {
    if (error->status != 400 || error->message.empty()) __builtin_trap();
    if (!nlohmann::json::accept(error_body(*error))) __builtin_trap();
    return 0;
  }
  const CompletionRequest& r = std::get<CompletionRequest>(parsed);
  if (r.prompt.empty() || r.n < 1 || r.n > kMaxSamples || r.stop.size() > kMaxStops) __builtin_trap();
  if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 2)) __builtin_trap();
  if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) __builtin_trap();
  for (const auto& stop : r.stop)
    if (stop.empty()) __builtin_trap();
  if (r.include_usage && !r.stream) __builtin_trap();
  return 0;
}
