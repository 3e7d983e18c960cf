// Hugging Face tokenizer.json read and written: the tiny committed tokenizer (made by
// make_real_model_goldens.py) against tokenizers' ids, a round trip through to_tokenizer_json and
// checkpoint metadata, the Llama 3 pre-tokenizer, and the refusals, each naming file and field.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/helpers.h"
#include "tokenizers/byte_level_bpe.h"
#include "tokenizers/pre_tokenizer.h"
#include "tokenizers/tokenizer_json.h"

using namespace tapegrad;
using namespace tapegrad::tokenizers;
using test::slurp;

namespace {

const std::string kTinyDir = TAPEGRAD_SOURCE_DIR "/tests/data/models/tiny_llama/";

const nlohmann::json& tiny_cases() {
  static const nlohmann::json cases =
      nlohmann::json::parse(slurp(TAPEGRAD_SOURCE_DIR "/tests/data/tokenizer_golden.json"))["tiny"]["cases"];
  return cases;
}

void check_tiny_cases(const Tokenizer& tokenizer) {
  REQUIRE(tiny_cases().size() > 40);
  for (const auto& item : tiny_cases()) {
    INFO("text: ", item["text"].get<std::string>());
    CHECK(tokenizer.encode(item["text"].get<std::string>()) == item["ids"].get<std::vector<std::int32_t>>());
  }
}

nlohmann::json tiny_json() { return nlohmann::json::parse(slurp(kTinyDir + "tokenizer.json")); }

// The error of reading the tiny tokenizer.json after `change`.
template <class Change>
std::string refusal(Change change) {
  nlohmann::json json = tiny_json();
  change(json);
  return test::error_of<std::invalid_argument>([&] { bpe_vocab_from_tokenizer_json(json.dump(), "tok.json"); });
}

}  // namespace

TEST_CASE("the tiny tokenizer.json gives tokenizers' ids, and its tokenizer_config.json sets bos and eos") {
  ByteLevelBpe tokenizer = ByteLevelBpe::from_tokenizer_json(kTinyDir + "tokenizer.json", kTinyDir + "tokenizer_config.json");
  check_tiny_cases(tokenizer);
  CHECK(tokenizer.vocab_size() == 320);
  CHECK(tokenizer.vocab().pre == "gpt2");
  CHECK(tokenizer.vocab().special_ids == std::vector<std::int32_t>{0, 1, 2});
  CHECK(tokenizer.bos_id() == 1);
  CHECK(!tokenizer.add_bos());
  CHECK(tokenizer.end_ids() == std::vector<std::int32_t>{2});
  CHECK(!ByteLevelBpe::from_tokenizer_json(kTinyDir + "tokenizer.json", std::nullopt).bos_id());
}

TEST_CASE("a tokenizer round-trips through to_tokenizer_json and through checkpoint metadata to the same ids") {
  ByteLevelBpe tokenizer = ByteLevelBpe::from_tokenizer_json(kTinyDir + "tokenizer.json", kTinyDir + "tokenizer_config.json");
  BpeVocab written = bpe_vocab_from_tokenizer_json(tokenizer.to_tokenizer_json(), "written");
  CHECK(written.tokens == tokenizer.vocab().tokens);
  CHECK(written.merges == tokenizer.vocab().merges);
  check_tiny_cases(ByteLevelBpe::from_vocab(written));

  auto metadata = tokenizer.to_metadata();
  CHECK(metadata.at("tokenizer") == "bpe");
  CHECK(metadata.at("tokenizer.bos_id") == "1");
  CHECK(metadata.at("tokenizer.end_ids") == "2");
  std::unique_ptr<Tokenizer> rebuilt = tokenizer_from_metadata(metadata);
  CHECK(rebuilt->kind() == "bpe");
  CHECK(rebuilt->bos_id() == 1);
  CHECK(rebuilt->end_ids() == std::vector<std::int32_t>{2});
  CHECK(rebuilt->special_id("<|im_end|>") == 2);
  check_tiny_cases(*rebuilt);

  metadata["tokenizer.end_ids"] = "2,x";
  CHECK(test::error_of([&] { tokenizer_from_metadata(metadata); }) ==
        "tokenizer metadata: \"tokenizer.end_ids\" holds \"x\", not an id");
  metadata.erase("tokenizer.json");
  CHECK(test::error_of([&] { tokenizer_from_metadata(metadata); }) ==
        "tokenizer metadata: a \"bpe\" tokenizer needs the field \"tokenizer.json\"");
}

TEST_CASE("merges read the same in the \"a b\" and the [a, b] form") {
  nlohmann::json json = tiny_json();
  for (auto& merge : json["model"]["merges"]) merge = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
  check_tiny_cases(ByteLevelBpe::from_vocab(bpe_vocab_from_tokenizer_json(json.dump(), "string merges")));
}

TEST_CASE("Llama 3's pre-tokenizer and post-processor are read, and written back as Hugging Face writes them") {
  nlohmann::json json = tiny_json();
  const std::string pattern = PreTokenizer::named("llama3").pattern();
  json["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers",
                            {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  json["model"]["ignore_merges"] = true;
  json["post_processor"] = nlohmann::json::parse(R"({"type": "Sequence", "processors": [{"type": "ByteLevel"},
      {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                                {"Sequence": {"id": "A", "type_id": 0}}]}]})");
  ByteLevelBpe tokenizer = ByteLevelBpe::from_vocab(bpe_vocab_from_tokenizer_json(json.dump(), "llama3 tokenizer.json"));
  CHECK(tokenizer.vocab().pre == "llama3");
  CHECK(tokenizer.bos_id() == 1);
  CHECK(tokenizer.add_bos());
  // tokenizers 0.23's ids for this tokenizer.json (the tiny one, Llama 3's pre-tokenizer put in).
  CHECK(tokenizer.encode("Hello world's 12345 THEY'LL\r\n\n  x") ==
        std::vector<std::int32_t>{42, 71, 272, 81, 276, 81, 84, 78, 70, 9, 85, 223, 19, 20, 21, 22,
                                  23, 223, 54, 42, 39, 59, 9, 46, 46, 204, 201, 201, 223, 223, 90});
  CHECK(tokenizer.encode("   \n\n   \t  end with spaces   ") ==
        std::vector<std::int32_t>{281, 201, 201, 281, 200, 223, 223, 293, 276, 75, 86, 74, 267, 82, 67, 292, 85, 281});
  CHECK(tokenizer.encode("don't DON'T 1,000,000 \u00bd") ==
        std::vector<std::int32_t>{70, 81, 80, 9, 86, 223, 38, 49, 48, 9, 54, 223, 19, 14, 290, 18, 14, 290, 18, 223, 129, 124});

  nlohmann::json written = nlohmann::json::parse(tokenizer.to_tokenizer_json());
  CHECK(written["pre_tokenizer"] == json["pre_tokenizer"]);
  CHECK(written["model"]["ignore_merges"] == true);
  CHECK(written["post_processor"]["single"][0]["SpecialToken"]["id"] == "<|im_start|>");
  BpeVocab again = bpe_vocab_from_tokenizer_json(written.dump(), "written");
  CHECK(again.pre == "llama3");
  CHECK(again.add_bos);
}

TEST_CASE("with Llama 3's ignore_merges a piece that is a whole token is emitted without merges") {
  nlohmann::json json = tiny_json();
  json["model"]["vocab"]["Ġxyzzy"] = 320;  // no merge makes it
  for (const char* pre : {"gpt2", "llama3"}) {
    BpeVocab vocab = bpe_vocab_from_tokenizer_json(json.dump(), "tok.json");
    vocab.pre = pre;
    std::vector<std::int32_t> ids = ByteLevelBpe::from_vocab(vocab).encode("a xyzzy");
    CHECK((ids == std::vector<std::int32_t>{67, 320}) == (std::string(pre) == "llama3"));
  }
}

TEST_CASE("a tokenizer.json outside what is understood is refused naming the file and the JSON path") {
  CHECK(test::error_of([] { bpe_vocab_from_tokenizer_json("{", "tok.json"); }).rfind("tok.json: not JSON: ", 0) == 0);
  CHECK(test::contains(refusal([](auto& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }),
                       "tok.json: pre_tokenizer: {\"type\":\"Whitespace\"} is not supported (understood: ByteLevel"));
  CHECK(test::contains(refusal([](auto& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }),
                       "tok.json: pre_tokenizer: "));
  CHECK(refusal([](auto& j) { j["model"]["ignore_merges"] = true; }) ==
        "tok.json: model.ignore_merges: true does not go with the gpt2 pre-tokenizer");
  CHECK(refusal([](auto& j) { j["normalizer"] = {{"type", "NFC"}}; }) ==
        "tok.json: normalizer: {\"type\":\"NFC\"} is not supported (only null)");
  CHECK(refusal([](auto& j) { j["model"]["type"] = "WordPiece"; }) == "tok.json: model.type: \"WordPiece\" is not BPE");
  CHECK(refusal([](auto& j) { j["model"]["byte_fallback"] = true; }) == "tok.json: model.byte_fallback: true is not supported");
  CHECK(refusal([](auto& j) { j["model"]["merges"][3] = 7; }) == "tok.json: model.merges[3]: 7 is not \"a b\" nor [a, b]");
  CHECK(refusal([](auto& j) { j["model"]["vocab"].erase("!"); }) ==
        "tok.json: model.vocab: no token has the id 3 (neither model.vocab nor added_tokens)");
  CHECK(refusal([](auto& j) { j["model"]["vocab"]["!"] = -3; }) == "tok.json: model.vocab[\"!\"]: -3 is not an id");
  CHECK(refusal([](auto& j) { j["added_tokens"][1]["content"] = 5; }) == "tok.json: added_tokens[1].content: 5 is not a string");
  CHECK(refusal([](auto& j) { j["added_tokens"][2]["rstrip"] = true; }) ==
        "tok.json: added_tokens[2].rstrip: true is not supported (the token is matched as it is)");
  // A field of another JSON type than the one read: its path and value, not the JSON library's words.
  CHECK(refusal([](auto& j) { j["model"]["ignore_merges"] = "yes"; }) ==
        "tok.json: model.ignore_merges: \"yes\" is not true or false");
  CHECK(refusal([](auto& j) { j["pre_tokenizer"]["type"] = 5; }) == "tok.json: pre_tokenizer.type: 5 is not a string");
  CHECK(refusal([](auto& j) { j["added_tokens"][2]["special"] = 1; }) ==
        "tok.json: added_tokens[2].special: 1 is not true or false");
  CHECK(refusal([](auto& j) { j["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", false}}}}}; }) ==
        "tok.json: post_processor.processors[0].type: false is not a string");
  CHECK(refusal([](auto& j) { j["model"]["unk_token"] = "<nope>"; }) == "tok.json: model.unk_token: \"<nope>\" is not a token");
  CHECK(refusal([](auto& j) { j.erase("model"); }) == "tok.json: (top): no \"model\"");

  auto config_refusal = [](const std::string& config) {
    return test::error_of<std::invalid_argument>(
        [&] { bpe_vocab_from_tokenizer_json(tiny_json().dump(), "tok.json", config, "config.json"); });
  };
  CHECK(config_refusal(R"({"bos_token": "<s>"})") == "config.json: bos_token: \"<s>\" is not a token");
  CHECK(config_refusal(R"({"eos_token": {"content": 3}})") == "config.json: eos_token.content: 3 is not a string");
  CHECK(config_refusal(R"({"add_bos_token": true})") == "config.json: add_bos_token: is true but there is no bos_token");
  CHECK(config_refusal(R"({"add_bos_token": "yes"})") == "config.json: add_bos_token: \"yes\" is not true or false");
  CHECK(test::contains(test::error_of<std::runtime_error>([] { ByteLevelBpe::from_tokenizer_json("/nonexistent/tok.json", {}); }),
                       "/nonexistent/tok.json: cannot be opened"));
}
