// The playground (GET /) in a real browser: build/serve runs on a loopback port, and
// playground_browser.py drives headless Chromium over the DevTools protocol to type a prompt,
// generate with a seed and stop a long generation. The page's text must equal build/generate's
// for the same checkpoint, prompt, settings and seed; Stop must cancel the request on the server.
// Served a model with a chat template, the page's chat mode holds a conversation.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <cstdlib>

#include "core/simd.h"
#include "nn/checkpoint.h"
#include "nn/models/rotary_decoder.h"
#include "serve/serve_helpers.h"
#include "support/programs.h"

namespace tapegrad::test {
namespace {

/// Whether the browser test can run here; without chromium it is skipped with a message, and
/// under CI (CI=true), where scripts/deps.sh installs chromium, that is a failure.
bool chromium_available() {
  if (std::system("command -v chromium >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1") == 0) return true;
  const std::string why = "the playground's browser test needs chromium and python3 (apt-get install chromium)";
  const char* ci = std::getenv("CI");
  if (ci && std::string(ci) == "true") FAIL(why);
  MESSAGE("skipped: " << why);
  return false;
}

}  // namespace

TEST_CASE("the playground in headless Chromium streams generate's text for a seed, and Stop cancels on the server") {
  // It tests the page and the HTTP path, not the kernels: once, at the widest SIMD level.
  if (simd_level() != supported_simd_levels().back() || !chromium_available()) return;
  const std::filesystem::path dir = work_dir("playground");
  // Random weights, large enough that a long generation lasts seconds (Stop must find it
  // running), with characters of two and three UTF-8 bytes in the vocabulary.
  const tokenizers::CharTokenizer tokenizer =
      tokenizers::CharTokenizer::from_text("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ,.!?\n\u00e9\u00f6\u20ac");
  const std::string checkpoint = (dir / "model.safetensors").string();
  nn::save_model_checkpoint(checkpoint, nn::LanguageModel(nn::rotary_decoder(tokenizer.size(), 128, 4, 4, 2048)),
                            tokenizer);

  const std::string prompt = "Caf\u00e9 \u20ac", seed = "11", temperature = "0.9", top_k = "20", top_p = "0.95",
                    max_tokens = "60";
  const Result reference = run("generate", {"--checkpoint", checkpoint, "--prompt", prompt, "--max-new", max_tokens,
                                            "--temperature", temperature, "--top-k", top_k, "--top-p", top_p, "--seed",
                                            seed});
  REQUIRE_MESSAGE(reference.status == 0, reference.err);

  const pid_t server = start("serve",
                             {"--checkpoint", checkpoint, "--port", "0", "--parallel", "4", "--max-tokens", "2000",
                              "--threads", "1"},
                             dir / "serve.out", dir / "serve.err");
  const std::string url = "http://127.0.0.1:" + std::to_string(port_of(dir / "serve.err"));
  const std::string driver = std::string(TAPEGRAD_SOURCE_DIR) + "/tests/serve/playground_browser.py";
  const std::string command = "python3 '" + driver + "' --url " + url + " --prompt '" + prompt + "' --seed " + seed +
                              " --temperature " + temperature + " --top-k " + top_k + " --top-p " + top_p +
                              " --max-tokens " + max_tokens + " --long-max-tokens 1900 --timeout 90 --screenshot '" +
                              (dir / "playground.png").string() + "' > '" + (dir / "browser.json").string() +
                              "' 2> '" + (dir / "browser.err").string() + "'";
  const int status = std::system(command.c_str());
  ::kill(server, SIGTERM);
  const int server_status = wait_for(server);
  INFO("serve's log: " << read_bytes(dir / "serve.err"));
  REQUIRE_MESSAGE(status == 0, "playground_browser.py failed: " << read_bytes(dir / "browser.err"));
  const nlohmann::json page = nlohmann::json::parse(read_bytes(dir / "browser.json"));
  INFO("the page: " << page.dump());
  CHECK(page["state"] == "done");
  CHECK(page["error"] == "");
  CHECK(page["text"] == reference.out);  // the prompt and the completion, as generate prints them
  CHECK(page["model"] == "model (step 0)");  // the checkpoint's name and training step, from /v1/models
  CHECK(page["stop_state"] == "stopped");
  CHECK(page["stopped_chars"].get<int>() < 1900);
  CHECK(page["cancelled"].get<double>() >= 1);
  CHECK(server_status == 0);
  std::filesystem::remove_all(dir);
}

}  // namespace tapegrad::test

namespace tapegrad::test {

TEST_CASE("the playground offers chat mode for a model with a chat template; two turns show the server's replies") {
  if (simd_level() != supported_simd_levels().back() || !chromium_available()) return;
  const std::filesystem::path dir = work_dir("playground_chat");
  const std::string model = std::string(TAPEGRAD_SOURCE_DIR) + "/tests/data/models/tiny_llama";
  const pid_t server = start("serve", {"--model", model, "--port", "0", "--parallel", "2", "--threads", "1"},
                             dir / "serve.out", dir / "serve.err");
  const int port = port_of(dir / "serve.err");
  const std::string driver = std::string(TAPEGRAD_SOURCE_DIR) + "/tests/serve/playground_browser.py";
  const std::string command = "python3 '" + driver + "' --url http://127.0.0.1:" + std::to_string(port) +
                              " --prompt unused --chat 'Hi' --chat 'Ok' --seed 3 --temperature 0.8"
                              " --max-tokens 4 --timeout 90 > '" + (dir / "browser.json").string() + "' 2> '" +
                              (dir / "browser.err").string() + "'";
  const int status = std::system(command.c_str());
  INFO("serve's log: " << read_bytes(dir / "serve.err"));
  REQUIRE_MESSAGE(status == 0, "playground_browser.py failed: " << read_bytes(dir / "browser.err"));
  const nlohmann::json page = nlohmann::json::parse(read_bytes(dir / "browser.json"));
  INFO("the page: " << page.dump());
  CHECK(page["chat_offered"] == true);
  CHECK(page["state"] == "done");
  CHECK(page["error"] == "");
  // Each reply is what the API answers for the conversation so far with the same settings (short:
  // the tiny model holds 128 tokens, and SmolLM2's default system message takes most of them).
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(20);
  nlohmann::json messages = nlohmann::json::array();
  const nlohmann::json& conversation = page["conversation"];
  REQUIRE(conversation.size() == 4);
  for (std::size_t turn = 0; turn < 2; ++turn) {
    const nlohmann::json& asked = conversation[2 * turn];
    CHECK(asked["role"] == "user");
    CHECK(asked["content"] == (turn == 0 ? "Hi" : "Ok"));
    messages.push_back(asked);
    const nlohmann::json body = {{"messages", messages}, {"seed", 3}, {"temperature", 0.8}, {"max_tokens", 4}};
    auto r = client.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const nlohmann::json reply = nlohmann::json::parse(r->body)["choices"][0]["message"];
    CHECK(conversation[2 * turn + 1] == reply);
    messages.push_back(reply);
  }
  ::kill(server, SIGTERM);
  CHECK(wait_for(server) == 0);
  std::filesystem::remove_all(dir);
}

}  // namespace tapegrad::test
