// fsdp2/core/comm/comm_handle.h
//
// CommHandle: the result of an asynchronous collective, and CommLane: the
// single worker thread that runs one process group's collectives in order.
//
// Every collective in fsdp2 is issued on a lane and returns a CommHandle that
// the caller must wait on before it reads the output. Lanes keep collectives in
// program order, which is what keeps ranks matched: every rank issues the same
// collectives on the same lane in the same order.
#ifndef FSDP2_CORE_COMM_COMM_HANDLE_H_
#define FSDP2_CORE_COMM_COMM_HANDLE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace fsdp2 {
namespace comm {

// A handle on a collective in flight. Copyable; all copies refer to the same
// operation. wait() blocks until the operation ends and rethrows its error
// (a std::runtime_error naming the rank, collective and group).
class CommHandle {
 public:
  CommHandle() = default;  // A handle on nothing: wait() returns at once.
  explicit CommHandle(std::shared_future<void> done) : done_(std::move(done)) {}
  // `after_wait` runs in wait() once the operation has ended, on the
  // waiting thread (for device work: ordering that thread's stream after
  // the collective's).
  CommHandle(std::shared_future<void> done, std::function<void()> after_wait)
      : done_(std::move(done)), after_wait_(std::move(after_wait)) {}

  void wait() const {
    if (done_.valid()) done_.get();
    if (after_wait_) after_wait_();
  }
  const std::shared_future<void>& future() const { return done_; }
  bool ready() const {
    return !done_.valid() ||
           done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> done_;
  std::function<void()> after_wait_;
};

// A FIFO worker thread. Tasks run one at a time in submission order; a task's
// exception is stored in its handle. The destructor drains queued tasks.
class CommLane {
 public:
  explicit CommLane(std::string name);
  ~CommLane();
  CommLane(const CommLane&) = delete;
  CommLane& operator=(const CommLane&) = delete;

  // Queues `task`; the returned handle completes when it has run.
  CommHandle submit(std::function<void()> task);

  const std::string& name() const { return name_; }

 private:
  void run();

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  // A queued task and its completion. The worker destroys `fn` (and the
  // tensors it captured) before completing `done`, so a caller that waited
  // for the handle finds those tensors released (the engine's buffer pool
  // relies on it).
  struct Task {
    std::function<void()> fn;
    std::promise<void> done;
  };
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_COMM_HANDLE_H_
