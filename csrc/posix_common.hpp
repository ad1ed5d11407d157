// Helpers shared by the Posix tier's block and pack files.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "aligned_buffer.hpp"
#include "checksum.hpp"
#include "io_util.hpp"

namespace ucm {

struct ConstSpan {
    const uint8_t* p;
    uint64_t n;
};

// One scratch buffer per I/O thread, reused across blocks: no allocation per block.
inline AlignedBuffer& scratch() {
    thread_local AlignedBuffer buf;
    return buf;
}

inline uint32_t crc_of(const std::vector<ConstSpan>& parts) {
    uint32_t crc = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
        uint32_t pc = crc32c(parts[i].p, parts[i].n);
        crc = i ? crc32c_combine(crc, pc, parts[i].n) : pc;
    }
    return crc;
}

// Sequence number for temp and quarantine names. It must be unique per process, not per
// store: two stores of one process writing the same key would otherwise both create
// "<key>.tmp.<host>.<pid>.0" and one would fail with EEXIST (the name is opened O_EXCL).
inline std::string unique_suffix() {
    static std::atomic<uint64_t> counter{0};
    return host_name() + "." + std::to_string(getpid()) + "." +
           std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
}

}  // namespace ucm
