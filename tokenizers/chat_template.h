// Chat templates without a Jinja engine: a model's template (Jinja source) is recognised as one of
// the formats rendered here, ChatML (with or without a default system message, as SmolLM2's) and
// Llama 3 Instruct, by comparing its canonical form (jinja_canonical.h) with theirs.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tapegrad::tokenizers {

struct ChatMessage {
  std::string role, content;
};

class ChatTemplate {
 public:
  /// The format of a model's own template. One not recognised throws std::invalid_argument naming
  /// source_name and saying to pass --chat-template chatml|llama3|FILE.
  static ChatTemplate recognise(std::string_view jinja_source, std::string_view source_name);
  /// "chatml", "llama3", or the path of a file holding a template to recognise.
  static ChatTemplate named(std::string_view name_or_path);

  /// What transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt) gives;
  /// bos_token is the template's bos_token variable (Llama 3 starts with it).
  std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                     std::string_view bos_token = "") const;
  const std::string& name() const { return name_; }  ///< "chatml" or "llama3"
  /// The system message ChatML inserts when the first message is not a system one (SmolLM2's).
  const std::optional<std::string>& default_system() const { return default_system_; }

 private:
  ChatTemplate(std::string name, std::optional<std::string> default_system)
      : name_(std::move(name)), default_system_(std::move(default_system)) {}
  std::string name_;
  std::optional<std::string> default_system_;
};

}  // namespace tapegrad::tokenizers
