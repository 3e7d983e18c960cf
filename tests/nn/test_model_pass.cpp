// ModelPass: both passes offer every op a model description may use, and a pass whose op is
// missing or has another signature is not a ModelPass.
#include <doctest/doctest.h>

#include "nn/cache_pass.h"
#include "nn/tape_pass.h"

using namespace tapegrad;

namespace {

// The archetype with rope() taking no table: every other op is there.
struct RopeWithoutTable : nn::ModelPassArchetype {
  Value rope(const Value& x, std::size_t) { return x; }
};

// The archetype whose gelu_tanh() returns something other than its values.
struct GeluToFloat : nn::ModelPassArchetype {
  float gelu_tanh(const Value&) { return 0; }
};

}  // namespace

TEST_CASE("the tape pass, the cache pass and the archetype offer every op of a model description") {
  CHECK(nn::ModelPass<nn::TapePass>);
  CHECK(nn::ModelPass<nn::CachePass>);
  CHECK(nn::ModelPass<nn::ModelPassArchetype>);
}

TEST_CASE("a pass whose op has another signature is not a ModelPass") {
  CHECK_FALSE(nn::ModelPass<RopeWithoutTable>);
  CHECK_FALSE(nn::ModelPass<GeluToFloat>);
}
