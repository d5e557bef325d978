// SPDX-License-Identifier: Apache-2.0
// Tests of Status, Result<T> and the propagation macros.
#include "phos/common/ipc/control.h"
#include "phos/common/status.h"

#include <cerrno>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace phos {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;

Result<int> parsePositive(int v) {
  if (v <= 0) return makeError(Code::kInvalidArgument, "{} is not positive", v);
  return v;
}

Result<int> doubled(int v) {
  ASSIGN_OR_RETURN(int p, parsePositive(v));
  return 2 * p;
}

Status checkBoth(int a, int b) {
  RETURN_IF_ERROR(parsePositive(a).status());
  RETURN_IF_ERROR_CTX(parsePositive(b).status(), "second value");
  return Status::ok();
}

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.isOk());
  EXPECT_EQ(s.toString(), "OK");
}

TEST(Status, ErrorCarriesCodeAndMessage) {
  Status s = makeError(Code::kNotFound, "no kernel named '{}'", "saxpy");
  EXPECT_FALSE(s.isOk());
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.toString(), "NOT_FOUND: no kernel named 'saxpy'");
}

TEST(Status, WithContextPrefixesOnlyErrors) {
  EXPECT_EQ(Status::ok().withContext("ignored"), Status::ok());
  Status s = Status(Code::kIo, "read failed").withContext("loading image");
  EXPECT_EQ(s.message(), "loading image: read failed");
  EXPECT_EQ(s.code(), Code::kIo);
}

TEST(Status, ErrnoErrorMapsCommonCodes) {
  EXPECT_THAT(errnoError(ENOENT, "open x"), StatusIs(Code::kNotFound, HasSubstr("open x")));
  EXPECT_THAT(errnoError(EACCES, "open x"), StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(errnoError(ENOSPC, "write x"), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(errnoError(EIO, "write x"), StatusIs(Code::kIo));
}

TEST(Result, HoldsValueOrError) {
  Result<int> good = parsePositive(3);
  ASSERT_THAT(good, IsOk());
  EXPECT_EQ(*good, 3);
  Result<int> bad = parsePositive(-1);
  EXPECT_THAT(bad, StatusIs(Code::kInvalidArgument, HasSubstr("-1 is not positive")));
  EXPECT_EQ(bad.valueOr(7), 7);
}

TEST(Result, AssignOrReturnPropagates) {
  EXPECT_EQ(*doubled(4), 8);
  EXPECT_THAT(doubled(0), StatusIs(Code::kInvalidArgument));
}

TEST(Result, ReturnIfErrorAddsContext) {
  EXPECT_THAT(checkBoth(1, 1), IsOk());
  EXPECT_THAT(checkBoth(-1, 1), StatusIs(Code::kInvalidArgument, "-1 is not positive"));
  EXPECT_THAT(checkBoth(1, -2),
              StatusIs(Code::kInvalidArgument, "second value: -2 is not positive"));
}

TEST(Result, MoveOnlyValues) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(5);
  ASSERT_THAT(r, IsOk());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 5);
}


// The control protocol's refusal codes: one spelling on the wire, and which
// of them are the asker's mistake (the CLI's exit status 2).
TEST(ControlCodes, BadRequestsAreTheAskersMistakes) {
  for (Code c : {Code::kInvalidArgument, Code::kNotFound, Code::kAlreadyExists, Code::kDataLoss}) {
    EXPECT_TRUE(ipc::isBadRequest(wireCode(c))) << wireCode(c);
  }
  EXPECT_TRUE(ipc::isBadRequest(ipc::kNoSession));
  for (Code c : {Code::kFailedPrecondition, Code::kPermissionDenied, Code::kResourceExhausted, Code::kUnavailable,
                 Code::kIo, Code::kInternal, Code::kNotSupported}) {
    EXPECT_FALSE(ipc::isBadRequest(wireCode(c))) << wireCode(c);
  }
  EXPECT_FALSE(ipc::isBadRequest(ipc::kBusy));
  EXPECT_FALSE(ipc::isBadRequest(""));
  EXPECT_FALSE(ipc::isBadRequest("NOT_FOUND"));  // codeName's spelling is for messages, never the wire
}

}  // namespace
}  // namespace phos
