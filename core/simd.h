// The SIMD instruction set the kernels run with. Every kernel is compiled once per level and one
// is chosen at run time: the widest the CPU has, or the one TAPEGRAD_SIMD names.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

/// x86-64 instruction sets, narrowest first: SSE2 (every x86-64), AVX2 with FMA, and AVX-512 as
/// every AVX-512 server CPU has it (F, CD, DQ, BW, VL). emulated16 is a test level, in builds with
/// the tests only: the kernels on an emulated batch of 16 floats (AVX-512's width) made of plain
/// lanes, compiled for AVX2 with FMA, so that every AVX2 machine runs the 16-lane code paths.
enum class SimdLevel { sse2, avx2, avx512, emulated16 };

/// "sse2", "avx2", "avx512" or "emulated16": the names TAPEGRAD_SIMD takes.
std::string_view simd_level_name(SimdLevel level);
/// The real levels this CPU (and its operating system) can run, narrowest first.
std::vector<SimdLevel> supported_simd_levels();
/// Those levels' names, "sse2, avx2".
std::string supported_simd_level_names();
/// What the test suite runs: the supported levels, then emulated16 where this build has it and the
/// CPU runs it.
std::vector<SimdLevel> testable_simd_levels();
/// The level in use: TAPEGRAD_SIMD if set, else the widest supported. Throws std::runtime_error
/// naming the value when TAPEGRAD_SIMD is unknown or above what the CPU supports.
SimdLevel simd_level();
/// Switches every later kernel call to `level` (tests compare levels in one process); throws if
/// the CPU or the build cannot run it.
void set_simd_level(SimdLevel level);

}  // namespace tapegrad
