// Reductions (sum, mean, max: whole tensor or one axis) and views (reshape, permute, slice,
// cat, split). A Tensor is always contiguous, so a view is a copy forward and a scatter back.
#include <fmt/format.h>

#include <limits>
#include <numeric>
#include <stdexcept>

#include "core/ops.h"

namespace tapegrad {

namespace {

Shape reduced_shape(const Shape& s, std::size_t axis, bool keepdim) {
  Shape out = s;
  if (keepdim)
    out[axis] = 1;
  else
    out.erase(out.begin() + std::ptrdiff_t(axis));
  return out;
}

}  // namespace

// dx += dy everywhere
Var sum(const Var& x) {
  Op op("sum", {x});
  double total = 0;
  for (std::size_t i = 0; i < x.value().size(); ++i) total += x.value()[i];
  return op.finish(Tensor::scalar(float(total)), [x](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x))
      for (std::size_t i = 0; i < x.value().size(); ++i) dx[i] += dy[0];
  });
}

Var mean(const Var& x) {
  if (x.value().size() == 0) throw std::invalid_argument("mean: empty tensor");
  return scale(sum(x), 1.0f / float(x.value().size()));
}

Var max(const Var& x) {
  if (x.value().size() == 0) throw std::invalid_argument("max: empty tensor");
  return max(reshape(x, {x.value().size()}), 0, false);
}

// y[o, i] = sum_k x[o, k, i]; dx[o, k, i] += dy[o, i]
Var sum(const Var& x, int axis, bool keepdim) {
  std::size_t a = axis_index("sum", axis, x.shape());
  // Named variables, not a structured binding: clang 14 cannot capture bindings in lambdas.
  const AxisSplit split = split_at_axis(x.shape(), a);
  const std::size_t outer = split.outer, n = split.n, inner = split.inner;
  Op op("sum", {x});
  Tensor y(reduced_shape(x.shape(), a, keepdim));
  const Tensor& xv = x.value();
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t k = 0; k < n; ++k)
      for (std::size_t i = 0; i < inner; ++i) y[o * inner + i] += xv[(o * n + k) * inner + i];
  return op.finish(std::move(y), [x, outer, n, inner](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x))
      for (std::size_t o = 0; o < outer; ++o)
        for (std::size_t k = 0; k < n; ++k)
          for (std::size_t i = 0; i < inner; ++i) dx[(o * n + k) * inner + i] += dy[o * inner + i];
  });
}

Var mean(const Var& x, int axis, bool keepdim) {
  std::size_t a = axis_index("mean", axis, x.shape());
  if (x.shape()[a] == 0) throw std::invalid_argument(fmt::format("mean: axis {} of x {} is empty", axis, to_string(x.shape())));
  return scale(sum(x, axis, keepdim), 1.0f / float(x.shape()[a]));
}

// y[o, i] = x[o, k*, i] with k* the first maximum; dx[o, k*, i] += dy[o, i]. Saves k* (outer x inner).
Var max(const Var& x, int axis, bool keepdim) {
  std::size_t a = axis_index("max", axis, x.shape());
  // Named variables, not a structured binding: clang 14 cannot capture bindings in lambdas.
  const AxisSplit split = split_at_axis(x.shape(), a);
  const std::size_t outer = split.outer, n = split.n, inner = split.inner;
  if (n == 0) throw std::invalid_argument(fmt::format("max: axis {} of x {} is empty", axis, to_string(x.shape())));
  Op op("max", {x});
  Tensor y = Tensor::uninitialized(reduced_shape(x.shape(), a, keepdim));
  std::vector<std::size_t> argmax(outer * inner, 0);
  const Tensor& xv = x.value();
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t i = 0; i < inner; ++i) {
      std::size_t best = 0;
      for (std::size_t k = 1; k < n; ++k)
        if (xv[(o * n + k) * inner + i] > xv[(o * n + best) * inner + i]) best = k;
      argmax[o * inner + i] = best;
      y[o * inner + i] = xv[(o * n + best) * inner + i];
    }
  std::size_t bytes = argmax.size() * sizeof(std::size_t);
  return op.finish(std::move(y), [x, argmax = std::move(argmax), n, inner](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x))
      for (std::size_t j = 0; j < argmax.size(); ++j) dx[((j / inner) * n + argmax[j]) * inner + j % inner] += dy[j];
  }, bytes);
}

// dx += dy, read under x's shape
Var reshape(const Var& x, Shape shape) {
  if (numel(shape) != x.value().size())
    throw std::invalid_argument(fmt::format("reshape: x {} has {} elements, which do not fill {}", to_string(x.shape()),
                                            x.value().size(), to_string(shape)));
  Op op("reshape", {x});
  return op.finish(x.value().reshaped(std::move(shape)), [x](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x)) kernels::accumulate(dx, dy.data(), dy.size());
  });
}

Var view(const Var& x, std::vector<std::int64_t> shape) {
  Shape out(shape.size());
  std::size_t known = 1, inferred = shape.size();
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && inferred == shape.size()) {
      inferred = i;
      continue;
    }
    if (shape[i] < 0)
      throw std::invalid_argument(fmt::format("view: size {} at position {} is invalid (one -1 at most)", shape[i], i));
    out[i] = std::size_t(shape[i]);
    known *= out[i];
  }
  if (inferred != shape.size()) {
    if (known == 0 || x.value().size() % known != 0)
      throw std::invalid_argument(fmt::format("view: x {} cannot be viewed with {} elements per -1 position",
                                              to_string(x.shape()), known));
    out[inferred] = x.value().size() / known;
  }
  return reshape(x, std::move(out));
}

// y's axis i is x's axis dims[i]: y[idx] = x[idx permuted back]; dx scatters dy the same way.
Var permute(const Var& x, std::vector<int> dims) {
  const Shape& s = x.shape();
  std::size_t rank = s.size();
  std::vector<std::size_t> axes(dims.size());
  std::vector<bool> seen(rank, false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims.size() != rank || dims[i] < -int(rank) || dims[i] >= int(rank) || seen[axes[i] = axis_index("permute", dims[i], s)])
      throw std::invalid_argument(fmt::format("permute: dims [{}] are not a permutation of the axes of x {}",
                                              fmt::join(dims, ", "), to_string(s)));
    seen[axes[i]] = true;
  }
  if (dims.size() != rank)
    throw std::invalid_argument(fmt::format("permute: dims [{}] are not a permutation of the axes of x {}",
                                            fmt::join(dims, ", "), to_string(s)));
  Shape out_shape(rank);
  std::vector<std::size_t> in_strides(rank), strides(rank);  // strides: x's stride of y's axis i
  for (std::size_t i = rank, stride = 1; i-- > 0; stride *= s[i]) in_strides[i] = stride;
  for (std::size_t i = 0; i < rank; ++i) {
    out_shape[i] = s[axes[i]];
    strides[i] = in_strides[axes[i]];
  }
  // For every element of y (row-major), its offset in x: an odometer over y's axes.
  auto offsets = std::make_shared<std::vector<std::size_t>>(numel(out_shape));
  std::vector<std::size_t> index(rank, 0);
  for (std::size_t i = 0, offset = 0; i < offsets->size(); ++i) {
    (*offsets)[i] = offset;
    for (std::size_t axis = rank; axis-- > 0;) {
      offset += strides[axis];
      if (++index[axis] < out_shape[axis]) break;
      offset -= strides[axis] * out_shape[axis];
      index[axis] = 0;
    }
  }
  Op op("permute", {x});
  Tensor y = Tensor::uninitialized(out_shape);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = x.value()[(*offsets)[i]];
  std::size_t bytes = offsets->size() * sizeof(std::size_t);
  return op.finish(std::move(y), [x, offsets](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x))
      for (std::size_t i = 0; i < dy.size(); ++i) dx[(*offsets)[i]] += dy[i];
  }, bytes);
}

Var transpose(const Var& x, int axis0, int axis1) {
  std::size_t a = axis_index("transpose", axis0, x.shape()), b = axis_index("transpose", axis1, x.shape());
  std::vector<int> dims(x.shape().size());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[a], dims[b]);
  return permute(x, dims);
}

// y[o, k, i] = x[o, start + k, i]; dx[o, start + k, i] += dy[o, k, i]
Var slice(const Var& x, int axis, std::size_t start, std::size_t end) {
  std::size_t a = axis_index("slice", axis, x.shape());
  // Named variables, not a structured binding: clang 14 cannot capture bindings in lambdas.
  const AxisSplit split = split_at_axis(x.shape(), a);
  const std::size_t outer = split.outer, n = split.n, inner = split.inner;
  if (start > end || end > n)
    throw std::invalid_argument(fmt::format("slice: [{}, {}) is not within axis {} of x {} (size {})", start, end, axis,
                                            to_string(x.shape()), n));
  Shape out_shape = x.shape();
  out_shape[a] = end - start;
  std::size_t len = (end - start) * inner;
  Op op("slice", {x});
  Tensor y = Tensor::uninitialized(out_shape);
  for (std::size_t o = 0; o < outer; ++o)
    std::copy_n(x.value().data() + (o * n + start) * inner, len, y.data() + o * len);
  return op.finish(std::move(y), [x, outer, n, inner, start, len](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x))
      for (std::size_t o = 0; o < outer; ++o) kernels::accumulate(dx + (o * n + start) * inner, dy.data() + o * len, len);
  });
}

// y = [x0 x1 ..] along axis; dx_j += its block of dy
Var cat(const std::vector<Var>& xs, int axis) {
  if (xs.empty()) throw std::invalid_argument("cat: no tensors given");
  const Shape& first = xs[0].shape();
  std::size_t a = axis_index("cat", axis, first);
  std::size_t total = 0;
  std::vector<std::size_t> sizes;
  for (std::size_t j = 0; j < xs.size(); ++j) {
    Shape s = xs[j].shape(), f = first;
    bool ok = s.size() == f.size();
    if (ok) {
      s[a] = f[a] = 0;
      ok = s == f;
    }
    if (!ok)
      throw std::invalid_argument(fmt::format("cat: tensor {} has shape {}, which does not match tensor 0's {} except "
                                              "along axis {}",
                                              j, to_string(xs[j].shape()), to_string(first), axis));
    sizes.push_back(xs[j].shape()[a]);
    total += sizes.back();
  }
  Shape out_shape = first;
  out_shape[a] = total;
  std::size_t outer = split_at_axis(first, a).outer, inner = split_at_axis(first, a).inner;
  Op op("cat", xs);
  Tensor y = Tensor::uninitialized(out_shape);
  for (std::size_t o = 0, at = 0; o < outer; ++o)
    for (std::size_t j = 0; j < xs.size(); ++j) {
      std::size_t len = sizes[j] * inner;
      std::copy_n(xs[j].value().data() + o * len, len, y.data() + at);
      at += len;
    }
  return op.finish(std::move(y), [xs, sizes, outer, inner, total](const Tensor& dy, const Tensor&) {
    for (std::size_t o = 0; o < outer; ++o) {
      std::size_t at = o * total * inner;
      for (std::size_t j = 0; j < xs.size(); ++j) {
        std::size_t len = sizes[j] * inner;
        if (float* dx = grad_ptr(xs[j])) kernels::accumulate(dx + o * len, dy.data() + at, len);
        at += len;
      }
    }
  });
}

Var concat(const std::vector<Var>& xs, int axis) { return cat(xs, axis); }

std::vector<Var> split(const Var& x, const std::vector<std::size_t>& sizes, int axis) {
  std::size_t a = axis_index("split", axis, x.shape());
  std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t(0));
  if (total != x.shape()[a])
    throw std::invalid_argument(fmt::format("split: sizes [{}] add up to {}, but axis {} of x {} has size {}",
                                            fmt::join(sizes, ", "), total, axis, to_string(x.shape()), x.shape()[a]));
  std::vector<Var> out;
  for (std::size_t j = 0, start = 0; j < sizes.size(); start += sizes[j++]) out.push_back(slice(x, axis, start, start + sizes[j]));
  return out;
}

std::vector<Var> split(const Var& x, std::size_t split_size, int axis) {
  std::size_t a = axis_index("split", axis, x.shape());
  if (split_size == 0) throw std::invalid_argument(fmt::format("split: split_size 0 for x {}", to_string(x.shape())));
  std::vector<std::size_t> sizes;
  for (std::size_t left = x.shape()[a]; left > 0; left -= std::min(left, split_size)) sizes.push_back(std::min(left, split_size));
  return split(x, sizes, axis);
}

}  // namespace tapegrad
