#include "core/common/error.h"

#include <gtest/gtest.h>

#include <future>

namespace fsdp2 {
namespace {

TEST(ErrorTest, CarriesItsCodeAndIsTheStandardTypeOfItsCategory) {
  try {
    throw FailedPreconditionError("call connect() first");
  } catch (const std::logic_error& e) {
    const Error* error = AsError(e);
    ASSERT_NE(error, nullptr);
    EXPECT_EQ(error->code(), ErrorCode::kFailedPrecondition);
    EXPECT_STREQ(error->what(), "call connect() first");
  }
  EXPECT_THROW(throw InvalidArgumentError("x"), std::invalid_argument);
  EXPECT_THROW(throw IoError("x"), std::runtime_error);
}

TEST(ErrorTest, ThrowErrorKeepsTheCode) {
  for (ErrorCode code : {ErrorCode::kInvalidArgument, ErrorCode::kShape, ErrorCode::kIo,
                         ErrorCode::kTimeout, ErrorCode::kCommunication,
                         ErrorCode::kInternal, ErrorCode::kOutOfMemory}) {
    try {
      ThrowError(code, "message");
      FAIL() << "ThrowError returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << ErrorCodeName(code);
      EXPECT_STREQ(e.what(), "message");
    }
  }
}

TEST(ErrorTest, AStandardExceptionHasNoCode) {
  std::promise<int> promise;
  promise.get_future();
  try {
    promise.get_future();  // a second time: std::future_error, a logic_error
    FAIL() << "no future_error";
  } catch (const std::exception& e) {
    EXPECT_EQ(AsError(e), nullptr);
  }
}

}  // namespace
}  // namespace fsdp2
