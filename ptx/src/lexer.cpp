// SPDX-License-Identifier: Apache-2.0
// PTX tokenizer: identifiers, dotted directives/modifiers, numbers, strings, punctuation.
#include "internal/lexer.h"

#include <cctype>

namespace phos::ptx::detail {
namespace {

// ASCII only, independent of the C locale (std::isalpha is both slower and locale-bound).
bool isAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool isIdentStart(char c) { return isAlpha(c) || c == '_' || c == '$' || c == '%'; }
bool isIdentChar(char c) {
  return isAlpha(c) || (c >= '0' && c <= '9') || c == '_' || c == '$';
}
bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isHex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

class Lexer {
 public:
  Lexer(std::string_view text, std::string_view source) : text_(text), source_(source) {}

  Result<std::vector<Token>> run() {
    std::vector<Token> out;
    // DWARF byte lists ("95,90,78,") are a token every 2 bytes; code about every 4.
    out.reserve(text_.size() / 3 + 16);
    bool space = true;
    while (true) {
      RETURN_IF_ERROR(skipSpace(space));
      Token t;
      t.line = line_;
      t.column = column();
      t.spaceBefore = space;
      space = false;
      if (pos_ >= text_.size()) {
        t.kind = TokenKind::kEnd;
        out.push_back(t);
        return out;
      }
      size_t start = pos_;
      char c = text_[pos_];
      if (c == '.' && pos_ + 1 < text_.size() && isDigit(text_[pos_ + 1]) && !out.empty() &&
          out.back().kind != TokenKind::kIdent && out.back().kind != TokenKind::kDot) {
        // ".5": a float literal, never a modifier (modifiers follow an opcode
        // or a modifier: suld.b.2d).
        RETURN_IF_ERROR(lexNumber(t));
      } else if (c == '.') {
        ++pos_;
        lexDottedName();
        if (pos_ == start + 1) return error(t, "expected a name after '.'");
        t.kind = TokenKind::kDot;
      } else if (isIdentStart(c)) {
        ++pos_;
        while (pos_ < text_.size() && isIdentChar(text_[pos_])) ++pos_;
        t.kind = TokenKind::kIdent;
      } else if (isDigit(c)) {
        RETURN_IF_ERROR(lexNumber(t));
      } else if (c == '"') {
        ++pos_;
        while (pos_ < text_.size() && text_[pos_] != '"') {
          if (text_[pos_] == '\n') return error(t, "unterminated string");
          if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;
          ++pos_;
        }
        if (pos_ >= text_.size()) return error(t, "unterminated string");
        ++pos_;
        t.kind = TokenKind::kString;
      } else if (std::string_view(",;:[]{}()+-!@|<>=").find(c) != std::string_view::npos) {
        ++pos_;
        t.kind = TokenKind::kPunct;
      } else {
        return error(t, fmt::format("unexpected character '{}'", printable(c)));
      }
      t.text = text_.substr(start, pos_ - start);
      out.push_back(t);
    }
  }

 private:
  static std::string printable(char c) {
    if (std::isprint(static_cast<unsigned char>(c))) return std::string(1, c);
    return fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
  }

  uint32_t column() const { return static_cast<uint32_t>(pos_ - lineStart_ + 1); }

  Status error(const Token& at, std::string_view what) const {
    return makeError(Code::kInvalidArgument, "{}:{}:{}: {}", source_, at.line, at.column, what);
  }

  // Names after a dot may contain "::" (.shared::cta, .L2::cache_hint).
  void lexDottedName() {
    while (pos_ < text_.size()) {
      if (isIdentChar(text_[pos_])) {
        ++pos_;
      } else if (text_[pos_] == ':' && pos_ + 2 < text_.size() && text_[pos_ + 1] == ':' &&
                 isIdentChar(text_[pos_ + 2])) {
        pos_ += 2;
      } else {
        break;
      }
    }
  }

  Status lexNumber(Token& t) {
    auto at = [&](size_t i) { return pos_ + i < text_.size() ? text_[pos_ + i] : '\0'; };
    // 0f/0F: 8 hex digits of an f32; 0d/0D: 16 hex digits of an f64.
    if (at(0) == '0' && (at(1) == 'f' || at(1) == 'F' || at(1) == 'd' || at(1) == 'D')) {
      size_t want = (at(1) == 'f' || at(1) == 'F') ? 8 : 16;
      pos_ += 2;
      size_t n = 0;
      while (isHex(at(0))) { ++pos_; ++n; }
      if (n != want) {
        return error(t, fmt::format("expected {} hex digits in float literal", want));
      }
      t.kind = TokenKind::kFloat;
      return Status::ok();
    }
    if (at(0) == '0' && (at(1) == 'x' || at(1) == 'X')) {
      pos_ += 2;
      size_t n = 0;
      while (isHex(at(0))) { ++pos_; ++n; }
      if (n == 0) return error(t, "expected hex digits after 0x");
      if (at(0) == 'U' || at(0) == 'u') ++pos_;
      t.kind = TokenKind::kInt;
      return Status::ok();
    }
    if (at(0) == '0' && (at(1) == 'b' || at(1) == 'B') && (at(2) == '0' || at(2) == '1')) {
      pos_ += 2;
      while (at(0) == '0' || at(0) == '1') ++pos_;
      if (at(0) == 'U' || at(0) == 'u') ++pos_;
      t.kind = TokenKind::kInt;
      return Status::ok();
    }
    bool isFloat = false;
    while (isDigit(at(0))) ++pos_;
    if (at(0) == '.' && isDigit(at(1))) {
      isFloat = true;
      ++pos_;
      while (isDigit(at(0))) ++pos_;
    } else if (at(0) == '.' && !isIdentStart(at(1))) {
      isFloat = true;  // "1." as in 1.e5 or a plain "1."
      ++pos_;
    }
    if ((at(0) == 'e' || at(0) == 'E') &&
        (isDigit(at(1)) || ((at(1) == '+' || at(1) == '-') && isDigit(at(2))))) {
      isFloat = true;
      pos_ += 2;
      while (isDigit(at(0))) ++pos_;
    }
    if (!isFloat && (at(0) == 'U' || at(0) == 'u')) ++pos_;
    if (isIdentChar(at(0))) return error(t, "malformed number");
    t.kind = isFloat ? TokenKind::kFloat : TokenKind::kInt;
    return Status::ok();
  }

  Status skipSpace(bool& space) {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == '\n') {
        ++pos_;
        ++line_;
        lineStart_ = pos_;
        space = true;
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
        ++pos_;
        space = true;
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
        space = true;
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '*') {
        Token at;
        at.line = line_;
        at.column = column();
        pos_ += 2;
        while (pos_ + 1 < text_.size() && !(text_[pos_] == '*' && text_[pos_ + 1] == '/')) {
          if (text_[pos_] == '\n') {
            ++line_;
            lineStart_ = pos_ + 1;
          }
          ++pos_;
        }
        if (pos_ + 1 >= text_.size()) return error(at, "unterminated /* comment");
        pos_ += 2;
        space = true;
      } else {
        break;
      }
    }
    return Status::ok();
  }

  std::string_view text_;
  std::string_view source_;
  size_t pos_ = 0;
  size_t lineStart_ = 0;
  uint32_t line_ = 1;
};

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view text, std::string_view sourceName) {
  return Lexer(text, sourceName).run();
}

}  // namespace phos::ptx::detail
