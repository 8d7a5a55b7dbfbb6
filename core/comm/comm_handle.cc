#include "core/comm/comm_handle.h"

namespace fsdp2 {
namespace comm {

CommLane::CommLane(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { run(); });
}

CommLane::~CommLane() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CommHandle CommLane::submit(std::function<void()> task) {
  std::packaged_task<void()> packaged(std::move(task));
  std::shared_future<void> done = packaged.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(packaged));
  }
  cv_.notify_one();
  return CommHandle(std::move(done));
}

void CommLane::run() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // exceptions land in the task's future
  }
}

}  // namespace comm
}  // namespace fsdp2
