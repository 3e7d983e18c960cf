// Views of a Tensor as an xtensor expression, and Tensors built from xtensor arrays. Include it
// only where xtensor is wanted: it brings in tens of thousands of header lines.
#pragma once

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>

#include "core/tensor.h"

namespace tapegrad {

/// A non-owning xtensor view of t's storage with t's shape (writes go to t).
inline auto as_xtensor(Tensor& t) { return xt::adapt(t.data(), t.size(), xt::no_ownership(), t.shape()); }
/// A read-only xtensor view of t's storage with t's shape.
inline auto as_xtensor(const Tensor& t) { return xt::adapt(t.data(), t.size(), xt::no_ownership(), t.shape()); }

/// A flat (n,) view of raw storage, for kernels.
template <class T>
auto flat_view(T* data, std::size_t n) {
  return xt::adapt(data, n, xt::no_ownership(), std::array<std::size_t, 1>{n});
}

/// A Tensor holding a copy of an evaluated xtensor expression, converted to float.
template <class E>
Tensor from_xtensor(const xt::xexpression<E>& expression) {
  xt::xarray<float> values = expression.derived_cast();
  Tensor t = Tensor::uninitialized(Shape(values.shape().begin(), values.shape().end()));
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

}  // namespace tapegrad
