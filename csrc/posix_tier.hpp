// The Posix tier: one file per block at <backend>/<3 hex>/<32 hex>, backend = hash % n.
//
// Writers fill a temp file named <32 hex>.tmp.<host>.<pid>.<counter> (unique to the writer:
// the counter is process-wide, so two stores of one process never pick the same name)
// and rename it into place only once every shard and the header are written, so a reader
// sees a whole block or none, however many processes and nodes write the same key at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include "block_file.hpp"
#include "key.hpp"
#include "pack_file.hpp"
#include "posix_common.hpp"
#include "stats.hpp"

namespace ucm {

struct PosixOptions {
    std::vector<std::string> backends;
    bool direct = false;
    bool fsync = false;
    uint64_t capacity = 0;       // bytes, 0 = unlimited
    double stale_temp_s = 3600;  // age after which another host's temp file counts as dead
};

struct GcReport {
    uint64_t removed_blocks = 0, removed_bytes = 0, temps_reclaimed = 0, used_bytes = 0;
    uint64_t blocks = 0;
};

class PosixTier {
public:
    PosixTier(PosixOptions opts, Layout layout, Counters& counters);
    ~PosixTier();  // stops the collector thread

    // "" on success. `parts` hold the payload in order (shards, or one cache slot).
    std::string write(const Key& key, const std::vector<ConstSpan>& parts);

    enum class Read { Ok, Missing, Corrupt, Error };
    // Reads and verifies the block; only a verified payload is handed to `deliver`. On Error,
    // `*err` is the errno of the call that failed (0 when the file was wrong, not the I/O).
    Read read(const Key& key, const std::function<void(const uint8_t*)>& deliver,
              std::string* reason, int* err);

    bool exists(const Key& key) const;

    // Packs (see pack_file.hpp): consecutive blocks of one chain in one file named by the
    // first one's key. `keys` are the chain's blocks from the pack's first one on.
    struct PackWrite {
        std::string err;    // "" when the pack on disk holds `held` leading blocks of ours
        uint32_t held = 0;  // all of them once ours is written; fewer when another writer's
                            // pack of the same first block (another chain after it) was there
    };
    // Writes keys[i] <- blocks[i] as one pack, unless a pack of keys[0] exists: never replaces
    // one (a hard link commits it), so a block reported held stays held.
    PackWrite write_pack(const std::vector<Key>& keys,
                         const std::vector<std::vector<ConstSpan>>& blocks);
    // The keys the pack of `head` holds, in order: false without one (or unreadable).
    bool pack_keys(const Key& head, std::vector<Key>* keys);
    // Reads the `wanted` blocks (index in the pack, key) of the pack of `head` in one read;
    // `deliver(w, payload)` gets each whose key and CRC-32C check. Outcome and reason per
    // wanted block: Missing where the pack does not hold that key at that index. A block
    // failing its CRC quarantines the pack.
    using PackEntry = std::pair<uint32_t, Key>;
    struct PackRead {
        std::vector<Read> outcome;
        std::vector<std::string> reasons;
        int err = 0;  // errno of the call that failed, for Read::Error
    };
    PackRead read_pack(const Key& head, const std::vector<PackEntry>& wanted,
                       const std::function<void(size_t, const uint8_t*)>& deliver);

    // One synchronous pass: reclaims dead writers' temp files and, over capacity, removes
    // the least recently written/read blocks down to 90% of it.
    GcReport collect();

    std::vector<std::string> notes() const;  // why direct I/O is off, unusable backends...
    std::vector<bool> direct_per_backend() const;

private:
    struct Backend {
        std::string root;
        std::atomic<bool> direct{false};
        std::string note;
    };
    size_t pick(const Key& key) const { return key.mix() % backends_.size(); }
    std::string dir_of(const Backend& b, const std::string& hex) const {
        return b.root + "/" + hex.substr(0, 3);
    }
    std::string pack_path(const Backend& b, const std::string& hex) const {
        return dir_of(b, hex) + "/" + hex + ".pack";
    }
    // A lookup the storage failed to answer (not "absent"): still a miss, counted by kind.
    void count_lookup_error(int err) const;
    void quarantine(Backend& b, const std::string& path, const std::string& name, ino_t ino);
    // Creates `tmp` (O_EXCL, O_DIRECT while *direct), making its shard folder when needed;
    // -1 with *err set on failure.
    int create_temp(Backend& b, const std::string& dir, const std::string& tmp, bool* direct,
                    std::string* err);
    // Opens the pack at `path` and checks its header into *h (Missing: no pack; Error: *err).
    Read open_pack(const std::string& path, const Key& first, bool direct, int* fd,
                   struct stat* st, PackHeader* h, std::string* reason, int* err);
    void request_gc();
    void gc_loop();
    bool temp_is_stale(const std::string& name, int64_t mtime_s) const;

    PosixOptions opts_;
    Layout layout_;
    Counters& c_;
    std::vector<std::unique_ptr<Backend>> backends_;
    std::atomic<uint64_t> commits_{0};  // blocks renamed into place, for the collector

    std::mutex gc_mu_;
    std::condition_variable gc_cv_;
    bool gc_wanted_ = true;  // the first pass measures what is already stored
    bool gc_stop_ = false;
    std::mutex gc_pass_mu_;  // one pass at a time
    std::thread gc_thread_;
};

}  // namespace ucm
