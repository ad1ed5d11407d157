#include "pack_file.hpp"

#include <cstring>
#include <ctime>

#include "aligned_buffer.hpp"
#include "checksum.hpp"

namespace ucm {
namespace {

// Offsets inside the fixed part (little-endian, as the hosts sharing a storage folder are).
constexpr size_t kOffVersion = 8, kOffHeaderSize = 12, kOffKey = 16, kOffBlocks = 32,
                 kOffShards = 36, kOffPayload = 40, kOffFlags = 48, kOffHeaderCrc = 52,
                 kOffCreated = 56;

std::string num(uint64_t v) { return std::to_string(v); }

uint64_t header_bytes(size_t nshards, uint32_t nblocks) {
    return align_up(kPackFixed + 8 * nshards + kPackEntry * nblocks);
}

}  // namespace

PackLayout::PackLayout(const Layout& block, uint32_t nblocks)
    : blocks(nblocks),
      header(header_bytes(block.shard_sizes.size(), nblocks)),
      stride(align_up(block.payload)),
      file_size(header + uint64_t(nblocks) * align_up(block.payload)) {}

void encode_pack_header(uint8_t* hdr, const Layout& block, const PackLayout& pl,
                        const std::vector<Key>& keys, const std::vector<uint32_t>& crcs) {
    std::memset(hdr, 0, pl.header);
    std::memcpy(hdr, kPackMagic, sizeof kPackMagic);
    put_le<uint32_t>(hdr, kOffVersion, kPackVersion);
    put_le<uint32_t>(hdr, kOffHeaderSize, static_cast<uint32_t>(pl.header));
    std::memcpy(hdr + kOffKey, keys[0].bytes.data(), kKeySize);
    put_le<uint32_t>(hdr, kOffBlocks, pl.blocks);
    put_le<uint32_t>(hdr, kOffShards, static_cast<uint32_t>(block.shard_sizes.size()));
    put_le<uint64_t>(hdr, kOffPayload, block.payload);
    put_le<uint32_t>(hdr, kOffFlags, 0);
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    put_le<uint64_t>(hdr, kOffCreated, uint64_t(ts.tv_sec) * 1000000000ULL + uint64_t(ts.tv_nsec));
    uint8_t* p = hdr + kPackFixed;
    for (auto s : block.shard_sizes) {
        put_le<uint64_t>(p, 0, s);
        p += 8;
    }
    for (uint32_t j = 0; j < pl.blocks; ++j, p += kPackEntry) {
        std::memcpy(p, keys[j].bytes.data(), kKeySize);
        put_le<uint32_t>(p, kKeySize, crcs[j]);
    }
    put_le<uint32_t>(hdr, kOffHeaderCrc, crc32c(hdr, pl.header));  // over the header, field zeroed
}

PackHeader check_pack_header(const uint8_t* hdr, size_t have, uint64_t file_size,
                             const Layout& block, const Key& first) {
    PackHeader r;
    auto corrupt = [&](std::string why) {
        r.verdict = Verdict::Corrupt;
        r.reason = std::move(why);
        r.keys.clear();
        return r;
    };
    if (have < kPackFixed || file_size < kPackFixed)
        return corrupt("truncated: file has " + num(file_size) + " bytes, less than a header");
    if (std::memcmp(hdr, kPackMagic, sizeof kPackMagic) != 0) return corrupt("bad magic");
    uint32_t version = get_le<uint32_t>(hdr, kOffVersion);
    if (version != kPackVersion) return corrupt("unsupported pack format version " + num(version));
    uint32_t nblocks = get_le<uint32_t>(hdr, kOffBlocks);
    uint32_t nshards = get_le<uint32_t>(hdr, kOffShards);
    uint64_t hsize = get_le<uint32_t>(hdr, kOffHeaderSize);
    if (nblocks == 0 || nblocks > kMaxPackBlocks || nshards == 0 || nshards > (1u << 16) ||
        hsize != header_bytes(nshards, nblocks))
        return corrupt("bad pack header: " + num(nblocks) + " blocks, " + num(nshards) +
                       " shards, header of " + num(hsize) + " bytes");
    r.header = hsize;
    r.blocks = nblocks;
    if (hsize > file_size)
        return corrupt("truncated: file has " + num(file_size) + " bytes, header needs " +
                       num(hsize));
    if (have < hsize) return r;  // the caller reads the rest of the header
    if (header_crc(hdr, hsize, kPackFixed, kOffHeaderCrc) != get_le<uint32_t>(hdr, kOffHeaderCrc))
        return corrupt("header checksum mismatch");
    if (std::memcmp(hdr + kOffKey, first.bytes.data(), kKeySize) != 0)
        return corrupt("header names another first block");
    uint64_t payload = get_le<uint64_t>(hdr, kOffPayload);
    bool same = nshards == block.shard_sizes.size() && payload == block.payload;
    for (size_t i = 0; same && i < nshards; ++i)
        same = get_le<uint64_t>(hdr, kPackFixed + 8 * i) == block.shard_sizes[i];
    if (!same) {
        r.verdict = Verdict::Mismatch;  // sound, of another shard layout: left in place
        r.reason = "shard layout mismatch: pack has " + num(nshards) + " shards / " +
                   num(payload) + " bytes a block, store expects " +
                   num(block.shard_sizes.size()) + " / " + num(block.payload);
        return r;
    }
    PackLayout pl(block, nblocks);
    if (file_size != pl.file_size)
        return corrupt(std::string(file_size < pl.file_size ? "truncated" : "oversized") +
                       ": file has " + num(file_size) + " bytes, a pack of " + num(nblocks) +
                       " blocks has " + num(pl.file_size));
    const uint8_t* p = hdr + kPackFixed + 8 * nshards;
    for (uint32_t j = 0; j < nblocks; ++j, p += kPackEntry) {
        r.keys.push_back(Key::from(p));
        r.crcs.push_back(get_le<uint32_t>(p, kKeySize));
    }
    if (!(r.keys[0] == first)) return corrupt("first entry holds another key");
    return r;
}

}  // namespace ucm
