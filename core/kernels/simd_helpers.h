// Private to core/kernels/: the width-generic SIMD helpers of the row kernels, one header per
// kind: the primitives (simd_primitives.h), reductions along a row (row_reductions.h), products
// held in registers (gemm_tiles.h) and attention's tiles (attention_tiles.h). The kernels include
// this header for all of them.
#pragma once

#include "core/kernels/attention_tiles.h"
#include "core/kernels/gemm_tiles.h"
#include "core/kernels/row_reductions.h"
#include "core/kernels/simd_primitives.h"
