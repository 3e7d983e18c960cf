// The character tokenizer and UTF-8 functions moved to tokenizers/ (namespace tapegrad::tokenizers);
// this header keeps their old names in tapegrad::nn so existing code compiles unchanged.
#pragma once

#include "tokenizers/char_tokenizer.h"
#include "tokenizers/utf8.h"

namespace tapegrad::nn {

using tokenizers::append_utf8;
using tokenizers::CharTokenizer;
using tokenizers::decode_utf8;
using tokenizers::describe_char;

}  // namespace tapegrad::nn
