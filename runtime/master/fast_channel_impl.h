/* The local channel of a remote session. When a client and its master run on one host, a
 * step need not cross the sockets: through ZeroMQ a request and its answer wake about eight
 * threads (the client's I/O thread and ZeroMQ's on each side, the master's I/O thread and the
 * thread that runs the step), and on a loaded machine each wake-up is a context switch. Here
 * the client writes the request into a shared-memory region and wakes the master's thread for
 * the session with a futex; that thread runs the step and writes the answer back the same
 * way: two wake-ups a step.
 *
 * The client creates the region (POSIX shared memory, mode 0600, this user's) and asks the
 * master to attach it with ATTACH_CHANNEL over the session's connection, which CurveZMQ
 * authenticates where keys are in use; the master opens it only if it is this user's, mode
 * 0600, of the size its header says. The client then unlinks the name, so the memory goes
 * when both sides have unmapped it. A request or answer that does not fit its half of the
 * region goes over the socket (an answer is parked and taken with TAKE_ANSWER).
 *
 * Layout: a 4 KiB header (magic, version, sizes, the creator's pid, one sequence word per
 * direction, a closed word, the length of each direction's message), then the request half,
 * then the answer half. A message is the msgpack header of the socket's wire format, then one
 * frame per tensor it describes, each as [u64 length][bytes] padded to 8: the tensor's bytes,
 * or a shared-memory slot's descriptor (shm_impl.h) for 64 KiB to 1 MiB.
 *
 * The reader copies what it reads out of the region before it decodes it (the writer may
 * scribble meanwhile: only its own step's values can come out wrong), checks every length
 * against the region, and decodes the header as one from the socket (rt_header_decode). */
#ifndef DG_FAST_CHANNEL_IMPL_H
#define DG_FAST_CHANNEL_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shm_impl.h"
#include "wire_impl.h"

typedef struct fc_region fc_region;

enum { FC_REQUEST = 0, FC_ANSWER = 1 };
// Each half of the region (the request's, the answer's).
#define FC_HALF_BYTES ((size_t)4 << 20)
#define FC_NAME_BYTES 64

typedef enum fc_wait_result { FC_READY, FC_TIMEOUT, FC_CLOSED } fc_wait_result;

// The client: a new region (stale ones of dead processes removed). Returns: new, free with
// fc_free; NULL with st set (no shared memory: the session goes over the socket).
fc_region *fc_create(dg_status *st);
// Its name, for ATTACH_CHANNEL. Borrowed.
const char *fc_name(const fc_region *r);
// Removes the name (the mappings stay). Idempotent.
void fc_unlink(fc_region *r);
// The master: maps the region a client named, after checking it (owner, mode, size, header)
// and claiming it (a region is attached once). Returns: new, free with fc_free; NULL with st
// set (INVALID_ARGUMENT naming what is wrong, FAILED_PRECONDITION when claimed already).
fc_region *fc_attach(const char *name, dg_status *st);
// Unmaps (and unlinks a name the client still holds).
void fc_free(fc_region **r);

// Writes a message into side's half. shm: slots for tensors of 64 KiB to 1 MiB (NULL: all
// inline). false when it does not fit (nothing is published).
bool fc_put(fc_region *r, int side, const rt_header *h, dg_tensor *const *ts, int n, rt_shm_pool *shm);
// Writes len bytes (at most a half) as side's message and declared_len as its length, as a
// hostile process of the same user could (tests and fuzzing).
void fc_put_raw(fc_region *r, int side, const void *bytes, size_t len, uint64_t declared_len);
// Publishes side's message and wakes the other party.
void fc_post(fc_region *r, int side);
// Waits until side's sequence moves past *seen (then *seen is updated: FC_READY, also after a
// close), the channel is closed (FC_CLOSED), or timeout_ms passes (FC_TIMEOUT; a close that
// races with the start of the wait is seen only then).
fc_wait_result fc_wait(fc_region *r, int side, uint32_t *seen, int64_t timeout_ms);
// As fc_wait, polling (yielding the CPU between looks) for at most spin_us instead of
// sleeping; FC_TIMEOUT when nothing came meanwhile. A thread that expects a message soon
// saves the other side's wake-up (a futex call, and on a virtual machine an idle CPU's exit).
fc_wait_result fc_wait_spin(fc_region *r, int side, uint32_t *seen, int64_t spin_us);
// The current sequence of side.
uint32_t fc_seq(fc_region *r, int side);
// Reads side's message: *h decoded and checked, *ts new tensors (the caller unrefs them and
// frees the array), their count *n. false with st set (INVALID_ARGUMENT) on a malformed one.
bool fc_take(fc_region *r, int side, rt_header *h, dg_tensor ***ts, int *n, dg_status *st);
// Marks the channel closed and wakes both sides. Safe from any thread, any number of times.
void fc_close(fc_region *r);
bool fc_closed(fc_region *r);

#endif
