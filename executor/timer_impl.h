/* A process-wide timer: one thread, started on first use, runs callbacks at their deadlines
 * (a list sorted by deadline; few timers are pending at once). Kernels that wait (the sync
 * replicas' TakeGradient and Dequeue) use it for their own deadlines.
 * Callbacks run on the timer thread, one at a time, and must not block. */
#ifndef DG_TIMER_IMPL_H
#define DG_TIMER_IMPL_H

#include <stdbool.h>
#include <stdint.h>

typedef void (*exec_timer_fn)(void *arg);

// Milliseconds on the monotonic clock.
int64_t exec_timer_now_ms(void);
// Calls fn(arg) on the timer thread once delay_ms from now, unless cancelled first. Returns
// the timer's id (> 0); 0 when the timer could not be started (out of memory, no thread),
// in which case fn is never called.
uint64_t exec_timer_add(int64_t delay_ms, exec_timer_fn fn, void *arg);
// Cancels timer id. Returns true when fn will not run; false when it has run, is running,
// or id is unknown (0 included). Never waits for a running callback.
bool exec_timer_cancel(uint64_t id);
// Number of pending timers (for tests).
int exec_timer_pending(void);

#endif
