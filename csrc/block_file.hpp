// On-disk format of one block file (see csrc/README.md): a page-aligned header carrying the
// key, the shard layout and two CRC-32C values, then the shards back to back, zero-padded to a
// page so the whole file can be read and written with O_DIRECT.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "key.hpp"

namespace ucm {

constexpr char kMagic[8] = {'U', 'C', 'M', 'B', 'L', 'O', 'C', 'K'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kFixedHeader = 64;  // bytes before the shard-size array

struct Layout {
    std::vector<uint64_t> shard_sizes;
    uint64_t payload = 0;      // sum of shard sizes
    uint64_t header = 0;       // header bytes, a multiple of 4096
    uint64_t file_size = 0;    // align_up(header + payload)

    explicit Layout(std::vector<uint64_t> shards);
};

// Fills `hdr` (layout.header bytes) for a payload whose CRC is `payload_crc`.
void encode_header(uint8_t* hdr, const Layout& layout, const Key& key, uint32_t payload_crc);

// Little-endian fields of the on-disk headers (the hosts sharing a storage folder are).
template <class T>
void put_le(uint8_t* p, size_t off, T v) { std::memcpy(p + off, &v, sizeof v); }
template <class T>
T get_le(const uint8_t* p, size_t off) {
    T v;
    std::memcpy(&v, p + off, sizeof v);
    return v;
}

// CRC-32C of a header of `size` bytes as if its 4-byte CRC field at `crc_off` (within the
// first `fixed` bytes) were zero, without writing to it.
uint32_t header_crc(const uint8_t* hdr, size_t size, size_t fixed, size_t crc_off);

enum class Verdict { Ok, Corrupt, Mismatch };

struct HeaderCheck {
    Verdict verdict = Verdict::Ok;
    std::string reason;
    uint32_t payload_crc = 0;
};

// Checks magic, version, header CRC, key, shard layout and file size. `file_size` is the
// size fstat saw; `have` is how many header bytes were readable.
HeaderCheck check_header(const uint8_t* hdr, size_t have, uint64_t file_size,
                         const Layout& layout, const Key& key);

}  // namespace ucm
