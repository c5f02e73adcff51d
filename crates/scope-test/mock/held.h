/* Held work: what waits on a device for a collective. One stream executor,
 * shared by the mock CUDA driver and the mock HIP runtime, which include it
 * after timeline.h. The mocks run work when it is issued, except work
 * ordered after a collective's part that is still open (posted, its peers
 * not all posted: the mock NCCL says so through scope_mock_part_opened and
 * _closed): later work on the part's stream, work on a stream made to wait
 * on an event that covers it, and so on. That work is held, queued on its
 * stream in issue order, and runs when what it waits for closed, on
 * whichever thread closed it, as a GPU runs work queued behind NCCL's
 * kernel. So a stream's work completes in issue order, whatever the kind.
 *
 * A collective posted on a stream that holds work is placed when the
 * stream reaches it (scope_mock_hold_post), by the next driver call, with
 * the lock released: the mock NCCL takes its lock, then the driver's. A
 * graph replay runs its nodes in recorded order the same way: each
 * recorded collective takes a slot in its stream's queue (held_slot) when
 * the replay is issued, the replay's later nodes queue behind it, and the
 * collective's post fills the slot. A host wait waits until what it covers
 * ran; a query answers not ready until then.
 *
 * The includer defines first:
 *  - `stream`, with `struct held *head, *last` (its queue),
 *    `unsigned long long placing` (the post being placed, 0: none),
 *    `unsigned long long *open` and `size_t nopen, capopen` (its open
 *    parts), `struct stream *next`; and `static stream *streams`, every
 *    stream that may hold work;
 *  - `replay_hook`, the mock NCCL's hook that places a post;
 *  - `held_work`, the payload of its held operations, and
 *    `static void held_run(stream *, held_work *, unsigned long long seq)`,
 *    which runs one and frees what it owns;
 *  - HELD_MUTEX, the mutex that guards the queues;
 *  - `static void held_gave_up(void)`, told (the lock held) when a host
 *    wait cannot end;
 *  - `static void wait_on(void *, unsigned long long)`, which waits for the
 *    mock NCCL's posts on a stream up to an operation number.
 * Every function is static; the three scope_mock_ hooks are the mock
 * NCCL's entry points. */
#ifndef SCOPE_MOCK_HELD_H
#define SCOPE_MOCK_HELD_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void held_unlock(int *h) { (void)h; pthread_mutex_unlock(&HELD_MUTEX); }
#define HELD_LOCKED int held_locked_ __attribute__((cleanup(held_unlock))) = (pthread_mutex_lock(&HELD_MUTEX), 1)

/* H_SLOT: a replay's recorded collective, until its post fills it (H_POST)
 * or the post is refused (the slot goes). */
enum { H_WORK, H_WAIT, H_POST, H_SLOT };
typedef struct held {
  int kind;
  unsigned long long seq;              /* its number on its stream */
  held_work w;                         /* H_WORK */
  replay_hook hook; void *blob;        /* H_POST: the mock NCCL's hook and its blob, owned */
  stream *on; unsigned long long upto; /* H_WAIT: every operation of `on` up to `upto` */
  struct held *next;
} held;
static unsigned long long nheld, nslots;

static void hold(stream *s, held h) {
  held *x = malloc(sizeof *x);
  *x = h;
  x->next = NULL;
  if (s->last) s->last->next = x; else s->head = x;
  s->last = x;
  nheld++;
  if (x->kind == H_SLOT) nslots++;
}
static held *unhold(stream *s) {
  held *h = s->head;
  s->head = h->next;
  if (!s->head) s->last = NULL;
  nheld--;
  return h;
}
/* Whether `s` has a part open at or before `upto`. */
static int open_upto(const stream *s, unsigned long long upto) {
  for (size_t i = 0; i < s->nopen; i++)
    if (s->open[i] <= upto) return 1;
  return 0;
}
/* Whether new work on `s` waits: its queue, or a part of its own open. */
static int holding(const stream *s) { return s->head || s->placing || s->nopen; }
/* Whether every operation of `s` up to `upto` ran. */
static int reached(const stream *s, unsigned long long upto) {
  if (s->head && s->head->seq <= upto) return 0;
  if (s->placing && s->placing <= upto) return 0;
  return !open_upto(s, upto);
}
static int runnable(const stream *s, const held *h) {
  if (s->placing || h->kind == H_SLOT) return 0;
  if (h->kind == H_WAIT) return reached(h->on, h->upto);
  return h->kind == H_POST || !open_upto(s, h->seq - 1);
}
/* Run what is held and may run now (the lock held); whether a post waits
 * at the head of its stream to be placed. */
static int drain(void) {
  int moved = 1, posts = 0;
  while (nheld && moved) {
    moved = 0;
    posts = 0;
    for (stream *s = streams; s; s = s->next) {
      while (s->head && runnable(s, s->head)) {
        if (s->head->kind == H_POST) {
          posts = 1;
          break;
        }
        held *h = unhold(s);
        if (h->kind == H_WORK) held_run(s, &h->w, h->seq);
        free(h);
        moved = 1;
      }
    }
  }
  return posts;
}
/* Place the posts their streams reached, with the lock released: each
 * calls into the mock NCCL. A stream placing one holds the rest. */
static void place_posts(void) {
  for (;;) {
    held *h = NULL;
    stream *on = NULL;
    pthread_mutex_lock(&HELD_MUTEX);
    if (nheld && drain()) {
      for (stream *s = streams; s && !h; s = s->next)
        if (s->head && s->head->kind == H_POST && !s->placing) {
          h = unhold(s);
          s->placing = h->seq;
          on = s;
        }
    }
    pthread_mutex_unlock(&HELD_MUTEX);
    if (!h) return;
    h->hook(h->blob, on, h->seq);
    pthread_mutex_lock(&HELD_MUTEX);
    on->placing = 0;
    drain();
    pthread_mutex_unlock(&HELD_MUTEX);
    free(h->blob);
    free(h);
  }
}
/* An open part of `s` (or of what its work up to `upto` waits for) to
 * wait for; NULL where nothing is open (a post waits to be placed). */
static stream *open_blocker(stream *s, unsigned long long upto, unsigned long long *seq, int depth) {
  for (size_t i = 0; i < s->nopen; i++)
    if (s->open[i] <= upto) {
      *seq = s->open[i];
      return s;
    }
  if (depth > 0 && s->head && s->head->seq <= upto && s->head->kind == H_WAIT)
    return open_blocker(s->head->on, s->head->upto, seq, depth - 1);
  return NULL;
}
static void wait_on(void *s, unsigned long long upto);
/* Wait, with the lock released, until `s`'s work up to `upto` ran (1).
 * One that cannot (a cycle, peers that never post) gives up after 30 s,
 * as the mock NCCL's wait does (0). */
static int wait_reached(stream *s, unsigned long long upto) {
  long long give_up = now_ns() + 30000000000LL;
  for (;;) {
    place_posts();
    pthread_mutex_lock(&HELD_MUTEX);
    drain();
    int done = reached(s, upto);
    unsigned long long seq = 0;
    stream *b = done ? NULL : open_blocker(s, upto, &seq, 64);
    if (!done && now_ns() > give_up) {
      held_gave_up();
      pthread_mutex_unlock(&HELD_MUTEX);
      return 0;
    }
    pthread_mutex_unlock(&HELD_MUTEX);
    if (done) return 1;
    if (b) {
      wait_on(b, seq);
    } else {
      struct timespec pause = {0, 50000};
      nanosleep(&pause, NULL);
    }
  }
}

/* Wait, with the lock released, until every stream `which` picks ran all
 * that was issued on it when looked at (a context's or a device's sync). */
static void wait_every_stream(int (*which)(const stream *)) {
  for (;;) {
    stream *behind = NULL;
    unsigned long long upto = 0;
    {
      HELD_LOCKED;
      drain();
      for (stream *s = streams; s && !behind; s = s->next)
        if (which(s) && !reached(s, s->issued)) behind = s, upto = s->issued;
    }
    if (!behind || !wait_reached(behind, upto)) break;
  }
}

/* A replay's recorded collective, operation `seq` of `s`: its slot, which
 * what the replay issues after it queues behind. */
static void held_slot(stream *s, unsigned long long seq) { hold(s, (held){.kind = H_SLOT, .seq = seq}); }
/* The replay's hook for slot `seq` returned: a slot its post did not fill
 * (the post was refused) goes, and what queued behind it runs. */
static void held_slot_done(stream *s, unsigned long long seq) {
  HELD_LOCKED;
  if (!nslots) return;
  for (held **at = &s->head, *prev = NULL; *at; prev = *at, at = &(*at)->next) {
    held *h = *at;
    if (h->kind != H_SLOT || h->seq != seq) continue;
    *at = h->next;
    if (s->last == h) s->last = prev;
    nheld--;
    nslots--;
    free(h);
    break;
  }
  drain();
}

/* Post a replay's recorded collective, operation `seq` of `s`, with no
 * lock held: `hook` posts it through the mock NCCL, which fills its slot.
 * A post refused there ends its timed part, as nothing waits for it. */
static void post_replayed(stream *s, replay_hook hook, const void *blob, unsigned long long seq) {
  tnode *mine;
  {
    TIMELINE_LOCKED;
    mine = s->unclaimed;
  }
  hook(blob, s, seq);
  held_slot_done(s, seq);
  TIMELINE_LOCKED;
  if (mine && s->unclaimed == mine) {
    s->unclaimed = mine->next;
    end_part(mine);
    drop(mine);
  }
}

void scope_mock_part_opened(void *p, unsigned long long seq) {
  HELD_LOCKED;
  stream *s = p;
  if (s->nopen == s->capopen) {
    s->capopen = s->capopen ? 2 * s->capopen : 8;
    s->open = realloc(s->open, s->capopen * sizeof *s->open);
  }
  s->open[s->nopen++] = seq;
}
void scope_mock_part_closed(void *p, unsigned long long seq) {
  HELD_LOCKED;
  stream *s = p;
  for (size_t i = 0; i < s->nopen; i++)
    if (s->open[i] == seq) {
      s->open[i] = s->open[--s->nopen];
      break;
    }
  drain();
}
/* A collective posted on `p` as its operation `seq`: held, to be placed by
 * `hook(blob)` when the stream reaches it, if the stream holds work or
 * `seq` is a replay's slot (1); else the mock NCCL places it now (0). */
int scope_mock_hold_post(void *p, unsigned long long seq, replay_hook hook, const void *blob, size_t n) {
  HELD_LOCKED;
  stream *s = p;
  held *slot = NULL;
  for (held *h = nslots ? s->head : NULL; h && !slot; h = h->next)
    if (h->kind == H_SLOT && h->seq == seq) slot = h;
  if (!slot && !s->head && !s->placing) return 0;
  void *copy = malloc(n ? n : 1);
  memcpy(copy, blob, n);
  if (slot) {
    slot->kind = H_POST;
    slot->hook = hook;
    slot->blob = copy;
    nslots--;
    return 1;
  }
  hold(s, (held){.kind = H_POST, .seq = seq, .hook = hook, .blob = copy});
  return 1;
}

#endif
