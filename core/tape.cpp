// The tape: entries in creation order, a reverse loop for backward, epochs for stale values.
#include "core/tape.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace tapegrad {

struct TapeState {
  std::uint64_t epoch = 1;  // bumped by clear(); a value whose epoch differs is stale
  bool spent = false;       // backward has run since the last clear()
};

static thread_local Tape* g_current = nullptr;

Var::Var(Tensor value, bool requires_grad) : node_(std::make_shared<Node>()) {
  node_->value = std::move(value);
  node_->requires_grad = requires_grad;
}

Node& Var::gradient_node() const {
  if (!node_) throw std::logic_error("Var: use of an undefined (default-constructed) Var");
  return *node_;
}
const Node& Var::node() const { return gradient_node(); }
Node& Var::node() { return gradient_node(); }

RecordedInput::RecordedInput(const Var& x) : node(x.node_), version(x.node().version) {}

Tensor& Var::mutable_value() {
  ++node().version;
  return node().value;
}

const Tensor& Var::grad() const {
  if (node().grad.empty())
    throw std::logic_error(fmt::format("Var::grad: no gradient has reached this value of shape {} (was it used "
                                       "in the loss, and did backward run?)",
                                       to_string(shape())));
  return node().grad;
}

Tensor& Var::grad_buffer() {
  Node& n = node();
  if (n.grad.empty()) n.grad = Tensor(n.value.shape());
  return n.grad;
}

void Var::zero_grad() { node().grad = Tensor(); }

bool tape_value_is_live(const Node& n) { return !n.tape || (n.epoch == n.tape->epoch && !n.tape->spent); }

Tape::Tape() : state_(std::make_shared<TapeState>()), previous_(g_current) { g_current = this; }

Tape::~Tape() {
  g_current = previous_;
  ++state_->epoch;  // values made here outlive the tape but can no longer be differentiated
}

Tape* Tape::current() { return g_current; }

void Tape::record(const char* name, std::vector<RecordedInput> inputs, const std::shared_ptr<Node>& out,
                  Backward backward, std::size_t saved_bytes) {
  out->requires_grad = true;
  out->is_leaf = false;
  out->tape = state_;
  out->epoch = state_->epoch;
  state_->spent = false;
  bytes_ += out->value.bytes() + saved_bytes;
  entries_.push_back({out, std::move(backward), name, std::move(inputs), out->version});
}

void Tape::backward(const Var& loss, BackwardObserver* observer) {
  if (loss.value().size() != 1)
    throw std::invalid_argument(fmt::format("Tape::backward: the loss must have one element, got shape {}; pass "
                                            "a seed gradient for other outputs",
                                            to_string(loss.shape())));
  backward(loss, Tensor(loss.shape(), 1.0f), observer);
}

std::vector<std::vector<std::size_t>> Tape::final_after_entries(BackwardObserver& observer) const {
  const std::vector<Var>& watched = observer.watched();
  std::unordered_map<const Node*, std::size_t> index;
  for (std::size_t i = 0; i < watched.size(); ++i) index.emplace(&watched[i].node(), i);
  // Entries run in reverse: a leaf's gradient is final after the earliest entry that reads it.
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> earliest(watched.size(), none);
  for (std::size_t e = entries_.size(); e-- > 0;)
    for (const RecordedInput& input : entries_[e].inputs) {
      const std::shared_ptr<const Node> n = input.node.lock();
      if (!n) continue;
      if (auto it = index.find(n.get()); it != index.end()) earliest[it->second] = e;
    }
  std::vector<std::vector<std::size_t>> after(entries_.size());
  for (std::size_t i = 0; i < watched.size(); ++i)
    if (earliest[i] == none) observer.gradient_final(i);  // read by no entry: final already
    else after[earliest[i]].push_back(i);
  return after;
}

void Tape::backward(const Var& out, const Tensor& seed, BackwardObserver* observer) {
  Node& root = out.gradient_node();
  if (root.tape != state_) {
    if (root.is_leaf) throw std::logic_error("Tape::backward: the output is a leaf, not computed on this tape");
    throw std::logic_error("Tape::backward: the output was computed on another tape");
  }
  if (state_->spent || root.epoch != state_->epoch)
    throw std::logic_error("Tape::backward: this tape is spent (backward already ran, or it was cleared); run the "
                           "forward again on a recording tape");
  expect_shape("Tape::backward", "the seed", seed.shape(), root.value.shape());
  if (root.grad.empty()) {
    root.grad = seed;
  } else {
    for (std::size_t i = 0; i < seed.size(); ++i) root.grad[i] += seed[i];
  }
  const std::vector<std::vector<std::size_t>> final_after =
      observer ? final_after_entries(*observer) : std::vector<std::vector<std::size_t>>();
  // Each entry is released as soon as it has run: nothing earlier on the tape refers to it, so
  // activations and intermediate gradients are freed progressively, as PyTorch does.
  for (std::size_t e = entries_.size(); e-- > 0;) {
    Entry& entry = entries_[e];
    Node& node = *entry.out;
    if (!node.grad.empty()) {
      check_unchanged(entry);
      entry.backward(node);
    }
    if (&node != &root) node.grad = Tensor();
    entry.backward = nullptr;
    entry.out.reset();
    if (observer) {
      for (std::size_t leaf : final_after[e]) observer->gradient_final(leaf);
      observer->entry_done();
    }
  }
  clear();
  state_->spent = true;
}

// One counter compare per input: an input whose node has died was saved by no backward.
void Tape::check_unchanged(const Entry& entry) {
  std::string changed;
  for (std::size_t i = 0; i < entry.inputs.size() && changed.empty(); ++i) {
    const RecordedInput& input = entry.inputs[i];
    std::shared_ptr<const Node> n = input.node.lock();
    if (n && n->version != input.version)
      changed = fmt::format("input {} of shape {} was changed in place (version {} -> {})", i,
                            to_string(n->value.shape()), input.version, n->version);
  }
  if (changed.empty() && entry.out->version != entry.out_version)
    changed = fmt::format("output of shape {} was changed in place (version {} -> {})",
                          to_string(entry.out->value.shape()), entry.out_version, entry.out->version);
  if (changed.empty()) return;
  std::string message = fmt::format(
      "Tape::backward: {}'s {} after {} was recorded, and its backward needs the value it read; change it after "
      "backward (as optimizers do), or give {} a copy (this backward's gradients are partial)",
      entry.name, changed, entry.name, entry.name);
  clear();  // the entries after this one have run: this backward cannot resume
  state_->spent = true;
  throw std::logic_error(message);
}

void Tape::clear() {
  entries_.clear();
  bytes_ = 0;
  ++state_->epoch;
  state_->spent = false;
}

static thread_local LeafReads* g_leaf_reads = nullptr;

LeafReads::LeafReads() : previous_(g_leaf_reads) { g_leaf_reads = this; }
LeafReads::~LeafReads() { g_leaf_reads = previous_; }

void LeafReads::note(const Var& x) {
  LeafReads* reads = g_leaf_reads;
  if (!reads || !x.defined()) return;
  const Node& n = x.node();
  if (!n.is_leaf || !n.requires_grad) return;
  if (std::find(reads->seen_.begin(), reads->seen_.end(), &n) != reads->seen_.end()) return;
  reads->seen_.push_back(&n);
  reads->leaves_.emplace_back(x);
}

NoGradScope::NoGradScope() : saved_(g_current) { g_current = nullptr; }
NoGradScope::~NoGradScope() { g_current = saved_; }

}  // namespace tapegrad
