/*
 * A mock of the HIP runtime and hiprtc, for testing the server's Rust side
 * on machines without ROCm. It is not HIP: "device" memory is host memory,
 * every operation runs at once (unless it is held behind a collective
 * still waiting for its peers: see "held work"), and the only kernels are the test kernels
 * (scope_fill, scope_copy, scope_add) plus scope_trap, which leaves a
 * sticky hipErrorIllegalAddress on its device, as a faulting kernel does,
 * and scope_ecc, which leaves a sticky hipErrorECCNotCorrectable there.
 * A sticky code is the device's: every stream of it answers it, the
 * communication streams a collective runs on included, and so does a new
 * stream's creation, until hipDeviceReset clears it. A reset clears any sticky code but the ones
 * CUDA's documentation calls process-fatal (700, 702, 710, 719), which
 * real HIP is not promised to bring back. The mock tracks nothing else per
 * device, so a reset destroys nothing: a server must not name what it made
 * before the reset again, which the mock cannot check.
 *
 * It is also a checker: it fails calls that real HIP would mis-handle or
 * silently capture — an event recorded on, or a wait issued to, a stream
 * that is capturing; a capture that is not in relaxed mode; a compile
 * without --offload-arch for the device's gcnArchName; a launch of a
 * function whose module was unloaded, and a graph replay that would launch
 * one (hipErrorInvalidHandle: a graph must keep its kernels' modules
 * loaded). An unloaded module's record is kept, so that a stale function
 * handle is caught rather than read from freed memory.
 *
 * Values (error codes, struct offsets) are the ROCm 6 header's. There are
 * four devices (for the mock RCCL's groups), each an MI300-like one: its launch limits (grid 2^31-1 x 65,535 x 65,535,
 * blocks 1024 x 1024 x 1024 of at most 1,024 threads, 64 KiB of LDS,
 * 64-wide wavefronts) are in its properties, and a launch past them fails.
 *
 * Timed mode (scope_mock_timing(1); off by default) is the CUDA mock's
 * (server-cuda's tests/mock/mock_cuda.c), with the same hook names, so
 * that a test can measure overlap by the wall clock: bytes still move at
 * issue; each stream is an in-order queue in model time (CLOCK_MONOTONIC),
 * an operation starting at the latest of its issue, the stream's previous
 * finish and the events it was made to wait on (hipStreamWaitEvent), and
 * lasting its kernel's time (scope_mock_kernel_time: "fill", "copy",
 * "add", "trap", "ecc"; another name is ignored) or its copy's
 * (scope_mock_copy_time, per MiB). An event records the model finish of
 * its stream's work so far; hipEventQuery answers not ready until the wall
 * clock reaches it; hipStreamSynchronize and hipEventSynchronize sleep
 * until then. A collective of the mock RCCL is a part its stream cannot
 * finish alone (scope_mock_stream_part, scope_mock_replay_part,
 * scope_mock_part_join and _join_kept, scope_mock_part_settled,
 * scope_mock_part_release, scope_mock_part_end: see the CUDA mock); an
 * abort ends the parts of a joined call that has not finished too, and
 * the host waits read a finish again when a part changes.
 * scope_mock_host_waits counts the calls of those two host waits, in
 * either mode. The model has a lock of its own (the rest of this mock
 * has none), taken only in timed mode and by the mock RCCL's hooks.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int hipError_t;
enum {
  OK = 0, E_INVALID = 1, E_OOM = 2, E_INVALID_DEVICE = 101, E_INVALID_HANDLE = 400, E_ILLEGAL_STATE = 401,
  E_INVALID_CONFIGURATION = 9, E_NOT_FOUND = 500, E_ILLEGAL_ADDRESS = 700, E_CAPTURE_UNSUPPORTED = 900,
  E_CAPTURE_UNMATCHED = 903, E_CAPTURE_ISOLATION = 905, E_CAPTURED_EVENT = 907, E_NOT_READY = 600,
  E_ECC = 214
};

#define TOTAL ((size_t)1 << 30)
/* An MI300-like device's launch limits, as hipGetDevicePropertiesR0600
 * reports them; hipModuleLaunchKernel refuses past them, and (as real HIP
 * does, with hipErrorInvalidConfiguration) a launch whose blocks times
 * threads along an axis pass UINT32_MAX. */
static const int GRID[3] = {2147483647, 65535, 65535};
static const int BLOCK[3] = {1024, 1024, 1024};
#define THREADS_PER_BLOCK 1024
#define SHARED_PER_BLOCK ((size_t)64 << 10)
#define WAVEFRONT 64
#define RUNTIME_HOLDS ((size_t)64 << 20)
static size_t used = RUNTIME_HOLDS;

/* ----- kernels and operations ----- */

typedef struct { const char *name; int pointers; size_t scalars; int id; } kernel;
#define NKERNELS 5
static const kernel KERNELS[NKERNELS] = {
  {"scope_fill", 1, 8, 0}, {"scope_copy", 2, 4, 1}, {"scope_add", 3, 4, 2}, {"scope_trap", 1, 0, 3},
  {"scope_ecc", 1, 0, 4},
};

/* A loaded module: its code, and one function handle per kernel it holds. */
struct module;
typedef struct { const kernel *k; struct module *m; } function;
typedef struct module { int live; char *image; function functions[NKERNELS]; } module;

/* A recorded collective (launch 2): the mock RCCL's `hook`, called with
 * its `blob` (n bytes, owned by the op's graph), the stream and the
 * replay's operation number there, at each replay. */
typedef void (*replay_hook)(const void *blob, void *stream, unsigned long long seq);
typedef struct {
  int launch; /* 0: copy, 1: launch, 2: a recorded collective */
  void *dst; const void *src; size_t n;
  const function *f; unsigned threads; void *args[3]; unsigned char scalars[8];
  replay_hook hook;
} op;

typedef struct { op *ops; size_t len, cap; } graph;
/* `issued` counts the collectives the mock RCCL posts on the stream, work
 * held behind one and a replay's nodes (the rest of its work runs as it
 * is issued). */
/* Timed mode: as the CUDA mock's stream, `tail` or `tail_node`, and a
 * graph replay's collective parts the mock RCCL has yet to post. */
struct tnode;
typedef struct stream {
  graph *capture; hipError_t sticky; unsigned long long issued; int device;
  long long tail;
  struct tnode *tail_node, *unclaimed;
  /* Held work (see "held work" below): the queue, in order; the post
   * being placed (its number, 0: none); its open collective parts; and
   * the list of every stream, which a destroyed one with held work stays
   * in until that work ran. */
  struct held *head, *last;
  unsigned long long placing, *open;
  size_t nopen, capopen;
  int destroyed;
  struct stream *next;
} stream;
/* The sticky code each device holds (scope_trap, scope_ecc), until hipDeviceReset. */
#define DEVICES 4
static hipError_t device_sticky[DEVICES];
static unsigned long long resets;
unsigned long long scope_mock_resets(void) { return resets; }
/* What `s` answers: its own sticky code, else its device's. */
static hipError_t sticky(const stream *s) { return s->sticky ? s->sticky : device_sticky[s->device]; }
typedef struct { stream *last; unsigned long long seq; long long at; struct tnode *node; } event;

static void push(graph *g, op o) {
  if (g->len == g->cap) {
    g->cap = g->cap ? g->cap * 2 : 8;
    g->ops = realloc(g->ops, g->cap * sizeof(op));
  }
  g->ops[g->len++] = o;
}

/* ----- timed mode: device time (see the header; as the CUDA mock's) ----- */

static int timing;
static unsigned long long kernel_ns[NKERNELS], copy_ns_per_mib, host_waits;
static pthread_mutex_t timed_lock = PTHREAD_MUTEX_INITIALIZER;
static void timed_unlock(int *held) { (void)held; pthread_mutex_unlock(&timed_lock); }
#define TIMED_LOCKED int timed_held_ __attribute__((cleanup(timed_unlock))) = (pthread_mutex_lock(&timed_lock), 1)
#define TIMELINE_MUTEX timed_lock
#define MOCK_NAME "mock hip"
#include "timeline.h"
static unsigned long long duration(const op *o) {
  if (o->launch == 1) return kernel_ns[o->f->k->id];
  if (o->launch == 2) return 0;
  return (unsigned long long)((double)o->n * (double)copy_ns_per_mib / 1048576.0);
}

void scope_mock_timing(int on) { TIMED_LOCKED; __atomic_store_n(&timing, on != 0, __ATOMIC_RELAXED); }
void scope_mock_kernel_time(const char *kind, unsigned long long ns) {
  TIMED_LOCKED;
  for (int k = 0; k < NKERNELS; k++)
    if (kind && !strcmp(kind, KERNELS[k].name + 6)) kernel_ns[k] = ns; /* past "scope_" */
}
void scope_mock_copy_time(unsigned long long ns_per_mib) { TIMED_LOCKED; copy_ns_per_mib = ns_per_mib; }
unsigned long long scope_mock_host_waits(void) { return __atomic_load_n(&host_waits, __ATOMIC_RELAXED); }

static void run(stream *s, const op *o) {
  if (!o->launch) { memcpy(o->dst, o->src, o->n); return; }
  if (o->launch == 2) return; /* hipGraphLaunch posts it */
  unsigned *a0 = o->args[0], *a1 = o->args[1], *a2 = o->args[2];
  unsigned n, value;
  memcpy(&n, o->scalars, 4);
  memcpy(&value, o->scalars + 4, 4);
  if (o->f->k->id == 3) { s->sticky = E_ILLEGAL_ADDRESS; device_sticky[s->device] = E_ILLEGAL_ADDRESS; return; }
  if (o->f->k->id == 4) { s->sticky = E_ECC; device_sticky[s->device] = E_ECC; return; }
  for (unsigned i = 0; i < o->threads && i < n; i++) {
    switch (o->f->k->id) {
      case 0: a0[i] = value; break;
      case 1: a1[i] = a0[i]; break;
      case 2: a2[i] = a0[i] + a1[i]; break;
    }
  }
}

/* ----- held work: what waits on the device for a collective -----
 * The stream executor both mocks share (scope-test's mock/held.h; see
 * there): work ordered after a collective's part still open, on its
 * stream or through an event wait, is queued on its stream in issue
 * order and runs once the part closed. It has a lock of its own, taken
 * after the mock RCCL's and never while calling into it. */
typedef struct {
  op o;
  void *owned; /* a host-to-device copy's source, copied */
} held_work;
static void held_run(stream *s, held_work *w, unsigned long long seq) {
  (void)seq;
  run(s, &w->o);
  free(w->owned);
}
static void held_gave_up(void) {
  fprintf(stderr, "mock hip: a host wait gave up: its held work waits for a collective that cannot finish\n");
}
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static stream *streams;
#define HELD_MUTEX hold_lock
#include "held.h"
/* Issue `o` on `s`: record it if capturing, hold it behind an open
 * collective, else run it. `copied`: a host source read before the call
 * returns, as a copy from pageable memory is. */
static void issue_copied(stream *s, op o, int copied) {
  if (s->capture) { push(s->capture, o); return; }
  if (__atomic_load_n(&timing, __ATOMIC_RELAXED)) {
    TIMED_LOCKED;
    model_op(s, duration(&o));
  }
  {
    HELD_LOCKED;
    if (holding(s)) {
      held_work w = {.o = o};
      if (copied) {
        w.owned = malloc(o.n ? o.n : 1);
        memcpy(w.owned, o.src, o.n);
        w.o.src = w.owned;
      }
      hold(s, (held){.kind = H_WORK, .seq = ++s->issued, .w = w});
      return;
    }
  }
  run(s, &o);
}
static void issue(stream *s, op o) { issue_copied(s, o, 0); }

/* ----- device ----- */

hipError_t hipInit(unsigned flags) { (void)flags; return OK; }
hipError_t hipRuntimeGetVersion(int *v) { *v = 60241134; return OK; }
/* Four devices, for groups of four ranks (the mock RCCL); the device a
 * thread last set is its current one, as HIP keeps it. They share the
 * memory budget. */
static __thread int current_device;
hipError_t hipGetDeviceCount(int *c) { *c = DEVICES; return OK; }
hipError_t hipSetDevice(int d) {
  if (d < 0 || d >= DEVICES) return E_INVALID_DEVICE;
  current_device = d;
  return OK;
}
static int process_fatal(hipError_t e) { return e == 700 || e == 702 || e == 710 || e == 719; }
hipError_t hipDeviceReset(void) {
  if (process_fatal(device_sticky[current_device])) return device_sticky[current_device];
  device_sticky[current_device] = OK;
  resets++;
  return OK;
}
hipError_t hipDeviceTotalMem(size_t *b, int d) { if (d < 0 || d >= DEVICES) return E_INVALID_DEVICE; *b = TOTAL; return OK; }
hipError_t hipGetDevicePropertiesR0600(void *p, int d) {
  if (d < 0 || d >= DEVICES) return E_INVALID_DEVICE;
  memset(p, 0, 1472);
  strcpy((char *)p, "Mock Radeon (scope test double)");
  *(size_t *)((char *)p + 288) = TOTAL;
  /* sharedMemPerBlock, warpSize, maxThreadsPerBlock, maxThreadsDim, maxGridSize */
  *(size_t *)((char *)p + 296) = SHARED_PER_BLOCK;
  *(int *)((char *)p + 308) = WAVEFRONT;
  *(int *)((char *)p + 320) = THREADS_PER_BLOCK;
  memcpy((char *)p + 324, BLOCK, sizeof BLOCK);
  memcpy((char *)p + 336, GRID, sizeof GRID);
  strcpy((char *)p + 1160, "gfx90a:sramecc+:xnack-");
  return OK;
}
const char *hipGetErrorName(hipError_t e) {
  switch (e) {
    case OK: return "hipSuccess";
    case E_OOM: return "hipErrorOutOfMemory";
    case E_ILLEGAL_ADDRESS: return "hipErrorIllegalAddress";
    default: return "hipErrorMock";
  }
}
const char *hipGetErrorString(hipError_t e) {
  return e == E_ILLEGAL_ADDRESS ? "an illegal memory access was encountered (mock)" : "mock error";
}

/* ----- hooks for the mock RCCL (scope-test's mock/mock_nccl.c) ----- */

int scope_mock_current_device(void) { return current_device; }
/* Live device allocations, so that the mock RCCL can check that a
 * collective's buffer lies inside one (as the CUDA mock's registry lets
 * the mock NCCL). */
typedef struct allocation { char *at; size_t n; int serial; struct allocation *next; } allocation;
static allocation *allocations;
static pthread_mutex_t allocations_lock = PTHREAD_MUTEX_INITIALIZER;
static void remember(char *at, size_t n) {
  static int serial;
  allocation *a = malloc(sizeof *a);
  if (!a) return;
  pthread_mutex_lock(&allocations_lock);
  serial = serial % 2000000000 + 1;
  *a = (allocation){at, n, serial, allocations};
  allocations = a;
  pthread_mutex_unlock(&allocations_lock);
}
static void forget(char *at) {
  pthread_mutex_lock(&allocations_lock);
  for (allocation **it = &allocations; *it; it = &(*it)->next)
    if ((*it)->at == at) {
      allocation *gone = *it;
      *it = gone->next;
      free(gone);
      break;
    }
  pthread_mutex_unlock(&allocations_lock);
}
/* The live device allocation [p, p + n) lies inside, by its number (as
 * the CUDA mock's: never 0, and a new one for each allocation), or 0. */
int scope_mock_device_range(const void *p, size_t n) {
  const char *c = p;
  int inside = 0;
  pthread_mutex_lock(&allocations_lock);
  for (allocation *a = allocations; a && !inside; a = a->next)
    if (c >= a->at && n <= a->n && (size_t)(c - a->at) <= a->n - n) inside = a->serial;
  pthread_mutex_unlock(&allocations_lock);
  return inside;
}
int scope_mock_stream_capturing(void *p) { stream *s = p; return s ? s->capture != NULL : -1; }

/* A new operation on stream `p` (a collective), its number there; in
 * timed mode it takes no time. */
unsigned long long scope_mock_stream_op(void *p) {
  stream *s = p;
  if (!__atomic_load_n(&timing, __ATOMIC_RELAXED)) return ++s->issued;
  TIMED_LOCKED;
  model_op(s, 0);
  return ++s->issued;
}
/* NCCL runs one communicator's kernels in issue order whatever their
 * streams (a launch waits on the communicator's internal stream, which
 * then waits on the launch): the mock RCCL orders the next operation of
 * `p` after operation `upto` of `on` (if it still exists) and, in timed
 * mode, after the finish of part `after` (a handle it keeps:
 * scope_mock_part_keep). */
void scope_mock_stream_after(void *p, void *on, unsigned long long upto, void *after) {
  stream *s = p, *o = on;
  if (!s || !o || s == o) return;
  if (__atomic_load_n(&timing, __ATOMIC_RELAXED) && after) {
    TIMED_LOCKED;
    timed_wait_event(s, 0, after);
  }
  HELD_LOCKED;
  int exists = 0;
  for (stream *t = streams; t && !exists; t = t->next) exists = t == o;
  if (exists && !reached(o, upto)) hold(s, (held){.kind = H_WAIT, .seq = ++s->issued, .on = o, .upto = upto});
}
/* ----- streams and events ----- */

hipError_t hipStreamCreateWithFlags(void **s, unsigned flags) {
  if (flags != 1) return E_INVALID; /* the server asks for non-blocking streams */
  if (device_sticky[current_device]) return device_sticky[current_device];
  stream *created = calloc(1, sizeof(stream));
  created->device = current_device;
  {
    HELD_LOCKED;
    created->next = streams;
    streams = created;
  }
  *s = created;
  return OK;
}
hipError_t hipStreamDestroy(void *p) {
  stream *s = p;
  {
    /* Work held on it, or waiting for it, still runs on the device: it
     * stays (and is not freed) while there is any. */
    HELD_LOCKED;
    int needed = holding(s);
    for (stream *t = streams; t && !needed; t = t->next)
      for (held *h = t->head; h && !needed; h = h->next) needed = h->kind == H_WAIT && h->on == s;
    if (needed) {
      s->destroyed = 1;
      return OK;
    }
    for (stream **at = &streams; *at; at = &(*at)->next)
      if (*at == s) { *at = s->next; break; }
  }
  if (s && (s->tail_node || s->unclaimed)) {
    /* What still waits on its work holds its own references. */
    TIMED_LOCKED;
    drop(s->tail_node);
    while (s->unclaimed) {
      tnode *u = s->unclaimed;
      s->unclaimed = u->next;
      end_part(u);
      drop(u);
    }
  }
  /* Not freed: an event recorded on it still names it (`e->last`), and
   * HIP answers that event's queries after the stream is gone. Freeing it
   * let a query read freed memory: a segfault in `reached` about three
   * runs in a hundred under load. What stays is a stream with nothing
   * held, which every such query reads as finished. */
  s->destroyed = 1;
  return OK;
}
hipError_t hipStreamSynchronize(void *p) {
  stream *s = p;
  if (s->capture) return E_CAPTURE_UNSUPPORTED;
  int timed = __atomic_load_n(&timing, __ATOMIC_RELAXED);
  when w = timed ? when_tail(s) : (when){0, NULL};
  __atomic_add_fetch(&host_waits, 1, __ATOMIC_RELAXED);
  unsigned long long upto;
  {
    HELD_LOCKED;
    upto = s->issued;
  }
  wait_reached(s, upto);
  wait_on(s, upto);
  if (timed) timed_wait(w);
  return sticky(s);
}
hipError_t hipEventCreateWithFlags(void **e, unsigned flags) { (void)flags; *e = calloc(1, sizeof(event)); return OK; }
hipError_t hipEventDestroy(void *e) {
  if (e && ((event *)e)->node) {
    TIMED_LOCKED;
    drop(((event *)e)->node);
  }
  free(e);
  return OK;
}
hipError_t hipEventRecord(void *p, void *ps) {
  stream *s = ps;
  event *e = p;
  if (s->capture) return E_CAPTURED_EVENT; /* the server must never do this */
  if (sticky(s)) return sticky(s);
  place_posts();
  e->last = s;
  {
    HELD_LOCKED;
    e->seq = s->issued;
  }
  if (__atomic_load_n(&timing, __ATOMIC_RELAXED)) {
    TIMED_LOCKED;
    timed_record(s, &e->at, &e->node);
  }
  return OK;
}
hipError_t hipEventQuery(void *p) {
  event *e = p;
  place_posts();
  if (e->last) {
    HELD_LOCKED;
    if (!reached(e->last, e->seq)) return E_NOT_READY;
  }
  if (pending_on(e->last, e->seq)) return E_NOT_READY;
  if (__atomic_load_n(&timing, __ATOMIC_RELAXED) && e->last) {
    TIMED_LOCKED;
    long long at = e->node ? finish_of(e->node) : e->at;
    if (at < 0 || now_ns() < at) return E_NOT_READY;
  }
  return e->last ? sticky(e->last) : OK;
}
hipError_t hipEventSynchronize(void *p) {
  event *e = p;
  when w = {0, NULL};
  int timed = __atomic_load_n(&timing, __ATOMIC_RELAXED) && e->last;
  if (timed) {
    TIMED_LOCKED;
    w.at = e->at;
    w.node = e->node;
    if (w.node) w.node->refs++;
  }
  __atomic_add_fetch(&host_waits, 1, __ATOMIC_RELAXED);
  if (e->last) wait_reached(e->last, e->seq);
  wait_on(e->last, e->seq);
  if (timed) timed_wait(w);
  return e->last ? sticky(e->last) : OK;
}
hipError_t hipStreamWaitEvent(void *p, void *pe, unsigned flags) {
  stream *s = p;
  event *e = pe;
  (void)flags;
  if (s->capture) return E_CAPTURE_ISOLATION; /* the server must never do this */
  if (__atomic_load_n(&timing, __ATOMIC_RELAXED) && e && e->last) {
    TIMED_LOCKED;
    timed_wait_event(s, e->at, e->node);
  }
  place_posts();
  if (e && e->last) {
    /* What the event covers has not run (held behind a collective): the
     * stream's later work is held until it has. */
    HELD_LOCKED;
    if (!reached(e->last, e->seq)) hold(s, (held){.kind = H_WAIT, .seq = ++s->issued, .on = e->last, .upto = e->seq});
  }
  return sticky(s);
}

/* ----- memory ----- */

hipError_t hipMalloc(void **p, size_t n) {
  size_t now = __atomic_add_fetch(&used, n, __ATOMIC_SEQ_CST);
  if (now > TOTAL) { __atomic_sub_fetch(&used, n, __ATOMIC_SEQ_CST); return E_OOM; }
  char *raw = malloc(n + 256);
  if (!raw) { __atomic_sub_fetch(&used, n, __ATOMIC_SEQ_CST); return E_OOM; }
  *(size_t *)raw = n;
  *p = raw + 256;
  remember(raw + 256, n);
  return OK;
}
static int every(const stream *s) {
  (void)s;
  return 1;
}
hipError_t hipFree(void *p) {
  if (!p) return OK;
  /* As HIP's, a free waits for the device: for held work to run. */
  wait_every_stream(every);
  forget(p);
  char *raw = (char *)p - 256;
  __atomic_sub_fetch(&used, *(size_t *)raw, __ATOMIC_SEQ_CST);
  free(raw);
  return OK;
}
hipError_t hipHostMalloc(void **p, size_t n, unsigned flags) { (void)flags; *p = malloc(n); return *p ? OK : E_OOM; }
hipError_t hipHostFree(void *p) { free(p); return OK; }
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *p) {
  stream *s = p;
  if (kind < 1 || kind > 3) return E_INVALID;
  if (sticky(s)) return sticky(s);
  /* A recorded copy keeps the source *pointer*, as HIP's memcpy node does. */
  op o = {0, dst, src, n, NULL, 0, {0}, {0}, NULL};
  place_posts();
  issue_copied(s, o, kind == 1);
  return OK;
}

/* ----- modules and launches ----- */

hipError_t hipModuleLoadData(void **out, const void *image) {
  module *m = calloc(1, sizeof(module));
  m->live = 1;
  m->image = strdup(image);
  for (int i = 0; i < NKERNELS; i++) { m->functions[i].k = &KERNELS[i]; m->functions[i].m = m; }
  *out = m;
  return OK;
}
hipError_t hipModuleUnload(void *p) {
  module *m = p;
  if (!m || !m->live) return E_INVALID_HANDLE;
  free(m->image);
  m->image = NULL;
  m->live = 0; /* the record stays: a launch of one of its functions is then caught */
  return OK;
}
hipError_t hipModuleGetFunction(void **f, void *p, const char *name) {
  module *m = p;
  if (!m || !m->live) return E_INVALID_HANDLE;
  if (!strstr(m->image, name)) return E_NOT_FOUND;
  for (int i = 0; i < NKERNELS; i++)
    if (!strcmp(KERNELS[i].name, name)) { *f = &m->functions[i]; return OK; }
  return E_NOT_FOUND;
}
hipError_t hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, void *p, void **params, void **extra) {
  stream *s = p;
  const function *fn = f;
  (void)shared; (void)extra;
  if (!fn || !fn->m->live) return E_INVALID_HANDLE; /* a function of an unloaded module */
  const kernel *k = fn->k;
  if (sticky(s)) return sticky(s);
  if (!gx || !gy || !gz || !bx || !by || !bz) return E_INVALID;
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  if ((unsigned long long)bx * by * bz > THREADS_PER_BLOCK) return E_INVALID;
  for (int i = 0; i < 3; i++) {
    if (grid[i] > (unsigned)GRID[i] || block[i] > (unsigned)BLOCK[i]) return E_INVALID;
    if ((unsigned long long)grid[i] * block[i] > UINT32_MAX) return E_INVALID_CONFIGURATION;
  }
  unsigned long long threads = (unsigned long long)gx * gy * gz * bx * by * bz;
  op o = {1, NULL, NULL, 0, fn, threads > UINT32_MAX ? UINT32_MAX : (unsigned)threads, {0}, {0}, NULL};
  for (int i = 0; i < k->pointers; i++) o.args[i] = *(void **)params[i];
  if (k->scalars) memcpy(o.scalars, params[k->pointers], k->scalars);
  place_posts();
  issue(s, o);
  return OK;
}

/* ----- capture and graphs ----- */

hipError_t hipStreamBeginCapture(void *p, int mode) {
  stream *s = p;
  if (s->capture) return E_ILLEGAL_STATE;
  if (mode != 2) return E_INVALID; /* the server captures in relaxed mode */
  s->capture = calloc(1, sizeof(graph));
  return OK;
}
hipError_t hipStreamEndCapture(void *p, void **g) {
  stream *s = p;
  if (!s->capture) return E_CAPTURE_UNMATCHED;
  *g = s->capture;
  s->capture = NULL;
  return OK;
}
hipError_t hipGraphInstantiate(void **exec, void *g, void *node, char *log, size_t size) {
  graph *from = g, *to = calloc(1, sizeof(graph));
  (void)node; (void)log; (void)size;
  for (size_t i = 0; i < from->len; i++) {
    op o = from->ops[i];
    if (o.launch == 2) {
      void *blob = malloc(o.n ? o.n : 1);
      memcpy(blob, o.dst, o.n);
      o.dst = blob;
    }
    push(to, o);
  }
  *exec = to;
  return OK;
}

/* Record a collective into capturing stream `p`'s graph: `hook(blob,
 * stream, seq)` is called at each replay. Whether it was recorded. */
int scope_mock_record_collective(void *p, replay_hook hook, const void *blob, size_t n) {
  stream *s = p;
  if (!s || !s->capture) return 0;
  op o = {0};
  o.launch = 2;
  o.hook = hook;
  o.n = n;
  o.dst = malloc(n ? n : 1);
  memcpy(o.dst, blob, n);
  push(s->capture, o);
  return 1;
}
/* A replay issues the graph's nodes in recorded order, as the CUDA mock's
 * does: its work runs or is held as eager work is, each recorded
 * collective takes a slot in the stream's queue that what was recorded
 * after it waits behind (held.h), and the collectives are then posted in
 * order, each filling its slot. */
hipError_t hipGraphLaunch(void *exec, void *p) {
  stream *s = p;
  graph *g = exec;
  if (s->capture) return E_CAPTURE_UNSUPPORTED;
  if (sticky(s)) return sticky(s);
  for (size_t i = 0; i < g->len; i++)
    if (g->ops[i].launch == 1 && !g->ops[i].f->m->live) return E_INVALID_HANDLE; /* its module was unloaded */
  place_posts();
  unsigned long long first;
  {
    HELD_LOCKED;
    first = s->issued + 1;
    s->issued += g->len;
  }
  if (__atomic_load_n(&timing, __ATOMIC_RELAXED)) {
    /* In order: the work between two collectives is one span of time. */
    TIMED_LOCKED;
    unsigned long long span = 0;
    tnode **end = &s->unclaimed;
    while (*end) end = &(*end)->next;
    for (size_t i = 0; i < g->len; i++) {
      if (g->ops[i].launch != 2) { span += duration(&g->ops[i]); continue; }
      model_op(s, span);
      span = 0;
      *end = add_part(s, first + i);
      end = &(*end)->next;
    }
    model_op(s, span);
  }
  {
    HELD_LOCKED;
    for (size_t i = 0; i < g->len; i++) {
      if (g->ops[i].launch == 2) held_slot(s, first + i);
      else if (holding(s)) hold(s, (held){.kind = H_WORK, .seq = first + i, .w = {.o = g->ops[i]}});
      else run(s, &g->ops[i]);
    }
  }
  for (size_t i = 0; i < g->len; i++)
    if (g->ops[i].launch == 2) post_replayed(s, g->ops[i].hook, g->ops[i].dst, first + i);
  place_posts();
  return OK;
}
static void graph_free(graph *g) {
  for (size_t i = 0; i < g->len; i++)
    if (g->ops[i].launch == 2) free(g->ops[i].dst);
  free(g->ops);
  free(g);
}
hipError_t hipGraphExecDestroy(void *exec) { graph_free(exec); return OK; }
hipError_t hipGraphDestroy(void *g) { graph_free(g); return OK; }

/* ----- hiprtc ----- */

typedef struct { char *source; char *log; } program;
static const char *ARCH = "--offload-arch=gfx90a:sramecc+:xnack-";

/* With SCOPE_MOCK_HIPRTC_DUMP naming a directory, every source given to
 * hiprtcCompileProgram is also written there, as `<FNV-1a 64 of the
 * source>.hip` (so a source compiled many times is one file), before the
 * mock looks at it: how server-hip's tests/toolchain.rs collects the HIP C++
 * that test binaries run on the mock emit, to compile it with the real
 * hiprtc. Written beside and renamed into place, so a reader never sees half
 * a file and two processes dumping the same source do not interleave. The
 * compile then goes on as without it: a kernel the mock does not know
 * compiles, and its hipModuleGetFunction fails, so a test stops there. */
static void dump(const char *source) {
  const char *dir = getenv("SCOPE_MOCK_HIPRTC_DUMP");
  if (!dir || !*dir) return;
  unsigned long long hash = 1469598103934665603ULL;
  for (const char *c = source; *c; c++) { hash ^= (unsigned char)*c; hash *= 1099511628211ULL; }
  char path[4096], partial[4200];
  snprintf(path, sizeof path, "%s/%016llx.hip", dir, hash);
  snprintf(partial, sizeof partial, "%s.%ld.partial", path, (long)getpid());
  FILE *f = fopen(partial, "w");
  if (!f) { fprintf(stderr, "mock hiprtc: cannot write %s\n", partial); return; }
  int ok = fputs(source, f) >= 0;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(partial, path) != 0) { fprintf(stderr, "mock hiprtc: cannot write %s\n", path); remove(partial); }
}

int hiprtcCreateProgram(void **p, const char *src, const char *name, int n, const char **h, const char **hn) {
  (void)name; (void)h; (void)hn;
  if (n != 0) return 3;
  program *prog = calloc(1, sizeof(program));
  prog->source = strdup(src);
  prog->log = strdup("");
  *p = prog;
  return 0;
}
int hiprtcCompileProgram(void *p, int n, const char **options) {
  program *prog = p;
  int arch = 0;
  dump(prog->source);
  for (int i = 0; i < n; i++) arch |= !strcmp(options[i], ARCH);
  free(prog->log);
  if (!arch) { prog->log = strdup("mock hiprtc: expected --offload-arch=gfx90a:sramecc+:xnack-"); return 5; }
  const char *bad = strstr(prog->source, "this_name_is_not_declared_anywhere");
  if (bad) {
    /* ROCm 5.2's hiprtc's words and position (its comgr names the file
       after a temporary folder, not the program; tests/toolchain.rs). */
    prog->log = strdup("kernel.hip:3:24: error: use of undeclared identifier 'this_name_is_not_declared_anywhere'");
    return 6;
  }
  prog->log = strdup("");
  return 0;
}
int hiprtcGetCodeSize(void *p, size_t *n) { *n = strlen(((program *)p)->source) + 1; return 0; }
int hiprtcGetCode(void *p, char *code) { strcpy(code, ((program *)p)->source); return 0; }
int hiprtcGetProgramLogSize(void *p, size_t *n) { *n = strlen(((program *)p)->log) + 1; return 0; }
int hiprtcGetProgramLog(void *p, char *log) { strcpy(log, ((program *)p)->log); return 0; }
int hiprtcDestroyProgram(void **p) {
  program *prog = *p;
  free(prog->source); free(prog->log); free(prog);
  *p = NULL;
  return 0;
}
const char *hiprtcGetErrorString(int r) {
  switch (r) {
    case 0: return "HIPRTC_SUCCESS";
    case 5: return "HIPRTC_ERROR_INVALID_OPTION";
    case 6: return "HIPRTC_ERROR_COMPILATION";
    default: return "HIPRTC_ERROR_MOCK";
  }
}
