// Page-aligned, growable scratch memory: O_DIRECT needs aligned addresses, offsets and sizes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>

#include <sys/mman.h>

namespace ucm {

constexpr size_t kAlign = 4096;
constexpr size_t kHuge = 2u << 20;

inline size_t align_up(size_t n, size_t a = kAlign) { return (n + a - 1) / a * a; }

class AlignedBuffer {
public:
    AlignedBuffer() = default;
    ~AlignedBuffer() { std::free(data_); }
    AlignedBuffer(const AlignedBuffer&) = delete;
    AlignedBuffer& operator=(const AlignedBuffer&) = delete;

    // Returns at least n aligned bytes; contents are not preserved when it grows.
    uint8_t* reserve(size_t n) {
        if (n > cap_) {
            std::free(data_);
            data_ = nullptr;
            cap_ = 0;
            void* p = nullptr;
            // Blocks of 2 MiB and more: huge pages, so an O_DIRECT request is a few large
            // physically contiguous segments instead of one per 4 KiB page.
            size_t align = n >= kHuge ? kHuge : kAlign;
            size_t cap = align_up(n, align);
            if (posix_memalign(&p, align, cap) != 0) throw std::bad_alloc();
            if (align == kHuge) madvise(p, cap, MADV_HUGEPAGE);
            data_ = static_cast<uint8_t*>(p);
            cap_ = cap;
        }
        return data_;
    }

private:
    uint8_t* data_ = nullptr;
    size_t cap_ = 0;
};

}  // namespace ucm
