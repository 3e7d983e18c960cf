// 0.1's path of nn/models/rotary_decoder.h, kept until 0.3 (README.md, "Versions").
#pragma once
#pragma GCC warning "nn/rotary_decoder.h is deprecated: include nn/models/rotary_decoder.h"

#include "nn/models/rotary_decoder.h"
