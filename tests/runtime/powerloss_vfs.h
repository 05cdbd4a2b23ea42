/* A test-only SQLite VFS that simulates power loss, for tests/runtime/test_checkpoint_powerloss.c.
 * It wraps the default (unix) VFS: every call reaches the real files, and meanwhile the shim
 * keeps, per database, journal and WAL file, the content that is durable (what the last xSync
 * of that file covered) and the writes and truncations made since. The -shm file is not
 * tracked: it is rebuilt after a crash, so at a cut it is simply lost. After a chosen number
 * of xWrite/xSync/xTruncate calls (counted over all files) the power goes: that call and
 * every later one fails with an SQLITE_IOERR code, so the program sees errors, never a false
 * success. plvfs_write_crash_state() then writes what a disk could hold after the cut: the
 * durable content plus a random subset of the later writes, cut into 512-byte sectors
 * (torn and reordered writes). One process, one thread; not for production. */
#ifndef DG_TEST_POWERLOSS_VFS_H
#define DG_TEST_POWERLOSS_VFS_H

#include <stdbool.h>
#include <stdint.h>

#define PLVFS_SECTOR_BYTES 512

// Registers the shim over the current default VFS (once per process) and makes it the
// default. False if SQLite has no default VFS or memory runs out.
bool plvfs_install(void);
// Makes the wrapped VFS the default again and unregisters the shim; forgets every file.
void plvfs_uninstall(void);
// true: the shim is the default VFS (connections opened now are observed); false: the
// wrapped VFS is, and connections opened now bypass the shim entirely.
void plvfs_set_default(bool use_shim);

// Forgets every tracked file and arms the next cut: the first cut_after_ops counted calls
// succeed, the next fails and so does everything after it. cut_after_ops < 0: never cut.
void plvfs_reset(int64_t cut_after_ops);
// Counted calls (xWrite, xSync, xTruncate) that succeeded since plvfs_reset().
int64_t plvfs_n_ops(void);
// Whether the cut has happened.
bool plvfs_is_cut(void);
// Counted call i (0-based) since plvfs_reset(): 'w' xWrite, 's' xSync, 't' xTruncate; 0 for
// a call not made (yet).
char plvfs_op_kind(int64_t i);

typedef struct plvfs_crash_stats {
    int n_files;              // files written
    int64_t n_pieces;         // unsynced sector pieces and truncations seen
    int64_t n_applied;        // of those, how many reached the simulated disk
} plvfs_crash_stats;

// Writes into directory dir (which must exist), under each tracked file's base name, the
// content the file could have after a power cut now: its durable content, then each write or
// truncation since its last xSync, in order, where each 512-byte sector piece of a write
// (and each truncation) is kept with probability keep_prob, drawn from a PRNG seeded with
// seed. Deleted files are absent, and so is every -shm file. stats may be NULL. False (and a
// message on stderr) on an I/O error.
bool plvfs_write_crash_state(const char *dir, uint64_t seed, double keep_prob,
                             plvfs_crash_stats *stats);

#endif
