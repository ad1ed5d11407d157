#include "posix_tier.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <thread>

#include "aligned_buffer.hpp"
#include "checksum.hpp"
#include "fault.hpp"
#include "io_util.hpp"
#include "posix_common.hpp"

namespace ucm {
namespace {

int mkdir_p(const std::string& path) {
    if (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return 0;
    if (errno != ENOENT) return errno;
    auto slash = path.find_last_of('/');
    if (slash == std::string::npos || slash == 0) return ENOENT;
    int rc = mkdir_p(path.substr(0, slash));
    if (rc) return rc;
    return (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) ? 0 : errno;
}

int64_t now_s() { return static_cast<int64_t>(time(nullptr)); }

bool is_shard_dir(const char* name) {
    if (std::strlen(name) != 3) return false;
    for (int i = 0; i < 3; ++i)
        if (!isxdigit(static_cast<unsigned char>(name[i])) || isupper(name[i])) return false;
    return true;
}

// The whole file as one gather list: header, shards, and (buffered) zero padding to the
// file size; O_DIRECT shards are whole pages already.
std::vector<iovec> with_header(const Layout& layout, const uint8_t* hdr,
                               const std::vector<ConstSpan>& parts, bool pad) {
    static const uint8_t zeros[kAlign] = {};
    std::vector<iovec> iov;
    iov.reserve(parts.size() + 2);
    iov.push_back({const_cast<uint8_t*>(hdr), layout.header});
    uint64_t end = layout.header;
    for (const auto& p : parts) {
        iov.push_back({const_cast<uint8_t*>(p.p), p.n});
        end += p.n;
    }
    if (pad && end < layout.file_size) iov.push_back({const_cast<uint8_t*>(zeros), layout.file_size - end});
    return iov;
}

}  // namespace

PosixTier::PosixTier(PosixOptions opts, Layout layout, Counters& counters)
    : opts_(std::move(opts)), layout_(std::move(layout)), c_(counters) {
    for (const auto& root : opts_.backends) {
        auto b = std::make_unique<Backend>();
        b->root = root;
        while (b->root.size() > 1 && b->root.back() == '/') b->root.pop_back();
        if (int rc = mkdir_p(b->root)) {
            // Not fatal: blocks of this backend fail with this reason until it appears.
            b->note = io_error("backend unusable: cannot create", b->root, rc);
        } else if (opts_.direct) {
            std::string probe = b->root + "/.direct-probe." + host_name() + "." +
                                std::to_string(getpid());
            int fd = open(probe.c_str(), O_CREAT | O_WRONLY | O_DIRECT | O_CLOEXEC, 0644);
            if (fd >= 0) {
                b->direct = true;
                close(fd);
                unlink(probe.c_str());
            } else {
                b->note = "io_direct off for " + b->root + ": the filesystem refuses O_DIRECT (" +
                          errno_text(errno) + "); using buffered I/O";
            }
        }
        backends_.push_back(std::move(b));
    }
    gc_thread_ = std::thread([this] { gc_loop(); });
}

PosixTier::~PosixTier() {
    {
        std::lock_guard<std::mutex> lk(gc_mu_);
        gc_stop_ = true;
    }
    gc_cv_.notify_all();
    gc_thread_.join();
}

std::vector<std::string> PosixTier::notes() const {
    std::vector<std::string> out;
    for (const auto& b : backends_)
        if (!b->note.empty()) out.push_back(b->note);
    return out;
}

std::vector<bool> PosixTier::direct_per_backend() const {
    std::vector<bool> out;
    for (const auto& b : backends_) out.push_back(b->direct.load());
    return out;
}

bool PosixTier::exists(const Key& key) const {
    fault::stall(fault::Site::PosixStat);
    const Backend& b = *backends_[pick(key)];
    std::string hex = key.hex();
    struct stat st;
    if (stat((dir_of(b, hex) + "/" + hex).c_str(), &st) == 0) return S_ISREG(st.st_mode);
    int e = errno;
    if (e != ENOENT && e != ENOTDIR) count_lookup_error(e);
    return false;
}

void PosixTier::count_lookup_error(int err) const {
    // Counted by kind, so a hit rate that collapses says why.
    c_.lookup_errors.add();
    if (err == ESTALE) c_.lookup_estale.add();
    else if (err == ENOTCONN) c_.lookup_enotconn.add();
    else if (err == EIO) c_.lookup_eio.add();
}

std::string PosixTier::write(const Key& key, const std::vector<ConstSpan>& parts) {
    Backend& b = *backends_[pick(key)];
    const std::string hex = key.hex();
    const std::string dir = dir_of(b, hex);
    const std::string final_path = dir + "/" + hex;
    struct stat st;
    if (stat(final_path.c_str(), &st) == 0) {
        // Same key = same bytes (keys digest the content's identity): nothing to do.
        c_.posix_write_skipped.add();
        return "";
    }
    fault::point(fault::Site::PosixWrite, "posix write");
    fault::stall(fault::Site::PosixWrite);
    const std::string tmp = final_path + ".tmp." + unique_suffix();
    bool direct = b.direct.load(std::memory_order_relaxed);
    std::string why;
    int fd = create_temp(b, dir, tmp, &direct, &why);
    if (fd < 0) return why;
    auto fail = [&](const std::string& what, int e) {
        close(fd);
        unlink(tmp.c_str());
        if (e == ENOSPC || e == EDQUOT) request_gc();
        return io_error(what, tmp, e);
    };

    // Page-aligned shards whose sizes are whole pages (cache slots, most KV layouts) go to
    // the disk straight from the caller's memory: no staging copy.
    bool zero_copy = direct;
    for (const auto& p : parts)
        zero_copy = zero_copy && reinterpret_cast<uintptr_t>(p.p) % kAlign == 0 && p.n % kAlign == 0;
    int rc = 0;
    if (zero_copy) {
        // One pwritev per block: the header (the checksum is computed first) then the shards.
        uint8_t* hdr = scratch().reserve(layout_.header);
        encode_header(hdr, layout_, key, crc_of(parts));
        rc = writev_all(fd, with_header(layout_, hdr, parts, false), 0);
        if (rc == EINVAL) {  // the device wants stricter alignment: stage like below
            zero_copy = false;
            rc = 0;
        }
    }
    if (!zero_copy && direct) {
        // O_DIRECT wants aligned memory and lengths: stage header + payload + zero padding.
        uint8_t* buf = scratch().reserve(layout_.file_size);
        uint8_t* pay = buf + layout_.header;
        for (const auto& p : parts) {
            std::memcpy(pay, p.p, p.n);
            pay += p.n;
        }
        std::memset(pay, 0, buf + layout_.file_size - pay);
        encode_header(buf, layout_, key, crc32c(buf + layout_.header, layout_.payload));
        rc = write_all(fd, buf, layout_.file_size, 0);
        if (rc == EINVAL) {  // the filesystem accepted the flag at open but not the I/O
            b.direct = false;
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT);
            rc = write_all(fd, buf, layout_.file_size, 0);
        }
    } else if (!direct) {
        // Buffered: one pwritev straight from the caller's shards, zero padding at the end.
        uint8_t* hdr = scratch().reserve(layout_.header);
        encode_header(hdr, layout_, key, crc_of(parts));
        rc = writev_all(fd, with_header(layout_, hdr, parts, true), 0);
    }
    if (rc) return fail("cannot write", rc);
    if (opts_.fsync && fdatasync(fd) != 0) return fail("cannot fsync", errno);
    if (close(fd) != 0) {
        int e = errno;
        unlink(tmp.c_str());
        return io_error("cannot close", tmp, e);
    }
    // rename() is atomic: readers see the old file, the new one, or none; never a mix.
    if (rename(tmp.c_str(), final_path.c_str()) != 0) {
        int e = errno;
        unlink(tmp.c_str());
        return io_error("cannot rename into", final_path, e);
    }
    if (opts_.fsync) {
        if (int e = fsync_dir(dir)) return io_error("cannot fsync directory", dir, e);
    }
    c_.posix_bytes_written.add(layout_.payload);
    c_.posix_blocks_written.add();
    c_.posix_used_bytes.add(layout_.file_size);
    commits_.fetch_add(1);
    if (opts_.capacity && c_.posix_used_bytes.get() > opts_.capacity) request_gc();
    return "";
}

int PosixTier::create_temp(Backend& b, const std::string& dir, const std::string& tmp,
                           bool* direct, std::string* err) {
    auto create = [&] {
        int f = open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | (*direct ? O_DIRECT : 0), 0644);
        if (f < 0 && *direct && errno == EINVAL) {
            b.direct = false;
            *direct = false;
            f = open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
        }
        return f;
    };
    int fd = create();
    // First block of this shard directory (or the backend itself is gone). On a network
    // filesystem another node may be creating the same directory right now: its mkdir has
    // made the name (ours says EEXIST) but a create inside can still fail ENOENT for a few
    // milliseconds (measured on GlusterFS: two hosts storing the same keys at once), so try
    // again briefly before calling the block failed.
    for (int attempt = 0; fd < 0 && errno == ENOENT && attempt < 8; ++attempt) {
        if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
            int e = errno;
            *err = e == ENOENT ? "backend directory " + b.root + " is missing"
                               : io_error("cannot create", dir, e);
            return -1;
        }
        if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1 << attempt));
        fd = create();
    }
    if (fd < 0) {
        int e = errno;
        if (e == ENOSPC) request_gc();
        *err = io_error("cannot create", tmp, e);
    }
    return fd;
}

PosixTier::Read PosixTier::read(const Key& key, const std::function<void(const uint8_t*)>& deliver,
                                std::string* reason, int* err) {
    *err = 0;
    Backend& b = *backends_[pick(key)];
    const std::string hex = key.hex();
    const std::string path = dir_of(b, hex) + "/" + hex;
    fault::point(fault::Site::PosixRead, "posix read");
    fault::stall(fault::Site::PosixRead);
    bool direct = b.direct.load(std::memory_order_relaxed);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0 && direct && errno == EINVAL) {
        direct = false;
        fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) {
            *reason = "not found";
            return Read::Missing;
        }
        *reason = io_error("cannot open", path, e);
        *err = e;
        return Read::Error;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *err = errno;
        *reason = io_error("cannot stat", path, *err);
        close(fd);
        return Read::Error;
    }
    uint64_t size = uint64_t(st.st_size);
    // Read at most what a sound file can hold (+ one page to notice an oversized one).
    uint64_t want = std::min<uint64_t>(align_up(size), layout_.file_size + kAlign);
    uint8_t* buf = scratch().reserve(std::max<uint64_t>(want, kAlign));
    size_t got = 0;
    int rc = read_full(fd, buf, want, 0, &got);
    if (rc == EINVAL && direct) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT);
        rc = read_full(fd, buf, want, 0, &got);
    }
    if (rc) {
        *reason = io_error("cannot read", path, rc);
        *err = rc;
        close(fd);
        return Read::Error;
    }
    HeaderCheck hc = check_header(buf, got, std::min<uint64_t>(size, got), layout_, key);
    if (hc.verdict == Verdict::Ok &&
        crc32c(buf + layout_.header, layout_.payload) != hc.payload_crc) {
        hc.verdict = Verdict::Corrupt;
        hc.reason = "payload checksum mismatch";
    }
    if (hc.verdict != Verdict::Ok) {
        close(fd);
        *reason = path + ": " + hc.reason;
        if (hc.verdict == Verdict::Mismatch) return Read::Error;
        c_.corrupt_blocks.add();
        quarantine(b, path, hex, st.st_ino);
        return Read::Corrupt;
    }
    // With a capacity limit, reading refreshes the block's age so the collector removes the
    // least recently *used* blocks; at most once a minute per block to keep reads read-only.
    if (opts_.capacity && st.st_mtime + 60 < now_s()) futimens(fd, nullptr);
    close(fd);
    deliver(buf + layout_.header);
    c_.posix_bytes_read.add(layout_.payload);
    c_.posix_blocks_read.add();
    return Read::Ok;
}

void PosixTier::quarantine(Backend& b, const std::string& path, const std::string& name,
                           ino_t ino) {
    // Only move the file we judged: a writer may have renamed a sound one into place since.
    struct stat now;
    if (stat(path.c_str(), &now) != 0 || now.st_ino != ino) return;
    std::string dir = b.root + "/corrupt";
    mkdir(dir.c_str(), 0755);
    std::string dest = dir + "/" + name + "." + unique_suffix();
    if (rename(path.c_str(), dest.c_str()) != 0) unlink(path.c_str());
    c_.quarantined_blocks.add();
    c_.posix_used_bytes.sub(std::min<uint64_t>(c_.posix_used_bytes.get(), uint64_t(now.st_size)));
}

bool PosixTier::temp_is_stale(const std::string& name, int64_t mtime_s) const {
    // <32 hex>[.pack].tmp.<host>.<pid>.<counter>; the host may itself contain dots.
    auto last = name.rfind('.');
    auto mid = last == std::string::npos ? last : name.rfind('.', last - 1);
    const size_t host_at = name.find(".tmp.") + 5;
    bool old = mtime_s + static_cast<int64_t>(opts_.stale_temp_s) < now_s();
    if (mid == std::string::npos || mid < host_at) return old;
    std::string host = name.substr(host_at, mid - host_at);
    long pid = std::strtol(name.c_str() + mid + 1, nullptr, 10);
    if (host != host_name()) return old;
    if (pid == getpid()) return false;  // ours and in flight
    // A dead writer on this host: its temp can never be completed. (A recycled pid only
    // delays reclamation until the age limit.)
    return !pid_alive(pid) || old;
}

GcReport PosixTier::collect() {
    std::lock_guard<std::mutex> pass(gc_pass_mu_);
    struct Entry {
        int64_t mtime_ns;
        uint64_t size;
        std::string path;
    };
    std::vector<Entry> blocks;
    GcReport r;
    const uint64_t commits_before = commits_.load();
    for (const auto& b : backends_) {
        DIR* top = opendir(b->root.c_str());
        if (!top) continue;
        while (dirent* d = readdir(top)) {
            if (!is_shard_dir(d->d_name)) continue;
            std::string dir = b->root + "/" + d->d_name;
            DIR* sub = opendir(dir.c_str());
            if (!sub) continue;
            int dfd = dirfd(sub);
            while (dirent* f = readdir(sub)) {
                std::string name = f->d_name;
                if (name.size() < kKeySize * 2) continue;
                struct stat st;
                if (fstatat(dfd, f->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
                Key k;
                const size_t hexlen = kKeySize * 2;
                const bool pack = name.compare(hexlen, 5, ".pack") == 0;
                const size_t stem = pack ? hexlen + 5 : hexlen;  // a pack counts as one entry
                if (!parse_hex_key(name.data(), hexlen, &k)) continue;
                if (name.size() == stem) {
                    blocks.push_back({int64_t(st.st_mtim.tv_sec) * 1000000000LL +
                                          st.st_mtim.tv_nsec,
                                      uint64_t(st.st_size), dir + "/" + name});
                } else if (name.compare(stem, 5, ".tmp.") == 0 &&
                           temp_is_stale(name, st.st_mtime)) {
                    if (unlinkat(dfd, f->d_name, 0) == 0) ++r.temps_reclaimed;
                }
            }
            closedir(sub);
        }
        closedir(top);
    }
    uint64_t used = 0;
    for (const auto& e : blocks) used += e.size;
    if (opts_.capacity && used > opts_.capacity) {
        uint64_t target = opts_.capacity / 10 * 9;
        std::sort(blocks.begin(), blocks.end(),
                  [](const Entry& a, const Entry& b) { return a.mtime_ns < b.mtime_ns; });
        for (const auto& e : blocks) {
            if (used <= target) break;
            if (unlink(e.path.c_str()) == 0) {
                used -= e.size;
                ++r.removed_blocks;
                r.removed_bytes += e.size;
            }
        }
    }
    r.used_bytes = used;
    r.blocks = blocks.size() - r.removed_blocks;
    c_.posix_used_bytes.set(used);
    c_.gc_runs.add();
    c_.gc_removed_blocks.add(r.removed_blocks);
    c_.gc_removed_bytes.add(r.removed_bytes);
    c_.temps_reclaimed.add(r.temps_reclaimed);
    // Blocks committed while we scanned may be missing from `used`: look again soon, so the
    // limit holds once writes stop instead of waiting for the next write to notice.
    if (opts_.capacity && commits_.load() != commits_before) request_gc();
    return r;
}

void PosixTier::request_gc() {
    {
        std::lock_guard<std::mutex> lk(gc_mu_);
        gc_wanted_ = true;
    }
    gc_cv_.notify_one();
}

void PosixTier::gc_loop() {
    pthread_setname_np(pthread_self(), "ucm-gc");
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(gc_mu_);
            gc_cv_.wait(lk, [this] { return gc_stop_ || gc_wanted_; });
            if (gc_stop_) return;
            gc_wanted_ = false;
        }
        collect();
        // Back off a little so a burst of writes over capacity costs one pass, not hundreds.
        std::unique_lock<std::mutex> lk(gc_mu_);
        gc_cv_.wait_for(lk, std::chrono::milliseconds(200), [this] { return gc_stop_; });
        if (gc_stop_) return;
    }
}

}  // namespace ucm
