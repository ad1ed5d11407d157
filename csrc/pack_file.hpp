// On-disk format of a pack: several consecutive blocks of one prefix chain in one file, so a
// network filesystem pays its per-file round trips (create, close, rename, open) once per pack
// instead of once per block. See csrc/README.md, "Packs".
//
// A pack is named by the key of its first block. Its header lists every block's key and
// CRC-32C, so a reader whose chain shares only the first blocks of the pack (two prompts with
// one system prompt) still finds those: the blocks whose keys match, up to the first that
// differs. Each block starts on a page, so one block, or a run of them, reads with O_DIRECT.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "block_file.hpp"
#include "key.hpp"

namespace ucm {

constexpr char kPackMagic[8] = {'U', 'C', 'M', 'P', 'A', 'C', 'K', '1'};
constexpr uint32_t kPackVersion = 1;
constexpr size_t kPackFixed = 64;   // bytes before the shard sizes
constexpr size_t kPackEntry = 24;   // per block: key, CRC-32C, 4 bytes zero
constexpr uint32_t kMaxPackBlocks = 4096;

struct PackLayout {
    uint32_t blocks = 0;
    uint64_t header = 0;  // a multiple of 4096
    uint64_t stride = 0;  // bytes per block in the file: the payload rounded up to a page
    uint64_t file_size = 0;

    PackLayout(const Layout& block, uint32_t nblocks);
    uint64_t offset(uint32_t j) const { return header + uint64_t(j) * stride; }
};

// Fills `hdr` (pl.header bytes) for blocks `keys` (keys[0] names the pack) and their CRCs.
void encode_pack_header(uint8_t* hdr, const Layout& block, const PackLayout& pl,
                        const std::vector<Key>& keys, const std::vector<uint32_t>& crcs);

struct PackHeader {
    Verdict verdict = Verdict::Ok;
    std::string reason;
    uint32_t blocks = 0;
    uint64_t header = 0;                // the header's size as the file states it
    std::vector<Key> keys;              // one per block
    std::vector<uint32_t> crcs;
};

// Reads the fixed part and, when `have` covers the whole header, checks it (magic, version,
// header CRC, first key, shard layout, file size) and lists the blocks. A header longer than
// `have` comes back Ok with `header` set and no keys: read that many bytes and call again.
PackHeader check_pack_header(const uint8_t* hdr, size_t have, uint64_t file_size,
                             const Layout& block, const Key& first);

// How many of `keys` a pack holding `held` stores: its blocks match ours from the first on, up
// to the first that differs (a key digests the whole chain before it).
inline uint32_t leading_match(const std::vector<Key>& held, const std::vector<Key>& keys) {
    uint32_t n = 0;
    while (n < held.size() && n < keys.size() && held[n] == keys[n]) ++n;
    return n;
}

}  // namespace ucm
