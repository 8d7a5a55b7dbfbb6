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
  Task queued{std::move(task), std::promise<void>()};
  std::shared_future<void> done = queued.done.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(queued));
  }
  cv_.notify_one();
  return CommHandle(std::move(done));
}

void CommLane::run() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      task.fn();
    } catch (...) {
      error = std::current_exception();  // lands in the task's future
    }
    task.fn = nullptr;  // release what it captured before anyone is woken
    if (error) {
      task.done.set_exception(error);
    } else {
      task.done.set_value();
    }
  }
}

}  // namespace comm
}  // namespace fsdp2
