// Tensor: float32, contiguous, row-major storage with a checked shape. The storage is 64-byte
// aligned so that kernels can use full SIMD loads; xtensor views of it live in xtensor_interop.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace tapegrad {

using Shape = std::vector<std::size_t>;

/// "[4, 3]": the form every shape error uses.
std::string to_string(const Shape& shape);
/// Product of the dimensions (1 for a scalar shape []).
std::size_t numel(const Shape& shape);

/// Deleter of tensor storage: returns it to the storage cache (see tensor.cpp).
struct StorageDeleter {
  std::size_t bytes = 0;
  void operator()(float* p) const;
};

class Tensor {
 public:

  Tensor() = default;
  /// Zero-filled tensor of the given shape.
  explicit Tensor(Shape shape);
  Tensor(Shape shape, float fill);
  Tensor(Shape shape, const std::vector<float>& values);  // values.size() must equal numel(shape)

  /// Storage of the given shape whose contents are unspecified (every kernel output that writes
  /// all of its elements starts from this, skipping a memset).
  static Tensor uninitialized(Shape shape);
  static Tensor scalar(float value) { return Tensor(Shape{}, value); }

  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  const Shape& shape() const { return shape_; }
  std::size_t rank() const { return shape_.size(); }
  std::size_t dim(std::size_t axis) const;  // checked
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(float); }
  bool empty() const { return size_ == 0 && shape_.empty() && !data_; }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  float& operator[](std::size_t i) { return data_[i]; }
  float operator[](std::size_t i) const { return data_[i]; }
  /// Checked multi-index access, for tests and setup code (not for kernels).
  float& at(std::initializer_list<std::size_t> index);
  float at(std::initializer_list<std::size_t> index) const;
  float item() const;  // the value of a one-element tensor

  void fill(float value);
  /// The same data under another shape with the same number of elements.
  Tensor reshaped(Shape shape) const&;
  Tensor reshaped(Shape shape) &&;

 private:
  std::size_t offset_of(std::initializer_list<std::size_t> index) const;

  Shape shape_;
  std::size_t size_ = 0;
  std::unique_ptr<float[], StorageDeleter> data_;
};

/// Bytes of freed tensor storage kept for reuse, and a way to hand it back to the system.
std::size_t cached_storage_bytes();
void release_cached_storage();

/// Throws std::invalid_argument "<op>: expected <what> to be [..], got [..]" when shapes differ.
void expect_shape(const char* op, const char* what, const Shape& actual, const Shape& expected);
/// Max |a - b| over two tensors of the same shape.
float max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace tapegrad
