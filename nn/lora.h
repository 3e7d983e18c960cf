// LoRA (Hu et al. 2021, "Low-Rank Adaptation of Large Language Models") on a model's projections:
// adapters added to a frozen base (nn/linear.h's LoraAdapter), recorded in checkpoints, written
// and read in PEFT's layout (adapter_config.json, adapter_model.safetensors), and merged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nn/checkpoint_metadata.h"
#include "nn/language_model.h"

namespace tapegrad::nn {

/// What add_lora adds.
struct LoraOptions {
  std::size_t rank = 8;  ///< r
  float alpha = 8;       ///< the adapters' output is scaled by alpha / r (PEFT's lora_alpha)
  /// The projections of every block, by PEFT's module names without "_proj": q, k, v, o
  /// (attention), gate, up, down (the SwiGLU FFN). PEFT's default for Llama is q and v.
  std::vector<std::string> targets = {"q", "v"};
  std::uint64_t seed = 0;  ///< the initialisation of A
};

/// The projection names LoRA knows, in a block's order: q, k, v, o, gate, up, down.
std::vector<std::string_view> lora_target_names();

/// Freezes every parameter of model (Module::freeze) and gives each targeted projection of every
/// block an adapter: A (in, r) ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform_ with
/// a = sqrt(5)), drawn from Rng(seed) in parameter order; B (r, out) zero, so the model's output
/// is unchanged until B trains. Throws std::invalid_argument naming the value for a rank of 0 or
/// above a projection's smaller side, alpha not positive, an unknown or repeated target, a model
/// that has adapters already, or one with none of the targets.
void add_lora(LanguageModel& model, const LoraOptions& options);

/// The options of the model's adapters (seed 0), or nullopt when it has none.
std::optional<LoraOptions> lora_of(const LanguageModel& model);

/// Folds every adapter into its weight, W += (alpha / r) A B, and removes it (the weight stays
/// frozen); returns how many were merged.
std::size_t merge_lora(LanguageModel& model);

/// Checkpoint metadata of the adapters: lora.rank, lora.alpha, lora.targets ("q,v"); empty
/// without adapters.
Metadata lora_metadata(const LanguageModel& model);
/// Before a checkpoint's tensors are read: adds adapters as lora_metadata recorded them (their
/// values are the file's to fill); nothing when the metadata has no lora.rank. Throws
/// std::runtime_error naming the key when a value is bad.
void add_lora_from_metadata(LanguageModel& model, const Metadata& metadata);

/// Whether the model's architecture has a Hugging Face layout that PEFT's files name (Llama's).
bool has_peft_layout(const LanguageModel& model);

/// Writes the adapters as PEFT's save_pretrained does into folder (created if needed):
/// adapter_model.safetensors with base_model.model.MODULE.lora_A.weight (r, in), MODULE the
/// Hugging Face module's name, and .lora_B.weight (out, r) in float32 (q and k rows back in Hugging Face's rotate-half order,
/// Note [Llama's RoPE]), and adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r,
/// lora_alpha, target_modules, lora_dropout 0, bias none, fan_in_fan_out false,
/// base_model_name_or_path = base_model), each file atomically. Throws std::invalid_argument for a
/// model without adapters or without a Hugging Face layout (Llama has one).
void save_peft_adapter(const std::string& folder, const LanguageModel& model, const std::string& base_model);

/// Reads a PEFT LoRA folder (what save_peft_adapter or PEFT's save_pretrained writes) onto model,
/// which must be the same base: add_lora's freezing, then the file's adapters. Refuses, with
/// std::runtime_error naming the file and the key, what tapegrad does not apply: another
/// peft_type, DoRA, rsLoRA, rank or alpha patterns, modules_to_save, layers_to_transform, a bias,
/// fan_in_fan_out, a target it does not know; and any tensor missing, unknown, mis-shaped or not
/// finite. Returns the options read (seed 0).
LoraOptions load_peft_adapter(const std::string& folder, LanguageModel& model);

}  // namespace tapegrad::nn
