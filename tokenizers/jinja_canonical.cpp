// The canonical form of a Jinja template: a lexer for tags and text with Jinja's whitespace
// control (-, +, trim_blocks, lstrip_blocks), and a tokeniser for the expressions inside tags.
#include "tokenizers/jinja_canonical.h"

#include <fmt/format.h>

#include <cctype>
#include <stdexcept>
#include <vector>

namespace tapegrad::tokenizers {

namespace {

enum class PieceKind { text, output, statement, comment };

struct Piece {
  PieceKind kind;
  std::string body;
  char open_modifier = 0, close_modifier = 0;  // '-', '+' or none
};

bool is_jinja_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// The end of the string literal that opens at `at` (its closing quote's position + 1).
std::size_t literal_end(std::string_view source, std::size_t at) {
  const char quote = source[at];
  for (std::size_t i = at + 1; i < source.size(); ++i) {
    if (source[i] == '\\') ++i;
    else if (source[i] == quote) return i + 1;
  }
  throw std::invalid_argument(fmt::format("Jinja template: the string at offset {} is not closed", at));
}

std::vector<Piece> lex(std::string_view source) {
  std::vector<Piece> pieces;
  std::size_t at = 0;
  while (at < source.size()) {
    std::size_t open = source.find('{', at);
    while (open != std::string_view::npos && open + 1 < source.size() && std::string_view("{%#").find(source[open + 1]) == std::string_view::npos)
      open = source.find('{', open + 1);
    if (open == std::string_view::npos || open + 1 >= source.size()) {
      pieces.push_back({PieceKind::text, std::string(source.substr(at))});
      break;
    }
    if (open > at) pieces.push_back({PieceKind::text, std::string(source.substr(at, open - at))});
    const char kind_char = source[open + 1];
    const PieceKind kind = kind_char == '{' ? PieceKind::output : kind_char == '%' ? PieceKind::statement : PieceKind::comment;
    const std::string closer = kind == PieceKind::output ? "}}" : kind == PieceKind::statement ? "%}" : "#}";
    Piece piece{kind, ""};
    std::size_t body = open + 2;
    if (body < source.size() && (source[body] == '-' || source[body] == '+')) piece.open_modifier = source[body++];
    std::size_t close = body;
    while (true) {
      if (close + 1 >= source.size())
        throw std::invalid_argument(fmt::format("Jinja template: the tag at offset {} is not closed", open));
      if (kind != PieceKind::comment && (source[close] == '\'' || source[close] == '"')) {
        close = literal_end(source, close);
        continue;
      }
      if (source.compare(close, 2, closer) == 0) break;
      ++close;
    }
    std::size_t body_end = close;
    if (body_end > body && (source[body_end - 1] == '-' || source[body_end - 1] == '+')) piece.close_modifier = source[--body_end];
    piece.body = std::string(source.substr(body, body_end - body));
    pieces.push_back(std::move(piece));
    at = close + 2;
  }
  return pieces;
}

// Jinja's whitespace control, with transformers' trim_blocks and lstrip_blocks. lstrip_blocks
// looks at the source's lines, so it goes first, before any newline is trimmed.
void control_whitespace(std::vector<Piece>& pieces) {
  for (std::size_t i = 1; i < pieces.size(); ++i) {
    const Piece& tag = pieces[i];
    std::string& before = pieces[i - 1].body;
    if (tag.kind == PieceKind::text || tag.kind == PieceKind::output || tag.open_modifier != 0 ||
        pieces[i - 1].kind != PieceKind::text)
      continue;
    const std::size_t newline = before.find_last_of('\n');
    if (newline == std::string::npos && i != 1) continue;  // the text follows a tag on the same line
    const std::size_t line_start = newline == std::string::npos ? 0 : newline + 1;
    if (before.find_first_not_of(" \t", line_start) == std::string::npos) before.erase(line_start);
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Piece& tag = pieces[i];
    if (tag.kind == PieceKind::text) continue;
    if (tag.open_modifier == '-' && i > 0 && pieces[i - 1].kind == PieceKind::text) {
      std::string& before = pieces[i - 1].body;
      while (!before.empty() && is_jinja_space(before.back())) before.pop_back();
    }
    if (i + 1 == pieces.size() || pieces[i + 1].kind != PieceKind::text) continue;
    std::string& after = pieces[i + 1].body;
    if (tag.close_modifier == '-') {
      std::size_t kept = 0;
      while (kept < after.size() && is_jinja_space(after[kept])) ++kept;
      after.erase(0, kept);
    } else if (tag.kind != PieceKind::output && tag.close_modifier != '+') {  // trim_blocks
      if (after.starts_with("\r\n")) after.erase(0, 2);
      else if (after.starts_with('\n') || after.starts_with('\r')) after.erase(0, 1);
    }
  }
}

char unescaped(char c) {
  switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    default: return c;  // \\, \', \" and anything else stand for the character itself
  }
}

struct Token {
  std::string text;
  bool literal = false;  // text is then the literal's value
};

std::vector<Token> tokenize(std::string_view expression) {
  std::vector<Token> tokens;
  for (std::size_t i = 0; i < expression.size();) {
    const char c = expression[i];
    if (is_jinja_space(c)) {
      ++i;
    } else if (c == '\'' || c == '"') {
      std::size_t end = literal_end(expression, i);
      std::string value;
      for (std::size_t k = i + 1; k + 1 < end; ++k) value += expression[k] == '\\' ? unescaped(expression[++k]) : expression[k];
      tokens.push_back({value, true});
      i = end;
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t end = i;
      while (end < expression.size() && (std::isalnum(static_cast<unsigned char>(expression[end])) || expression[end] == '_')) ++end;
      std::string word(expression.substr(i, end - i));
      const bool attribute = !tokens.empty() && tokens.back().text == "." && !tokens.back().literal;
      if (attribute && !std::isdigit(static_cast<unsigned char>(word[0]))) {  // message.role -> message['role']
        tokens.back().text = "[";
        tokens.push_back({word, true});
        tokens.push_back({"]"});
      } else {
        tokens.push_back({word});
      }
      i = end;
    } else {
      std::string_view two = expression.substr(i, 2);
      const bool pair = two == "==" || two == "!=" || two == "<=" || two == ">=" || two == "**" || two == "//";
      tokens.push_back({std::string(expression.substr(i, pair ? 2 : 1))});
      i += pair ? 2 : 1;
    }
  }
  // 'a' + 'b' and 'a' ~ 'b' are 'ab'.
  std::vector<Token> folded;
  for (Token& token : tokens) {
    const std::size_t n = folded.size();
    if (token.literal && n >= 2 && folded[n - 2].literal && !folded[n - 1].literal &&
        (folded[n - 1].text == "+" || folded[n - 1].text == "~")) {
      folded.pop_back();
      folded.back().text += token.text;
    } else {
      folded.push_back(std::move(token));
    }
  }
  return folded;
}

std::string canonical_expression(std::string_view expression) {
  std::string out;
  for (const Token& token : tokenize(expression)) {
    if (!out.empty()) out += ' ';
    out += token.literal ? jinja_canonical_literal(token.text) : token.text;
  }
  return out;
}

}  // namespace

std::string jinja_canonical_literal(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\\' || c == '\'') out += {'\\', c};
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out + "'";
}

std::string jinja_canonical(std::string_view source) {
  std::vector<Piece> pieces = lex(source);
  control_whitespace(pieces);
  std::string out;
  std::string pending_text;  // consecutive literal outputs are one output
  auto flush_text = [&] {
    if (!pending_text.empty()) out += "out " + jinja_canonical_literal(pending_text) + "\n";
    pending_text.clear();
  };
  for (const Piece& piece : pieces) {
    if (piece.kind == PieceKind::comment) continue;
    if (piece.kind == PieceKind::text) {
      pending_text += piece.body;
      continue;
    }
    std::vector<Token> tokens = tokenize(piece.body);
    if (piece.kind == PieceKind::output && tokens.size() == 1 && tokens[0].literal) {
      pending_text += tokens[0].text;
      continue;
    }
    flush_text();
    out += (piece.kind == PieceKind::output ? "out " : "do ") + canonical_expression(piece.body) + "\n";
  }
  flush_text();
  return out;
}

}  // namespace tapegrad::tokenizers
