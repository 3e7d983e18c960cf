// The flag that says whether the error being thrown was agreed by every rank.
#include "training/rank_agreement.h"

#include "training/trainer.h"

namespace tapegrad::examples {

namespace {
std::atomic<bool> g_agreed_failure{false};
}  // namespace

void mark_failure_agreed() { g_agreed_failure = true; }

bool failure_is_agreed() { return g_agreed_failure.load(); }

}  // namespace tapegrad::examples
