// 0.1's path of nn/models/gpt2.h, kept until 0.3 (README.md, "Versions").
#pragma once
#pragma GCC warning "nn/gpt2.h is deprecated: include nn/models/gpt2.h"

#include "nn/models/gpt2.h"
