/* Shared memory between the transports of one host: tensor bytes that travel to a peer on
 * the same machine are copied into a slot of a region the sender owns (POSIX shared memory,
 * mode 0600) and only a small descriptor crosses the socket; the receiver maps the region
 * once and reads the bytes in place, and dropping its tensor frees the slot. This halves the
 * copies of a large frame (no kernel socket buffers) and takes the bytes off the TCP stack.
 * A frame that finds no free slot goes over the socket as before, so nothing depends on it.
 *
 * Region layout: a 4 KiB header (magic, version, slot count and size, one atomic state word
 * per slot: 0 free, 1 in flight, 2 being read), then the slots. The sender's I/O thread takes slots; any thread of
 * the receiver frees them (an atomic store), also after the sender is gone. */
#ifndef DG_SHM_IMPL_H
#define DG_SHM_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/status.h"
#include "distgraph/tensor.h"

// A descriptor frame has exactly this many bytes and starts with RT_SHM_MAGIC.
#define RT_SHM_DESC_BYTES 40
#define RT_SHM_MAGIC "DGSHM01"
// Frames from this many bytes up to the slot size go through shared memory.
#define RT_SHM_MIN_BYTES ((size_t)64 << 10)
#define RT_SHM_SLOT_BYTES ((size_t)1 << 20)
#define RT_SHM_SLOTS 64

typedef struct rt_shm_pool rt_shm_pool;

// The sender's region, created now (and stale regions of dead processes removed).
// Returns: new, free with rt_shm_pool_free (unmaps and unlinks); NULL with st set.
rt_shm_pool *rt_shm_pool_new(dg_status *st);
void rt_shm_pool_free(rt_shm_pool **p);
// Copies len bytes into a free slot and writes its descriptor. false (nothing written) when
// len is outside [RT_SHM_MIN_BYTES, RT_SHM_SLOT_BYTES] or no slot is free.
bool rt_shm_put(rt_shm_pool *p, const void *data, size_t len, unsigned char desc[RT_SHM_DESC_BYTES]);
// Slots in use now (for tests).
int rt_shm_pool_in_use(rt_shm_pool *p);

// True when a frame of frame_len bytes standing for expected_len tensor bytes is a descriptor.
bool rt_shm_is_desc(const void *frame, size_t frame_len, size_t expected_len);
// Resolves a descriptor of expected_len bytes: *data points at the bytes in the sender's
// region (mapped read-only, once per process, while used or while the sender lives),
// *slot_state is what rt_shm_release frees. Checks the magic, the region file (this user's,
// mode 0600), its header, the slot index and the lengths. false with st set. A descriptor is
// only taken from a peer on this host (the transport checks).
bool rt_shm_get(const void *desc, size_t expected_len, void **data, void **slot_state, dg_status *st);
// Frees the slot (after the bytes are no longer read) and the reference it held on the region.
void rt_shm_release(void *slot_state);
// Removes the names in /dev/shm "<prefix><pid>-..." whose process has exited (a crash leaves
// them behind).
void rt_shm_remove_stale(const char *prefix);
// Unmaps the regions no slot is held in whose creator has exited. Returns how many went.
int rt_shm_sweep(void);
// Regions of other processes mapped now (for tests).
int rt_shm_num_mappings(void);
// A tensor over the bytes of a descriptor: its deallocator frees the slot. Returns: new; NULL
// with st set.
dg_tensor *rt_shm_tensor(const void *desc, dg_dtype dtype, dg_shape shape, size_t nbytes, dg_status *st);

#endif
