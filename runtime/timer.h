/* runtime/timer.h: wall-clock timing for step times and throughput. */
#ifndef MT_RUNTIME_TIMER_H
#define MT_RUNTIME_TIMER_H

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds since an arbitrary fixed point, from the monotonic clock
 * (clock_gettime(CLOCK_MONOTONIC)): never goes backwards, unaffected by changes
 * of the system time. Only differences are meaningful. Resolution ~1 ns. */
double mt_time_now(void);

#ifdef __cplusplus
}
#endif
#endif
