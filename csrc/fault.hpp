// Test-only fault injection: makes the next N passes through a named point throw (or stall),
// so tests can prove that an exception inside a worker fails that block instead of killing the host
// process. Disarmed (the default) it costs one relaxed atomic load per block.
#pragma once

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

namespace ucm::fault {

enum class Site : int { PosixWrite = 0, PosixRead = 1, PosixStat = 2, Count = 3 };

inline std::atomic<int>& armed(Site s) {
    static std::atomic<int> counts[int(Site::Count)];
    return counts[int(s)];
}

inline void arm(Site s, int times) { armed(s).store(times); }

inline void point(Site s, const char* name) {
    auto& n = armed(s);
    if (n.load(std::memory_order_relaxed) <= 0) return;
    if (n.fetch_sub(1) > 0) throw std::runtime_error(std::string("injected fault at ") + name);
    n.fetch_add(1);  // raced past zero with another thread: undo
}

// Stalls: the next N passes through a point sleep for a set time first, as a call into a
// network filesystem that stopped answering does (the I/O itself then happens, late).
// Disarming (ms 0) is the mount answering again: the calls stalled in it return at once, so
// a test can hold a stall as long as it needs and end it when it chooses, not by a timer.
struct Stall {
    std::atomic<int> times{0};
    std::atomic<int> ms{0};
};

inline Stall& stall_of(Site s) {
    static Stall stalls[int(Site::Count)];
    return stalls[int(s)];
}

inline void arm_stall(Site s, int times, int ms) {
    stall_of(s).ms.store(ms);
    stall_of(s).times.store(times);
}

inline void stall(Site s) {
    auto& st = stall_of(s);
    if (st.times.load(std::memory_order_relaxed) <= 0) return;
    if (st.times.fetch_sub(1) > 0) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(st.ms.load());
        while (st.ms.load() > 0 && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
    }
    st.times.fetch_add(1);
}

}  // namespace ucm::fault
