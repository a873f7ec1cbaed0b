/*
 * wheel.h: the hierarchical timing wheel that holds hwtimer's pending
 * timeouts, behind the five calls the worker in hwt.c needs (insert,
 * unlink, next tick with work, expire a tick, drain) and two that look
 * without changing anything (visit, occupancy).
 *
 * Level 0 is the wheel the user configured: ticks_per_wheel buckets of one
 * tick each.  Above it, levels of 64 slots, each slot as wide as the whole
 * level below it (level 1's slots span one turn of level 0; level 2's, 64
 * turns; and so on, until 63 bits of ticks are covered).  As in Linux and
 * tokio, where a timeout goes is read off the highest bit in which its due
 * tick differs from the wheel's current tick: level 0 holds the ticks of the
 * current turn (aligned on the wheel's size), level k the rest of the
 * current level-(k+1) slot.  When the current tick reaches the start of an
 * occupied slot, that slot is cascaded: its timeouts move down to where
 * they belong from the new tick, so a timeout moves at most once per level
 * on its way down and is expired from level 0 exactly at its due tick.
 * Timeouts that never fall due (deadline HWT_NEVER) wait on a list of their
 * own that nothing but drain visits.
 *
 * Order: all pending timeouts due at one tick are always on the same list,
 * in the order they were inserted.  A fresh insert and a cascade agree on
 * where a due tick goes, and the slot holding tick T is cascaded the moment
 * the wheel's tick reaches its start, before anything else is inserted at
 * that tick; so a cascade appends to lists that hold none of the same
 * ticks, and timeouts due in the same tick keep their scheduling order.
 *
 * One thread at a time calls these (hwt.c: the worker, with the timer's
 * lock held).  Errors follow hwt.h's rule: only init can fail, and it
 * returns 0 or an errno value.
 */
#ifndef HWT_WHEEL_H
#define HWT_WHEEL_H

#include "hwt.h"

#define HWT_WHEEL_SLOTS 64 /* slots of each level above level 0 */

/* Bits 6 to 31 of hwt_timeout.flags are the wheel's (the low six are
   hwt.c's): the kind of list the timeout is on (bits 28-31; 0: none) and
   its index on that level (bits 6-27).  The list is stored, not derived
   from the deadline, because a reset writes the deadline before the worker
   relinks the timeout. */
#define HWT_WHEEL_FLAGS_SHIFT 28
#define HWT_WHEEL_FLAGS_MASK  (UINT32_C(0xf) << HWT_WHEEL_FLAGS_SHIFT)
#define HWT_WHEEL_INDEX_SHIFT 6
#define HWT_WHEEL_INDEX_MASK  (UINT32_C(0x3fffff) << HWT_WHEEL_INDEX_SHIFT)
/* Level 0 has at most this many buckets: a larger ticks_per_wheel gets
   this many and one more level, which changes nothing anyone can see but
   the occupancy figures (and saves memory). */
#define HWT_WHEEL_MAX_LEVEL0 (UINT32_C(1) << 22)

typedef struct hwt_wheel {
    int64_t tick_ns;
    /* The next tick to expire.  Every slot that starts at or before it has
       been cascaded, and nothing due before it remains but cancelled
       timeouts whose cancel is queued. */
    int64_t elapsed;
    uint32_t mask;   /* level 0's size - 1 */
    unsigned bits;   /* log2 of level 0's size */
    unsigned levels; /* levels above level 0 */
    /* owned: level 0's buckets, 64 slots per level above, the never list,
       and the passed-over list (cancelled or reset timeouts that expiry
       found in a bucket, until their queued entry takes them) */
    hwt_link *heads;
    uint32_t *counts;   /* owned: timeouts on each of those lists */
    uint64_t *occupied; /* owned: level 0's bitmap, a bit per non-empty bucket */
    uint64_t *summary;  /* owned: a bit per non-zero word of occupied */
    size_t words, summary_words;
    uint64_t upper[HWT_MAX_LEVELS];      /* [k]: level k's occupied slots; [0] unused */
    uint64_t linked[HWT_MAX_LEVELS + 2]; /* per level; then never, then cancelled */
} hwt_wheel;

/* Prepares an empty wheel of `ticks_per_wheel` (a power of two, <= 2**30)
   buckets of `tick_ns` at tick 0.  Returns 0 or ENOMEM. */
int hwt_wheel_init(hwt_wheel *w, uint32_t ticks_per_wheel, int64_t tick_ns);
/* Frees what init allocated; the timeouts still on it are not touched. */
void hwt_wheel_destroy(hwt_wheel *w);

/* Links `to` (on no list) where its deadline belongs: due at tick
   max(ceil(deadline / tick_ns) - 1, 0, elapsed), the first that ends at or
   after it, at the tail of that tick's list. */
void hwt_wheel_insert(hwt_wheel *w, hwt_timeout *to);
/* Takes `to` off its list (it must be on one); link.prev is NULL after. */
void hwt_wheel_unlink(hwt_wheel *w, hwt_timeout *to);
bool hwt_wheel_linked(const hwt_timeout *to);

/* Returns the first tick at or after `elapsed` with work, a level-0 bucket
   to expire or a slot to cascade, or HWT_NEVER if the wheel holds nothing
   but never-due timeouts. */
int64_t hwt_wheel_next_tick(const hwt_wheel *w);
/* Moves the wheel to tick `tick` (at most hwt_wheel_next_tick: no work may
   be skipped) and cascades the slot that starts there. */
void hwt_wheel_advance(hwt_wheel *w, int64_t tick);

/* What hwt_wheel_expire() does with the timeouts it expires. */
typedef struct hwt_wheel_expiry {
    /* Whether `to`, just expired, joins the run (and it may count it);
       if not, it is unlinked alone and handed to take(). */
    bool (*joins)(void *ctx, const hwt_timeout *to);
    void (*take)(void *ctx, hwt_timeout *to);
    void *ctx;
    /* out: the run, in scheduling order, chained by link.next (NULL-ended),
       and its length */
    hwt_timeout *head, *tail;
    size_t n;
} hwt_wheel_expiry;
/* Expires the bucket of tick `elapsed`, in scheduling order: moves each
   timeout still INIT to EXPIRED (HWT_RUNNING for a periodic one, which
   comes back by hwt_timeout_rearm, and for a one-shot bound for an
   `ends_once` sink, which its consumer ends).  Those that join the run
   leave the bucket together at the end, with one unlink rather than one
   each; the others leave one by one, to e->take().  Cancelled or reset
   ones move to the passed-over list, linked still, for their queued entry
   to unlink or relink.  Stops after `limit` timeouts.  Returns whether the
   bucket is empty.  The caller keeps every other writer of a linked
   timeout's state out meanwhile (hwt.c: the cancel lock), so that each
   state is read and written, with no compare-and-swap: a walk of cold
   nodes spends most of its time in those. */
bool hwt_wheel_expire(hwt_wheel *w, size_t limit, hwt_wheel_expiry *e);

/* Unlinks every timeout, cancelled ones too, and returns them chained by
   link.next (NULL if none), level by level. */
hwt_timeout *hwt_wheel_drain(hwt_wheel *w);

/* Called for each linked timeout, and with NULL at the end of each list;
   returns false to stop the walk. */
typedef bool (*hwt_wheel_visit_fn)(void *ctx, hwt_timeout *to);
/* Walks the lists in due order: every timeout on a later list is due at a
   later tick than every one on an earlier list, and each list is in
   scheduling order.  The never list comes last.  Changes nothing. */
void hwt_wheel_visit(const hwt_wheel *w, hwt_wheel_visit_fn fn, void *ctx);

/* Calls fn for every linked timeout, on whatever list (behind the current
   tick, never due, passed over), each once, in no order to rely on; and
   with NULL at the end of each list.  Changes nothing. */
void hwt_wheel_visit_all(const hwt_wheel *w, hwt_wheel_visit_fn fn, void *ctx);

/* Fills `out` with how the linked timeouts spread over the levels. */
void hwt_wheel_occupancy(const hwt_wheel *w, hwt_occupancy *out);

#endif /* HWT_WHEEL_H */
