// ForeignTensor: where each parameter of a model lives in Hugging Face and GGUF files, one table
// per architecture (as tinygrad's keymaps and llama.cpp's LLM_TENSOR_NAMES), and
// load_foreign_tensors, which turns the files' tensors into tapegrad's layout and assigns them.
#pragma once

#include <functional>
#include <span>
#include <string>

#include "core/tensor.h"
#include "nn/module.h"

namespace tapegrad::nn {

/// One parameter of a model and its names and layout in foreign files. Tensors are fetched in
/// PyTorch's layout (a GGUF tensor's dims reversed): matrices (out, in), except GPT-2's Conv1D in
/// Hugging Face files, (in, out). tapegrad's Linear stores its weight (in, out), so a file's (out,
/// in) matrix is transposed at load; embeddings and vectors are taken as they are.
struct ForeignTensor {
  std::string param;      ///< tapegrad's parameter name, e.g. "blocks.3.attn.wq.weight"
  std::string hf_name;    ///< e.g. "model.layers.3.self_attn.q_proj.weight"
  std::string gguf_name;  ///< e.g. "blk.3.attn_q.weight"
  bool linear_weight = false;  ///< a Linear's weight (in, out): the file's (out, in) matrix transposed
  bool hf_conv1d = false;      ///< Hugging Face stores it (in, out) already (GPT-2's Conv1D)
  /// > 0: the Hugging Face rows are in rotate-half order, in this many heads; llama.cpp's
  /// converter permutation makes them interleaved (Note [Llama's RoPE], nn/models/llama.h).
  std::size_t hf_rope_heads = 0;
  /// "q", "k" or "v": this part of a fused tensor of three equal parts (Hugging Face's c_attn
  /// (in, 3*out) and its bias, GGUF's attn_qkv (3*out, in)); "" when not fused.
  std::string split;
};

/// The rows of an (out, in) matrix of `heads` heads in rotate-half order (Hugging Face) put in
/// interleaved-pair order (llama.cpp's convert_hf_to_gguf permute): within each head of Dh rows,
/// row 2i comes from row i and row 2i + 1 from row i + Dh/2. A bias vector is a matrix of one column.
Tensor permute_rope_rows(const Tensor& weight, std::size_t heads);
/// The inverse of permute_rope_rows: interleaved-pair rows back in rotate-half order, for writing
/// Hugging Face files.
Tensor unpermute_rope_rows(const Tensor& weight, std::size_t heads);

/// The transpose of a (rows, cols) matrix: files store a Linear's weight (out, in), tapegrad
/// (in, out).
Tensor transposed(const Tensor& matrix);

/// Assigns every parameter of model named in map: fetch(entry) gives the file's float32 tensor in
/// PyTorch's layout (it looks up entry.hf_name or entry.gguf_name, as from_hf says); the split part
/// is taken, from_hf's RoPE permutation applied, and a Linear's weight transposed. Throws
/// std::invalid_argument naming both names and both shapes when a result does not fit its
/// parameter, or naming a parameter the model lacks.
void load_foreign_tensors(Module& model, std::span<const ForeignTensor> map,
                          const std::function<Tensor(const ForeignTensor&)>& fetch_pytorch_layout, bool from_hf);

}  // namespace tapegrad::nn
