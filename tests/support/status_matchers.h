// SPDX-License-Identifier: Apache-2.0
// GoogleTest matchers for Status and Result<T>: IsOk(), StatusIs(code).
#pragma once

#include <gmock/gmock.h>

#include "phos/common/status.h"

namespace phos::testing {

inline const Status& toStatus(const Status& s) { return s; }
template <typename T>
Status toStatus(const Result<T>& r) { return r.status(); }

MATCHER(IsOk, "is OK") {
  Status s = toStatus(arg);
  if (!s.isOk()) *result_listener << "whose status is " << s.toString();
  return s.isOk();
}

MATCHER_P(StatusIs, code, "has code " + std::string(codeName(code))) {
  Status s = toStatus(arg);
  *result_listener << "whose status is " << s.toString();
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, messageMatcher,
           "has code " + std::string(codeName(code)) + " and a matching message") {
  Status s = toStatus(arg);
  *result_listener << "whose status is " << s.toString();
  return s.code() == code &&
         ::testing::ExplainMatchResult(messageMatcher, s.message(), result_listener);
}

}  // namespace phos::testing
