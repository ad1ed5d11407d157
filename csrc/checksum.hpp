// CRC-32C (Castagnoli) of block payloads and headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ucm {

// Standard CRC-32C (init and final xor 0xffffffff): crc32c("123456789") == 0xe3069283.
// Uses the SSE4.2 crc32 instruction on three interleaved streams when the CPU has it, a
// slicing-by-8 table otherwise.
uint32_t crc32c(const void* data, size_t n);

// crc32c(A || B) from crc32c(A), crc32c(B) and len(B).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b);

// True when the hardware path is in use (reported in Store.info()).
bool crc32c_hardware();

}  // namespace ucm
