// CachePass's logits: the first head op writes them into the caller's rows, and no later op of
// the description overwrites what an earlier one returned.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "core/random.h"
#include "nn/cache_pass.h"
#include "nn/embedding.h"

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
