// Copies of a block into memory the store does not own (the caller's KV buffers).
#pragma once

#include <cstddef>

namespace ucm {

// Blocks from this size on are copied out with streaming stores (x86-64): the destination is
// written without first being read into the cache, and the copy does not evict what the
// threads beside it are using. 1 MiB: larger than one core's L2 share.
constexpr size_t kStreamCopyMin = 1u << 20;

// memcpy's contract, for copies that are part of a block of block_bytes.
void copy_out(void* dst, const void* src, size_t n, size_t block_bytes);

}  // namespace ucm
