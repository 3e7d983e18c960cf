// Private to core/: run-time dispatch of the kernels. Every core/kernels/*.cpp file is compiled
// once per SIMD level (core/simd.h), with that level's compiler flags, into namespace
// kernels::<level>; each level fills one KernelTable (core/kernels/table.cpp), and the public
// kernels (core/kernels.cpp) call through the table of the level in use. The build makes every
// other symbol of a level's objects local (CMakeLists.txt), so code compiled for AVX-512 is never
// linked into another level.
#pragma once

#include "core/kernels.h"
#include "core/simd.h"

namespace tapegrad::kernels {

/// A pointer to every kernel of core/kernel_list.h, as one SIMD level compiled it.
template <class T> struct KernelTable {
#define TAPEGRAD_KERNEL(Return, name, parameters, arguments) Return(*name) parameters = nullptr;
#include "core/kernel_list.h"
};

namespace sse2 { template <class T> const KernelTable<T>& table(); }
namespace avx2 { template <class T> const KernelTable<T>& table(); }
namespace avx512 { template <class T> const KernelTable<T>& table(); }
namespace emulated16 { template <class T> const KernelTable<T>& table(); }  // in builds with the tests

/// The table of the level in use (float and double).
template <class T> const KernelTable<T>& active_table();

/// Whether a table has every kernel of the list (the suite checks every level's table; a
/// static_assert cannot, since sanitizer builds do not fold a function's address to a constant).
template <class T> constexpr bool has_every_kernel(const KernelTable<T>& table) {
  return true
#define TAPEGRAD_KERNEL(Return, name, parameters, arguments) && table.name != nullptr
#include "core/kernel_list.h"
      ;
}

}  // namespace tapegrad::kernels

/// Instantiates a kernel for float and double with the signature it is declared with (in
/// core/kernel_list.h or core/kernels.h). A SIMD kernel's definition in core/kernels/*.cpp is
/// followed by it; one left without it fails the link, its table entry having no definition.
#define TAPEGRAD_INSTANTIATE_KERNEL(name)     \
  template decltype(name<float>) name<float>; \
  template decltype(name<double>) name<double>;
