// Block keys: fixed-size binary digests chosen by the caller (never a user path).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

namespace ucm {

constexpr size_t kKeySize = 16;

struct Key {
    std::array<uint8_t, kKeySize> bytes{};

    static Key from(const void* data) {
        Key k;
        std::memcpy(k.bytes.data(), data, kKeySize);
        return k;
    }
    bool operator==(const Key& o) const { return bytes == o.bytes; }

    std::string hex() const {
        static const char digits[] = "0123456789abcdef";
        std::string s(kKeySize * 2, '0');
        for (size_t i = 0; i < kKeySize; ++i) {
            s[2 * i] = digits[bytes[i] >> 4];
            s[2 * i + 1] = digits[bytes[i] & 15];
        }
        return s;
    }

    // Keys are digests, but a caller may still hand us structured ones (counters in tests);
    // a splitmix finaliser keeps backend choice and hash-map buckets evenly spread anyway.
    uint64_t mix() const {
        uint64_t a, b;
        std::memcpy(&a, bytes.data(), 8);
        std::memcpy(&b, bytes.data() + 8, 8);
        uint64_t z = a ^ (b * 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
};

struct KeyHash {
    size_t operator()(const Key& k) const { return static_cast<size_t>(k.mix()); }
};

// Parses 32 lowercase hex characters; false for anything else (foreign files in a shard dir).
inline bool parse_hex_key(const char* s, size_t n, Key* out) {
    if (n != kKeySize * 2) return false;
    for (size_t i = 0; i < kKeySize; ++i) {
        int v = 0;
        for (int j = 0; j < 2; ++j) {
            char c = s[2 * i + j];
            int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
            if (d < 0) return false;
            v = v * 16 + d;
        }
        out->bytes[i] = static_cast<uint8_t>(v);
    }
    return true;
}

}  // namespace ucm
