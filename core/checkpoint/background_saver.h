// fsdp2/core/checkpoint/background_saver.h
//
// Background checkpoint saves. A save is split in two: its collective part
// (checking the target, gathering tensor-parallel and full tensors) runs on
// the training thread and copies this rank's tensors into a staging buffer
// (CPU tensors no training step touches); what is left is writing files, a
// PendingWrite that needs no process group (rank 0 learns that the other
// ranks' files are complete from their atomic appearance in DIR.tmp), so it
// never interleaves with training collectives. BackgroundSaver runs one
// PendingWrite at a time on its own thread.
#ifndef FSDP2_CORE_CHECKPOINT_BACKGROUND_SAVER_H_
#define FSDP2_CORE_CHECKPOINT_BACKGROUND_SAVER_H_

#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace fsdp2 {
namespace checkpoint {

// Writes this rank's part of a staged checkpoint; on rank 0 it also waits
// for the other ranks' files and swaps the directory in.
using PendingWrite = std::function<void()>;

class BackgroundSaver {
 public:
  BackgroundSaver() = default;
  // Waits for a save in flight; an error it had is printed to stderr.
  ~BackgroundSaver();
  BackgroundSaver(const BackgroundSaver&) = delete;
  BackgroundSaver& operator=(const BackgroundSaver&) = delete;

  // Waits for the save in flight (at most one: rethrows its error), then
  // runs `write` on a background thread.
  void start(PendingWrite write);
  // Waits for the save in flight, if any; rethrows the error it had.
  void wait();
  // Whether a save is still being written.
  bool in_flight() const { return in_flight_.load(); }

  // Tests only: `gate` runs on the background thread before each write (a
  // test holds the write there until training steps have run).
  static void SetGateForTesting(std::function<void()> gate);

 private:
  std::thread thread_;
  std::exception_ptr error_;
  std::atomic<bool> in_flight_{false};
};

}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_BACKGROUND_SAVER_H_
