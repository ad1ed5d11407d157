// Small POSIX helpers with errno-carrying failures.
#pragma once

#include <sys/uio.h>

#include <string>
#include <vector>

namespace ucm {

std::string errno_text(int err);
// "what path: reason"
std::string io_error(const std::string& what, const std::string& path, int err);
// Host name made safe for a file name (no '/', no whitespace).
const std::string& host_name();
// Full pwrite/pread loops; return 0 or an errno. A short read at EOF returns the bytes read
// through *done.
int write_all(int fd, const void* buf, size_t n, off_t off);
int read_full(int fd, void* buf, size_t n, off_t off, size_t* done);
// pwritev until every iovec is written (short writes resume mid-vector).
int writev_all(int fd, std::vector<iovec> iov, off_t off);
bool pid_alive(long pid);
int fsync_dir(const std::string& dir);

}  // namespace ucm
