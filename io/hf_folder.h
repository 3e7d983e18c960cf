// Hugging Face model folders: config.json, the weights (model.safetensors, or shards listed by
// model.safetensors.index.json) read to float32, and where the tokenizer files are. Generic: the
// config's text is handed on unparsed; architectures read it.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "core/tensor.h"

namespace tapegrad::io {

/// A model folder's contents.
struct HfFolder {
  std::string path;
  std::string config_json;               ///< the text of config.json (a JSON object)
  std::map<std::string, Tensor> tensors;  ///< every weight, float32 in PyTorch shapes (from F32, F16 or BF16)
  std::string tokenizer_json_path;
  std::optional<std::string> tokenizer_config_path;  ///< tokenizer_config.json, when present
  std::optional<std::string> chat_template_path;     ///< chat_template.jinja, when present
};

/// Reads the folder at `path`. Required: config.json (a JSON object), tokenizer.json, and either
/// model.safetensors (preferred when both exist, as transformers does) or
/// model.safetensors.index.json whose weight_map names, for every tensor, a shard in the folder;
/// every shard must hold exactly the tensors listed for it. A missing or contradictory file throws
/// std::runtime_error naming that file.
HfFolder read_hf_folder(const std::string& path);

}  // namespace tapegrad::io
