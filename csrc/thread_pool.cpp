#include "thread_pool.hpp"

#include <pthread.h>

#include <cstdio>
#include <exception>

namespace ucm {

ThreadPool::ThreadPool(unsigned threads, std::string name) : name_(std::move(name)) {
    if (threads == 0) threads = 1;
    for (unsigned i = 0; i < threads; ++i) {
        workers_.emplace_back([this] { run(); });
        // Named threads make `top -H` and perf output readable on a serving node.
        pthread_setname_np(workers_.back().native_handle(), name_.substr(0, 15).c_str());
    }
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::submit(std::function<void()> job, bool urgent) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        (urgent ? urgent_ : background_).push_back(std::move(job));
    }
    cv_.notify_one();
}

void ThreadPool::run() {
    for (;;) {
        std::function<void()> job;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [this] { return stopping_ || !urgent_.empty() || !background_.empty(); });
            auto& q = !urgent_.empty() ? urgent_ : background_;
            if (q.empty()) return;  // stopping and drained
            job = std::move(q.front());
            q.pop_front();
        }
        run_job(job);
    }
}

void ThreadPool::run_job(const std::function<void()>& job) {
    // An exception escaping a std::thread calls std::terminate, which would take the whole
    // serving process down. Store jobs catch their own errors and fail their block (see
    // Store::guarded); this is the last resort for anything else: say so and keep serving.
    try {
        job();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ucm_store: %s worker: uncaught exception: %s\n", name_.c_str(),
                     e.what());
    } catch (...) {
        std::fprintf(stderr, "ucm_store: %s worker: uncaught non-standard exception\n",
                     name_.c_str());
    }
}

}  // namespace ucm
