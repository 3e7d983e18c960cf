// Private to core/: opened by every core/kernels_*.cpp. Those files are compiled once per SIMD
// level (core/kernel_table.h); CMakeLists.txt names the level in TAPEGRAD_SIMD_LEVEL and sets its
// compiler flags, so xsimd::batch<T> is that level's widest batch.
#pragma once

#include <xsimd/xsimd.hpp>

#include "core/kernel_table.h"
#include "core/parallel.h"
#include "core/simd_helpers.h"

#ifndef TAPEGRAD_SIMD_LEVEL
#error "core/kernels_*.cpp are compiled by CMakeLists.txt once per SIMD level, with TAPEGRAD_SIMD_LEVEL defined"
#endif

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

template <class T> using Batch = xsimd::batch<T>;

#include "core/kernel_functions.h"

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
