/*
 * A mock of NCCL, for running the device transport of server-cuda (over
 * its mock driver, mock_cuda.c) and server-hip (over mock_hip.c) on
 * machines without a GPU. It lives in the test kit, which both servers'
 * tests depend on (scope_test::clib::MOCK_NCCL). It is not NCCL: there is
 * no network and no kernel; a collective's bytes move when the last rank
 * of the communicator posts its part, on that rank's thread, between the
 * mock driver's "device" allocations (host memory). A driver that holds
 * work behind a collective (see "held work" below) holds a post too: it
 * is placed when its stream reaches it. A send or a receive is posted and
 * placed the same way: each half is an open part of its stream until the
 * other half is placed, when the bytes move, so work on either side keeps
 * its stream order around it.
 *
 * server-cuda's tests build it with -Wl,-soname,libnccl.so and load it by
 * absolute path before cudarc looks for "libnccl.so" (see their
 * harness.rs). server-hip's tests build it as a mock RCCL (RCCL is NCCL's
 * API), with SCOPE_MOCK_DRIVER naming their mock HIP runtime. Values (result
 * codes, data types, reduction operations, the ncclConfig_t head) are NCCL
 * 2.30's, as cudarc's bindings (feature nccl-02030) spell them.
 *
 * Like a non-blocking communicator, a collective returns as soon as it is
 * posted (ncclSuccess) — and, like NCCL's kernel, it is work on its stream
 * that is not done until every rank posted: the driver's queries answer
 * "not ready" and its host waits wait until then (or an abort). And
 * ncclCommInitRankConfig with blocking = 0
 * returns ncclInProgress until every rank joined, which
 * ncclCommGetAsyncError reports. A blocking init waits for its peers.
 *
 * As NCCL's, one communicator's calls run in issue order whatever their
 * streams (NCCL's launch waits on the communicator's internal stream): a
 * post on another stream than the communicator's last waits for that one
 * (the driver's scope_mock_stream_after), in timed mode too.
 * ncclCommSplit gives a communicator of its own, as scope's ballots use.
 *
 * It is a checker too. Each of these fails and counts a violation
 * (scope_mock_nccl_violations / scope_mock_nccl_last_violation, printed to
 * stderr), where real NCCL refuses the call, hangs, or reads or writes past
 * a buffer:
 *
 *  - a config without NCCL_API_MAGIC, a unique id not from
 *    ncclGetUniqueId, a rank outside the communicator, ranks that disagree
 *    on its size, a rank joined twice;
 *  - two ranks of one communicator on one device ("Duplicate GPU detected"),
 *    and an init with no current CUDA context on the thread;
 *  - a collective before every rank joined, or on a communicator that was
 *    aborted or destroyed (a use after free in NCCL), an abort or destroy
 *    of one already aborted, a destroy of one whose init is still in
 *    progress (NCCL's destroy would wait for peers that never come);
 *  - ranks that post different calls for one sequence number: another
 *    collective, another count, type, operation or root (NCCL would hang
 *    or move the wrong bytes);
 *  - a send or receive buffer not inside one live device allocation for
 *    the bytes the call touches;
 *  - a recorded call whose replays disagree across ranks, or that a
 *    replay posts on an aborted communicator;
 *  - a data type NCCL does not number (0 to 9, ncclInt8 to ncclBfloat16),
 *    an unknown operation;
 *  - a send or receive whose peer is outside the communicator or the rank
 *    itself, halves of one transfer of different lengths, or a transfer
 *    on a capturing stream.
 *
 * In the mock driver's timed mode (mock_cuda.c: scope_mock_timing), each
 * rank's part of a call is an operation of its stream that starts as the
 * stream's work allows (the driver's model) and that the driver cannot
 * finish alone: when the last rank posts, every rank's part finishes at
 * the latest part's start plus latency + bytes / bandwidth, as set by
 * scope_mock_nccl_model (default 0 and infinite: at the latest start).
 * `bytes` is the call's count times its element size: the per-rank
 * message (an all-gather's or all-to-all's input per rank, a
 * reduce-scatter's output per rank). A send and its receive are modelled
 * alike, for the bytes of the transfer. ncclCommAbort ends its unfinished
 * parts at once, as NCCL's kernels return after an abort: one not joined
 * yet ends at the abort, and so does every part of a joined call whose
 * finish has not passed — but not before its own start (a rank whose
 * stream is still busy with earlier work ends its part when that work is
 * done); work behind them follows from the new finishes. For that the
 * communicator keeps the driver's handles on its joined parts until the
 * driver says no abort can move them (scope_mock_part_join_kept,
 * scope_mock_part_settled); a driver without those hooks gets the join
 * as before, and an abort ends only what was not joined. What an ended
 * part was to write is left scribbled with 0xa5 bytes, as a killed
 * kernel leaves partial data (see scribble). Communicators
 * in shared mode (ranks in separate processes) are not timed: their
 * parts take no model time, and a host wait waits for the peers as
 * before. A driver without timed mode sees the calls as before.
 *
 * A call on a capturing stream is recorded (through the driver's
 * scope_mock_record_collective) and checked as a post would be, without
 * taking a sequence number: each replay of its graph posts it then, as
 * the next call of its communicator, as NCCL's captured kernels run. The
 * post fills the slot the replay left in its stream's queue, so the
 * graph's later nodes wait for it (the drivers' held.h).
 *
 * A reduction combines the ranks' elements in rank order (rank 0's, then
 * rank 1's, ...), in the arithmetic NCCL's kernels use, so that a test can
 * expect NCCL's bits: integer sums and products wrap, and their average
 * is the wrapped sum divided by the ranks, truncating; float32 and float64
 * add in their own type; float16 and bfloat16 combine in float and round
 * to 16 bits at every step. A minimum or maximum of floats takes the
 * number over a NaN, as fminf and fmaxf do.
 *
 * Every entry point takes one process-wide lock.
 */
#include <errno.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

enum {
  SUCCESS = 0, UNHANDLED_CUDA = 1, SYSTEM = 2, INTERNAL = 3, INVALID_ARGUMENT = 4,
  INVALID_USAGE = 5, REMOTE = 6, IN_PROGRESS = 7
};
/* ncclDataType_t, and each type's element size: NCCL counts elements. */
enum { INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 };
static const size_t ELEMENT_SIZES[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
/* The element size of `dtype`; 0 for a type NCCL does not number. */
static size_t element_size(int dtype) {
  return dtype >= INT8 && dtype <= BFLOAT16 ? ELEMENT_SIZES[dtype] : 0;
}
enum { SUM = 0, PROD = 1, MAX = 2, MIN = 3, AVG = 4 };
enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, ALL_TO_ALL };
static const char *CALLS[] = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast",
                              "ncclAlltoAll"};

#define API_MAGIC 0xcafebeefu
#define ID_MAGIC "scopemck"
#define MAX_RANKS 8
#define VERSION 23007

typedef struct { char internal[128]; } ncclUniqueId;
/* The head of ncclConfig_t every version shares. */
typedef struct { size_t size; unsigned magic, version; int blocking; } config_head;

typedef struct {
  int posted, kind, dtype, op, root;
  size_t count;
  const void *send;
  void *recv;
  /* The stream it was posted on, and its operation number there (the
   * driver's scope_mock_stream_op): the stream's later work waits for it. */
  void *stream;
  unsigned long long seq;
  /* Timed mode: the driver's handle on its part, until the call is joined. */
  void *part;
} post;
typedef struct call {
  unsigned long long seq;
  int nposted, mismatched;
  post posts[MAX_RANKS];
  struct call *next;
} call;
/* A point-to-point transfer, number n from one rank to another: bytes
 * move when both halves are placed. */
typedef struct transfer {
  int from, to, has_send, has_recv;
  unsigned long long n;
  const void *send;
  void *recv;
  size_t send_bytes, recv_bytes;
  void *send_stream, *recv_stream;
  unsigned long long send_seq, recv_seq;
  void *send_part, *recv_part; /* timed mode, as a post's */
  struct transfer *next;
} transfer;
/* A joined part an abort may still end, and what it writes on its rank:
 * the bytes, and the driver's number for the allocation they were in at
 * the join (scope_mock_device_range). */
typedef struct kept_part { void *part; void *recv; size_t bytes; int allocation; } kept_part;
typedef struct clique {
  unsigned long long id;
  /* A shrink's or split's clique: its parent's id and which shrink or split
   * of it (0: neither). */
  unsigned long long parent, nth;
  /* The id ncclGetUniqueId made for the first clique of its line, which
   * its shrinks and splits inherit, and how many ranks joined this one by
   * a shrink: a test counts the shrinks of its own groups, whatever
   * others run. */
  unsigned long long root, shrinks;
  int nranks, joined, aborted;
  int devices[MAX_RANKS], present[MAX_RANKS];
  call *calls;
  transfer *transfers;
  /* Timed mode: the driver's handles on joined parts whose finish an
   * abort may still move (see join_parts). */
  struct kept_part *kept;
  size_t nkept, capkept, prune_at;
  struct clique *next;
} clique;
struct shared_clique;
typedef struct comm {
  clique *c;                 /* in this process */
  struct shared_clique *sh;  /* or across processes (see "shared mode") */
  int rank, aborted, destroyed;
  /* How many times this rank shrank, and split, this communicator. */
  unsigned long long shrunk, split;
  /* Shared mode: the clique's file, whose split is `<file>.split`. */
  char path[112];
  /* Its last post: the stream, its operation there, and (timed) its part,
   * a handle kept here, which the next post on another stream waits for. */
  void *last_stream, *last_part;
  unsigned long long last_seq;
  unsigned long long next_seq;
  /* Transfers posted to, and from, each peer: their numbers. */
  unsigned long long sent[MAX_RANKS], received[MAX_RANKS];
} comm;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static clique *cliques;
static unsigned long long next_id = 1;
/* The id last made on each thread, for scope_mock_nccl_last_id_made_here. */
static __thread unsigned long long made_here;
static unsigned long long violations;
static char last_violation[512];

static void unlock(int *unused) { (void)unused; pthread_mutex_unlock(&lock); }
#define LOCKED int held_ __attribute__((cleanup(unlock))) = (pthread_mutex_lock(&lock), 1)

static int refuse(int code, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(last_violation, sizeof last_violation, fmt, args);
  va_end(args);
  violations++;
  fprintf(stderr, "mock nccl: refused (%d): %s\n", code, last_violation);
  return code;
}

unsigned long long scope_mock_nccl_violations(void) { LOCKED; return violations; }
const char *scope_mock_nccl_last_violation(void) { return last_violation; }

/* The mock driver's hooks, found through the copy already loaded: the
 * mock CUDA driver by its soname, or the library SCOPE_MOCK_DRIVER names
 * (server-hip's tests build this file as a mock RCCL over their mock HIP
 * runtime, loaded by path). */
#ifndef SCOPE_MOCK_DRIVER
#define SCOPE_MOCK_DRIVER "libcuda.so"
#endif
static void *driver_hook(const char *name) {
  void *driver = dlopen(SCOPE_MOCK_DRIVER, RTLD_NOLOAD | RTLD_LAZY);
  return driver ? dlsym(driver, name) : NULL;
}
static int current_device(void) {
  int (*f)(void) = (int (*)(void))driver_hook("scope_mock_current_device");
  return f ? f() : -1;
}
static int device_range(const void *p, size_t n) {
  int (*f)(const void *, size_t) = (int (*)(const void *, size_t))driver_hook("scope_mock_device_range");
  return f ? f(p, n) : 0;
}
static int stream_capturing(void *s) {
  int (*f)(void *) = (int (*)(void *))driver_hook("scope_mock_stream_capturing");
  return f ? f(s) : -1;
}

/* A call recorded into a capturing stream's graph: what its replays post. */
typedef struct {
  comm *m;
  int kind, dtype, op, root;
  size_t count;
  const void *send;
  void *recv;
} recorded;
static void replay_recorded(const void *blob, void *stream, unsigned long long seq);
static int record_call(void *stream, const recorded *r) {
  typedef void (*hook)(const void *, void *, unsigned long long);
  int (*f)(void *, hook, const void *, size_t) =
      (int (*)(void *, hook, const void *, size_t))driver_hook("scope_mock_record_collective");
  return f ? f(stream, replay_recorded, r, sizeof *r) : 0;
}

static unsigned long long stream_op(void *s) {
  unsigned long long (*f)(void *) = (unsigned long long (*)(void *))driver_hook("scope_mock_stream_op");
  return f ? f(s) : 0;
}

/* ----- held work (the driver's queue behind a collective) -----
 * A local post is a part of its stream that is open until its call runs
 * or its communicator is aborted: the driver holds the work ordered after
 * an open part (scope_mock_part_opened, scope_mock_part_closed) and runs
 * it once the part closed, as a GPU runs work behind NCCL's kernel. A
 * post issued on a stream that holds work is placed only when the stream
 * reaches it (scope_mock_hold_post; place_held below): its call's number
 * is taken when it is issued, as NCCL's is, and the call runs when every
 * rank's part is placed. A driver without the hooks runs everything when
 * it is issued. */
static void part_opened(void *stream, unsigned long long seq) {
  void (*f)(void *, unsigned long long) = (void (*)(void *, unsigned long long))driver_hook("scope_mock_part_opened");
  if (f) f(stream, seq);
}
static void part_closed(void *stream, unsigned long long seq) {
  void (*f)(void *, unsigned long long) = (void (*)(void *, unsigned long long))driver_hook("scope_mock_part_closed");
  if (f) f(stream, seq);
}

/* ----- timed mode (the driver's model of device time) -----
 * A post's part: a new operation of the stream (its number) whose finish
 * is set here, *part the driver's handle (NULL where the driver keeps no
 * time: timed mode off, or a driver without it). */
static unsigned long long latency_ns;
static double bytes_per_second;
void scope_mock_nccl_model(unsigned long long latency, double bandwidth) {
  LOCKED;
  latency_ns = latency;
  bytes_per_second = bandwidth;
}
static unsigned long long cost(size_t bytes) {
  double transfer = bytes_per_second > 0 ? (double)bytes * 1e9 / bytes_per_second : 0;
  return latency_ns + (unsigned long long)transfer;
}
static unsigned long long stream_part(void *s, void **part) {
  unsigned long long (*f)(void *, void **) =
      (unsigned long long (*)(void *, void **))driver_hook("scope_mock_stream_part");
  *part = NULL;
  return f ? f(s, part) : stream_op(s);
}
/* A replay's part: made by the driver's graph launch, taken here. */
static void *replay_part(void *s) {
  void *(*f)(void *) = (void *(*)(void *))driver_hook("scope_mock_replay_part");
  return f ? f(s) : NULL;
}
/* NCCL runs one communicator's kernels in issue order, whatever their
 * streams: the next post of `m` on `stream` waits for its last one when
 * that was on another stream (scope_mock_stream_after). */
static void after_last(comm *m, void *stream) {
  void (*f)(void *, void *, unsigned long long, void *) =
      (void (*)(void *, void *, unsigned long long, void *))driver_hook("scope_mock_stream_after");
  if (f && m->last_stream && m->last_stream != stream) f(stream, m->last_stream, m->last_seq, m->last_part);
}
/* `m`'s last post is now operation `seq` of `stream`, part `part`. */
static void now_last(comm *m, void *stream, unsigned long long seq, void *part) {
  void (*keep)(void *) = (void (*)(void *))driver_hook("scope_mock_part_keep");
  void (*release)(void *) = (void (*)(void *))driver_hook("scope_mock_part_release");
  if (m->last_part && release) release(m->last_part);
  m->last_part = part && keep && release ? part : NULL;
  if (m->last_part) keep(m->last_part);
  m->last_stream = stream;
  m->last_seq = seq;
}

/* Handles of `c`'s joined parts that the driver says no abort can move
 * any more (their finish passed) are handed back. Looked at when the
 * list has doubled since, so that a join costs O(1) amortized. */
static void forget_settled(clique *c) {
  if (c->nkept < c->prune_at) return;
  int (*settled)(void *) = (int (*)(void *))driver_hook("scope_mock_part_settled");
  void (*release)(void *) = (void (*)(void *))driver_hook("scope_mock_part_release");
  size_t left = 0;
  for (size_t i = 0; i < c->nkept; i++) {
    if (settled && release && settled(c->kept[i].part)) release(c->kept[i].part);
    else c->kept[left++] = c->kept[i];
  }
  c->nkept = left;
  c->prune_at = 2 * left > 64 ? 2 * left : 64;
}
static size_t recv_bytes(const post *p, int n);
/* Every part of a call of `c` posted: they finish together, `bytes` after
 * the latest start. Where the driver can (scope_mock_part_join_kept),
 * the handles stay here, with what each part writes (`recvs[i]`,
 * `written[i]` bytes), so that an abort can still end the call while it
 * has not finished, and scribble what it was writing. */
static void join_parts(clique *c, void **parts, void **recvs, const size_t *written, int n, size_t bytes) {
  void *known[MAX_RANKS];
  kept_part writes[MAX_RANKS];
  int k = 0;
  for (int i = 0; i < n; i++)
    if (parts[i]) {
      writes[k] = (kept_part){parts[i], recvs[i], written[i], recvs[i] ? device_range(recvs[i], written[i]) : 0};
      known[k++] = parts[i];
    }
  if (!k) return;
  typedef void (*join_hook)(void **, int, unsigned long long);
  join_hook kept = (join_hook)driver_hook("scope_mock_part_join_kept");
  join_hook f = (join_hook)driver_hook("scope_mock_part_join");
  if (!kept) {
    if (f) f(known, k, cost(bytes));
    return;
  }
  kept(known, k, cost(bytes));
  forget_settled(c);
  if (c->nkept + (size_t)k > c->capkept) {
    c->capkept = c->capkept ? 2 * c->capkept + (size_t)k : 64;
    c->kept = realloc(c->kept, c->capkept * sizeof *c->kept);
  }
  for (int i = 0; i < k; i++) c->kept[c->nkept++] = writes[i];
}

/* What NCCL's kernel leaves when an abort kills it is partial data. Over
 * what an unfinished part was to write the mock leaves this pattern,
 * which no test's correct run produces: a read that the failure model
 * should have failed shows wrong bytes, never a right sum by luck (the
 * last replay's, or one the mock moved before the part's finish). Only
 * where the bytes are still in the allocation they were in when the part
 * was joined (`allocation`; 0: any live one, for a part not joined, whose
 * stream still holds its frees). */
#define SCRIBBLE 0xa5
static void scribble(void *recv, size_t bytes, int allocation) {
  int now = recv && bytes ? device_range(recv, bytes) : 0;
  if (now && (!allocation || now == allocation)) memset(recv, SCRIBBLE, bytes);
}
/* Hold operation `seq` of `stream` (the `n` bytes at `blob`, copied) until
 * the stream reaches it, when the driver calls `place(blob)` (1); 0 where
 * the stream holds nothing and it is placed now, or the driver cannot. */
typedef void (*place_hook)(const void *, void *, unsigned long long);
static int hold_behind(void *stream, unsigned long long seq, place_hook place, const void *blob, size_t n) {
  int (*f)(void *, unsigned long long, place_hook, const void *, size_t) =
      (int (*)(void *, unsigned long long, place_hook, const void *, size_t))driver_hook("scope_mock_hold_post");
  return f ? f(stream, seq, place, blob, n) : 0;
}
static void end_part(void **part) {
  void (*f)(void *) = (void (*)(void *))driver_hook("scope_mock_part_end");
  if (*part && f) f(*part);
  *part = NULL;
}

/* ----- shared mode: ranks in separate processes -----
 * scope_mock_nccl_shared_id(dir, &id) makes an id whose clique lives in a
 * file of `dir`, mapped by every process that joins it (the id carries
 * the file's path): ranks in separate processes, each with
 * its own mock driver, meet there as real NCCL's ranks meet over the
 * network. A post is placed when its stream reaches it: it copies its
 * send bytes into the clique's slot for the call, and stays an open part
 * of its stream; the last rank to post computes every rank's output
 * there; each process copies its rank's output into its own "device"
 * memory, closing the part, when its driver asks or its poller looks.
 * Nothing else of a rank's process is visible to its peers. */

#define SLOTS 8
#define SLOT_BYTES (64 * 1024)
typedef struct {
  unsigned long long seq;
  int used, nposted, done, mismatched, taken;
  post meta[MAX_RANKS]; /* pointers unused: each process maps the file elsewhere */
} shared_call;
typedef struct {
  int used, from, to, has_send, has_recv, done, taken;
  unsigned long long n;
  size_t send_bytes, recv_bytes;
} shared_transfer;
typedef struct shared_clique {
  pthread_mutex_t lock;
  int nranks, joined, aborted;
  int present[MAX_RANKS], devices[MAX_RANKS];
  shared_call calls[SLOTS];
  unsigned char bytes[SLOTS][MAX_RANKS][2][SLOT_BYTES];
  shared_transfer transfers[SLOTS];
  unsigned char transfer_bytes[SLOTS][SLOT_BYTES];
} shared_clique;

/* A shared post of this process, until its output is copied home: a
 * collective's (transfer 0), or a transfer's half (1 a send, 2 a receive,
 * of transfer `seq` from rank `from` to rank `to`). A peer's abort does
 * not end it: as NCCL's kernel, it waits for bytes that never come until
 * this process aborts its own communicator (`ended`), so no stream here
 * runs past a round a peer left unwritten before this rank learns of it. */
typedef struct local_post {
  shared_clique *sh;
  int slot, rank;
  unsigned long long seq, stream_seq;
  void *recv, *stream;
  size_t recv_bytes;
  struct local_post *next;
  int transfer, from, to;
  int ended;
} local_post;
static local_post *shared_posts;

/* The clique file `path`, mapped; NULL when it cannot be. */
static shared_clique *map_clique(const char *path, int create) {
  int fd = open(path, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  if (fd < 0) return NULL;
  if (create && ftruncate(fd, sizeof(shared_clique)) != 0) { close(fd); return NULL; }
  void *at = mmap(NULL, sizeof(shared_clique), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (at == MAP_FAILED) return NULL;
  shared_clique *sh = at;
  if (create) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&sh->lock, &a);
  }
  return sh;
}

/* Lock a clique's state. A peer process killed while it held the lock
 * leaves it to the next locker (a robust mutex), with whatever it had
 * changed: every change a part makes ends by marking it posted or done,
 * so a part cut short is one never posted, and its round stalls for its
 * peers, as NCCL's does when a peer dies. Without this, a kill at the
 * wrong instant would hang every other process of the clique. */
static void lock_shared(shared_clique *sh) {
  if (pthread_mutex_lock(&sh->lock) == EOWNERDEAD) pthread_mutex_consistent(&sh->lock);
}

/* For a test: die holding the shared clique of `id`, as a peer process
 * killed at the wrong instant would. */
void scope_mock_nccl_die_holding(const ncclUniqueId *id) {
  shared_clique *sh = map_clique(id->internal + 16, 0);
  if (sh) lock_shared(sh);
  raise(SIGKILL);
}

/* For a test: lock and unlock the shared clique of `id`; 0 when there is
 * none. A lock a dead process left held never returns without
 * `lock_shared`'s robust mutex. */
int scope_mock_nccl_shared_usable(const ncclUniqueId *id) {
  shared_clique *sh = map_clique(id->internal + 16, 0);
  if (!sh) return 0;
  lock_shared(sh);
  pthread_mutex_unlock(&sh->lock);
  munmap(sh, sizeof *sh);
  return 1;
}

/* Whether this process's shared post `p` still waits for its peers; once
 * done, its output is copied home and the post forgotten (returns 0). */
static int shared_transfer_pending(local_post *p) {
  shared_clique *sh = p->sh;
  lock_shared(sh);
  shared_transfer *t = p->slot < 0 ? NULL : &sh->transfers[p->slot];
  int pending = 0;
  if (p->ended) {
    /* ended by this rank's abort, nothing written */
  } else if (p->slot < 0) {
    /* placed after a peer's abort: waits for this rank's own */
    pending = 1;
  } else if (t->used && t->from == p->from && t->to == p->to && t->n == p->seq && t->done) {
    if (p->transfer == 2) memcpy(p->recv, sh->transfer_bytes[p->slot], p->recv_bytes);
    if (++t->taken == 2) t->used = 0;
  } else {
    pending = 1;
  }
  pthread_mutex_unlock(&sh->lock);
  return pending;
}

static int shared_pending(local_post *p) {
  if (p->transfer) return shared_transfer_pending(p);
  shared_clique *sh = p->sh;
  lock_shared(sh);
  shared_call *k = p->slot < 0 ? NULL : &sh->calls[p->slot];
  int pending = 0;
  if (p->ended) {
    /* ended by this rank's abort, nothing written */
  } else if (p->slot < 0) {
    /* placed after a peer's abort: waits for this rank's own */
    pending = 1;
  } else if (k->used && k->seq == p->seq && k->done) {
    memcpy(p->recv, sh->bytes[p->slot][p->rank][1], p->recv_bytes);
    if (++k->taken == sh->nranks) k->used = 0;
  } else {
    pending = 1;
  }
  pthread_mutex_unlock(&sh->lock);
  return pending;
}

/* Whether a shared post on `stream` up to `upto` is pending; every post
 * found done on the way (NULL: every post) comes home and closes. */
static int shared_pending_on(void *stream, unsigned long long upto) {
  int pending = 0;
  for (local_post **at = &shared_posts; *at;) {
    local_post *p = *at;
    if (!stream || (p->stream == stream && p->stream_seq <= upto)) {
      if (shared_pending(p)) {
        pending = stream != NULL;
      } else {
        *at = p->next;
        part_closed(p->stream, p->stream_seq);
        free(p);
        continue;
      }
    }
    at = &p->next;
  }
  return pending;
}

/* ----- collectives on streams -----
 * A posted call is work on its stream that finishes only when every rank
 * posted (or the communicator is aborted): the driver asks here before it
 * reports the stream's work done (a query answers "not ready"; a host wait
 * waits). A host wait behind a call whose peers never post would never
 * return on a GPU: here it gives up after 30 s and counts a violation. */

static int pending_locked(void *stream, unsigned long long upto) {
  if (shared_pending_on(stream, upto)) return 1;
  for (clique *c = cliques; c; c = c->next) {
    if (c->aborted) continue;
    for (call *k = c->calls; k; k = k->next)
      for (int r = 0; r < c->nranks; r++)
        if (k->posts[r].posted && k->posts[r].stream == stream && k->posts[r].seq <= upto) return 1;
    for (transfer *t = c->transfers; t; t = t->next)
      if ((t->has_send && t->send_stream == stream && t->send_seq <= upto) ||
          (t->has_recv && t->recv_stream == stream && t->recv_seq <= upto))
        return 1;
  }
  return 0;
}

int scope_mock_nccl_pending(void *stream, unsigned long long upto) {
  LOCKED;
  return pending_locked(stream, upto);
}

void scope_mock_nccl_wait(void *stream, unsigned long long upto) {
  LOCKED;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 30;
  while (pending_locked(stream, upto)) {
    /* A peer in another process signals nothing here: look again every
     * millisecond. */
    struct timespec soon;
    clock_gettime(CLOCK_REALTIME, &soon);
    soon.tv_nsec += 1000000;
    if (soon.tv_nsec >= 1000000000) { soon.tv_sec++; soon.tv_nsec -= 1000000000; }
    pthread_cond_timedwait(&changed, &lock, &soon);
    if (soon.tv_sec > until.tv_sec || (soon.tv_sec == until.tv_sec && soon.tv_nsec >= until.tv_nsec)) {
      refuse(INTERNAL, "a host wait on a stream behind a collective whose peers never posted: on a GPU it "
             "would not return (wait for a collective with a deadline, and abort)");
      return;
    }
  }
}

/* Tell the driver where to ask, once a communicator exists. */
static void register_with_driver(void) {
  void (*f)(int (*)(void *, unsigned long long), void (*)(void *, unsigned long long)) =
      (void (*)(int (*)(void *, unsigned long long), void (*)(void *, unsigned long long)))driver_hook(
          "scope_mock_register_collectives");
  if (f) f(scope_mock_nccl_pending, scope_mock_nccl_wait);
}

int ncclGetVersion(int *version) {
  if (!version) return INVALID_ARGUMENT;
  *version = VERSION;
  return SUCCESS;
}

const char *ncclGetErrorString(int result) {
  switch (result) {
    case SUCCESS: return "no error";
    case UNHANDLED_CUDA: return "unhandled cuda error";
    case SYSTEM: return "unhandled system error";
    case INTERNAL: return "internal error";
    case INVALID_ARGUMENT: return "invalid argument";
    case INVALID_USAGE: return "invalid usage";
    case REMOTE: return "remote process exited or there was a network error";
    case IN_PROGRESS: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char *ncclGetLastError(comm *c) { (void)c; return last_violation; }

int ncclGetUniqueId(ncclUniqueId *id) {
  LOCKED;
  if (!id) return refuse(INVALID_ARGUMENT, "ncclGetUniqueId with a null id");
  memset(id, 0, sizeof *id);
  memcpy(id->internal, ID_MAGIC, 8);
  unsigned long long n = next_id++;
  memcpy(id->internal + 8, &n, sizeof n);
  made_here = n;
  return SUCCESS;
}

/* Shared mode: an id (as ncclGetUniqueId's) naming a new clique in a file
 * of `dir`, which ranks in other processes join. Only ids made here are
 * shared, so the process's other communicators stay in memory. */
int scope_mock_nccl_shared_id(const char *dir, ncclUniqueId *id) {
  int made = ncclGetUniqueId(id);
  if (made != SUCCESS) return made;
  LOCKED;
  unsigned long long n;
  memcpy(&n, id->internal + 8, sizeof n);
  snprintf(id->internal + 16, sizeof id->internal - 16, "%s/clique-%d-%llu", dir, (int)getpid(), n);
  shared_clique *sh = map_clique(id->internal + 16, 1);
  if (!sh) return refuse(SYSTEM, "scope_mock_nccl_shared_id: cannot make the shared clique %s", id->internal + 16);
  munmap(sh, sizeof *sh);
  /* Its one split (ncclCommSplit), made now so no rank maps it half made. */
  char split[160];
  snprintf(split, sizeof split, "%s.split", id->internal + 16);
  sh = map_clique(split, 1);
  if (!sh) return refuse(SYSTEM, "scope_mock_nccl_shared_id: cannot make the shared clique %s", split);
  munmap(sh, sizeof *sh);
  return SUCCESS;
}

/* The in-process clique `key` names, made (of `nranks`) by its first
 * member. The lock is held. */
static clique *clique_of(unsigned long long key, int nranks) {
  clique *c = cliques;
  while (c && c->id != key) c = c->next;
  if (!c) {
    c = calloc(1, sizeof *c);
    c->id = key;
    c->root = key;
    c->nranks = nranks;
    c->next = cliques;
    cliques = c;
  }
  return c;
}

/* The clique of the `nth` shrink of clique `parent`, under an id of its
 * own: ids from ncclGetUniqueId count up from 1, these down from the top,
 * so no chain of shrinks reaches another clique's id. */
static clique *shrunk_clique_of(const clique *parent, unsigned long long nth, int nranks) {
  static unsigned long long last = 0;
  clique *c = cliques;
  while (c && !(c->nth && c->parent == parent->id && c->nth == nth)) c = c->next;
  if (!c) {
    c = clique_of(~last++, nranks);
    c->parent = parent->id;
    c->root = parent->root;
    c->nth = nth;
  }
  return c;
}

int ncclCommInitRankConfig(comm **out, int nranks, ncclUniqueId id, int rank, config_head *config) {
  LOCKED;
  if (!out) return refuse(INVALID_ARGUMENT, "ncclCommInitRankConfig with a null communicator pointer");
  if (config && config->magic != API_MAGIC)
    return refuse(INVALID_ARGUMENT, "ncclCommInitRankConfig: the config was not made from NCCL_CONFIG_INITIALIZER "
                  "(magic %#x)", config->magic);
  if (memcmp(id.internal, ID_MAGIC, 8) != 0)
    return refuse(INVALID_ARGUMENT, "ncclCommInitRankConfig: a unique id not made by ncclGetUniqueId");
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
    return refuse(INVALID_ARGUMENT, "ncclCommInitRankConfig: rank %d of %d", rank, nranks);
  int device = current_device();
  if (device < 0) return refuse(INVALID_USAGE, "ncclCommInitRankConfig with no current CUDA context on the thread");
  register_with_driver();
  if (id.internal[16]) {
    /* Shared mode: the clique is the file the id names. */
    shared_clique *sh = map_clique(id.internal + 16, 0);
    if (!sh) return refuse(INVALID_ARGUMENT, "ncclCommInitRankConfig: no shared clique at %s", id.internal + 16);
    lock_shared(sh);
    if (!sh->nranks) sh->nranks = nranks;
    int bad = sh->nranks != nranks ? 1 : sh->present[rank] ? 2 : 0;
    for (int r = 0; r < sh->nranks && !bad; r++)
      if (sh->present[r] && sh->devices[r] == device) bad = 3;
    if (!bad) {
      sh->present[rank] = 1;
      sh->devices[rank] = device;
      sh->joined++;
    }
    int joined = sh->joined;
    pthread_mutex_unlock(&sh->lock);
    if (bad == 1) return refuse(INVALID_ARGUMENT, "ncclCommInitRankConfig: %d ranks where a peer said otherwise", nranks);
    if (bad == 2) return refuse(INVALID_USAGE, "ncclCommInitRankConfig: rank %d joined twice", rank);
    if (bad == 3) return refuse(INVALID_USAGE, "Duplicate GPU detected: two ranks on device %d", device);
    comm *m = calloc(1, sizeof *m);
    m->sh = sh;
    m->rank = rank;
    snprintf(m->path, sizeof m->path, "%s", id.internal + 16);
    *out = m;
    if (config && config->blocking == 0) return joined == nranks ? SUCCESS : IN_PROGRESS;
    return refuse(INVALID_USAGE, "ncclCommInitRankConfig: the mock's shared mode takes non-blocking communicators");
  }
  unsigned long long key;
  memcpy(&key, id.internal + 8, sizeof key);
  clique *c = clique_of(key, nranks);
  if (c->nranks != nranks)
    return refuse(INVALID_ARGUMENT, "ncclCommInitRankConfig: %d ranks where a peer said %d", nranks, c->nranks);
  if (c->present[rank]) return refuse(INVALID_USAGE, "ncclCommInitRankConfig: rank %d joined twice", rank);
  for (int r = 0; r < nranks; r++)
    if (c->present[r] && c->devices[r] == device)
      return refuse(INVALID_USAGE, "Duplicate GPU detected: ranks %d and %d both on device %d", r, rank, device);
  c->present[rank] = 1;
  c->devices[rank] = device;
  c->joined++;
  pthread_cond_broadcast(&changed);
  comm *m = calloc(1, sizeof *m);
  m->c = c;
  m->rank = rank;
  *out = m;
  int blocking = !config || config->blocking != 0;
  if (!blocking) return c->joined == c->nranks ? SUCCESS : IN_PROGRESS;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 30;
  while (c->joined < c->nranks && !c->aborted)
    if (pthread_cond_timedwait(&changed, &lock, &until) != 0)
      return refuse(INTERNAL, "ncclCommInitRank: rank %d waited 30 s for its peers", rank);
  return c->aborted ? REMOTE : SUCCESS;
}

/* How many ranks shrank a communicator of the line of cliques `root`
 * began (ncclCommShrink), for tests that tell the library's shrink from a
 * fresh join. Per line, not per process: tests that shrink groups of their
 * own at the same time add nothing to it. */
unsigned long long scope_mock_nccl_shrinks_from(unsigned long long root) {
  LOCKED;
  unsigned long long n = 0;
  for (clique *c = cliques; c; c = c->next)
    if (c->root == root) n += c->shrinks;
  return n;
}

/* The id ncclGetUniqueId last made on the calling thread (0: none): the
 * root of the group a test just made there. */
unsigned long long scope_mock_nccl_last_id_made_here(void) {
  return made_here;
}

static int usable(comm *m, const char *call);

/* NCCL 2.27's shrink, in-process communicators only: the survivors of the
 * parent's clique, renumbered in order, form a new clique every survivor
 * names the same way (the parent's id, and how many shrinks of it this
 * rank made). A real NCCL refuses what this refuses. */
#define SHRINK_ABORT 0x01
int ncclCommShrink(comm *m, int *exclude, int nexclude, comm **out, config_head *config, int flags) {
  LOCKED;
  int bad = usable(m, "ncclCommShrink");
  if (bad) return bad;
  if (!out) return refuse(INVALID_ARGUMENT, "ncclCommShrink with a null communicator pointer");
  if (m->sh) return refuse(INVALID_USAGE, "ncclCommShrink: the mock shrinks communicators of one process only");
  if (config && config->magic != API_MAGIC)
    return refuse(INVALID_ARGUMENT, "ncclCommShrink: the config was not made from NCCL_CONFIG_INITIALIZER");
  if (flags & ~SHRINK_ABORT) return refuse(INVALID_ARGUMENT, "ncclCommShrink: unknown flags %#x", flags);
  clique *parent = m->c;
  if (parent->aborted && !(flags & SHRINK_ABORT))
    return refuse(INVALID_USAGE, "ncclCommShrink of a communicator a peer aborted, without NCCL_SHRINK_ABORT");
  if (nexclude < 0 || nexclude >= parent->nranks || (nexclude && !exclude))
    return refuse(INVALID_ARGUMENT, "ncclCommShrink excluding %d of %d ranks", nexclude, parent->nranks);
  int below = 0;
  for (int i = 0; i < nexclude; i++) {
    if (exclude[i] < 0 || exclude[i] >= parent->nranks || (i && exclude[i] <= exclude[i - 1]))
      return refuse(INVALID_ARGUMENT, "ncclCommShrink: excluded ranks out of range or not ascending");
    if (exclude[i] == m->rank) return refuse(INVALID_USAGE, "ncclCommShrink called by excluded rank %d", m->rank);
    if (exclude[i] < m->rank) below++;
  }
  int nranks = parent->nranks - nexclude, rank = m->rank - below;
  clique *c = shrunk_clique_of(parent, (unsigned long long)(++m->shrunk), nranks);
  if (c->nranks != nranks)
    return refuse(INVALID_ARGUMENT, "ncclCommShrink: %d survivors where a peer said %d", nranks, c->nranks);
  if (c->present[rank]) return refuse(INVALID_USAGE, "ncclCommShrink: survivor %d shrank twice", rank);
  c->present[rank] = 1;
  c->devices[rank] = parent->devices[m->rank];
  c->joined++;
  c->shrinks++;
  pthread_cond_broadcast(&changed);
  comm *n = calloc(1, sizeof *n);
  n->c = c;
  n->rank = rank;
  *out = n;
  if (!config || config->blocking == 0) return c->joined == c->nranks ? SUCCESS : IN_PROGRESS;
  return refuse(INVALID_USAGE, "ncclCommShrink: the mock shrinks to non-blocking communicators");
}

/* NCCL 2.18's split, as scope uses it: every rank's color 0 and its key
 * its rank, so the new clique holds every rank, numbered as before, under
 * an id its members name alike (the parent's, and which split of it). In
 * shared mode the clique is the file made beside the parent's, one split
 * per communicator. A real NCCL refuses what this refuses but the colors
 * and keys, which it takes, and this mock does not model. */
int ncclCommSplit(comm *m, int color, int key, comm **out, config_head *config) {
  LOCKED;
  int bad = usable(m, "ncclCommSplit");
  if (bad) return bad;
  if (!out) return refuse(INVALID_ARGUMENT, "ncclCommSplit with a null communicator pointer");
  if (config && config->magic != API_MAGIC)
    return refuse(INVALID_ARGUMENT, "ncclCommSplit: the config was not made from NCCL_CONFIG_INITIALIZER");
  if (color != 0 || key != m->rank)
    return refuse(INVALID_ARGUMENT, "ncclCommSplit: color %d, key %d on rank %d (the mock splits into one "
                  "communicator of every rank, numbered as before)", color, key, m->rank);
  if (config && config->blocking != 0)
    return refuse(INVALID_USAGE, "ncclCommSplit: the mock splits to non-blocking communicators");
  comm *n = calloc(1, sizeof *n);
  n->rank = m->rank;
  if (m->sh) {
    if (m->split++) { free(n); return refuse(INVALID_USAGE, "ncclCommSplit: the mock's shared mode splits once"); }
    snprintf(n->path, sizeof n->path, "%.*s.split", (int)sizeof n->path - 7, m->path);
    shared_clique *sh = map_clique(n->path, 0);
    if (!sh) {
      free(n);
      return refuse(INVALID_ARGUMENT, "ncclCommSplit: no shared clique beside %s", m->path);
    }
    lock_shared(sh);
    if (!sh->nranks) sh->nranks = m->sh->nranks;
    int twice = sh->present[m->rank];
    if (!twice) {
      sh->present[m->rank] = 1;
      sh->devices[m->rank] = m->sh->devices[m->rank];
      sh->joined++;
    }
    int joined = sh->joined, nranks = sh->nranks;
    pthread_mutex_unlock(&sh->lock);
    if (twice) { free(n); return refuse(INVALID_USAGE, "ncclCommSplit: rank %d split twice", m->rank); }
    n->sh = sh;
    *out = n;
    return joined == nranks ? SUCCESS : IN_PROGRESS;
  }
  clique *parent = m->c;
  /* Splits count from the top bit down, apart from the parent's shrinks. */
  clique *c = shrunk_clique_of(parent, (1ULL << 63) | ++m->split, parent->nranks);
  if (c->present[m->rank]) { free(n); return refuse(INVALID_USAGE, "ncclCommSplit: rank %d split twice", m->rank); }
  c->present[m->rank] = 1;
  c->devices[m->rank] = parent->devices[m->rank];
  c->joined++;
  pthread_cond_broadcast(&changed);
  n->c = c;
  *out = n;
  return c->joined == c->nranks ? SUCCESS : IN_PROGRESS;
}

static int usable(comm *m, const char *call) {
  if (!m) return refuse(INVALID_ARGUMENT, "%s with a null communicator", call);
  if (m->aborted) return refuse(INVALID_ARGUMENT, "%s on an aborted communicator (freed by ncclCommAbort)", call);
  if (m->destroyed) return refuse(INVALID_ARGUMENT, "%s on a destroyed communicator", call);
  return SUCCESS;
}

int ncclCommGetAsyncError(comm *m, int *error) {
  LOCKED;
  int bad = usable(m, "ncclCommGetAsyncError");
  if (bad) return bad;
  if (m->sh) {
    lock_shared(m->sh);
    *error = m->sh->aborted ? REMOTE : m->sh->joined < m->sh->nranks ? IN_PROGRESS : SUCCESS;
    pthread_mutex_unlock(&m->sh->lock);
    return SUCCESS;
  }
  *error = m->c->aborted ? REMOTE : m->c->joined < m->c->nranks ? IN_PROGRESS : SUCCESS;
  return SUCCESS;
}

int ncclCommCount(comm *m, int *count) {
  LOCKED;
  int bad = usable(m, "ncclCommCount");
  if (bad) return bad;
  *count = m->sh ? m->sh->nranks : m->c->nranks;
  return SUCCESS;
}

int ncclCommAbort(comm *m) {
  LOCKED;
  int bad = usable(m, "ncclCommAbort");
  if (bad) return bad;
  m->aborted = 1;
  now_last(m, NULL, 0, NULL);
  if (m->sh) {
    lock_shared(m->sh);
    m->sh->aborted = 1;
    pthread_mutex_unlock(&m->sh->lock);
    for (local_post *p = shared_posts; p; p = p->next)
      if (p->sh == m->sh && p->rank == m->rank) {
        p->ended = 1;
        part_closed(p->stream, p->stream_seq);
      }
  } else {
    m->c->aborted = 1;
    /* Timed mode: what waited for peers ends now (under this lock, so a
     * driver that finds nothing pending finds the parts ended). */
    for (call *k = m->c->calls; k; k = k->next)
      for (int r = 0; r < m->c->nranks; r++) {
        post *q = &k->posts[r];
        if (q->posted) scribble(q->recv, recv_bytes(q, m->c->nranks), 0);
        end_part(&q->part);
        if (q->posted) part_closed(q->stream, q->seq);
      }
    for (transfer *t = m->c->transfers; t; t = t->next) {
      if (t->has_recv) scribble(t->recv, t->recv_bytes, 0);
      end_part(&t->send_part);
      end_part(&t->recv_part);
      if (t->has_send) part_closed(t->send_stream, t->send_seq);
      if (t->has_recv) part_closed(t->recv_stream, t->recv_seq);
    }
    /* And what was joined but has not finished: every rank's kernel of
     * the communicator returns (a rank still busy before its part ends
     * it once that work is done: the driver's model). */
    int (*settled)(void *) = (int (*)(void *))driver_hook("scope_mock_part_settled");
    for (size_t i = 0; i < m->c->nkept; i++) {
      kept_part *x = &m->c->kept[i];
      if (settled && !settled(x->part)) scribble(x->recv, x->bytes, x->allocation);
      end_part(&x->part);
    }
    m->c->nkept = 0;
  }
  pthread_cond_broadcast(&changed);
  return SUCCESS;
}

int ncclCommDestroy(comm *m) {
  LOCKED;
  int bad = usable(m, "ncclCommDestroy");
  if (bad) return bad;
  /* An init still in progress, its clique neither complete nor aborted:
   * NCCL's destroy waits for that init, for peers that may never come. A
   * caller whose join did not settle aborts. */
  int joined, nranks, aborted;
  if (m->sh) {
    lock_shared(m->sh);
    joined = m->sh->joined, nranks = m->sh->nranks, aborted = m->sh->aborted;
    pthread_mutex_unlock(&m->sh->lock);
  } else {
    joined = m->c->joined, nranks = m->c->nranks, aborted = m->c->aborted;
  }
  if (joined < nranks && !aborted)
    return refuse(INVALID_USAGE, "ncclCommDestroy of rank %d while its init is in progress (%d of %d ranks "
                  "joined): NCCL waits there for the missing peers; ncclCommAbort ends an init", m->rank,
                  joined, nranks);
  m->destroyed = 1;
  now_last(m, NULL, 0, NULL);
  return SUCCESS;
}

/* ----- the collectives ----- */

static size_t send_bytes(const post *p, int n) {
  size_t bytes = p->count * element_size(p->dtype);
  switch (p->kind) {
    case ALL_REDUCE: case ALL_GATHER: case BROADCAST: return bytes;
    default: return bytes * (size_t)n; /* reduce-scatter, all-to-all */
  }
}
static size_t recv_bytes(const post *p, int n) {
  size_t bytes = p->count * element_size(p->dtype);
  switch (p->kind) {
    case ALL_REDUCE: case REDUCE_SCATTER: case BROADCAST: return bytes;
    default: return bytes * (size_t)n; /* all-gather, all-to-all */
  }
}

/* The 16-bit floats, by hand: the harnesses link no libm, and C11 has no
 * such types. NCCL reduces them in float, rounding to 16 bits at every
 * step, so these are the only arithmetic the mock needs. */
static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (e == 0x1f) {
    bits = sign | 0x7f800000 | man << 13; /* infinity, or NaN with its payload */
  } else if (e) {
    bits = sign | (e + 127 - 15) << 23 | man << 13;
  } else {
    /* Zero or subnormal: man units of 2^-24, exact in float. */
    float f = (float)man * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
/* Rounded to the nearest binary16, ties to even: what __float2half does. */
static uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t a = x & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff); /* NaN, made quiet */
  if (a >= 0x47800000) return sign | 0x7c00; /* 2^16 and up, and infinity */
  if (a >= 0x38800000) {
    /* A normal half (2^-14 and up): rebias the exponent and round off 13
     * bits; a carry out of the mantissa steps the exponent, and from 65520
     * up to infinity (0x7c00), as it should. */
    uint32_t m = a - ((uint32_t)(127 - 15) << 23);
    m += 0xfff + ((m >> 13) & 1);
    return sign | (uint16_t)(m >> 13);
  }
  /* A subnormal half: units of 2^-24. Below 2^-25 (and at it, a tie to
   * even zero) rounds to zero; a carry to 0x400 is the least normal. */
  int e = (int)(a >> 23);
  if (e < 102) return sign;
  uint32_t m = (a & 0x7fffff) | 0x800000;
  int shift = 126 - e; /* 14 to 24 */
  uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1))) q++;
  return sign | (uint16_t)q;
}
static float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
/* Rounded to the nearest bfloat16, ties to even: what __float2bfloat16
 * does. A carry rounds the largest floats up to infinity, as it should. */
static uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* NaN, made quiet */
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}
/* fmaxf's and fminf's choice of v over a, without libm: the number wins
 * over a NaN. */
static inline int takes_max(float a, float v) { return v > a || a != a; }
static inline int takes_min(float a, float v) { return v < a || a != a; }

/* Fold element `from + i` of every rank's send buffer, in rank order,
 * into acc's element i, i < count: the operation chosen once, outside the
 * loop, so the mock's own host work for a call stays small beside the time
 * the call models. memcpy, as a buffer's elements need not be aligned. */
#define FOLD(T, COMBINE)                                                      \
  for (int r = 1; r < n; r++) {                                               \
    const char *src = (const char *)k->posts[r].send + from * sizeof(T);      \
    for (size_t i = 0; i < count; i++) {                                      \
      T a, v;                                                                 \
      memcpy(&a, acc + i * sizeof(T), sizeof(T));                             \
      memcpy(&v, src + i * sizeof(T), sizeof(T));                             \
      a = COMBINE;                                                            \
      memcpy(acc + i * sizeof(T), &a, sizeof(T));                             \
    }                                                                         \
  }
/* Avg's last step: every element of the sum, divided by the ranks. */
#define DIVIDE(T, QUOTIENT)                                                   \
  if (p0->op == AVG)                                                          \
    for (size_t i = 0; i < count; i++) {                                      \
      T a;                                                                    \
      memcpy(&a, acc + i * sizeof(T), sizeof(T));                             \
      a = QUOTIENT;                                                           \
      memcpy(acc + i * sizeof(T), &a, sizeof(T));                             \
    }
/* Integers of type T: sums and products wrap (in U, the unsigned type of
 * T's width), Min and Max compare as T, and Avg divides the wrapped sum
 * as T does, truncating. */
#define REDUCE_INT(T, U)                                                      \
  {                                                                           \
    switch (p0->op) {                                                         \
      case SUM: case AVG: FOLD(U, (U)(a + v)) break;                          \
      case PROD: FOLD(U, (U)(a * v)) break;                                   \
      case MAX: FOLD(T, v > a ? v : a) break;                                 \
      case MIN: FOLD(T, v < a ? v : a) break;                                 \
    }                                                                         \
    DIVIDE(T, (T)(a / n))                                                     \
  }
/* float and double, in their own arithmetic. */
#define REDUCE_FLOAT(T)                                                       \
  {                                                                           \
    switch (p0->op) {                                                         \
      case SUM: case AVG: FOLD(T, a + v) break;                               \
      case PROD: FOLD(T, a * v) break;                                        \
      case MAX: FOLD(T, v > a || a != a ? v : a) break;                       \
      case MIN: FOLD(T, v < a || a != a ? v : a) break;                       \
    }                                                                         \
    DIVIDE(T, a / (T)n)                                                       \
  }
/* float16 and bfloat16: combined in float, rounded back at every step.
 * A minimum or maximum is one of its operands, so it keeps its bits. */
#define REDUCE_16(WIDEN, NARROW)                                              \
  {                                                                           \
    switch (p0->op) {                                                         \
      case SUM: case AVG: FOLD(uint16_t, NARROW(WIDEN(a) + WIDEN(v))) break;  \
      case PROD: FOLD(uint16_t, NARROW(WIDEN(a) * WIDEN(v))) break;           \
      case MAX: FOLD(uint16_t, takes_max(WIDEN(a), WIDEN(v)) ? v : a) break;  \
      case MIN: FOLD(uint16_t, takes_min(WIDEN(a), WIDEN(v)) ? v : a) break;  \
    }                                                                         \
    DIVIDE(uint16_t, NARROW(WIDEN(a) / (float)n))                             \
  }
static void reduce(char *acc, const call *k, int n, size_t from, size_t count) {
  const post *p0 = &k->posts[0];
  size_t size = element_size(p0->dtype);
  memcpy(acc, (const char *)p0->send + from * size, count * size);
  switch (p0->dtype) {
    case INT8: REDUCE_INT(int8_t, uint8_t) break;
    case UINT8: REDUCE_INT(uint8_t, uint8_t) break;
    case INT32: REDUCE_INT(int32_t, uint32_t) break;
    case UINT32: REDUCE_INT(uint32_t, uint32_t) break;
    case INT64: REDUCE_INT(int64_t, uint64_t) break;
    case UINT64: REDUCE_INT(uint64_t, uint64_t) break;
    case FLOAT16: REDUCE_16(half_to_float, float_to_half) break;
    case FLOAT32: REDUCE_FLOAT(float) break;
    case FLOAT64: REDUCE_FLOAT(double) break;
    case BFLOAT16: REDUCE_16(bf16_to_float, float_to_bf16) break;
  }
}
#undef REDUCE_16
#undef REDUCE_FLOAT
#undef REDUCE_INT
#undef DIVIDE
#undef FOLD

/* Every rank posted: compute every output, then write them (a send buffer
 * may be its rank's receive buffer). */
static void run(call *k, int n) {
  const post *p0 = &k->posts[0];
  char *out[MAX_RANKS];
  for (int r = 0; r < n; r++) out[r] = malloc(recv_bytes(&k->posts[r], n) + 1);
  size_t count = p0->count, part = count * element_size(p0->dtype);
  switch (p0->kind) {
    case ALL_REDUCE:
      reduce(out[0], k, n, 0, count);
      for (int r = 1; r < n; r++) memcpy(out[r], out[0], part);
      break;
    case REDUCE_SCATTER:
      for (int r = 0; r < n; r++) reduce(out[r], k, n, (size_t)r * count, count);
      break;
    case ALL_GATHER:
      for (int r = 0; r < n; r++)
        for (int from = 0; from < n; from++) memcpy(out[r] + (size_t)from * part, k->posts[from].send, part);
      break;
    case BROADCAST:
      for (int r = 0; r < n; r++) memcpy(out[r], k->posts[p0->root].send, part);
      break;
    case ALL_TO_ALL:
      for (int to = 0; to < n; to++)
        for (int from = 0; from < n; from++)
          memcpy(out[to] + (size_t)from * part, (const char *)k->posts[from].send + (size_t)to * part, part);
      break;
  }
  for (int r = 0; r < n; r++) {
    memmove(k->posts[r].recv, out[r], recv_bytes(&k->posts[r], n));
    free(out[r]);
  }
}

/* A shared post, numbered when issued and placed when its stream reaches
 * it, as NCCL's kernel reads its input only when it runs: a call
 * (`transfer` 0, `seq` its number) or a transfer's half (1 a send, 2 a
 * receive; `seq` its number between the two ranks). */
typedef struct {
  comm *m;
  int transfer, peer;
  unsigned long long seq;
  post p;
  size_t bytes;
} shared_issue;
static int place_shared(const shared_issue *h);

static void place_shared_held(const void *blob, void *stream, unsigned long long stream_seq) {
  LOCKED;
  (void)stream;
  (void)stream_seq;
  place_shared(blob);
}

/* Hold `h` behind its stream's work (1), or 0 where nothing is held. */
static int hold_shared(const shared_issue *h) {
  return hold_behind(h->p.stream, h->p.seq, place_shared_held, h, sizeof *h);
}

static int shared_pending_on(void *stream, unsigned long long upto);

/* A device finishes its work unasked: this thread looks at the shared
 * posts every 200 µs, so a post done by its peers closes its part (and
 * its stream's later work runs) whether or not the host asks. */
static void *poll_shared(void *unused) {
  (void)unused;
  for (;;) {
    struct timespec pause = {0, 200000};
    nanosleep(&pause, NULL);
    LOCKED;
    shared_pending_on(NULL, 0);
  }
  return NULL;
}

/* Remember this process's placed post `mine` until its bytes come home:
 * an open part of its stream, whose later work waits for it. */
static void remember_shared(local_post mine) {
  static int polling;
  if (!polling) {
    pthread_t poller;
    polling = pthread_create(&poller, NULL, poll_shared, NULL) == 0;
    if (polling) pthread_detach(poller);
  }
  local_post *at = calloc(1, sizeof *at);
  *at = mine;
  at->next = shared_posts;
  shared_posts = at;
  part_opened(at->stream, at->stream_seq);
}

/* Place a call's post (the caller holds `lock`): its send bytes go into
 * the slot of its number; the last rank's runs the call. A peer's abort
 * leaves it waiting, as NCCL's kernel, until this rank aborts. */
static int place_shared_call(const shared_issue *h) {
  comm *m = h->m;
  shared_clique *sh = m->sh;
  const post *p = &h->p;
  if (m->aborted || m->destroyed) return REMOTE;
  const char *name = CALLS[p->kind];
  lock_shared(sh);
  int n = sh->nranks;
  size_t sb = send_bytes(p, n), rb = recv_bytes(p, n);
  int sends = p->kind != BROADCAST || m->rank == p->root;
  const char *why = NULL;
  int slot = -1;
  for (int i = 0; i < SLOTS && !sh->aborted; i++)
    if (sh->calls[i].used && sh->calls[i].seq == h->seq) slot = i;
  for (int i = 0; i < SLOTS && !sh->aborted && slot < 0; i++)
    if (!sh->calls[i].used) {
      slot = i;
      memset(&sh->calls[i], 0, sizeof sh->calls[i]);
      sh->calls[i].used = 1;
      sh->calls[i].seq = h->seq;
    }
  if (!sh->aborted && slot < 0) why = "every slot of the shared clique is taken";
  shared_call *k = slot < 0 ? NULL : &sh->calls[slot];
  for (int r = 0; k && r < n && !why; r++) {
    const post *q = &k->meta[r];
    if (q->posted && (q->kind != p->kind || q->count != p->count || q->dtype != p->dtype || q->op != p->op ||
                      q->root != p->root)) {
      k->mismatched = 1;
      why = "posted another call than a peer for the same sequence number";
    }
  }
  if (why) {
    pthread_mutex_unlock(&sh->lock);
    return refuse(INVALID_USAGE, "%s on rank %d (shared): %s", name, m->rank, why);
  }
  if (k) {
    if (sends) memcpy(sh->bytes[slot][m->rank][0], p->send, sb);
    k->meta[m->rank] = *p;
    k->nposted++;
    if (k->nposted == n && !k->mismatched) {
      call local;
      memset(&local, 0, sizeof local);
      for (int r = 0; r < n; r++) {
        local.posts[r] = k->meta[r];
        local.posts[r].send = sh->bytes[slot][r][0];
        local.posts[r].recv = sh->bytes[slot][r][1];
      }
      run(&local, n);
      k->done = 1;
    }
  }
  pthread_mutex_unlock(&sh->lock);
  /* Slot -1: a peer aborted first; it waits for this rank's abort. */
  remember_shared((local_post){sh, slot, m->rank, h->seq, p->seq, p->recv, p->stream, rb, NULL, 0, 0, 0, 0});
  return SUCCESS;
}

/* A type NCCL does not number (whose bytes the mock cannot count), or an
 * operation it does not know: a violation. */
static int refuse_type(const char *name, int dtype, int op) {
  if (!element_size(dtype)) return refuse(INVALID_ARGUMENT, "%s: data type %d", name, dtype);
  if (op < SUM || op > AVG) return refuse(INVALID_ARGUMENT, "%s: operation %d", name, op);
  return SUCCESS;
}

/* A post of a communicator in shared mode (the caller holds `lock`). */
static int post_shared(comm *m, int kind, const void *send, void *recv, size_t count, int dtype, int op, int root,
                       void *stream, unsigned long long stream_seq) {
  const char *name = CALLS[kind];
  shared_clique *sh = m->sh;
  int bad = refuse_type(name, dtype, op);
  if (bad) return bad;
  int capturing = stream_seq ? 0 : stream_capturing(stream);
  if (capturing < 0) return refuse(INVALID_USAGE, "%s on a stream that is not a live stream", name);
  post p = {1, kind, dtype, op, root, count, send, recv, stream, 0, NULL};
  if (capturing) {
    /* Recorded: its replays post it (NCCL captures a call as kernels). */
    int sends = kind != BROADCAST || m->rank == root;
    if ((sends && !device_range(send, send_bytes(&p, sh->nranks))) || !device_range(recv, recv_bytes(&p, sh->nranks)))
      return refuse(INVALID_ARGUMENT, "%s recorded on rank %d: a buffer is not inside one live device allocation",
                    name, m->rank);
    recorded r = {m, kind, dtype, op, root, count, send, recv};
    if (!record_call(stream, &r)) return refuse(INVALID_USAGE, "%s: the capture could not record it", name);
    return SUCCESS;
  }
  lock_shared(sh);
  int n = sh->nranks;
  size_t sb = send_bytes(&p, n), rb = recv_bytes(&p, n);
  int sends = kind != BROADCAST || m->rank == root;
  const char *why = NULL;
  if (sh->aborted) why = "";
  else if (sh->joined < n) why = "before every rank joined the communicator";
  else if (sb > SLOT_BYTES || rb > SLOT_BYTES) why = "more bytes than the mock's shared mode carries (64 KiB a rank)";
  else if ((sends && !device_range(send, sb)) || !device_range(recv, rb)) why = "a buffer is not inside one live device allocation";
  int aborted = sh->aborted;
  pthread_mutex_unlock(&sh->lock);
  if (why) {
    if (aborted) return REMOTE; /* a peer aborted: the communicator's error, not a misuse */
    return refuse(INVALID_USAGE, "%s on rank %d (shared): %s", name, m->rank, why);
  }
  if (!stream_seq) after_last(m, stream);
  p.seq = stream_seq ? stream_seq : stream_op(stream);
  now_last(m, stream, p.seq, NULL);
  shared_issue h = {m, 0, 0, m->next_seq++, p, 0};
  if (hold_shared(&h)) return SUCCESS; /* a replay's fills its slot */
  return place_shared_call(&h);
}

/* A post issued where its stream holds work: placed when it is reached. */
typedef struct { comm *m; unsigned long long call_seq; post p; } held_post;
static int place(comm *m, unsigned long long seq, post p);
static int hold_post(void *stream, const held_post *h);

/* Post a call on `stream`: now (stream_seq 0: a new operation of the
 * stream, or recorded if the stream captures), or as part of a graph's
 * replay, operation `stream_seq` of the stream. */
static int post_call(comm *m, int kind, const void *send, void *recv, size_t count, int dtype, int op, int root,
                     void *stream, unsigned long long stream_seq) {
  LOCKED;
  const char *name = CALLS[kind];
  int bad = usable(m, name);
  if (bad) return bad;
  if (m->sh) return post_shared(m, kind, send, recv, count, dtype, op, root, stream, stream_seq);
  clique *c = m->c;
  int n = c->nranks;
  /* A peer aborted: NCCL answers the communicator's error (not a misuse). */
  if (c->aborted) return REMOTE;
  if (c->joined < n) return refuse(INVALID_USAGE, "%s before every rank joined the communicator", name);
  bad = refuse_type(name, dtype, op);
  if (bad) return bad;
  if (kind == BROADCAST && (root < 0 || root >= n)) return refuse(INVALID_ARGUMENT, "%s: root %d of %d", name, root, n);
  int capturing = stream_seq ? 0 : stream_capturing(stream);
  if (capturing < 0) return refuse(INVALID_USAGE, "%s on a stream that is not a live stream", name);
  post p = {1, kind, dtype, op, root, count, send, recv, stream, 0, NULL};
  int sends = kind != BROADCAST || m->rank == root;
  if ((sends && !device_range(send, send_bytes(&p, n))) || !device_range(recv, recv_bytes(&p, n)))
    return refuse(INVALID_ARGUMENT, "%s on rank %d: a buffer is not inside one live device allocation", name,
                  m->rank);
  if (capturing) {
    /* Recorded: its replays post it (NCCL captures a call as kernels). */
    recorded r = {m, kind, dtype, op, root, count, send, recv};
    if (!record_call(stream, &r)) return refuse(INVALID_USAGE, "%s: the capture could not record it", name);
    return SUCCESS;
  }
  unsigned long long seq = m->next_seq++;
  if (stream_seq) {
    p.seq = stream_seq;
    p.part = replay_part(stream);
  } else {
    after_last(m, stream);
    p.seq = stream_part(stream, &p.part);
  }
  now_last(m, stream, p.seq, p.part);
  held_post h = {m, seq, p};
  if (hold_post(stream, &h)) return SUCCESS;
  return place(m, seq, p);
}

/* Place rank `m`'s post `p` of call number `seq` (the lock held): the
 * call runs, and every part of it closes, when its last part is placed.
 * A post placed after its communicator was aborted or destroyed ends
 * there, as NCCL's kernel returns after an abort. */
static int place(comm *m, unsigned long long seq, post p) {
  clique *c = m->c;
  int n = c->nranks;
  if (c->aborted || m->destroyed) {
    end_part(&p.part);
    return REMOTE;
  }
  call *k = c->calls;
  while (k && k->seq != seq) k = k->next;
  if (!k) {
    k = calloc(1, sizeof *k);
    k->seq = seq;
    k->next = c->calls;
    c->calls = k;
  }
  for (int r = 0; r < n; r++) {
    const post *q = &k->posts[r];
    if (q->posted && (q->kind != p.kind || q->count != p.count || q->dtype != p.dtype || q->op != p.op ||
                      q->root != p.root)) {
      k->mismatched = 1;
      end_part(&p.part);
      return refuse(INVALID_USAGE, "call #%llu: rank %d posted %s of %zu (type %d, op %d, root %d) where rank %d "
                    "posted %s of %zu (type %d, op %d, root %d)", seq, m->rank, CALLS[p.kind], p.count, p.dtype,
                    p.op, p.root, r, CALLS[q->kind], q->count, q->dtype, q->op, q->root);
    }
  }
  k->posts[m->rank] = p;
  k->nposted++;
  part_opened(p.stream, p.seq);
  if (k->nposted == n && !k->mismatched) {
    run(k, n);
    void *parts[MAX_RANKS];
    for (int r = 0; r < n; r++) parts[r] = k->posts[r].part;
    void *recvs[MAX_RANKS];
    size_t written[MAX_RANKS];
    for (int r = 0; r < n; r++) {
      recvs[r] = k->posts[r].recv;
      written[r] = recv_bytes(&k->posts[r], n);
    }
    join_parts(c, parts, recvs, written, n, p.count * element_size(p.dtype));
    for (call **at = &c->calls; *at; at = &(*at)->next)
      if (*at == k) { *at = k->next; break; }
    for (int r = 0; r < n; r++) part_closed(k->posts[r].stream, k->posts[r].seq);
    free(k);
    pthread_cond_broadcast(&changed);
  }
  return SUCCESS;
}

/* The driver's hook for a held post its stream reached. */
static void place_held(const void *blob, void *stream, unsigned long long stream_seq) {
  LOCKED;
  const held_post *h = blob;
  (void)stream;
  (void)stream_seq;
  place(h->m, h->call_seq, h->p);
}

static int hold_post(void *stream, const held_post *h) {
  return hold_behind(stream, h->p.seq, place_held, h, sizeof *h);
}

/* A graph holding a recorded call was replayed on `stream` as its
 * operation `seq`: the call is posted, as its kernel would start. A
 * refusal here (an aborted communicator, ranks whose replays disagree)
 * counts a violation like any other. */
static void replay_recorded(const void *blob, void *stream, unsigned long long seq) {
  const recorded *r = blob;
  post_call(r->m, r->kind, r->send, r->recv, r->count, r->dtype, r->op, r->root, stream, seq);
}

int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, comm *m, void *stream) {
  return post_call(m, ALL_REDUCE, send, recv, count, dtype, op, 0, stream, 0);
}
int ncclAllGather(const void *send, void *recv, size_t count, int dtype, comm *m, void *stream) {
  return post_call(m, ALL_GATHER, send, recv, count, dtype, SUM, 0, stream, 0);
}
int ncclReduceScatter(const void *send, void *recv, size_t count, int dtype, int op, comm *m, void *stream) {
  return post_call(m, REDUCE_SCATTER, send, recv, count, dtype, op, 0, stream, 0);
}
int ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root, comm *m, void *stream) {
  return post_call(m, BROADCAST, send, recv, count, dtype, SUM, root, stream, 0);
}
int ncclAlltoAll(const void *send, void *recv, size_t count, int dtype, comm *m, void *stream) {
  return post_call(m, ALL_TO_ALL, send, recv, count, dtype, SUM, 0, stream, 0);
}

/* ----- point-to-point ----- */

/* Place a transfer's half (the caller holds `lock`): a send copies its
 * bytes into the transfer's slot; a receive copies them home when its
 * driver next asks, once both halves are placed. */
static int place_shared_transfer(const shared_issue *h) {
  comm *m = h->m;
  shared_clique *sh = m->sh;
  int is_send = h->transfer == 1;
  const char *name = is_send ? "ncclSend" : "ncclRecv";
  int from = is_send ? m->rank : h->peer, to = is_send ? h->peer : m->rank;
  void *buf = is_send ? (void *)(uintptr_t)h->p.send : h->p.recv;
  size_t bytes = h->bytes;
  if (m->aborted || m->destroyed) return REMOTE;
  lock_shared(sh);
  const char *why = NULL;
  int slot = -1;
  for (int i = 0; i < SLOTS && !sh->aborted; i++) {
    shared_transfer *t = &sh->transfers[i];
    if (t->used && t->from == from && t->to == to && t->n == h->seq) slot = i;
  }
  for (int i = 0; i < SLOTS && !sh->aborted && slot < 0; i++)
    if (!sh->transfers[i].used) {
      slot = i;
      memset(&sh->transfers[i], 0, sizeof sh->transfers[i]);
      sh->transfers[i] = (shared_transfer){1, from, to, 0, 0, 0, 0, h->seq, 0, 0};
    }
  if (!sh->aborted && slot < 0) why = "every transfer slot of the shared clique is taken";
  shared_transfer *t = slot < 0 ? NULL : &sh->transfers[slot];
  if (t && ((is_send && t->has_recv && t->recv_bytes != bytes) || (!is_send && t->has_send && t->send_bytes != bytes)))
    why = "a length the other half does not post";
  if (why) {
    pthread_mutex_unlock(&sh->lock);
    return refuse(INVALID_USAGE, "%s #%llu from rank %d to rank %d (shared): %s", name, h->seq, from, to, why);
  }
  if (t && is_send) {
    memcpy(sh->transfer_bytes[slot], buf, bytes);
    t->has_send = 1;
    t->send_bytes = bytes;
  } else if (t) {
    t->has_recv = 1;
    t->recv_bytes = bytes;
  }
  if (t && t->has_send && t->has_recv) t->done = 1;
  pthread_mutex_unlock(&sh->lock);
  remember_shared((local_post){sh, slot, m->rank, h->seq, h->p.seq, is_send ? NULL : buf, h->p.stream,
                               is_send ? 0 : bytes, NULL, is_send ? 1 : 2, from, to, 0});
  return SUCCESS;
}

/* A transfer's half in shared mode (the caller holds `lock`), placed when
 * its stream reaches it. */
static int transfer_shared(comm *m, int is_send, void *buf, size_t bytes, int peer, void *stream) {
  const char *name = is_send ? "ncclSend" : "ncclRecv";
  shared_clique *sh = m->sh;
  int from = is_send ? m->rank : peer, to = is_send ? peer : m->rank;
  lock_shared(sh);
  const char *why = NULL;
  if (sh->aborted) why = "";
  else if (sh->joined < sh->nranks) why = "before every rank joined the communicator";
  else if (bytes > SLOT_BYTES) why = "more bytes than the mock's shared mode carries (64 KiB a transfer)";
  int aborted = sh->aborted;
  pthread_mutex_unlock(&sh->lock);
  unsigned long long n = is_send ? m->sent[peer] : m->received[peer];
  if (why) {
    if (aborted) return REMOTE;
    return refuse(INVALID_USAGE, "%s #%llu from rank %d to rank %d (shared): %s", name, n, from, to, why);
  }
  if (is_send) m->sent[peer]++;
  else m->received[peer]++;
  after_last(m, stream);
  post p = {1, 0, 0, 0, 0, 0, is_send ? buf : NULL, is_send ? NULL : buf, stream, stream_op(stream), NULL};
  now_last(m, stream, p.seq, NULL);
  shared_issue h = {m, is_send ? 1 : 2, peer, n, p, bytes};
  if (hold_shared(&h)) return SUCCESS;
  return place_shared_transfer(&h);
}

static int place_shared(const shared_issue *h) {
  return h->transfer ? place_shared_transfer(h) : place_shared_call(h);
}

/* One half of transfer number n from one rank to another: the bytes move
 * when both halves are posted, on the thread of the later one. Refused (a
 * violation) where real NCCL would hang or misbehave: a peer outside the
 * communicator or the rank itself, halves of different lengths, a buffer
 * outside the live allocations, a capturing stream (scope does not record
 * transfers). */
/* One half of a transfer, posted: placed at once, or held until its
 * stream reaches it (its operation `seq` there, timed part `part`). */
typedef struct {
  comm *m;
  int is_send;
  void *buf;
  size_t bytes;
  int peer;
  void *stream;
  unsigned long long seq;
  void *part;
  unsigned long long k;
} held_half;
static int place_half(const held_half *h);
static int hold_half(const held_half *h);

static int post_transfer(comm *m, int is_send, void *buf, size_t count, int dtype, int peer, void *stream) {
  LOCKED;
  const char *name = is_send ? "ncclSend" : "ncclRecv";
  int bad = usable(m, name);
  if (bad) return bad;
  int n = m->sh ? m->sh->nranks : m->c->nranks;
  if (peer < 0 || peer >= n || peer == m->rank)
    return refuse(INVALID_ARGUMENT, "%s on rank %d: peer %d of %d", name, m->rank, peer, n);
  if (!element_size(dtype)) return refuse(INVALID_ARGUMENT, "%s: data type %d", name, dtype);
  size_t bytes = count * element_size(dtype);
  if (stream_capturing(stream) != 0)
    return refuse(INVALID_USAGE, "%s on a stream that is capturing or not a live stream", name);
  if (!device_range(buf, bytes))
    return refuse(INVALID_ARGUMENT, "%s on rank %d: a buffer is not inside one live device allocation", name,
                  m->rank);
  if (m->sh) return transfer_shared(m, is_send, buf, bytes, peer, stream);
  clique *c = m->c;
  if (c->aborted) return REMOTE;
  if (c->joined < n) return refuse(INVALID_USAGE, "%s before every rank joined the communicator", name);
  /* Numbered in issue order, placed in stream order, as a call is. */
  held_half h = {m, is_send, buf, bytes, peer, stream, 0, NULL, is_send ? m->sent[peer]++ : m->received[peer]++};
  after_last(m, stream);
  h.seq = stream_part(stream, &h.part);
  now_last(m, stream, h.seq, h.part);
  if (hold_half(&h)) return SUCCESS;
  return place_half(&h);
}

/* Place one half of transfer `h->k` between `h->m`'s rank and `h->peer`
 * (the lock held): an open part of its stream until the other half is
 * placed too, when the bytes move and both parts close. A half placed
 * after an abort ends there. */
static int place_half(const held_half *h) {
  comm *m = h->m;
  clique *c = m->c;
  if (c->aborted || m->destroyed) {
    void *part = h->part;
    end_part(&part);
    return REMOTE;
  }
  int from = h->is_send ? m->rank : h->peer, to = h->is_send ? h->peer : m->rank;
  transfer *t = c->transfers;
  while (t && !(t->from == from && t->to == to && t->n == h->k)) t = t->next;
  if (!t) {
    t = calloc(1, sizeof *t);
    t->from = from;
    t->to = to;
    t->n = h->k;
    t->next = c->transfers;
    c->transfers = t;
  }
  if (h->is_send) {
    t->has_send = 1;
    t->send = h->buf;
    t->send_bytes = h->bytes;
    t->send_stream = h->stream;
    t->send_seq = h->seq;
    t->send_part = h->part;
  } else {
    t->has_recv = 1;
    t->recv = h->buf;
    t->recv_bytes = h->bytes;
    t->recv_stream = h->stream;
    t->recv_seq = h->seq;
    t->recv_part = h->part;
  }
  part_opened(h->stream, h->seq);
  if (!(t->has_send && t->has_recv)) return SUCCESS;
  void *parts[2] = {t->send_part, t->recv_part}, *recvs[2] = {NULL, t->recv};
  size_t written[2] = {0, t->recv_bytes};
  join_parts(c, parts, recvs, written, 2, t->send_bytes < t->recv_bytes ? t->send_bytes : t->recv_bytes);
  for (transfer **at = &c->transfers; *at; at = &(*at)->next)
    if (*at == t) { *at = t->next; break; }
  size_t sent = t->send_bytes, received = t->recv_bytes;
  if (sent == received) memmove(t->recv, t->send, sent);
  part_closed(t->send_stream, t->send_seq);
  part_closed(t->recv_stream, t->recv_seq);
  unsigned long long k = t->n;
  free(t);
  pthread_cond_broadcast(&changed);
  if (sent != received)
    return refuse(INVALID_USAGE, "transfer #%llu from rank %d to rank %d: %zu bytes sent, %zu received", k, from,
                  to, sent, received);
  return SUCCESS;
}

/* The driver's hook for a held half its stream reached. */
static void place_half_held(const void *blob, void *stream, unsigned long long stream_seq) {
  LOCKED;
  (void)stream;
  (void)stream_seq;
  place_half(blob);
}

static int hold_half(const held_half *h) {
  return hold_behind(h->stream, h->seq, place_half_held, h, sizeof *h);
}

int ncclSend(const void *send, size_t count, int dtype, int peer, comm *m, void *stream) {
  return post_transfer(m, 1, (void *)(uintptr_t)send, count, dtype, peer, stream);
}
int ncclRecv(void *recv, size_t count, int dtype, int peer, comm *m, void *stream) {
  return post_transfer(m, 0, recv, count, dtype, peer, stream);
}
