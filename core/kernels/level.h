// Private to the kernels: opened by every core/kernels/*.cpp. Those files are compiled once per
// SIMD level (core/kernels/kernel_table.h); CMakeLists.txt names the level in TAPEGRAD_SIMD_LEVEL
// and sets its compiler flags, so xsimd::batch<T> is that level's widest batch. Builds with the
// tests compile them once more as the level emulated16, with TAPEGRAD_EMULATED_BATCH, on an
// emulated 64-byte batch (AVX-512's 16 floats), so that the 16-lane paths of every kernel run on
// any AVX2 machine. Kernels call fma, exp, hadd and max unqualified, so that either batch type
// finds its own.
#pragma once

#include <xsimd/xsimd.hpp>

#include "core/kernels/emulated_batch.h"
#include "core/kernels/kernel_table.h"
#include "core/kernels/simd_helpers.h"
#include "core/parallel.h"

#ifndef TAPEGRAD_SIMD_LEVEL
#error "core/kernels/*.cpp are compiled by CMakeLists.txt once per SIMD level, with TAPEGRAD_SIMD_LEVEL defined"
#endif

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

#ifdef TAPEGRAD_EMULATED_BATCH
template <class T> using Batch = EmulatedBatch<T, 64 / sizeof(T)>;
#else
template <class T> using Batch = xsimd::batch<T>;
#endif
using detail::fma;  // a fused one for every width (core/kernels/simd_helpers.h)
using xsimd::exp;
using xsimd::fma;
using xsimd::hadd;
using xsimd::max;

// This level's copy of every kernel of the list.
#define TAPEGRAD_KERNEL(Return, name, parameters, arguments) template <class T> Return name parameters;
#include "core/kernel_list.h"

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
