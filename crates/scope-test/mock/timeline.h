/* Model time of a device's streams: the timed mode shared by the mock CUDA
 * driver and the mock HIP runtime, which include it where their timed mode
 * begins, and the hooks through which the mock NCCL posts, joins and ends
 * its parts there. Each defines first `typedef struct stream {...} stream;`
 * with `struct tnode *tail_node` (its chain, or NULL) and `long long tail`
 * (its model time once the chain settled), and what the second half below
 * names. The static functions are called with the mock's timing lock held,
 * unless they say otherwise; the scope_mock_ hooks take it. */
#ifndef SCOPE_MOCK_TIMELINE_H
#define SCOPE_MOCK_TIMELINE_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Signalled when a part is posted, joined or ended. Its waits time out by
 * CLOCK_MONOTONIC, model time's clock. */
static pthread_cond_t timed_changed;
__attribute__((constructor)) static void timed_changed_init(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&timed_changed, &a);
  pthread_condattr_destroy(&a);
}

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
static long long later(long long a, long long b) { return a > b ? a : b; }

/* Where model time is not known at issue — behind a collective's part that
 * waits for its peers — a stream's work is a chain of nodes, evaluated
 * once the parts below are joined. A plain node finishes at
 * max(prev + a, b, dep): a run of operations folds into one (each adds
 * its duration to a, and b = max(b, its issue) + duration); an event wait
 * puts the event's node in dep. A part starts at max(prev, posted); joined,
 * all parts of its call finish together at the latest start plus the
 * call's cost. Nodes are counted references: the stream's tail, events,
 * the next node, a group, the mock NCCL's (or RCCL's) handle.
 *
 * A joined call's finish stays open to an abort until it has passed: an
 * aborted communicator's parts that have not finished end at the abort,
 * or at their own start if later (scope_mock_part_end). So a finish is
 * settled (`finish`, the node's chain dropped) only once it cannot move:
 * when it no longer depends on a joined call yet to finish, or when it has
 * passed (what an abort moves ends no earlier than the abort, so a finish
 * already passed depends on none that can move). Until then it is
 * provisional, kept in `pval` for the `moves` it was found in: only an
 * abort that ends a joined call moves a known finish (a join only makes
 * unknown ones known), and then the chain is evaluated again. */
enum { T_PLAIN, T_PART, T_JOINED };
typedef struct tnode {
  int refs, kind, visiting;
  unsigned mark;
  unsigned long long unknown;       /* the epoch it was last found unknown in */
  long long finish;                 /* -1 until settled */
  long long pval;                   /* a provisional finish, found at `moves` pmoves */
  unsigned long long pmoves;
  struct tnode *prev, *dep;
  long long prev_time;              /* the stream's tail below, when prev is NULL */
  long long a, b;
  long long posted;
  struct tgroup *group;
  stream *on;                       /* a part's stream and operation number */
  unsigned long long seq;
  struct tnode *next;               /* in the stream's unclaimed parts */
} tnode;
typedef struct tgroup {
  int n;
  tnode **parts;
  long long extra;
  long long pval;                   /* its finish while it has not passed, found at `moves` pmoves */
  unsigned long long pmoves;
} tgroup;
/* Only a part's join or end can make an unknown finish known: a node found
 * unknown stays so until the epoch moves, which keeps issuing behind a
 * waiting part O(1) an operation. Only an abort of a joined call moves a
 * provisional finish: `moves` counts those. */
static unsigned long long epoch = 1, moves = 1;

static void drop(tnode *x) {
  while (x && --x->refs == 0) {
    tnode *prev = x->prev;
    drop(x->dep);
    free(x);
    x = prev;
  }
}
static void settle(tnode *x, long long f) {
  x->finish = f;
  x->kind = T_PLAIN;
  x->group = NULL;
  drop(x->prev);
  drop(x->dep);
  x->prev = x->dep = NULL;
}

static long long finish_of(tnode *x);
static long long part_start(tnode *p) {
  long long before = p->prev ? finish_of(p->prev) : p->prev_time;
  return before < 0 ? -1 : later(before, p->posted);
}
/* A joined call that finished at `f`: its parts settle, the group goes. */
static long long group_settle(tgroup *g, long long f) {
  for (int i = 0; i < g->n; i++) settle(g->parts[i], f);
  for (int i = 0; i < g->n; i++) drop(g->parts[i]);
  free(g->parts);
  free(g);
  return f;
}
/* A joined part's finish, which is its whole call's; settles them all
 * once it has passed. */
static long long group_finish(tnode *x) {
  tgroup *g = x->group;
  if (g->pmoves == moves) return g->pval > now_ns() ? g->pval : group_settle(g, g->pval);
  long long latest = 0;
  int known = 1;
  for (int i = 0; i < g->n; i++) g->parts[i]->visiting = 1;
  for (int i = 0; i < g->n && known; i++) {
    long long start = part_start(g->parts[i]);
    if (start < 0) known = 0;
    latest = later(latest, start);
  }
  for (int i = 0; i < g->n; i++) {
    g->parts[i]->visiting = 0;
    if (!known) g->parts[i]->unknown = epoch;
  }
  if (!known) return -1;
  long long f = latest + g->extra;
  if (f <= now_ns()) return group_settle(g, f);
  g->pval = f;
  g->pmoves = moves;
  return f;
}
/* A node that ends a run of plain ones: settled, provisional, a joined
 * part, or unknown (a part not yet joined; a node on the path being
 * evaluated: a cycle, which a GPU would never finish either). */
static long long leaf(tnode *y) {
  if (y->finish >= 0) return y->finish;
  if (y->unknown == epoch) return -1;
  if (y->kind == T_PLAIN && y->pmoves == moves && !y->visiting) {
    long long f = y->pval;
    if (f <= now_ns()) settle(y, f); /* passed: nothing can move it now */
    return f;
  }
  return y->kind == T_JOINED && !y->visiting ? group_finish(y) : -1;
}
/* `x`'s model finish, or -1 while it is not known; settled (x->finish set)
 * or provisional (see above). The caller holds a reference. The run of
 * plain nodes below x is evaluated bottom up in a loop, not by recursion:
 * work issued behind a part can be a long chain. */
static long long finish_of(tnode *x) {
  tnode **run = NULL;
  size_t len = 0, cap = 0;
  for (tnode *y = x; y && y->finish < 0 && y->kind == T_PLAIN && !y->visiting && y->unknown != epoch &&
                     y->pmoves != moves;
       y = y->prev) {
    if (len == cap) {
      cap = cap ? cap * 2 : 16;
      run = realloc(run, cap * sizeof *run);
    }
    run[len++] = y;
  }
  if (!len) return leaf(x);
  for (size_t i = 0; i < len; i++) run[i]->visiting = 1;
  tnode *bottom = run[len - 1];
  long long f = bottom->prev_time, now = now_ns();
  int firm = 1; /* whether f is settled */
  if (bottom->prev) {
    f = leaf(bottom->prev);
    firm = bottom->prev->finish >= 0;
  }
  size_t left = len;
  while (left && f >= 0) {
    tnode *c = run[left - 1];
    long long d = 0;
    if (c->dep) {
      d = finish_of(c->dep);
      firm = firm && c->dep->finish >= 0;
    }
    if (d < 0) { f = -1; break; }
    f = later(later(f + c->a, c->b), d);
    c->visiting = 0;
    firm = firm || f <= now;
    if (firm) {
      settle(c, f); /* may free run[left], settled already */
    } else {
      c->pval = f;
      c->pmoves = moves;
    }
    left--;
  }
  for (size_t i = 0; i < left; i++) {
    run[i]->visiting = 0;
    run[i]->unknown = epoch;
  }
  free(run);
  return left ? -1 : f;
}

/* The tail settled at last: fold it into `tail`. */
static void collapse(stream *s) {
  if (s->tail_node && finish_of(s->tail_node) >= 0 && s->tail_node->finish >= 0) {
    s->tail = s->tail_node->finish;
    drop(s->tail_node);
    s->tail_node = NULL;
  }
}
/* A new node at `s`'s tail, taking over the stream's reference. */
static tnode *append(stream *s, int kind) {
  tnode *n = calloc(1, sizeof *n);
  n->refs = 1;
  n->kind = kind;
  n->finish = -1;
  n->prev = s->tail_node;
  n->prev_time = s->tail;
  s->tail_node = n;
  return n;
}
/* The tail node, if new work may fold into it: no one else sees it (its
 * provisional finish, if any, is forgotten: the work changes it). */
static tnode *foldable(stream *s) {
  tnode *t = s->tail_node;
  if (!t || t->refs != 1 || t->kind != T_PLAIN || t->dep) return NULL;
  t->pmoves = 0;
  return t;
}
/* An event recorded on `s` now: the model finish of its work so far, `*at`,
 * or the node that will know it, `*node` (a reference; the event's last
 * one is dropped). */
static void timed_record(stream *s, long long *at, tnode **node) {
  collapse(s);
  drop(*node);
  *at = s->tail;
  *node = s->tail_node;
  if (*node) (*node)->refs++;
}
/* `s`'s later work starts no earlier than event time `at` / node `e`'s finish. */
static void timed_wait_event(stream *s, long long at, tnode *e) {
  if (e && finish_of(e) >= 0 && e->finish >= 0) { at = e->finish; e = NULL; }
  collapse(s);
  if (!e && !s->tail_node) { s->tail = later(s->tail, at); return; }
  tnode *t = e ? NULL : foldable(s);
  if (!t) {
    t = append(s, T_PLAIN);
    if (e) { t->dep = e; e->refs++; }
  }
  t->b = later(t->b, at);
}

/* ----- operations, parts and host waits -----
 * What follows needs, besides `stream` (with `issued`, its operations, and
 * `unclaimed`, a replay's parts its collectives have yet to post):
 * TIMELINE_MUTEX, the mutex that guards model time; `timing`, whether
 * timed mode is on; and MOCK_NAME, the mock's name for its messages. */
static void timeline_unlock(int *h) { (void)h; pthread_mutex_unlock(&TIMELINE_MUTEX); }
#define TIMELINE_LOCKED \
  int timeline_locked_ __attribute__((cleanup(timeline_unlock))) = (pthread_mutex_lock(&TIMELINE_MUTEX), 1)

/* An operation of `dur` ns issued on `s` now. */
static void model_op(stream *s, unsigned long long dur) {
  long long now = now_ns(), d = (long long)dur;
  collapse(s);
  if (!s->tail_node) { s->tail = later(s->tail, now) + d; return; }
  tnode *t = foldable(s);
  if (!t) {
    t = append(s, T_PLAIN);
    t->b = now;
  }
  t->a += d;
  t->b = later(t->b, now) + d;
}
/* A collective's part, operation `seq` of `s`: references for the
 * stream and for the caller. */
static tnode *add_part(stream *s, unsigned long long seq) {
  collapse(s);
  tnode *n = append(s, T_PART);
  n->posted = now_ns();
  n->on = s;
  n->seq = seq;
  n->refs++;
  return n;
}
/* An aborted communicator's part ends now, or at its own start if later
 * (its stream's earlier work still runs first): one not yet joined, or a
 * joined call's whose finish has not passed (or is not known yet) — then
 * every part of that call, each at its own start or now. What is ordered
 * after them follows from the new finishes (the epoch moves), and the
 * host waits sleeping on a finish wake to read it again. */
static void end_part(tnode *x) {
  if (x->kind == T_JOINED) finish_of(x); /* settles the call if it has passed */
  epoch++;
  long long now = now_ns();
  if (x->kind == T_PART) {
    x->kind = T_PLAIN;
    x->a = 0;
    x->b = later(x->posted, now);
  } else if (x->kind == T_JOINED) {
    tgroup *g = x->group;
    for (int i = 0; i < g->n; i++) {
      tnode *p = g->parts[i];
      p->kind = T_PLAIN;
      p->group = NULL;
      p->a = 0;
      p->b = later(p->posted, now);
    }
    for (int i = 0; i < g->n; i++) drop(g->parts[i]); /* the group's references; the caller holds x */
    free(g->parts);
    free(g);
    moves++;
  }
  pthread_cond_broadcast(&timed_changed);
}
/* A part not yet joined that `x`'s finish waits for, or NULL. */
static tnode *blocker(tnode *x, unsigned mark) {
  for (; x && x->finish < 0 && x->mark != mark; x = x->prev) {
    x->mark = mark;
    if (x->kind == T_PART) return x;
    if (x->kind == T_JOINED) {
      for (int i = 0; i < x->group->n; i++) {
        tnode *m = x->group->parts[i], *b;
        if (m != x && m->mark == mark) continue;
        m->mark = mark;
        if ((b = blocker(m->prev, mark))) return b;
      }
      return NULL;
    }
    tnode *b = blocker(x->dep, mark);
    if (b) return b;
  }
  return NULL;
}
/* A collective the mock NCCL posted on a stream is an operation of that
 * stream which finishes when every rank posted: the mock NCCL registers
 * how to ask, and these ask it, with the mock's locks released (the mock
 * NCCL calls into the driver under its own lock). */
static int (*collectives_pending)(void *, unsigned long long);
static void (*collectives_wait)(void *, unsigned long long);
void scope_mock_register_collectives(int (*pending)(void *, unsigned long long),
                                     void (*wait)(void *, unsigned long long)) {
  TIMELINE_LOCKED;
  collectives_pending = pending;
  collectives_wait = wait;
}
static int pending_on(void *s, unsigned long long upto) {
  return s && collectives_pending && collectives_pending(s, upto);
}
static void wait_on(void *s, unsigned long long upto) {
  if (s && collectives_wait) collectives_wait(s, upto);
}

/* Timed mode's collectives. scope_mock_stream_part is scope_mock_stream_op
 * for a part whose finish the mock NCCL sets: *part is its handle (NULL
 * when timed mode is off), until the mock NCCL hands it back through
 * scope_mock_part_join (every part of one call, all finishing at the
 * latest part's start plus extra_ns) or scope_mock_part_end (an aborted
 * communicator: it ends now, or at its own start if later). With
 * scope_mock_part_join_kept the mock NCCL keeps its handles after the
 * join, so that an abort can still end a joined call that has not
 * finished (scope_mock_part_end, on any one part of it, ends them all);
 * scope_mock_part_settled says when a handle is no longer needed for
 * that (its finish passed, or nothing can move it), and
 * scope_mock_part_release hands one back. A graph replay's recorded
 * collectives have their parts made by the graph launch;
 * scope_mock_replay_part hands out the next one of `p` (NULL if none). */
unsigned long long scope_mock_stream_part(void *p, void **part) {
  TIMELINE_LOCKED;
  stream *s = p;
  ++s->issued;
  *part = timing ? add_part(s, s->issued) : NULL;
  if (*part) pthread_cond_broadcast(&timed_changed);
  return s->issued;
}
void *scope_mock_replay_part(void *p) {
  TIMELINE_LOCKED;
  stream *s = p;
  tnode *n = s->unclaimed;
  if (n) {
    s->unclaimed = n->next;
    n->next = NULL;
    pthread_cond_broadcast(&timed_changed);
  }
  return n;
}
static void join(void **parts, int n, unsigned long long extra_ns, int kept) {
  if (n <= 0) return;
  tgroup *g = calloc(1, sizeof *g);
  g->n = n;
  g->parts = calloc((size_t)n, sizeof *g->parts);
  g->extra = (long long)extra_ns;
  epoch++;
  for (int i = 0; i < n; i++) {
    tnode *x = parts[i];
    g->parts[i] = x; /* the mock NCCL's reference, now the group's, or the group's own */
    if (kept) x->refs++;
    x->kind = T_JOINED;
    x->group = g;
  }
  tnode *first = g->parts[0];
  first->refs++;
  finish_of(first); /* settles it now when it can: nothing else may ask */
  drop(first);
  pthread_cond_broadcast(&timed_changed);
}
void scope_mock_part_join(void **parts, int n, unsigned long long extra_ns) {
  TIMELINE_LOCKED;
  join(parts, n, extra_ns, 0);
}
void scope_mock_part_join_kept(void **parts, int n, unsigned long long extra_ns) {
  TIMELINE_LOCKED;
  join(parts, n, extra_ns, 1);
}
int scope_mock_part_settled(void *part) {
  TIMELINE_LOCKED;
  tnode *x = part;
  return !x || (finish_of(x) >= 0 && x->finish >= 0);
}
void scope_mock_part_release(void *part) {
  TIMELINE_LOCKED;
  drop(part);
}
void scope_mock_part_end(void *part) {
  TIMELINE_LOCKED;
  tnode *x = part;
  end_part(x);
  drop(x);
}

/* Timed mode's host wait: a model time, or a node (a reference, dropped here). */
typedef struct { long long at; tnode *node; } when;
static when when_tail(stream *s) {
  TIMELINE_LOCKED;
  collapse(s);
  when w = {s->tail, s->tail_node};
  if (w.node) w.node->refs++;
  return w;
}
/* Wait on timed_changed (the lock held) until model time `t` at the latest. */
static void wait_changed(long long t) {
  struct timespec ts = {(time_t)(t / 1000000000LL), (long)(t % 1000000000LL)};
  pthread_cond_timedwait(&timed_changed, &TIMELINE_MUTEX, &ts);
}
/* Sleep, with the lock not held, until `w` has passed. Its finish is read
 * again whenever a part is posted, joined or ended, and the sleep lasts
 * until that finish or the next such change: an abort can move a finish
 * earlier (see end_part). While its time is not known, wait for the part
 * it waits for: a posted one's peers (as the mock NCCL's wait does, which
 * gives up after 30 s), a replay's part to be posted. A wait that cannot
 * end gives up, as the untimed mock's does: the peers never posted, or a
 * cycle of waits. */
static void timed_wait(when w) {
  static unsigned marks;
  long long give_up = now_ns() + 30000000000LL;
  pthread_mutex_lock(&TIMELINE_MUTEX);
  for (;;) {
    long long f = w.node ? finish_of(w.node) : w.at;
    if (f >= 0) {
      if (now_ns() >= f) break;
      wait_changed(f);
      continue;
    }
    tnode *b = blocker(w.node, ++marks);
    if (!b || now_ns() > give_up) {
      fprintf(stderr, MOCK_NAME ": a timed host wait gave up: its work waits for a collective that cannot finish\n");
      break;
    }
    stream *on = b->on;
    unsigned long long seq = b->seq;
    pthread_mutex_unlock(&TIMELINE_MUTEX);
    if (pending_on(on, seq)) {
      wait_on(on, seq);
      if (pending_on(on, seq)) give_up = 0; /* the mock NCCL gave up (a violation) */
      pthread_mutex_lock(&TIMELINE_MUTEX);
      continue;
    }
    /* Not posted yet (a replay's part, before its hook posts it): a
     * moment, or until a part is posted, joined or ended. */
    pthread_mutex_lock(&TIMELINE_MUTEX);
    wait_changed(now_ns() + 1000000);
  }
  drop(w.node);
  pthread_mutex_unlock(&TIMELINE_MUTEX);
}
void scope_mock_part_keep(void *part) {
  TIMELINE_LOCKED;
  if (part) ((tnode *)part)->refs++;
}


#endif
