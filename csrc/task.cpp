#include "task.hpp"

namespace ucm {

Task::Task(uint64_t id, size_t blocks, bool track_persist)
    : id_(id), n_(blocks), remaining_(blocks), persist_remaining_(track_persist ? blocks : 0) {
    result_.ok.assign(blocks, 0);
    result_.errors.assign(blocks, std::string());
    if (track_persist) {
        persist_.ok.assign(blocks, 0);
        persist_.errors.assign(blocks, std::string());
    }
}

void Task::finish(size_t i, const std::string& error) {
    result_.ok[i] = error.empty();
    result_.errors[i] = error;
    // acq_rel: the last finisher's wake-up publishes every other block's outcome too.
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(mu_);
        cv_.notify_all();
    }
}

void Task::finish_persist(size_t i, const std::string& error) {
    persist_.ok[i] = error.empty();
    persist_.errors[i] = error;
    if (persist_remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(mu_);
        cv_.notify_all();
    }
}

bool Task::wait_on(const std::atomic<size_t>& counter, long long timeout_ms) {
    std::unique_lock<std::mutex> lk(mu_);
    auto pred = [&] { return counter.load(std::memory_order_acquire) == 0; };
    if (timeout_ms < 0) {
        cv_.wait(lk, pred);
        return true;
    }
    return cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), pred);
}

bool Task::wait(long long timeout_ms) { return wait_on(remaining_, timeout_ms); }
bool Task::wait_persisted(long long timeout_ms) { return wait_on(persist_remaining_, timeout_ms); }

}  // namespace ucm
