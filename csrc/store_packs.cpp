// Packs in the task pipeline: the blocks of a dump that start a pack (indices 0, 1, 2... of
// one head) are written as one pack once every one of them is in the DRAM tier (or, without
// a cache, in one job from the caller's memory); the blocks of a load that sit in one pack
// and miss the cache are read in one read of it. Anything a pack does not cover goes the way
// of a single block: a file of its own.
#include <algorithm>
#include <cstring>
#include <map>

#include "store.hpp"

namespace ucm {

std::vector<Store::Member> Store::pack_groups(const std::shared_ptr<Task>& t,
                                              const std::shared_ptr<const Blocks>& blocks,
                                              const std::vector<Key>& keys,
                                              const PackRefs& packs, bool dump) {
    std::vector<Member> out(keys.size());
    if (!posix_ || packs.empty()) return out;
    // Blocks by their pack, in index order.
    std::map<std::array<uint8_t, kKeySize>, std::vector<std::pair<uint32_t, size_t>>> by_head;
    for (size_t i = 0; i < keys.size() && i < packs.size(); ++i)
        if (packs[i].set) by_head[packs[i].head.bytes].emplace_back(packs[i].index, i);
    for (auto& [head, refs] : by_head) {
        std::sort(refs.begin(), refs.end());
        size_t n = refs.size();
        if (dump) {
            // A pack holds indices 0, 1, 2...: the leading run of them present in this dump
            // (a duplicate index ends it). The rest are written as blocks of their own.
            n = 0;
            while (n < refs.size() && refs[n].first == n) ++n;
            if (n < 2) continue;  // a pack of one block is just a block
        }
        auto g = std::make_shared<PackGroup>();
        g->t = t;
        g->blocks = blocks;
        g->head = Key::from(head.data());
        g->waiting = n;
        g->src.resize(n);
        g->miss.assign(n, false);
        for (size_t j = 0; j < n; ++j) {
            g->members.push_back(refs[j].second);
            g->index.push_back(refs[j].first);
            g->keys.push_back(keys[refs[j].second]);
            out[refs[j].second] = Member{g, j, std::make_shared<std::atomic<bool>>(false)};
        }
    }
    return out;
}

void Store::member_ready(const Member& m, Source src) {
    if (m.reported->exchange(true)) return;  // reported already (a job that threw after it)
    auto& g = *m.group;
    bool last;
    {
        std::lock_guard<std::mutex> lk(g.mu);
        g.src[m.pos] = std::move(src);
        last = --g.waiting == 0;
    }
    if (last) io_pool_->submit([this, g = m.group] { write_group(g); }, false);
}

std::vector<ConstSpan> Store::parts_of(const PackGroup& g, size_t j) const {
    const Source& s = g.src[j];
    switch (s.kind) {
    case Source::Kind::Slot: return {{cache_->data(s.slot), block_bytes_}};
    case Source::Kind::Owned: return {{s.owned->reserve(block_bytes_), block_bytes_}};
    case Source::Kind::Caller: {
        std::vector<ConstSpan> parts;
        for (const auto& sp : (*g.blocks)[g.members[j]]) parts.push_back({sp.p, sp.n});
        return parts;
    }
    case Source::Kind::None: break;
    }
    return {};
}

void Store::write_group(const std::shared_ptr<PackGroup>& gp) {
    PackGroup& g = *gp;
    const size_t n = g.members.size();
    std::vector<bool> finished(n, false);
    // Ends member j with `err`: lets go of its bytes, then reports it (as write_through does:
    // a dump issued once the outcome is out finds the slot free).
    auto finish = [&](size_t j, const std::string& err) {
        finished[j] = true;
        const size_t i = g.members[j];
        Source& s = g.src[j];
        if (!err.empty()) c_.posix_write_errors.add();
        switch (s.kind) {
        case Source::Kind::Slot:
            cache_->unpin(s.slot);
            pending_writes_.fetch_sub(1);
            break;
        case Source::Kind::Owned:  // written around a full cache: stored once written
            if (g.t->finish(i, err) && !err.empty()) c_.dump_errors.add();
            s.owned.reset();
            pending_writes_.fetch_sub(1);
            break;
        case Source::Kind::Caller:
            if (!err.empty()) c_.dump_errors.add();
            g.t->end_copy(i, err);
            break;
        case Source::Kind::None: return;  // reported where it failed
        }
        persist_done(g.t, i, err);
    };
    try {
        // The pack: the members from index 0 up to the first one that is not stored.
        size_t run = 0;
        while (run < n && g.src[run].kind != Source::Kind::None) ++run;
        PosixTier::PackWrite w;
        if (run >= 2) {
            std::vector<std::vector<ConstSpan>> parts;
            for (size_t j = 0; j < run; ++j) parts.push_back(parts_of(g, j));
            w = posix_->write_pack(std::vector<Key>(g.keys.begin(), g.keys.begin() + run), parts);
        }
        for (size_t j = 0; j < n; ++j) {
            if (g.src[j].kind == Source::Kind::None) {
                finished[j] = true;
                continue;
            }
            if (j < run && run >= 2 && !w.err.empty()) finish(j, w.err);
            else if (j < run && j < w.held) finish(j, std::string());
            else finish(j, posix_->write(g.keys[j], parts_of(g, j)));  // a file of its own
        }
    } catch (const std::exception& e) {
        c_.job_errors.add();
        for (size_t j = 0; j < n; ++j)
            if (!finished[j]) finish(j, std::string("internal error: ") + e.what());
    }
}

void Store::dump_group_direct(const std::shared_ptr<PackGroup>& g) {
    // Without a cache the pack is written from the caller's memory: each block is claimed
    // first (a cancel waits for claimed ones, skips the rest), as dump_to_posix does.
    for (size_t j = 0; j < g->members.size(); ++j) {
        const size_t i = g->members[j];
        if (g->t->begin_copy(i)) g->src[j].kind = Source::Kind::Caller;
        else persist_done(g->t, i, kGivenUp);
    }
    write_group(g);
}

void Store::member_checked(const Member& m, bool miss) {
    if (m.reported->exchange(true)) return;
    auto& g = *m.group;
    bool last, any = false;
    {
        std::lock_guard<std::mutex> lk(g.mu);
        g.miss[m.pos] = miss;
        last = --g.waiting == 0;
        if (last) any = std::find(g.miss.begin(), g.miss.end(), true) != g.miss.end();
    }
    if (last && any) io_pool_->submit([this, g = m.group] { read_group(g); }, true);
}

void Store::read_group(const std::shared_ptr<PackGroup>& gp) {
    PackGroup& g = *gp;
    const bool all_missed = !cache_;  // without a cache nobody looked: every block is a miss
    std::vector<size_t> who;         // members wanted from the pack
    std::vector<PosixTier::PackEntry> wanted;
    for (size_t j = 0; j < g.members.size(); ++j)
        if ((all_missed || g.miss[j]) && g.t->open(g.members[j])) {
            who.push_back(j);
            wanted.emplace_back(g.index[j], g.keys[j]);
        }
    if (wanted.empty()) return;
    std::vector<bool> copied(who.size(), false), handled(who.size(), false);
    try {
        auto deliver = [&](size_t w, const uint8_t* payload) {
            const size_t i = g.members[who[w]];
            // As load_from_posix: the caller's memory only while the block is still wanted.
            if (g.t->begin_copy(i)) {
                copied[w] = true;
                scatter_out((*g.blocks)[i], payload);
            }
            uint32_t slot = 0;
            if (cache_ && cfg_.cache_on_load &&
                cache_->reserve(g.keys[who[w]], &slot) == CacheTier::Reserve::Reserved) {
                std::memcpy(cache_->data(slot), payload, block_bytes_);
                cache_->commit(slot, false);
                c_.cache_bytes_written.add(block_bytes_);
                c_.cache_blocks_written.add();
            }
        };
        auto r = posix_->read_pack(g.head, wanted, deliver);
        for (size_t w = 0; w < who.size(); ++w) {
            const size_t j = who[w], i = g.members[j];
            handled[w] = true;
            switch (r.outcome[w]) {
            case PosixTier::Read::Ok:
                count_read(r.outcome[w], 0);
                if (copied[w]) g.t->end_copy(i, std::string());
                else c_.load_late.add();
                break;
            case PosixTier::Read::Missing:
            case PosixTier::Read::Corrupt:
                // Not in the pack (or the pack is gone aside): maybe in a file of its own.
                if (r.outcome[w] == PosixTier::Read::Corrupt) c_.posix_read_errors.add();
                submit_block(*io_pool_, g.t, i, true, [this, t = g.t, i, key = g.keys[j], gp] {
                    load_from_posix(t, i, key, (*gp->blocks)[i]);
                });
                break;
            case PosixTier::Read::Error:
                count_read(r.outcome[w], r.err);
                if (g.t->finish(i, r.reasons[w])) c_.load_errors.add();
                break;
            }
        }
    } catch (const std::exception& e) {
        c_.job_errors.add();
        for (size_t w = 0; w < who.size(); ++w) {
            if (handled[w]) continue;
            const size_t i = g.members[who[w]];
            if (copied[w]) g.t->end_copy(i, std::nullopt);
            if (g.t->finish(i, std::string("internal error: ") + e.what())) c_.load_errors.add();
        }
    }
}

bool Store::in_pack(PackMemo& memo, const PackRef& ref, const Key& key) {
    std::shared_ptr<PackMemo::Held> held;
    {
        std::lock_guard<std::mutex> lk(memo.mu);
        auto& slot = memo.heads[ref.head];
        if (!slot) slot = std::make_shared<PackMemo::Held>();
        held = slot;
    }
    std::lock_guard<std::mutex> lk(held->mu);  // one header read per pack, the others wait
    if (!held->read) {
        if (!posix_->pack_keys(ref.head, &held->keys)) held->keys.clear();
        held->read = true;
    }
    return ref.index < held->keys.size() && held->keys[ref.index] == key;
}

}  // namespace ucm
