/* The floating-point mode kernels run in (the executor sets it around each kernel, the CPU's
 * GEMM threads for their whole life).
 *
 * Kernels run with denormal floats flushed to zero and read as zero (x86's FTZ and DAZ), as
 * TensorFlow runs its CPU kernels: arithmetic on a denormal costs about a hundred cycles on
 * x86, and Adam's moments of a weight whose gradient stays zero (a border pixel of MNIST)
 * decay into them within a few hundred steps, which made ApplyAdam a third of a training
 * step. exec_fp_enter sets the mode on this thread and returns the one to restore with
 * exec_fp_leave (a caller's own thread keeps its mode outside the kernels). */
#ifndef DG_EXEC_FP_IMPL_H
#define DG_EXEC_FP_IMPL_H

#if defined(__SSE2__)
#include <xmmintrin.h>
static inline unsigned exec_fp_enter(void) {
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040);   // FTZ (bit 15) and DAZ (bit 6)
    return old;
}
static inline void exec_fp_leave(unsigned old) { _mm_setcsr(old); }
#else
static inline unsigned exec_fp_enter(void) { return 0; }
static inline void exec_fp_leave(unsigned old) { (void)old; }
#endif

#endif
