// Moved to nn/models/gpt2.h; this header keeps the old include path working.
#pragma once

#include "nn/models/gpt2.h"
