// SPDX-License-Identifier: Apache-2.0
// Splits PTX text into tokens with line:column positions (private to the parser).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "phos/common/status.h"

namespace phos::ptx::detail {

enum class TokenKind : uint8_t {
  kEnd,
  kIdent,    // saxpy, %r1, $L__BB0_2, _ (sink)
  kDot,      // .b32, .shared::cta, .version (text includes the dot)
  kInt,      // 42, 0x1F, 017, 0b101, 42U
  kFloat,    // 0f3F800000, 0d..., 1.5, 1e-3
  kString,   // "..." (text includes the quotes)
  kPunct,    // one of , ; : [ ] { } ( ) + - ! @ | < > =
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string_view text;
  uint32_t line = 0;
  uint32_t column = 0;
  bool spaceBefore = false;  // whitespace or a comment separates it from the previous token

  bool is(char c) const { return kind == TokenKind::kPunct && text.size() == 1 && text[0] == c; }
  bool isDot(std::string_view t) const { return kind == TokenKind::kDot && text == t; }
};

// Tokenizes all of `text`; the last token is kEnd. Fails on a character that
// cannot start a token or an unterminated string/comment.
Result<std::vector<Token>> tokenize(std::string_view text, std::string_view sourceName);

}  // namespace phos::ptx::detail
