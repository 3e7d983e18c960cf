// Byte-level BPE against Hugging Face tokenizers' ids (tests/data/tokenizer_golden.json, written by
// make_real_model_goldens.py): SmolLM2's vocabulary from its GGUF with both pre-tokenizers, the
// whole of tiny Shakespeare, and a small vocabulary built here for specials and refusals.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/fnv1a.h"
#include "nn/pretrained.h"
#include "support/helpers.h"
#include "support/real_model.h"
#include "tokenizers/byte_alphabet.h"
#include "tokenizers/byte_level_bpe.h"
#include "tokenizers/utf8.h"

using namespace tapegrad;
using namespace tapegrad::tokenizers;
using test::slurp;

namespace {

const nlohmann::json& golden() {
  static const nlohmann::json json = nlohmann::json::parse(slurp(TAPEGRAD_SOURCE_DIR "/tests/data/tokenizer_golden.json"));
  return json;
}

// The ids' int32 bytes as the golden scripts hash them (little-endian, as every target is).
std::uint64_t fnv1a64(const std::vector<std::int32_t>& ids) {
  return tapegrad::fnv1a64(ids.data(), ids.size() * sizeof(std::int32_t));
}

// SmolLM2's vocabulary as nn::load_pretrained_tokenizer reads it from its GGUF, with the given
// pre-tokenizer.
BpeVocab smollm2_vocab(const std::string& path, const std::string& pre) {
  std::unique_ptr<Tokenizer> loaded = nn::load_pretrained_tokenizer(path);
  BpeVocab vocab = dynamic_cast<const ByteLevelBpe&>(*loaded).vocab();
  vocab.pre = pre;
  return vocab;
}

void check_golden_cases(const Tokenizer& tokenizer, const nlohmann::json& cases) {
  REQUIRE(cases.size() > 40);
  for (const auto& item : cases) {
    const std::string text = item["text"];
    INFO("text: ", text);
    CHECK(tokenizer.encode(text) == item["ids"].get<std::vector<std::int32_t>>());
    CHECK(tokenizer.decode(tokenizer.encode(text)) == text);
  }
}

// Random valid UTF-8: mostly ASCII, spaces and digits, with 2-, 3- and 4-byte characters.
std::string random_utf8(Rng& rng, std::size_t characters) {
  std::string text;
  for (std::size_t i = 0; i < characters; ++i) {
    char32_t c;
    switch (rng.below(5)) {
      case 0: c = char32_t(0x20 + rng.below(0x5F)); break;
      case 1: c = U" \t\n0123456789'"[rng.below(15)]; break;
      case 2: c = char32_t(0x80 + rng.below(0x800 - 0x80)); break;
      case 3: c = char32_t(0x800 + rng.below(0xD800 - 0x800)); break;
      default: c = char32_t(0x10000 + rng.below(0x110000 - 0x10000)); break;
    }
    append_utf8(text, c);
  }
  return text;
}

// A vocabulary of the 256 bytes, "he", "ll", "hell", "hello", and three specials, one a prefix of
// another.
BpeVocab small_vocab() {
  BpeVocab vocab;
  for (unsigned b = 0; b < 256; ++b) vocab.tokens.push_back(bytes_to_alphabet(std::string(1, char(b))));
  for (const char* merged : {"he", "ll", "hell", "hello"}) vocab.tokens.push_back(merged);
  vocab.merges = {"h e", "l l", "he ll", "hell o"};
  for (const char* special : {"<|end|>", "<|end|>!", "<|user|>"}) vocab.tokens.push_back(special);
  vocab.special_ids = {260, 261, 262};
  vocab.pre = "gpt2";
  vocab.bos = 262;
  vocab.end_ids = {260};
  return vocab;
}

}  // namespace

TEST_CASE("SmolLM2's vocabulary gives Hugging Face's ids on the stress strings with the smollm and gpt2 pre-tokenizers") {
  auto path = test::smollm2_path();
  if (!path) return;
  for (const char* entry : {"smollm2", "smollm2_gpt2_pre"}) {
    INFO("golden entry: ", entry);
    const nlohmann::json& set = golden()[entry];
    ByteLevelBpe tokenizer = ByteLevelBpe::from_vocab(smollm2_vocab(*path, set["pre"]));
    CHECK(tokenizer.vocab_size() == 49152);
    check_golden_cases(tokenizer, set["cases"]);
  }
}

TEST_CASE("SmolLM2's ids of the whole of tiny Shakespeare have Hugging Face's count and hash") {
  auto path = test::smollm2_path();
  if (!path) return;
  const char* env = std::getenv("TAPEGRAD_SHAKESPEARE");
  const std::string text_path = env ? env : TAPEGRAD_SOURCE_DIR "/../shared/data/tinyshakespeare.txt";
  if (!std::ifstream(text_path)) {
    const std::string why = "tiny Shakespeare is not at " + text_path + " (set TAPEGRAD_SHAKESPEARE)";
    if (std::getenv("CI")) FAIL(why);
    MESSAGE("skipped: ", why);
    return;
  }
  const std::string text = slurp(text_path);
  ByteLevelBpe tokenizer = ByteLevelBpe::from_vocab(smollm2_vocab(*path, "smollm"));
  std::vector<std::int32_t> ids = tokenizer.encode(text);
  const nlohmann::json& want = golden()["smollm2"]["shakespeare"];
  CHECK(ids.size() == want["count"].get<std::size_t>());
  CHECK(fmt::format("0x{:016x}", fnv1a64(ids)) == want["fnv1a64"].get<std::string>());
  CHECK(tokenizer.decode(ids) == text);
}

TEST_CASE("SmolLM2's control tokens are matched whole and its specials are named") {
  auto path = test::smollm2_path();
  if (!path) return;
  ByteLevelBpe tokenizer = ByteLevelBpe::from_vocab(smollm2_vocab(*path, "smollm"));
  CHECK(tokenizer.special_id("<|im_start|>") == 1);
  CHECK(tokenizer.special_id("<|im_end|>") == 2);
  CHECK(!tokenizer.special_id("hello"));
  CHECK(tokenizer.bos_id() == 1);
  CHECK(std::ranges::count(tokenizer.end_ids(), 2) == 1);
  CHECK(tokenizer.vocab().special_ids.size() == 17);
  std::vector<std::int32_t> ids = tokenizer.encode("<|im_start|>user<|im_end|>");
  CHECK(ids.front() == 1);
  CHECK(ids.back() == 2);
  CHECK(tokenizer.token_bytes(1) == "<|im_start|>");
}

TEST_CASE("decode(encode(s)) is s for random valid UTF-8, and a long piece encodes in one pass") {
  ByteLevelBpe tokenizer = ByteLevelBpe::from_tokenizer_json(TAPEGRAD_SOURCE_DIR "/tests/data/models/tiny_llama/tokenizer.json",
                                                             std::nullopt);
  Rng rng(40);
  for (int i = 0; i < 300; ++i) {
    const std::string text = random_utf8(rng, rng.below(60));
    INFO("text: ", text);
    CHECK(tokenizer.decode(tokenizer.encode(text)) == text);
  }
  // One piece of 200,000 letters and one of 200,000 spaces: a quadratic merge loop or an
  // exhausted regex stack would show here.
  for (const std::string& text : {std::string(200000, 'a'), std::string(200000, ' ') + "x"})
    CHECK(tokenizer.decode(tokenizer.encode(text)) == text);
}

TEST_CASE("invalid UTF-8 is refused naming its byte offset") {
  ByteLevelBpe tokenizer = ByteLevelBpe::from_vocab(small_vocab());
  CHECK(test::error_of([&] { tokenizer.encode("hello \xE2\x82"); }) == "invalid UTF-8 at byte offset 6: truncated sequence");
  CHECK(test::error_of([&] { tokenizer.encode("<|end|>\xFF"); }) == "invalid UTF-8 at byte offset 7: invalid lead byte");
}

TEST_CASE("special tokens are matched whole, the longest at the leftmost position, before merges") {
  ByteLevelBpe tokenizer = ByteLevelBpe::from_vocab(small_vocab());
  const std::int32_t h = 'h';  // the first 256 ids are the bytes, and ASCII stands for itself
  CHECK(tokenizer.encode("hello") == std::vector<std::int32_t>{259});
  CHECK(tokenizer.encode("hell") == std::vector<std::int32_t>{258});
  CHECK(tokenizer.encode("hehe") == std::vector<std::int32_t>{256, 256});
  CHECK(tokenizer.encode("<|end|>!hello<|end|>?") == std::vector<std::int32_t>{261, 259, 260, '?'});
  CHECK(tokenizer.encode("<|user|>h<|end|") == std::vector<std::int32_t>{262, h, '<', '|', 'e', 'n', 'd', '|'});
  CHECK(tokenizer.decode(tokenizer.encode("<|end|>!hello<|end|>?")) == "<|end|>!hello<|end|>?");
  CHECK(tokenizer.special_id("<|end|>!") == 261);
  CHECK(tokenizer.bos_id() == 262);
  CHECK(!tokenizer.add_bos());
  CHECK(test::error_of<std::out_of_range>([&] { tokenizer.token_bytes(263); }) ==
        "ByteLevelBpe: id 263 is outside the vocabulary of size 263");
}

TEST_CASE("a vocabulary that contradicts itself is refused naming the fault") {
  auto refused = [](auto change) {
    BpeVocab vocab = small_vocab();
    change(vocab);
    return test::error_of<std::invalid_argument>([&] { ByteLevelBpe::from_vocab(vocab); });
  };
  CHECK(refused([](BpeVocab& v) { v.pre = "bert"; }) ==
        "unknown pre-tokenizer \"bert\" (known: gpt2 (or gpt-2), smollm, llama3 (or llama-bpe))");
  CHECK(refused([](BpeVocab& v) { v.merges.push_back("hello x y"); }) ==
        "BPE vocabulary: merge 4 \"hello x y\" is not two tokens separated by one space");
  CHECK(refused([](BpeVocab& v) { v.merges.push_back("hello zz"); }) ==
        "BPE vocabulary: merge 4 \"hello zz\": \"zz\" is not a token");
  CHECK(refused([](BpeVocab& v) { v.merges.push_back("o h"); }) == "BPE vocabulary: merge 4 \"o h\": \"oh\" is not a token");
  CHECK(refused([](BpeVocab& v) { v.end_ids = {263}; }) == "BPE vocabulary: end id 263 is outside the 263 tokens");
  CHECK(refused([](BpeVocab& v) { v.bos = -1; }) == "BPE vocabulary: bos id -1 is outside the 263 tokens");
  CHECK(refused([](BpeVocab& v) { v.unk = 263; }) == "BPE vocabulary: unk id 263 is outside the 263 tokens");
  CHECK(refused([](BpeVocab& v) { v.special_ids.push_back(400); }) ==
        "BPE vocabulary: special token id 400 is outside the 263 tokens");
  CHECK(refused([](BpeVocab& v) { v.token_types = {1, 1}; }) == "BPE vocabulary: 2 token types for 263 tokens");
  CHECK(refused([](BpeVocab& v) { v.tokens.clear(); }) == "BPE vocabulary: no tokens");
  CHECK(refused([](BpeVocab& v) { v.bos.reset(), v.add_bos = true; }) == "BPE vocabulary: add_bos is set but there is no bos id");
}

TEST_CASE("control and user-defined token types make specials; other types do not") {
  BpeVocab vocab = small_vocab();
  vocab.special_ids.clear();
  vocab.token_types.assign(vocab.tokens.size(), 1);
  vocab.token_types[260] = 3;
  vocab.token_types[262] = 4;
  ByteLevelBpe tokenizer = ByteLevelBpe::from_vocab(vocab);
  CHECK(tokenizer.vocab().special_ids == std::vector<std::int32_t>{260, 262});
  CHECK(tokenizer.encode("<|user|><|end|>!") == std::vector<std::int32_t>{262, 260, '!'});
}

TEST_CASE("a byte without a token is dropped, or becomes unk when the vocabulary has one") {
  BpeVocab vocab = small_vocab();
  vocab.tokens['l'] = "\xC5\x82";  // U+0142 stands for no byte: "l" has no token now
  vocab.merges = {"h e"};
  const std::int32_t space = ' ';  // 'Ġ' is the token of byte 0x20, and tokens are in byte order
  CHECK(ByteLevelBpe::from_vocab(vocab).encode("hello l") == std::vector<std::int32_t>{256, 'o', space});
  vocab.unk = 0;
  CHECK(ByteLevelBpe::from_vocab(vocab).encode("hello l") == std::vector<std::int32_t>{256, 0, 0, 'o', space, 0});
}

TEST_CASE("one tokenizer encodes from several threads at once, each getting the ids it gets alone") {
  ByteLevelBpe tokenizer = ByteLevelBpe::from_tokenizer_json(TAPEGRAD_SOURCE_DIR "/tests/data/models/tiny_llama/tokenizer.json",
                                                             std::nullopt);
  Rng rng(41);
  std::vector<std::string> texts;
  for (int i = 0; i < 4; ++i) texts.push_back(random_utf8(rng, 20000));
  std::vector<std::vector<std::int32_t>> alone, together(texts.size());
  for (const std::string& text : texts) alone.push_back(tokenizer.encode(text));
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < texts.size(); ++i)
    threads.emplace_back([&, i] {
      for (int repeat = 0; repeat < 3; ++repeat) together[i] = tokenizer.encode(texts[i]);
    });
  for (std::thread& thread : threads) thread.join();
  CHECK(together == alone);
}
