// Test-only fault injection: makes the next N passes through a named point throw, so tests
// can prove that an exception inside a worker fails that block instead of killing the host
// process. Disarmed (the default) it costs one relaxed atomic load per block.
#pragma once

#include <atomic>
#include <stdexcept>
#include <string>

namespace ucm::fault {

enum class Site : int { PosixWrite = 0, PosixRead = 1, Count = 2 };

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

}  // namespace ucm::fault
