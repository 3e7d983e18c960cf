// load_foreign_tensors and the RoPE row permutation: foreign files' tensors into tapegrad's layout.
#include "nn/models/foreign_tensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>

namespace tapegrad::nn {

namespace {

/// The rows (or, for Hugging Face's Conv1D, the columns) of part "q", "k" or "v" of a fused tensor.
Tensor split_part(const Tensor& fused, const ForeignTensor& entry, bool columns, const std::string& file_name) {
  const std::size_t part = entry.split == "q" ? 0 : entry.split == "k" ? 1 : entry.split == "v" ? 2 : 3;
  const bool by_columns = columns && fused.rank() == 2;  // a bias is split along its one axis
  const std::size_t axis = by_columns ? 1 : 0;
  if (part == 3 || fused.rank() == 0 || fused.rank() > 2 || fused.dim(axis) % 3 != 0)
    throw std::invalid_argument(fmt::format("load_foreign_tensors: {}: cannot take part '{}' of three along axis {} "
                                            "of {} for {}",
                                            file_name, entry.split, axis, to_string(fused.shape()), entry.param));
  const std::size_t rows = fused.dim(0), cols = fused.rank() == 2 ? fused.dim(1) : 1;
  if (fused.rank() == 1) {
    const std::size_t n = rows / 3;
    return Tensor({n}, std::vector<float>(fused.data() + part * n, fused.data() + (part + 1) * n));
  }
  if (!by_columns) {
    const std::size_t n = rows / 3;
    return Tensor({n, cols}, std::vector<float>(fused.data() + part * n * cols, fused.data() + (part + 1) * n * cols));
  }
  const std::size_t n = cols / 3;
  Tensor out = Tensor::uninitialized({rows, n});
  for (std::size_t r = 0; r < rows; ++r)
    std::copy_n(fused.data() + r * cols + part * n, n, out.data() + r * n);
  return out;
}

// Row 2i of each head from row i and row 2i + 1 from row i + Dh/2 (to_interleaved), or back.
Tensor move_rope_rows(const Tensor& weight, std::size_t heads, bool to_interleaved, const char* caller) {
  const std::size_t rows = weight.rank() == 0 ? 0 : weight.dim(0), cols = weight.rank() == 2 ? weight.dim(1) : 1;
  if (weight.rank() == 0 || weight.rank() > 2 || heads == 0 || rows % (2 * heads) != 0)
    throw std::invalid_argument(fmt::format("{}: {} rows of {} do not split into {} heads of an even size", caller,
                                            rows, to_string(weight.shape()), heads));
  const std::size_t head_dim = rows / heads, half = head_dim / 2;
  Tensor out = Tensor::uninitialized(weight.shape());
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < half; ++i)
      for (std::size_t pair = 0; pair < 2; ++pair) {
        const std::size_t rotate_half = h * head_dim + pair * half + i, interleaved = h * head_dim + 2 * i + pair;
        const std::size_t from = to_interleaved ? rotate_half : interleaved, to = to_interleaved ? interleaved : rotate_half;
        std::copy_n(weight.data() + from * cols, cols, out.data() + to * cols);
      }
  return out;
}

}  // namespace

Tensor permute_rope_rows(const Tensor& weight, std::size_t heads) {
  return move_rope_rows(weight, heads, true, "permute_rope_rows");
}

Tensor unpermute_rope_rows(const Tensor& weight, std::size_t heads) {
  return move_rope_rows(weight, heads, false, "unpermute_rope_rows");
}

void load_foreign_tensors(Module& model, std::span<const ForeignTensor> map,
                          const std::function<Tensor(const ForeignTensor&)>& fetch_pytorch_layout, bool from_hf) {
  std::map<std::string, Var> params;
  for (const auto& p : model.params()) params.emplace(p.name, p.var);
  for (const ForeignTensor& entry : map) {
    auto found = params.find(entry.param);
    if (found == params.end())
      throw std::invalid_argument(
          fmt::format("load_foreign_tensors: the model has no parameter '{}' (for {})", entry.param,
                      from_hf ? entry.hf_name : entry.gguf_name));
    const std::string& file_name = from_hf ? entry.hf_name : entry.gguf_name;
    const bool conv1d = from_hf && entry.hf_conv1d;  // (in, out): tapegrad's layout already
    Tensor t = fetch_pytorch_layout(entry);
    const Shape file_shape = t.shape();
    if (!entry.split.empty()) t = split_part(t, entry, conv1d, file_name);
    if (from_hf && entry.hf_rope_heads > 0) t = permute_rope_rows(t, entry.hf_rope_heads);
    if (entry.linear_weight && !conv1d && t.rank() == 2) t = transposed(t);
    Var& param = found->second;
    if (t.shape() != param.value().shape())
      throw std::invalid_argument(fmt::format("load_foreign_tensors: {} {} gives {} for {} {}", file_name,
                                              to_string(file_shape), to_string(t.shape()), entry.param,
                                              to_string(param.value().shape())));
    std::copy_n(t.data(), t.size(), param.mutable_value().data());
    params.erase(found);
  }
  // A model built under SkipInitScope holds whatever memory held where no entry wrote: a silent wrong model.
  if (!params.empty())
    throw std::invalid_argument(fmt::format("load_foreign_tensors: the map names no tensor for parameter '{}' ({} "
                                            "parameters left unassigned)",
                                            params.begin()->first, params.size()));
}

Tensor transposed(const Tensor& m) {
  const std::size_t rows = m.dim(0), cols = m.dim(1);
  Tensor out = Tensor::uninitialized({cols, rows});
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) out.data()[c * rows + r] = m.data()[r * cols + c];
  return out;
}

}  // namespace tapegrad::nn
