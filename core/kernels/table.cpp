// This SIMD level's KernelTable (core/kernels/kernel_table.h): every kernel of core/kernel_list.h
// as the other core/kernels/*.cpp files compiled it for TAPEGRAD_SIMD_LEVEL.
#include "core/kernels/level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

template <class T> constexpr KernelTable<T> level_table{
#define TAPEGRAD_KERNEL(Return, name, parameters, arguments) .name = &name<T>,
#include "core/kernel_list.h"
};

template <class T> const KernelTable<T>& table() { return level_table<T>; }
template const KernelTable<float>& table<float>();
template const KernelTable<double>& table<double>();

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
