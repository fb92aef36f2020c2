/* msl_emu/counters.h -- what the fake Metal runtime has done since start (or the last reset).
 *
 * The engine reports host_waits_per_token and kernels_per_token from these in the emulated
 * Metal build; tests use them to check that host code batches its work as intended.
 * Counted at execution (commit), so commands of a buffer that failed are not counted after
 * the failing one. Thread-safe; msl_emu_counters() returns a consistent-enough snapshot. */
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct MslEmuCounters {
  uint64_t command_buffers_committed; /* commit calls */
  uint64_t waits;                     /* waitUntilCompleted calls */
  uint64_t dispatches;                /* compute dispatches executed, indirect ones included */
  uint64_t indirect_dispatches;       /* of which dispatchThreadgroupsWithIndirectBuffer */
  uint64_t blits;                     /* blit commands executed (copies and fills) */
} MslEmuCounters;

MslEmuCounters msl_emu_counters(void);
void msl_emu_reset_counters(void);

#ifdef __cplusplus
}
#endif
