/* pool.c : the CPU backend's fixed thread pool (see pool.h).
 *
 * Workers sleep on a condition variable and wake for each job; tasks are taken
 * from an atomic counter. The pool is (re)built lazily when the thread count
 * setting changes. The caller's thread works as thread 0.
 *
 * The default thread count (FLASHC_NUM_THREADS, else the online cores) is read
 * once: sysconf(_SC_NPROCESSORS_ONLN) opens and reads a file under /sys on
 * glibc, about 6 us, which every call paid up to three times (workspace size,
 * run, pool) when it was read per call.
 */
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "../internal.h"

/* ---- thread count setting ---- */
static atomic_int fc_threads_setting; /* 0 = default */
static atomic_int fc_threads_default; /* 0 = not read yet */

static int fc_read_default_threads(void) {
    const char *env = getenv("FLASHC_NUM_THREADS");
    if (env && *env) {
        char *end = NULL;
        long n = strtol(env, &end, 10);
        if (end && *end == '\0' && n >= 1 && n <= 4096) return (int)n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)(n > 4096 ? 4096 : n) : 1;
}

/* Read on first use; two threads racing here read the same value. */
static int fc_default_threads(void) {
    int n = atomic_load_explicit(&fc_threads_default, memory_order_relaxed);
    if (n == 0) {
        n = fc_read_default_threads();
        atomic_store_explicit(&fc_threads_default, n, memory_order_relaxed);
    }
    return n;
}

void flashc_set_num_threads(int n) { atomic_store(&fc_threads_setting, n > 0 ? n : 0); }

int flashc_get_num_threads(void) { return fc_cpu_num_threads(); }

int fc_cpu_num_threads(void) {
    int n = atomic_load(&fc_threads_setting);
    return n > 0 ? n : fc_default_threads();
}

/* ---- the pool ---- */
typedef struct fc_pool {
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    pthread_t *workers;
    int nworkers;           /* threads besides the caller */
    uint64_t generation;    /* bumped per job */
    int busy;               /* workers still inside the current job */
    int quit;
    /* the current job */
    fc_task_fn fn;
    void *ctx;
    int64_t ntasks;
    atomic_llong next;
} fc_pool;

static fc_pool fc_the_pool = {.mu = PTHREAD_MUTEX_INITIALIZER,
                              .wake = PTHREAD_COND_INITIALIZER,
                              .done = PTHREAD_COND_INITIALIZER};
static pthread_mutex_t fc_pool_owner = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static _Thread_local int fc_in_task;

static void fc_pool_work(fc_pool *p, fc_task_fn fn, void *ctx, int64_t ntasks, int thread) {
    fc_in_task = 1;
    for (;;) {
        int64_t t = atomic_fetch_add(&p->next, 1);
        if (t >= ntasks) break;
        fn(ctx, t, thread);
    }
    fc_in_task = 0;
}

typedef struct { fc_pool *pool; int thread; } fc_worker_arg;

static void *fc_worker_main(void *arg) {
    fc_worker_arg w = *(fc_worker_arg *)arg;
    free(arg);
    fc_pool *p = w.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        fc_task_fn fn = p->fn;
        void *ctx = p->ctx;
        int64_t ntasks = p->ntasks;
        pthread_mutex_unlock(&p->mu);
        fc_pool_work(p, fn, ctx, ntasks, w.thread);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void fc_pool_stop(fc_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nworkers; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    p->workers = NULL;
    p->nworkers = 0;
    p->quit = 0;
    p->generation = 0; /* workers start with seen = 0: not the last job's generation */
}

/* Make the pool have n-1 workers; on failure it keeps as many as started. */
static void fc_pool_resize(fc_pool *p, int n) {
    if (p->nworkers == n - 1) return;
    fc_pool_stop(p);
    if (n <= 1) return;
    p->workers = (pthread_t *)calloc((size_t)(n - 1), sizeof(pthread_t));
    if (!p->workers) return;
    for (int i = 0; i < n - 1; i++) {
        fc_worker_arg *arg = (fc_worker_arg *)malloc(sizeof *arg);
        if (!arg) break;
        arg->pool = p;
        arg->thread = i + 1;
        if (pthread_create(&p->workers[i], NULL, fc_worker_main, arg) != 0) {
            free(arg);
            break;
        }
        p->nworkers++;
    }
}

void fc_pool_run(int64_t ntasks, fc_task_fn fn, void *ctx) {
    fc_pool_run_on(ntasks, fc_cpu_num_threads(), fn, ctx);
}

void fc_pool_run_on(int64_t ntasks, int nthreads, fc_task_fn fn, void *ctx) {
    if (ntasks <= 0) return;
    int n = fc_cpu_num_threads();
    /* the pool's threads are numbered up to n - 1: the caller's scratch must
     * cover them all (nthreads < n also when the setting grew since it was sized) */
    if (n <= 1 || nthreads < n || ntasks == 1 || fc_in_task ||
        pthread_mutex_trylock(&fc_pool_owner) != 0) {
        for (int64_t t = 0; t < ntasks; t++) fn(ctx, t, 0);
        return;
    }
    fc_pool *p = &fc_the_pool;
    fc_pool_resize(p, n);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->ntasks = ntasks;
    atomic_store(&p->next, 0);
    p->busy = p->nworkers;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    fc_pool_work(p, fn, ctx, ntasks, 0);

    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&fc_pool_owner);
}
