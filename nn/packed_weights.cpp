// pack_matrices: walks a model's layers by name and swaps their float32 matrices for packed ones.
#include "nn/packed_weights.h"

#include <map>
#include <string>
#include <vector>

#include "nn/embedding.h"
#include "nn/linear.h"

namespace tapegrad::nn {

namespace {

// Every module under `root`, by dotted name ("blocks.3.attn.wq").
class ModulesByName : public Members {
 public:
  std::map<std::string, Module*> modules;
  void operator()(std::string_view, Var&) override {}
  void operator()(std::string_view name, Module& child) override {
    const std::string full = prefix_.empty() ? std::string(name) : prefix_ + "." + std::string(name);
    modules[full] = &child;
    const std::string outer = prefix_;
    prefix_ = full;
    child.members(*this);
    prefix_ = outer;
  }

 private:
  std::string prefix_;
};

std::map<std::string, Module*> modules_of(Module& model) {
  ModulesByName walk;
  model.members(walk);
  return walk.modules;
}

// w (rows, cols), or w^T when `transpose` (a Linear's (in, out) weight gives its (out, in) rows),
// as `type`; none when the rows are not whole blocks.
std::optional<quant::PackedMatrix> converted(const Tensor& w, bool transpose, quant::TensorType type) {
  const std::size_t rows = w.dim(transpose ? 1 : 0), cols = w.dim(transpose ? 0 : 1);
  if (cols % quant::block_format(type).block_elems != 0) return std::nullopt;
  return transpose ? quant::pack_transposed(w.data(), rows, cols, type) : quant::pack_matrix(w.data(), rows, cols, type);
}

}  // namespace

std::size_t pack_matrices(Module& model, std::span<const ForeignTensor> map, const FileMatrix& file_matrix,
                          std::optional<quant::TensorType> convert_to) {
  const std::map<std::string, Module*> modules = modules_of(model);
  std::size_t packed = 0;
  for (const ForeignTensor& entry : map) {
    if (!entry.split.empty() || !entry.param.ends_with(".weight")) continue;
    auto found = modules.find(entry.param.substr(0, entry.param.size() - 7));
    if (found == modules.end()) continue;
    if (auto* linear = dynamic_cast<Linear*>(found->second); linear && !linear->adapter && linear->weight.defined()) {
      std::optional<quant::PackedMatrix> matrix;
      if (convert_to) matrix = converted(linear->weight.value(), true, *convert_to);
      else matrix = file_matrix(entry, linear->out(), linear->in());
      if (!matrix) continue;
      linear->packed = std::make_shared<const quant::PackedMatrix>(std::move(*matrix));
      linear->weight = Var();  // frees the float32 copy
      ++packed;
    } else if (auto* table = dynamic_cast<Embedding*>(found->second); table && table->weight.defined()) {
      const Tensor& w = table->weight.value();
      // 4-bit formats keep the token embedding in Q8_0, as llama.cpp's quantize does.
      const bool four_bits = convert_to == quant::TensorType::Q4_0 || convert_to == quant::TensorType::Q4_1;
      std::optional<quant::PackedMatrix> matrix =
          convert_to ? converted(w, false, four_bits ? quant::TensorType::Q8_0 : *convert_to)
                     : file_matrix(entry, w.dim(0), w.dim(1));
      if (!matrix) continue;
      table->packed = std::make_shared<const quant::PackedMatrix>(std::move(*matrix));
      table->weight = Var();
      ++packed;
    }
  }
  return packed;
}

std::map<std::string, std::size_t> packed_bytes(Module& model) {
  std::map<std::string, std::size_t> bytes;
  for (const auto& [name, module] : modules_of(model)) {
    if (auto* linear = dynamic_cast<Linear*>(module); linear && linear->packed) bytes[name] = linear->packed->bytes.size();
    if (auto* table = dynamic_cast<Embedding*>(module); table && table->packed) bytes[name] = table->packed->bytes.size();
  }
  return bytes;
}

bool has_packed_matrices(Module& model) {
  for (const auto& [name, module] : modules_of(model)) {
    if (auto* linear = dynamic_cast<Linear*>(module); linear && linear->packed) return true;
    if (auto* table = dynamic_cast<Embedding*>(module); table && table->packed) return true;
  }
  return false;
}

}  // namespace tapegrad::nn
