// GGUF files (llama.cpp's format, versions 2 and 3): a memory-mapped reader that parses and
// validates the whole header (metadata, tensor infos, alignment, overlaps) before any tensor is
// touched; tensor bytes stay in the mapping until dequantized. Generic: no model names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/quant/block_format.h"
#include "core/tensor.h"
#include "io/gguf_value.h"

namespace tapegrad::io {

/// One tensor: its shape in PyTorch order (ggml's ne reversed, outermost first) and its bytes, a
/// span into the file's mapping (valid while a GgufFile of that file lives).
struct GgufTensor {
  std::string name;
  quant::TensorType type;
  std::vector<std::size_t> shape;
  std::span<const std::byte> data;
};

/// A GGUF file, mapped read-only. Copies share the mapping. The file must not shrink while it is
/// mapped (reading a page past its new end would raise SIGBUS, as for any mapped file).
class GgufFile {
 public:
  /// Maps and validates the file; every problem throws std::runtime_error
  /// "<path>: <field>: <problem>" (big-endian files are refused, saying so).
  static GgufFile open(const std::string& path);

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  /// general.alignment, or GGUF's default 32.
  std::size_t alignment() const { return alignment_; }

  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  /// The value of `key`, or null.
  const GgufValue* find(const std::string& key) const;
  /// The value of `key`; throws "<path>: metadata key '<key>' is missing".
  const GgufValue& at(const std::string& key) const;

  /// The tensors in the file's order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  /// The tensor called `name`, or null.
  const GgufTensor* find_tensor(const std::string& name) const;
  /// The tensor as float32 of its shape, dequantized as gguf.quants.dequantize does.
  Tensor dequantize(const GgufTensor& tensor) const;
  /// Lets the system drop the pages that hold only this tensor's bytes (a caller that has copied
  /// them: the process then holds the copy, not both); reading them again reads the file again.
  void release(const GgufTensor& tensor) const;

 private:
  GgufFile() = default;

  std::string path_;
  std::shared_ptr<const void> mapping_;  // unmaps when the last copy goes
  std::uint32_t version_ = 0;
  std::size_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, std::size_t> tensor_index_;
};

/// Limits on what the reader accepts from a header (llama.cpp's are the model).
inline constexpr std::size_t kGgufMaxDims = 4;
inline constexpr std::size_t kGgufMaxTensorNameBytes = 64;
inline constexpr std::size_t kGgufMaxArrayDepth = 8;

}  // namespace tapegrad::io
