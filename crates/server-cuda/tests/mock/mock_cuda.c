/*
 * A mock of the CUDA driver API, for running the server's Rust on machines
 * without an NVIDIA GPU. It is not CUDA: "device" memory is host memory,
 * work runs when it is issued (or is recorded into a graph while its stream
 * captures) unless it is ordered after a collective still waiting for its
 * peers, when it is held until that collective ran (see "held work"), and
 * the only kernels are the ones the mock NVRTC
 * (mock_nvrtc.c) recognises — fill, copy, add, accumulate, and wild, which
 * writes through a wild pointer and leaves a sticky
 * CUDA_ERROR_ILLEGAL_ADDRESS on the context, surfacing at the next sync;
 * from then on every call returns 700, as in a corrupted CUDA context.
 *
 * It is built with -Wl,-soname,libcuda.so and loaded by absolute path
 * before cudarc looks for "libcuda.so": glibc's dlopen finds an object
 * already loaded by its soname, so cudarc binds to this file.
 *
 * Values (CUresult codes, enum values, the CUmemPoolProps layout, the
 * kernel parameter convention) are the CUDA 13.0 header's, as cudarc's
 * generated bindings (feature cuda-13000) spell them.
 *
 * There are four devices, for groups of four ranks (scope-test's mock/mock_nccl.c), each
 * with its own primary context; they share the memory budget, the sticky
 * error and the lock. Each is an sm_90 one: cuDeviceGetAttribute answers an H100/H200's
 * launch limits (grid 2^31-1 x 65,535 x 65,535, block 1024 x 1024 x 64 of
 * at most 1,024 threads, 48 KiB of shared memory per block, 32-thread
 * warps), and cuLaunchKernel refuses a launch past them.
 *
 * Time is modelled just enough to check ordering: each stream counts the
 * operations issued on it and how many the host knows are done. Only a
 * host wait (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize)
 * or an event query that finds the work done (cuEventQuery) advances
 * "done"; work runs as it is issued, so only a collective the mock NCCL
 * holds until its peers post, and work held behind one, is ever not done
 * (see its hooks below). A
 * pool block freed on a stream is reused only once that free is known done
 * (or on the same stream), and cuMemPoolTrimTo releases only such blocks.
 *
 * Timed mode (scope_mock_timing(1); off by default) models device time
 * as well, so that a test can measure overlap by the wall clock: bytes
 * still move when work is issued, only completion moves. Each stream is
 * an in-order queue in model time (CLOCK_MONOTONIC): an operation starts
 * at the latest of its issue, the stream's previous finish and the events
 * the stream was made to wait on, and lasts its kind's time
 * (scope_mock_kernel_time per kernel kind, a name other than the mock
 * NVRTC's kinds ignored; scope_mock_copy_time per MiB of a memcpy;
 * memsets, stream-ordered allocations and frees take none). A graph
 * replay runs its operations in order. An event records the model finish
 * of its stream's work so far; cuEventQuery and cuStreamQuery answer
 * NOT_READY until the wall clock reaches it (and one that finds it passed
 * advances "done", as an event query does), and the host waits sleep
 * until then, without the lock. A collective of the mock NCCL is a
 * "part" whose finish the mock NCCL sets once every rank posted
 * (scope_mock_part_join: the latest part's start plus the call's cost) or
 * the communicator is aborted (scope_mock_part_end: now); until then the
 * finish of whatever is ordered after it, on its stream or through an
 * event, is unknown, and a host wait for it waits for the peers (the mock
 * NCCL's wait) before sleeping. An abort also ends a joined call that has
 * not finished yet: each of its parts at the abort, or at its own start
 * if later (a rank still busy before its part), and what is ordered after
 * them moves with them. So a host wait does not sleep to a finish fixed
 * in advance: it sleeps on a condition variable until the finish, and
 * reads the finish again when woken (a part posted, joined or ended);
 * queries answer from the finish as it is now. cuCtxSynchronize waits for
 * the current context's streams. scope_mock_host_waits counts the calls
 * of the three host waits that got past their checks, in either mode.
 *
 * It is also a checker. Each call below fails (and counts a violation,
 * readable through scope_mock_violations / scope_mock_last_violation, and
 * printed to stderr) where real CUDA refuses the call or would mis-handle
 * it:
 *
 *  - any context-level call with no current context on the calling thread
 *    (CUDA_ERROR_INVALID_CONTEXT), or before cuInit (NOT_INITIALIZED);
 *  - cuStreamSynchronize / cuStreamQuery on a stream that is capturing
 *    (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); the capture is invalidated,
 *    so its later work and its end answer STREAM_CAPTURE_INVALIDATED;
 *  - cuStreamWaitEvent from a capturing stream on an event recorded
 *    outside the capture (STREAM_CAPTURE_ISOLATION, invalidating it), and
 *    any wait, query or sync on an event last recorded in a capture
 *    (CUDA_ERROR_CAPTURED_EVENT);
 *  - a capture begun in a mode other than RELAXED (the server's lock
 *    serialises calls; the other modes forbid what it does on other
 *    streams meanwhile), a capture begun twice, an end on a stream that
 *    is not capturing (CUDA_ERROR_ILLEGAL_STATE);
 *  - a host-to-device copy from pageable memory inside a capture (the
 *    graph would read whatever is there at replay: STREAM_CAPTURE_UNSUPPORTED);
 *  - cuMemAllocFromPoolAsync, cuMemFreeAsync or cuGraphLaunch on a
 *    capturing stream: legal CUDA, but each would put a node (allocation,
 *    free, child graph) into the graph (CUDA_ERROR_NOT_PERMITTED here);
 *  - a copy or kernel argument on a stream that is not yet ordered after
 *    the stream-ordered allocation of its memory on another stream (no
 *    event wait on the allocating stream's work, no host wait for it):
 *    real CUDA would race with the allocation (CUDA_ERROR_INVALID_VALUE
 *    here);
 *  - a copy or kernel argument outside every live allocation — a freed
 *    pointer, or a range past its block — refused when issued or recorded
 *    (CUDA_ERROR_INVALID_VALUE), and a fault (ILLEGAL_ADDRESS) when a
 *    graph replay meets one;
 *  - a free of a pointer that is not a live block of that pool (double
 *    free, foreign pointer), cuMemFreeHost of a pointer not from
 *    cuMemHostAlloc;
 *  - cuMemPoolCreate with props that are not a pinned device pool on
 *    device 0 with zeroed reserved bytes (checks the struct layout);
 *  - cuLaunchKernel with a zero or oversized block/grid, or with no
 *    kernelParams for a kernel that has parameters;
 *  - a launch of a function whose module was unloaded, and a graph
 *    replay that would launch one (CUDA_ERROR_INVALID_HANDLE): a graph
 *    must keep the modules of its kernels loaded;
 *  - cuModuleLoadDataEx with an error log buffer but no size for it.
 *
 * Not errors, but what CUDA does: an allocation past what is free is
 * CUDA_ERROR_OUT_OF_MEMORY and leaves nothing behind; garbage PTX is
 * CUDA_ERROR_INVALID_PTX with a log in CU_JIT_ERROR_LOG_BUFFER, and PTX
 * whose `.version` is newer than the driver's CUDA version JITs is
 * CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222), with ptxas's words in the log.
 *
 * Counted, not refused: cuGraphExecDestroy of a graph whose last replay
 * the host has not waited for. Real CUDA allows it (the exec is freed when
 * the replay completes), but the failure model has the server wait first
 * (rule 35), so a test can ask whether it did.
 *
 * cuDriverGetVersion reports CUDA 13.0, or SCOPE_MOCK_DRIVER_VERSION
 * where the build defines it (12020 for 12.2).
 *
 * Built with -DSCOPE_MOCK_OLD_DRIVER it is an older or virtualised driver:
 * CUDA 12.2 (a 535 driver, unless SCOPE_MOCK_DRIVER_VERSION says
 * otherwise), no memory pools (the attribute reads 0 and cuMemPoolCreate
 * is refused) and no cuFuncGetParamInfo (the symbol is absent, as before
 * CUDA 12.4).
 *
 * Test hooks (not CUDA): scope_mock_fail_next (the next call of the named
 * entry point returns the given code: a driver failure where the mock
 * would not make one), scope_mock_violations, scope_mock_last_violation,
 * scope_mock_graphs_destroyed_in_flight,
 * scope_mock_stream_pending (operations the host has not waited for), and
 * scope_mock_invalidate_capture (what the driver does to a capture when a
 * thread makes an illegal call in global capture mode); and for the mock
 * NCCL, scope_mock_current_device, scope_mock_device_range,
 * scope_mock_stream_capturing and scope_mock_record_collective (a
 * collective recorded into a capture, posted by each replay), and
 * scope_mock_part_opened, scope_mock_part_closed and scope_mock_hold_post
 * (held work). Timed mode's:
 * scope_mock_timing, scope_mock_kernel_time, scope_mock_copy_time,
 * scope_mock_host_waits; and for the mock NCCL, scope_mock_stream_part,
 * scope_mock_replay_part, scope_mock_part_join (and _join_kept,
 * scope_mock_part_settled, scope_mock_part_release) and
 * scope_mock_part_end.
 *
 * Every entry point takes one process-wide recursive lock: concurrent tests
 * share the mock, and "device" work runs on the caller's thread.
 */
#define _GNU_SOURCE /* PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum {
  OK = 0, E_INVALID_VALUE = 1, E_OUT_OF_MEMORY = 2, E_NOT_INITIALIZED = 3, E_INVALID_DEVICE = 101,
  E_INVALID_CONTEXT = 201, E_INVALID_PTX = 218, E_UNSUPPORTED_PTX_VERSION = 222, E_INVALID_HANDLE = 400, E_ILLEGAL_STATE = 401,
  E_NOT_FOUND = 500, E_NOT_READY = 600, E_ILLEGAL_ADDRESS = 700, E_NOT_PERMITTED = 800,
  E_CAPTURE_UNSUPPORTED = 900, E_CAPTURE_INVALIDATED = 901, E_CAPTURE_ISOLATION = 905,
  E_CAPTURED_EVENT = 907
};
/* CUdevice_attribute, CUmemPool_attribute, CUstreamCaptureMode, CUjit_option. */
enum {
  ATTR_MAX_THREADS_PER_BLOCK = 1, ATTR_MAX_BLOCK_DIM_X = 2, ATTR_MAX_BLOCK_DIM_Y = 3, ATTR_MAX_BLOCK_DIM_Z = 4,
  ATTR_MAX_GRID_DIM_X = 5, ATTR_MAX_GRID_DIM_Y = 6, ATTR_MAX_GRID_DIM_Z = 7, ATTR_MAX_SHARED_MEMORY_PER_BLOCK = 8,
  ATTR_WARP_SIZE = 10, ATTR_CC_MAJOR = 75, ATTR_CC_MINOR = 76, ATTR_MEMORY_POOLS_SUPPORTED = 115
};
enum { POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3, POOL_RELEASE_THRESHOLD = 4,
       POOL_RESERVED_MEM_CURRENT = 5, POOL_USED_MEM_CURRENT = 7 };
enum { CAPTURE_MODE_RELAXED = 2 };
enum { JIT_ERROR_LOG_BUFFER = 5, JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6 };

#define TOTAL ((size_t)1 << 30)
/* Devices cuDeviceGetCount reports: enough for a group of four ranks. */
#define DEVICES 4
#define CONTEXT_HOLDS ((size_t)64 << 20)
#define DEVICE_CC 90
/* The CUDA version cuDriverGetVersion reports (1000 * major + 10 * minor):
 * 13.0, or 12.2 (a 535 driver) for the old driver, unless the build names
 * one. Its JIT refuses PTX of a newer ISA than the version has. */
#ifndef SCOPE_MOCK_DRIVER_VERSION
#ifdef SCOPE_MOCK_OLD_DRIVER
#define SCOPE_MOCK_DRIVER_VERSION 12020
#else
#define SCOPE_MOCK_DRIVER_VERSION 13000
#endif
#endif
#define DEVICE_NAME "Mock sm_90 GPU (scope test double)"
/* An H100/H200's launch limits, as cuDeviceGetAttribute reports them; the
 * same numbers bound what cuLaunchKernel accepts. */
static const unsigned GRID[3] = {2147483647u, 65535, 65535};
static const unsigned BLOCK[3] = {1024, 1024, 64};
#define THREADS_PER_BLOCK 1024
#define SHARED_PER_BLOCK (48 * 1024)
#define WARP 32

/* ----- the lock, violations, hooks ----- */

static pthread_mutex_t lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static void unlock(int *held) { if (*held) pthread_mutex_unlock(&lock); }
#define LOCKED int held_ __attribute__((cleanup(unlock))) = (pthread_mutex_lock(&lock), 1)

static unsigned long long violations;
static char last_violation[512];

__attribute__((format(printf, 2, 3))) static CUresult refuse(CUresult code, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(last_violation, sizeof last_violation, fmt, args);
  va_end(args);
  violations++;
  fprintf(stderr, "mock cuda: refused (%d): %s\n", code, last_violation);
  return code;
}

unsigned long long scope_mock_violations(void) { LOCKED; return violations; }
const char *scope_mock_last_violation(void) { LOCKED; return last_violation; }
/* Graph execs destroyed while a replay was not yet waited for: legal CUDA, not a violation. */
static unsigned long long destroyed_in_flight;
static unsigned long long resets;
unsigned long long scope_mock_graphs_destroyed_in_flight(void) { LOCKED; return destroyed_in_flight; }

/* ----- the context ----- */

typedef struct { int retained; int ordinal; } context;
/* One primary context per device. The devices share everything else: the
 * memory budget, the sticky error and the lock (a sticky fault on one
 * poisons them all, which is stricter than CUDA's per-context one). */
static context primaries[DEVICES] = {{0, 0}, {0, 1}, {0, 2}, {0, 3}};
static int initialized;
static __thread context *current;
/* A wild kernel ran: the fault is pending until a sync surfaces it, then sticky. */
static int fault_pending;
static CUresult sticky;
/* The code the pending fault surfaces as: an illegal address, unless a test
 * planted another sticky one (scope_mock_fault_next_sync). */
static CUresult pending_code;
void scope_mock_fault_next_sync(CUresult code) {
  LOCKED;
  fault_pending = 1;
  pending_code = code;
}

/* A test's planted failure: the next call of `fail_call` returns `fail_code`. */
static char fail_call[64];
static CUresult fail_code;
void scope_mock_fail_next(const char *call, CUresult code) {
  LOCKED;
  snprintf(fail_call, sizeof fail_call, "%s", call);
  fail_code = code;
}

/* What every context-level call checks first. */
static CUresult enter(const char *call) {
  if (!initialized) return refuse(E_NOT_INITIALIZED, "%s before cuInit", call);
  if (sticky) return sticky;
  if (!current || !current->retained)
    return refuse(E_INVALID_CONTEXT, "%s with no current context on this thread", call);
  if (fail_call[0] && strcmp(fail_call, call) == 0) {
    fail_call[0] = 0;
    return fail_code;
  }
  return OK;
}
#define ENTER LOCKED; { CUresult entered_ = enter(__func__); if (entered_) return entered_; }

static CUresult surface(void) {
  if (fault_pending) { fault_pending = 0; sticky = pending_code ? pending_code : E_ILLEGAL_ADDRESS; pending_code = 0; }
  return sticky;
}

/* ----- memory: a registry of every live block ----- */

enum { DEVICE = 1, HOST = 2 };
struct stream;
struct pool;
typedef struct block {
  char *base;
  size_t size;
  int kind, live;
  int freeing;                            /* a stream-ordered free of it is held */
  struct pool *pool;                      /* NULL: cuMemAlloc or host */
  struct stream *freed_on;                /* pool blocks, once freed */
  unsigned long long freed_seq;
  struct stream *alloc_on;                /* pool blocks: the stream in whose order it was made */
  unsigned long long alloc_seq;
  int serial;                             /* which allocation it holds (see scope_mock_device_range) */
  struct block *next;
} block;
static block *blocks;
static size_t used = CONTEXT_HOLDS;

typedef struct pool {
  int live;
  size_t reserved, in_use;
  unsigned long long threshold;
  struct pool *next;
} pool;
static pool *pools;

/* The live block of `kind` holding [p, p + n), if any. */
static block *find(const void *p, size_t n, int kind) {
  const char *c = p;
  for (block *b = blocks; b; b = b->next)
    if (b->live && b->kind == kind && c >= b->base && c + n <= b->base + b->size && c + n >= c) return b;
  return NULL;
}

/* A number for each allocation made live, never 0. */
static int next_serial(void) {
  static int serial;
  serial = serial % 2000000000 + 1;
  return serial;
}
static block *new_block(size_t size, int kind, pool *owner) {
  char *base = malloc(size ? size : 1);
  if (!base) return NULL;
  block *b = calloc(1, sizeof(block));
  b->base = base; b->size = size; b->kind = kind; b->live = 1; b->pool = owner;
  b->serial = next_serial();
  b->next = blocks;
  blocks = b;
  return b;
}

static void drop_block(block *gone) {
  for (block **at = &blocks; *at; at = &(*at)->next)
    if (*at == gone) { *at = gone->next; break; }
  if (gone->kind == DEVICE) used -= gone->size;
  if (gone->pool) gone->pool->reserved -= gone->size;
  free(gone->base);
  free(gone);
}

/* ----- streams, events, operations ----- */

enum { OP_HTOD, OP_DTOH, OP_DTOD, OP_KERNEL, OP_HOOK };
struct function;
/* A recorded collective (OP_HOOK): the mock NCCL's `hook`, called with its
 * `blob` (n bytes, owned), the stream and the replay's operation number
 * there, when a graph holding it is replayed. */
typedef void (*replay_hook)(const void *blob, void *stream, unsigned long long seq);
typedef struct {
  int kind;
  char *dst; const char *src; size_t n;
  const struct function *f; unsigned threads; unsigned char *params;
  replay_hook hook;
} op;

typedef struct { op *ops; size_t len, cap; } graph;

#define MAX_KNOWN 16
struct tnode;
typedef struct stream {
  int live;
  unsigned long long issued, done;        /* operations issued; known finished */
  /* Timed mode: the model finish of the work issued so far, `tail`, or,
   * while it is not known, the node that will know it (a reference); a
   * graph replay's collective parts the mock NCCL has yet to post; the
   * context it was made in, for cuCtxSynchronize. */
  long long tail;
  struct tnode *tail_node, *unclaimed;
  context *ctx;
  /* What this stream's later work is ordered after, through event waits:
   * every operation of known[i].of up to known[i].seq. */
  struct { struct stream *of; unsigned long long seq; } known[MAX_KNOWN];
  int nknown;
  /* Held work (see "held work" below): the queue, in order; the post
   * being placed (its number, 0: none); the numbers of its collective
   * parts the mock NCCL has not closed. */
  struct held *head, *last;
  unsigned long long placing;
  unsigned long long *open;
  size_t nopen, capopen;
  int capturing, invalidated;
  graph *capture;
  struct stream *next;
} stream;
static stream *streams;

/* Timed mode: `at`, the model finish of `on`'s work when recorded, or `node`, which will know it. */
typedef struct {
  int live; stream *on; unsigned long long seq; stream *captured_by;
  long long at; struct tnode *node;
} event;

typedef struct replayed { stream *on; unsigned long long seq; struct replayed *next; } replayed;
typedef struct { int live; graph g; replayed *replays; } exec;

static void push(graph *g, op o) {
  if (g->len == g->cap) {
    g->cap = g->cap ? g->cap * 2 : 8;
    g->ops = realloc(g->ops, g->cap * sizeof(op));
  }
  g->ops[g->len++] = o;
}

static void finish(stream *s) { s->done = s->issued; }

/* How far `s`'s work is ordered after `of`'s: all of it for itself. */
static unsigned long long known_of(const stream *s, const stream *of) {
  if (s == of) return ~0ULL;
  unsigned long long seq = of->done;
  for (int i = 0; i < s->nknown; i++)
    if (s->known[i].of == of && s->known[i].seq > seq) seq = s->known[i].seq;
  return seq;
}
static void learn(stream *s, stream *of, unsigned long long seq) {
  if (s == of) return;
  for (int i = 0; i < s->nknown; i++)
    if (s->known[i].of == of) {
      if (s->known[i].seq < seq) s->known[i].seq = seq;
      return;
    }
  if (s->nknown < MAX_KNOWN) {
    s->known[s->nknown].of = of;
    s->known[s->nknown].seq = seq;
    s->nknown++;
  }
}

/* The host waited for every stream: release what pools hold past their threshold. */
static void release_over_threshold(pool *only, unsigned long long keep);

static int reusable(const block *b, const stream *on) {
  return b->freed_on == on || b->freed_on->done >= b->freed_seq;
}

/* ----- kernels (the module side; see mock_nvrtc.c for the compiler) ----- */

enum { K_FILL, K_COPY, K_ADD, K_ACCUMULATE, K_WILD };
static const char *KINDS[] = {"fill", "copy", "add", "accumulate", "wild"};
static const int POINTERS[] = {1, 2, 3, 2, 1};
#define MAX_PARAMS 8

typedef struct function {
  char name[128];
  int kind, nparams;
  size_t size[MAX_PARAMS], offset[MAX_PARAMS], total;
  struct module *module;
} function;
typedef struct module { int live, nfunctions; function functions[16]; } module;

/* ----- timed mode: device time (see the header) ----- */

static int timing;
static unsigned long long kernel_ns[5], copy_ns_per_mib, host_waits;
#define TIMELINE_MUTEX lock
#define MOCK_NAME "mock cuda"
#include "timeline.h"
/* An operation of `dur` ns issued on `s` now, in timed mode. */
static void timed_op(stream *s, unsigned long long dur) {
  if (timing) model_op(s, dur);
}
static unsigned long long duration(const op *o) {
  if (o->kind == OP_KERNEL) return kernel_ns[o->f->kind];
  if (o->kind == OP_HOOK) return 0;
  return (unsigned long long)((double)o->n * (double)copy_ns_per_mib / 1048576.0);
}

void scope_mock_timing(int on) { LOCKED; timing = on != 0; }
void scope_mock_kernel_time(const char *kind, unsigned long long ns) {
  LOCKED;
  for (int k = 0; k < 5; k++)
    if (kind && !strcmp(kind, KINDS[k])) kernel_ns[k] = ns;
}
void scope_mock_copy_time(unsigned long long ns_per_mib) { LOCKED; copy_ns_per_mib = ns_per_mib; }
unsigned long long scope_mock_host_waits(void) { LOCKED; return host_waits; }

/* Run one operation now. `replay` (1: a graph's, 2: held): checks failing
 * here are faults, not refusals; a held copy's host side is not checked
 * (pageable memory the caller keeps until its wait). */
static CUresult run(const op *o, int replay) {
  if (fault_pending || sticky) return OK; /* a faulted context runs nothing more */
  if (o->kind == OP_HOOK) return OK; /* cuGraphLaunch calls it, unlocked */
  if (o->kind != OP_KERNEL) {
    int dst_kind = o->kind == OP_DTOH ? HOST : DEVICE, src_kind = o->kind == OP_HTOD ? HOST : DEVICE;
    int dst_ok = dst_kind == HOST ? (replay != 1 || find(o->dst, o->n, HOST) != NULL) : find(o->dst, o->n, DEVICE) != NULL;
    int src_ok = src_kind == HOST ? (replay != 1 || find(o->src, o->n, HOST) != NULL) : find(o->src, o->n, DEVICE) != NULL;
    if (!dst_ok || !src_ok) {
      refuse(E_ILLEGAL_ADDRESS, "a replayed copy of %zu bytes touches memory that was freed", o->n);
      fault_pending = 1;
      return OK;
    }
    memmove(o->dst, o->src, o->n);
    return OK;
  }
  const function *f = o->f;
  unsigned *arg[3] = {0};
  for (int i = 0; i < POINTERS[f->kind]; i++) memcpy(&arg[i], o->params + f->offset[i], 8);
  unsigned n = 0, value = 0;
  if (f->nparams > POINTERS[f->kind]) {
    const unsigned char *scalars = o->params + f->offset[POINTERS[f->kind]];
    size_t size = f->size[POINTERS[f->kind]];
    if (size >= 4) memcpy(&n, scalars, 4);
    if (size >= 8) memcpy(&value, scalars + 4, 4);
  }
  if (f->kind == K_WILD) { fault_pending = 1; return OK; }
  size_t count = n < o->threads ? n : o->threads;
  for (int i = 0; i < POINTERS[f->kind]; i++) {
    if (!find(arg[i], count * 4, DEVICE)) {
      if (replay) {
        refuse(E_ILLEGAL_ADDRESS, "`%s` replayed with argument %d outside every live allocation", f->name, i);
        fault_pending = 1;
        return OK;
      }
      return refuse(E_INVALID_VALUE, "`%s` argument %d (%p, %zu bytes used) is outside every live allocation",
                    f->name, i, (void *)arg[i], count * 4);
    }
  }
  for (size_t i = 0; i < count; i++) {
    switch (f->kind) {
      case K_FILL: arg[0][i] = value; break;
      case K_COPY: arg[1][i] = arg[0][i]; break;
      case K_ADD: arg[2][i] = arg[0][i] + arg[1][i]; break;
      case K_ACCUMULATE: arg[1][i] += arg[0][i]; break;
    }
  }
  return OK;
}

static void op_free(op *o) { if (o->kind == OP_KERNEL || o->kind == OP_HOOK) free(o->params); }

/* ----- held work: what waits on the device for a collective -----
 * The stream executor both mocks share (scope-test's mock/held.h): work
 * ordered after a collective's part still open is held, queued on its
 * stream in issue order, and runs once the part closed. Here a held
 * operation is an op, a memset or a stream-ordered free; a held copy's
 * host side is not checked (pageable memory the caller keeps until its
 * wait). */
enum { W_OP, W_MEMSET, W_FREE };
typedef struct {
  int kind, replay;
  op o;                         /* W_OP */
  char *owned;                  /* W_OP: a host-to-device copy's source, copied */
  char *dst; unsigned char value; size_t n; /* W_MEMSET */
  block *b;                     /* W_FREE */
} held_work;
static void free_block_on(stream *s, block *b, unsigned long long seq) {
  b->live = 0;
  b->freeing = 0;
  b->pool->in_use -= b->size;
  b->freed_on = s;
  b->freed_seq = seq;
}
static void held_run(stream *s, held_work *w, unsigned long long seq) {
  switch (w->kind) {
    case W_OP: run(&w->o, w->replay); op_free(&w->o); free(w->owned); break;
    case W_MEMSET:
      if (!fault_pending && !sticky && find(w->dst, w->n, DEVICE)) memset(w->dst, w->value, w->n);
      break;
    case W_FREE: free_block_on(s, w->b, seq); break;
  }
}
static void held_gave_up(void) {
  refuse(E_ILLEGAL_STATE, "a host wait gave up: its held work waits for a collective that cannot finish");
}
#define HELD_MUTEX lock
#include "held.h"
/* NCCL runs one communicator's kernels in issue order whatever their
 * streams (a launch waits on the communicator's internal stream, which
 * then waits on the launch): the mock NCCL orders the next operation of
 * `p` after operation `upto` of `on` and, in timed mode, after the finish
 * of part `after` (a handle it keeps: scope_mock_part_keep). */
void scope_mock_stream_after(void *p, void *on, unsigned long long upto, void *after) {
  LOCKED;
  stream *s = p, *o = on;
  if (!s || !o || s == o || !o->live) return;
  if (timing && after) timed_wait_event(s, 0, after);
  if (!reached(o, upto)) {
    s->issued++;
    hold(s, (held){.kind = H_WAIT, .seq = s->issued, .on = o, .upto = upto});
  }
}
static CUresult ordered_for(stream *s, const void *p, const char *what);

/* Issue `o` on `s`: record it if capturing, else run it. Takes ownership of o.params. */
static CUresult issue(stream *s, op o) {
  if (o.kind == OP_KERNEL) {
    for (int i = 0; i < POINTERS[o.f->kind]; i++) {
      void *p;
      memcpy(&p, o.params + o.f->offset[i], 8);
      CUresult bad = ordered_for(s, p, o.f->name);
      if (bad) { op_free(&o); return bad; }
    }
  }
  if (s->capturing) {
    if (s->invalidated) { op_free(&o); return E_CAPTURE_INVALIDATED; }
    if (o.kind == OP_KERNEL) {
      /* Arguments must be live when recorded, too. */
      const function *f = o.f;
      for (int i = 0; i < POINTERS[f->kind]; i++) {
        void *p;
        memcpy(&p, o.params + f->offset[i], 8);
        if (!find(p, 1, DEVICE)) {
          op_free(&o);
          return refuse(E_INVALID_VALUE, "`%s` recorded with argument %d outside every live allocation", f->name, i);
        }
      }
    }
    push(s->capture, o);
    return OK;
  }
  s->issued++;
  timed_op(s, duration(&o));
  if (holding(s)) {
    if (o.kind == OP_KERNEL) {
      for (int i = 0; i < POINTERS[o.f->kind]; i++) {
        void *p;
        memcpy(&p, o.params + o.f->offset[i], 8);
        if (!find(p, 1, DEVICE)) {
          op_free(&o);
          return refuse(E_INVALID_VALUE, "`%s` argument %d is outside every live allocation", o.f->name, i);
        }
      }
    }
    held_work w = {.kind = W_OP, .o = o, .replay = 2};
    if (o.kind == OP_HTOD) {
      /* A copy from pageable memory reads it before the call returns. */
      w.owned = malloc(o.n ? o.n : 1);
      memcpy(w.owned, o.src, o.n);
      w.o.src = w.owned;
    }
    hold(s, (held){.kind = H_WORK, .seq = s->issued, .w = w});
    return OK;
  }
  CUresult r = run(&o, 0);
  op_free(&o);
  return r;
}

/* Work on `s` touching device memory at `p` must be ordered after the
 * stream-ordered allocation of its block: on the allocating stream, after
 * an event wait on it, or after the host saw that stream's work finish. */
static CUresult ordered_for(stream *s, const void *p, const char *what) {
  block *b = find(p, 1, DEVICE);
  if (!b || !b->alloc_on || known_of(s, b->alloc_on) >= b->alloc_seq) return OK;
  return refuse(E_INVALID_VALUE,
                "%s uses %p on a stream not yet ordered after its stream-ordered allocation on another stream",
                what, p);
}

static CUresult stream_ok(stream *s, const char *call) {
  if (!s) return refuse(E_INVALID_HANDLE, "%s on the legacy default stream (the server uses its own)", call);
  if (!s->live) return refuse(E_INVALID_HANDLE, "%s on a destroyed stream", call);
  return OK;
}
#define STREAM(s) { CUresult bad_ = stream_ok(s, __func__); if (bad_) return bad_; }

/* ----- hooks for the mock NCCL (scope-test's mock/mock_nccl.c) ----- */

/* A new operation on live stream `p` (a collective), its number there;
 * in timed mode it takes no time. */
unsigned long long scope_mock_stream_op(void *p) {
  LOCKED;
  stream *s = p;
  ++s->issued;
  timed_op(s, 0);
  return s->issued;
}

/* Record a collective into capturing stream `p`'s graph: `hook(blob, stream,
 * seq)` is called at each replay. Whether it was recorded (0: not a live,
 * capturing stream, or its capture is invalidated). */
int scope_mock_record_collective(void *p, replay_hook hook, const void *blob, size_t n) {
  LOCKED;
  stream *s = p;
  int live = 0;
  for (stream *it = streams; it; it = it->next) live |= it == s && s->live;
  if (!live || !s->capturing || s->invalidated) return 0;
  op o = {0};
  o.kind = OP_HOOK;
  o.hook = hook;
  o.n = n;
  o.params = malloc(n ? n : 1);
  memcpy(o.params, blob, n);
  push(s->capture, o);
  return 1;
}

/* The device the calling thread's current context is on, or -1. */
int scope_mock_current_device(void) {
  LOCKED;
  return current && current->retained ? current->ordinal : -1;
}

/* Whether [p, p + n) lies inside one live device allocation. */
int scope_mock_device_range(const void *p, size_t n) {
  LOCKED;
  block *b = find(p, n, DEVICE);
  return b ? b->serial : 0;
}

/* Whether `s` is a live stream that is capturing (-1: not a live stream). */
int scope_mock_stream_capturing(void *s) {
  LOCKED;
  stream *st = s;
  for (stream *it = streams; it; it = it->next)
    if (it == st) return st->live ? st->capturing : -1;
  return -1;
}

/* ----- initialisation, device, context ----- */

CUresult cuInit(unsigned flags) {
  LOCKED;
  if (flags) return refuse(E_INVALID_VALUE, "cuInit flags must be 0");
  initialized = 1;
  return OK;
}
CUresult cuDriverGetVersion(int *v) { *v = SCOPE_MOCK_DRIVER_VERSION; return OK; }
CUresult cuDeviceGetCount(int *n) { LOCKED; if (!initialized) return E_NOT_INITIALIZED; *n = DEVICES; return OK; }
CUresult cuDeviceGet(int *d, int ordinal) {
  LOCKED;
  if (!initialized) return refuse(E_NOT_INITIALIZED, "cuDeviceGet before cuInit");
  if (ordinal < 0 || ordinal >= DEVICES) return E_INVALID_DEVICE;
  *d = ordinal;
  return OK;
}
CUresult cuDeviceGetName(char *name, int len, int d) {
  if (d < 0 || d >= DEVICES) return E_INVALID_DEVICE;
  if (len <= 0) return E_INVALID_VALUE;
  snprintf(name, (size_t)len, "%s", DEVICE_NAME);
  return OK;
}
CUresult cuDeviceGetAttribute(int *value, int attribute, int d) {
  if (d < 0 || d >= DEVICES) return E_INVALID_DEVICE;
  switch (attribute) {
    case ATTR_CC_MAJOR: *value = DEVICE_CC / 10; break;
    case ATTR_CC_MINOR: *value = DEVICE_CC % 10; break;
    case ATTR_MAX_THREADS_PER_BLOCK: *value = THREADS_PER_BLOCK; break;
    case ATTR_MAX_BLOCK_DIM_X: case ATTR_MAX_BLOCK_DIM_Y: case ATTR_MAX_BLOCK_DIM_Z:
      *value = (int)BLOCK[attribute - ATTR_MAX_BLOCK_DIM_X]; break;
    case ATTR_MAX_GRID_DIM_X: case ATTR_MAX_GRID_DIM_Y: case ATTR_MAX_GRID_DIM_Z:
      *value = (int)GRID[attribute - ATTR_MAX_GRID_DIM_X]; break;
    case ATTR_MAX_SHARED_MEMORY_PER_BLOCK: *value = SHARED_PER_BLOCK; break;
    case ATTR_WARP_SIZE: *value = WARP; break;
#ifdef SCOPE_MOCK_OLD_DRIVER
    case ATTR_MEMORY_POOLS_SUPPORTED: *value = 0; break;
#else
    case ATTR_MEMORY_POOLS_SUPPORTED: *value = 1; break;
#endif
    default: *value = 0;
  }
  return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int d) { if (d < 0 || d >= DEVICES) return E_INVALID_DEVICE; *bytes = TOTAL; return OK; }

CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) {
  LOCKED;
  if (sticky) return sticky;
  if (d < 0 || d >= DEVICES) return E_INVALID_DEVICE;
  primaries[d].retained++;
  *ctx = &primaries[d];
  return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int d) {
  LOCKED;
  if (d < 0 || d >= DEVICES) return E_INVALID_DEVICE;
  if (primaries[d].retained <= 0) return refuse(E_INVALID_CONTEXT, "primary context released more often than retained");
  primaries[d].retained--;
  return OK;
}
/* The codes after which CUDA's documentation says the process must be
 * terminated and relaunched (illegal address, launch timeout, assert,
 * hardware stack error, illegal instruction, misaligned address, invalid
 * address space, invalid PC, launch failed): a reset does not bring such a
 * context back here, as CUDA promises nothing for it. */
static int process_fatal(CUresult e) { return e == 700 || e == 702 || e == 710 || (e >= 714 && e <= 719); }
/* Resetting the primary context clears a sticky error that is not
 * process-fatal. The mock does not track which objects were made on which
 * device, so it destroys nothing: a server must not name the objects it made
 * before the reset again, which the mock cannot check. (The sticky error is
 * process-wide here, so a reset of any device clears it.) */
CUresult cuDevicePrimaryCtxReset_v2(int d) {
  LOCKED;
  if (!initialized) return refuse(E_NOT_INITIALIZED, "cuDevicePrimaryCtxReset before cuInit");
  if (d < 0 || d >= DEVICES) return E_INVALID_DEVICE;
  if (fault_pending) { fault_pending = 0; sticky = pending_code ? pending_code : E_ILLEGAL_ADDRESS; pending_code = 0; }
  if (sticky && process_fatal(sticky)) return sticky;
  sticky = 0;
  resets++;
  return OK;
}
unsigned long long scope_mock_resets(void) { LOCKED; return resets; }
CUresult cuCtxGetCurrent(void **ctx) { LOCKED; if (sticky) return sticky; *ctx = current; return OK; }
CUresult cuCtxSetCurrent(void *ctx) {
  LOCKED;
  if (sticky) return sticky;
  context *c = ctx;
  if (c && (c < primaries || c >= primaries + DEVICES || !c->retained))
    return refuse(E_INVALID_CONTEXT, "cuCtxSetCurrent with a context that is not retained");
  current = ctx;
  return OK;
}
static int in_current_context(const stream *s) { return s->ctx == current; }
CUresult cuCtxSynchronize(void) {
  when *waits = NULL;
  size_t nwaits = 0;
  {
    ENTER;
    for (stream *s = streams; s; s = s->next) {
      if (s->live && s->capturing)
        return refuse(E_CAPTURE_UNSUPPORTED, "cuCtxSynchronize while a stream is capturing");
    }
    host_waits++;
    for (stream *s = streams; timing && s; s = s->next) {
      if (!s->live || s->ctx != current) continue;
      waits = realloc(waits, (nwaits + 1) * sizeof *waits);
      waits[nwaits++] = when_tail(s);
    }
  }
  wait_every_stream(in_current_context);
  for (size_t i = 0; i < nwaits; i++) timed_wait(waits[i]);
  free(waits);
  ENTER;
  for (stream *s = streams; s; s = s->next) finish(s);
  release_over_threshold(NULL, 0);
  return surface();
}

static const char *error_string(CUresult e) {
  switch (e) {
    case OK: return "no error";
    case E_INVALID_VALUE: return "invalid argument";
    case E_OUT_OF_MEMORY: return "out of memory";
    case E_NOT_INITIALIZED: return "initialization error";
    case E_INVALID_DEVICE: return "invalid device ordinal";
    case E_INVALID_CONTEXT: return "invalid device context";
    case E_INVALID_PTX: return "a PTX JIT compilation failed";
    case E_UNSUPPORTED_PTX_VERSION: return "the provided PTX was compiled with an unsupported toolchain.";
    case E_INVALID_HANDLE: return "invalid resource handle";
    case E_ILLEGAL_STATE: return "the operation cannot be performed in the present state";
    case E_NOT_FOUND: return "named symbol not found";
    case E_NOT_READY: return "device not ready";
    case E_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    case E_NOT_PERMITTED: return "operation not permitted";
    case E_CAPTURE_UNSUPPORTED: return "operation not permitted when stream is capturing";
    case E_CAPTURE_INVALIDATED: return "operation failed due to a previous error during capture";
    case E_CAPTURE_ISOLATION: return "operation would make the legacy stream depend on a capturing blocking stream";
    case E_CAPTURED_EVENT: return "operation not permitted on an event last recorded in a capturing stream";
    default: return "unknown error (mock)";
  }
}
CUresult cuGetErrorString(CUresult e, const char **s) { *s = error_string(e); return OK; }
CUresult cuGetErrorName(CUresult e, const char **s) {
  switch (e) {
    case E_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case E_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    default: *s = "CUDA_ERROR_MOCK";
  }
  return OK;
}

/* ----- streams and events ----- */

CUresult cuStreamCreate(void **out, unsigned flags) {
  ENTER;
  if (flags > 1) return refuse(E_INVALID_VALUE, "cuStreamCreate flags %u", flags);
  stream *s = calloc(1, sizeof(stream));
  s->live = 1;
  s->ctx = current;
  s->next = streams;
  streams = s;
  *out = s;
  return OK;
}
CUresult cuStreamDestroy_v2(void *p) {
  ENTER;
  stream *s = p;
  STREAM(s);
  if (s->capturing) return refuse(E_ILLEGAL_STATE, "destroying a stream that is capturing");
  /* Its work completes on the device; the struct stays, for pool blocks freed on it. */
  finish(s);
  s->live = 0;
  return OK;
}
static CUresult capturing_refusal(stream *s, const char *call) {
  s->invalidated = 1;
  return refuse(E_CAPTURE_UNSUPPORTED, "%s on a stream that is capturing (the capture is now invalidated)", call);
}
CUresult cuStreamSynchronize(void *p) {
  unsigned long long upto;
  when w = {0, NULL};
  int timed;
  {
    ENTER;
    stream *s = p;
    STREAM(s);
    if (s->capturing) return capturing_refusal(s, "cuStreamSynchronize");
    upto = s->issued;
    host_waits++;
    timed = timing;
    if (timed) w = when_tail(s);
  }
  wait_reached(p, upto);
  wait_on(p, upto);
  if (timed) timed_wait(w);
  ENTER;
  stream *s = p;
  STREAM(s);
  finish(s);
  release_over_threshold(NULL, 0);
  return surface();
}
CUresult cuStreamQuery(void *p) {
  unsigned long long upto;
  place_posts();
  {
    ENTER;
    stream *s = p;
    STREAM(s);
    if (s->capturing) return capturing_refusal(s, "cuStreamQuery");
    upto = s->issued;
    if (!reached(s, upto)) return E_NOT_READY;
  }
  /* Asked without the lock: the mock NCCL takes its own, then this one. */
  if (pending_on(p, upto)) return E_NOT_READY;
  ENTER;
  stream *s = p;
  STREAM(s);
  if (timing) {
    /* The model finish passed: done, and now the host knows. */
    collapse(s);
    long long at = s->tail_node ? finish_of(s->tail_node) : s->tail;
    if (at < 0 || now_ns() < at) return E_NOT_READY;
    s->done = s->issued;
  }
  return s->done == s->issued ? surface() : E_NOT_READY;
}

CUresult cuEventCreate(void **out, unsigned flags) {
  ENTER;
  (void)flags;
  event *e = calloc(1, sizeof(event));
  e->live = 1;
  *out = e;
  return OK;
}
CUresult cuEventDestroy_v2(void *p) {
  ENTER;
  event *e = p;
  if (!e || !e->live) return refuse(E_INVALID_HANDLE, "destroying an event twice");
  e->live = 0; /* kept: a stale handle is then caught, not reused */
  drop(e->node);
  e->node = NULL;
  return OK;
}
CUresult cuEventRecord(void *pe, void *ps) {
  place_posts();
  ENTER;
  event *e = pe;
  stream *s = ps;
  STREAM(s);
  if (!e || !e->live) return refuse(E_INVALID_HANDLE, "recording a destroyed event");
  if (s->capturing) {
    if (s->invalidated) return E_CAPTURE_INVALIDATED;
    e->captured_by = s; /* legal: an event node; but nothing outside may wait on it */
    return OK;
  }
  e->on = s;
  e->seq = s->issued;
  e->captured_by = NULL;
  if (timing) timed_record(s, &e->at, &e->node);
  return OK;
}
static CUresult event_usable(event *e, const char *call) {
  if (!e || !e->live) return refuse(E_INVALID_HANDLE, "%s on a destroyed event", call);
  if (e->captured_by)
    return refuse(E_CAPTURED_EVENT, "%s on an event last recorded in a capturing stream", call);
  return OK;
}
CUresult cuEventQuery(void *p) {
  event *e = p;
  place_posts();
  {
    ENTER;
    CUresult bad = event_usable(e, "cuEventQuery");
    if (bad) return bad;
    if (e->on && !reached(e->on, e->seq)) return E_NOT_READY;
  }
  if (pending_on(e->on, e->seq)) return E_NOT_READY;
  ENTER;
  if (timing && e->on) {
    long long at = e->node ? finish_of(e->node) : e->at;
    if (at < 0 || now_ns() < at) return E_NOT_READY;
  }
  /* Nothing it covers waits on a collective, and work runs as it is
   * issued (or its model time passed): it is done, and now the host knows. */
  if (e->on && e->on->done < e->seq) e->on->done = e->seq;
  return surface();
}
CUresult cuEventSynchronize(void *p) {
  event *e = p;
  when w = {0, NULL};
  int timed;
  {
    ENTER;
    CUresult bad = event_usable(e, "cuEventSynchronize");
    if (bad) return bad;
    host_waits++;
    timed = timing && e->on;
    if (timed) {
      w.at = e->at;
      w.node = e->node;
      if (w.node) w.node->refs++;
    }
  }
  if (e->on) wait_reached(e->on, e->seq);
  wait_on(e->on, e->seq);
  if (timed) timed_wait(w);
  ENTER;
  if (e->on && e->on->done < e->seq) e->on->done = e->seq;
  release_over_threshold(NULL, 0);
  return surface();
}
CUresult cuStreamWaitEvent(void *ps, void *pe, unsigned flags) {
  place_posts();
  ENTER;
  stream *s = ps;
  event *e = pe;
  STREAM(s);
  if (flags) return refuse(E_INVALID_VALUE, "cuStreamWaitEvent flags %u", flags);
  if (!e || !e->live) return refuse(E_INVALID_HANDLE, "waiting on a destroyed event");
  if (s->capturing) {
    if (s->invalidated) return E_CAPTURE_INVALIDATED;
    if (e->captured_by == s || (!e->on && !e->captured_by)) return OK;
    s->invalidated = 1;
    return refuse(E_CAPTURE_ISOLATION,
                  "a capturing stream waits on an event recorded outside its capture (the capture is now invalidated)");
  }
  if (e->captured_by)
    return refuse(E_CAPTURED_EVENT, "waiting on an event last recorded in a capturing stream");
  /* The order, which the allocation check reads; and, where what the
   * event covers has not run (held behind a collective), the stream's
   * later work is held until it has. */
  if (e->on) {
    learn(s, e->on, e->seq);
    for (int i = 0; i < e->on->nknown; i++) learn(s, e->on->known[i].of, e->on->known[i].seq);
    if (timing) timed_wait_event(s, e->at, e->node);
    if (!reached(e->on, e->seq)) {
      s->issued++;
      hold(s, (held){.kind = H_WAIT, .seq = s->issued, .on = e->on, .upto = e->seq});
    }
  }
  return OK;
}

/* ----- capture and graphs ----- */

CUresult cuStreamBeginCapture_v2(void *p, int mode) {
  ENTER;
  stream *s = p;
  STREAM(s);
  if (s->capturing) return refuse(E_ILLEGAL_STATE, "a capture begun on a stream already capturing");
  if (mode != CAPTURE_MODE_RELAXED) return refuse(E_INVALID_VALUE, "a capture begun in mode %d, not RELAXED", mode);
  s->capturing = 1;
  s->invalidated = 0;
  s->capture = calloc(1, sizeof(graph));
  return OK;
}
static void graph_clear(graph *g) {
  for (size_t i = 0; i < g->len; i++) op_free(&g->ops[i]);
  free(g->ops);
  g->ops = NULL;
  g->len = g->cap = 0;
}
CUresult cuStreamEndCapture(void *p, void **out) {
  ENTER;
  stream *s = p;
  STREAM(s);
  if (!s->capturing) return refuse(E_ILLEGAL_STATE, "cuStreamEndCapture on a stream that is not capturing");
  graph *g = s->capture;
  int invalidated = s->invalidated;
  s->capturing = s->invalidated = 0;
  s->capture = NULL;
  if (invalidated) {
    graph_clear(g);
    free(g);
    *out = NULL;
    return E_CAPTURE_INVALIDATED;
  }
  *out = g;
  return OK;
}
/* Test hook: invalidate `p`'s capture, as the driver does when a thread makes an
   illegal call during a capture in global mode. Whether there was one. */
int scope_mock_invalidate_capture(void *p) {
  LOCKED;
  stream *s = p;
  if (!s || !s->live || !s->capturing || s->invalidated) return 0;
  s->invalidated = 1;
  return 1;
}
/* Test hook: operations issued on `p` that the host has not waited for. */
unsigned long long scope_mock_stream_pending(void *p) {
  LOCKED;
  stream *s = p;
  return s ? s->issued - s->done : 0;
}
static op op_copy(const op *o) {
  op c = *o;
  if (o->kind == OP_KERNEL) {
    c.params = malloc(o->f->total ? o->f->total : 1);
    memcpy(c.params, o->params, o->f->total);
  }
  if (o->kind == OP_HOOK) {
    c.params = malloc(o->n ? o->n : 1);
    memcpy(c.params, o->params, o->n);
  }
  return c;
}
CUresult cuGraphInstantiateWithFlags(void **out, void *pg, unsigned long long flags) {
  ENTER;
  graph *g = pg;
  if (!g) return refuse(E_INVALID_VALUE, "instantiating a null graph");
  if (flags) return refuse(E_INVALID_VALUE, "cuGraphInstantiateWithFlags flags %llu", flags);
  exec *x = calloc(1, sizeof(exec));
  x->live = 1;
  for (size_t i = 0; i < g->len; i++) push(&x->g, op_copy(&g->ops[i]));
  *out = x;
  return OK;
}
static CUresult graph_launch(void *px, void *ps, unsigned long long *first);
/* A replay issues the graph's nodes in recorded order, each an operation
 * of the stream: its work runs or is held as eager work is, and each
 * recorded collective takes a slot in the stream's queue, so what was
 * recorded after it waits for it (held.h), as a device runs a graph. Its
 * collectives are then posted in order, without the driver's lock: the
 * mock NCCL takes its own lock and then the driver's, so calling it with
 * the driver's held could deadlock against a rank posting on another
 * thread. Each post fills its slot, placed when the stream reaches it. */
CUresult cuGraphLaunch(void *px, void *ps) {
  place_posts();
  unsigned long long first = 0;
  CUresult r = graph_launch(px, ps, &first);
  if (r != OK) return r;
  exec *x = px;
  stream *s = ps;
  for (size_t i = 0; i < x->g.len; i++)
    if (x->g.ops[i].kind == OP_HOOK) post_replayed(s, x->g.ops[i].hook, x->g.ops[i].params, first + i);
  place_posts();
  return OK;
}
static CUresult graph_launch(void *px, void *ps, unsigned long long *first) {
  ENTER;
  exec *x = px;
  stream *s = ps;
  STREAM(s);
  if (!x || !x->live) return refuse(E_INVALID_HANDLE, "launching a destroyed graph");
  if (s->capturing) return refuse(E_NOT_PERMITTED, "cuGraphLaunch on a capturing stream (a child-graph node)");
  for (size_t i = 0; i < x->g.len; i++)
    if (x->g.ops[i].kind == OP_KERNEL && !x->g.ops[i].f->module->live)
      return refuse(E_INVALID_HANDLE, "replaying a graph that launches `%s`, whose module was unloaded",
                    x->g.ops[i].f->name);
  *first = s->issued + 1;
  /* Timed: the work between two collectives is one span of time. */
  unsigned long long span = 0;
  tnode **end = &s->unclaimed;
  while (*end) end = &(*end)->next;
  for (size_t i = 0; i < x->g.len; i++) {
    const op *o = &x->g.ops[i];
    s->issued++;
    if (o->kind == OP_HOOK) {
      if (timing) {
        timed_op(s, span);
        span = 0;
        *end = add_part(s, s->issued);
        end = &(*end)->next;
      }
      held_slot(s, s->issued);
      continue;
    }
    span += duration(o);
    if (holding(s)) {
      held_work w = {.kind = W_OP, .o = op_copy(o), .replay = 1};
      hold(s, (held){.kind = H_WORK, .seq = s->issued, .w = w});
    } else {
      run(o, 1);
    }
  }
  timed_op(s, span);
  replayed *r = x->replays;
  while (r && r->on != s) r = r->next;
  if (!r) {
    r = calloc(1, sizeof(replayed));
    r->on = s;
    r->next = x->replays;
    x->replays = r;
  }
  r->seq = s->issued;
  return OK;
}
CUresult cuGraphExecDestroy(void *px) {
  ENTER;
  exec *x = px;
  if (!x || !x->live) return refuse(E_INVALID_HANDLE, "destroying a graph exec twice");
  for (replayed *r = x->replays; r; r = r->next)
    if (r->on->done < r->seq) {
      destroyed_in_flight++;
      fprintf(stderr, "mock cuda: a graph was destroyed before the host waited for its replay\n");
      break;
    }
  while (x->replays) { replayed *r = x->replays; x->replays = r->next; free(r); }
  graph_clear(&x->g);
  x->live = 0;
  return OK;
}
CUresult cuGraphDestroy(void *pg) {
  ENTER;
  graph *g = pg;
  if (!g) return refuse(E_INVALID_VALUE, "destroying a null graph");
  graph_clear(g);
  free(g);
  return OK;
}

/* ----- memory ----- */

/* CUmemPoolProps, CUDA 12.6 – 13.1: 88 bytes. */
typedef struct {
  int allocType, handleTypes;
  struct { int type, id; } location;
  void *win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
} pool_props;
_Static_assert(sizeof(pool_props) == 88, "CUmemPoolProps is 88 bytes in CUDA 13.0");

CUresult cuMemPoolCreate(void **out, const pool_props *props) {
  ENTER;
#ifdef SCOPE_MOCK_OLD_DRIVER
  (void)out; (void)props;
  return refuse(E_NOT_PERMITTED, "cuMemPoolCreate on a device that reports no memory pool support");
#endif
  int zero = 1;
  for (size_t i = 0; i < sizeof props->reserved; i++) zero &= props->reserved[i] == 0;
  if (props->allocType != 1 || props->handleTypes != 0 || props->location.type != 1 || props->location.id != current->ordinal ||
      props->win32SecurityAttributes || props->maxSize || props->usage || !zero)
    return refuse(E_INVALID_VALUE, "cuMemPoolCreate: not a plain pinned pool on the current device (alloc %d, handles %d, "
                  "location %d/%d, maxSize %zu, usage %u, reserved zero %d)", props->allocType, props->handleTypes,
                  props->location.type, props->location.id, props->maxSize, props->usage, zero);
  pool *p = calloc(1, sizeof(pool));
  p->live = 1;
  p->next = pools;
  pools = p;
  *out = p;
  return OK;
}
static CUresult pool_ok(pool *p, const char *call) {
  if (!p || !p->live) return refuse(E_INVALID_HANDLE, "%s on a destroyed pool", call);
  return OK;
}
#define POOL(p) { CUresult bad_ = pool_ok(p, __func__); if (bad_) return bad_; }

CUresult cuMemPoolDestroy(void *pp) {
  ENTER;
  pool *p = pp;
  POOL(p);
  /* CUDA releases outstanding blocks when they are freed; the server frees
     everything first, so here they all go. */
  for (block *b = blocks, *next; b; b = next) {
    next = b->next;
    if (b->pool == p) drop_block(b);
  }
  p->live = 0;
  return OK;
}
CUresult cuMemPoolSetAttribute(void *pp, int attribute, void *value) {
  ENTER;
  pool *p = pp;
  POOL(p);
  switch (attribute) {
    case POOL_RELEASE_THRESHOLD: memcpy(&p->threshold, value, 8); return OK;
    case POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES: return OK; /* the mock never adds dependencies */
    default: return refuse(E_INVALID_VALUE, "cuMemPoolSetAttribute: attribute %d", attribute);
  }
}
CUresult cuMemPoolGetAttribute(void *pp, int attribute, void *value) {
  ENTER;
  pool *p = pp;
  POOL(p);
  unsigned long long v;
  switch (attribute) {
    case POOL_RELEASE_THRESHOLD: v = p->threshold; break;
    case POOL_RESERVED_MEM_CURRENT: v = p->reserved; break;
    case POOL_USED_MEM_CURRENT: v = p->in_use; break;
    default: return refuse(E_INVALID_VALUE, "cuMemPoolGetAttribute: attribute %d", attribute);
  }
  memcpy(value, &v, 8);
  return OK;
}
/* Release freed, finished blocks of `only` (every pool if NULL) while it holds more than `keep`
   (or its threshold, when only is NULL). */
static void release_over_threshold(pool *only, unsigned long long keep) {
  for (block *b = blocks, *next; b; b = next) {
    next = b->next;
    pool *p = b->pool;
    if (!p || b->live || (only && p != only)) continue;
    unsigned long long limit = only ? keep : p->threshold;
    if (p->reserved > limit && b->freed_on->done >= b->freed_seq) drop_block(b);
  }
}
CUresult cuMemPoolTrimTo(void *pp, size_t keep) {
  ENTER;
  pool *p = pp;
  POOL(p);
  release_over_threshold(p, keep);
  return OK;
}
static size_t rounded(size_t n) { return (n + 511) & ~(size_t)511; }

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *out, size_t n, void *pp, void *ps) {
  ENTER;
  pool *p = pp;
  stream *s = ps;
  POOL(p);
  STREAM(s);
  if (s->capturing)
    return refuse(E_NOT_PERMITTED, "cuMemAllocFromPoolAsync on a capturing stream (an allocation node in the graph)");
  if (!n) return E_INVALID_VALUE;
  size_t size = rounded(n);
  for (block *b = blocks; b; b = b->next) {
    if (b->pool == p && !b->live && b->size >= size && b->size <= 2 * size && reusable(b, s)) {
      b->live = 1;
      b->serial = next_serial();
      b->freed_on = NULL;
      p->in_use += b->size;
      *out = (CUdeviceptr)(uintptr_t)b->base;
      s->issued++;
      timed_op(s, 0);
      b->alloc_on = s;
      b->alloc_seq = s->issued;
      return OK;
    }
  }
  if (used + size > TOTAL) return E_OUT_OF_MEMORY;
  block *b = new_block(size, DEVICE, p);
  if (!b) return E_OUT_OF_MEMORY;
  used += size;
  p->reserved += size;
  p->in_use += size;
  *out = (CUdeviceptr)(uintptr_t)b->base;
  s->issued++;
  timed_op(s, 0);
  b->alloc_on = s;
  b->alloc_seq = s->issued;
  return OK;
}
CUresult cuMemFreeAsync(CUdeviceptr ptr, void *ps) {
  place_posts();
  ENTER;
  stream *s = ps;
  STREAM(s);
  block *b = find((void *)(uintptr_t)ptr, 1, DEVICE);
  if (!b || b->base != (char *)(uintptr_t)ptr || !b->pool || b->freeing)
    return refuse(E_INVALID_VALUE, "cuMemFreeAsync of %#llx, which is not a live pool allocation", ptr);
  if (s->capturing)
    return refuse(E_NOT_PERMITTED, "cuMemFreeAsync on a capturing stream (a free node in the graph)");
  s->issued++;
  timed_op(s, 0);
  if (holding(s)) {
    b->freeing = 1;
    hold(s, (held){.kind = H_WORK, .seq = s->issued, .w = {.kind = W_FREE, .b = b}});
    return OK;
  }
  free_block_on(s, b, s->issued);
  return OK;
}
#ifndef SCOPE_MOCK_OLD_DRIVER
/* The device's default pool, for cudarc's own allocations (the bench's
 * raw-API baseline): made on first use, like the driver's. */
static pool *default_pool(void) {
  static pool *p;
  if (!p) {
    p = calloc(1, sizeof(pool));
    p->live = 1;
    p->next = pools;
    pools = p;
  }
  return p;
}
#endif
CUresult cuMemAllocAsync(CUdeviceptr *out, size_t n, void *ps) {
  ENTER;
#ifdef SCOPE_MOCK_OLD_DRIVER
  (void)out; (void)n; (void)ps;
  return refuse(E_NOT_PERMITTED, "cuMemAllocAsync on a device that reports no memory pool support");
#else
  return cuMemAllocFromPoolAsync(out, n, default_pool(), ps);
#endif
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, void *ps) {
  place_posts();
  ENTER;
  stream *s = ps;
  STREAM(s);
  if (!find((void *)(uintptr_t)dst, n, DEVICE))
    return refuse(E_INVALID_VALUE, "a memset of %zu bytes at %#llx, outside every live allocation", n, dst);
  CUresult unordered = ordered_for(s, (void *)(uintptr_t)dst, "a memset");
  if (unordered) return unordered;
  if (s->capturing) return refuse(E_NOT_PERMITTED, "cuMemsetD8Async on a capturing stream (not modelled)");
  s->issued++;
  timed_op(s, 0);
  if (holding(s)) {
    held_work w = {.kind = W_MEMSET, .dst = (char *)(uintptr_t)dst, .value = value, .n = n};
    hold(s, (held){.kind = H_WORK, .seq = s->issued, .w = w});
    return OK;
  }
  if (!fault_pending && !sticky) memset((void *)(uintptr_t)dst, value, n);
  return OK;
}
CUresult cuMemAlloc_v2(CUdeviceptr *out, size_t n) {
  ENTER;
  if (!n) return E_INVALID_VALUE;
  if (used + n > TOTAL) return E_OUT_OF_MEMORY;
  block *b = new_block(n, DEVICE, NULL);
  if (!b) return E_OUT_OF_MEMORY;
  used += n;
  *out = (CUdeviceptr)(uintptr_t)b->base;
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr ptr) {
  ENTER;
  block *b = find((void *)(uintptr_t)ptr, 1, DEVICE);
  if (!b || b->base != (char *)(uintptr_t)ptr || b->pool)
    return refuse(E_INVALID_VALUE, "cuMemFree of %#llx, which is not a live cuMemAlloc allocation", ptr);
  drop_block(b);
  return OK;
}
CUresult cuMemHostAlloc(void **out, size_t n, unsigned flags) {
  ENTER;
  (void)flags;
  block *b = new_block(n, HOST, NULL);
  if (!b) return E_OUT_OF_MEMORY;
  *out = b->base;
  return OK;
}
CUresult cuMemFreeHost(void *p) {
  ENTER;
  block *b = find(p, 1, HOST);
  if (!b || b->base != p) return refuse(E_INVALID_VALUE, "cuMemFreeHost of %p, which is not from cuMemHostAlloc", p);
  drop_block(b);
  return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *ps) {
  place_posts();
  ENTER;
  stream *s = ps;
  STREAM(s);
  if (!find((void *)(uintptr_t)dst, n, DEVICE))
    return refuse(E_INVALID_VALUE, "a write of %zu bytes to %#llx, outside every live allocation", n, dst);
  CUresult unordered = ordered_for(s, (void *)(uintptr_t)dst, "a host-to-device copy");
  if (unordered) return unordered;
  if (s->capturing && !s->invalidated && !find(src, n, HOST)) {
    s->invalidated = 1;
    return refuse(E_CAPTURE_UNSUPPORTED, "a captured host-to-device copy from pageable memory (the capture is now invalidated)");
  }
  op o = {OP_HTOD, (char *)(uintptr_t)dst, src, n, NULL, 0, NULL, NULL};
  return issue(s, o);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *ps) {
  place_posts();
  ENTER;
  stream *s = ps;
  STREAM(s);
  if (!find((void *)(uintptr_t)src, n, DEVICE))
    return refuse(E_INVALID_VALUE, "a read of %zu bytes from %#llx, outside every live allocation", n, src);
  CUresult unordered = ordered_for(s, (void *)(uintptr_t)src, "a device-to-host copy");
  if (unordered) return unordered;
  if (s->capturing && !s->invalidated && !find(dst, n, HOST)) {
    s->invalidated = 1;
    return refuse(E_CAPTURE_UNSUPPORTED, "a captured device-to-host copy to pageable memory (the capture is now invalidated)");
  }
  op o = {OP_DTOH, dst, (const char *)(uintptr_t)src, n, NULL, 0, NULL, NULL};
  return issue(s, o);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *ps) {
  place_posts();
  ENTER;
  stream *s = ps;
  STREAM(s);
  if (!find((void *)(uintptr_t)dst, n, DEVICE) || !find((void *)(uintptr_t)src, n, DEVICE))
    return refuse(E_INVALID_VALUE, "a copy of %zu bytes from %#llx to %#llx, outside every live allocation", n, src, dst);
  CUresult unordered = ordered_for(s, (void *)(uintptr_t)src, "a device copy's source");
  if (!unordered) unordered = ordered_for(s, (void *)(uintptr_t)dst, "a device copy's destination");
  if (unordered) return unordered;
  op o = {OP_DTOD, (char *)(uintptr_t)dst, (const char *)(uintptr_t)src, n, NULL, 0, NULL, NULL};
  return issue(s, o);
}

/* ----- modules and launches ----- */

/* Write `text` into the JIT's error log, as far as it fits. */
static void jit_log(char *log, size_t size, const char *text) {
  if (!log || !size) return;
  snprintf(log, size, "%s", text);
}

/* The newest PTX ISA (10 * major + minor) a driver of CUDA `version`
 * JITs: the ISA that CUDA release introduced (the PTX ISA release
 * history: 12.0 to 12.5 bring 8.0 to 8.5, 12.6 none, 12.7 8.6, 12.8 8.7,
 * 12.9 8.8, 13.0 9.0). */
static int newest_ptx_isa(int version) {
  int major = version / 1000, minor = (version % 1000) / 10;
  if (major >= 13) return 90 + minor;
  if (major == 12) return minor <= 5 ? 80 + minor : minor == 6 ? 85 : 79 + minor;
  return 70 + minor;
}

/* Parse the mock NVRTC's PTX: header directives, then one `.scope_mock_entry NAME KIND SIZE...` per kernel. */
static CUresult load(module *m, const char *image, char *log, size_t log_size) {
  char text[512];
  int line = 0, target = 0;
  const char *at = image;
  while (*at) {
    line++;
    const char *end = strchr(at, '\n');
    size_t len = end ? (size_t)(end - at) : strlen(at);
    char buf[512];
    if (len >= sizeof buf) len = sizeof buf - 1;
    memcpy(buf, at, len);
    buf[len] = 0;
    at = end ? end + 1 : at + len;
    char *t = buf;
    while (*t == ' ' || *t == '\t' || *t == '\r') t++;
    if (!*t || !strncmp(t, "//", 2) || !strncmp(t, ".address_size ", 14)) continue;
    int isa_major, isa_minor;
    if (sscanf(t, ".version %d.%d", &isa_major, &isa_minor) == 2) {
      int newest = newest_ptx_isa(SCOPE_MOCK_DRIVER_VERSION);
      if (isa_major * 10 + isa_minor > newest) {
        /* ptxas's words, as the real JIT puts them in the log. */
        snprintf(text, sizeof text, "ptxas application ptx input, line %d; fatal   : Unsupported .version %d.%d; "
                 "current version is '%d.%d'", line, isa_major, isa_minor, newest / 10, newest % 10);
        jit_log(log, log_size, text);
        return E_UNSUPPORTED_PTX_VERSION;
      }
      continue;
    }
    if (sscanf(t, ".target sm_%d", &target) == 1) {
      if (target > DEVICE_CC) {
        snprintf(text, sizeof text, "ptxas application ptx input, line %d; fatal   : SM version specified by "
                 ".target (sm_%d) is higher than the device's (sm_%d)", line, target, DEVICE_CC);
        jit_log(log, log_size, text);
        return E_INVALID_PTX;
      }
      continue;
    }
    if (!strncmp(t, ".scope_mock_entry ", 18) && target && m->nfunctions < 16) {
      function *f = &m->functions[m->nfunctions];
      char kind[32];
      int used_chars = 0;
      if (sscanf(t + 18, "%127s %31s%n", f->name, kind, &used_chars) == 2) {
        f->kind = -1;
        for (int k = 0; k < 5; k++) if (!strcmp(kind, KINDS[k])) f->kind = k;
        const char *sizes = t + 18 + used_chars;
        int step = 0;
        size_t size, offset = 0;
        f->nparams = 0;
        while (f->nparams < MAX_PARAMS && sscanf(sizes, "%zu%n", &size, &step) == 1) {
          size_t align = size >= 8 ? 8 : 4;
          offset = (offset + align - 1) / align * align;
          f->size[f->nparams] = size;
          f->offset[f->nparams] = offset;
          offset += size;
          f->nparams++;
          sizes += step;
        }
        f->total = offset;
        f->module = m;
        if (f->kind >= 0 && f->nparams >= POINTERS[f->kind]) { m->nfunctions++; continue; }
      }
    }
    char token[64];
    sscanf(t, "%63s", token);
    snprintf(text, sizeof text, "ptxas application ptx input, line %d; error   : Unknown directive or instruction "
             "'%s' (the mock JIT loads only the mock NVRTC's PTX)\nptxas fatal   : Ptx assembly aborted due to errors",
             line, token);
    jit_log(log, log_size, text);
    return E_INVALID_PTX;
  }
  if (!target || !m->nfunctions) {
    jit_log(log, log_size, "ptxas fatal   : no .target or no entry in the PTX input");
    return E_INVALID_PTX;
  }
  return OK;
}

CUresult cuModuleLoadDataEx(void **out, const void *image, unsigned n, int *options, void **values) {
  ENTER;
  char *log = NULL;
  size_t log_size = 0;
  int has_log = 0, has_size = 0;
  for (unsigned i = 0; i < n; i++) {
    if (options[i] == JIT_ERROR_LOG_BUFFER) { log = values[i]; has_log = 1; }
    if (options[i] == JIT_ERROR_LOG_BUFFER_SIZE_BYTES) { log_size = (size_t)(uintptr_t)values[i]; has_size = 1; }
  }
  if (has_log && !has_size) return refuse(E_INVALID_VALUE, "a JIT error log buffer with no size");
  module *m = calloc(1, sizeof(module));
  CUresult r = load(m, image, log, log_size);
  if (r) { free(m); return r; }
  m->live = 1;
  *out = m;
  return OK;
}
CUresult cuModuleLoadData(void **out, const void *image) {
  return cuModuleLoadDataEx(out, image, 0, NULL, NULL);
}
CUresult cuModuleUnload(void *pm) {
  ENTER;
  module *m = pm;
  if (!m || !m->live) return refuse(E_INVALID_HANDLE, "unloading a module twice");
  m->live = 0; /* kept: a launch of one of its functions is then caught */
  return OK;
}
CUresult cuModuleGetFunction(void **out, void *pm, const char *name) {
  ENTER;
  module *m = pm;
  if (!m || !m->live) return refuse(E_INVALID_HANDLE, "cuModuleGetFunction on an unloaded module");
  for (int i = 0; i < m->nfunctions; i++)
    if (!strcmp(m->functions[i].name, name)) { *out = &m->functions[i]; return OK; }
  return E_NOT_FOUND;
}
#ifndef SCOPE_MOCK_OLD_DRIVER
CUresult cuFuncGetParamInfo(void *pf, size_t index, size_t *offset, size_t *size) {
  ENTER;
  function *f = pf;
  if (!f || !f->module->live) return refuse(E_INVALID_HANDLE, "cuFuncGetParamInfo on a function of an unloaded module");
  if (index >= (size_t)f->nparams) return E_INVALID_VALUE;
  if (offset) *offset = f->offset[index];
  if (size) *size = f->size[index];
  return OK;
}
#endif /* cuFuncGetParamInfo is CUDA 12.4+ */
CUresult cuLaunchKernel(void *pf, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *ps, void **params, void **extra) {
  place_posts();
  ENTER;
  function *f = pf;
  stream *s = ps;
  STREAM(s);
  if (!f || !f->module->live) return refuse(E_INVALID_HANDLE, "launching a function of an unloaded module");
  if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > THREADS_PER_BLOCK ||
      gx > GRID[0] || gy > GRID[1] || gz > GRID[2] || bx > BLOCK[0] || by > BLOCK[1] || bz > BLOCK[2])
    return refuse(E_INVALID_VALUE, "`%s` launched with grid %ux%ux%u, block %ux%ux%u", f->name, gx, gy, gz, bx, by, bz);
  if (shared > SHARED_PER_BLOCK) return refuse(E_INVALID_VALUE, "`%s` asks for %u bytes of shared memory", f->name, shared);
  if (extra) return refuse(E_INVALID_VALUE, "`%s` launched with `extra` (the server passes kernelParams)", f->name);
  if (f->nparams && !params) return refuse(E_INVALID_VALUE, "`%s` takes parameters; kernelParams is null", f->name);
  op o = {OP_KERNEL, NULL, NULL, 0, f, 0, malloc(f->total ? f->total : 1), NULL};
  unsigned long long threads = (unsigned long long)gx * gy * gz * bx * by * bz;
  o.threads = threads > 0xffffffffu ? 0xffffffffu : (unsigned)threads;
  for (int i = 0; i < f->nparams; i++) memcpy(o.params + f->offset[i], params[i], f->size[i]);
  return issue(s, o);
}
