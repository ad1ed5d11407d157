// An asynchronous batch operation: one outcome per block, and for dumps a second set of
// outcomes that says when each block reached the last tier (persisted).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
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

    uint64_t id() const { return id_; }
    size_t blocks() const { return n_; }

    // Each block index is finished exactly once per phase, by exactly one thread.
    void finish(size_t i, const std::string& error);
    void finish_persist(size_t i, const std::string& error);

    bool done() const { return remaining_.load(std::memory_order_acquire) == 0; }
    bool persisted() const { return persist_remaining_.load(std::memory_order_acquire) == 0; }

    // false on timeout; timeout_ms < 0 waits forever.
    bool wait(long long timeout_ms);
    bool wait_persisted(long long timeout_ms);

    Outcomes result() const { return result_; }
    Outcomes persist_result() const { return persist_; }

private:
    bool wait_on(const std::atomic<size_t>& counter, long long timeout_ms);

    uint64_t id_;
    size_t n_;
    Outcomes result_, persist_;
    std::atomic<size_t> remaining_, persist_remaining_;
    std::mutex mu_;
    std::condition_variable cv_;
};

}  // namespace ucm
