/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord files
 * (tfrecord.c), and its masked form. One implementation for the data room: slicing by 8
 * over tables built once, or the SSE4.2 instruction where the CPU has it. */
#ifndef DG_DATA_CRC32C_IMPL_H
#define DG_DATA_CRC32C_IMPL_H

#include <stddef.h>
#include <stdint.h>

// Extends crc (0 to start) over n bytes of data: data_crc32c(0, "123456789", 9) = 0xE3069283.
uint32_t data_crc32c(uint32_t crc, const void *data, size_t n);
// The table-driven path alone, whatever the CPU (the tests compare both paths).
uint32_t data_crc32c_portable(uint32_t crc, const void *data, size_t n);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, and its inverse.
uint32_t data_crc32c_mask(uint32_t crc);
uint32_t data_crc32c_unmask(uint32_t masked);

#endif
