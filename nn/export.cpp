// export_hf and export_gguf: a Llama's or a GPT-2's parameters through its architecture's
// foreign-tensor map into the files' names and layouts, plus the config keys and tokenizer files
// each format's readers require (transformers' LlamaForCausalLM and GPT2LMHeadModel; llama.cpp's
// llama-model.cpp and llama-vocab.cpp).
#include "nn/export.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "io/atomic_file.h"
#include "io/gguf_writer.h"
#include "io/safetensors.h"
#include "nn/models/foreign_tensors.h"
#include "nn/models/gpt2.h"
#include "nn/models/llama.h"
#include "tokenizers/byte_level_bpe.h"

namespace tapegrad::nn {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::int32_t kNormalToken = 1, kControlToken = 3, kUnusedToken = 5;  // GGUF's token types

const tokenizers::ByteLevelBpe& bpe_of(const tokenizers::Tokenizer& tokenizer, const std::string& target) {
  if (const auto* bpe = dynamic_cast<const tokenizers::ByteLevelBpe*>(&tokenizer)) return *bpe;
  throw std::invalid_argument(fmt::format("{}: only a byte-level BPE tokenizer exports (this one is '{}')", target,
                                          tokenizer.kind()));
}

// What the writers need of an architecture: its table of names and its config in each format.
struct ExportedArchitecture {
  std::vector<ForeignTensor> map;                        ///< every parameter's names (nn/models/foreign_tensors.h)
  std::size_t vocab = 0, max_len = 0;                    ///< the embedding's rows, the longest text
  ordered_json hf_config;                                ///< config.json without the token ids
  std::string gguf_arch;                                 ///< general.architecture, the keys' prefix
  std::function<void(io::GgufWriter&)> add_gguf_config;  ///< the "<gguf_arch>.*" keys
};

ExportedArchitecture exported_llama(const LlamaConfig& c) {
  ordered_json hf = {{"architectures", {"LlamaForCausalLM"}},
                     {"model_type", "llama"},
                     {"vocab_size", c.vocab},
                     {"hidden_size", c.d_model},
                     {"intermediate_size", c.ffn_dim()},
                     {"num_hidden_layers", c.n_blocks},
                     {"num_attention_heads", c.n_heads},
                     {"num_key_value_heads", c.kv_heads()},
                     {"head_dim", c.head_size()},
                     {"max_position_embeddings", c.max_len},
                     {"rms_norm_eps", c.norm_eps},
                     {"rope_theta", c.rope_theta},
                     {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},
                     {"hidden_act", "silu"},
                     {"attention_bias", false},
                     {"mlp_bias", false},
                     {"tie_word_embeddings", c.tied_head}};
  auto add_gguf = [c](io::GgufWriter& writer) {
    writer.add_u32("llama.vocab_size", std::uint32_t(c.vocab));
    writer.add_u32("llama.context_length", std::uint32_t(c.max_len));
    writer.add_u32("llama.embedding_length", std::uint32_t(c.d_model));
    writer.add_u32("llama.block_count", std::uint32_t(c.n_blocks));
    writer.add_u32("llama.feed_forward_length", std::uint32_t(c.ffn_dim()));
    writer.add_u32("llama.attention.head_count", std::uint32_t(c.n_heads));
    writer.add_u32("llama.attention.head_count_kv", std::uint32_t(c.kv_heads()));
    writer.add_u32("llama.attention.key_length", std::uint32_t(c.head_size()));
    writer.add_u32("llama.attention.value_length", std::uint32_t(c.head_size()));
    writer.add_u32("llama.rope.dimension_count", std::uint32_t(c.head_size()));
    writer.add_f32("llama.rope.freq_base", float(c.rope_theta));
    writer.add_f32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  };
  return {llama_foreign_tensors(c), c.vocab, c.max_len, std::move(hf), "llama", add_gguf};
}

// GPT2LMHeadModel's config (transformers' configuration_gpt2.py names); llama.cpp's gpt2 keys.
ExportedArchitecture exported_gpt2(const Gpt2Config& c) {
  ordered_json hf = {{"architectures", {"GPT2LMHeadModel"}},
                     {"model_type", "gpt2"},
                     {"vocab_size", c.vocab},
                     {"n_embd", c.d_model},
                     {"n_inner", c.ffn_dim()},
                     {"n_layer", c.n_blocks},
                     {"n_head", c.n_heads},
                     {"n_positions", c.max_len},
                     {"layer_norm_epsilon", c.norm_eps},
                     {"activation_function", "gelu_new"},
                     {"resid_pdrop", c.dropout},
                     {"embd_pdrop", c.dropout},
                     {"attn_pdrop", c.dropout},
                     {"scale_attn_weights", true},
                     {"tie_word_embeddings", true}};
  auto add_gguf = [c](io::GgufWriter& writer) {
    writer.add_u32("gpt2.context_length", std::uint32_t(c.max_len));
    writer.add_u32("gpt2.embedding_length", std::uint32_t(c.d_model));
    writer.add_u32("gpt2.block_count", std::uint32_t(c.n_blocks));
    writer.add_u32("gpt2.feed_forward_length", std::uint32_t(c.ffn_dim()));
    writer.add_u32("gpt2.attention.head_count", std::uint32_t(c.n_heads));
    writer.add_f32("gpt2.attention.layer_norm_epsilon", c.norm_eps);
  };
  return {gpt2_foreign_tensors(c), c.vocab, c.max_len, std::move(hf), "gpt2", add_gguf};
}

ExportedArchitecture exported_architecture(const LanguageModel& model, const std::string& target) {
  if (const Llama* llama = model.as<Llama>()) return exported_llama(llama->config());
  if (const Gpt2* gpt2 = model.as<Gpt2>()) return exported_gpt2(gpt2->config());
  throw std::invalid_argument(
      fmt::format("{}: only Llama and GPT-2 models export (this model is '{}')", target, model.arch()));
}

// The three parts q, k, v (each in the file's PyTorch layout) as the one fused tensor the file
// holds, the inverse of load_foreign_tensors' split: rows after rows, or for Hugging Face's
// Conv1D (in, out) matrix columns beside columns; a bias end to end.
Tensor joined_parts(const std::vector<Tensor>& parts, bool columns) {
  const Tensor& first = parts.front();
  const std::size_t rows = first.dim(0), cols = first.rank() == 2 ? first.dim(1) : 1;
  if (first.rank() == 1 || !columns) {
    std::vector<float> values;
    for (const Tensor& part : parts) values.insert(values.end(), part.data(), part.data() + part.size());
    Shape shape = first.shape();
    shape[0] *= parts.size();
    return Tensor(shape, std::move(values));
  }
  Tensor out = Tensor::uninitialized({rows, cols * parts.size()});
  for (std::size_t p = 0; p < parts.size(); ++p)
    for (std::size_t r = 0; r < rows; ++r)
      std::copy_n(parts[p].data() + r * cols, cols, out.data() + (r * parts.size() + p) * cols);
  return out;
}

// A tensor of the file: its names (a fused tensor's: its first part's, split cleared) and values.
struct FileTensor {
  ForeignTensor entry;
  Tensor tensor;
};

// The model's parameters as the file's tensors, in the file's PyTorch layout (Hugging Face's
// when to_hf, else GGUF's): a Linear's (in, out) weight transposed unless Hugging Face keeps it
// as a Conv1D, q and k rows unpermuted for HF, q, k and v parts joined. A parameter the map does
// not name (an unmerged LoRA adapter) is refused: it would be lost.
std::vector<FileTensor> file_tensors(const LanguageModel& model, const ExportedArchitecture& arch, bool to_hf,
                                     const std::string& target) {
  std::map<std::string, const Tensor*> params;
  for (const auto& p : model.params()) params.emplace(p.name, &p.var.value());
  std::vector<FileTensor> out;
  std::map<std::string, std::vector<Tensor>> parts;  // by file name, until all three are there
  for (const ForeignTensor& entry : arch.map) {
    auto found = params.find(entry.param);
    if (found == params.end())
      throw std::logic_error(fmt::format("{}: the {} has no parameter '{}'", target, arch.gguf_arch, entry.param));
    const bool conv1d = to_hf && entry.hf_conv1d;
    Tensor t = *found->second;
    if (entry.linear_weight && !conv1d) t = transposed(t);
    if (to_hf && entry.hf_rope_heads > 0) t = unpermute_rope_rows(t, entry.hf_rope_heads);
    params.erase(found);
    if (entry.split.empty()) {
      out.push_back({entry, std::move(t)});
      continue;
    }
    std::vector<Tensor>& fused = parts[to_hf ? entry.hf_name : entry.gguf_name];
    fused.push_back(std::move(t));
    if (fused.size() < 3) continue;  // the map lists q, k, v in order
    ForeignTensor whole = entry;
    whole.split.clear();
    out.push_back({std::move(whole), joined_parts(fused, conv1d)});
  }
  if (!params.empty())
    throw std::invalid_argument(fmt::format("{}: parameter '{}' has no place in a {} file (merge LoRA adapters "
                                            "into the weights before exporting)",
                                            target, params.begin()->first, arch.gguf_arch));
  return out;
}

void write_text(const std::string& path, const std::string& text) {
  io::AtomicFile out(path);
  out.write(text.data(), text.size());
  out.commit();
}

std::optional<std::int32_t> eos_of(const tokenizers::BpeVocab& vocab) {
  return vocab.end_ids.empty() ? std::nullopt : std::optional(vocab.end_ids.front());
}

// config.json: the architecture's keys, then the token ids and the dtype.
ordered_json hf_config(const ExportedArchitecture& arch, const tokenizers::BpeVocab& vocab) {
  const std::optional<std::int32_t> eos = eos_of(vocab);
  ordered_json config = arch.hf_config;
  config["bos_token_id"] = vocab.bos ? ordered_json(*vocab.bos) : ordered_json(nullptr);
  config["eos_token_id"] = eos ? ordered_json(*eos) : ordered_json(nullptr);
  config["torch_dtype"] = "float32";
  config["dtype"] = "float32";
  return config;
}

ordered_json hf_tokenizer_config(const tokenizers::BpeVocab& vocab, std::size_t max_len,
                                 const std::optional<std::string>& chat_template) {
  auto token = [&](std::optional<std::int32_t> id) {
    return id ? ordered_json(vocab.tokens[std::size_t(*id)]) : ordered_json(nullptr);
  };
  ordered_json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                         {"bos_token", token(vocab.bos)},
                         {"eos_token", token(eos_of(vocab))},
                         {"add_bos_token", vocab.add_bos},
                         {"model_max_length", max_len},
                         {"clean_up_tokenization_spaces", false}};
  if (vocab.unk) config["unk_token"] = token(vocab.unk);
  if (chat_template) config["chat_template"] = *chat_template;
  return config;
}

// GGUF's name of a pre-tokenizer (llama.cpp's tokenizer.ggml.pre).
const char* gguf_pre_name(const std::string& pre) {
  if (pre == "smollm") return "smollm";
  if (pre == "llama3") return "llama-bpe";
  return "gpt-2";
}

void add_gguf_tokenizer(io::GgufWriter& writer, const tokenizers::BpeVocab& vocab, std::size_t model_vocab,
                        const std::optional<std::string>& chat_template, const std::string& path) {
  if (vocab.tokens.size() > model_vocab)
    throw std::invalid_argument(fmt::format("{}: the tokenizer has {} tokens, more than the model's vocabulary of {}",
                                            path, vocab.tokens.size(), model_vocab));
  std::vector<std::string> tokens = vocab.tokens;
  std::vector<std::int32_t> types(model_vocab, kNormalToken);
  for (std::size_t id = 0; id < vocab.tokens.size(); ++id)
    if (id < vocab.token_types.size()) types[id] = vocab.token_types[id];
  for (std::int32_t id : vocab.special_ids)
    if (vocab.token_types.empty()) types[std::size_t(id)] = kControlToken;
  // llama.cpp takes the vocabulary's size from the token list: rows past the tokenizer's get
  // placeholders, as llama.cpp's converter pads them.
  for (std::size_t id = vocab.tokens.size(); id < model_vocab; ++id) {
    tokens.push_back(fmt::format("[PAD{}]", id));
    types[id] = kUnusedToken;
  }
  writer.add_string("tokenizer.ggml.model", "gpt2");
  writer.add_string("tokenizer.ggml.pre", gguf_pre_name(vocab.pre));
  writer.add_strings("tokenizer.ggml.tokens", std::move(tokens));
  writer.add_i32s("tokenizer.ggml.token_type", types);
  writer.add_strings("tokenizer.ggml.merges", vocab.merges);
  if (vocab.bos) writer.add_u32("tokenizer.ggml.bos_token_id", std::uint32_t(*vocab.bos));
  if (const auto eos = eos_of(vocab)) writer.add_u32("tokenizer.ggml.eos_token_id", std::uint32_t(*eos));
  if (vocab.unk) writer.add_u32("tokenizer.ggml.unknown_token_id", std::uint32_t(*vocab.unk));
  writer.add_bool("tokenizer.ggml.add_bos_token", vocab.add_bos);
  if (chat_template) writer.add_string("tokenizer.chat_template", *chat_template);
}

// llama.cpp's general.file_type (LLAMA_FTYPE_*) of an export.
std::uint32_t gguf_file_type(GgufExportType type) {
  switch (type) {
    case GgufExportType::F32: return 0;
    case GgufExportType::BF16: return 32;
    case GgufExportType::Q8_0: return 7;
  }
  return 0;
}

quant::TensorType tensor_type_of(GgufExportType type, const Tensor& t) {
  if (t.rank() < 2 || type == GgufExportType::F32) return quant::TensorType::F32;
  if (type == GgufExportType::BF16) return quant::TensorType::BF16;
  return t.shape().back() % 32 == 0 ? quant::TensorType::Q8_0 : quant::TensorType::F32;
}

}  // namespace

void check_exportable(const ExportSource& source, const std::string& target) {
  exported_architecture(source.model, target);
  bpe_of(source.tokenizer, target);
}

GgufExportType parse_gguf_export_type(std::string_view name) {
  if (name == "f32") return GgufExportType::F32;
  if (name == "bf16") return GgufExportType::BF16;
  if (name == "q8_0") return GgufExportType::Q8_0;
  throw std::invalid_argument(fmt::format("export type '{}' is not one of f32, bf16, q8_0", name));
}

void export_hf(const ExportSource& source, const std::string& dir) {
  const ExportedArchitecture arch = exported_architecture(source.model, dir);
  const tokenizers::ByteLevelBpe& tokenizer = bpe_of(source.tokenizer, dir);
  const tokenizers::BpeVocab& vocab = tokenizer.vocab();
  if (vocab.tokens.size() > arch.vocab)
    throw std::invalid_argument(fmt::format("{}: the tokenizer has {} tokens, more than the model's vocabulary of {}",
                                            dir, vocab.tokens.size(), arch.vocab));
  const std::vector<FileTensor> tensors = file_tensors(source.model, arch, true, dir);
  io::write_folder_atomically(dir, [&](const std::string& folder) {
    std::vector<std::pair<std::string, const Tensor*>> named;
    for (const auto& [entry, tensor] : tensors) named.emplace_back(entry.hf_name, &tensor);
    write_safetensors(folder + "/model.safetensors", named, {{"format", "pt"}});
    write_text(folder + "/config.json", hf_config(arch, vocab).dump(2) + "\n");
    write_text(folder + "/tokenizer.json", tokenizer.to_tokenizer_json());
    write_text(folder + "/tokenizer_config.json",
               hf_tokenizer_config(vocab, arch.max_len, source.chat_template).dump(2) + "\n");
  });
}

void export_gguf(const ExportSource& source, const std::string& path, GgufExportType type) {
  const ExportedArchitecture arch = exported_architecture(source.model, path);
  const tokenizers::ByteLevelBpe& tokenizer = bpe_of(source.tokenizer, path);
  io::GgufWriter writer;
  writer.add_string("general.architecture", arch.gguf_arch);
  writer.add_u32("general.file_type", gguf_file_type(type));
  arch.add_gguf_config(writer);
  add_gguf_tokenizer(writer, tokenizer.vocab(), arch.vocab, source.chat_template, path);
  for (const auto& [entry, tensor] : file_tensors(source.model, arch, false, path)) {
    const quant::TensorType tensor_type = tensor_type_of(type, tensor);
    if (tensor_type == quant::TensorType::Q8_0)
      for (std::size_t i = 0; i < tensor.size(); ++i)
        if (!std::isfinite(tensor.data()[i]))
          throw std::invalid_argument(fmt::format("{}: parameter '{}' holds {} at element {}; q8_0 blocks need finite "
                                                  "values",
                                                  path, entry.param, tensor.data()[i], i));
    writer.add_tensor(entry.gguf_name, tensor_type, tensor.shape(), std::span<const float>(tensor.data(), tensor.size()));
  }
  writer.write(path);
}

}  // namespace tapegrad::nn
