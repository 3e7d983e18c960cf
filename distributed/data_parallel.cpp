// Gradient buckets and the replica check.
#include "distributed/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace tapegrad::distributed {

GradientBuckets::GradientBuckets(ParameterList params, std::size_t bucket_floats) : params_(std::move(params)) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (buckets_.empty() || buckets_.back().values.size() >= bucket_floats) buckets_.push_back({i, i, {}});
    Bucket& b = buckets_.back();
    b.last = i + 1;
    b.values.resize(b.values.size() + params_[i].var.value().size());
  }
}

std::size_t GradientBuckets::floats() const {
  std::size_t n = 0;
  for (const Bucket& b : buckets_) n += b.values.size();
  return n;
}

void GradientBuckets::accumulate() {
  for (Bucket& b : buckets_) {
    float* at = b.values.data();
    for (std::size_t i = b.first; i < b.last; ++i) {
      const Var& var = params_[i].var;
      const std::size_t n = var.value().size();
      if (!var.has_grad()) {
        if (empty_) std::fill_n(at, n, 0.0f);
      } else if (empty_) {
        std::copy_n(var.grad().data(), n, at);
      } else {
        const float* g = var.grad().data();
        for (std::size_t k = 0; k < n; ++k) at[k] += g[k];
      }
      at += n;
    }
  }
  empty_ = false;
}

double GradientBuckets::reduce(Communicator& comm, std::size_t parts) {
  if (empty_) throw std::logic_error("GradientBuckets::reduce: accumulate() the gradients first");
  double seconds = 0;
  const float divisor = float(parts);
  for (Bucket& b : buckets_) {
    const auto started = std::chrono::steady_clock::now();
    comm.ordered_sum(b.values);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const float* at = b.values.data();
    for (std::size_t i = b.first; i < b.last; ++i) {
      Tensor& grad = params_[i].var.grad_buffer();
      float* g = grad.data();
      for (std::size_t k = 0; k < grad.size(); ++k) g[k] = parts > 1 ? at[k] / divisor : at[k];
      at += grad.size();
    }
  }
  empty_ = true;
  return seconds;
}

std::uint64_t parameters_hash(const ParameterList& params) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const NamedParameter& p : params) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(p.var.value().data());
    for (std::size_t i = 0; i < p.var.value().size() * sizeof(float); ++i) {
      h ^= bytes[i];
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}

void check_same_parameters(Communicator& comm, const ParameterList& params, const std::string& when) {
  const std::vector<std::uint64_t> hashes = allgather_value(comm, parameters_hash(params));
  for (std::size_t r = 1; r < hashes.size(); ++r)
    if (hashes[r] != hashes[0])
      throw std::runtime_error(fmt::format(
          "{}: the parameters of rank {} (hash {:016x}) differ from those of rank 0 ({:016x}); the replicas "
          "diverged, which a correct run never does (a faulty machine or a bug): nothing was saved",
          when, r, hashes[r], hashes[0]));
}

}  // namespace tapegrad::distributed
