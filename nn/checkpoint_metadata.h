// Reading the "__metadata__" strings of a checkpoint back into numbers: each reader names the key
// and the text it refused, for the loaders and for train_char's resume.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace tapegrad::nn {

/// The "__metadata__" of a safetensors file: key -> value, both strings.
using Metadata = std::map<std::string, std::string>;

/// The value of key; throws std::runtime_error "metadata key '<key>' is missing".
const std::string& metadata_text(const Metadata& metadata, const std::string& key);

/// The value of key as a size in [0, 2^31] (a model dimension); throws std::runtime_error naming
/// the key and the text otherwise.
std::size_t metadata_size(const Metadata& metadata, const std::string& key);

/// The value of key as a non-negative 64-bit integer (a step or a count); throws
/// std::runtime_error naming the key and the text otherwise.
std::int64_t metadata_count(const Metadata& metadata, const std::string& key);

/// The value of key as a 64-bit unsigned integer (a seed); throws std::runtime_error naming the
/// key and the text otherwise.
std::uint64_t metadata_seed(const Metadata& metadata, const std::string& key);

/// The value of key as a finite number > 0 (an epsilon, a base, a probability); throws
/// std::runtime_error naming the key and the text otherwise.
double metadata_positive(const Metadata& metadata, const std::string& key);

/// The value of key as a number in [0, 1) (a dropout probability); throws std::runtime_error
/// naming the key and the text otherwise.
double metadata_probability(const Metadata& metadata, const std::string& key);

/// Throws std::runtime_error unless the file's format_version is `expected`.
void check_format_version(const Metadata& metadata, const std::string& expected);

/// Reads the sizes every architecture records (vocab_size, d_model, n_heads, n_blocks, max_len,
/// d_ff) into a model config; throws std::runtime_error naming the key and the text otherwise.
template <class Config> void read_model_sizes(const Metadata& metadata, Config& config) {
  config.vocab = metadata_size(metadata, "vocab_size");
  config.d_model = metadata_size(metadata, "d_model");
  config.n_heads = metadata_size(metadata, "n_heads");
  config.n_blocks = metadata_size(metadata, "n_blocks");
  config.max_len = metadata_size(metadata, "max_len");
  config.d_ff = metadata_size(metadata, "d_ff");
}

/// Writes the sizes read_model_sizes reads (d_ff as the model uses it) into metadata.
template <class Config> void write_model_sizes(const Config& config, Metadata& metadata) {
  metadata["vocab_size"] = std::to_string(config.vocab);
  metadata["d_model"] = std::to_string(config.d_model);
  metadata["n_heads"] = std::to_string(config.n_heads);
  metadata["n_blocks"] = std::to_string(config.n_blocks);
  metadata["max_len"] = std::to_string(config.max_len);
  metadata["d_ff"] = std::to_string(config.ffn_dim());
}

/// Records config.seed, the root of the dropout streams, as "dropout_seed" when the model has
/// dropout: a resumed run's masks then continue the saved run's. Without dropout the seed drew
/// only the initial weights, which the file holds, and it is not written.
template <class Config> void write_dropout_seed(const Config& config, Metadata& metadata) {
  if (config.dropout > 0) metadata["dropout_seed"] = std::to_string(config.seed);
}

/// Reads what write_dropout_seed wrote into config.seed; when it is absent (no dropout, or a file
/// from before the key) the seed stays as it is.
template <class Config> void read_dropout_seed(const Metadata& metadata, Config& config) {
  if (metadata.count("dropout_seed")) config.seed = metadata_seed(metadata, "dropout_seed");
}

}  // namespace tapegrad::nn
