#include "block_file.hpp"

#include <cstring>
#include <ctime>

#include "aligned_buffer.hpp"
#include "checksum.hpp"

namespace ucm {
namespace {

// Field offsets inside the fixed part of the header (little-endian, as the hosts that
// share a storage directory are).
constexpr size_t kOffVersion = 8, kOffHeaderSize = 12, kOffKey = 16, kOffShards = 32,
                 kOffFlags = 36, kOffPayload = 40, kOffPayloadCrc = 48, kOffHeaderCrc = 52,
                 kOffCreated = 56;

std::string num(uint64_t v) { return std::to_string(v); }

}  // namespace

uint32_t header_crc(const uint8_t* hdr, size_t size, size_t fixed, size_t crc_off) {
    uint8_t head[256];  // the fixed parts are 64 bytes
    std::memcpy(head, hdr, fixed);
    put_le<uint32_t>(head, crc_off, 0);
    return crc32c_combine(crc32c(head, fixed), crc32c(hdr + fixed, size - fixed), size - fixed);
}

Layout::Layout(std::vector<uint64_t> shards) : shard_sizes(std::move(shards)) {
    for (auto s : shard_sizes) payload += s;
    header = align_up(kFixedHeader + 8 * shard_sizes.size());
    file_size = align_up(header + payload);
}

void encode_header(uint8_t* hdr, const Layout& layout, const Key& key, uint32_t payload_crc) {
    std::memset(hdr, 0, layout.header);
    std::memcpy(hdr, kMagic, sizeof kMagic);
    put_le<uint32_t>(hdr, kOffVersion, kFormatVersion);
    put_le<uint32_t>(hdr, kOffHeaderSize, static_cast<uint32_t>(layout.header));
    std::memcpy(hdr + kOffKey, key.bytes.data(), kKeySize);
    put_le<uint32_t>(hdr, kOffShards, static_cast<uint32_t>(layout.shard_sizes.size()));
    put_le<uint32_t>(hdr, kOffFlags, 0);
    put_le<uint64_t>(hdr, kOffPayload, layout.payload);
    put_le<uint32_t>(hdr, kOffPayloadCrc, payload_crc);
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    put_le<uint64_t>(hdr, kOffCreated, uint64_t(ts.tv_sec) * 1000000000ULL + uint64_t(ts.tv_nsec));
    for (size_t i = 0; i < layout.shard_sizes.size(); ++i)
        put_le<uint64_t>(hdr, kFixedHeader + 8 * i, layout.shard_sizes[i]);
    // The header CRC covers the whole header with its own field zeroed.
    put_le<uint32_t>(hdr, kOffHeaderCrc, crc32c(hdr, layout.header));
}

HeaderCheck check_header(const uint8_t* hdr, size_t have, uint64_t file_size,
                         const Layout& layout, const Key& key) {
    HeaderCheck r;
    auto corrupt = [&](std::string why) {
        r.verdict = Verdict::Corrupt;
        r.reason = std::move(why);
        return r;
    };
    if (have < kFixedHeader || file_size < kFixedHeader)
        return corrupt("truncated: file has " + num(file_size) + " bytes, less than a header");
    if (std::memcmp(hdr, kMagic, sizeof kMagic) != 0) return corrupt("bad magic");
    uint32_t version = get_le<uint32_t>(hdr, kOffVersion);
    if (version != kFormatVersion)
        return corrupt("unsupported format version " + num(version));
    uint64_t hsize = get_le<uint32_t>(hdr, kOffHeaderSize);
    if (hsize < kFixedHeader || hsize % kAlign || hsize > (1u << 24))
        return corrupt("bad header size " + num(hsize));
    if (hsize > have || hsize > file_size)
        return corrupt("truncated: file has " + num(file_size) + " bytes, header needs " +
                       num(hsize));
    if (header_crc(hdr, hsize, kFixedHeader, kOffHeaderCrc) != get_le<uint32_t>(hdr, kOffHeaderCrc))
        return corrupt("header checksum mismatch");
    if (std::memcmp(hdr + kOffKey, key.bytes.data(), kKeySize) != 0)
        return corrupt("header holds another key");
    uint32_t nshards = get_le<uint32_t>(hdr, kOffShards);
    uint64_t payload = get_le<uint64_t>(hdr, kOffPayload);
    bool same = nshards == layout.shard_sizes.size() && payload == layout.payload &&
                hsize == layout.header;
    for (size_t i = 0; same && i < nshards; ++i)
        same = get_le<uint64_t>(hdr, kFixedHeader + 8 * i) == layout.shard_sizes[i];
    if (!same) {
        // A sound file written with another shard layout: a configuration mismatch, not
        // damage, so the file stays where it is.
        r.verdict = Verdict::Mismatch;
        r.reason = "shard layout mismatch: file has " + num(nshards) + " shards / " +
                   num(payload) + " bytes, store expects " + num(layout.shard_sizes.size()) +
                   " / " + num(layout.payload);
        return r;
    }
    if (file_size < layout.file_size)
        return corrupt("truncated: file has " + num(file_size) + " bytes, expected " +
                       num(layout.file_size));
    if (file_size > layout.file_size)
        return corrupt("oversized: file has " + num(file_size) + " bytes, expected " +
                       num(layout.file_size));
    r.payload_crc = get_le<uint32_t>(hdr, kOffPayloadCrc);
    return r;
}

}  // namespace ucm
