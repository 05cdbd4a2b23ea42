/* Short time slices for the threads that move messages: the transport's I/O thread and
 * ZeroMQ's I/O threads ("ZMQbg/IO/<n>").
 *
 * Linux's EEVDF scheduler (6.6 on) lets a thread that wakes up preempt the running one only
 * when the woken thread's virtual deadline is earlier; from 6.12 a thread may ask for its own
 * slice (sched_setattr's sched_runtime under SCHED_OTHER), and a thread with a shorter slice
 * than the running one's preempts it when it wakes. A stage of a pipeline that computes on
 * the only core it may use otherwise holds the message threads off until its kernel's slice
 * ends: a gradient sent while the next piece computes leaves a millisecond or more later. A
 * shorter slice changes when these threads run, not how much CPU time they get; it needs no
 * privilege. Older kernels ignore the field (the call succeeds and nothing changes). */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "transport_impl.h"

// struct sched_attr of sched_setattr(2) (glibc has no wrapper before 2.41).
typedef struct io_sched_attr {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
} io_sched_attr;

bool rt_io_thread_slice(pid_t tid, int64_t slice_us) {
#if defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
    io_sched_attr a;
    memset(&a, 0, sizeof a);
    // The thread's own policy and nice value kept: only SCHED_OTHER threads get a slice.
    if (syscall(SYS_sched_getattr, tid, &a, sizeof a, 0) != 0 || a.policy != SCHED_OTHER) return false;
    a.size = sizeof a;
    a.flags = 0;
    a.runtime = (uint64_t)slice_us * 1000;
    return syscall(SYS_sched_setattr, tid, &a, 0) == 0;
#else
    (void)tid;
    (void)slice_us;
    return false;
#endif
}

int rt_io_threads_slice(int64_t slice_us) {
    if (slice_us <= 0) return 0;
    int n = rt_io_thread_slice(0, slice_us) ? 1 : 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return n;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", de->d_name);
        FILE *f = fopen(path, "re");
        if (!f) continue;
        if (fgets(comm, sizeof comm, f) && strncmp(comm, "ZMQbg/IO/", 9) == 0 &&
            rt_io_thread_slice((pid_t)atoi(de->d_name), slice_us))
            n++;
        fclose(f);
    }
    closedir(d);
    return n;
}
