// Chat templates against transformers' apply_chat_template(tokenize=False): SmolLM2's template
// (from its GGUF) and Llama 3 Instruct's, rendered in tests/data/chat_golden.json by
// make_real_model_goldens.py; respellings of a template recognised; others refused.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/helpers.h"
#include "tokenizers/chat_template.h"

using namespace tapegrad;
using namespace tapegrad::tokenizers;

namespace {

const nlohmann::json& golden() {
  static const nlohmann::json json = [] {
    std::ifstream in(TAPEGRAD_SOURCE_DIR "/tests/data/chat_golden.json");
    REQUIRE(in);
    std::ostringstream text;
    text << in.rdbuf();
    return nlohmann::json::parse(text.str());
  }();
  return json;
}

std::vector<ChatMessage> messages_of(const nlohmann::json& messages) {
  std::vector<ChatMessage> out;
  for (const auto& message : messages) out.push_back({message["role"], message["content"]});
  return out;
}

void check_golden(const ChatTemplate& chat, const nlohmann::json& set) {
  const std::string bos = set.value("bos_token", "");
  REQUIRE(set["cases"].size() >= 6);
  for (const auto& item : set["cases"]) {
    INFO("messages: ", item["messages"].dump(), ", add_generation_prompt: ", item["add_generation_prompt"].get<bool>());
    CHECK(chat.render(messages_of(item["messages"]), item["add_generation_prompt"], bos) == item["text"].get<std::string>());
  }
}

const std::vector<ChatMessage> kHiYo = {{"user", "Hi"}, {"assistant", "Yo"}};

}  // namespace

TEST_CASE("SmolLM2's template is ChatML with its default system message, rendered as transformers renders it") {
  ChatTemplate chat = ChatTemplate::recognise(golden()["smollm2"]["template"].get<std::string>(), "SmolLM2's GGUF");
  CHECK(chat.name() == "chatml");
  CHECK(chat.default_system() == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  check_golden(chat, golden()["smollm2"]);
  CHECK(chat.render({}, true) == "<|im_start|>assistant\n");
}

TEST_CASE("Llama 3 Instruct's template is recognised and rendered as transformers renders it, contents trimmed") {
  ChatTemplate chat = ChatTemplate::recognise(golden()["llama3"]["template"].get<std::string>(), "llama3.jinja");
  CHECK(chat.name() == "llama3");
  check_golden(chat, golden()["llama3"]);
  check_golden(ChatTemplate::named("llama3"), golden()["llama3"]);
}

TEST_CASE("chat templates are named, or read from a file") {
  CHECK(ChatTemplate::named("chatml").render(kHiYo, false) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n");
  CHECK(!ChatTemplate::named("chatml").default_system());
  const std::string path = test::process_path("smollm2.jinja");
  std::ofstream(path) << golden()["smollm2"]["template"].get<std::string>();
  check_golden(ChatTemplate::named(path), golden()["smollm2"]);
  CHECK(test::error_of([] { ChatTemplate::named("zephyr"); }) ==
        "--chat-template: \"zephyr\" is neither chatml, llama3 nor a file that can be read");
}

TEST_CASE("a template respelled with whitespace control, other quotes and attribute syntax is still recognised") {
  // transformers 5.25 renders both, for kHiYo with add_generation_prompt, as the expected text.
  const std::string dashes =
      "{%- for message in messages -%}\n  {%- if loop.first and messages[0].role != \"system\" -%}\n    "
      "{{- \"<|im_start|>system\\nYou are X<|im_end|>\\n\" -}}\n  {%- endif -%}\n  {{- \"<|im_start|>\" + message.role + "
      "\"\\n\" + message.content + \"<|im_end|>\\n\" -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}"
      "{{- \"<|im_start|>assistant\\n\" -}}{%- endif -%}";
  const std::string blocks =
      "{% for message in messages %}\n    {% if loop.first and messages[0]['role'] != 'system' %}\n"
      "{{ '<|im_start|>system\\nYou are Y<|im_end|>\\n' }}\n    {%- endif %}\n{{ '<|im_start|>' + message['role'] + "
      "'\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n{%- endfor %}\n{% if add_generation_prompt %}\n"
      "{{ '<|im_start|>assistant\\n' }}\n{%- endif %}";
  const std::string rest = "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>assistant\n";
  CHECK(ChatTemplate::recognise(dashes, "dashes").render(kHiYo, true) == "<|im_start|>system\nYou are X" + rest);
  CHECK(ChatTemplate::recognise(blocks, "blocks").render(kHiYo, true) == "<|im_start|>system\nYou are Y" + rest);
}

TEST_CASE("a template that renders otherwise is refused, naming its source and the --chat-template flag") {
  const std::string hint = "pass --chat-template chatml|llama3|FILE";
  // Without the dash before endif the newline after the system line would be output.
  std::string extra_newline =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nS<|im_end|>\\n' }}\n{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  for (const std::string& source : {std::string("{{ messages }}"), extra_newline, std::string("{% for m in messages %}")}) {
    std::string error = test::error_of<std::invalid_argument>([&] { ChatTemplate::recognise(source, "model.gguf"); });
    CHECK(error.rfind("model.gguf: ", 0) == 0);
    CHECK(test::contains(error, hint));
  }
  CHECK(test::contains(test::error_of([] { ChatTemplate::recognise("{{ 'a }}", "t.jinja"); }), "is not closed"));
}
