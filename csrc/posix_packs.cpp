// The Posix tier's packs: several blocks of one chain in one file (pack_file.hpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "fault.hpp"
#include "posix_tier.hpp"

namespace ucm {
PosixTier::Read PosixTier::open_pack(const std::string& path, const Key& first, bool direct,
                                     int* fd, struct stat* st, PackHeader* h,
                                     std::string* reason, int* err) {
    *err = 0;
    *fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (*fd < 0 && direct && errno == EINVAL) *fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (*fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR) {
            *reason = "not found";
            return Read::Missing;
        }
        *err = e;
        *reason = io_error("cannot open", path, e);
        return Read::Error;
    }
    auto fail = [&](Read r) {
        close(*fd);
        *fd = -1;
        return r;
    };
    if (fstat(*fd, st) != 0) {
        *err = errno;
        *reason = io_error("cannot stat", path, *err);
        return fail(Read::Error);
    }
    const uint64_t size = uint64_t(st->st_size);
    // One page holds the header of a pack of up to ~140 blocks of 80 shards; a longer
    // header is read again whole.
    uint64_t want = kAlign;
    for (int pass = 0; pass < 2; ++pass) {
        uint8_t* buf = scratch().reserve(want);
        size_t got = 0;
        int rc = read_full(*fd, buf, want, 0, &got);
        if (rc == EINVAL && direct) {
            fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_DIRECT);
            rc = read_full(*fd, buf, want, 0, &got);
        }
        if (rc) {
            *err = rc;
            *reason = io_error("cannot read", path, rc);
            return fail(Read::Error);
        }
        *h = check_pack_header(buf, got, size, layout_, first);
        if (h->verdict != Verdict::Ok || !h->keys.empty()) break;
        want = h->header;  // longer than one page: read it whole
    }
    if (h->verdict == Verdict::Mismatch) {
        *reason = path + ": " + h->reason;
        return fail(Read::Error);
    }
    if (h->verdict == Verdict::Corrupt || h->keys.empty()) {
        *reason = path + ": " + (h->reason.empty() ? "header unreadable" : h->reason);
        return fail(Read::Corrupt);
    }
    return Read::Ok;
}

bool PosixTier::pack_keys(const Key& head, std::vector<Key>* keys) {
    fault::stall(fault::Site::PosixStat);
    Backend& b = *backends_[pick(head)];
    const std::string hex = head.hex();
    const std::string path = pack_path(b, hex);
    int fd = -1, err = 0;
    struct stat st;
    PackHeader h;
    std::string reason;
    Read r = open_pack(path, head, b.direct.load(std::memory_order_relaxed), &fd, &st, &h,
                       &reason, &err);
    if (r != Read::Ok) {
        if (r == Read::Error && err) count_lookup_error(err);
        return false;  // a corrupt pack is moved aside by the read that finds it
    }
    close(fd);
    *keys = std::move(h.keys);
    return true;
}

PosixTier::PackWrite PosixTier::write_pack(const std::vector<Key>& keys,
                                           const std::vector<std::vector<ConstSpan>>& blocks) {
    PackWrite out;
    Backend& b = *backends_[pick(keys[0])];
    const std::string hex = keys[0].hex();
    const std::string dir = dir_of(b, hex);
    const std::string final_path = pack_path(b, hex);
    bool direct = b.direct.load(std::memory_order_relaxed);
    // A pack of this first block may be there: it holds ours as far as its keys match ours
    // (the same first block, then maybe another chain). Its header says; nothing to write.
    auto held_by_existing = [&](bool* found) {
        int fd = -1, err = 0;
        struct stat st;
        PackHeader h;
        std::string reason;
        *found = false;
        Read r = open_pack(final_path, keys[0], direct, &fd, &st, &h, &reason, &err);
        if (r == Read::Ok) {
            close(fd);
            *found = true;
            return leading_match(h.keys, keys);
        }
        if (r == Read::Corrupt) {
            c_.corrupt_blocks.add();
            quarantine(b, final_path, hex + ".pack", st.st_ino);
        } else if (r == Read::Error) {
            *found = true;  // unreadable or another layout: not ours to replace
            out.err = reason;
        }
        return 0u;
    };
    bool found = false;
    out.held = held_by_existing(&found);
    if (found) {
        if (out.err.empty()) c_.posix_write_skipped.add(out.held);
        return out;
    }
    fault::point(fault::Site::PosixWrite, "posix write");
    fault::stall(fault::Site::PosixWrite);
    const uint32_t n = static_cast<uint32_t>(keys.size());
    const PackLayout pl(layout_, n);
    const std::string tmp = final_path + ".tmp." + unique_suffix();
    int fd = create_temp(b, dir, tmp, &direct, &out.err);
    if (fd < 0) return out;
    auto fail = [&](const std::string& what, int e) {
        close(fd);
        unlink(tmp.c_str());
        if (e == ENOSPC || e == EDQUOT) request_gc();
        out.err = io_error(what, tmp, e);
        return out;
    };
    std::vector<uint32_t> crcs;
    crcs.reserve(n);
    for (const auto& parts : blocks) crcs.push_back(crc_of(parts));
    // Page-aligned shards of whole pages go to the file straight from the caller's memory;
    // otherwise the pack is staged (O_DIRECT) or padded from a page of zeros (buffered).
    bool zero_copy = true;
    for (const auto& parts : blocks)
        for (const auto& p : parts)
            zero_copy = zero_copy && reinterpret_cast<uintptr_t>(p.p) % kAlign == 0 &&
                        p.n % kAlign == 0;
    int rc = 0;
    bool staged = direct && !zero_copy;
    if (!staged) {
        static const uint8_t zeros[kAlign] = {};
        uint8_t* hdr = scratch().reserve(pl.header);
        encode_pack_header(hdr, layout_, pl, keys, crcs);
        std::vector<iovec> iov;
        iov.reserve(blocks.size() * (layout_.shard_sizes.size() + 1) + 1);
        iov.push_back({hdr, pl.header});
        for (const auto& parts : blocks) {
            for (const auto& p : parts) iov.push_back({const_cast<uint8_t*>(p.p), p.n});
            if (pl.stride > layout_.payload)
                iov.push_back({const_cast<uint8_t*>(zeros), pl.stride - layout_.payload});
        }
        rc = writev_all(fd, std::move(iov), 0);
        if (rc == EINVAL && direct) {  // the device wants stricter alignment: stage below
            staged = true;
            rc = 0;
        }
    }
    if (staged) {
        uint8_t* buf = scratch().reserve(pl.file_size);
        for (uint32_t j = 0; j < n; ++j) {
            uint8_t* dst = buf + pl.offset(j);
            for (const auto& p : blocks[j]) {
                std::memcpy(dst, p.p, p.n);
                dst += p.n;
            }
            std::memset(dst, 0, buf + pl.offset(j) + pl.stride - dst);
        }
        encode_pack_header(buf, layout_, pl, keys, crcs);
        rc = write_all(fd, buf, pl.file_size, 0);
        if (rc == EINVAL) {  // the filesystem accepted the flag at open but not the I/O
            b.direct = false;
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT);
            rc = write_all(fd, buf, pl.file_size, 0);
        }
    }
    if (rc) return fail("cannot write", rc);
    if (opts_.fsync && fdatasync(fd) != 0) return fail("cannot fsync", errno);
    if (close(fd) != 0) {
        int e = errno;
        unlink(tmp.c_str());
        out.err = io_error("cannot close", tmp, e);
        return out;
    }
    // link() commits the pack whole, and fails where another writer's pack already is (a
    // rename would replace it, and blocks it reported held would be gone).
    if (link(tmp.c_str(), final_path.c_str()) != 0) {
        int e = errno;
        if (e != EEXIST) {
            unlink(tmp.c_str());
            out.err = io_error("cannot link into", final_path, e);
            return out;
        }
        unlink(tmp.c_str());
        out.held = held_by_existing(&found);  // the other writer's pack: what it holds of ours
        if (out.err.empty()) c_.posix_write_skipped.add(out.held);
        return out;
    }
    unlink(tmp.c_str());
    if (opts_.fsync) {
        if (int e = fsync_dir(dir)) {
            out.err = io_error("cannot fsync directory", dir, e);
            return out;
        }
    }
    out.held = n;
    c_.posix_packs_written.add();
    c_.posix_bytes_written.add(uint64_t(n) * layout_.payload);
    c_.posix_blocks_written.add(n);
    c_.posix_used_bytes.add(pl.file_size);
    commits_.fetch_add(1);
    if (opts_.capacity && c_.posix_used_bytes.get() > opts_.capacity) request_gc();
    return out;
}

PosixTier::PackRead PosixTier::read_pack(
    const Key& head, const std::vector<PackEntry>& wanted,
    const std::function<void(size_t, const uint8_t*)>& deliver) {
    PackRead out;
    const size_t count = wanted.size();
    auto all = [&](Read r, const std::string& why) {
        out.outcome.assign(count, r);
        out.reasons.assign(count, why);
        return out;
    };
    Backend& b = *backends_[pick(head)];
    const std::string hex = head.hex();
    const std::string path = pack_path(b, hex);
    fault::point(fault::Site::PosixRead, "posix read");
    fault::stall(fault::Site::PosixRead);
    bool direct = b.direct.load(std::memory_order_relaxed);
    int fd = -1;
    struct stat st;
    PackHeader h;
    std::string reason;
    Read r = open_pack(path, head, direct, &fd, &st, &h, &reason, &out.err);
    if (r == Read::Corrupt) {
        c_.corrupt_blocks.add();
        quarantine(b, path, hex + ".pack", st.st_ino);
    }
    if (r != Read::Ok) return all(r, reason);
    // A block is in the pack when the pack holds its key at its index (a key digests the
    // whole chain before it, so the blocks before it match too). One read spans them all.
    out.outcome.assign(count, Read::Missing);
    out.reasons.assign(count, "not found");
    uint32_t lo = UINT32_MAX, hi = 0;
    std::vector<bool> held(count, false);
    for (size_t w = 0; w < count; ++w) {
        const auto& [j, key] = wanted[w];
        if (j < h.blocks && h.keys[j] == key) {
            held[w] = true;
            lo = std::min(lo, j);
            hi = std::max(hi, j + 1);
        }
    }
    if (lo >= hi) {
        close(fd);
        return out;
    }
    const PackLayout pl(layout_, h.blocks);
    const uint64_t span = uint64_t(hi - lo) * pl.stride;
    uint8_t* buf = scratch().reserve(span);
    size_t got = 0;
    int rc = read_full(fd, buf, span, off_t(pl.offset(lo)), &got);
    if (rc == EINVAL && direct) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT);
        rc = read_full(fd, buf, span, off_t(pl.offset(lo)), &got);
    }
    if (rc || got < span) {
        close(fd);
        out.err = rc ? rc : EIO;
        return all(Read::Error, rc ? io_error("cannot read", path, rc)
                                   : path + ": short read (the file shrank)");
    }
    if (opts_.capacity && st.st_mtime + 60 < time(nullptr)) futimens(fd, nullptr);
    close(fd);
    c_.posix_packs_read.add();
    bool corrupt = false;
    for (size_t w = 0; w < count; ++w) {
        if (!held[w]) continue;
        const uint32_t j = wanted[w].first;
        const uint8_t* payload = buf + uint64_t(j - lo) * pl.stride;
        if (crc32c(payload, layout_.payload) != h.crcs[j]) {
            corrupt = true;
            out.outcome[w] = Read::Corrupt;
            out.reasons[w] = path + ": payload checksum mismatch in block " + std::to_string(j);
            continue;
        }
        deliver(w, payload);
        out.outcome[w] = Read::Ok;
        out.reasons[w].clear();
        c_.posix_bytes_read.add(layout_.payload);
        c_.posix_blocks_read.add();
    }
    if (corrupt) {
        c_.corrupt_blocks.add();
        quarantine(b, path, hex + ".pack", st.st_ino);
    }
    return out;
}

}  // namespace ucm
