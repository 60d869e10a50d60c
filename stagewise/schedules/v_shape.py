"""V-Half and V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024, arXiv:2405.15362).

Like ZB-V, the model is cut into 2p stages in a V: rank r holds stage r (chunk
0, on the way down) and stage 2p-1-r (chunk 1, on the way back up). The paper
builds a schedule by repeating one *building block* per micro-batch every 6
unit slots (F, F, I, I, W, W of the rank's two chunks); the block's offsets on
each rank set its lifespan, and the lifespan sets the peak memory:

- V-Half: peak (p+2)//2 micro-batches of a rank's share (half of 1F1B's p),
  bubble about half of 1F1B's when F = I = W;
- V-Min: peak (p+4)//3 (a third), bubble about 2/3 of 1F1B's.

Three passes make the order, all on the slot grid: repeat the block; put each
owed W in the first free slot after its I; *squeeze* the warm-up and the
cool-down, moving each action to the earliest free slot after its
dependencies that keeps the rank's peak. The W's are then placed again into
the slots the squeeze freed. The program is each rank's slots in order; the
simulator times it with real costs.

A long step is not squeezed slot by slot: past a few micro-batches more than p
(``steady_from``: p+4 or p+5 for V-Half, about 2p/3 + 4 for V-Min) the warm-up
and the cool-down no longer touch, and between them each rank repeats one period
of six actions, a micro-batch on each time. The step is built at ``steady_from``
and the periods it lacks are spliced into each rank's program one period after
the warm-up, every later action that many micro-batches on. The splice checks
its own premise (two periods that repeat at the cut) and builds the step in full
where it fails; a test holds the spliced programs equal to the full build.
"""

from __future__ import annotations

import bisect
from functools import lru_cache

from ..actions import Action, new
from ..schedule import Schedule, make

CYCLE = 6  #: slots of one building block on a rank: F, F, I, I, W, W


def v_half(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    return _v_schedule("v-half", ranks, microbatches, half_offsets)


def v_min(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    return _v_schedule("v-min", ranks, microbatches, min_offsets)


def half_offsets(p: int, r: int) -> tuple[int, int, int, int]:
    """Block slots of rank r's F(down), F(up), I(up), I(down) for V-Half (the paper's Figure 4b)."""
    gap = 3 if p % 2 == 0 else 0  # keeps the block's slots apart on an even number of ranks
    return 2 * r, 3 * p - r - 2, 3 * p + gap + 2 * r - 1, 6 * p + gap - r - 2


def min_offsets(p: int, r: int) -> tuple[int, int, int, int]:
    """Block slots of rank r's F(down), F(up), I(up), I(down) for V-Min (the paper's Figure 4a)."""
    gap = 2 if p % 3 == 0 else 0
    return r, 2 * p - r - 1, 2 * p + gap + r, 4 * p + gap - r - 1


#: the first slot the cool-down's squeezes change, counted from ``cool_start`` (measured: see "long steps")
_COOL_FIRST = {half_offsets: -1, min_offsets: 6}


def _v_schedule(name: str, p: int, m: int, offsets) -> Schedule:
    """The schedule at ``m``: built in full up to ``steady_from``, spliced from the one built there beyond."""
    m0 = steady_from(p, offsets)
    if m > m0:
        cuts = _periodic_at(p, offsets, _cut(p, offsets))
        if cuts is not None:
            return make(name, _splice(cuts, m - m0), _placement(p), m)
    return _full(name, p, m, offsets)


def _full(name: str, p: int, m: int, offsets) -> Schedule:
    """The schedule built slot by slot at ``m`` (what ``_v_schedule`` returns, at any length)."""
    return make(name, _grid(p, m, offsets).programs(), _placement(p), m)


def _placement(p: int) -> list[int]:
    return [s if s < p else 2 * p - 1 - s for s in range(2 * p)]


def _grid(p: int, m: int, offsets) -> _Grid:
    grid = _Grid(p, m)
    for r in range(p):
        down, up = r, 2 * p - 1 - r
        for (kind, stage), first in zip((("F", down), ("F", up), ("I", up), ("I", down)), offsets(p, r)):
            for mb in range(m):
                grid.put(r, new(Action, (kind, stage, mb)), first + CYCLE * mb)
    grid.place_ws()
    grid.squeeze(with_w=True)  # the warm-up and the cool-down, W's included
    grid.drop_ws()
    grid.squeeze(with_w=False)  # the cool-down again, now that the W's are out of the way
    grid.place_ws()
    return grid


# --- long steps: the steady state spliced in ----------------------------------------------------
#
# The squeeze moves only actions before ``warm_end`` (I of stage 0, mb 0, at slot ``offsets(p, 0)[3]``) and
# from ``cool_start`` (F of stage 0, mb m-1, at slot CYCLE x (m-1)) on; between them each slot keeps the
# block's action and the W's fill the rest, one period of CYCLE slots per micro-batch. Once the cool-down
# starts after the warm-up ends (CYCLE x (m-1) > warm_end; before that the squeeze never reaches its
# cool-down phase), the two no longer see each other:
# - the limit: the peak before the squeeze is the largest of the warm-up's, the repeating middle's and the
#   cool-down's, each the same at every such m (the middle repeats; the cool-down is the same pattern later);
# - the warm-up: squeezed first, in slot order, into earlier slots, after earlier dependencies, against
#   that limit: nothing in it depends on m;
# - the cool-down: its moves look back only to their own previous micro-batch and their dependencies, in the
#   middle, where the grid and the scans' states (live, owed W's) repeat every period, so they are the
#   moves at any shorter such m, CYCLE slots and one micro-batch later per period more;
# - the W's: placed by a left-to-right scan whose owed queues repeat in the middle as well.
# Measured on the grids (p up to 64): from 4 slots after ``warm_end`` on, each slot holds the one CYCLE
# before, a micro-batch on, up to where the cool-down first changes a slot: 1 before ``cool_start`` (V-Half)
# or 6 after it (V-Min), ``_COOL_FIRST``. ``_cut`` lies past the first, and ``steady_from`` is the fewest
# micro-batches that keep the two periods from ``_cut`` (which ``_periodic_at`` checks) before the second.
# The splice itself is exact a little earlier (from the first separated m + 1, p up to 24), with no checked
# period there. tests/test_schedules_v_shape.py holds the spliced programs equal to the full build.


def _cut(p: int, offsets) -> int:
    """The slot the periods are spliced in at: one period after the warm-up ends."""
    return offsets(p, 0)[3] + CYCLE


def steady_from(p: int, offsets) -> int:
    """The micro-batch count a longer step is spliced from: the fewest whose cool-down changes no slot of the
    two periods from ``_cut`` (V-Half: p+5 for even p, p+4 for odd; V-Min: (4p+gap-1)//6 + 4, gap 2 where
    3 divides p, else 0)."""
    last = _cut(p, offsets) + 2 * CYCLE - 1  # the last slot ``_periodic_at`` reads
    return (last - _COOL_FIRST[offsets]) // CYCLE + 2  # the fewest m with CYCLE x (m-1) + first > last


_Cut = tuple[tuple[Action, ...], tuple[Action, ...]]  #: a rank's program: the actions before the cut, from it on


@lru_cache(maxsize=16)  # the planner asks for several m at one p: the build at ``steady_from`` serves them all
def _periodic_at(p: int, offsets, cut: int) -> tuple[_Cut, ...] | None:
    """Each rank's program at ``steady_from`` cut at slot ``cut`` (the actions before, those from it on), or
    None where the grid is not one repeating period there (the window from ``cut`` and the one after it,
    each of the rank's six (kind, stage) once): the caller then builds the step in full."""
    grid = _grid(p, steady_from(p, offsets), offsets)
    cuts = []
    for slots in grid.slots:
        window = [slots.get(t) for t in range(cut, cut + 2 * CYCLE)]
        if None in window or len({(a.kind, a.stage) for a in window[:CYCLE]}) != CYCLE:
            return None
        if any(b != (a.kind, a.stage, a.mb + 1) for a, b in zip(window, window[CYCLE:])):
            return None
        order = sorted(slots)
        at = bisect.bisect_left(order, cut)
        cuts.append((tuple(slots[t] for t in order[:at]), tuple(slots[t] for t in order[at:])))
    return tuple(cuts)


def _splice(cuts: tuple[_Cut, ...], more: int) -> list[list[Action]]:
    """Each rank's program with ``more`` periods (the first CYCLE actions from the cut, one micro-batch on
    each time) spliced in at the cut, and every later action ``more`` micro-batches on."""
    programs = []
    for before, after in cuts:
        periods = [new(Action, (a.kind, a.stage, a.mb + k)) for k in range(more) for a in after[:CYCLE]]
        programs.append([*before, *periods, *(new(Action, (a.kind, a.stage, a.mb + more)) for a in after)])
    return programs


class _PrefixMax:
    """The largest prefix sum of per-slot weights (+1 at F, -1 at W), kept under point updates: the peak of
    a rank whose W's are in the grid, in O(log slots) per move instead of a scan (the same value)."""

    def __init__(self, weights: dict[int, int]):
        self.n = n = 1 << max(1, max(weights, default=0).bit_length() + 1)
        total = self.sum = [0] * (2 * n)
        best = self.best = [0] * (2 * n)  # the largest prefix sum within the node, the empty prefix (0) included
        for i, w in weights.items():
            total[n + i], best[n + i] = w, max(0, w)
        for k in range(n - 1, 0, -1):  # ``_pull`` written out: the trees are built once per rank and squeeze
            left = 2 * k
            sl = total[left]
            total[k] = sl + total[left + 1]
            x, y = best[left], sl + best[left + 1]
            best[k] = x if x > y else y

    def _pull(self, k: int) -> None:
        left, right = 2 * k, 2 * k + 1
        self.sum[k] = self.sum[left] + self.sum[right]
        self.best[k] = max(self.best[left], self.sum[left] + self.best[right])

    def set(self, i: int, w: int) -> None:
        if i >= self.n:  # a slot past the end: rebuild larger
            self.__init__({**{k: x for k in range(self.n) if (x := self.sum[self.n + k])}, i: w})
            return
        total, best = self.sum, self.best
        k = i + self.n
        total[k], best[k] = w, w if w > 0 else 0
        k >>= 1
        while k:  # ``_pull`` up to the root, written out (every move of a squeeze makes two of these)
            left = 2 * k
            sl = total[left]
            total[k] = sl + total[left + 1]
            x, y = best[left], sl + best[left + 1]
            best[k] = x if x > y else y
            k >>= 1

    @property
    def peak(self) -> int:
        return self.best[1]

    def raised(self, lo: int, hi: int) -> int:
        """The peak once an F moves from slot ``hi`` to the free slot ``lo``: every prefix in [lo, hi) gains one
        (a free ``lo`` adds nothing to the prefix before it, so that one may count too)."""
        total, i = 0, lo + self.n
        while i > 1:  # the sum of the slots before lo: the left siblings on the way up
            if i & 1:
                total += self.sum[i - 1]
            i //= 2
        run, best, rights = 0, 0, []
        i, j = lo + self.n, hi + self.n
        while i < j:  # the nodes covering [lo, hi), in order
            if i & 1:
                best, run = max(best, run + self.best[i]), run + self.sum[i]
                i += 1
            if j & 1:
                j -= 1
                rights.append(j)
            i //= 2
            j //= 2
        for k in reversed(rights):
            best, run = max(best, run + self.best[k]), run + self.sum[k]
        return max(self.peak, total + best + 1)


_WEIGHT = {"F": 1, "W": -1}


class _Grid:
    """Unit slots of each rank and the action in each. Mutable: the passes rewrite it in place.

    While a squeeze runs, each rank's peak is kept incrementally (``_track``): with the W's in the grid a
    prefix-max tree; without them, the scan's state after each occupied slot, resumed from the first slot a
    move touched. Both give what a full scan gives (``_full_peak``)."""

    def __init__(self, p: int, m: int):
        self.p, self.m = p, m
        self.slots: list[dict[int, Action]] = [{} for _ in range(p)]
        self.at: dict[Action, int] = {}
        self._tracking: bool | None = None  # None: no squeeze running; else its with_w
        self._trees: list[_PrefixMax] = []
        self._keys: list[list[int]] = []  # without W's: occupied slots in order, and the scan's states
        self._states: list[list[tuple[int, int, int, int]]] = []

    def rank_of(self, stage: int) -> int:
        return stage if stage < self.p else 2 * self.p - 1 - stage

    def put(self, r: int, a: Action, slot: int) -> None:
        self.slots[r][slot] = a
        self.at[a] = slot
        if self._tracking is True and a.kind in _WEIGHT:
            self._trees[r].set(slot, _WEIGHT[a.kind])
        elif self._tracking is False:
            keys = self._keys[r]
            i = bisect.bisect_left(keys, slot)
            keys.insert(i, slot)
            del self._states[r][i:]

    def move(self, r: int, a: Action, slot: int) -> None:
        self._clear(r, self.at[a])
        self.put(r, a, slot)

    def _clear(self, r: int, slot: int) -> None:
        a = self.slots[r].pop(slot)
        if self._tracking is True and a.kind in _WEIGHT:
            self._trees[r].set(slot, 0)
        elif self._tracking is False:
            keys = self._keys[r]
            i = bisect.bisect_left(keys, slot)
            keys.pop(i)
            del self._states[r][i:]

    def _track(self, with_w: bool | None) -> None:
        """Start (with_w True/False) or stop (None) keeping each rank's peak incrementally."""
        self._tracking = with_w
        if with_w is True:
            self._trees = [_PrefixMax({t: _WEIGHT[a.kind] for t, a in slots.items() if a.kind in _WEIGHT})
                           for slots in self.slots]
        elif with_w is False:
            self._keys = [sorted(slots) for slots in self.slots]
            self._states = [[] for _ in self.slots]

    def place_ws(self) -> None:
        """Each free slot takes the oldest W owed (chunk 1's first, as its I's unblock the rank before)."""
        for r in range(self.p):
            up, down = 2 * self.p - 1 - r, r
            owed: dict[int, list[int]] = {up: [], down: []}
            slot, last = 0, max(self.slots[r])
            while slot <= last or owed[up] or owed[down]:
                a = self.slots[r].get(slot)
                if a is not None and a.kind == "I":
                    owed[a.stage].append(a.mb)
                elif a is None:
                    stage = up if owed[up] else down if owed[down] else None
                    if stage is not None:
                        self.put(r, new(Action, ("W", stage, owed[stage].pop(0))), slot)
                slot += 1

    def drop_ws(self) -> None:
        for r in range(self.p):
            for slot, a in list(self.slots[r].items()):
                if a.kind == "W":
                    self._clear(r, slot)
                    del self.at[a]

    def peak(self, r: int, with_w: bool) -> int:
        """Live activations of rank r at its fullest: +1 at F, -1 at W (W's not in the grid yet take free slots)."""
        if self._tracking is True and with_w:  # every W is in the grid: the largest prefix sum
            return self._trees[r].peak
        if self._tracking is False and not with_w:
            return self._resume(r)
        return self._full_peak(r, with_w)

    def _full_peak(self, r: int, with_w: bool) -> int:
        live = peak = owed = prev = 0
        slots = self.slots[r]
        for slot in sorted(slots):  # occupied slots only: a run of free ones pays owed W's at once
            live, peak, owed, prev = self._step(slots[slot], slot, live, peak, owed, prev, with_w)
        return peak

    @staticmethod
    def _step(a: Action, slot: int, live: int, peak: int, owed: int, prev: int, with_w: bool):
        """The scan's state after occupied ``slot``: the free slots since ``prev`` pay owed W's, then ``a``."""
        if owed:
            paid = min(owed, slot - prev - 1)
            live, owed = live - paid, owed - paid
        if a.kind == "F":
            live += 1
            peak = max(peak, live)
        elif a.kind == "W":
            live -= 1
        elif not with_w:
            owed += 1
        return live, peak, owed, slot

    def _resume(self, r: int) -> int:
        """The W-less scan of rank r, resumed after the last slot no move has touched."""
        keys, states, slots = self._keys[r], self._states[r], self.slots[r]
        live, peak, owed, prev = states[-1] if states else (0, 0, 0, 0)
        for slot in keys[len(states):]:  # ``_step(..., with_w=False)`` written out: the W-less squeeze's hot loop
            if owed:
                paid = slot - prev - 1
                if paid > owed:
                    paid = owed
                live -= paid
                owed -= paid
            kind = slots[slot].kind
            if kind == "F":
                live += 1
                if live > peak:
                    peak = live
            elif kind == "W":
                live -= 1
            else:
                owed += 1
            prev = slot
            states.append((live, peak, owed, prev))
        return peak

    def earliest(self, a: Action) -> int:
        """The first slot after a's dependencies: the chain of its micro-batch and its own previous one."""
        kind, s, mb = a
        at = self.at
        deps = []  # plain tuples: equal to, and hashed as, the Actions that key ``at``
        if kind == "F" and s > 0:
            deps.append(("F", s - 1, mb))
        if kind == "I":
            deps.append(("F", s, mb))
            if s < 2 * self.p - 1:
                deps.append(("I", s + 1, mb))
        if kind == "W":
            deps.append(("I", s, mb))
        if mb > 0:
            deps.append((kind, s, mb - 1))
        best = 0
        for d in deps:
            t = at.get(d)
            if t is not None and t >= best:
                best = t + 1
        return best

    def squeeze(self, *, with_w: bool) -> None:
        """Move each warm-up (only ``with_w``) and cool-down action to the earliest free slot that keeps the peak.

        The warm-up ends when rank 0 first runs I of stage 0 (a micro-batch went down and up the V);
        the cool-down starts after the first forward of the last micro-batch on stage 0.
        """
        self._track(with_w)
        limit = max(self.peak(r, with_w) for r in range(self.p))
        order = sorted(self.at.items(), key=lambda x: (x[1], self.rank_of(x[0].stage), x[0].stage))
        phase = 0
        warm_end, cool_start = Action("I", 0, 0), Action("F", 0, self.m - 1)
        for a, slot in order:
            if phase == 0 and a == warm_end:
                phase = 1
            if phase == 1:
                if a == cool_start:
                    phase = 2
                continue
            if phase == 0 and not with_w:
                continue
            r = self.rank_of(a.stage)
            # with the W's counted, only an earlier F can raise the peak (an I counts nothing, an earlier W
            # frees sooner): the others take the first free slot without the O(slots) peak scan
            sure = with_w and a.kind != "F"
            for t in range(self.earliest(a), slot):
                if t not in self.slots[r]:
                    if self._tracking is True and a.kind == "F":  # the peak after the move, without making it
                        if self._trees[r].raised(t, slot) <= limit:
                            self.move(r, a, t)
                            break
                        continue
                    self.move(r, a, t)
                    if sure or self.peak(r, with_w) <= limit:
                        break
                    self.move(r, a, slot)
        self._track(None)

    def programs(self) -> list[list[Action]]:
        return [[slots[t] for t in sorted(slots)] for slots in self.slots]
