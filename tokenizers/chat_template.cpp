// The chat formats rendered here, and their recognition: a model's template matches a format when
// its canonical form equals that of the format's reference template (the template the model family
// ships), the default system text of ChatML being the one free part.
#include "tokenizers/chat_template.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tokenizers/jinja_canonical.h"
#include "tokenizers/utf8.h"

namespace tapegrad::tokenizers {

namespace {

constexpr std::string_view kSystemPlaceholder = "@DEFAULT_SYSTEM@";

// ChatML as SmolLM2 ships it, a default system message first when the first message is not a
// system one; and without one.
constexpr const char* kChatmlWithSystem =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n@DEFAULT_SYSTEM@<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
constexpr const char* kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
// Meta-Llama-3-8B-Instruct's template.
constexpr const char* kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

// The text a canonical literal's inside stands for, or nullopt if it is more than one literal.
std::optional<std::string> unescape_canonical(std::string_view inside) {
  std::string out;
  for (std::size_t i = 0; i < inside.size(); ++i) {
    if (inside[i] == '\'') return std::nullopt;
    if (inside[i] != '\\') {
      out += inside[i];
      continue;
    }
    if (++i == inside.size()) return std::nullopt;
    out += inside[i] == 'n' ? '\n' : inside[i];
  }
  return out;
}

// Python's str.isspace(), which Jinja's trim filter strips (str.strip()).
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Jinja's trim: text without leading and trailing white space (stopping at invalid UTF-8).
std::string_view trim(std::string_view text) {
  while (!text.empty()) {
    Utf8Char first = next_utf8_char(text, 0);
    if (first.error || !is_python_space(first.code_point)) break;
    text.remove_prefix(first.length);
  }
  while (!text.empty()) {
    std::size_t start = text.size() - 1;
    while (start > 0 && text.size() - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    Utf8Char last = next_utf8_char(text, start);
    if (last.error || start + last.length != text.size() || !is_python_space(last.code_point)) break;
    text.remove_suffix(last.length);
  }
  return text;
}

}  // namespace

ChatTemplate ChatTemplate::recognise(std::string_view jinja_source, std::string_view source_name) {
  std::string canonical;
  try {
    canonical = jinja_canonical(jinja_source);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}; pass --chat-template chatml|llama3|FILE", source_name, e.what()));
  }
  if (canonical == jinja_canonical(kChatml)) return ChatTemplate("chatml", std::nullopt);
  if (canonical == jinja_canonical(kLlama3)) return ChatTemplate("llama3", std::nullopt);
  const std::string with_system = jinja_canonical(kChatmlWithSystem);
  const std::size_t hole = with_system.find(kSystemPlaceholder);
  const std::string_view before = std::string_view(with_system).substr(0, hole);
  const std::string_view after = std::string_view(with_system).substr(hole + kSystemPlaceholder.size());
  if (canonical.size() >= before.size() + after.size() && canonical.starts_with(before) && canonical.ends_with(after))
    if (auto system = unescape_canonical(
            std::string_view(canonical).substr(before.size(), canonical.size() - before.size() - after.size())))
      return ChatTemplate("chatml", std::move(*system));
  throw std::invalid_argument(fmt::format(
      "{}: the chat template is not one tapegrad recognises (ChatML, with or without a default system message, or "
      "Llama 3 Instruct); pass --chat-template chatml|llama3|FILE",
      source_name));
}

ChatTemplate ChatTemplate::named(std::string_view name_or_path) {
  if (name_or_path == "chatml") return ChatTemplate("chatml", std::nullopt);
  if (name_or_path == "llama3") return ChatTemplate("llama3", std::nullopt);
  const std::string path(name_or_path);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::invalid_argument(
        fmt::format("--chat-template: \"{}\" is neither chatml, llama3 nor a file that can be read", name_or_path));
  std::ostringstream source;
  source << in.rdbuf();
  return recognise(source.str(), path);
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                 std::string_view bos_token) const {
  std::string out;
  if (name_ == "llama3") {
    for (std::size_t i = 0; i < messages.size(); ++i) {
      if (i == 0) out += bos_token;
      out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n";
      out += trim(messages[i].content);
      out += "<|eot_id|>";
    }
    if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && default_system_ && messages[0].role != "system")
      out += "<|im_start|>system\n" + *default_system_ + "<|im_end|>\n";
    out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace tapegrad::tokenizers
