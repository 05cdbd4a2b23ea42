/* The TFRecord format (docs/DATASETS.md): each record is its length (uint64, little-endian),
 * the masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data. tfrecord.c
 * reads one record at a time for the TFRecord source (sources.c) and writes them
 * (dg_tfrecord_writer, distgraph/dataset.h). */
#ifndef DG_DATA_TFRECORD_IMPL_H
#define DG_DATA_TFRECORD_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "distgraph/status.h"

// Reads the record at *offset of f (path for messages, file_bytes its size; f positioned at
// *offset) into *buf (grown as needed, capacity *cap; caller frees). Returns 1 with *n bytes
// and *offset past the record, 0 at the file's end (*offset == file_bytes), -1 with DATA_LOSS
// naming the file and the record's offset: a length or CRC cut short, a length over max_bytes
// or past the file's end, a CRC that does not match. After -1, *offset is where reading may go
// on: past the record when only the data's CRC failed, else the file's end (a length that
// cannot be trusted leaves no next record to find).
int data_tfrecord_read(FILE *f, const char *path, int64_t file_bytes, int64_t max_bytes, int64_t *offset,
                       unsigned char **buf, size_t *cap, size_t *n, dg_status *st);

#endif
