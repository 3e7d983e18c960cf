// load_pretrained: a GGUF file or a Hugging Face folder -> config, weights, tokenizer, chat
// template. One entry per architecture ties the files' config keys to its config; its tensor
// map (nn/models/) ties the files' tensor names to its parameters.
#include "nn/pretrained.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <vector>

#include "core/random.h"
#include "io/gguf.h"
#include "io/hf_folder.h"
#include "nn/models/foreign_tensors.h"
#include "nn/models/gpt2.h"
#include "nn/models/llama.h"
#include "nn/packed_weights.h"
#include "tokenizers/byte_level_bpe.h"

namespace tapegrad::nn {

namespace {

using json = nlohmann::json;

// ---- config keys -------------------------------------------------------------------------------

std::size_t gguf_size(const io::GgufFile& file, const std::string& key) {
  const std::int64_t value = file.at(key).as_int();
  if (value <= 0) throw std::runtime_error(fmt::format("{}: metadata {} is {}; it must be positive", file.path(), key, value));
  return std::size_t(value);
}

double gguf_float_or(const io::GgufFile& file, const std::string& key, double fallback) {
  const io::GgufValue* value = file.find(key);
  return value ? value->as_float() : fallback;
}

// A key of config.json; `fallback` (when given) stands in for an absent or null key.
const json& hf_key(const json& config, const std::string& key, const std::string& path,
                   const json* fallback = nullptr) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    if (fallback) return *fallback;
    throw std::runtime_error(fmt::format("{}/config.json: key '{}' is missing", path, key));
  }
  return *it;
}

std::size_t hf_size(const json& config, const std::string& key, const std::string& path) {
  const json& value = hf_key(config, key, path);
  if (!value.is_number_integer() || value.get<std::int64_t>() <= 0)
    throw std::runtime_error(
        fmt::format("{}/config.json: '{}' is {}; it must be a positive integer", path, key, value.dump()));
  return value.get<std::size_t>();
}

double hf_number(const json& config, const std::string& key, const std::string& path, double fallback) {
  const json fallback_value = fallback;
  const json& value = hf_key(config, key, path, &fallback_value);
  if (!value.is_number()) throw std::runtime_error(fmt::format("{}/config.json: '{}' is {}; it must be a number", path, key, value.dump()));
  return value.get<double>();
}

// The sizes every GGUF architecture names the same way, "<arch>.embedding_length" and so on.
template <class Config>
Config gguf_sizes(const io::GgufFile& file, const std::string& arch, std::size_t vocab) {
  Config c;
  c.vocab = vocab;
  c.d_model = gguf_size(file, arch + ".embedding_length");
  c.n_blocks = gguf_size(file, arch + ".block_count");
  c.d_ff = gguf_size(file, arch + ".feed_forward_length");
  c.n_heads = gguf_size(file, arch + ".attention.head_count");
  c.max_len = gguf_size(file, arch + ".context_length");
  return c;
}

LlamaConfig llama_config_from_gguf(const io::GgufFile& file, std::size_t vocab) {
  LlamaConfig c = gguf_sizes<LlamaConfig>(file, "llama", vocab);
  c.n_kv_heads = file.find("llama.attention.head_count_kv") ? gguf_size(file, "llama.attention.head_count_kv") : c.n_heads;
  if (file.find("llama.rope.dimension_count")) c.head_dim = gguf_size(file, "llama.rope.dimension_count");
  c.norm_eps = float(file.at("llama.attention.layer_norm_rms_epsilon").as_float());
  c.rope_theta = gguf_float_or(file, "llama.rope.freq_base", 10000.0);
  c.tied_head = file.find_tensor("output.weight") == nullptr;  // as transformers decides it
  return c;
}

// RoPE's base: "rope_theta" (transformers 4) or "rope_parameters" {"rope_type": "default",
// "rope_theta"} (transformers 5). Scaled variants (Llama 3.1's "llama3", YaRN) are refused.
double rope_theta_from_hf(const json& config, const std::string& path) {
  if (auto it = config.find("rope_scaling"); it != config.end() && !it->is_null())
    throw std::runtime_error(fmt::format("{}/config.json: rope_scaling {} is not supported (plain RoPE only)", path,
                                         it->dump()));
  auto it = config.find("rope_parameters");
  if (it == config.end() || it->is_null()) return hf_number(config, "rope_theta", path, 10000.0);
  if (!it->is_object() || it->value("rope_type", "default") != "default")
    throw std::runtime_error(fmt::format("{}/config.json: rope_parameters {} is not supported (rope_type \"default\" "
                                         "only)",
                                         path, it->dump()));
  return hf_number(*it, "rope_theta", path, 10000.0);
}

LlamaConfig llama_config_from_hf(const json& config, const std::string& path) {
  const json silu = "silu", no_bias = false;
  if (hf_key(config, "hidden_act", path, &silu) != "silu")
    throw std::runtime_error(fmt::format("{}/config.json: hidden_act {} is not supported (SwiGLU's \"silu\" only)",
                                         path, config["hidden_act"].dump()));
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (hf_key(config, key, path, &no_bias) != false)
      throw std::runtime_error(fmt::format("{}/config.json: {} is {}; Llama without biases only", path, key,
                                           config[key].dump()));
  LlamaConfig c;
  c.vocab = hf_size(config, "vocab_size", path);
  c.d_model = hf_size(config, "hidden_size", path);
  c.n_blocks = hf_size(config, "num_hidden_layers", path);
  c.d_ff = hf_size(config, "intermediate_size", path);
  c.n_heads = hf_size(config, "num_attention_heads", path);
  c.n_kv_heads = config.contains("num_key_value_heads") && !config["num_key_value_heads"].is_null()
                     ? hf_size(config, "num_key_value_heads", path)
                     : c.n_heads;
  if (config.contains("head_dim") && !config["head_dim"].is_null()) c.head_dim = hf_size(config, "head_dim", path);
  c.max_len = hf_size(config, "max_position_embeddings", path);
  c.norm_eps = float(hf_number(config, "rms_norm_eps", path, 1e-6));
  c.rope_theta = rope_theta_from_hf(config, path);
  const json tied_default = false;
  const json& tied = hf_key(config, "tie_word_embeddings", path, &tied_default);
  if (!tied.is_boolean())
    throw std::runtime_error(fmt::format("{}/config.json: 'tie_word_embeddings' is {}; it must be true or false", path, tied.dump()));
  c.tied_head = tied.get<bool>();
  return c;
}

Gpt2Config gpt2_config_from_gguf(const io::GgufFile& file, std::size_t vocab) {
  Gpt2Config c = gguf_sizes<Gpt2Config>(file, "gpt2", vocab);
  c.norm_eps = float(gguf_float_or(file, "gpt2.attention.layer_norm_epsilon", 1e-5));
  return c;
}

Gpt2Config gpt2_config_from_hf(const json& config, const std::string& path) {
  const json gelu_new = "gelu_new";
  const json& activation = hf_key(config, "activation_function", path, &gelu_new);
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh")
    throw std::runtime_error(fmt::format("{}/config.json: activation_function {} is not supported (GPT-2's tanh GELU, "
                                         "\"gelu_new\", only)",
                                         path, activation.dump()));
  Gpt2Config c;
  c.vocab = hf_size(config, "vocab_size", path);
  c.d_model = hf_size(config, "n_embd", path);
  c.n_blocks = hf_size(config, "n_layer", path);
  c.n_heads = hf_size(config, "n_head", path);
  c.max_len = hf_size(config, "n_positions", path);
  if (config.contains("n_inner") && !config["n_inner"].is_null()) c.d_ff = hf_size(config, "n_inner", path);
  c.norm_eps = float(hf_number(config, "layer_norm_epsilon", path, 1e-5));
  return c;
}

// ---- weights -----------------------------------------------------------------------------------

using Fetch = std::function<Tensor(const ForeignTensor&)>;

// Builds a Model from config, loads every parameter through its tensor map, and packs its
// matrices as options.weights asks (file_matrix: the file's own blocks).
template <class Model, class Config>
LanguageModel load_weights(const Config& config, std::span<const ForeignTensor> map, const Fetch& fetch, bool from_hf,
                           const LoadOptions& options, const FileMatrix& file_matrix) {
  Model model = [&] {
    SkipInitScope skip;  // every parameter is assigned below
    return Model(config);
  }();
  if (options.weights == "file") {
    // The file's blocks first, then float32 for the rest alone: the packed matrices' float32
    // copies are never filled (untouched, their pages never become resident), so a load holds
    // about the file's size, not the float32 model's.
    pack_matrices(model, map, file_matrix, std::nullopt);
    std::set<std::string> unpacked;
    for (const auto& p : model.params()) unpacked.insert(p.name);
    std::vector<ForeignTensor> rest;
    for (const ForeignTensor& entry : map)
      if (unpacked.contains(entry.param)) rest.push_back(entry);
    load_foreign_tensors(model, rest, fetch, from_hf);
    return LanguageModel(std::move(model));
  }
  load_foreign_tensors(model, map, fetch, from_hf);
  if (options.weights != "f32") {
    const quant::BlockFormat* format = quant::find_conversion(options.weights);
    if (!format)
      throw std::invalid_argument(fmt::format("load_pretrained: weights '{}' is not one of f32, file, bf16, f16, q8_0, "
                                              "q4_0, q4_1",
                                              options.weights));
    pack_matrices(model, map, file_matrix, format->type);
  }
  return LanguageModel(std::move(model));
}

// A GGUF tensor's own blocks, interleaved (core/quant/row_groups.h), when packed_matmul has kernels for its type.
FileMatrix gguf_matrix(const io::GgufFile& file) {
  auto mapping = std::make_shared<const io::GgufFile>(file);  // copies share the mapping
  return [mapping](const ForeignTensor& entry, std::size_t rows, std::size_t cols) -> std::optional<quant::PackedMatrix> {
    const io::GgufTensor* tensor = mapping->find_tensor(entry.gguf_name);
    if (!tensor || !quant::has_packed_kernels(tensor->type) || tensor->shape != std::vector<std::size_t>{rows, cols})
      return std::nullopt;
    quant::PackedMatrix packed = quant::interleave_matrix(tensor->type, rows, cols, tensor->data);
    mapping->release(*tensor);  // the process holds the interleaved copy, not the file's pages too
    return packed;
  };
}

FileMatrix no_file_matrix() {  // Hugging Face folders: float32 or converted
  return [](const ForeignTensor&, std::size_t, std::size_t) { return std::optional<quant::PackedMatrix>(); };
}

// The fetch of a GGUF file's tensors, dequantized, in PyTorch's layout.
Fetch gguf_fetch(const io::GgufFile& file) {
  return [&file](const ForeignTensor& entry) {
    const io::GgufTensor* tensor = file.find_tensor(entry.gguf_name);
    if (!tensor) throw std::runtime_error(fmt::format("{}: tensor '{}' is missing", file.path(), entry.gguf_name));
    return file.dequantize(*tensor);
  };
}

Fetch hf_fetch(io::HfFolder& folder) {
  return [&folder](const ForeignTensor& entry) {
    auto it = folder.tensors.find(entry.hf_name);
    if (it == folder.tensors.end())
      throw std::runtime_error(fmt::format("{}: tensor '{}' is missing", folder.path, entry.hf_name));
    return it->second;  // GPT-2's fused c_attn is fetched three times, once per part
  };
}

// ---- the architectures a published file may hold ----------------------------------------------

// One per architecture: its names in GGUF (general.architecture) and in config.json
// ("architectures"), and how a file of it becomes a model.
struct PublishedArchitecture {
  const char* gguf_name;
  const char* hf_name;
  LanguageModel (*from_gguf)(const io::GgufFile& file, std::size_t vocab, const LoadOptions& options);
  LanguageModel (*from_hf)(const json& config, const std::string& path, io::HfFolder& folder, const LoadOptions& options);
};

template <class Model, auto config_from_gguf, auto config_from_hf, auto foreign_tensors>
constexpr PublishedArchitecture published(const char* gguf_name, const char* hf_name) {
  return {gguf_name, hf_name,
          [](const io::GgufFile& file, std::size_t vocab, const LoadOptions& options) {
            auto config = config_from_gguf(file, vocab);
            config.remat = options.remat;
            return load_weights<Model>(config, foreign_tensors(config), gguf_fetch(file), false, options,
                                       gguf_matrix(file));
          },
          [](const json& config, const std::string& path, io::HfFolder& folder, const LoadOptions& options) {
            auto model_config = config_from_hf(config, path);
            model_config.remat = options.remat;
            return load_weights<Model>(model_config, foreign_tensors(model_config), hf_fetch(folder), true, options,
                                       no_file_matrix());
          }};
}

const PublishedArchitecture published_architectures[] = {
    published<Llama, llama_config_from_gguf, llama_config_from_hf, llama_foreign_tensors>("llama", "LlamaForCausalLM"),
    published<Gpt2, gpt2_config_from_gguf, gpt2_config_from_hf, gpt2_foreign_tensors>("gpt2", "GPT2LMHeadModel"),
};

// The entry whose GGUF (hf false) or config.json (hf true) name is `name`, or an error naming
// `where` and every supported name.
const PublishedArchitecture& find_published(const std::string& name, bool hf, const std::string& where) {
  std::vector<std::string> names;
  for (const PublishedArchitecture& arch : published_architectures) {
    if (name == (hf ? arch.hf_name : arch.gguf_name)) return arch;
    names.push_back(hf ? arch.hf_name : arch.gguf_name);
  }
  throw std::runtime_error(
      fmt::format("{}: architecture '{}' is not supported (supported: {})", where, name, fmt::join(names, ", ")));
}

// ---- tokenizers --------------------------------------------------------------------------------

// The ids that end a reply: eos and eot, and the control tokens that llama.cpp also treats as
// the end of generation.
std::vector<std::int32_t> gguf_end_ids(const io::GgufFile& file, const std::vector<std::string>& tokens,
                                       const std::vector<std::int32_t>& types) {
  std::vector<std::int32_t> ids;
  auto add = [&](std::int64_t id) {
    if (id < 0 || std::size_t(id) >= tokens.size())
      throw std::runtime_error(fmt::format("{}: an end-of-text token id {} is outside the vocabulary of {} tokens",
                                           file.path(), id, tokens.size()));
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(std::int32_t(id));
  };
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (const io::GgufValue* value = file.find(key)) add(value->as_int());
  constexpr std::string_view end_texts[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>",
                                            "<|eom_id|>", "<|end|>", "</s>"};
  for (std::size_t id = 0; id < tokens.size(); ++id)
    if (!types.empty() && types[id] == 3)
      for (std::string_view text : end_texts)
        if (tokens[id] == text) add(std::int64_t(id));
  return ids;
}

std::string gguf_pre_tokenizer(const io::GgufFile& file) {
  const io::GgufValue* pre = file.find("tokenizer.ggml.pre");
  const std::string name = pre ? pre->as_string() : "default";
  if (name == "smollm" || name == "starcoder" || name == "refact") return "smollm";  // digits split one by one
  if (name == "gpt-2" || name == "gpt2" || name == "default") return "gpt2";
  if (name == "llama-bpe" || name == "llama3") return "llama3";
  throw std::runtime_error(fmt::format("{}: tokenizer.ggml.pre '{}' is not supported (supported: smollm, starcoder, "
                                       "refact, gpt-2, default, llama-bpe)",
                                       file.path(), name));
}

std::unique_ptr<tokenizers::Tokenizer> gguf_tokenizer(const io::GgufFile& file) {
  const std::string model = file.at("tokenizer.ggml.model").as_string();
  if (model != "gpt2")
    throw std::runtime_error(fmt::format("{}: tokenizer.ggml.model '{}' is not supported (byte-level BPE, \"gpt2\", only)",
                                         file.path(), model));
  tokenizers::BpeVocab vocab;
  vocab.tokens = file.at("tokenizer.ggml.tokens").as_strings();
  vocab.merges = file.at("tokenizer.ggml.merges").as_strings();
  if (const io::GgufValue* types = file.find("tokenizer.ggml.token_type"))
    for (std::int64_t type : types->as_ints()) vocab.token_types.push_back(std::int32_t(type));
  if (!vocab.token_types.empty() && vocab.token_types.size() != vocab.tokens.size())
    throw std::runtime_error(fmt::format("{}: tokenizer.ggml.token_type has {} entries for {} tokens", file.path(),
                                         vocab.token_types.size(), vocab.tokens.size()));
  vocab.pre = gguf_pre_tokenizer(file);
  if (const io::GgufValue* bos = file.find("tokenizer.ggml.bos_token_id")) vocab.bos = std::int32_t(bos->as_int());
  if (const io::GgufValue* add_bos = file.find("tokenizer.ggml.add_bos_token")) vocab.add_bos = add_bos->as_bool();
  vocab.end_ids = gguf_end_ids(file, vocab.tokens, vocab.token_types);
  for (std::size_t id = 0; id < vocab.token_types.size(); ++id)
    if (vocab.token_types[id] == 3 || vocab.token_types[id] == 4) vocab.special_ids.push_back(std::int32_t(id));
  try {
    return std::make_unique<tokenizers::ByteLevelBpe>(tokenizers::ByteLevelBpe::from_vocab(std::move(vocab)));
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: the tokenizer: {}", file.path(), e.what()));
  }
}

std::optional<std::string> hf_chat_template(const io::HfFolder& folder) {
  if (folder.chat_template_path) {
    std::ifstream in(*folder.chat_template_path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  if (!folder.tokenizer_config_path) return std::nullopt;
  std::ifstream in(*folder.tokenizer_config_path, std::ios::binary);
  const json config = json::parse(in, nullptr, false);
  if (config.is_discarded())
    throw std::runtime_error(fmt::format("{}: not valid JSON", *folder.tokenizer_config_path));
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array())  // named templates: the "default" one
    for (const json& entry : *it)
      if (entry.value("name", "") == "default" && entry.contains("template") && entry["template"].is_string())
        return entry["template"].get<std::string>();
  throw std::runtime_error(fmt::format("{}: chat_template is neither a string nor a list with a \"default\" template",
                                       *folder.tokenizer_config_path));
}

PretrainedModel load_gguf(const std::string& path, const LoadOptions& options) {
  const io::GgufFile file = io::GgufFile::open(path);
  const std::string arch = file.at("general.architecture").as_string();
  std::unique_ptr<tokenizers::Tokenizer> tokenizer = gguf_tokenizer(file);
  const std::size_t vocab = tokenizer->vocab_size();
  // A forged header may describe a far larger model than the file's tensors hold: refuse it before
  // allocating it. Dequantized, 4-bit blocks grow about 7x, and the float32 tensors made come to
  // about three copies of the model (its own, the file's dequantized, a Linear's transposed): SmolLM2's
  // Q4_1 file loads with 15.3x its size, a file of Q4_0 throughout would take about 20x.
  const std::size_t file_bytes = std::filesystem::file_size(path);
  TensorAllocationLimit limit(24 * file_bytes + (64 << 20),
                              fmt::format("{}: the sizes in the metadata describe a model larger than the file", path));
  LanguageModel model = find_published(arch, false, path + ": general.architecture").from_gguf(file, vocab, options);
  std::optional<std::string> chat_template;
  if (const io::GgufValue* value = file.find("tokenizer.chat_template")) chat_template = value->as_string();
  return {std::move(model), std::move(tokenizer), std::move(chat_template), "gguf"};
}

std::unique_ptr<tokenizers::Tokenizer> hf_tokenizer(const std::string& tokenizer_json,
                                                    const std::optional<std::string>& tokenizer_config) {
  return std::make_unique<tokenizers::ByteLevelBpe>(
      tokenizers::ByteLevelBpe::from_tokenizer_json(tokenizer_json, tokenizer_config));
}

PretrainedModel load_hf(const std::string& path, const LoadOptions& options) {
  io::HfFolder folder = io::read_hf_folder(path);
  const json config = json::parse(folder.config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object())
    throw std::runtime_error(fmt::format("{}/config.json: not a JSON object", path));
  const json& architectures = hf_key(config, "architectures", path);
  if (!architectures.is_array() || architectures.size() != 1 || !architectures[0].is_string())
    throw std::runtime_error(fmt::format("{}/config.json: 'architectures' is {}; expected one name", path,
                                         architectures.dump()));
  const std::string arch = architectures[0].get<std::string>();
  LanguageModel model = find_published(arch, true, path + "/config.json").from_hf(config, path, folder, options);
  std::unique_ptr<tokenizers::Tokenizer> tokenizer = hf_tokenizer(folder.tokenizer_json_path, folder.tokenizer_config_path);
  if (tokenizer->vocab_size() > model.config().vocab)
    throw std::runtime_error(fmt::format("{}: tokenizer.json has {} tokens but config.json's vocab_size is {}", path,
                                         tokenizer->vocab_size(), model.config().vocab));
  return {std::move(model), std::move(tokenizer), hf_chat_template(folder), "hf"};
}

void check_exists(const std::string& path) {
  if (!std::filesystem::exists(path)) throw std::runtime_error(fmt::format("{}: no such file or folder", path));
  if (!std::filesystem::is_directory(path) && !is_pretrained_path(path))
    throw std::runtime_error(fmt::format("{}: neither a GGUF file (it does not start with \"GGUF\") nor a Hugging Face "
                                         "folder",
                                         path));
}

}  // namespace

bool is_pretrained_path(const std::string& path) {
  if (std::filesystem::is_directory(path)) return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

PretrainedModel load_pretrained(const std::string& path, const LoadOptions& options) {
  check_exists(path);
  try {
    PretrainedModel loaded = std::filesystem::is_directory(path) ? load_hf(path, options) : load_gguf(path, options);
    // The file's tensors, dequantized, split and transposed on the way, were this load's temporaries
    // in sizes no step of the model allocates (SmolLM2's embedding alone is 113 MB; a Hugging Face
    // folder's, the whole float32 model): back to the system, not kept by the storage cache.
    release_cached_storage();
    return loaded;
  } catch (const std::exception& e) {
    // The readers name the file; a model's own checks (impossible sizes) do not.
    if (std::string_view(e.what()).starts_with(path)) throw;
    throw std::runtime_error(fmt::format("{}: {}", path, e.what()));
  }
}

std::unique_ptr<tokenizers::Tokenizer> load_pretrained_tokenizer(const std::string& path) {
  check_exists(path);
  if (std::filesystem::is_directory(path)) {  // tokenizer.json, and tokenizer_config.json when present
    const std::filesystem::path config = std::filesystem::path(path) / "tokenizer_config.json";
    return hf_tokenizer((std::filesystem::path(path) / "tokenizer.json").string(),
                        std::filesystem::exists(config) ? std::optional(config.string()) : std::nullopt);
  }
  return gguf_tokenizer(io::GgufFile::open(path));
}

}  // namespace tapegrad::nn
