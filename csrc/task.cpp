#include "task.hpp"

namespace ucm {

Task::Task(uint64_t id, size_t blocks, bool track_persist)
    : id_(id),
      n_(blocks),
      track_persist_(track_persist),
      phases_(new std::atomic<uint8_t>[blocks]()),
      remaining_(blocks),
      persist_remaining_(track_persist ? blocks : 0) {
    result_.ok.assign(blocks, 0);
    result_.errors.assign(blocks, std::string());
    if (track_persist) {
        persist_.ok.assign(blocks, 0);
        persist_.errors.assign(blocks, std::string());
    }
}

bool Task::record(size_t i, uint8_t phase, Outcomes& out, std::atomic<size_t>& remaining,
                  const std::string& error) {
    if (phases_[i].fetch_or(phase, std::memory_order_relaxed) & phase) return false;
    out.ok[i] = error.empty();
    out.errors[i] = error;
    // acq_rel: the last finisher's wake-up publishes every other block's outcome too.
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(mu_);
        cv_.notify_all();
    }
    return true;
}

bool Task::finish(size_t i, const std::string& error) {
    return record(i, kDone, result_, remaining_, error);
}

bool Task::finish_persist(size_t i, const std::string& error) {
    return track_persist_ && record(i, kPersisted, persist_, persist_remaining_, error);
}

bool Task::begin_copy(size_t i) {
    // Counted in before the claim is taken: a cancel that sees no claim on this block then
    // still waits until this attempt has either failed or finished its copy.
    copying_.fetch_add(1, std::memory_order_acq_rel);
    uint8_t cur = phases_[i].load(std::memory_order_acquire);
    for (;;) {
        if (cur & (kDone | kCopying)) {
            copy_counted_out();
            return false;
        }
        if (phases_[i].compare_exchange_weak(cur, cur | kCopying, std::memory_order_acq_rel))
            return true;
    }
}

void Task::end_copy(size_t i, const std::optional<std::string>& error) {
    if (error) record(i, kDone, result_, remaining_, *error);
    phases_[i].fetch_and(uint8_t(~kCopying), std::memory_order_acq_rel);
    copy_counted_out();
}

void Task::copy_counted_out() {
    if (copying_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(mu_);
        cv_.notify_all();
    }
}

size_t Task::cancel(const std::string& reason) {
    size_t given_up = 0;
    for (size_t i = 0; i < n_; ++i) {
        uint8_t cur = phases_[i].load(std::memory_order_acquire);
        for (;;) {
            if (cur & (kDone | kCopying)) break;  // finished, or finishing a memory copy now
            // Marked done before its outcome is written, like record(): nobody else writes it.
            if (phases_[i].compare_exchange_weak(cur, cur | kDone, std::memory_order_acq_rel)) {
                result_.ok[i] = 0;
                result_.errors[i] = reason;
                remaining_.fetch_sub(1, std::memory_order_acq_rel);
                ++given_up;
                break;
            }
        }
    }
    std::unique_lock<std::mutex> lk(mu_);
    cv_.notify_all();
    // A copy in progress is a memcpy of one block: it ends (and finishes its block) shortly.
    cv_.wait(lk, [&] { return copying_.load(std::memory_order_acquire) == 0; });
    return given_up;
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
