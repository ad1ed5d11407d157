#include "io_util.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ucm {

std::string errno_text(int err) {
    char buf[256];
    // GNU strerror_r may return a static string instead of filling buf.
    const char* s = strerror_r(err, buf, sizeof buf);
    return std::string(s) + " (errno " + std::to_string(err) + ")";
}

std::string io_error(const std::string& what, const std::string& path, int err) {
    return what + " " + path + ": " + errno_text(err);
}

const std::string& host_name() {
    static const std::string name = [] {
        char buf[256] = {0};
        if (gethostname(buf, sizeof buf - 1) != 0) return std::string("unknown");
        std::string s(buf);
        for (char& c : s)
            if (!(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
                c = '_';
        return s.empty() ? std::string("unknown") : s;
    }();
    return name;
}

int write_all(int fd, const void* buf, size_t n, off_t off) {
    const char* p = static_cast<const char*>(buf);
    while (n) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        p += w;
        n -= size_t(w);
        off += w;
    }
    return 0;
}

int read_full(int fd, void* buf, size_t n, off_t off, size_t* done) {
    char* p = static_cast<char*>(buf);
    *done = 0;
    while (n) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (r == 0) return 0;  // EOF: caller compares *done
        p += r;
        n -= size_t(r);
        off += r;
        *done += size_t(r);
    }
    return 0;
}

int writev_all(int fd, std::vector<iovec> iov, off_t off) {
    size_t first = 0;
    while (first < iov.size()) {
        int cnt = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
        ssize_t w = pwritev(fd, iov.data() + first, cnt, off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        off += w;
        size_t left = size_t(w);
        while (left && first < iov.size()) {
            size_t take = std::min(left, iov[first].iov_len);
            iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
            iov[first].iov_len -= take;
            left -= take;
            if (iov[first].iov_len == 0) ++first;
        }
    }
    return 0;
}

bool pid_alive(long pid) {
    if (pid <= 0) return false;
    return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

int fsync_dir(const std::string& dir) {
    int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno;
    int rc = fsync(fd) == 0 ? 0 : errno;
    close(fd);
    return rc;
}

}  // namespace ucm
