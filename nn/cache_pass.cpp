// CachePass: the ops of a model description as kernel calls on rows, and the threads that run it.
#include "nn/cache_pass.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <utility>

namespace tapegrad::nn {

// Runs body(t, threads) for each t in [0, threads) on as many kernel threads (each t once, should
// OpenMP give fewer), then rethrows the first exception a body threw: none may leave the region.
template <class Body>
static void on_threads(std::size_t threads, Body&& body) {
  std::exception_ptr failure;
#pragma omp parallel num_threads(int(threads))
  {
    try {
      for (std::size_t t = std::size_t(omp_get_thread_num()); t < threads; t += std::size_t(omp_get_num_threads()))
        body(t, threads);
    } catch (...) {
#pragma omp critical(tapegrad_cache_pass_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

CachePass::CachePass(KVCache& cache, std::span<const Run> runs, KVCache::Scratch& scratch, PrefillLogits logits,
                     float* logits_out, std::size_t vocab)
    : cache_(cache), runs_(runs), scratch_(scratch), logits_(logits), logits_out_(logits_out), vocab_(vocab) {
  for (const Run& run : runs_) rows_ += run.count;
  scratch_.rewind();
}

Rows CachePass::take(std::size_t cols) { return take(rows_, cols); }

// Every op but linear and rope takes its output here before it reads an input, so that none can
// read the rows of a deferred product before they are computed.
Rows CachePass::take(std::size_t rows, std::size_t cols) {
  run_deferred();
  return take_deferrable(rows, cols);
}

Rows CachePass::take_deferrable(std::size_t rows, std::size_t cols) { return {scratch_.take(rows * cols), rows, cols}; }

// Once: a second head op must not overwrite the first's logits, which the description may still read.
Rows CachePass::take_logits(std::size_t rows, std::size_t cols) {
  if (!logits_out_ || rows != logit_rows() || cols != vocab_) return take(rows, cols);
  run_deferred();
  return {std::exchange(logits_out_, nullptr), rows, cols};
}

void CachePass::check_cols(const char* op, const Rows& x, std::size_t cols) const {
  if (x.cols != cols || x.rows != rows_)
    throw std::invalid_argument(fmt::format("CachePass::{}: expected rows ({}, {}), got ({}, {})", op, rows_, cols,
                                            x.rows, x.cols));
}

Rows CachePass::embed(const Embedding& table) {
  const std::size_t vocab = table.packed ? table.packed->rows : table.weight.shape()[0];
  Rows y = take(table.packed ? table.packed->cols : table.weight.shape()[1]);
  std::size_t r = 0;
  for (const Run& run : runs_) {
    for (std::size_t i = 0; i < run.count; ++i)
      if (run.tokens[i] < 0 || std::size_t(run.tokens[i]) >= vocab)
        throw std::out_of_range(fmt::format("CachePass::embed: token id {} is outside the table of {} rows",
                                            run.tokens[i], vocab));
    if (table.packed) {
      for (std::size_t i = 0; i < run.count; ++i) quant::dequantize_rows(*table.packed, run.tokens[i], 1, y.row(r + i));
    } else {
      kernels::embedding_forward(y.row(r), table.weight.value().data(), run.tokens, run.count, y.cols);
    }
    r += run.count;
  }
  return y;
}

Rows CachePass::positions(const Embedding& table) {
  const std::size_t length = table.packed ? table.packed->rows : table.weight.shape()[0];
  const std::size_t dim = table.packed ? table.packed->cols : table.weight.shape()[1];
  Rows y = take(dim);
  std::size_t r = 0;
  for (const Run& run : runs_) {
    if (run.position + run.count > length)
      throw std::out_of_range(fmt::format("CachePass::positions: position {} is outside the table of {} rows",
                                          run.position + run.count - 1, length));
    if (table.packed) quant::dequantize_rows(*table.packed, run.position, run.count, y.row(r));
    else std::copy_n(table.weight.value().data() + run.position * dim, run.count * dim, y.row(r));
    r += run.count;
  }
  return y;
}

Rows CachePass::add(const Rows& a, const Rows& b) {
  check_cols("add", b, a.cols);
  Rows y = take(a.cols);
  kernels::add_forward(y.data, a.data, b.data, rows_ * a.cols);
  return y;
}

Rows CachePass::rms_norm(const Rows& x, const RMSNorm& norm) {
  check_cols("rms_norm", x, norm.weight.shape()[0]);
  Rows y = take(x.cols);
  kernels::rms_norm_forward<float>(y.data, nullptr, x.data, norm.weight.value().data(), rows_, x.cols, norm.eps);
  return y;
}

Rows CachePass::layer_norm(const Rows& x, const LayerNorm& norm) {
  check_cols("layer_norm", x, norm.weight.shape()[0]);
  Rows y = take(x.cols);
  kernels::layer_norm_forward<float>(y.data, nullptr, nullptr, x.data, norm.weight.value().data(),
                                     norm.bias.value().data(), rows_, x.cols, norm.eps);
  return y;
}

Rows CachePass::linear(const Rows& x, const Linear& layer) {
  check_cols("linear", x, layer.in());
  Rows y = take_deferrable(x.rows, layer.out());
  if (!defer_product(y, x, layer)) product_into(y, x, layer);
  return y;
}

bool CachePass::defer_product(const Rows& y, const Rows& x, const Linear& layer) {
  const bool deferrable = layer.packed && !layer.bias.defined() && !layer.adapter;
  if (!deferrable || x.data != deferred_input_ || products_deferred_ == max_deferred) run_deferred();
  if (!deferrable) return false;
  deferred_input_ = x.data;
  deferred_products_[products_deferred_++] = {y.data, layer.packed.get()};
  return true;
}

bool CachePass::is_deferred_output(const Rows& x) const {
  for (std::size_t i = 0; i < products_deferred_; ++i)
    if (deferred_products_[i].y == x.data) return true;
  return false;
}

void CachePass::run_deferred() {
  if (products_deferred_ == 0) return;
  quant::packed_matmuls(std::span(deferred_products_).first(products_deferred_), deferred_input_, rows_, false);
  for (std::size_t i = 0; i < products_deferred_; ++i)
    packed_bytes_ += deferred_products_[i].w->bytes.size();
  for (std::size_t i = 0; i < ropes_deferred_; ++i) {
    const DeferredRope& r = deferred_ropes_[i];
    rope_now(r.y, r.x, *r.table, r.n_heads);
  }
  products_deferred_ = ropes_deferred_ = 0;
  deferred_input_ = nullptr;
}

Rows CachePass::head(const Rows& x, const Linear& layer) {
  check_cols("head", x, layer.in());
  const Rows in = head_input(x);
  Rows y = take_logits(in.rows, layer.out());
  product_into(y, in, layer);
  return y;
}

// The products are row-stable, so a row's logits have the same bits whichever rows share them.
Rows CachePass::head_input(const Rows& x) {
  if (logits_ == PrefillLogits::every_token) return x;
  Rows last = take(runs_.size(), x.cols);
  std::size_t end = 0;
  for (std::size_t i = 0; i < runs_.size(); ++i) {
    end += runs_[i].count;
    std::copy_n(x.row(end - 1), x.cols, last.row(i));
  }
  return last;
}

void CachePass::packed_product(float* y, const float* x, std::size_t rows, const quant::PackedMatrix& w,
                               bool accumulate) {
  quant::packed_matmul(y, x, rows, w, accumulate);
  packed_bytes_ += w.bytes.size();
}

void CachePass::product_into(Rows& y, const Rows& x, const Linear& layer) {
  if (layer.packed) packed_product(y.data, x.data, x.rows, *layer.packed, false);
  else kernels::row_stable_matmul(y.data, x.data, layer.weight.value().data(), x.rows, layer.in(), layer.out(), false);
  if (layer.bias.defined()) kernels::add_bias_forward(y.data, y.data, layer.bias.value().data(), x.rows, y.cols);
  if (layer.adapter) add_adapter(y, x, *layer.adapter);
}

void CachePass::add_adapter(Rows& y, const Rows& x, const LoraAdapter& adapter) {
  const std::size_t rank = adapter.a.shape()[1];
  Rows down = take(x.rows, rank);  // scale (x A), then y += down B: LoraAdapter::add_to's order
  kernels::row_stable_matmul(down.data, x.data, adapter.a.value().data(), x.rows, x.cols, rank, false);
  kernels::scale_forward(down.data, down.data, adapter.scale(), x.rows * rank);
  kernels::row_stable_matmul(y.data, down.data, adapter.b.value().data(), x.rows, rank, y.cols, true);
}

Rows CachePass::tied_head(const Rows& x, const Embedding& table) {
  if (table.packed) {  // the table is already (out, in)
    check_cols("tied_head", x, table.packed->cols);
    const Rows in = head_input(x);
    Rows y = take_logits(in.rows, table.packed->rows);
    packed_product(y.data, in.data, in.rows, *table.packed, false);
    return y;
  }
  check_cols("tied_head", x, table.weight.shape()[1]);
  const Rows in = head_input(x);
  const std::size_t vocab = table.weight.shape()[0], width = table.weight.shape()[1];
  Rows y = take_logits(in.rows, vocab);
  kernels::row_stable_matmul_transposed(y.data, in.data, table.weight.value().data(), in.rows, width, vocab);
  return y;
}

Rows CachePass::rope(const Rows& x, const std::shared_ptr<const kernels::RopeTable<float>>& table,
                     std::size_t n_heads) {
  Rows y = take_deferrable(rows_, x.cols);
  if (is_deferred_output(x) && ropes_deferred_ < max_deferred) {
    deferred_ropes_[ropes_deferred_++] = {y, x, table.get(), n_heads};
    return y;
  }
  run_deferred();
  rope_now(y, x, *table, n_heads);
  return y;
}

void CachePass::rope_now(const Rows& y, const Rows& x, const kernels::RopeTable<float>& table, std::size_t n_heads) {
  std::size_t r = 0;
  for (const Run& run : runs_) {
    kernels::rope_forward(y.row(r), x.row(r), table, 1, run.count, n_heads, x.cols / n_heads, run.position);
    r += run.count;
  }
}

Rows CachePass::attention(const Rows& q, const Rows& k, const Rows& v, AttentionHeads heads, const Dropout&) {
  const std::size_t width = cache_.width(), layer = layer_++, n_heads = heads.n_heads;
  if (layer >= cache_.layers())
    throw std::logic_error(fmt::format("CachePass::attention: the model attends {} times per token, but the cache "
                                       "has {} layers",
                                       layer + 1, cache_.layers()));
  if (heads.n_kv_heads != cache_.kv_heads())
    throw std::invalid_argument(fmt::format("CachePass::attention: the cache holds {} KV heads a row, the model "
                                            "attends with {}; use model.make_cache()",
                                            cache_.kv_heads(), heads.n_kv_heads));
  const std::size_t head_dim = width / heads.n_kv_heads;
  check_cols("attention", q, n_heads * head_dim);
  check_cols("attention", k, width);
  check_cols("attention", v, width);
  Rows y = take(q.cols);
  // Scores and sums of one query: n_heads x (max_len in whole key blocks, + 1), one area a thread,
  // each on cache lines.
  const std::size_t blocks = (cache_.max_len() + kernels::key_block - 1) / kernels::key_block;
  const std::size_t scratch_floats = (n_heads * (blocks * kernels::key_block + 1) + 15) / 16 * 16;
  // Run i's rows of the cache, then its attention over them: every run computed whole by one
  // thread, with the same bits on any thread.
  auto attend_run = [&](const Run& run, std::size_t r, float* scratch) {
    cache_.write(layer, run.sequence, run.position, run.count, k.row(r), v.row(r));
    kernels::AttentionShape shape{1, run.count, run.position + run.count, n_heads, head_dim, run.position,
                                  heads.n_kv_heads};
    shape.kv_capacity = cache_.max_len();
    if (cache_.type() == KVCacheType::f32)
      attend(y.row(r), q.row(r), cache_.keys<float>(layer, run.sequence), cache_.values<float>(layer, run.sequence),
             shape, scratch);
    else
      attend(y.row(r), q.row(r), cache_.keys<std::uint16_t>(layer, run.sequence),
             cache_.values<std::uint16_t>(layer, run.sequence), shape, scratch);
  };
  // Several sequences in a pass that runs alone (run_cache_passes' one pass of a model whose
  // weights stream from memory, its products splitting their outputs): the sequences go round the
  // kernel threads in one parallel region, rather than a region a sequence splitting its heads
  // (SmolLM2's BF16 file, 16 sequences at 2 threads: 650-770 -> 840-900 tokens/s on a Zen 4),
  // unless one sequence holds more than 1.5 threads' even share of the work (one far along beside
  // new ones: a step of BF16 sequences at positions 2,000 and 8, 9.0-9.9 ms with its heads split
  // against 9.8-11.9 dealt), whose heads then split.
  const std::size_t threads = std::min<std::size_t>(std::max(1, num_threads()), runs_.size());
  std::size_t total_work = 0, most_work = 0;
  for (const Run& run : runs_) {
    const std::size_t work = run.count * (run.position + run.count);  // (query, key) pairs
    total_work += work, most_work = std::max(most_work, work);
  }
  if (threads > 1 && !omp_in_parallel() && 2 * most_work * threads <= 3 * total_work) {
    float* scratch = scratch_.take(threads * scratch_floats);
    on_threads(threads, [&](std::size_t t, std::size_t n) {
      std::size_t r = 0;
      for (std::size_t i = 0; i < runs_.size(); r += runs_[i].count, ++i)
        if (i % n == t) attend_run(runs_[i], r, scratch + t * scratch_floats);
    });
    return y;
  }
  float* scratch = scratch_.take(scratch_floats);
  std::size_t r = 0;
  for (const Run& run : runs_) {
    attend_run(run, r, scratch);
    r += run.count;
  }
  return y;
}

// One sequence's heads split over the kernel threads when the pass runs alone (several sequences
// are split by sequence in run_cache_passes): each head computed whole by one thread, whose bits
// do not depend on the split (kernels::cached_attention_forward).
template <class Element>
void CachePass::attend(float* y, const float* q, const Element* keys, const Element* values,
                       const kernels::AttentionShape& shape, float* scratch) {
  auto attend_heads = [&](const kernels::AttentionShape& heads) {
    if constexpr (std::is_same_v<Element, float>)
      kernels::cached_attention_forward<float>(y, q, keys, values, heads, scratch);
    else
      kernels::cached_attention_forward_f16<float>(y, q, keys, values, heads, scratch);
  };
  const std::size_t work = shape.q_len * shape.kv_len * shape.model_dim();
  const std::size_t threads = std::min<std::size_t>(std::max(1, num_threads()), shape.n_heads);
  if (threads <= 1 || omp_in_parallel() || work < min_split_attention) {
    attend_heads(shape);
    return;
  }
  on_threads(threads, [&](std::size_t t, std::size_t n) {
    kernels::AttentionShape part = shape;
    part.first_head = shape.n_heads * t / n;
    part.head_count = shape.n_heads * (t + 1) / n - part.first_head;
    if (part.head_count > 0) attend_heads(part);
  });
}

Rows CachePass::residual(const Rows& x, const Rows& h, const Linear& out, const Dropout&) {
  check_cols("residual", h, out.in());
  check_cols("residual", x, out.out());
  Rows y = take(x.cols);
  if (!out.bias.defined()) {  // y = x + h W: the chains start from zero, then add x
    std::copy_n(x.data, rows_ * x.cols, y.data);
    if (out.packed) packed_product(y.data, h.data, rows_, *out.packed, true);
    else kernels::row_stable_matmul(y.data, h.data, out.weight.value().data(), rows_, out.in(), out.out(), true);
    if (out.adapter) add_adapter(y, h, *out.adapter);
    return y;
  }
  if (out.packed) packed_product(y.data, h.data, rows_, *out.packed, false);
  else kernels::row_stable_matmul(y.data, h.data, out.weight.value().data(), rows_, out.in(), out.out(), false);
  kernels::add_bias_forward(y.data, y.data, out.bias.value().data(), rows_, y.cols);
  kernels::add_forward(y.data, y.data, x.data, rows_ * y.cols);
  if (out.adapter) add_adapter(y, h, *out.adapter);
  return y;
}

Rows CachePass::swiglu(const Rows& gate, const Rows& up) {
  check_cols("swiglu", up, gate.cols);
  Rows y = take(gate.cols);
  kernels::swiglu_forward(y.data, gate.data, up.data, rows_ * gate.cols);  // elementwise: any stretch of rows
  return y;
}

Rows CachePass::gelu_tanh(const Rows& x) {
  Rows y = take(x.cols);
  kernels::gelu_tanh_forward<float>(y.data, nullptr, x.data, rows_ * x.cols);
  return y;
}

void check_decode(std::span<CachePass::Run> runs, KVCache& cache, const void* model, std::size_t layers,
                  std::size_t max_len, std::size_t width, std::size_t vocab) {
  if (cache.layers() != layers || cache.max_len() > max_len || cache.width() != width)
    throw std::invalid_argument(fmt::format("KVCache: made for {} blocks x {} positions x width {}, but the model "
                                            "has {} x at most {} x {}; use model.make_cache()",
                                            cache.layers(), cache.max_len(), cache.width(), layers, max_len, width));
  if (cache.model() != model)
    throw std::invalid_argument("KVCache: this cache was made by another model; use model.make_cache()");
  for (std::size_t i = 0; i < runs.size(); ++i) {
    CachePass::Run& run = runs[i];
    if (run.sequence >= cache.sequences())
      throw std::out_of_range(fmt::format("KVCache: sequence {} of a cache of {}", run.sequence, cache.sequences()));
    if (!cache.active(run.sequence))
      throw std::invalid_argument(
          fmt::format("KVCache: sequence {} was dropped; restart({}) it first", run.sequence, run.sequence));
    if (i > 0 && runs[i - 1].sequence >= run.sequence)
      throw std::invalid_argument(fmt::format("KVCache: sequences must come once each, in increasing order; got {} "
                                              "after {}",
                                              run.sequence, runs[i - 1].sequence));
    if (run.count == 0) throw std::invalid_argument("KVCache: no tokens to write");
    run.position = cache.position(run.sequence);
    if (run.position + run.count > cache.max_len())
      throw std::out_of_range(fmt::format("KVCache: {} tokens at position {} run past max_len {}; reset() to start "
                                          "a new sequence",
                                          run.count, run.position, cache.max_len()));
    for (std::size_t t = 0; t < run.count; ++t)
      if (run.tokens[t] < 0 || std::size_t(run.tokens[t]) >= vocab)
        throw std::out_of_range(fmt::format("KVCache: token id {} at index {} is outside the vocabulary of size {}",
                                            run.tokens[t], t, vocab));
  }
  bool holds_rows = false;
  for (std::size_t s = 0; s < cache.sequences(); ++s)
    holds_rows = holds_rows || (cache.active(s) && cache.position(s) > 0);
  const std::uint64_t version = cache.weights_version();
  if (holds_rows && version != cache.filled_version)
    throw std::logic_error(fmt::format("KVCache: the weights changed since this cache was filled (version {} -> "
                                       "{}); call reset() and prefill again",
                                       cache.filled_version, version));
  cache.filled_version = version;
}

void run_cache_passes(KVCache& cache, const DecodeRequest& request, const std::function<Rows(CachePass&)>& describe) {
  const std::span<const CachePass::Run> runs = request.runs;
  std::size_t total = 0;
  for (const auto& run : runs) total += run.count;
  // Several sequences: contiguous groups of runs, one per thread, balanced by tokens; a single
  // sequence runs on this thread and its kernels split their own work.
  // A pass per thread reads every weight once per thread; one pass reads them once, its products
  // splitting their outputs over the threads, but runs the rest of the per-token work (attention,
  // norms) on one thread. One pass wins where the last pass read many packed bytes per token
  // (SmolLM2 at 2 threads, one pass against a pass per thread, docs/quantization.md: 4 sequences
  // 1.4-1.6x for every file, 24 to 134 MB a token; 16 sequences F32 1.17x at 34 MB a token, BF16
  // 1.00x at 17, Q8_0 0.96x at 9, Q4_1 0.82x at 6). The bits are the same either way.
  constexpr std::size_t streaming_bytes_per_token = std::size_t(16) << 20;
  const bool streaming = cache.packed_bytes_per_pass > streaming_bytes_per_token * total;
  const std::size_t threads =
      omp_in_parallel() || streaming ? 1 : std::min<std::size_t>(std::max(1, num_threads()), runs.size());
  if (cache.scratch.size() < threads) cache.scratch.resize(threads);
  auto pass = [&](std::size_t t) {
    std::size_t begin = 0, end = runs.size(), first_row = 0;  // first_row: of the request's tokens
    if (threads > 1) {
      // Run i goes to the thread whose share of the tokens contains the run's first token.
      auto owner = [&](std::size_t row) { return row * threads / total; };
      std::size_t row = 0;
      begin = end = runs.size();
      for (std::size_t i = 0; i < runs.size(); row += runs[i].count, ++i) {
        if (owner(row) == t && begin == runs.size()) begin = i, first_row = row;
        if (owner(row) > t) {
          end = i;
          break;
        }
      }
      if (begin == runs.size()) return;
    }
    // The pass's logit rows are contiguous in request.logits: its tokens' or its runs'.
    float* destination =
        request.logits + (request.which == PrefillLogits::every_token ? first_row : begin) * request.vocab;
    CachePass p(cache, runs.subspan(begin, end - begin), cache.scratch[t], request.which, destination, request.vocab);
    Rows logits = describe(p);
    p.run_deferred();
    if (t == 0) cache.packed_bytes_per_pass = p.packed_bytes();
    if (p.layers_used() != cache.layers())
      throw std::logic_error(fmt::format("CachePass: the model attended {} times per token, but the cache has {} "
                                         "layers; make the cache with the model's make_cache()",
                                         p.layers_used(), cache.layers()));
    // A description whose logits come from no head op returns every token's: each run's last is kept.
    const bool every_row = logits.rows == p.rows();
    if (!(every_row || logits.rows == p.logit_rows()) || logits.cols != request.vocab)
      throw std::logic_error(fmt::format("CachePass: the description returned ({}, {}) rows, expected logits ({}, {})",
                                         logits.rows, logits.cols, p.logit_rows(), request.vocab));
    if (logits.data == destination) return;  // a head op wrote them in place
    if (request.which == PrefillLogits::every_token) {
      std::copy_n(logits.data, logits.rows * logits.cols, destination);
    } else {
      for (std::size_t i = begin, row = 0; i < end; ++i) {
        row += every_row ? runs[i].count : 1;
        std::copy_n(logits.row(row - 1), request.vocab, request.logits + i * request.vocab);
      }
    }
  };
  if (threads == 1) {
    pass(0);
  } else {
    on_threads(threads, [&](std::size_t t, std::size_t) { pass(t); });
  }
  for (const auto& run : runs) cache.advance(run.sequence, run.count);
}

}  // namespace tapegrad::nn
