/* pool.h : the CPU backend's fixed thread pool.
 *
 * One process-wide pool of fc_cpu_num_threads() threads (the caller's thread is
 * thread 0). fc_pool_run hands tasks out dynamically, so a task must write only
 * its own outputs: results never depend on which thread ran what.
 */
#ifndef FLASHC_CPU_POOL_H
#define FLASHC_CPU_POOL_H

#include <stdint.h>

typedef void (*fc_task_fn)(void *ctx, int64_t task, int thread);

/* Run fn(ctx, t, thread) for every t in [0, ntasks), thread in
 * [0, fc_cpu_num_threads()); returns when all have finished. A call made from
 * inside a task, or while another thread's call holds the pool, runs all of its
 * tasks on the calling thread as thread 0 (each call has its own workspace, so
 * per-thread scratch never collides). */
void fc_pool_run(int64_t ntasks, fc_task_fn fn, void *ctx);

/* fc_pool_run for a caller whose per-thread scratch covers threads [0, nthreads):
 * the pool runs the tasks only when nthreads >= fc_cpu_num_threads(), else the
 * calling thread runs them all as thread 0. nthreads = 1 is the small-call path
 * (fwd.c): no worker is woken (a wake-up and the join cost 10-30 us). */
void fc_pool_run_on(int64_t ntasks, int nthreads, fc_task_fn fn, void *ctx);

#endif /* FLASHC_CPU_POOL_H */
