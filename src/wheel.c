/*
 * wheel.c: the hierarchical timing wheel (see wheel.h for its layout and
 * why a cascade keeps timeouts of one tick in scheduling order).
 *
 * Lists are intrusive and circular around a head in w->heads; a head whose
 * `next` is NULL was never used (calloc's zero pages stay unmapped for a
 * large level 0).  Index p of w->heads: level 0's bucket p for p < n; level
 * 1 + (p - n) / 64, slot (p - n) % 64 below n + 64 * levels; then the never
 * list and the cancelled list.
 *
 * A timeout's flags say which level it is on and its index there.  No
 * timeout waits in a bucket behind the current tick: expiry moves the
 * cancelled or reset ones it passes over to a list of their own.
 */
#include "wheel.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- where things are ---- */

static inline uint32_t size0(const hwt_wheel *w)
{
    return w->mask + 1;
}

static inline uint32_t never_index(const hwt_wheel *w)
{
    return size0(w) + HWT_WHEEL_SLOTS * w->levels;
}

static inline uint32_t cancelled_index(const hwt_wheel *w)
{
    return never_index(w) + 1;
}

/* log2 of the ticks one slot of level k >= 1 spans. */
static inline unsigned slot_shift(const hwt_wheel *w, unsigned k)
{
    return w->bits + 6 * (k - 1);
}

/* The level of list p: 0 .. levels; levels + 1 the never list, levels + 2
   the cancelled list. */
static inline unsigned level_of(const hwt_wheel *w, uint32_t p)
{
    if (p >= never_index(w))
        return w->levels + 1 + (p - never_index(w));
    return p < size0(w) ? 0 : 1 + (p - size0(w)) / HWT_WHEEL_SLOTS;
}

/* The first tick of the block of 2**shift ticks that holds `tick`. */
static inline int64_t block_start(int64_t tick, unsigned shift)
{
    return shift >= 63 ? 0 : tick & ~((INT64_C(1) << shift) - 1);
}

/* The tick a timeout is due at, inserted now: the first tick that ends at
   or after its deadline (one on a tick boundary is due at the tick that
   ends there, as on a punctual timer, never early), and never before the
   current tick (a deadline already past fires at the current tick's end). */
static inline int64_t due_tick(const hwt_wheel *w, const hwt_timeout *to)
{
    int64_t deadline = hwt_timeout_deadline(to);
    int64_t calc = deadline <= 0 ? 0 : (deadline - 1) / w->tick_ns;
    return calc > w->elapsed ? calc : w->elapsed;
}

/* The list for a timeout due at tick `due` >= elapsed: the same for one
   inserted now and for one inserted earlier and still linked. */
static uint32_t list_for(const hwt_wheel *w, int64_t due)
{
    uint64_t differ = (uint64_t)due ^ (uint64_t)w->elapsed;
    if (!(differ >> w->bits))
        return (uint32_t)due & w->mask; /* in the current turn of level 0 */
    unsigned top = 63 - (unsigned)__builtin_clzll(differ);
    unsigned k = (top - w->bits) / 6 + 1;
    uint32_t slot = (uint32_t)((uint64_t)due >> slot_shift(w, k)) & (HWT_WHEEL_SLOTS - 1);
    return size0(w) + (k - 1) * HWT_WHEEL_SLOTS + slot;
}

/* ---- level 0's bitmap ---- */

static inline void mark_occupied(hwt_wheel *w, uint32_t p)
{
    unsigned k = level_of(w, p);
    if (k > w->levels)
        return; /* the never and cancelled lists have no bit: nothing looks */
    if (k) {
        w->upper[k] |= UINT64_C(1) << ((p - size0(w)) % HWT_WHEEL_SLOTS);
        return;
    }
    size_t word = p >> 6;
    w->occupied[word] |= UINT64_C(1) << (p & 63);
    w->summary[word >> 6] |= UINT64_C(1) << (word & 63);
}

static inline void mark_empty(hwt_wheel *w, uint32_t p)
{
    unsigned k = level_of(w, p);
    if (k > w->levels)
        return;
    if (k) {
        w->upper[k] &= ~(UINT64_C(1) << ((p - size0(w)) % HWT_WHEEL_SLOTS));
        return;
    }
    size_t word = p >> 6;
    w->occupied[word] &= ~(UINT64_C(1) << (p & 63));
    if (!w->occupied[word])
        w->summary[word >> 6] &= ~(UINT64_C(1) << (word & 63));
}

/* Returns the first occupied level-0 bucket >= from, or -1. */
static int64_t first_occupied_from(const hwt_wheel *w, uint32_t from)
{
    size_t word = from >> 6;
    uint64_t bits = w->occupied[word] & (~UINT64_C(0) << (from & 63));
    if (bits)
        return (int64_t)((word << 6) | (size_t)__builtin_ctzll(bits));
    size_t sw = (word + 1) >> 6;
    if (sw >= w->summary_words)
        return -1;
    uint64_t sbits =
        (word + 1) & 63 ? w->summary[sw] & (~UINT64_C(0) << ((word + 1) & 63)) : w->summary[sw];
    for (;;) {
        if (sbits) {
            size_t found = (sw << 6) | (size_t)__builtin_ctzll(sbits);
            return (int64_t)((found << 6) | (size_t)__builtin_ctzll(w->occupied[found]));
        }
        if (++sw >= w->summary_words)
            return -1;
        sbits = w->summary[sw];
    }
}

/* ---- lists ---- */

static void link_at(hwt_wheel *w, uint32_t p, hwt_timeout *to)
{
    hwt_link *head = &w->heads[p];
    if (!head->next)
        head->next = head->prev = head;
    to->link.prev = head->prev;
    to->link.next = head;
    head->prev->next = &to->link;
    head->prev = &to->link;
    unsigned k = level_of(w, p);
    uint32_t first = k == 0 ? 0 : k <= w->levels ? size0(w) + (k - 1) * HWT_WHEEL_SLOTS : p;
    to->flags = (to->flags & ~(HWT_WHEEL_FLAGS_MASK | HWT_WHEEL_INDEX_MASK)) |
                (uint32_t)(k + 1) << HWT_WHEEL_FLAGS_SHIFT | (p - first) << HWT_WHEEL_INDEX_SHIFT;
    if (w->counts[p]++ == 0)
        mark_occupied(w, p);
    w->linked[k]++;
}

/* The list `to` (linked) is on, from its flags. */
static uint32_t list_of(const hwt_wheel *w, const hwt_timeout *to)
{
    unsigned k = ((to->flags & HWT_WHEEL_FLAGS_MASK) >> HWT_WHEEL_FLAGS_SHIFT) - 1;
    uint32_t i = (to->flags & HWT_WHEEL_INDEX_MASK) >> HWT_WHEEL_INDEX_SHIFT;
    if (k > w->levels)
        return k == w->levels + 1 ? never_index(w) : cancelled_index(w);
    return k == 0 ? i : size0(w) + (k - 1) * HWT_WHEEL_SLOTS + i;
}

void hwt_wheel_insert(hwt_wheel *w, hwt_timeout *to)
{
    assert(!hwt_wheel_linked(to));
    uint32_t p =
        hwt_timeout_deadline(to) == HWT_NEVER ? never_index(w) : list_for(w, due_tick(w, to));
    link_at(w, p, to);
}

bool hwt_wheel_linked(const hwt_timeout *to)
{
    return (to->flags & HWT_WHEEL_FLAGS_MASK) != 0;
}

/* Takes `to` off list p, which it is on. */
static void unlink_from(hwt_wheel *w, uint32_t p, hwt_timeout *to)
{
    hwt_link *l = &to->link;
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = NULL;
    to->flags &= ~(HWT_WHEEL_FLAGS_MASK | HWT_WHEEL_INDEX_MASK);
    if (--w->counts[p] == 0)
        mark_empty(w, p);
    w->linked[level_of(w, p)]--;
}

void hwt_wheel_unlink(hwt_wheel *w, hwt_timeout *to)
{
    assert(hwt_wheel_linked(to));
    unlink_from(w, list_of(w, to), to);
}

/* ---- moving the wheel ---- */

int64_t hwt_wheel_next_tick(const hwt_wheel *w)
{
    int64_t now = w->elapsed;
    int64_t b = first_occupied_from(w, (uint32_t)now & w->mask);
    if (b >= 0)
        return (now & ~(int64_t)w->mask) | b;
    /* each level's occupied slots lie after everything on the levels below */
    for (unsigned k = 1; k <= w->levels; k++) {
        unsigned shift = slot_shift(w, k);
        unsigned cur = (unsigned)((uint64_t)now >> shift) & (HWT_WHEEL_SLOTS - 1);
        uint64_t later = cur == 63 ? 0 : w->upper[k] & (~UINT64_C(0) << (cur + 1));
        if (later) {
            uint64_t slot = (uint64_t)__builtin_ctzll(later);
            return block_start(now, shift + 6) | (int64_t)(slot << shift);
        }
    }
    return HWT_NEVER;
}

/* Moves every timeout of list p (a slot that starts at `elapsed`) down to
   where it belongs from here, in order: the lists it lands on hold none of
   its ticks yet (wheel.h), so appending keeps each tick's order. */
static void cascade(hwt_wheel *w, uint32_t p)
{
    hwt_link *head = &w->heads[p];
    hwt_link *from = head->next;
    head->prev->next = NULL; /* the detached list ends here */
    head->next = head->prev = head;
    w->linked[level_of(w, p)] -= w->counts[p];
    w->counts[p] = 0;
    mark_empty(w, p);
    while (from) {
        hwt_timeout *to = hwt_timeout_of(from);
        from = from->next;

        link_at(w, list_for(w, due_tick(w, to)), to);
    }
}

void hwt_wheel_advance(hwt_wheel *w, int64_t tick)
{
    if (tick <= w->elapsed)
        return;
    w->elapsed = tick;
    if (tick & w->mask)
        return; /* inside a turn of level 0: no slot starts here */
    /* a tick starts a slot on at most one occupied level; the higher first */
    for (unsigned k = w->levels; k >= 1; k--) {
        unsigned shift = slot_shift(w, k);
        if (tick & ((INT64_C(1) << shift) - 1))
            continue; /* not a slot boundary of this level */
        uint32_t slot = (uint32_t)((uint64_t)tick >> shift) & (HWT_WHEEL_SLOTS - 1);
        if (w->upper[k] & (UINT64_C(1) << slot))
            cascade(w, size0(w) + (k - 1) * HWT_WHEEL_SLOTS + slot);
    }
}

/* Takes the run, the first n timeouts of list p, off it at once: the
   walk left them linked, and took their wheel flags and back links. */
static void unlink_run(hwt_wheel *w, uint32_t p, hwt_link *last, size_t n)
{
    hwt_link *head = &w->heads[p];
    head->next = last->next;
    last->next->prev = head;
    last->next = NULL;
    w->linked[0] -= n;
    if ((w->counts[p] -= (uint32_t)n) == 0)
        mark_empty(w, p);
}

bool hwt_wheel_expire(hwt_wheel *w, size_t limit, hwt_wheel_expiry *e)
{
    uint32_t p = (uint32_t)w->elapsed & w->mask;
    hwt_link *head = &w->heads[p], *last = NULL;
    e->head = e->tail = NULL;
    e->n = 0;
    if (!head->next)
        return true; /* never used */
    for (hwt_link *l = head->next; l != head && limit--;) {
        hwt_timeout *to = hwt_timeout_of(l);
        l = l->next;
        if (atomic_load_explicit(&to->state, memory_order_relaxed) != HWT_INIT) {
            /* cancelled or reset: its queued entry takes it from there */
            unlink_from(w, p, to);
            link_at(w, cancelled_index(w), to);
            continue;
        }
        atomic_store_explicit(&to->state,
                              hwt_timeout_delivered_running(to) ? HWT_RUNNING : HWT_EXPIRED,
                              memory_order_release);
        if (!e->joins(e->ctx, to)) {
            unlink_from(w, p, to);
            e->take(e->ctx, to);
            continue;
        }
        /* Off the wheel as far as anyone can tell; its forward link stays
           for the run until the walk unlinks the run. */
        to->link.prev = NULL;
        to->flags &= ~(HWT_WHEEL_FLAGS_MASK | HWT_WHEEL_INDEX_MASK);
        last = &to->link;
        e->n++;
    }
    if (e->n) {
        e->head = hwt_timeout_of(head->next);
        e->tail = hwt_timeout_of(last);
        unlink_run(w, p, last, e->n);
    }
    return w->counts[p] == 0;
}

/* ---- looking ---- */

/* Visits list p; returns false if fn stopped the walk. */
static bool visit_list(const hwt_wheel *w, uint32_t p, hwt_wheel_visit_fn fn, void *ctx)
{
    const hwt_link *head = &w->heads[p];
    if (!w->counts[p])
        return true;
    for (hwt_link *l = head->next; l != head; l = l->next)
        if (!fn(ctx, hwt_timeout_of(l)))
            return false;
    return fn(ctx, NULL);
}

/* Visits the occupied buckets of level 0 from bucket `from` to the end;
   returns false if fn stopped the walk. */
static bool visit_level0_from(const hwt_wheel *w, uint32_t from, hwt_wheel_visit_fn fn, void *ctx)
{
    for (int64_t b = first_occupied_from(w, from); b >= 0;
         b = b + 1 < size0(w) ? first_occupied_from(w, (uint32_t)b + 1) : -1)
        if (!visit_list(w, (uint32_t)b, fn, ctx))
            return false;
    return true;
}

void hwt_wheel_visit(const hwt_wheel *w, hwt_wheel_visit_fn fn, void *ctx)
{
    /* level 0 from the current tick to the end of its turn, then each
       level's slots after the current one: the order they fall due in */
    if (!visit_level0_from(w, (uint32_t)w->elapsed & w->mask, fn, ctx))
        return;
    for (unsigned k = 1; k <= w->levels; k++) {
        uint64_t bits = w->upper[k];
        while (bits) {
            uint32_t slot = (uint32_t)__builtin_ctzll(bits);
            bits &= bits - 1;
            if (!visit_list(w, size0(w) + (k - 1) * HWT_WHEEL_SLOTS + slot, fn, ctx))
                return;
        }
    }
    visit_list(w, never_index(w), fn, ctx);
}

void hwt_wheel_visit_all(const hwt_wheel *w, hwt_wheel_visit_fn fn, void *ctx)
{
    /* every bucket of level 0, those behind the current tick included (as
       drain takes them), then every other list, the passed-over one too */
    if (!visit_level0_from(w, 0, fn, ctx))
        return;
    for (uint32_t p = size0(w); p <= cancelled_index(w); p++)
        if (!visit_list(w, p, fn, ctx))
            return;
}

/* Unlinks the first timeout of list p and chains it after *tail. */
static void drain_first(hwt_wheel *w, uint32_t p, hwt_timeout **tail)
{
    hwt_timeout *to = hwt_timeout_of(w->heads[p].next);
    unlink_from(w, p, to);
    (*tail)->link.next = &to->link;
    *tail = to;
}

hwt_timeout *hwt_wheel_drain(hwt_wheel *w)
{
    hwt_timeout first = {0}, *tail = &first;
    /* every bucket of level 0, those behind the current tick included:
       cancelled timeouts may wait there for their cancel */
    for (int64_t b = first_occupied_from(w, 0); b >= 0; b = first_occupied_from(w, 0))
        drain_first(w, (uint32_t)b, &tail);
    for (uint32_t p = size0(w); p <= cancelled_index(w); p++)
        while (w->counts[p])
            drain_first(w, p, &tail);
    tail->link.next = NULL;
    return hwt_timeout_of(first.link.next);
}

void hwt_wheel_occupancy(const hwt_wheel *w, hwt_occupancy *out)
{
    memset(out, 0, sizeof(*out));
    out->levels = 1 + w->levels;
    out->tick = w->elapsed;
    out->never = w->linked[w->levels + 1];
    hwt_level_occupancy *l0 = &out->level[0];
    l0->bucket_ticks = 1;
    l0->buckets = size0(w);
    l0->timeouts = w->linked[0];
    for (int64_t b = first_occupied_from(w, 0); b >= 0;
         b = b + 1 < size0(w) ? first_occupied_from(w, (uint32_t)b + 1) : -1) {
        l0->occupied++;
        if (w->counts[b] > l0->fullest)
            l0->fullest = w->counts[b];
    }
    for (unsigned k = 1; k <= w->levels; k++) {
        hwt_level_occupancy *lk = &out->level[k];
        lk->bucket_ticks = INT64_C(1) << slot_shift(w, k);
        lk->buckets = HWT_WHEEL_SLOTS;
        lk->timeouts = w->linked[k];
        lk->occupied = (uint64_t)__builtin_popcountll(w->upper[k]);
        for (uint32_t s = 0; s < HWT_WHEEL_SLOTS; s++) {
            uint32_t c = w->counts[size0(w) + (k - 1) * HWT_WHEEL_SLOTS + s];
            if (c > lk->fullest)
                lk->fullest = c;
        }
    }
}

/* ---- life cycle ---- */

int hwt_wheel_init(hwt_wheel *w, uint32_t ticks_per_wheel, int64_t tick_ns)
{
    memset(w, 0, sizeof(*w));
    w->tick_ns = tick_ns;
    if (ticks_per_wheel > HWT_WHEEL_MAX_LEVEL0)
        ticks_per_wheel = HWT_WHEEL_MAX_LEVEL0; /* the index must fit in flags */
    w->mask = ticks_per_wheel - 1;
    w->bits = (unsigned)__builtin_ctz(ticks_per_wheel);
    /* enough levels that the top one's slots reach bit 63 of a tick */
    w->levels = (63 - w->bits + 5) / 6;
    w->words = (ticks_per_wheel + 63) / 64;
    w->summary_words = (w->words + 63) / 64;
    size_t lists = (size_t)cancelled_index(w) + 1;
    /* A large level 0 is mostly untouched: calloc keeps its pages unmapped
       until a bucket is first used. */
    w->heads = calloc(lists, sizeof(hwt_link));
    w->counts = calloc(lists, sizeof(uint32_t));
    w->occupied = calloc(w->words, sizeof(uint64_t));
    w->summary = calloc(w->summary_words, sizeof(uint64_t));
    if (!w->heads || !w->counts || !w->occupied || !w->summary) {
        hwt_wheel_destroy(w);
        return ENOMEM;
    }
    return 0;
}

void hwt_wheel_destroy(hwt_wheel *w)
{
    free(w->heads);
    free(w->counts);
    free(w->occupied);
    free(w->summary);
    w->heads = NULL;
    w->counts = NULL;
    w->occupied = w->summary = NULL;
}
