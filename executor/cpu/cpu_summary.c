/* What runs on this CPU, in words: the CPU, its vectors, the GEMM of each dtype (gemm.c's
 * float32 and float64, gemm16.c's 16-bit floats) and the threads; printed once per process
 * that makes a session and by dg-inspect cpu. */
#include <stdatomic.h>
#include <stdio.h>

#include "cpu_impl.h"
#include "exec_cpu_impl.h"

// What the summary says of a provider's vectors: narrower than the CPU's (and not by the cap),
// capped, or above the cap because the provider cannot be capped (OpenBLAS fixes its kernels
// when it loads: OPENBLAS_CORETYPE).
static const char *isa_note(const cpu_gemm_info *i, cpu_isa used) {
    if (used < i->cap) return ", NARROWER than the CPU";
    if (used < i->cpu) return ", capped by DG_MAX_CPU_ISA";
    if (used > i->cap) return ", not capped by DG_MAX_CPU_ISA (OPENBLAS_CORETYPE does)";
    return "";
}

const char *exec_cpu_summary(void) {
    static __thread char line[640];
    const cpu_gemm_info *i = cpu_gemm_get_info();
    char feats[64] = "";
    snprintf(feats, sizeof feats, "%s%s%s%s", i->has_vnni ? " vnni" : "", i->has_bf16 ? " bf16" : "",
             i->has_fp16 ? " fp16" : "", i->has_amx ? " amx" : "");
    snprintf(line, sizeof line,
             "%s; vector ISA %s%s%s%s; GEMM float32 %s %s%s%s, float64 %s %s%s, bfloat16 %s, float16 %s; "
             "intra-op threads %d",
             i->model, cpu_isa_name(i->cpu), *feats ? " (" : "", *feats ? feats + 1 : "", *feats ? ")" : "",
             i->f32_provider, i->f32_kernel, isa_note(i, i->f32_isa),
             i->f32_sparse ? " (a mostly-zero A: its nonzeros only)" : "", i->f64_provider, i->f64_kernel,
             isa_note(i, i->f64_isa), cpu_gemm16_summary(DG_BFLOAT16), cpu_gemm16_summary(DG_FLOAT16),
             exec_cpu_threads());
    return line;
}

void exec_cpu_announce(void) {
    static atomic_bool said;
    if (!atomic_exchange(&said, true)) fprintf(stderr, "distgraph: cpu: %s\n", exec_cpu_summary());
}
