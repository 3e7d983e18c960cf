// 0.1's path of io/safetensors.h (the file formats' folder), kept until 0.3 (README.md, "Versions").
#pragma once
#pragma GCC warning "core/safetensors.h is deprecated: include io/safetensors.h"

#include "io/safetensors.h"
