// An asynchronous batch operation: one outcome per block, and for dumps a second set of
// outcomes that says when each block reached the last tier (persisted).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ucm {

struct Outcomes {
    std::vector<uint8_t> ok;
    std::vector<std::string> errors;
};

class Task {
public:
    Task(uint64_t id, size_t blocks, bool track_persist);
    Task(const Task&) = delete;
    Task& operator=(const Task&) = delete;

    uint64_t id() const { return id_; }
    size_t blocks() const { return n_; }
    bool tracks_persist() const { return track_persist_; }

    // Each phase of a block is finished once: the first call records the outcome and returns
    // true, later calls return false and change nothing. That lets an error handler fail
    // "whatever is still open" of a block without knowing how far its job got.
    bool finish(size_t i, const std::string& error);
    bool finish_persist(size_t i, const std::string& error);

    // The caller's memory of block i may be touched only between begin_copy (true) and
    // end_copy. begin_copy is false once the block is finished or cancelled: a worker that
    // comes late (its read returned after the caller gave up) must leave that memory alone,
    // because the caller may have handed it to someone else. end_copy(i, err) finishes the
    // block with err; end_copy(i, std::nullopt) only ends the copy (the block stays open).
    bool begin_copy(size_t i);
    void end_copy(size_t i, const std::optional<std::string>& error);

    // Gives up on every block not finished yet, with `reason` as its error; waits only for
    // copies already in progress (memory to memory, never I/O), so that when it returns no
    // worker touches the caller's memory again. Returns how many blocks it gave up.
    size_t cancel(const std::string& reason);

    // Whether block i's outcome of that phase is still to be reported.
    bool open(size_t i) const { return !(phases_[i].load() & kDone); }
    bool copying(size_t i) const { return phases_[i].load() & kCopying; }
    bool persist_open(size_t i) const {
        return track_persist_ && !(phases_[i].load() & kPersisted);
    }

    bool done() const { return remaining_.load(std::memory_order_acquire) == 0; }
    bool persisted() const { return persist_remaining_.load(std::memory_order_acquire) == 0; }

    // false on timeout; timeout_ms < 0 waits forever.
    bool wait(long long timeout_ms);
    bool wait_persisted(long long timeout_ms);

    Outcomes result() const { return result_; }
    Outcomes persist_result() const { return persist_; }

private:
    enum : uint8_t { kDone = 1, kPersisted = 2, kCopying = 4 };
    bool record(size_t i, uint8_t phase, Outcomes& out, std::atomic<size_t>& remaining,
                const std::string& error);
    bool wait_on(const std::atomic<size_t>& counter, long long timeout_ms);
    void copy_counted_out();

    uint64_t id_;
    size_t n_;
    bool track_persist_;
    Outcomes result_, persist_;
    std::unique_ptr<std::atomic<uint8_t>[]> phases_;  // kDone | kPersisted bits per block
    std::atomic<size_t> remaining_, persist_remaining_;
    std::atomic<size_t> copying_{0};  // begin_copy attempts and copies not ended yet
    std::mutex mu_;
    std::condition_variable cv_;
};

}  // namespace ucm
