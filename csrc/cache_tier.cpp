#include "cache_tier.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <stdexcept>

#include "aligned_buffer.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace ucm {

CacheTier::CacheTier(uint64_t capacity_bytes, uint64_t block_bytes, bool prefault)
    : block_bytes_(block_bytes), stride_(align_up(block_bytes)) {
    uint64_t n = stride_ ? capacity_bytes / stride_ : 0;
    if (n == 0)
        throw std::invalid_argument("cache capacity of " + std::to_string(capacity_bytes) +
                                    " bytes holds no block of " + std::to_string(block_bytes) +
                                    " bytes");
    if (n > 0xfffffff0ULL) n = 0xfffffff0ULL;
    nslots_ = static_cast<uint32_t>(n);
    map_bytes_ = align_up(nslots_ * stride_, 2u << 20);
    void* p = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        throw std::runtime_error("cannot map the cache buffer of " + std::to_string(map_bytes_) +
                                 " bytes: " + std::strerror(errno));
    base_ = static_cast<uint8_t*>(p);
    // Huge pages halve the TLB misses of multi-MiB copies. Faulting every page in now keeps
    // first-touch page faults (upstream's dump bottleneck) out of the dump path.
    madvise(base_, map_bytes_, MADV_HUGEPAGE);
    if (prefault && madvise(base_, map_bytes_, MADV_POPULATE_WRITE) != 0) {
        for (uint64_t off = 0; off < map_bytes_; off += kAlign) base_[off] = 0;
    }
    slots_.resize(nslots_);
    free_.reserve(nslots_);
    for (uint32_t i = nslots_; i > 0; --i) free_.push_back(i - 1);
    index_.reserve(nslots_);
}

CacheTier::~CacheTier() {
    if (base_) munmap(base_, map_bytes_);
}

bool CacheTier::evict_one() {
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
        Slot& s = slots_[*it];
        if (s.pins) continue;
        uint32_t idx = *it;
        index_.erase(s.key);
        lru_.erase(std::next(it).base());
        s.used = s.ready = false;
        free_.push_back(idx);
        ++evictions_;
        return true;
    }
    return false;
}

CacheTier::Reserve CacheTier::reserve(const Key& key, uint32_t* slot) {
    std::lock_guard<std::mutex> lk(mu_);
    if (index_.count(key)) return Reserve::Exists;
    if (free_.empty() && !evict_one()) return Reserve::Full;
    uint32_t idx = free_.back();
    free_.pop_back();
    Slot& s = slots_[idx];
    s.key = key;
    s.used = true;
    s.ready = false;
    s.pins = 0;
    index_.emplace(key, idx);
    *slot = idx;
    return Reserve::Reserved;
}

void CacheTier::commit(uint32_t slot, bool pin) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        Slot& s = slots_[slot];
        s.ready = true;
        if (pin) ++s.pins;
        lru_.push_front(slot);
        s.lru = lru_.begin();
    }
    filled_.notify_all();
}

void CacheTier::abort(uint32_t slot) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        Slot& s = slots_[slot];
        index_.erase(s.key);
        s.used = s.ready = false;
        free_.push_back(slot);
    }
    filled_.notify_all();
}

void CacheTier::pin_locked(uint32_t slot) {
    Slot& s = slots_[slot];
    ++s.pins;
    lru_.splice(lru_.begin(), lru_, s.lru);
}

bool CacheTier::pin(const Key& key, uint32_t* slot) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(key);
    if (it == index_.end() || !slots_[it->second].ready) return false;
    pin_locked(it->second);
    *slot = it->second;
    return true;
}

bool CacheTier::pin_when_ready(const Key& key, uint32_t* slot) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        auto it = index_.find(key);
        if (it == index_.end()) return false;
        if (slots_[it->second].ready) {
            pin_locked(it->second);
            *slot = it->second;
            return true;
        }
        filled_.wait(lk);
    }
}

void CacheTier::unpin(uint32_t slot) {
    std::lock_guard<std::mutex> lk(mu_);
    --slots_[slot].pins;
}

bool CacheTier::contains(const Key& key) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(key);
    return it != index_.end() && slots_[it->second].ready;
}

uint64_t CacheTier::evictions() const {
    std::lock_guard<std::mutex> lk(mu_);
    return evictions_;
}

uint64_t CacheTier::resident() const {
    std::lock_guard<std::mutex> lk(mu_);
    return lru_.size();
}

}  // namespace ucm
