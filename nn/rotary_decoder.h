// Moved to nn/models/rotary_decoder.h; this header keeps the old include path working.
#pragma once

#include "nn/models/rotary_decoder.h"
