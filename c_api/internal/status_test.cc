// The C ABI's one error-to-status mapping (api_impl.h), fed real failures:
// the status comes from the error's code, never from its standard type.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <future>
#include <new>
#include <string>

#include "c_api/internal/api_impl.h"
#include "core/comm/world.h"
#include "core/common/error.h"
#include "core/strategy/fsdp2_strategy.h"

namespace fsdp2 {
namespace c_api {
namespace {

// What an entry point returns when `body` throws (or FSDP2_OK).
template <typename Body>
fsdp2_status_t Entry(Body body) {
  FSDP2_API_BEGIN
  body();
  FSDP2_API_END
}

TEST(StatusTest, ACommArgumentErrorIsInvalidArgument) {
  comm::RendezvousOptions options;
  options.world_size = 1;
  options.store_path = (std::filesystem::temp_directory_path() /
                        ("fsdp2_status_test_" + std::to_string(::getpid())))
                           .string();
  std::filesystem::remove(options.store_path);
  auto world = comm::World::Init(options);
  at::Tensor input = at::ones({4});
  at::Tensor too_small = at::zeros({3});
  EXPECT_EQ(Entry([&] { world->group()->all_gather_into_flat(too_small, input).wait(); }),
            FSDP2_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(LastError()).find("all_gather_into_flat"), std::string::npos)
      << LastError();
  EXPECT_EQ(Entry([&] { world->group()->broadcast(input, /*root=*/3).wait(); }),
            FSDP2_ERROR_INVALID_ARGUMENT);
  std::filesystem::remove(options.store_path);
}

TEST(StatusTest, ACallInTheWrongOrderIsWrongOrder) {
  strategy::FSDP2Strategy strategy;
  EXPECT_EQ(Entry([&] { strategy.barrier(); }), FSDP2_ERROR_WRONG_ORDER);
  EXPECT_NE(std::string(LastError()).find("setup_environment"), std::string::npos)
      << LastError();
}

TEST(StatusTest, AFutureErrorOrABrokenInvariantIsNotWrongOrder) {
  std::promise<int> promise;
  promise.get_future();
  // std::future_error is a std::logic_error with no fsdp2 code.
  EXPECT_EQ(Entry([&] { promise.get_future(); }), FSDP2_ERROR_INTERNAL);
  EXPECT_EQ(Entry([] { throw InternalError("unit 3 has no parameters"); }),
            FSDP2_ERROR_INTERNAL);
  EXPECT_STREQ(LastError(), "unit 3 has no parameters");
  EXPECT_EQ(Entry([] { throw std::out_of_range("vector::at"); }), FSDP2_ERROR_INTERNAL);
}

TEST(StatusTest, StandardExceptionsKeepTheirFallbacks) {
  EXPECT_EQ(Entry([] { throw std::bad_alloc(); }), FSDP2_ERROR_OUT_OF_MEMORY);
  // LibTorch's out-of-memory (as CUDA's caching allocator throws it) is one
  // too, with its message; any other LibTorch error stays RUNTIME.
  EXPECT_EQ(Entry([] {
              TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 GiB");
            }),
            FSDP2_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(LastError()).find("Tried to allocate 2.00 GiB"), std::string::npos);
  EXPECT_EQ(Entry([] {
              TORCH_CHECK(false, "DefaultCPUAllocator: not enough memory: you tried to "
                                 "allocate 8589934592 bytes.");
            }),
            FSDP2_ERROR_OUT_OF_MEMORY);
  // posix_memalign's failure, as alloc_cpu.cpp words it: the size, what to
  // do, and the allocator's words, without the enforce's location.
  EXPECT_EQ(Entry([] {
              CAFFE_ENFORCE_EQ(12, 0, "DefaultCPUAllocator: can't allocate memory: you tried "
                                      "to allocate 2400000000 bytes. Error code 12 (Cannot "
                                      "allocate memory)");
            }),
            FSDP2_ERROR_OUT_OF_MEMORY);
  const std::string oom = LastError();
  EXPECT_EQ(oom.rfind("out of host memory: allocating 2.4 GB failed. Free memory", 0), 0u) << oom;
  EXPECT_NE(oom.find("(LibTorch: DefaultCPUAllocator: can't allocate memory"), std::string::npos)
      << oom;
  EXPECT_EQ(oom.find("enforce fail"), std::string::npos) << oom;
  EXPECT_EQ(Entry([] { TORCH_CHECK(false, "a shape mismatch"); }), FSDP2_ERROR_RUNTIME);
  EXPECT_EQ(Entry([] { throw std::runtime_error("x"); }), FSDP2_ERROR_RUNTIME);
  EXPECT_EQ(Entry([] { throw std::invalid_argument("x"); }), FSDP2_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(Entry([] { throw 42; }), FSDP2_ERROR_INTERNAL);
  EXPECT_EQ(Entry([] {}), FSDP2_OK);
}

TEST(StatusTest, EveryCodeHasItsStatus) {
  EXPECT_EQ(StatusOf(ErrorCode::kInvalidArgument), FSDP2_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(StatusOf(ErrorCode::kShape), FSDP2_ERROR_SHAPE);
  EXPECT_EQ(StatusOf(ErrorCode::kInvalidHandle), FSDP2_ERROR_INVALID_HANDLE);
  EXPECT_EQ(StatusOf(ErrorCode::kFailedPrecondition), FSDP2_ERROR_WRONG_ORDER);
  EXPECT_EQ(StatusOf(ErrorCode::kNotFound), FSDP2_ERROR_IO);
  EXPECT_EQ(StatusOf(ErrorCode::kIo), FSDP2_ERROR_IO);
  EXPECT_EQ(StatusOf(ErrorCode::kCommunication), FSDP2_ERROR_RUNTIME);
  EXPECT_EQ(StatusOf(ErrorCode::kTimeout), FSDP2_ERROR_RUNTIME);
  EXPECT_EQ(StatusOf(ErrorCode::kOutOfMemory), FSDP2_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(StatusOf(ErrorCode::kInternal), FSDP2_ERROR_INTERNAL);
  // A coded error thrown as its standard type still maps by its code.
  EXPECT_EQ(Entry([] { ThrowError(ErrorCode::kTimeout, "timed out after 5 ms"); }),
            FSDP2_ERROR_RUNTIME);
  EXPECT_EQ(Entry([] { throw IoError("disk full"); }), FSDP2_ERROR_IO);
}

}  // namespace
}  // namespace c_api
}  // namespace fsdp2
