// The safetensors reader and writer moved to io/safetensors.h with the other file formats; this
// header keeps the old include path compiling.
#pragma once

#include "io/safetensors.h"
