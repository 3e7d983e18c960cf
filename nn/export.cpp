// export_hf and export_gguf: a Llama's parameters through its foreign-tensor map into the files'
// names and layouts, plus the config keys and tokenizer files each format's readers require
// (transformers' LlamaForCausalLM; llama.cpp's llama-model.cpp and llama-vocab.cpp).
#include "nn/export.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "io/atomic_file.h"
#include "io/gguf_writer.h"
#include "io/safetensors.h"
#include "nn/models/foreign_tensors.h"
#include "nn/models/llama.h"
#include "tokenizers/byte_level_bpe.h"

namespace tapegrad::nn {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::int32_t kNormalToken = 1, kControlToken = 3, kUnusedToken = 5;  // GGUF's token types

const Llama& llama_of(const LanguageModel& model, const std::string& target) {
  if (const Llama* llama = model.as<Llama>()) return *llama;
  throw std::invalid_argument(fmt::format("{}: only Llama models export (this model is '{}')", target, model.arch()));
}

const tokenizers::ByteLevelBpe& bpe_of(const tokenizers::Tokenizer& tokenizer, const std::string& target) {
  if (const auto* bpe = dynamic_cast<const tokenizers::ByteLevelBpe*>(&tokenizer)) return *bpe;
  throw std::invalid_argument(fmt::format("{}: only a byte-level BPE tokenizer exports (this one is '{}')", target,
                                          tokenizer.kind()));
}

// Each entry of the map with its parameter in the file's PyTorch layout (Hugging Face's when
// to_hf, else GGUF's): a Linear's (in, out) weight transposed, q and k rows unpermuted for HF.
// A parameter the map does not name (an unmerged LoRA adapter) is refused: it would be lost.
std::vector<std::pair<ForeignTensor, Tensor>> foreign_layout(const Llama& model, bool to_hf, const std::string& target) {
  const std::vector<ForeignTensor> map = llama_foreign_tensors(model.config());
  std::map<std::string, const Tensor*> params;
  for (const auto& p : model.params()) params.emplace(p.name, &p.var.value());
  std::vector<std::pair<ForeignTensor, Tensor>> out;
  for (const ForeignTensor& entry : map) {
    auto found = params.find(entry.param);
    if (found == params.end())
      throw std::logic_error(fmt::format("{}: the Llama has no parameter '{}'", target, entry.param));
    Tensor t = *found->second;
    if (entry.linear_weight) t = transposed(t);
    if (to_hf && entry.hf_rope_heads > 0) t = unpermute_rope_rows(t, entry.hf_rope_heads);
    out.emplace_back(entry, std::move(t));
    params.erase(found);
  }
  if (!params.empty())
    throw std::invalid_argument(fmt::format("{}: parameter '{}' has no place in a Llama file (merge LoRA adapters "
                                            "into the weights before exporting)",
                                            target, params.begin()->first));
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

ordered_json hf_config(const LlamaConfig& c, const tokenizers::BpeVocab& vocab) {
  const std::optional<std::int32_t> eos = eos_of(vocab);
  return {{"architectures", {"LlamaForCausalLM"}},
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
          {"tie_word_embeddings", c.tied_head},
          {"bos_token_id", vocab.bos ? ordered_json(*vocab.bos) : ordered_json(nullptr)},
          {"eos_token_id", eos ? ordered_json(*eos) : ordered_json(nullptr)},
          {"torch_dtype", "float32"},
          {"dtype", "float32"}};
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
  llama_of(source.model, target);
  bpe_of(source.tokenizer, target);
}

GgufExportType parse_gguf_export_type(std::string_view name) {
  if (name == "f32") return GgufExportType::F32;
  if (name == "bf16") return GgufExportType::BF16;
  if (name == "q8_0") return GgufExportType::Q8_0;
  throw std::invalid_argument(fmt::format("export type '{}' is not one of f32, bf16, q8_0", name));
}

void export_hf(const ExportSource& source, const std::string& dir) {
  const Llama& model = llama_of(source.model, dir);
  const tokenizers::ByteLevelBpe& tokenizer = bpe_of(source.tokenizer, dir);
  const tokenizers::BpeVocab& vocab = tokenizer.vocab();
  const LlamaConfig& config = model.config();
  if (vocab.tokens.size() > config.vocab)
    throw std::invalid_argument(fmt::format("{}: the tokenizer has {} tokens, more than the model's vocabulary of {}",
                                            dir, vocab.tokens.size(), config.vocab));
  const auto tensors = foreign_layout(model, true, dir);
  io::write_folder_atomically(dir, [&](const std::string& folder) {
    std::vector<std::pair<std::string, const Tensor*>> named;
    for (const auto& [entry, tensor] : tensors) named.emplace_back(entry.hf_name, &tensor);
    write_safetensors(folder + "/model.safetensors", named, {{"format", "pt"}});
    write_text(folder + "/config.json", hf_config(config, vocab).dump(2) + "\n");
    write_text(folder + "/tokenizer.json", tokenizer.to_tokenizer_json());
    write_text(folder + "/tokenizer_config.json",
               hf_tokenizer_config(vocab, config.max_len, source.chat_template).dump(2) + "\n");
  });
}

void export_gguf(const ExportSource& source, const std::string& path, GgufExportType type) {
  const Llama& model = llama_of(source.model, path);
  const tokenizers::ByteLevelBpe& tokenizer = bpe_of(source.tokenizer, path);
  const LlamaConfig& c = model.config();
  io::GgufWriter writer;
  writer.add_string("general.architecture", "llama");
  writer.add_u32("general.file_type", gguf_file_type(type));
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
  add_gguf_tokenizer(writer, tokenizer.vocab(), c.vocab, source.chat_template, path);
  for (const auto& [entry, tensor] : foreign_layout(model, false, path)) {
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
