"""Fashion-MNIST for the peer scripts (torch_cnn.py, tf_cnn.py): reads the IDX .gz files of
Debian's dataset-fashion-mnist package (/usr/share/datasets/fashion-mnist, or $FMNIST_DIR)
with gzip and numpy, and samples epoch-shuffled mini-batches.

Imports nothing heavy at module level (numpy is imported when data is loaded), so a script
can set its thread environment variables before its framework is imported.
"""
import gzip
import os
import struct

DATA_DIR = os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def set_thread_env(n):
    """OpenMP / MKL / OpenBLAS pools to n threads; must run before the framework is imported."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)


def missing_files(data_dir=DATA_DIR):
    return [f for f in FILES if not os.path.isfile(os.path.join(data_dir, f))]


def _read_idx(path, magic_want, header_ints):
    import numpy as np
    with gzip.open(path, "rb") as f:
        buf = f.read()
    head = struct.unpack(">" + "i" * header_ints, buf[:4 * header_ints])
    if head[0] != magic_want:
        raise ValueError("bad IDX magic %d in %s (want %d)" % (head[0], path, magic_want))
    arr = np.frombuffer(buf, dtype=np.uint8, offset=4 * header_ints)
    want = 1
    for d in head[1:]:
        want *= d
    if arr.size != want:
        raise ValueError("%s: %d bytes of data, header says %d" % (path, arr.size, want))
    return arr.reshape(head[1:])


def load(data_dir=DATA_DIR):
    """Returns (xtr, ytr, xte, yte): images float32 [N,28,28,1] (NHWC) with pixel/255 in
    [0,1], labels int64 [N]; 60000 training and 10000 test examples."""
    import numpy as np
    p = lambda name: os.path.join(data_dir, name)
    xtr = _read_idx(p(FILES[0]), 2051, 4)
    ytr = _read_idx(p(FILES[1]), 2049, 2)
    xte = _read_idx(p(FILES[2]), 2051, 4)
    yte = _read_idx(p(FILES[3]), 2049, 2)
    if xtr.shape != (60000, 28, 28) or xte.shape != (10000, 28, 28) \
            or ytr.shape != (60000,) or yte.shape != (10000,):
        raise ValueError("unexpected Fashion-MNIST shapes %s %s %s %s"
                         % (xtr.shape, ytr.shape, xte.shape, yte.shape))
    f = lambda x: (x.astype(np.float32) / 255.0).reshape(-1, 28, 28, 1)
    return f(xtr), ytr.astype(np.int64), f(xte), yte.astype(np.int64)


class BatchSampler:
    """Random mini-batches without replacement within an epoch: the training set is
    reshuffled whenever fewer than a batch of examples are left (like next_batch)."""

    def __init__(self, n, batch_size, seed):
        import numpy as np
        self.n, self.bs = n, batch_size
        self.rng = np.random.RandomState(seed)
        self._shuffle()

    def _shuffle(self):
        self.perm = self.rng.permutation(self.n)
        self.pos = 0

    def next(self):
        if self.pos + self.bs > self.n:
            self._shuffle()
        idx = self.perm[self.pos:self.pos + self.bs]
        self.pos += self.bs
        return idx


def stats(times_ms):
    """mean, median, p10, p90 of a list of step times in ms."""
    import statistics
    t = sorted(times_ms)
    q = lambda f: t[min(len(t) - 1, int(f * len(t)))]
    return statistics.fmean(t), statistics.median(t), q(0.1), q(0.9)
