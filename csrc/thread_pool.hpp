// Fixed-size worker pool with two queues: urgent work (loads a request waits for) runs before
// background work (write-through), so persistence never delays a forward pass.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ucm {

class ThreadPool {
public:
    ThreadPool(unsigned threads, std::string name);
    ~ThreadPool();  // runs every queued job, then joins
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    void submit(std::function<void()> job, bool urgent = false);
    unsigned size() const { return static_cast<unsigned>(workers_.size()); }

private:
    void run();
    void run_job(const std::function<void()>& job);

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> urgent_, background_;
    bool stopping_ = false;
    std::vector<std::thread> workers_;
    std::string name_;
};

}  // namespace ucm
