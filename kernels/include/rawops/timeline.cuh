// Experiments only (a variant built by dev/cubins.py with RAWOPS_TIMELINE): per-block or per-warp
// timestamps read back from the module global `rawops_timeline`, to see where a kernel's time
// goes (launch ramp, wait for the first data, math, barriers, the tail) where ncu gives only
// totals. The shipped build has neither the global nor the stamps.
#pragma once

#ifdef RAWOPS_TIMELINE
#ifndef RAWOPS_TIMELINE_SLOTS
#define RAWOPS_TIMELINE_SLOTS 8192
#endif
constexpr int kTimelineMarks = 8;  // per slot: the caller's marks; the last one holds the SM id

// Slot-major: rawops_timeline[slot][mark], nanoseconds of %globaltimer.
__device__ unsigned long long rawops_timeline[RAWOPS_TIMELINE_SLOTS][kTimelineMarks];

namespace rawops {

__device__ __forceinline__ unsigned long long timeline_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

// The time once `value` has been computed: the asm takes it as an input, so the stamp waits
// for it (a load's data, an mma's result) instead of being scheduled ahead of it.
__device__ __forceinline__ unsigned long long timeline_after(unsigned value) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(value) : "memory");
  return t;
}

__device__ __forceinline__ unsigned timeline_smid() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// Mark `mark` of slot `slot`, written as it is taken (marks held in registers until the end
// made the small-batch linear spill). Mark 0 also records the SM id in the slot's last mark.
__device__ __forceinline__ void timeline_mark(int slot, int mark, unsigned long long t) {
  if (slot >= RAWOPS_TIMELINE_SLOTS) return;
  rawops_timeline[slot][mark] = t;
  if (mark == 0) rawops_timeline[slot][kTimelineMarks - 1] = timeline_smid();
}

}  // namespace rawops
#endif
