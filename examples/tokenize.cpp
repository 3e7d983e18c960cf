// tokenize: a published model's tokenizer from the command line: text (--text or --file) to one
// JSON array of ids, or with --decode a JSON array of ids on standard input back to text.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/program.h"
#include "nn/pretrained.h"

using namespace tapegrad;
using namespace tapegrad::examples;

int main(int argc, char** argv) {
  CLI::App app{
      "Encodes text with a model's tokenizer and prints one JSON array of ids; --decode reads such an array on "
      "standard input and prints its text.",
      "tokenize"};
  std::string model, text, file;
  bool decode = false;
  app.add_option("--model", model, "A GGUF file or a Hugging Face folder (required)");
  app.add_option("--text", text, "The text to encode");
  app.add_option("--file", file, "A file whose text to encode");
  app.add_flag("--decode", decode, "Read a JSON array of ids on standard input and print their text");

  return run_program(app, argc, argv, [&] {
    if (model.empty()) throw UsageError("--model is required");
    const int inputs = int(app.count("--text") > 0) + int(app.count("--file") > 0) + int(decode);
    if (inputs != 1) throw UsageError("give exactly one of --text, --file and --decode");
    const auto tokenizer = nn::load_pretrained_tokenizer(model);
    if (decode) {
      const std::string input(std::istreambuf_iterator<char>(std::cin), {});
      const nlohmann::json ids = nlohmann::json::parse(input, nullptr, false);
      if (ids.is_discarded() || !ids.is_array())
        throw UsageError("--decode: standard input is not a JSON array of token ids");
      std::vector<std::int32_t> tokens;
      for (const auto& id : ids) {
        if (!id.is_number_integer()) throw UsageError(fmt::format("--decode: {} is not a token id", id.dump()));
        const std::int64_t value = id.get<std::int64_t>();
        if (value < 0 || std::size_t(value) >= tokenizer->vocab_size())
          throw UsageError(fmt::format("--decode: id {} is outside the vocabulary of {} tokens", value,
                                       tokenizer->vocab_size()));
        tokens.push_back(std::int32_t(value));
      }
      const std::string out = tokenizer->decode(tokens);
      std::fwrite(out.data(), 1, out.size(), stdout);
      return 0;
    }
    const std::string input = file.empty() ? text : read_file(file);
    std::vector<std::int32_t> ids;
    try {
      ids = tokenizer->encode(input);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("{}: {}", file.empty() ? "--text" : file, e.what()));
    }
    fmt::print("{}\n", nlohmann::json(ids).dump());
    return 0;
  });
}
