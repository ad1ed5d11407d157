// The DRAM tier: one buffer of fixed-size block slots with least-recently-used eviction.
//
// A slot is FILLING while a dump or a load copies into it (invisible to readers), then READY.
// Pins keep a slot from eviction while someone copies out of it or the write-through to the
// next tier still reads it, so a block is never evicted before it is persisted.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "key.hpp"

namespace ucm {

class CacheTier {
public:
    CacheTier(uint64_t capacity_bytes, uint64_t block_bytes, bool prefault);
    ~CacheTier();
    CacheTier(const CacheTier&) = delete;
    CacheTier& operator=(const CacheTier&) = delete;

    enum class Reserve { Reserved, Exists, Full };
    // Claims a slot for `key` (evicting the least recently used unpinned block if needed).
    Reserve reserve(const Key& key, uint32_t* slot);
    // Makes a reserved slot readable; with `pin` it stays pinned for the caller.
    void commit(uint32_t slot, bool pin);
    // Gives a reserved slot back (the copy into it failed).
    void abort(uint32_t slot);

    // Pins a READY block for reading and marks it most recently used; false on a miss.
    bool pin(const Key& key, uint32_t* slot);
    // Like pin, but if the key's slot is still FILLING, waits until it is committed (true,
    // pinned) or given back (false). Fillers hold a slot only for one memcpy, never across
    // I/O or another wait, so the wait is short and cannot deadlock.
    bool pin_when_ready(const Key& key, uint32_t* slot);
    void unpin(uint32_t slot);

    bool contains(const Key& key);
    uint8_t* data(uint32_t slot) const { return base_ + uint64_t(slot) * stride_; }
    uint64_t block_bytes() const { return block_bytes_; }
    uint32_t slots() const { return nslots_; }
    uint64_t evictions() const;
    uint64_t resident() const;

private:
    struct Slot {
        Key key;
        uint32_t pins = 0;
        bool used = false;
        bool ready = false;
        std::list<uint32_t>::iterator lru;  // valid when ready
    };
    bool evict_one();  // with mu_ held
    void pin_locked(uint32_t slot);

    uint8_t* base_ = nullptr;
    uint64_t map_bytes_ = 0, block_bytes_, stride_;
    uint32_t nslots_;
    mutable std::mutex mu_;
    std::condition_variable filled_;  // a FILLING slot was committed or given back
    std::vector<Slot> slots_;
    std::vector<uint32_t> free_;
    std::list<uint32_t> lru_;  // front = most recently used, READY slots only
    std::unordered_map<Key, uint32_t, KeyHash> index_;
    uint64_t evictions_ = 0;
};

}  // namespace ucm
