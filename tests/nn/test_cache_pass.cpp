// CachePass's logits: the first head op writes them into the caller's rows, and no later op of
// the description overwrites what an earlier one returned; packed products of one input deferred
// to run together give the bits of one product at a time, and every op that reads rows computes
// them first.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "nn/cache_pass.h"
#include "core/quant/packed_matrix.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/rms_norm.h"

using namespace tapegrad;
using namespace tapegrad::nn;

namespace {

// A pass of no attention layers over `tokens` (one run of sequence 0) into logits, every token's.
void run(KVCache& cache, const std::vector<std::int32_t>& tokens, std::vector<float>& logits, std::size_t vocab,
         const std::function<Rows(CachePass&)>& describe) {
  CachePass::Run runs[] = {{0, 0, tokens.size(), tokens.data()}};
  logits.assign(tokens.size() * vocab, -1.0f);
  run_cache_passes(cache, {runs, vocab, logits.data(), PrefillLogits::every_token}, describe);
  cache.reset();
}

}  // namespace

TEST_CASE("the head writes the caller's logits in place; a second head op leaves the first's rows alone") {
  constexpr std::size_t vocab = 37, dim = 24;
  Rng rng(5);
  Embedding table(vocab, dim, 0.5f, rng);
  KVCache cache(0, 8, dim);
  const std::vector<std::int32_t> tokens = {3, 30, 7, 0, 36};
  const float* written = nullptr;
  std::vector<float> alone, twice;
  run(cache, tokens, alone, vocab, [&](CachePass& p) {
    Rows y = p.tied_head(p.embed(table), table);
    written = y.data;
    return y;
  });
  CHECK(written == alone.data());
  // The logits of a head op and of the same op run again, added: 2x each logit, exactly.
  run(cache, tokens, twice, vocab, [&](CachePass& p) {
    const Rows x = p.embed(table);
    const Rows first = p.tied_head(x, table), second = p.tied_head(x, table);
    CHECK(first.data != second.data);
    return p.add(first, second);
  });
  for (std::size_t i = 0; i < alone.size(); ++i) REQUIRE(twice[i] == 2 * alone[i]);
  // Without a buffer of the caller's, the head's rows come from the scratch and hold the same bits.
  KVCache::Scratch scratch;
  CachePass::Run runs[] = {{0, 0, tokens.size(), tokens.data()}};
  CachePass p(cache, runs, scratch);
  const Rows y = p.tied_head(p.embed(table), table);
  CHECK(std::memcmp(y.data, alone.data(), alone.size() * sizeof(float)) == 0);
}

TEST_CASE("packed products of one input, deferred with the RoPE of one of them, give the bits of each op run at once") {
  constexpr std::size_t vocab = 40, dim = 64, heads = 4;
  Rng rng(7);
  Embedding table(vocab, dim, 0.5f, rng);
  auto packed_linear = [&](std::size_t out) {
    std::vector<float> w(out * dim);  // (out, in)
    for (float& v : w) v = rng.normal() * 0.2f;
    Linear layer(dim, out, false, 0.1f, rng);
    layer.packed = std::make_shared<const quant::PackedMatrix>(quant::pack_matrix(w.data(), out, dim, quant::TensorType::Q8_0));
    return layer;
  };
  const Linear wa = packed_linear(dim), wb = packed_linear(dim), wc = packed_linear(vocab);
  const auto rope = std::make_shared<const kernels::RopeTable<float>>(kernels::make_rope_table<float>(8, dim / heads));
  KVCache cache(0, 8, dim);
  const std::vector<std::int32_t> tokens = {3, 30, 7, 0, 36};
  std::vector<float> logits;
  // The description ends on a deferred product: run_cache_passes runs it before reading the logits.
  run(cache, tokens, logits, vocab, [&](CachePass& p) {
    const Rows x = p.embed(table);
    const Rows a = p.rope(p.linear(x, wa), rope, heads);
    const Rows b = p.linear(x, wb);
    return p.linear(p.add(a, b), wc);
  });
  const std::size_t M = tokens.size();
  std::vector<float> x(M * dim), a(M * dim), roped(M * dim), b(M * dim), sum(M * dim), expected(M * vocab);
  kernels::embedding_forward(x.data(), table.weight.value().data(), tokens.data(), M, dim);
  quant::packed_matmul(a.data(), x.data(), M, *wa.packed, false);
  kernels::rope_forward(roped.data(), a.data(), *rope, 1, M, heads, dim / heads, 0);
  quant::packed_matmul(b.data(), x.data(), M, *wb.packed, false);
  kernels::add_forward(sum.data(), roped.data(), b.data(), M * dim);
  quant::packed_matmul(expected.data(), sum.data(), M, *wc.packed, false);
  CHECK(std::memcmp(logits.data(), expected.data(), expected.size() * sizeof(float)) == 0);
}

TEST_CASE("every op that reads rows computes a deferred product first: the bits of reading it computed") {
  // Fresh caches and scratch for each run: an op that read the product's rows unfilled would read
  // the new buffer's zeros, not the product.
  constexpr std::size_t vocab = 64, dim = 64;
  Rng rng(9);
  Embedding table(vocab, dim, 0.5f, rng);
  std::vector<float> w(dim * dim);  // (out, in)
  for (float& v : w) v = rng.normal() * 0.2f;
  Linear wa(dim, dim, false, 0.1f, rng), plain(dim, dim, false, 0.1f, rng);
  wa.packed = std::make_shared<const quant::PackedMatrix>(quant::pack_matrix(w.data(), dim, dim, quant::TensorType::Q8_0));
  const RMSNorm rms(dim);
  const LayerNorm ln(dim);
  const Dropout none(0.0f);
  const std::vector<std::int32_t> tokens = {3, 30, 7, 0, 36};
  const std::vector<std::pair<const char*, std::function<Rows(CachePass&, const Rows&, const Rows&)>>> ops = {
      {"add", [&](CachePass& p, const Rows& x, const Rows& a) { return p.add(x, a); }},
      {"rms_norm", [&](CachePass& p, const Rows&, const Rows& a) { return p.rms_norm(a, rms); }},
      {"layer_norm", [&](CachePass& p, const Rows&, const Rows& a) { return p.layer_norm(a, ln); }},
      {"linear", [&](CachePass& p, const Rows&, const Rows& a) { return p.linear(a, plain); }},
      {"head", [&](CachePass& p, const Rows&, const Rows& a) { return p.head(a, plain); }},
      {"tied_head", [&](CachePass& p, const Rows&, const Rows& a) { return p.tied_head(a, table); }},
      {"residual", [&](CachePass& p, const Rows& x, const Rows& a) { return p.residual(x, a, plain, none); }},
      {"swiglu", [&](CachePass& p, const Rows& x, const Rows& a) { return p.swiglu(a, x); }},
      {"gelu_tanh", [&](CachePass& p, const Rows&, const Rows& a) { return p.gelu_tanh(a); }},
  };
  for (const auto& [name, op] : ops) {
    const std::string op_name = name;
    CAPTURE(op_name);
    std::vector<float> deferred, computed;
    for (bool run_first : {false, true}) {
      KVCache cache(0, 8, dim);
      run(cache, tokens, run_first ? computed : deferred, vocab, [&](CachePass& p) {
        const Rows x = p.embed(table), a = p.linear(x, wa);
        if (run_first) p.run_deferred();
        return op(p, x, a);
      });
    }
    CHECK(std::memcmp(deferred.data(), computed.data(), computed.size() * sizeof(float)) == 0);
  }
}
