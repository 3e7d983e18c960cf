// A Jinja template's canonical form, to recognise a template whatever its spacing, quoting or
// attribute syntax: the text it outputs after whitespace control (transformers renders with
// trim_blocks and lstrip_blocks), and each tag's tokens, string literals unescaped and adjacent
// ones joined ('a' + 'b' is 'ab'), message.role written message['role']. Not an evaluator.
#pragma once

#include <string>
#include <string_view>

namespace tapegrad::tokenizers {

/// One line per output or statement: "out 'text'", "out message ['role'] + '\n'", "do for message
/// in messages". Throws std::invalid_argument on an unterminated tag or string.
std::string jinja_canonical(std::string_view source);

/// The canonical form of a string literal: quoted with ', and \, ' and newline escaped.
std::string jinja_canonical_literal(std::string_view text);

}  // namespace tapegrad::tokenizers
