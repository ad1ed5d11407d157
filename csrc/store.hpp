// The tier pipeline: `Cache|Posix` (DRAM in front, written through in the background),
// `Posix`, or `Cache` alone. Every operation is a batch that returns a task id at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "aligned_buffer.hpp"
#include "cache_tier.hpp"
#include "key.hpp"
#include "posix_tier.hpp"
#include "stats.hpp"
#include "task.hpp"
#include "thread_pool.hpp"

namespace ucm {

struct Span {
    uint8_t* p;
    uint64_t n;
};

using Blocks = std::vector<std::vector<Span>>;

// The error of a dumped block given up (cancelled) before it was stored.
extern const std::string kGivenUp;

// Where a block sits in a pack (posix_tier.hpp): the key of the pack's first block and the
// block's index there. A dump writes the blocks of one head with indices 0, 1, 2... as one
// pack; a load or lookup looks for a block in its pack first, then in a file of its own.
struct PackRef {
    Key head;
    uint32_t index = 0;
    bool set = false;
};
using PackRefs = std::vector<PackRef>;  // empty, or one per key

struct StoreConfig {
    bool cache = true;
    bool posix = true;
    uint64_t cache_bytes = 0;
    bool cache_prefault = true;
    bool cache_on_load = true;  // a Posix hit is copied into the cache for the next load
    PosixOptions posix_opts;
    std::vector<uint64_t> shard_sizes;
    unsigned copy_threads = 2;
    unsigned io_threads = 8;
    unsigned lookup_threads = 2;
    // Fault in each I/O thread's read buffer (a block file's bytes, huge pages) when the store
    // opens, so the first loads do not pay for it (measured ~0.2 s for 8 threads of 16 MiB
    // blocks: huge-page faults compact memory). Off for a store that only looks up.
    bool io_prefault = true;
};

class Store {
public:
    explicit Store(StoreConfig cfg);
    ~Store();  // close()

    // Blocks are validated by the binding: blocks[i].size() == shard count, sizes match.
    uint64_t dump(const std::vector<Key>& keys, const Blocks& blocks, const PackRefs& packs = {});
    uint64_t load(const std::vector<Key>& keys, const Blocks& blocks, const PackRefs& packs = {});

    // tier: 0 = any, 1 = cache only, 2 = posix only
    std::vector<bool> lookup(const std::vector<Key>& keys, int tier, const PackRefs& packs = {});
    size_t lookup_prefix(const std::vector<Key>& keys, const PackRefs& packs = {});

    // nullopt = timed out; throws std::out_of_range for an unknown or collected task.
    // wait() hands out the in-memory outcome; a dump's persisted outcome stays available.
    // wait_persisted() hands out a dump's last outcome and forgets the task entirely (a
    // block is persisted only after it was stored, so nothing is left to wait for).
    std::optional<Outcomes> wait(uint64_t tid, long long timeout_ms, bool consume = true);
    std::optional<Outcomes> wait_persisted(uint64_t tid, long long timeout_ms);
    // Gives up on every block of `tid` not finished yet (each fails with `reason`) and returns
    // the task's outcome, as wait() would. When it returns, no worker reads or writes the
    // caller's memory of that task again: a read that completes later goes to the cache only.
    std::optional<Outcomes> cancel(uint64_t tid, const std::string& reason);
    bool flush(long long timeout_ms);
    GcReport collect_garbage();

    // Packs, called synchronously on the caller's thread (see PosixTier): not yet part of
    // the task pipeline. write_pack: "" and how many leading blocks the pack on disk holds.
    std::pair<std::string, uint32_t> write_pack(const std::vector<Key>& keys, const Blocks& blocks);
    uint32_t pack_prefix(const std::vector<Key>& keys);
    // Loads blocks [begin, end) of the pack of keys[0] into blocks[j - begin]; the reason
    // per block ("" when loaded).
    std::vector<std::string> read_pack(const std::vector<Key>& keys, uint32_t begin,
                                       uint32_t end, const Blocks& blocks);

    std::vector<std::pair<std::string, uint64_t>> stats() const;
    std::vector<std::string> notes() const;
    std::vector<bool> direct_io() const;
    uint64_t block_bytes() const { return block_bytes_; }
    void close();
    bool closed() const { return closed_; }

private:
    void prefault_io(size_t bytes);  // see StoreConfig::io_prefault

    // ---- packs in the task pipeline (store_packs.cpp) ----
    struct Source {  // where a block of a pack being dumped is
        enum class Kind { None, Slot, Owned, Caller } kind = Kind::None;
        uint32_t slot = 0;
        std::shared_ptr<AlignedBuffer> owned;
    };
    struct PackGroup {
        std::shared_ptr<Task> t;
        std::shared_ptr<const Blocks> blocks;
        Key head;
        std::vector<size_t> members;  // the task's block indices, by index in the pack
        std::vector<uint32_t> index;
        std::vector<Key> keys;
        std::mutex mu;
        size_t waiting = 0;          // members not reported yet
        std::vector<Source> src;     // dump: each member's bytes (None: not stored)
        std::vector<bool> miss;      // load: the members the cache did not hold
    };
    struct Member {  // a block's place in its group
        std::shared_ptr<PackGroup> group;
        size_t pos = 0;
        std::shared_ptr<std::atomic<bool>> reported;
    };
    // Per block of a dump or load: its group, or none (a file of its own).
    std::vector<Member> pack_groups(const std::shared_ptr<Task>& t,
                                    const std::shared_ptr<const Blocks>& blocks,
                                    const std::vector<Key>& keys, const PackRefs& packs,
                                    bool dump);
    void member_ready(const Member& m, Source src);
    void member_checked(const Member& m, bool miss);
    void write_group(const std::shared_ptr<PackGroup>& g);
    void dump_group_direct(const std::shared_ptr<PackGroup>& g);
    void read_group(const std::shared_ptr<PackGroup>& g);
    std::vector<ConstSpan> parts_of(const PackGroup& g, size_t j) const;
    // Whether the pack of `ref.head` holds `key` at `ref.index` (headers read once per call;
    // the lookup's threads read different packs' headers at once).
    struct PackMemo {
        struct Held {
            std::mutex mu;
            bool read = false;
            std::vector<Key> keys;
        };
        std::mutex mu;
        std::unordered_map<Key, std::shared_ptr<Held>, KeyHash> heads;
    };
    bool in_pack(PackMemo& memo, const PackRef& ref, const Key& key);

    std::shared_ptr<Task> new_task(size_t n, bool track_persist);
    std::shared_ptr<Task> find(uint64_t tid, bool persist_table);
    // With tasks_mu_ held, after erasing `tid` from a table: counts it out of `tasks_live`
    // once neither table holds it (nobody can fetch a result of it any more).
    void forgotten_locked(uint64_t tid);

    // Queues one block's step; an exception it throws fails the block (fail_block).
    template <class Fn>
    void submit_block(ThreadPool& pool, const std::shared_ptr<Task>& t, size_t i, bool urgent,
                      Fn fn);
    void fail_block(const std::shared_ptr<Task>& t, size_t i, const std::string& what);

    void dump_to_cache(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                       const std::vector<Span>& shards, const Member* m = nullptr);
    void dump_to_posix(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                       const std::vector<Span>& shards, bool claimed);
    void dump_cached_copy(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                          uint32_t slot, const Member* m);
    void dump_around_full_cache(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                                const std::vector<Span>& shards, const Member* m);
    void fill_slot(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                   const std::vector<Span>& shards, uint32_t slot, const Member* m);
    void write_through(const std::shared_ptr<Task>& t, size_t i, const Key& key, uint32_t slot);
    void load_one(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                  const std::vector<Span>& shards, const Member* m = nullptr);
    void load_from_posix(const std::shared_ptr<Task>& t, size_t i, const Key& key,
                         const std::vector<Span>& shards);
    // One block's payload into the caller's shards (copy_out.hpp).
    void scatter_out(const std::vector<Span>& shards, const uint8_t* payload) const;
    void persist_done(const std::shared_ptr<Task>& t, size_t i, const std::string& err);
    void count_read(PosixTier::Read outcome, int err);


    StoreConfig cfg_;
    uint64_t block_bytes_ = 0;
    mutable Counters c_;
    std::unique_ptr<CacheTier> cache_;
    std::unique_ptr<PosixTier> posix_;
    std::unique_ptr<ThreadPool> copy_pool_, io_pool_, lookup_pool_;

    std::mutex tasks_mu_;
    uint64_t next_id_ = 1;
    std::unordered_map<uint64_t, std::shared_ptr<Task>> tasks_;
    // Dump tasks stay here until their persisted outcome is fetched; the oldest finished
    // ones are dropped past kMaxPersistRecords so an unasked question never leaks memory.
    std::map<uint64_t, std::shared_ptr<Task>> persist_;

    std::mutex flush_mu_;
    std::condition_variable flush_cv_;
    uint64_t pending_persist_ = 0;
    std::atomic<size_t> pending_writes_{0};  // write-throughs and write-arounds queued or running
    size_t max_pending_writes_ = 64;
    bool closed_ = false;
};

template <class Fn>
void Store::submit_block(ThreadPool& pool, const std::shared_ptr<Task>& t, size_t i, bool urgent,
                         Fn fn) {
    pool.submit(
        [this, t, i, fn = std::move(fn)] {
            try {
                fn();
            } catch (const std::exception& e) {
                fail_block(t, i, e.what());
            } catch (...) {
                fail_block(t, i, "unknown exception");
            }
        },
        urgent);
}

}  // namespace ucm
