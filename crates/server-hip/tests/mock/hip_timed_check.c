/*
 * A check of the mock HIP runtime's timed mode (mock_hip.c, as the CUDA
 * mock's: server-cuda's tests/mock/timed_check.c) by the wall clock, with
 * the kit's mock NCCL built as the mock RCCL over it. Built and run by
 * hip_timed_check.sh. A wait may not end before its model time, and may
 * end up to 25% + 5 ms after (a loaded 2-core machine).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int hipError_t;
hipError_t hipSetDevice(int);
hipError_t hipStreamCreateWithFlags(void **, unsigned);
hipError_t hipStreamSynchronize(void *);
hipError_t hipStreamWaitEvent(void *, void *, unsigned);
hipError_t hipEventCreateWithFlags(void **, unsigned);
hipError_t hipEventRecord(void *, void *);
hipError_t hipEventQuery(void *);
hipError_t hipEventSynchronize(void *);
hipError_t hipMalloc(void **, size_t);
hipError_t hipMemcpyAsync(void *, const void *, size_t, int, void *);
hipError_t hipModuleLoadData(void **, const void *);
hipError_t hipModuleGetFunction(void **, void *, const char *);
hipError_t hipModuleLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                                 void **, void **);
hipError_t hipStreamBeginCapture(void *, int);
hipError_t hipStreamEndCapture(void *, void **);
hipError_t hipGraphInstantiate(void **, void *, void *, char *, size_t);
hipError_t hipGraphLaunch(void *, void *);
void scope_mock_timing(int);
void scope_mock_kernel_time(const char *, unsigned long long);
unsigned long long scope_mock_host_waits(void);

typedef struct { char internal[128]; } ncclUniqueId;
int ncclGetUniqueId(ncclUniqueId *);
int ncclCommInitRankConfig(void **, int, ncclUniqueId, int, void *);
int ncclAllReduce(const void *, void *, size_t, int, int, void *, void *);
void scope_mock_nccl_model(unsigned long long, double);
unsigned long long scope_mock_nccl_violations(void);

enum { NOT_READY = 600, NCCL_INT32 = 2, NCCL_SUM = 0, RANKS = 4, H2D = 1, D2H = 2 };
#define MS 1000000LL
#define COUNT 1024

static int failures;
static long long now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
static void expect(const char *what, int ok) {
  printf("%-70s %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) failures++;
}
static void about(const char *what, long long took, long long model) {
  char line[160];
  snprintf(line, sizeof line, "%s: %.2f ms (model %.1f)", what, (double)took / 1e6, (double)model / 1e6);
  expect(line, took >= model - MS / 10 && took <= model + model / 4 + 5 * MS);
}
#define CHECK(call) do { int r_ = (call); if (r_) { printf("%s: %d\n", #call, r_); exit(2); } } while (0)

static void *fill;
static void launch_fill(void *stream, void *at, unsigned value) {
  unsigned scalars[2] = {32, value};
  void *params[] = {&at, scalars};
  CHECK(hipModuleLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
}

static ncclUniqueId id;
static pthread_barrier_t barrier;
static long long start, took[RANKS];
static unsigned sums[RANKS];

static void *rank_main(void *arg) {
  int r = (int)(long)arg;
  void *comm, *s, *send, *recv, *scratch;
  CHECK(hipSetDevice(r));
  CHECK(hipStreamCreateWithFlags(&s, 1));
  CHECK(hipMalloc(&send, COUNT * 4));
  CHECK(hipMalloc(&recv, COUNT * 4));
  CHECK(hipMalloc(&scratch, 4096));
  static unsigned values[RANKS][COUNT];
  for (int i = 0; i < COUNT; i++) values[r][i] = (unsigned)(r + 1) * 1000 + (unsigned)i;
  CHECK(hipMemcpyAsync(send, values[r], sizeof values[r], H2D, s));
  CHECK(hipStreamSynchronize(s));
  CHECK(ncclCommInitRankConfig(&comm, RANKS, id, r, NULL));
  unsigned out[COUNT];

  /* Rank 3 first runs a 20 ms kernel: every rank's all-reduce ends at 20 + 1 + 10 ms. */
  pthread_barrier_wait(&barrier);
  if (r == 0) start = now();
  pthread_barrier_wait(&barrier);
  if (r == 3) {
    scope_mock_kernel_time("fill", 20 * MS);
    launch_fill(s, scratch, 1);
  }
  CHECK(ncclAllReduce(send, recv, COUNT, NCCL_INT32, NCCL_SUM, comm, s));
  CHECK(hipStreamSynchronize(s));
  took[r] = now() - start;
  CHECK(hipMemcpyAsync(out, recv, sizeof out, D2H, s));
  CHECK(hipStreamSynchronize(s));
  sums[r] = out[7];
  pthread_barrier_wait(&barrier);
  if (r == 0)
    for (int q = 0; q < RANKS; q++) {
      char line[100];
      snprintf(line, sizeof line, "rank %d: all-reduce behind rank 3's 20 ms kernel", q);
      about(line, took[q], 31 * MS);
      expect("  its sum", sums[q] == 10 * 1000 + 4 * 7);
    }
  pthread_barrier_wait(&barrier);

  /* A graph of a 2 ms kernel and the all-reduce, replayed: 2 + 11 ms. */
  if (r == 0) scope_mock_kernel_time("fill", 2 * MS);
  void *g, *x;
  CHECK(hipStreamBeginCapture(s, 2));
  launch_fill(s, scratch, 1);
  CHECK(ncclAllReduce(send, recv, COUNT, NCCL_INT32, NCCL_SUM, comm, s));
  CHECK(hipStreamEndCapture(s, &g));
  CHECK(hipGraphInstantiate(&x, g, NULL, NULL, 0));
  pthread_barrier_wait(&barrier);
  if (r == 0) start = now();
  pthread_barrier_wait(&barrier);
  CHECK(hipGraphLaunch(x, s));
  CHECK(hipStreamSynchronize(s));
  took[r] = now() - start;
  pthread_barrier_wait(&barrier);
  if (r == 0)
    for (int q = 0; q < RANKS; q++) {
      char line[100];
      snprintf(line, sizeof line, "rank %d: graph replay of a 2 ms kernel + all-reduce", q);
      about(line, took[q], 13 * MS);
    }
  return NULL;
}

int main(void) {
  static const char image[] = "scope_fill";
  void *module, *a, *b, *e, *scratch;
  CHECK(hipSetDevice(0));
  CHECK(hipModuleLoadData(&module, image));
  CHECK(hipModuleGetFunction(&fill, module, "scope_fill"));
  CHECK(hipStreamCreateWithFlags(&a, 1));
  CHECK(hipStreamCreateWithFlags(&b, 1));
  CHECK(hipEventCreateWithFlags(&e, 0));
  CHECK(hipMalloc(&scratch, 4096));

  scope_mock_kernel_time("fill", 50 * MS);
  long long t0 = now();
  launch_fill(a, scratch, 1);
  CHECK(hipStreamSynchronize(a));
  expect("off: a 50 ms kernel + sync is instant", now() - t0 < 2 * MS);
  expect("off: host waits counted", scope_mock_host_waits() == 1);

  scope_mock_timing(1);
  scope_mock_kernel_time("fill", 2 * MS);
  t0 = now();
  for (int i = 0; i < 10; i++) launch_fill(a, scratch, (unsigned)i);
  expect("10 launches return at once", now() - t0 < MS);
  CHECK(hipEventRecord(e, a));
  expect("hipEventQuery right after is not ready", hipEventQuery(e) == NOT_READY);
  CHECK(hipStreamSynchronize(a));
  about("10 x 2 ms on one stream", now() - t0, 20 * MS);
  unsigned out[32];
  CHECK(hipMemcpyAsync(out, scratch, sizeof out, D2H, a));
  CHECK(hipStreamSynchronize(a));
  expect("the last fill's bytes are there", out[0] == 9);

  t0 = now();
  for (int i = 0; i < 10; i++) {
    launch_fill(a, scratch, 1);
    launch_fill(b, (char *)scratch + 128, 2);
  }
  CHECK(hipStreamSynchronize(a));
  CHECK(hipStreamSynchronize(b));
  about("two streams of 10 x 2 ms each (overlapping)", now() - t0, 20 * MS);

  t0 = now();
  for (int i = 0; i < 5; i++) launch_fill(a, scratch, 1);
  CHECK(hipEventRecord(e, a));
  for (int i = 0; i < 5; i++) launch_fill(a, scratch, 1);
  CHECK(hipStreamWaitEvent(b, e, 0));
  launch_fill(b, (char *)scratch + 128, 3);
  CHECK(hipStreamSynchronize(b));
  about("B's 2 ms kernel after waiting on A's event at 10 ms", now() - t0, 12 * MS);
  CHECK(hipEventSynchronize(e));
  CHECK(hipStreamSynchronize(a));

  scope_mock_nccl_model(1 * MS, COUNT * 4 / 0.010);
  CHECK(ncclGetUniqueId(&id));
  pthread_barrier_init(&barrier, NULL, RANKS);
  pthread_t threads[RANKS];
  for (long r = 0; r < RANKS; r++) pthread_create(&threads[r], NULL, rank_main, (void *)r);
  for (int r = 0; r < RANKS; r++) pthread_join(threads[r], NULL);
  scope_mock_timing(0);
  expect("no violations of the mock RCCL", !scope_mock_nccl_violations());
  printf("%s\n", failures ? "FAILED" : "all ok");
  return failures ? 1 : 0;
}
