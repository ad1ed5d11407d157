// Page-aligned, growable scratch memory: O_DIRECT needs aligned addresses, offsets and sizes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>

namespace ucm {

constexpr size_t kAlign = 4096;

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
            if (posix_memalign(&p, kAlign, align_up(n)) != 0) throw std::bad_alloc();
            data_ = static_cast<uint8_t*>(p);
            cap_ = align_up(n);
        }
        return data_;
    }

private:
    uint8_t* data_ = nullptr;
    size_t cap_ = 0;
};

}  // namespace ucm
