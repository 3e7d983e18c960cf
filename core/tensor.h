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

/// Sizes of the axes, outermost first ([] for a scalar).
using Shape = std::vector<std::size_t>;

/// "[4, 3]": the form every shape error uses.
std::string to_string(const Shape& shape);
/// Product of the dimensions (1 for a scalar shape []).
std::size_t numel(const Shape& shape);

/// Deleter of tensor storage: returns it to the storage cache (see tensor.cpp).
struct StorageDeleter {
  std::size_t bytes = 0;              ///< the size of the storage it frees
  void operator()(float* p) const;  ///< Returns p's storage to the cache.
};

/// A float32 array, contiguous and row-major, that owns its storage (copies copy it).
class Tensor {
 public:
  /// An empty tensor: no shape, no storage.
  Tensor() = default;
  /// Zero-filled tensor of the given shape.
  explicit Tensor(Shape shape);
  /// A tensor of the given shape with every element fill.
  Tensor(Shape shape, float fill);
  /// A tensor of the given shape holding values (values.size() must equal numel(shape)).
  Tensor(Shape shape, const std::vector<float>& values);

  /// Storage of the given shape whose contents are unspecified (every kernel output that writes
  /// all of its elements starts from this, skipping a memset).
  static Tensor uninitialized(Shape shape);
  /// A tensor of shape [] holding value.
  static Tensor scalar(float value) { return Tensor(Shape{}, value); }

  Tensor(const Tensor& other);             ///< A deep copy.
  Tensor& operator=(const Tensor& other);  ///< A deep copy.
  Tensor(Tensor&&) noexcept = default;             ///< Takes other's storage.
  Tensor& operator=(Tensor&&) noexcept = default;  ///< Takes other's storage.

  const Shape& shape() const { return shape_; }                      ///< The sizes of the axes.
  std::size_t rank() const { return shape_.size(); }                 ///< The number of axes.
  std::size_t dim(std::size_t axis) const;                           ///< The size of one axis (checked).
  std::size_t size() const { return size_; }                         ///< The number of elements.
  std::size_t bytes() const { return size_ * sizeof(float); }        ///< The storage's size in bytes.
  bool empty() const { return size_ == 0 && shape_.empty() && !data_; }  ///< True for Tensor().

  float* data() { return data_.get(); }                      ///< The elements, row-major.
  const float* data() const { return data_.get(); }          ///< The elements, row-major.
  float& operator[](std::size_t i) { return data_[i]; }      ///< Element i in storage order (unchecked).
  float operator[](std::size_t i) const { return data_[i]; }  ///< Element i in storage order (unchecked).
  /// Checked multi-index access, for tests and setup code (not for kernels).
  float& at(std::initializer_list<std::size_t> index);
  /// Checked multi-index access (read-only).
  float at(std::initializer_list<std::size_t> index) const;
  /// The value of a one-element tensor (throws for any other).
  float item() const;

  /// Sets every element to value.
  void fill(float value);
  /// The same data under another shape with the same number of elements.
  Tensor reshaped(Shape shape) const&;
  /// The same, moving the storage out of a temporary.
  Tensor reshaped(Shape shape) &&;

 private:
  std::size_t offset_of(std::initializer_list<std::size_t> index) const;

  Shape shape_;
  std::size_t size_ = 0;
  std::unique_ptr<float[], StorageDeleter> data_;
};

/// Within its lifetime, the tensors this thread allocates may take at most `bytes` in all; the one
/// that would pass it throws std::length_error with `what` and the sizes. For objects built from
/// sizes nobody vouches for: a model whose sizes come from a forged checkpoint is refused before
/// it allocates more than its file holds. Limits do not nest.
class TensorAllocationLimit {
 public:
  /// Starts the limit of `bytes` on this thread; `what` opens the message of a refusal.
  TensorAllocationLimit(std::size_t bytes, std::string what);
  ~TensorAllocationLimit();  ///< Ends the limit.
  TensorAllocationLimit(const TensorAllocationLimit&) = delete;
  TensorAllocationLimit& operator=(const TensorAllocationLimit&) = delete;
  /// Counts `bytes` more, or throws if they pass the limit of this thread's active limit (if any).
  static void charge(std::size_t bytes);

 private:
  std::size_t limit_, used_ = 0;
  std::string what_;
};

/// Uninitialized storage for `count` floats, on a cache line, from the cache tensors' storage
/// comes from and goes back to: for a kernel's large scratch that every training step asks for
/// again (fresh, it costs a page fault every 4 KB). Counted by an active TensorAllocationLimit.
std::unique_ptr<float[], StorageDeleter> cached_storage(std::size_t count);
/// Bytes of freed tensor storage kept for reuse.
std::size_t cached_storage_bytes();
/// Hands the cached storage back to the system.
void release_cached_storage();

/// Throws std::invalid_argument "<op>: expected <what> to be [..], got [..]" when shapes differ.
void expect_shape(const char* op, const char* what, const Shape& actual, const Shape& expected);
/// Max |a - b| over two tensors of the same shape.
float max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace tapegrad
