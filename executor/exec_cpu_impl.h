/* The CPU device type's process-wide calls, for code outside executor/cpu/ (whose own header,
 * cpu/cpu_impl.h, only the executor sees): registering its kernels, the threads of its GEMM
 * and the one-line summary of the CPU. */
#ifndef DG_EXEC_CPU_IMPL_H
#define DG_EXEC_CPU_IMPL_H

// The CPU device type's register_kernels (executor/cpu/cpu_register.c).
void exec_cpu_register(void);
// The threads one large CPU GEMM is split over, process-wide: n, or for n <= 0 the cores this
// process may use (executor/cpu/gemm.c).
void exec_cpu_set_threads(int n);
// The CPU, its vector instructions, what runs the GEMM and its threads, in one line
// (dg_cpu_summary). Returns: borrowed, valid on this thread until its next call.
const char *exec_cpu_summary(void);
// Prints "distgraph: cpu: " and exec_cpu_summary() to stderr, once per process
// (executor/cpu/cpu_summary.c).
void exec_cpu_announce(void);

#endif
