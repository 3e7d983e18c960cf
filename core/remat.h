// Per-block rematerialisation (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost").
#pragma once

#include <functional>

#include "core/tape.h"

namespace tapegrad {

// Note [Remat]
// rematerialize(block, x) records ONE entry on the current tape. Its forward runs block(x) with
// recording off, so none of the block's activations are kept: the entry holds only x (already
// held by whoever made it) and the block's output y. When backward reaches the entry it opens a
// nested Tape, re-runs block on a leaf copy of x (bit-identical values), backpropagates the
// incoming gradient through the nested tape, which accumulates into the block's parameters (they
// are leaves) and into the leaf copy, adds that into x's gradient, and frees the nested tape.
// The kernels and their order are exactly those of the plain path, so the gradients are
// bit-identical; the price is a second forward of each block during backward.
//
// The entry records x's version like any op's (core/tape.h, RecordedInput), and those of the
// leaves needing a gradient (the block's parameters) that the first forward's ops read, collected
// by LeafReads while nothing records: changing x or a parameter in place before backward is
// refused, as for a plain block, and a BackwardObserver learns that the block's parameter
// gradients are final once this entry has run.
//
// One part of that forward need not run again: the block's last op, whose output y is already
// known and whose backward reads only its inputs. So the re-run passes y as known_output, and a
// block may hand it to its last op (add_matmul does: for a decoder block this skips the FFN's
// down projection, a quarter of the block's projection FLOPs at d_ff = 4 d). A block that ignores
// it is still exact.
//
// A block with randomness (dropout) must take it from a seed fixed outside the block (nn::Gpt2Block
// and nn::RotaryDecoderBlock capture a per-step, per-block seed and build their Rng inside), so that
// the re-run draws the very same masks and the gradients stay bit-identical.
/// A block: y = block(x, known_output), where known_output, if given, is y from the first run.
using Block = std::function<Var(const Var& x, const Tensor* known_output)>;

/// y = block(x, nullptr), keeping only x and y on the tape (see Note [Remat]). Outside a
/// recording tape it is just block(x, nullptr).
Var rematerialize(Block block, const Var& x);

}  // namespace tapegrad
