// Counters shared by the tiers; Store.stats() reports every one by name. `tasks_live` is a
// gauge: tasks the store still holds a result of (not fetched yet; a dump's persisted
// outcome is kept after wait() until wait_persisted() or until 65,536 newer ones finish).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ucm {

struct Counter {
    std::atomic<uint64_t> v{0};
    void add(uint64_t n = 1) { v.fetch_add(n, std::memory_order_relaxed); }
    void sub(uint64_t n) { v.fetch_sub(n, std::memory_order_relaxed); }
    void set(uint64_t n) { v.store(n, std::memory_order_relaxed); }
    uint64_t get() const { return v.load(std::memory_order_relaxed); }
};

#define UCM_COUNTERS(X)                                                                   \
    X(cache_bytes_written) X(cache_blocks_written) X(cache_bytes_read) X(cache_blocks_read) \
    X(cache_hits) X(cache_misses) X(cache_full)                                            \
    X(posix_bytes_written) X(posix_blocks_written) X(posix_bytes_read) X(posix_blocks_read) \
    X(posix_packs_written) X(posix_packs_read) X(posix_hits) X(posix_misses) X(posix_write_skipped) X(posix_write_errors)              \
    X(posix_read_errors) X(posix_read_estale) X(posix_read_enotconn) X(posix_read_eio)     \
    X(corrupt_blocks) X(quarantined_blocks)                                                \
    X(gc_runs) X(gc_removed_blocks) X(gc_removed_bytes) X(temps_reclaimed)                 \
    X(posix_used_bytes) X(lookup_keys) X(lookup_hits) X(dump_blocks) X(load_blocks)        \
    X(load_errors) X(dump_errors) X(persist_errors) X(job_errors) X(tasks_live)             \
    X(load_timeouts) X(load_late) X(dump_timeouts) X(dump_dropped)                         \
    X(lookup_errors) X(lookup_estale) X(lookup_enotconn) X(lookup_eio)

struct Counters {
#define UCM_DECLARE(name) Counter name;
    UCM_COUNTERS(UCM_DECLARE)
#undef UCM_DECLARE

    std::vector<std::pair<std::string, uint64_t>> snapshot() const {
        std::vector<std::pair<std::string, uint64_t>> out;
#define UCM_SNAP(name) out.emplace_back(#name, name.get());
        UCM_COUNTERS(UCM_SNAP)
#undef UCM_SNAP
        return out;
    }
};

}  // namespace ucm
