// Inference-only weights: a loaded model's matrices (Linear weights, token embeddings) replaced by
// packed ones (core/quant/packed_matrix.h), kept in a file's block format or converted from float32;
// the float32 copies are freed. Decoding (CachePass) reads them; training and TapePass cannot.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>

#include "core/quant/packed_matrix.h"
#include "nn/models/foreign_tensors.h"
#include "nn/module.h"

namespace tapegrad::nn {

/// The file's own matrix for a map entry, (rows, cols) = (out, in) or (V, D), when it is in a
/// format with kernels; nullopt keeps the float32 weights.
using FileMatrix =
    std::function<std::optional<quant::PackedMatrix>(const ForeignTensor& entry, std::size_t rows, std::size_t cols)>;

/// Packs every Linear weight and Embedding table of `model` that `map` names (fused parts and
/// layers with a LoRA adapter excepted): converted to `convert_to` when given (a matrix whose rows
/// are not whole blocks stays float32; the 4-bit formats keep embeddings in Q8_0, as llama.cpp's
/// quantize does), else taken from file_matrix. Returns how many were packed.
std::size_t pack_matrices(Module& model, std::span<const ForeignTensor> map, const FileMatrix& file_matrix,
                          std::optional<quant::TensorType> convert_to);

/// The bytes of every packed matrix of `model` by its layer's name ("blocks.0.attn.wq", "embed").
std::map<std::string, std::size_t> packed_bytes(Module& model);

/// Whether any layer of `model` holds packed weights (then only decoding through a KVCache runs it).
bool has_packed_matrices(Module& model);

}  // namespace tapegrad::nn
