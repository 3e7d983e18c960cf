// 0.1's path of core/op_recording.h (the recording API, one letter from core/ops.h), kept until
// 0.3 (README.md, "Versions").
#pragma once
#pragma GCC warning "core/op.h is deprecated: include core/op_recording.h"

#include "core/op_recording.h"
