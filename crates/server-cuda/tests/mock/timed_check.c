/*
 * A check of the mocks' timed mode (mock_cuda.c's scope_mock_timing, the
 * mock NCCL's scope_mock_nccl_model) by the wall clock: streams overlap,
 * event waits order, a collective finishes after its latest rank's start
 * plus its cost, and timed mode off is as instant as before. Built and
 * run by timed_check.sh, linked against the two mocks as libcuda.so and
 * libnccl.so. An abort ends a joined all-reduce that has not finished:
 * the peers of a rank whose stream is busy return at the abort.
 * Tolerances are generous (a loaded 2-core machine): a wait may not end
 * before its model time, and may end up to 25% + 5 ms after.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuCtxSynchronize(void);
CUresult cuStreamCreate(void **, unsigned);
CUresult cuStreamSynchronize(void *);
CUresult cuStreamQuery(void *);
CUresult cuStreamWaitEvent(void *, void *, unsigned);
CUresult cuEventCreate(void **, unsigned);
CUresult cuEventRecord(void *, void *);
CUresult cuEventQuery(void *);
CUresult cuEventSynchronize(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemHostAlloc(void **, size_t, unsigned);
CUresult cuMemFreeHost(void *);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, void *);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, void *);
CUresult cuModuleLoadData(void **, const void *);
CUresult cuModuleGetFunction(void **, void *, const char *);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                        void **);
CUresult cuStreamBeginCapture_v2(void *, int);
CUresult cuStreamEndCapture(void *, void **);
CUresult cuGraphInstantiateWithFlags(void **, void *, unsigned long long);
CUresult cuGraphLaunch(void *, void *);
void scope_mock_timing(int);
void scope_mock_kernel_time(const char *, unsigned long long);
void scope_mock_copy_time(unsigned long long);
unsigned long long scope_mock_host_waits(void);
unsigned long long scope_mock_violations(void);

typedef struct { char internal[128]; } ncclUniqueId;
int ncclGetUniqueId(ncclUniqueId *);
int ncclCommInitRankConfig(void **, int, ncclUniqueId, int, void *);
int ncclAllReduce(const void *, void *, size_t, int, int, void *, void *);
int ncclSend(const void *, size_t, int, int, void *, void *);
int ncclRecv(void *, size_t, int, int, void *, void *);
int ncclCommAbort(void *);
void scope_mock_nccl_model(unsigned long long, double);
unsigned long long scope_mock_nccl_violations(void);

enum { NOT_READY = 600, NCCL_INT32 = 2, NCCL_SUM = 0, RANKS = 4 };
#define MS 1000000LL

static int failures;
static long long now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
static double ms(long long ns) { return (double)ns / 1e6; }
static void expect(const char *what, int ok) {
  printf("%-70s %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) failures++;
}
/* `took` ns where the model says `model` ns: not earlier, not much later. */
static void about(const char *what, long long took, long long model) {
  char line[160];
  int ok = took >= model - MS / 10 && took <= model + model / 4 + 5 * MS;
  snprintf(line, sizeof line, "%s: %.2f ms (model %.1f)", what, ms(took), ms(model));
  expect(line, ok);
}
#define CHECK(call) do { int r_ = (call); if (r_) { printf("%s: %d\n", #call, r_); exit(2); } } while (0)

static const char PTX[] =
    ".version 9.0\n.target sm_90\n.scope_mock_entry fill fill 8 8\n.scope_mock_entry copy copy 8 8 4\n";
static void *fill, *copy;
static CUdeviceptr scratch[RANKS];
static void *contexts[RANKS];

static void launch_fill(void *stream, CUdeviceptr at, unsigned value) {
  unsigned scalars[2] = {32, value};
  void *params[] = {&at, scalars};
  CHECK(cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
}

static void launch_copy(void *stream, CUdeviceptr from, CUdeviceptr to) {
  unsigned n = 32;
  void *params[] = {&from, &to, &n};
  CHECK(cuLaunchKernel(copy, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
}

/* ----- one device ----- */

static void single_device(void) {
  void *a, *b, *e;
  CHECK(cuCtxSetCurrent(contexts[0]));
  CHECK(cuStreamCreate(&a, 0));
  CHECK(cuStreamCreate(&b, 0));
  CHECK(cuEventCreate(&e, 0));
  scope_mock_kernel_time("fill", 2 * MS);

  /* Ten 2 ms kernels on one stream. */
  unsigned long long waits = scope_mock_host_waits();
  long long t0 = now();
  for (int i = 0; i < 10; i++) launch_fill(a, scratch[0], (unsigned)i);
  long long issued = now() - t0;
  expect("10 launches return at once (< 1 ms in all)", issued < MS);
  expect("cuStreamQuery right after is NOT_READY", cuStreamQuery(a) == NOT_READY);
  CHECK(cuStreamSynchronize(a));
  about("10 x 2 ms on one stream, cuStreamSynchronize", now() - t0, 20 * MS);
  expect("cuStreamQuery after the sync is ready", cuStreamQuery(a) == 0);
  unsigned out[32];
  CHECK(cuMemcpyDtoHAsync_v2(out, scratch[0], sizeof out, a));
  CHECK(cuStreamSynchronize(a));
  expect("the last fill's bytes are there", out[0] == 9 && out[31] == 9);
  expect("host waits counted (2)", scope_mock_host_waits() - waits == 2);

  /* Two streams overlap. */
  t0 = now();
  for (int i = 0; i < 10; i++) {
    launch_fill(a, scratch[0], 1);
    launch_fill(b, scratch[0] + 128, 2);
  }
  CHECK(cuStreamSynchronize(a));
  CHECK(cuStreamSynchronize(b));
  about("two streams of 10 x 2 ms each (overlapping)", now() - t0, 20 * MS);

  /* B waits for an event recorded on A after 5 x 2 ms. */
  t0 = now();
  for (int i = 0; i < 5; i++) launch_fill(a, scratch[0], 1);
  CHECK(cuEventRecord(e, a));
  for (int i = 0; i < 5; i++) launch_fill(a, scratch[0], 1); /* after the event: B does not wait for these */
  CHECK(cuStreamWaitEvent(b, e, 0));
  launch_fill(b, scratch[0] + 128, 3);
  expect("cuEventQuery before its time is NOT_READY", cuEventQuery(e) == NOT_READY);
  CHECK(cuStreamSynchronize(b));
  about("B's 2 ms kernel after waiting on A's event at 10 ms", now() - t0, 12 * MS);
  CHECK(cuEventSynchronize(e));
  expect("cuEventQuery after its time is ready", cuEventQuery(e) == 0);
  CHECK(cuCtxSynchronize());
  about("cuCtxSynchronize: A's 10 kernels", now() - t0, 20 * MS);

  /* No drift: a thousand 100 us kernels are 100 ms. */
  scope_mock_kernel_time("fill", 100000);
  t0 = now();
  for (int i = 0; i < 1000; i++) launch_fill(a, scratch[0], 1);
  CHECK(cuStreamSynchronize(a));
  about("1000 x 100 us on one stream", now() - t0, 100 * MS);

  /* A graph replays its kernels in order, with their times. */
  scope_mock_kernel_time("fill", 2 * MS);
  void *g, *x;
  CHECK(cuStreamBeginCapture_v2(a, 2));
  for (int i = 0; i < 3; i++) launch_fill(a, scratch[0], 4);
  CHECK(cuStreamEndCapture(a, &g));
  CHECK(cuGraphInstantiateWithFlags(&x, g, 0));
  t0 = now();
  CHECK(cuGraphLaunch(x, a));
  CHECK(cuGraphLaunch(x, a));
  CHECK(cuStreamSynchronize(a));
  about("two replays of a graph of 3 x 2 ms", now() - t0, 12 * MS);

  /* Copies: 8 ms per MiB. */
  scope_mock_copy_time(8 * MS);
  static char host[1 << 20];
  CUdeviceptr big;
  CHECK(cuMemAlloc_v2(&big, sizeof host));
  t0 = now();
  CHECK(cuMemcpyHtoDAsync_v2(big, host, sizeof host, a));
  CHECK(cuMemcpyDtoHAsync_v2(host, big, sizeof host, a));
  CHECK(cuStreamSynchronize(a));
  about("two copies of 1 MiB at 8 ms/MiB", now() - t0, 16 * MS);
  scope_mock_copy_time(0);
}

/* ----- four ranks ----- */

static ncclUniqueId id;
static pthread_barrier_t barrier, pair;
static long long round_start;
static long long took[RANKS];
static unsigned sums[RANKS];
static int early_query[RANKS];
static long long took_drained[RANKS], took_second[RANKS], took_synced[RANKS];
static int watched[RANKS];
static unsigned read_back[RANKS][3];

/* A watchdog, as the scope server's: polls cuEventQuery on an event
 * recorded after the collective, every 0.5 ms, until it is done. */
typedef struct { void *ctx, *event; int ready; } watch;
static void *watchdog(void *arg) {
  watch *w = arg;
  CHECK(cuCtxSetCurrent(w->ctx));
  for (int i = 0; i < 400 && !w->ready; i++) {
    int r = cuEventQuery(w->event);
    if (r == 0) w->ready = 1;
    else if (r != NOT_READY) { printf("watchdog: cuEventQuery %d\n", r); exit(2); }
    else usleep(500);
  }
  return NULL;
}

#define COUNT 1024 /* 4 KiB a rank */
static void *rank_main(void *arg) {
  int r = (int)(long)arg;
  void *comm, *s;
  CHECK(cuCtxSetCurrent(contexts[r]));
  CHECK(cuStreamCreate(&s, 0));
  CUdeviceptr send, recv;
  CHECK(cuMemAlloc_v2(&send, COUNT * 4));
  CHECK(cuMemAlloc_v2(&recv, COUNT * 4));
  static unsigned values[RANKS][COUNT];
  for (int i = 0; i < COUNT; i++) values[r][i] = (unsigned)(r + 1) * 1000 + (unsigned)i;
  CHECK(cuMemcpyHtoDAsync_v2(send, values[r], sizeof values[r], s));
  CHECK(cuStreamSynchronize(s));
  CHECK(ncclCommInitRankConfig(&comm, RANKS, id, r, NULL));
  unsigned out[COUNT];
  char line[128];

  /* Round 0: rank 3 first runs a 20 ms kernel; every rank's all-reduce
   * then ends at 20 + 1 + 10 ms. */
  pthread_barrier_wait(&barrier);
  if (r == 0) round_start = now();
  pthread_barrier_wait(&barrier);
  if (r == 3) {
    scope_mock_kernel_time("fill", 20 * MS);
    launch_fill(s, scratch[r], 1);
  }
  CHECK(ncclAllReduce((void *)send, (void *)recv, COUNT, NCCL_INT32, NCCL_SUM, comm, s));
  CHECK(cuStreamSynchronize(s));
  took[r] = now() - round_start;
  CHECK(cuMemcpyDtoHAsync_v2(out, recv, sizeof out, s));
  CHECK(cuStreamSynchronize(s));
  sums[r] = out[7];
  pthread_barrier_wait(&barrier);
  if (r == 0) {
    for (int q = 0; q < RANKS; q++) {
      snprintf(line, sizeof line, "rank %d: all-reduce behind rank 3's 20 ms kernel, synced", q);
      about(line, took[q], 31 * MS);
      expect("  its sum", sums[q] == 10 * 1000 + 4 * 7);
    }
  }
  pthread_barrier_wait(&barrier); /* reported before the next round writes */

  /* Round 1: rank 0 posts first, then a 2 ms kernel and an event, then
   * 300 kernels of 10 us each followed by an event (a chain of work whose
   * time is unknown until the peers post); a second stream waits on an
   * event recorded right after the all-reduce. The others post 5 ms
   * later. Until then none of rank 0's work is done. */
  long long t_second = 0, t_event = 0;
  if (r == 0) {
    scope_mock_kernel_time("fill", 2 * MS);
    scope_mock_kernel_time("copy", 10000);
    void *e, *after, *each, *s2;
    CHECK(cuEventCreate(&e, 0));
    CHECK(cuEventCreate(&after, 0));
    CHECK(cuEventCreate(&each, 0));
    CHECK(cuStreamCreate(&s2, 0));
    round_start = now();
    CHECK(ncclAllReduce((void *)send, (void *)recv, COUNT, NCCL_INT32, NCCL_SUM, comm, s));
    CHECK(cuEventRecord(after, s));
    launch_fill(s, scratch[r], 1);
    CHECK(cuEventRecord(e, s));
    for (int i = 0; i < 300; i++) {
      launch_copy(s, scratch[r], scratch[r] + 256);
      CHECK(cuEventRecord(each, s));
    }
    CHECK(cuStreamWaitEvent(s2, after, 0));
    launch_fill(s2, scratch[r] + 512, 1);
    early_query[0] = cuStreamQuery(s) == NOT_READY && cuEventQuery(e) == NOT_READY &&
                     cuEventQuery(after) == NOT_READY && cuStreamQuery(s2) == NOT_READY;
    pthread_barrier_wait(&barrier);
    CHECK(cuStreamSynchronize(s2));
    t_second = now() - round_start;
    CHECK(cuEventSynchronize(e));
    t_event = now() - round_start;
    CHECK(cuCtxSynchronize());
  } else {
    pthread_barrier_wait(&barrier);
    usleep(5000);
    CHECK(ncclAllReduce((void *)send, (void *)recv, COUNT, NCCL_INT32, NCCL_SUM, comm, s));
    CHECK(cuStreamSynchronize(s));
  }
  took[r] = now() - round_start;
  pthread_barrier_wait(&barrier);
  if (r == 0) {
    expect("rank 0: before its peers post, stream and event are NOT_READY", early_query[0]);
    about("rank 0: a second stream, waiting on an event after the all-reduce, + 2 ms", t_second, 18 * MS);
    about("rank 0: event after all-reduce (peers post at 5 ms) + 2 ms kernel", t_event, 18 * MS);
    about("rank 0: cuCtxSynchronize, + 300 x 10 us", took[0], 21 * MS);
    for (int q = 1; q < RANKS; q++) {
      snprintf(line, sizeof line, "rank %d: all-reduce posted at 5 ms, synced", q);
      about(line, took[q], 16 * MS);
    }
  }
  pthread_barrier_wait(&barrier); /* reported before the next round writes */

  /* Round 2: each rank replays a graph of a 2 ms kernel and the all-reduce. */
  void *g, *x;
  CHECK(cuStreamBeginCapture_v2(s, 2));
  launch_fill(s, scratch[r], 1);
  CHECK(ncclAllReduce((void *)send, (void *)recv, COUNT, NCCL_INT32, NCCL_SUM, comm, s));
  CHECK(cuStreamEndCapture(s, &g));
  CHECK(cuGraphInstantiateWithFlags(&x, g, 0));
  CHECK(cuMemcpyHtoDAsync_v2(recv, values[r], 4, s)); /* clobber, to see it rewritten */
  CHECK(cuStreamSynchronize(s));
  pthread_barrier_wait(&barrier);
  if (r == 0) round_start = now();
  pthread_barrier_wait(&barrier);
  CHECK(cuGraphLaunch(x, s));
  CHECK(cuStreamSynchronize(s));
  took[r] = now() - round_start;
  CHECK(cuMemcpyDtoHAsync_v2(out, recv, sizeof out, s));
  CHECK(cuStreamSynchronize(s));
  sums[r] = out[0];
  pthread_barrier_wait(&barrier);
  if (r == 0) {
    for (int q = 0; q < RANKS; q++) {
      snprintf(line, sizeof line, "rank %d: graph replay of 2 ms kernel + all-reduce", q);
      about(line, took[q], 13 * MS);
      expect("  its sum", sums[q] == 10 * 1000);
    }
  }
  pthread_barrier_wait(&barrier); /* reported before the next round writes */

  /* Round 3: a send from rank 1 to rank 2: 1 + 10 ms. */
  if (r == 1 || r == 2) {
    pthread_barrier_wait(&pair);
    if (r == 1) round_start = now();
    pthread_barrier_wait(&pair);
    if (r == 1) CHECK(ncclSend((void *)send, COUNT, NCCL_INT32, 2, comm, s));
    else CHECK(ncclRecv((void *)recv, COUNT, NCCL_INT32, 1, comm, s));
    CHECK(cuStreamSynchronize(s));
    took[r] = now() - round_start;
    CHECK(cuMemcpyDtoHAsync_v2(out, recv, sizeof out, s));
    CHECK(cuStreamSynchronize(s));
    sums[r] = out[5];
  }
  pthread_barrier_wait(&barrier);
  if (r == 0) {
    about("rank 1: ncclSend of 4 KiB, synced", took[1], 11 * MS);
    about("rank 2: ncclRecv of 4 KiB, synced", took[2], 11 * MS);
    expect("  the bytes arrived", sums[2] == 2 * 1000 + 5);
  }
  pthread_barrier_wait(&barrier); /* reported before the next round writes */

  /* Round 4: a data-parallel step, as the server's schedules issue it,
   * with a free collective (latency 0, infinite bandwidth): 32 x 1 ms
   * kernels, an all-reduce, a 2 ms kernel, then a read through pinned
   * staging ended by an event sync; the step is 34 ms. (a) "before": the
   * compute stream drained (event sync) before the all-reduce, on it;
   * (b) the all-reduce on a second stream, ordered by events, with a
   * watchdog polling an event behind it; (c) as (a), the read ended by
   * cuStreamSynchronize. */
  {
    void *s2, *drained, *ready, *reduced, *readback, *staging;
    CHECK(cuStreamCreate(&s2, 0));
    CHECK(cuEventCreate(&drained, 0));
    CHECK(cuEventCreate(&ready, 0));
    CHECK(cuEventCreate(&reduced, 0));
    CHECK(cuEventCreate(&readback, 0));
    CHECK(cuMemHostAlloc(&staging, COUNT * 4, 0));
    pthread_barrier_wait(&barrier);
    if (r == 0) {
      scope_mock_nccl_model(0, 0);
      scope_mock_kernel_time("fill", 1 * MS);
      scope_mock_kernel_time("copy", 2 * MS);
    }
    for (int variant = 0; variant < 3; variant++) {
      pthread_barrier_wait(&barrier);
      if (r == 0) round_start = now();
      pthread_barrier_wait(&barrier);
      for (int i = 0; i < 32; i++) launch_fill(s, send, (unsigned)i);
      watch w = {contexts[r], reduced, 0};
      pthread_t dog;
      if (variant == 1) {
        CHECK(cuEventRecord(ready, s));
        CHECK(cuStreamWaitEvent(s2, ready, 0));
        CHECK(ncclAllReduce((void *)send, (void *)recv, COUNT, NCCL_INT32, NCCL_SUM, comm, s2));
        CHECK(cuEventRecord(reduced, s2));
        CHECK(cuStreamWaitEvent(s, reduced, 0));
        pthread_create(&dog, NULL, watchdog, &w);
      } else {
        CHECK(cuEventRecord(drained, s));
        CHECK(cuEventSynchronize(drained));
        took_drained[r] = now() - round_start;
        CHECK(ncclAllReduce((void *)send, (void *)recv, COUNT, NCCL_INT32, NCCL_SUM, comm, s));
      }
      /* The mock moves the bytes when the last rank posts, and runs a
       * kernel when it is issued: the copy reads the sum only once every
       * rank posted (the Raw schedule's ranks meet there too). */
      pthread_barrier_wait(&barrier);
      launch_copy(s, recv, send);
      CHECK(cuMemcpyDtoHAsync_v2(staging, send, COUNT * 4, s));
      if (variant == 2) {
        CHECK(cuStreamSynchronize(s));
      } else {
        CHECK(cuEventRecord(readback, s));
        CHECK(cuEventSynchronize(readback));
      }
      long long t = now() - round_start;
      if (variant == 1) {
        pthread_join(dog, NULL);
        took_second[r] = t;
        watched[r] = w.ready;
      } else if (variant == 0) {
        took[r] = t;
      } else {
        took_synced[r] = t;
      }
      read_back[r][variant] = ((unsigned *)staging)[0];
      CHECK(cuStreamSynchronize(s2));
    }
    pthread_barrier_wait(&barrier);
    if (r == 0) {
      for (int q = 0; q < RANKS; q++) {
        snprintf(line, sizeof line, "rank %d: step, drained before the all-reduce: the drain", q);
        about(line, took_drained[q], 32 * MS);
        snprintf(line, sizeof line, "rank %d: step, drained before the all-reduce, event sync", q);
        about(line, took[q], 34 * MS);
        snprintf(line, sizeof line, "rank %d: step, all-reduce on a second stream, event sync", q);
        about(line, took_second[q], 34 * MS);
        expect("  its watchdog saw the all-reduce done", watched[q]);
        snprintf(line, sizeof line, "rank %d: step, drained before the all-reduce, stream sync", q);
        about(line, took_synced[q], 34 * MS);
        expect("  the sums read back (4 x 31, each time)",
               read_back[q][0] == 124 && read_back[q][1] == 124 && read_back[q][2] == 124);
      }
      scope_mock_nccl_model(1 * MS, COUNT * 4 / 0.010);
      scope_mock_kernel_time("fill", 2 * MS);
    }
    CHECK(cuMemFreeHost(staging));
    pthread_barrier_wait(&barrier); /* reported before the next round writes */
  }

  /* Round 5: rank 0 posts alone, then aborts: its wait ends at once. */
  if (r == 0) {
    round_start = now();
    CHECK(ncclAllReduce((void *)send, (void *)recv, COUNT, NCCL_INT32, NCCL_SUM, comm, s));
    launch_fill(s, scratch[r], 1);
    usleep(3000);
    CHECK(ncclCommAbort(comm));
    CHECK(cuStreamSynchronize(s));
    about("rank 0: a lone post then a 2 ms kernel, aborted at 3 ms", now() - round_start, 5 * MS);
  }
  return NULL;
}

/* ----- an abort ends a joined all-reduce that has not finished -----
 * Four ranks on a fresh communicator: rank 3's stream runs a 1 s kernel
 * before its all-reduce part, the others post theirs at once, so the call
 * is joined at once and would finish at 1 s + 11 ms. On each rank: an
 * event `after` recorded right after the part, then a 2 ms kernel on the
 * stream; a second stream waits on `after` and runs a 2 ms kernel. At
 * ~100 ms the main thread aborts the four communicators: ranks 0-2's
 * parts end then, rank 3's at its own start (1 s, its kernel's end), and
 * the work behind them follows. A rank's thread waits on its stream while
 * a second thread of it waits on the event, then the second stream:
 * both waits are asleep when the abort comes, and must wake for it. */
static long long abort_at;
static void *abort_comms[RANKS];
static void *abort_streams[RANKS], *abort_seconds[RANKS], *abort_events[RANKS];
static long long abort_stream_took[RANKS], abort_event_took[RANKS], abort_second_took[RANKS],
    abort_ctx_took[RANKS];
static int abort_pending_before[RANKS], abort_ready_after[RANKS];
static pthread_barrier_t abort_barrier;

static void *abort_event_waiter(void *arg) {
  int r = (int)(long)arg;
  CHECK(cuCtxSetCurrent(contexts[r]));
  CHECK(cuEventSynchronize(abort_events[r]));
  abort_event_took[r] = now() - round_start;
  CHECK(cuStreamSynchronize(abort_seconds[r]));
  abort_second_took[r] = now() - round_start;
  return NULL;
}
static void *abort_rank(void *arg) {
  int r = (int)(long)arg;
  void *comm, *s, *s2, *after;
  CHECK(cuCtxSetCurrent(contexts[r]));
  CHECK(cuStreamCreate(&s, 0));
  CHECK(cuStreamCreate(&s2, 0));
  CHECK(cuEventCreate(&after, 0));
  CUdeviceptr send, recv;
  CHECK(cuMemAlloc_v2(&send, COUNT * 4));
  CHECK(cuMemAlloc_v2(&recv, COUNT * 4));
  CHECK(cuStreamSynchronize(s));
  CHECK(ncclCommInitRankConfig(&comm, RANKS, id, r, NULL));
  abort_comms[r] = comm;
  abort_streams[r] = s;
  abort_seconds[r] = s2;
  abort_events[r] = after;
  pthread_barrier_wait(&abort_barrier); /* the main thread starts the clock */
  pthread_barrier_wait(&abort_barrier);
  if (r == 3) launch_fill(s, scratch[r], 1); /* 1 s */
  CHECK(ncclAllReduce((void *)send, (void *)recv, COUNT, NCCL_INT32, NCCL_SUM, comm, s));
  CHECK(cuEventRecord(after, s));
  launch_copy(s, scratch[r], scratch[r] + 256); /* 2 ms, after the part */
  CHECK(cuStreamWaitEvent(s2, after, 0));
  launch_copy(s2, scratch[r] + 512, scratch[r] + 768); /* 2 ms, after the event */
  pthread_barrier_wait(&abort_barrier); /* every rank posted: the call is joined */
  pthread_t waiter;
  pthread_create(&waiter, NULL, abort_event_waiter, (void *)(long)r);
  usleep(50000);
  abort_pending_before[r] = cuStreamQuery(s) == NOT_READY && cuEventQuery(after) == NOT_READY &&
                            cuStreamQuery(s2) == NOT_READY;
  CHECK(cuStreamSynchronize(s));
  abort_stream_took[r] = now() - round_start;
  pthread_join(waiter, NULL);
  CHECK(cuCtxSynchronize());
  abort_ctx_took[r] = now() - round_start;
  abort_ready_after[r] = cuStreamQuery(s) == 0 && cuEventQuery(after) == 0 && cuStreamQuery(s2) == 0;
  return NULL;
}
static void abort_joined(void) {
  scope_mock_nccl_model(1 * MS, COUNT * 4 / 0.010); /* 4 KiB in 10 ms: the call would end at 1011 ms */
  scope_mock_kernel_time("fill", 1000 * MS);
  scope_mock_kernel_time("copy", 2 * MS);
  CHECK(ncclGetUniqueId(&id));
  pthread_barrier_init(&abort_barrier, NULL, RANKS + 1);
  pthread_t threads[RANKS];
  for (long r = 0; r < RANKS; r++) pthread_create(&threads[r], NULL, abort_rank, (void *)r);
  pthread_barrier_wait(&abort_barrier);
  round_start = now();
  pthread_barrier_wait(&abort_barrier);
  pthread_barrier_wait(&abort_barrier); /* all posted */
  long long posted = now() - round_start;
  struct timespec until = {(time_t)((round_start + 100 * MS) / 1000000000LL),
                           (long)((round_start + 100 * MS) % 1000000000LL)};
  clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL);
  abort_at = now() - round_start;
  for (int r = 0; r < RANKS; r++) CHECK(ncclCommAbort(abort_comms[r]));
  for (int r = 0; r < RANKS; r++) pthread_join(threads[r], NULL);
  char line[160];
  snprintf(line, sizeof line, "abort: every rank posted (at %.2f ms) well before the abort (at %.2f ms)",
           ms(posted), ms(abort_at));
  expect(line, posted < 50 * MS);
  for (int r = 0; r < RANKS; r++) {
    long long part = r == 3 ? 1000 * MS : abort_at; /* its part's end: its own start, or the abort */
    snprintf(line, sizeof line, "rank %d: joined all-reduce aborted, cuStreamSynchronize (+ 2 ms)", r);
    about(line, abort_stream_took[r], part + 2 * MS);
    snprintf(line, sizeof line, "rank %d: joined all-reduce aborted, cuEventSynchronize after it", r);
    about(line, abort_event_took[r], part);
    snprintf(line, sizeof line, "rank %d: a second stream behind that event (+ 2 ms)", r);
    about(line, abort_second_took[r], part + 2 * MS);
    snprintf(line, sizeof line, "rank %d: then cuCtxSynchronize", r);
    about(line, abort_ctx_took[r], part + 2 * MS);
    expect("  before the abort: stream, event and second stream NOT_READY", abort_pending_before[r]);
    expect("  after the waits: all ready", abort_ready_after[r]);
  }
  scope_mock_kernel_time("fill", 2 * MS);
}

static void four_ranks(void) {
  scope_mock_nccl_model(1 * MS, COUNT * 4 / 0.010); /* 4 KiB in 10 ms */
  CHECK(ncclGetUniqueId(&id));
  pthread_barrier_init(&barrier, NULL, RANKS);
  pthread_barrier_init(&pair, NULL, 2);
  pthread_t threads[RANKS];
  for (long r = 0; r < RANKS; r++) pthread_create(&threads[r], NULL, rank_main, (void *)r);
  for (int r = 0; r < RANKS; r++) pthread_join(threads[r], NULL);
}

int main(void) {
  CHECK(cuInit(0));
  for (int d = 0; d < RANKS; d++) {
    CHECK(cuDevicePrimaryCtxRetain(&contexts[d], d));
    CHECK(cuCtxSetCurrent(contexts[d]));
    CHECK(cuMemAlloc_v2(&scratch[d], 4096));
  }
  void *module;
  CHECK(cuModuleLoadData(&module, PTX));
  CHECK(cuModuleGetFunction(&fill, module, "fill"));
  CHECK(cuModuleGetFunction(&copy, module, "copy"));

  /* Timed mode off: as before, instant. */
  scope_mock_kernel_time("fill", 50 * MS);
  CHECK(cuCtxSetCurrent(contexts[0]));
  void *s;
  CHECK(cuStreamCreate(&s, 0));
  long long t0 = now();
  launch_fill(s, scratch[0], 1);
  expect("off: cuStreamQuery before a host wait is NOT_READY, as before", cuStreamQuery(s) == NOT_READY);
  unsigned long long waits = scope_mock_host_waits();
  CHECK(cuStreamSynchronize(s));
  long long off = now() - t0;
  char line[128];
  snprintf(line, sizeof line, "off: a 50 ms kernel + sync is instant (%.3f ms)", ms(off));
  expect(line, off < 2 * MS);
  expect("off: host waits counted", scope_mock_host_waits() - waits == 1);

  scope_mock_timing(1);
  single_device();
  four_ranks();
  abort_joined();
  scope_mock_timing(0);
  expect("no violations of the driver or NCCL", !scope_mock_violations() && !scope_mock_nccl_violations());
  printf("%s\n", failures ? "FAILED" : "all ok");
  return failures ? 1 : 0;
}
