// Precompiled header for the library's translation units: the heavy xtensor and xsimd headers.
#pragma once
#include <xsimd/xsimd.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xnoalias.hpp>
#include <xtensor/xtensor.hpp>
