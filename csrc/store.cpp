#include "store.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>

#include "aligned_buffer.hpp"
#include "copy_out.hpp"
#include "posix_common.hpp"

namespace ucm {
namespace {

constexpr size_t kMaxPersistRecords = 65536;
// Counts a queued write out however it ends (an exception included).
struct PendingWrite {
    std::atomic<size_t>& n;
    ~PendingWrite() { n.fetch_sub(1); }
};

constexpr size_t kLookupChunk = 64;   // keys per unit of parallel lookup work
constexpr size_t kInlineLookup = 256;  // smaller batches are not worth a thread hop

// Runs fn(begin, end) over [0, n) in chunks on the pool and on the calling thread; chunks are
// handed out in increasing order so lookup_prefix can stop everyone at the first miss.
template <class Fn>
void parallel_chunks(ThreadPool& pool, size_t n, Fn fn) {
    struct Shared {
        std::atomic<size_t> next{0};
        std::mutex mu;
        std::condition_variable cv;
        unsigned running = 0;
        std::exception_ptr error;  // a helper's exception, rethrown on the calling thread
    };
    auto sh = std::make_shared<Shared>();
    auto work = [sh, n, &fn] {
        for (;;) {
            size_t b = sh->next.fetch_add(kLookupChunk);
            if (b >= n || !fn(b, std::min(n, b + kLookupChunk))) return;
        }
    };
    unsigned helpers = std::min<unsigned>(pool.size(), unsigned(n / kLookupChunk));
    sh->running = helpers;
    for (unsigned h = 0; h < helpers; ++h)
        pool.submit(
            [sh, work] {
                std::exception_ptr error;
                try {
                    work();
                } catch (...) {
                    error = std::current_exception();
                }
                // Always counted out, or the caller below would wait forever.
                std::lock_guard<std::mutex> lk(sh->mu);
                if (error && !sh->error) sh->error = error;
                if (--sh->running == 0) sh->cv.notify_all();
            },
            true);
    std::exception_ptr error;
    try {
        work();
    } catch (...) {
        error = std::current_exception();
    }
    // `fn` lives on this stack frame: every helper must be done with it before returning.
    std::unique_lock<std::mutex> lk(sh->mu);
    sh->cv.wait(lk, [&] { return sh->running == 0; });
    if (!error) error = sh->error;
    if (error) std::rethrow_exception(error);
}

}  // namespace

const std::string kGivenUp = "given up before it was stored (the caller's wait timed out)";

Store::Store(StoreConfig cfg) : cfg_(std::move(cfg)) {
    for (auto s : cfg_.shard_sizes) block_bytes_ += s;
    if (cfg_.shard_sizes.empty() || block_bytes_ == 0)
        throw std::invalid_argument("shard_sizes must list at least one shard of non-zero size");
    if (cfg_.cache) cache_ = std::make_unique<CacheTier>(cfg_.cache_bytes, block_bytes_,
                                                         cfg_.cache_prefault);
    if (cfg_.posix) {
        if (cfg_.posix_opts.backends.empty())
            throw std::invalid_argument("the Posix tier needs at least one storage backend");
        posix_ = std::make_unique<PosixTier>(cfg_.posix_opts, Layout(cfg_.shard_sizes), c_);
        io_pool_ = std::make_unique<ThreadPool>(cfg_.io_threads, "ucm-io");
        if (cfg_.io_prefault) prefault_io(Layout(cfg_.shard_sizes).file_size + kAlign);
    }
    if (cfg_.cache) copy_pool_ = std::make_unique<ThreadPool>(cfg_.copy_threads, "ucm-copy");
    // Writes waiting for the storage, past which a dump that finds the cache full is dropped:
    // as many as the cache has slots (they pin them), and room for a burst on a small cache.
    max_pending_writes_ = std::max<size_t>(cache_ ? cache_->slots() : 0, 64);
    lookup_pool_ = std::make_unique<ThreadPool>(cfg_.lookup_threads, "ucm-lookup");
}

Store::~Store() { close(); }

void Store::prefault_io(size_t bytes) {
    // One job per I/O thread: each waits until every thread holds one (so no thread takes
    // two), then reserves its buffer and touches every page of it. Open returns when all are
    // done: the first load finds them ready.
    struct Rendezvous {
        std::mutex mu;
        std::condition_variable cv;
        unsigned arrived = 0, done = 0;
    };
    auto rv = std::make_shared<Rendezvous>();
    const unsigned n = io_pool_->size();
    for (unsigned i = 0; i < n; ++i)
        io_pool_->submit([rv, n, bytes] {
            {
                std::unique_lock<std::mutex> lk(rv->mu);
                ++rv->arrived;
                rv->cv.notify_all();
                rv->cv.wait(lk, [&] { return rv->arrived == n; });
            }
            try {
                uint8_t* p = scratch().reserve(bytes);
                for (size_t off = 0; off < bytes; off += kAlign) p[off] = 0;
            } catch (const std::bad_alloc&) {
                // No memory for it now: the first read tries again, as without prefaulting.
            }
            std::lock_guard<std::mutex> lk(rv->mu);
            ++rv->done;
            rv->cv.notify_all();
        });
    std::unique_lock<std::mutex> lk(rv->mu);
    rv->cv.wait(lk, [&] { return rv->done == n; });
}

void Store::close() {
    if (closed_) return;
    flush(-1);
    // Copy jobs may still hand cache misses to the I/O pool, so drain them first.
    copy_pool_.reset();
    io_pool_.reset();
    lookup_pool_.reset();
    posix_.reset();
    cache_.reset();
    closed_ = true;
}

std::shared_ptr<Task> Store::new_task(size_t n, bool track_persist) {
    std::lock_guard<std::mutex> lk(tasks_mu_);
    auto t = std::make_shared<Task>(next_id_++, n, track_persist);
    tasks_.emplace(t->id(), t);
    c_.tasks_live.add();
    if (track_persist) {
        persist_.emplace(t->id(), t);
        for (auto it = persist_.begin(); persist_.size() > kMaxPersistRecords &&
                                         it != persist_.end();) {
            if (!it->second->persisted()) {
                ++it;
                continue;
            }
            uint64_t id = it->first;
            it = persist_.erase(it);
            forgotten_locked(id);
        }
    }
    return t;
}

void Store::forgotten_locked(uint64_t tid) {
    if (!tasks_.count(tid) && !persist_.count(tid)) c_.tasks_live.sub(1);
}

std::shared_ptr<Task> Store::find(uint64_t tid, bool persist_table) {
    std::lock_guard<std::mutex> lk(tasks_mu_);
    if (persist_table) {
        auto it = persist_.find(tid);
        if (it != persist_.end()) return it->second;
        throw std::out_of_range("no dump task " + std::to_string(tid) +
                                " awaiting a persisted result (unknown, a load, or already "
                                "fetched)");
    }
    auto it = tasks_.find(tid);
    if (it != tasks_.end()) return it->second;
    throw std::out_of_range("unknown task " + std::to_string(tid) +
                            " (never issued, or its result was already fetched)");
}

void Store::fail_block(const std::shared_ptr<Task>& t, size_t i, const std::string& what) {
    c_.job_errors.add();
    // A job that threw while it held the caller's memory lets go of it (it will not touch it
    // again), or a cancel would wait for it forever.
    if (t->copying(i)) t->end_copy(i, std::nullopt);
    const std::string err = "internal error: " + what;
    if (t->open(i)) {
        (t->tracks_persist() ? c_.dump_errors : c_.load_errors).add();
        t->finish(i, err);
    }
    persist_done(t, i, err);  // no-op for a load or a block whose persisted outcome is out
}

uint64_t Store::dump(const std::vector<Key>& keys, const Blocks& blocks_in,
                     const PackRefs& packs) {
    auto blocks = std::make_shared<const Blocks>(blocks_in);
    auto t = new_task(keys.size(), true);
    {
        std::lock_guard<std::mutex> lk(flush_mu_);
        pending_persist_ += keys.size();
    }
    c_.dump_blocks.add(keys.size());
    auto members = pack_groups(t, blocks, keys, packs, true);
    for (size_t i = 0; i < keys.size(); ++i) {
        Key key = keys[i];
        if (const Member& m = members[i]; m.group) {
            if (!cache_) {  // one job writes the whole group from the caller's memory
                if (m.pos == 0)
                    submit_block(*io_pool_, t, i, true, [this, g = m.group] { dump_group_direct(g); });
                continue;
            }
            submit_block(*copy_pool_, t, i, true, [this, t, i, key, blocks, m] {
                try {
                    dump_to_cache(t, i, key, (*blocks)[i], &m);
                } catch (...) {
                    member_ready(m, Source{});  // the group goes on without it
                    throw;
                }
            });
            continue;
        }
        if (cache_)
            submit_block(*copy_pool_, t, i, true,
                         [this, t, i, key, blocks] { dump_to_cache(t, i, key, (*blocks)[i]); });
        else
            submit_block(*io_pool_, t, i, true, [this, t, i, key, blocks] {
                dump_to_posix(t, i, key, (*blocks)[i], false);
            });
    }
    return t->id();
}

void Store::persist_done(const std::shared_ptr<Task>& t, size_t i, const std::string& err) {
    if (!t->persist_open(i)) return;  // a load, or already reported (see fail_block)
    if (!err.empty()) c_.persist_errors.add();
    t->finish_persist(i, err);
    std::lock_guard<std::mutex> lk(flush_mu_);
    if (--pending_persist_ == 0) flush_cv_.notify_all();
}

void Store::dump_to_cache(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                          const std::vector<Span>& shards, const Member* m) {
    // The caller's memory is read only under the claim; a dump given up (cancel) before its
    // turn reads nothing and is never persisted.
    if (!t->begin_copy(i)) {
        persist_done(t, i, kGivenUp);
        if (m) member_ready(*m, Source{});
        return;
    }
    uint32_t slot = 0;
    for (;;) {
        switch (cache_->reserve(key, &slot)) {
        case CacheTier::Reserve::Exists:
            if (cache_->pin_when_ready(key, &slot)) {
                dump_cached_copy(t, i, key, slot, m);
                return;
            }
            continue;  // the slot was given back or evicted meanwhile: claim one again
        case CacheTier::Reserve::Full:
            dump_around_full_cache(t, i, key, shards, m);
            return;
        case CacheTier::Reserve::Reserved:
            fill_slot(t, i, key, shards, slot, m);
            return;
        }
    }
}

void Store::dump_cached_copy(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                             uint32_t slot, const Member* m) {
    // The key is in DRAM (another dump or a load filled it; pin_when_ready waited for that
    // copy to complete), so this task's bytes are stored. Its persisted outcome must be its
    // own, though: the other dump's write-through may still be running, or may fail (disk
    // full, backend gone). So write the slot through again; the Posix tier skips it with one
    // stat() if the file is already there.
    t->end_copy(i, std::string());
    if (!posix_) {
        cache_->unpin(slot);
        persist_done(t, i, "pipeline has no persistent tier");
        return;
    }
    pending_writes_.fetch_add(1);
    if (m) {
        member_ready(*m, Source{Source::Kind::Slot, slot, nullptr});
        return;
    }
    submit_block(*io_pool_, t, i, false,
                 [this, t, i, key, slot] { write_through(t, i, key, slot); });
}

void Store::dump_around_full_cache(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                                   const std::vector<Span>& shards, const Member* m) {
    // Every slot is pinned by reads or pending write-throughs: write around the cache rather
    // than fail the block, from a copy the store owns, on the I/O pool. A copy thread never
    // sits in a write (the mount may stall), and the caller's memory is free once copied.
    c_.cache_full.add();
    std::string why = "cache full: every slot is in use";
    if (posix_) {
        size_t pending = pending_writes_.fetch_add(1);
        if (pending < max_pending_writes_) {
            auto owned = std::make_shared<AlignedBuffer>();
            uint8_t* dst = owned->reserve(block_bytes_);
            for (const auto& s : shards) {
                std::memcpy(dst, s.p, s.n);
                dst += s.n;
            }
            t->end_copy(i, std::nullopt);  // still open: stored once written
            if (m) {
                member_ready(*m, Source{Source::Kind::Owned, 0, owned});
                return;
            }
            submit_block(*io_pool_, t, i, false, [this, t, i, key, owned] {
                PendingWrite done{pending_writes_};
                std::string err = posix_->write(key, {{owned->reserve(block_bytes_), block_bytes_}});
                if (!err.empty()) c_.posix_write_errors.add();
                if (t->finish(i, err) && !err.empty()) c_.dump_errors.add();
                persist_done(t, i, err);
            });
            return;
        }
        // As many writes wait for the storage as the cache has slots: it is stalled or far
        // behind. Drop the block (a miss later) rather than queue without bound.
        pending_writes_.fetch_sub(1);
        c_.dump_dropped.add();
        why += " and " + std::to_string(pending) +
               " writes wait for the storage: block dropped, not stored";
    }
    c_.dump_errors.add();
    t->end_copy(i, why);
    persist_done(t, i, why);
    if (m) member_ready(*m, Source{});
}

void Store::fill_slot(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                      const std::vector<Span>& shards, uint32_t slot, const Member* m) {
    // Nothing between reserve() and commit() may throw: a slot left FILLING would stall
    // every later dump of this key in pin_when_ready.
    uint8_t* dst = cache_->data(slot);
    for (const auto& s : shards) {
        std::memcpy(dst, s.p, s.n);
        dst += s.n;
    }
    cache_->commit(slot, posix_ != nullptr);  // pinned until written through
    c_.cache_bytes_written.add(block_bytes_);
    c_.cache_blocks_written.add();
    t->end_copy(i, std::string());
    if (!posix_) {
        persist_done(t, i, "pipeline has no persistent tier");
        return;
    }
    pending_writes_.fetch_add(1);
    if (m) {
        member_ready(*m, Source{Source::Kind::Slot, slot, nullptr});
        return;
    }
    submit_block(*io_pool_, t, i, false,
                 [this, t, i, key, slot] { write_through(t, i, key, slot); });
}

void Store::write_through(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                          uint32_t slot) {
    // Unpinned however the write ends (an exception included), or the slot could never be
    // evicted again; and unpinned before the outcome is reported, so that a dump issued once
    // wait_persisted() returns finds the slot free (it went around a "full" cache before).
    struct Unpin {
        CacheTier& cache;
        uint32_t slot;
        ~Unpin() { cache.unpin(slot); }
    };
    PendingWrite done{pending_writes_};
    std::string err;
    {
        Unpin unpin{*cache_, slot};
        err = posix_->write(key, {{cache_->data(slot), block_bytes_}});
    }
    if (!err.empty()) c_.posix_write_errors.add();
    persist_done(t, i, err);
}

void Store::dump_to_posix(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                          const std::vector<Span>& shards, bool claimed) {
    // Without a cache the write reads the caller's memory itself, so the claim spans it: a
    // cancel waits for writes in flight (at most one per I/O thread) and skips the rest.
    if (!claimed && !t->begin_copy(i)) {
        persist_done(t, i, kGivenUp);
        return;
    }
    std::vector<ConstSpan> parts;
    parts.reserve(shards.size());
    for (const auto& s : shards) parts.push_back({s.p, s.n});
    std::string err = posix_->write(key, parts);
    if (!err.empty()) {
        c_.posix_write_errors.add();
        c_.dump_errors.add();
    }
    t->end_copy(i, err);
    persist_done(t, i, err);
}

uint64_t Store::load(const std::vector<Key>& keys, const Blocks& blocks_in,
                     const PackRefs& packs) {
    auto blocks = std::make_shared<const Blocks>(blocks_in);
    auto t = new_task(keys.size(), false);
    c_.load_blocks.add(keys.size());
    auto members = pack_groups(t, blocks, keys, packs, false);
    for (size_t i = 0; i < keys.size(); ++i) {
        Key key = keys[i];
        if (const Member& m = members[i]; m.group) {
            if (!cache_) {  // every block is a miss: one job reads the group's blocks
                if (m.pos == 0)
                    submit_block(*io_pool_, t, i, true, [this, g = m.group] { read_group(g); });
                continue;
            }
            submit_block(*copy_pool_, t, i, true, [this, t, i, key, blocks, m] {
                try {
                    load_one(t, i, key, (*blocks)[i], &m);
                } catch (...) {
                    member_checked(m, false);  // failed by the caller of this job
                    throw;
                }
            });
            continue;
        }
        if (cache_)
            submit_block(*copy_pool_, t, i, true,
                         [this, t, i, key, blocks] { load_one(t, i, key, (*blocks)[i]); });
        else
            submit_block(*io_pool_, t, i, true,
                         [this, t, i, key, blocks] { load_from_posix(t, i, key, (*blocks)[i]); });
    }
    return t->id();
}

void Store::load_one(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                     const std::vector<Span>& shards, const Member* m) {
    if (!t->open(i)) {  // given up before its turn: nothing to read, nowhere to put it
        if (m) member_checked(*m, false);
        return;
    }
    uint32_t slot = 0;
    if (cache_->pin(key, &slot)) {
        if (t->begin_copy(i)) {
            scatter_out(shards, cache_->data(slot));
            c_.cache_hits.add();
            c_.cache_bytes_read.add(block_bytes_);
            c_.cache_blocks_read.add();
            t->end_copy(i, std::string());
        }
        cache_->unpin(slot);
        if (m) member_checked(*m, false);
        return;
    }
    c_.cache_misses.add();
    if (!posix_) {
        if (t->finish(i, "not found")) c_.load_errors.add();
        return;
    }
    if (m) {
        member_checked(*m, true);  // read with the rest of its pack
        return;
    }
    // Hand over to the I/O pool: a copy thread must never sit in a disk read.
    auto shards_copy = shards;
    submit_block(*io_pool_, t, i, true,
                 [this, t, i, key, shards_copy] { load_from_posix(t, i, key, shards_copy); });
}

void Store::scatter_out(const std::vector<Span>& shards, const uint8_t* payload) const {
    for (const auto& s : shards) {
        copy_out(s.p, payload, s.n, block_bytes_);
        payload += s.n;
    }
}

void Store::load_from_posix(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                            const std::vector<Span>& shards) {
    if (!t->open(i)) return;  // given up while queued (a stalled mount): do not add a read to it
    std::string reason;
    bool copied = false;
    // The read lands in the I/O thread's own buffer; the caller's memory is written only if
    // the block is still wanted (a read that returns after a cancel leaves it alone).
    auto deliver = [&](const uint8_t* payload) {
        if (t->begin_copy(i)) {
            copied = true;
            scatter_out(shards, payload);
        }
        uint32_t slot = 0;
        if (cache_ && cfg_.cache_on_load &&
            cache_->reserve(key, &slot) == CacheTier::Reserve::Reserved) {
            std::memcpy(cache_->data(slot), payload, block_bytes_);
            cache_->commit(slot, false);
            c_.cache_bytes_written.add(block_bytes_);
            c_.cache_blocks_written.add();
        }
    };
    int err = 0;
    auto outcome = posix_->read(key, deliver, &reason, &err);
    count_read(outcome, err);
    if (outcome == PosixTier::Read::Ok) {
        if (copied) t->end_copy(i, std::string());
        else c_.load_late.add();  // came back after the caller gave up: the cache has it now
        return;
    }
    if (outcome == PosixTier::Read::Corrupt) reason = "corrupt block, moved aside: " + reason;
    if (t->finish(i, reason)) c_.load_errors.add();
}

std::vector<bool> Store::lookup(const std::vector<Key>& keys, int tier, const PackRefs& packs) {
    std::vector<uint8_t> hit(keys.size(), 0);
    PackMemo memo;
    auto probe = [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
            bool h = false;
            if (cache_ && tier != 2) h = cache_->contains(keys[i]);
            if (!h && posix_ && tier != 1 && i < packs.size() && packs[i].set)
                h = in_pack(memo, packs[i], keys[i]);
            if (!h && posix_ && tier != 1) h = posix_->exists(keys[i]);
            hit[i] = h;
        }
        return true;
    };
    if (keys.size() <= kInlineLookup) probe(0, keys.size());
    else parallel_chunks(*lookup_pool_, keys.size(), probe);
    size_t hits = 0;
    for (auto h : hit) hits += h;
    c_.lookup_keys.add(keys.size());
    c_.lookup_hits.add(hits);
    return std::vector<bool>(hit.begin(), hit.end());
}

size_t Store::lookup_prefix(const std::vector<Key>& keys, const PackRefs& packs) {
    std::atomic<size_t> first_miss{keys.size()};
    PackMemo memo;
    auto probe = [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
            if (i >= first_miss.load(std::memory_order_relaxed)) return false;
            bool h = (cache_ && cache_->contains(keys[i])) ||
                     (posix_ && i < packs.size() && packs[i].set && in_pack(memo, packs[i], keys[i])) ||
                     (posix_ && posix_->exists(keys[i]));
            if (!h) {
                size_t cur = first_miss.load();
                while (i < cur && !first_miss.compare_exchange_weak(cur, i)) {
                }
                return false;
            }
        }
        return true;
    };
    if (keys.size() <= kInlineLookup) probe(0, keys.size());
    else parallel_chunks(*lookup_pool_, keys.size(), probe);
    size_t n = first_miss.load();
    c_.lookup_keys.add(n + (n < keys.size() ? 1 : 0));
    c_.lookup_hits.add(n);
    return n;
}

std::optional<Outcomes> Store::wait(uint64_t tid, long long timeout_ms, bool consume) {
    auto t = find(tid, false);
    if (!t->wait(timeout_ms)) return std::nullopt;
    if (consume) {
        std::lock_guard<std::mutex> lk(tasks_mu_);
        if (tasks_.erase(tid)) forgotten_locked(tid);
    }
    return t->result();
}

std::optional<Outcomes> Store::wait_persisted(uint64_t tid, long long timeout_ms) {
    auto t = find(tid, true);
    if (!t->wait_persisted(timeout_ms)) return std::nullopt;
    {
        // Persisted implies stored (every block finishes its memory phase first), so this is
        // the task's last word: forget it in both tables, or a caller that only ever asks
        // wait_persisted (the connector's wait_persisted mode) would leak every task.
        std::lock_guard<std::mutex> lk(tasks_mu_);
        if (persist_.erase(tid) + tasks_.erase(tid) > 0) forgotten_locked(tid);
    }
    return t->persist_result();
}

std::optional<Outcomes> Store::cancel(uint64_t tid, const std::string& reason) {
    auto t = find(tid, false);
    size_t n = t->cancel(reason);
    (t->tracks_persist() ? c_.dump_timeouts : c_.load_timeouts).add(n);
    (t->tracks_persist() ? c_.dump_errors : c_.load_errors).add(n);
    {
        std::lock_guard<std::mutex> lk(tasks_mu_);
        if (tasks_.erase(tid)) forgotten_locked(tid);
    }
    return t->result();
}

bool Store::flush(long long timeout_ms) {
    std::unique_lock<std::mutex> lk(flush_mu_);
    auto idle = [this] { return pending_persist_ == 0; };
    if (timeout_ms < 0) {
        flush_cv_.wait(lk, idle);
        return true;
    }
    return flush_cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), idle);
}

namespace {
PosixTier& need_posix(const std::unique_ptr<PosixTier>& p) {
    if (!p) throw std::invalid_argument("packs need the Posix tier");
    return *p;
}
}  // namespace

std::pair<std::string, uint32_t> Store::write_pack(const std::vector<Key>& keys,
                                                   const Blocks& blocks) {
    if (keys.empty() || keys.size() > kMaxPackBlocks)
        throw std::invalid_argument("a pack holds 1 to " + std::to_string(kMaxPackBlocks) +
                                    " blocks, not " + std::to_string(keys.size()));
    std::vector<std::vector<ConstSpan>> parts(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i)
        for (const auto& s : blocks[i]) parts[i].push_back({s.p, s.n});
    auto w = need_posix(posix_).write_pack(keys, parts);
    if (!w.err.empty()) c_.posix_write_errors.add();
    return {w.err, w.held};
}

uint32_t Store::pack_prefix(const std::vector<Key>& keys) {
    std::vector<Key> held;
    if (keys.empty() || !need_posix(posix_).pack_keys(keys[0], &held)) return 0;
    return leading_match(held, keys);
}

std::vector<std::string> Store::read_pack(const std::vector<Key>& keys, uint32_t begin,
                                          uint32_t end, const Blocks& blocks) {
    if (begin > end || end > keys.size() || blocks.size() != end - begin)
        throw std::invalid_argument("read_pack: blocks [begin, end) of the keys, one buffer each");
    std::vector<PosixTier::PackEntry> wanted;
    for (uint32_t j = begin; j < end; ++j) wanted.emplace_back(j, keys[j]);
    auto deliver = [&](size_t w, const uint8_t* payload) { scatter_out(blocks[w], payload); };
    auto r = need_posix(posix_).read_pack(keys.empty() ? Key{} : keys[0], wanted, deliver);
    for (size_t i = 0; i < r.outcome.size(); ++i) {
        if (r.outcome[i] == PosixTier::Read::Corrupt)
            r.reasons[i] = "corrupt block, pack moved aside: " + r.reasons[i];
        count_read(r.outcome[i], r.err);
    }
    return r.reasons;
}

void Store::count_read(PosixTier::Read outcome, int err) {
    switch (outcome) {
    case PosixTier::Read::Ok: c_.posix_hits.add(); break;
    case PosixTier::Read::Missing: c_.posix_misses.add(); break;
    case PosixTier::Read::Corrupt: c_.posix_read_errors.add(); break;
    case PosixTier::Read::Error:
        c_.posix_read_errors.add();
        // the kinds a network filesystem gives: a handle gone stale, the server gone, an I/O error
        if (err == ESTALE) c_.posix_read_estale.add();
        else if (err == ENOTCONN) c_.posix_read_enotconn.add();
        else if (err == EIO) c_.posix_read_eio.add();
        break;
    }
}

GcReport Store::collect_garbage() { return posix_ ? posix_->collect() : GcReport{}; }

std::vector<std::pair<std::string, uint64_t>> Store::stats() const {
    auto out = c_.snapshot();
    if (cache_) {
        out.emplace_back("cache_evictions", cache_->evictions());
        out.emplace_back("cache_resident_blocks", cache_->resident());
        out.emplace_back("cache_slots", cache_->slots());
    }
    return out;
}

std::vector<std::string> Store::notes() const {
    return posix_ ? posix_->notes() : std::vector<std::string>{};
}

std::vector<bool> Store::direct_io() const {
    return posix_ ? posix_->direct_per_backend() : std::vector<bool>{};
}

}  // namespace ucm
