// Gradient buckets and the replica check.
#include "distributed/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace tapegrad::distributed {

namespace {
double seconds_since(std::chrono::steady_clock::time_point started) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}
}  // namespace

GradientBuckets::GradientBuckets(ParameterList params, std::size_t bucket_floats)
    : params_(std::move(params)),
      bucket_of_(params_.size()),
      offset_of_(params_.size()),
      pending_(params_.size(), false) {
  for (const NamedParameter& p : params_) {
    if (!p.var.requires_grad())
      throw std::invalid_argument(fmt::format("GradientBuckets: parameter '{}' is frozen (requires_grad false) and has "
                                              "no gradient to exchange; pass trainable(params)",
                                              p.name));
    vars_.push_back(p.var);
  }
  std::size_t floats = 0;
  for (std::size_t i = params_.size(); i-- > 0;) {
    if (buckets_.empty() || floats >= bucket_floats) buckets_.push_back({i + 1, i + 1, {}, 0, nullptr}), floats = 0;
    buckets_.back().first = i;
    floats += params_[i].var.value().size();
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    for (std::size_t i = bucket.first; i < bucket.last; ++i) {
      bucket_of_[i] = b;
      offset_of_[i] = bucket.values.size();
      bucket.values.resize(bucket.values.size() + params_[i].var.value().size());
    }
  }
}

std::size_t GradientBuckets::floats() const {
  std::size_t n = 0;
  for (const Bucket& b : buckets_) n += b.values.size();
  return n;
}

void GradientBuckets::add_gradient(std::size_t parameter) {
  const Var& var = params_[parameter].var;
  float* at = buckets_[bucket_of_[parameter]].values.data() + offset_of_[parameter];
  const std::size_t n = var.value().size();
  if (!var.has_grad()) {
    if (empty_) std::fill_n(at, n, 0.0f);
  } else if (empty_) {
    std::copy_n(var.grad().data(), n, at);
  } else {
    const float* g = var.grad().data();
    for (std::size_t k = 0; k < n; ++k) at[k] += g[k];
  }
}

void GradientBuckets::accumulate() {
  if (comm_) throw std::logic_error("GradientBuckets::accumulate: an overlapped exchange is under way; reduce() first");
  for (std::size_t i = 0; i < params_.size(); ++i) add_gradient(i);
  empty_ = false;
}

BackwardObserver& GradientBuckets::exchange_during_backward(Communicator& comm) {
  if (comm_) throw std::logic_error("GradientBuckets::exchange_during_backward: the last exchange was not reduced");
  comm_ = &comm;
  next_start_ = next_done_ = 0;
  std::fill(pending_.begin(), pending_.end(), true);
  for (Bucket& b : buckets_) b.waiting = b.last - b.first;
  return *this;
}

void GradientBuckets::gradient_final(std::size_t index) {
  if (!comm_ || !pending_[index]) return;
  pending_[index] = false;
  add_gradient(index);
  if (--buckets_[bucket_of_[index]].waiting == 0) start_ready_buckets();
}

void GradientBuckets::start_ready_buckets() {
  const auto started = std::chrono::steady_clock::now();
  for (; next_start_ < buckets_.size() && buckets_[next_start_].waiting == 0; ++next_start_)
    buckets_[next_start_].sum = comm_->start_ordered_sum(buckets_[next_start_].values);
  comm_seconds_ += seconds_since(started);
}

void GradientBuckets::entry_done() {
  if (next_done_ == next_start_) return;
  const auto started = std::chrono::steady_clock::now();
  // The earliest unfinished sum first, stopping at one not done: sums must advance in the order
  // they started (each rank starts their second steps in that order).
  while (next_done_ < next_start_ && buckets_[next_done_].sum->test()) buckets_[next_done_++].sum.reset();
  comm_seconds_ += seconds_since(started);
}

double GradientBuckets::reduce(Communicator& comm, std::size_t parts) {
  if (comm_) {
    if (comm_ != &comm) throw std::logic_error("GradientBuckets::reduce: not the communicator of the exchange");
    for (std::size_t i = 0; i < params_.size(); ++i)  // what a backward that did not run (fully) left
      if (pending_[i]) gradient_final(i);
  } else {
    if (empty_) throw std::logic_error("GradientBuckets::reduce: accumulate() the gradients first");
    comm_ = &comm;
    next_start_ = next_done_ = 0;
    for (Bucket& b : buckets_) b.waiting = 0;
    start_ready_buckets();
  }
  const auto started = std::chrono::steady_clock::now();
  for (; next_done_ < buckets_.size(); ++next_done_)
    if (auto& sum = buckets_[next_done_].sum) sum->wait(), sum.reset();
  const double seconds = comm_seconds_ + seconds_since(started);
  const float divisor = float(parts);
  for (const Bucket& b : buckets_) {
    const float* at = b.values.data();
    for (std::size_t i = b.first; i < b.last; ++i) {
      Tensor& grad = params_[i].var.grad_buffer();
      float* g = grad.data();
      for (std::size_t k = 0; k < grad.size(); ++k) g[k] = parts > 1 ? at[k] / divisor : at[k];
      at += grad.size();
    }
  }
  comm_ = nullptr;
  comm_seconds_ = 0;
  empty_ = true;
  return seconds;
}

optim::FlatRange optimizer_shard(std::size_t total, int rank, int ranks) {
  const std::size_t size = (total + std::size_t(ranks) - 1) / std::size_t(ranks);
  return {std::min(total, std::size_t(rank) * size), std::min(total, std::size_t(rank + 1) * size)};
}

namespace {
// Every rank's shard of a flat array of total floats (mine: this rank's shard, at most
// ceil(total / ranks) floats), put together in rank order.
std::vector<float> allgather_shards(Communicator& comm, std::span<const float> mine, std::size_t total) {
  const std::size_t size = optimizer_shard(total, 0, comm.size()).size();
  std::vector<float> padded(size, 0.0f);
  std::copy(mine.begin(), mine.end(), padded.begin());
  const std::vector<std::byte> all = comm.allgather(std::as_bytes(std::span(padded)));
  std::vector<float> out(total);
  std::memcpy(out.data(), all.data(), total * sizeof(float));  // the shards are contiguous, the padding last
  return out;
}
}  // namespace

void allgather_parameters(Communicator& comm, ParameterList& params) {
  const std::size_t total = optim::flat_size(params);
  const optim::FlatRange mine = optimizer_shard(total, comm.rank(), comm.size());
  std::vector<float> shard(mine.size());
  for (const optim::ParameterPiece& piece : optim::pieces_in(params, mine))
    std::copy_n(params[piece.parameter].var.value().data() + piece.begin, piece.count,
                shard.data() + (piece.flat - mine.begin));
  const std::vector<float> all = allgather_shards(comm, shard, total);
  for (const optim::ParameterPiece& piece : optim::pieces_in(params, {0, total}))
    std::copy_n(all.data() + piece.flat, piece.count, params[piece.parameter].var.mutable_value().data());
}

optim::OptimizerState gathered_state(Communicator& comm, const optim::Optimizer& optimizer) {
  const std::size_t total = optim::flat_size(optimizer.params());
  const optim::FlatRange held = optimizer.held(), shard = optimizer_shard(total, comm.rank(), comm.size());
  if (held.begin != shard.begin || held.end != shard.end)
    throw std::logic_error(fmt::format("gathered_state: rank {} keeps elements [{}, {}), not its shard [{}, {}) of {}",
                                       comm.rank(), held.begin, held.end, shard.begin, shard.end, total));
  return optimizer.state([&](std::span<const float> held) { return allgather_shards(comm, held, total); });
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
