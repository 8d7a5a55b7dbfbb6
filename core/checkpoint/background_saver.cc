#include "core/checkpoint/background_saver.h"

#include <iostream>

namespace fsdp2 {
namespace checkpoint {
namespace {

std::mutex gate_mutex;
std::function<void()> gate;

}  // namespace

void BackgroundSaver::SetGateForTesting(std::function<void()> g) {
  std::lock_guard<std::mutex> lock(gate_mutex);
  gate = std::move(g);
}

BackgroundSaver::~BackgroundSaver() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "fsdp2: a background checkpoint save failed: " << e.what() << "\n";
  }
}

void BackgroundSaver::start(PendingWrite write) {
  wait();
  in_flight_ = true;
  thread_ = std::thread([this, write = std::move(write)] {
    try {
      std::function<void()> g;
      {
        std::lock_guard<std::mutex> lock(gate_mutex);
        g = gate;
      }
      if (g) g();
      write();
    } catch (...) {
      error_ = std::current_exception();
    }
    in_flight_ = false;
  });
}

void BackgroundSaver::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace checkpoint
}  // namespace fsdp2
