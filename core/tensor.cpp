// Tensor storage, shape checks and formatting.
#include "core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include "core/aligned.h"
#include "core/parallel.h"

namespace tapegrad {

std::string to_string(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::size_t numel(const Shape& shape) {
  std::size_t n = 1;
  for (std::size_t d : shape) n *= d;
  return n;
}

namespace {

// A training step frees and re-allocates the same activation sizes every step. glibc serves
// large blocks with fresh mmaps and unmaps them on free, so each step paid page faults on
// megabytes of zeroed pages (measured: 15-20% of a small model's step). Freed blocks of at
// least min_cached_bytes are kept here by exact size and handed out again, as PyTorch's caching
// allocator does. The total kept is capped at the larger of 1 GiB and the most large-block bytes
// ever live at once: a step's activations, whatever the model, come back whole (SmolLM2's
// B4xT256 step frees 1.1 GiB: a flat 1 GiB cap refaulted 83,000 pages a step), while an unusual
// size pattern can hoard at most one peak's worth.
class StorageCache {
 public:
  static constexpr std::size_t alignment = CacheLineAllocator<float>::alignment, min_cached_bytes = 1 << 16,
                               min_cap_bytes = std::size_t(1) << 30;

  static std::size_t rounded(std::size_t count) {
    return (count * sizeof(float) + alignment - 1) / alignment * alignment;
  }

  float* allocate(std::size_t bytes) {
    if (bytes >= min_cached_bytes) {
      std::lock_guard lock(mutex_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= bytes;
        count_live(bytes);
        return static_cast<float*>(p);
      }
    }
    void* p = std::aligned_alloc(alignment, bytes);
    if (!p) throw std::bad_alloc();
    if (bytes >= min_cached_bytes) {
      std::lock_guard lock(mutex_);
      count_live(bytes);
    }
    return static_cast<float*>(p);
  }

  void release(void* p, std::size_t bytes) {
    if (bytes >= min_cached_bytes) {
      std::lock_guard lock(mutex_);
      live_bytes_ -= bytes;
      if (cached_bytes_ + bytes <= std::max(min_cap_bytes, peak_live_bytes_)) {
        free_[bytes].push_back(p);
        cached_bytes_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  std::size_t cached_bytes() {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }

  void trim() {
    std::lock_guard lock(mutex_);
    for (auto& [bytes, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    cached_bytes_ = 0;
  }

 private:
  void count_live(std::size_t bytes) {  // under mutex_
    live_bytes_ += bytes;
    peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  }

  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_bytes_ = 0;
  std::size_t live_bytes_ = 0, peak_live_bytes_ = 0;  // large blocks handed out and not released
};

StorageCache& storage_cache() {
  static StorageCache* cache = new StorageCache;  // never destroyed: tensors may outlive static destructors
  return *cache;
}

}  // namespace

std::size_t cached_storage_bytes() { return storage_cache().cached_bytes(); }
void release_cached_storage() { storage_cache().trim(); }

void StorageDeleter::operator()(float* p) const { storage_cache().release(p, bytes); }

static thread_local TensorAllocationLimit* active_limit = nullptr;

TensorAllocationLimit::TensorAllocationLimit(std::size_t bytes, std::string what) : limit_(bytes), what_(std::move(what)) {
  if (active_limit) throw std::logic_error("TensorAllocationLimit: a limit is already active on this thread");
  active_limit = this;
}
TensorAllocationLimit::~TensorAllocationLimit() { active_limit = nullptr; }

void TensorAllocationLimit::charge(std::size_t bytes) {
  TensorAllocationLimit* limit = active_limit;
  if (!limit) return;
  if (bytes > limit->limit_ - limit->used_)
    throw std::length_error(fmt::format("{}: tensors of {} bytes and {} more would pass the limit of {} bytes",
                                        limit->what_, limit->used_, bytes, limit->limit_));
  limit->used_ += bytes;
}

std::unique_ptr<float[], StorageDeleter> cached_storage(std::size_t count) {
  if (count == 0) return {nullptr, StorageDeleter{0}};
  if (count > (std::size_t(-1) - 64) / sizeof(float))
    throw std::length_error(fmt::format("tensor storage of {} floats: more floats than the address space holds", count));
  std::size_t bytes = StorageCache::rounded(count);
  TensorAllocationLimit::charge(bytes);
  return {storage_cache().allocate(bytes), StorageDeleter{bytes}};
}

Tensor Tensor::uninitialized(Shape shape) {
  Tensor t;
  t.size_ = numel(shape);
  t.shape_ = std::move(shape);
  t.data_ = cached_storage(t.size_);
  return t;
}

Tensor::Tensor(Shape shape) : Tensor(std::move(shape), 0.0f) {}

Tensor::Tensor(Shape shape, float fill) : Tensor(uninitialized(std::move(shape))) { this->fill(fill); }

Tensor::Tensor(Shape shape, const std::vector<float>& values) : Tensor(uninitialized(std::move(shape))) {
  if (values.size() != size_)
    throw std::invalid_argument(fmt::format("Tensor: shape {} holds {} values, got {}",
                                            to_string(shape_), size_, values.size()));
  std::copy(values.begin(), values.end(), data());
}

Tensor::Tensor(const Tensor& other) : shape_(other.shape_), size_(other.size_), data_(cached_storage(other.size_)) {
  if (size_) std::memcpy(data(), other.data(), bytes());
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = Tensor(other);
  return *this;
}

std::size_t Tensor::dim(std::size_t axis) const {
  if (axis >= shape_.size())
    throw std::out_of_range(fmt::format("Tensor::dim: axis {} of a tensor of shape {}", axis, to_string(shape_)));
  return shape_[axis];
}

std::size_t Tensor::offset_of(std::initializer_list<std::size_t> index) const {
  if (index.size() != shape_.size())
    throw std::out_of_range(fmt::format("Tensor::at: {} indices for a tensor of shape {}", index.size(),
                                        to_string(shape_)));
  std::size_t offset = 0, axis = 0;
  for (std::size_t i : index) {
    if (i >= shape_[axis])
      throw std::out_of_range(fmt::format("Tensor::at: index {} on axis {} of a tensor of shape {}", i, axis,
                                          to_string(shape_)));
    offset = offset * shape_[axis++] + i;
  }
  return offset;
}

float& Tensor::at(std::initializer_list<std::size_t> index) { return data_[offset_of(index)]; }
float Tensor::at(std::initializer_list<std::size_t> index) const { return data_[offset_of(index)]; }

float Tensor::item() const {
  if (size_ != 1)
    throw std::invalid_argument(fmt::format("Tensor::item: tensor of shape {} has {} elements, not 1",
                                            to_string(shape_), size_));
  return data_[0];
}

// Large fills (gradient buffers start as zeros) run on the kernel threads: serial, they leave the
// other threads waiting between ops.
void Tensor::fill(float value) {
  constexpr std::size_t block = 1 << 15;
  detail::parallel_for((size_ + block - 1) / block, block, [&](std::size_t b) {
    std::fill_n(data() + b * block, std::min(block, size_ - b * block), value);
  });
}

Tensor Tensor::reshaped(Shape shape) const& { return Tensor(*this).reshaped(std::move(shape)); }

Tensor Tensor::reshaped(Shape shape) && {
  if (numel(shape) != size_)
    throw std::invalid_argument(fmt::format("reshape: cannot view a tensor of shape {} as {}", to_string(shape_),
                                            to_string(shape)));
  shape_ = std::move(shape);
  return std::move(*this);
}

void expect_shape(const char* op, const char* what, const Shape& actual, const Shape& expected) {
  if (actual != expected)
    throw std::invalid_argument(
        fmt::format("{}: expected {} to be {}, got {}", op, what, to_string(expected), to_string(actual)));
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  expect_shape("max_abs_diff", "b", b.shape(), a.shape());
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace tapegrad
