"""PyTorch's side of bench/dataset_compare.sh: records per second of a DataLoader (WORKERS
worker processes, shuffled, batches of BATCH) over TFRecord shards written by dg-tfrecord. The
Dataset finds the records by reading the TFRecord framing itself (a little-endian uint64
length, its 4-byte CRC, the data, the data's 4-byte CRC; the CRCs are not checked) and parses
each record into a float32 image [784] scaled by 1/255 and an int64 label (the record's first
8 bytes, little-endian). Read EPOCHS times. Prints one JSON line.

usage: torch_dataset.py [--epochs N] [--workers W] [--batch K] FILE...
"""
import argparse
import json
import struct
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class TFRecordFiles(Dataset):
    """Every record of the files, by (file, offset of its data, length)."""

    def __init__(self, files):
        self.files = files
        self.index = []
        for fi, path in enumerate(files):
            with open(path, "rb") as f:
                at = 0
                while True:
                    head = f.read(12)
                    if len(head) < 12:
                        break
                    (n,) = struct.unpack("<Q", head[:8])
                    self.index.append((fi, at + 12, n))
                    f.seek(n + 4, 1)
                    at += 16 + n
        self.handles = {}   # opened in each worker process, on first use

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        fi, off, n = self.index[i]
        f = self.handles.get(fi)
        if f is None:
            f = self.handles[fi] = open(self.files[fi], "rb")
        f.seek(off)
        rec = f.read(n)
        (label,) = struct.unpack("<q", rec[:8])
        image = torch.from_numpy(np.frombuffer(rec, dtype=np.uint8, offset=8).astype(np.float32) * (1.0 / 255.0))
        return image, label


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ds = TFRecordFiles(a.files)
    loader = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                        generator=torch.Generator().manual_seed(1))
    records, total = 0, 0.0
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        for image, label in loader:
            records += int(image.shape[0])
            total += float(image.numpy()[0, 0]) + float(label.numpy()[0])
    s = time.perf_counter() - t0
    print(json.dumps({"bench": "dataset", "system": "torch", "version": torch.__version__,
                      "records_per_s": round(records / s), "records": records, "epochs": a.epochs,
                      "seconds": round(s, 3), "workers": a.workers, "batch": a.batch,
                      "checksum": round(total, 1)}))


if __name__ == "__main__":
    main()
