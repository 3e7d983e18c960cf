// Reverse-mode autodiff on a tape (Griewank & Walther, ch. 3; Stan Math's design): Var is a value
// with an optional gradient; every op run while a Tape is recording appends one entry holding its
// backward; Tape::backward walks the entries in reverse creation order, which is already a
// topological order, and accumulates into the gradients of leaves (parameters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tapegrad {

struct TapeState;  // shared by a tape and the values it made, so stale values are detected

/// The storage behind a Var: its value, its gradient (empty until something flows into it), and
/// where it came from.
struct Node {
  Tensor value;                ///< the value
  Tensor grad;                 ///< d loss / d value, empty until something flows into it
  bool requires_grad = false;  ///< whether backward computes grad
  bool is_leaf = true;         ///< made by the user (a parameter, an input), not by an op
  std::shared_ptr<TapeState> tape;  ///< the tape that produced it (null for leaves)
  std::uint64_t epoch = 0;          ///< the tape's epoch when it was produced
  std::uint64_t version = 0;        ///< bumped by every in-place change (Var::mutable_value)
};

class Var;

/// A value as a tape entry saw it when it was recorded: its node, not kept alive, and its version
/// then. Before the entry's backward runs, the tape checks that a node still alive has the same
/// version (PyTorch's saved-variable check): a backward must read the values its forward read.
struct RecordedInput {
  /// x's node and current version.
  explicit RecordedInput(const Var& x);
  std::weak_ptr<const Node> node;  ///< a dead node needs no check: no backward saved it
  std::uint64_t version;           ///< its version when the entry was recorded
};

/// A value in the autodiff graph: a shared handle to a Node (copies share it), as a
/// torch.Tensor is a handle to its storage and autograd metadata.
class Var {
 public:
  /// An undefined Var (defined() is false): a placeholder to assign to.
  Var() = default;
  /// A leaf. Parameters pass requires_grad = true.
  explicit Var(Tensor value, bool requires_grad = false);

  const Tensor& value() const { return node().value; }  ///< The value.
  /// For in-place updates (optimizers, loading): bumps the version, so that KV caches notice and
  /// a backward that needs the old value refuses to run.
  Tensor& mutable_value();
  const Shape& shape() const { return node().value.shape(); }  ///< The value's shape.
  bool requires_grad() const { return node().requires_grad; }   ///< Whether backward computes its gradient.
  bool is_leaf() const { return node().is_leaf; }               ///< Made by the user, not by an op.
  bool has_grad() const { return !node().grad.empty(); }        ///< Whether a gradient has reached it.
  /// The accumulated gradient; throws if none has flowed here.
  const Tensor& grad() const;
  /// The gradient buffer, allocated as zeros on first use.
  Tensor& grad_buffer();
  /// Drops the gradient (the next backward starts from zero).
  void zero_grad();
  /// How many times the value was changed in place (caches compare it).
  std::uint64_t version() const { return node().version; }
  /// Marks the value as changed in place.
  void bump_version() { ++node().version; }
  /// False for a default-constructed Var.
  bool defined() const { return static_cast<bool>(node_); }

  /// The storage behind this handle, read-only.
  const Node& node() const;
  /// The storage behind this handle; writing its value bypasses the version (use mutable_value()).
  Node& node();
  /// A handle to an existing node (what Op::finish returns).
  explicit Var(std::shared_ptr<Node> node) : node_(std::move(node)) {}

 private:
  // A backward adds into the gradients of inputs it captured by value (its closure is const):
  // the op API's gradient functions (core/op_recording.h) and the tape alone reach the node for that.
  friend Tensor* grad_if_needed(const Var& x);
  friend struct GradTarget grad_target(const Var& x);
  friend bool adopt_grad(const Var& x, Tensor& gradient);
  friend class Tape;
  friend struct RecordedInput;
  Node& gradient_node() const;

  std::shared_ptr<Node> node_;
};

/// What a backward reports about chosen leaves (parameters), so that work on a gradient can start
/// as soon as it is final instead of after the whole backward: data-parallel training sums each
/// block's gradients across ranks under the rest of backward, as PyTorch DDP's hooks do.
class BackwardObserver {
 public:
  virtual ~BackwardObserver() = default;
  /// The leaves to report on (a parameter list's Vars).
  virtual const std::vector<Var>& watched() const = 0;
  /// watched()[index]'s gradient is final for this backward: every entry that reads the leaf has
  /// run. Called once per watched leaf and backward, those no entry reads first (before any
  /// entry runs; their gradient is whatever it was).
  virtual void gradient_final(std::size_t index) = 0;
  /// After each entry's backward: a place to advance work in progress (poll communication).
  virtual void entry_done() {}
};

/// A recording scope: while a Tape is alive and innermost, differentiable ops record on it.
/// Tapes nest (a nested Tape records until it is destroyed, then the outer one resumes).
class Tape {
 public:
  Tape();
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  /// Seeds d loss = 1 (loss must have one element) and runs every entry's backward in reverse.
  /// Afterwards the tape is spent: its entries are freed and a second backward is an error.
  /// Throws std::logic_error, and leaves the tape spent, when an entry's input or output was
  /// changed in place since it was recorded (see RecordedInput).
  /// With an observer, reports each watched leaf's gradient as soon as it is final (a leaf is
  /// final after the earliest-recorded entry that reads it, which runs last).
  void backward(const Var& loss, BackwardObserver* observer = nullptr);
  /// Same with an explicit seed of out's shape (used by rematerialised blocks).
  void backward(const Var& out, const Tensor& seed, BackwardObserver* observer = nullptr);
  /// Frees every entry; values made on this tape can no longer be used to record or backward.
  void clear();

  /// Bytes of activations the entries keep alive (op outputs and saved tensors).
  std::size_t bytes() const { return bytes_; }
  /// The number of entries (ops recorded).
  std::size_t size() const { return entries_.size(); }

  /// The innermost recording tape, or null inside a NoGradScope or outside any Tape.
  static Tape* current();

  /// An entry's backward: adds out.grad's contribution into the gradients of its inputs.
  using Backward = std::function<void(Node& out)>;
  /// Appends an entry of op `name` (a string literal) reading inputs: backward(out) runs when
  /// gradient reaches out. Ops record through Op (core/op_recording.h), which calls this; remat
  /// (core/remat.h) records its one entry per block here.
  void record(const char* name, std::vector<RecordedInput> inputs, const std::shared_ptr<Node>& out,
              Backward backward, std::size_t saved_bytes);
  /// What the values made on this tape share with it, to detect a cleared or spent tape.
  const std::shared_ptr<TapeState>& state() const { return state_; }

 private:
  struct Entry {
    std::shared_ptr<Node> out;
    Backward backward;
    const char* name;
    std::vector<RecordedInput> inputs;
    std::uint64_t out_version;  // the output is checked too: a backward may read it (exp, softmax)
  };
  void check_unchanged(const Entry& entry);
  // For each entry, the watched leaves whose gradient is final once it has run.
  std::vector<std::vector<std::size_t>> final_after_entries(BackwardObserver& observer) const;
  std::vector<Entry> entries_;
  std::size_t bytes_ = 0;
  std::shared_ptr<TapeState> state_;
  Tape* previous_ = nullptr;
};

/// False when the tape that produced n has been cleared or spent since (its graph is gone).
bool tape_value_is_live(const Node& n);

/// While alive, collects on this thread the leaves needing a gradient (parameters) that ops read
/// while nothing records: a rematerialised block's first forward records no op, so its one tape
/// entry (core/remat.h) lists these as inputs, like the block's own ops would.
class LeafReads {
 public:
  LeafReads();
  ~LeafReads();
  LeafReads(const LeafReads&) = delete;
  LeafReads& operator=(const LeafReads&) = delete;
  /// Notes x if it is a leaf needing a gradient, once (ops call this when they do not record).
  static void note(const Var& x);
  /// The leaves read so far, each once, in the order first read.
  std::vector<RecordedInput> take() { return std::move(leaves_); }

 private:
  std::vector<RecordedInput> leaves_;
  std::vector<const Node*> seen_;
  LeafReads* previous_;
};

/// Turns recording off for its lifetime (inference, optimizer updates, rematerialised forwards).
class NoGradScope {
 public:
  NoGradScope();
  ~NoGradScope();
  NoGradScope(const NoGradScope&) = delete;
  NoGradScope& operator=(const NoGradScope&) = delete;

 private:
  Tape* saved_;
};

}  // namespace tapegrad
