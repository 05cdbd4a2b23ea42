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
#include "distgraph/tensor.h"

// Reads the record at *offset of f (path for messages, file_bytes its size; f positioned at
// *offset) into *out, a uint8 tensor [length] (new, caller unrefs). Returns 1 with *offset
// past the record, 0 at the file's end (*offset >= file_bytes), -1 with DATA_LOSS naming the
// file and the record's offset: a length or CRC cut short, a length over max_bytes or past the
// file's end, a CRC that does not match, a failed read (RESOURCE_EXHAUSTED out of memory).
// After -1, *out is NULL and *offset is where reading may go on: past the record when its
// length passed its CRC and the record fits in the file (the data's CRC failed, or the length
// is over max_bytes), else the file's end (a length that cannot be trusted leaves no next
// record to find); a failed read's error is cleared from f.
// A stream (a pipe, a device: distgraph/dataset.h) is read with file_bytes DATA_STREAM_BYTES: its
// end is where reading meets end-of-file between records (0), a record cut short there is
// DATA_LOSS, and a record over max_bytes is read past (f cannot seek).
#define DATA_STREAM_BYTES INT64_MAX
int data_tfrecord_read(FILE *f, const char *path, int64_t file_bytes, int64_t max_bytes, int64_t *offset,
                       dg_tensor **out, dg_status *st);

#endif
