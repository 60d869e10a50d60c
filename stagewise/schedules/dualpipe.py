"""DualPipe (DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv:2412.19437).

Micro-batches enter from both ends. Lane 0 runs stages 0..p-1 on ranks
0..p-1 with micro-batches 0..m/2-1; lane 1 is a second copy of the model, its
stage p+s on rank p-1-s, fed micro-batches m/2..m-1 from the last rank. Each
rank so holds one stage of each lane (two parameter copies).

Every rank runs the same eight steps (as in deepseek-ai/DualPipe). A rank
calls *phase 0* the lane that starts nearer to it, *phase 1* the other one;
``half_rank`` is its distance to the nearer end. The main step overlaps a
forward of one phase with a backward of the other (``F&B`` pairs); the first
and last steps split the backward into I and W to fill the bubbles, the W's
run in the order their I's ran. DualPipeV runs the same steps on a V.
"""

from __future__ import annotations

from collections import deque, namedtuple

from ..actions import Action, Pair, new
from ..schedule import Lane, Schedule, make


def dualpipe(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p, m = ranks, microbatches
    half = m // 2  # micro-batches per lane
    programs = []
    for r in range(p):
        near_end = r < p // 2  # lane 0 starts on rank 0, lane 1 on rank p-1
        lane0 = (r, 0)
        lane1 = (2 * p - 1 - r, half)  # stage p+s on rank p-1-s
        phase0, phase1 = (lane0, lane1) if near_end else (lane1, lane0)
        programs.append(eight_steps(min(r, p - 1 - r), p // 2, half, phase0, phase1))
    placement = list(range(p)) + [p - 1 - s for s in range(p)]
    lanes = (Lane(stage_lo=0, stage_hi=p, mb_lo=0, mb_hi=half), Lane(stage_lo=p, stage_hi=2 * p, mb_lo=half, mb_hi=m))
    return make("dualpipe", programs, placement, m, lanes)


class Steps(namedtuple("Steps", [f"step_{k}" for k in range(1, 9)])):
    """How many times each of DualPipe's eight steps repeats on one rank (the paper's n of each step):
    ``step_1`` nF0, ``step_2`` nF0F1, ``step_3`` nI1W1F1, ``step_4`` n(F0&B1)(F1&B0) (the main step),
    ``step_5`` nB1(F1&B0), ``step_6`` nB1B0, ``step_7`` nWI0, ``step_8`` nW."""

    __slots__ = ()


def steps(h: int, H: int, n: int) -> Steps:
    """Step lengths of the rank at distance ``h`` from its nearer end, of ``H``, with ``n`` micro-batches a phase."""
    return Steps(step_1=2 * (H - h - 1), step_2=h + 1, step_3=H - h - 1, step_4=n - 2 * H + h + 1,
                 step_5=H - h - 1, step_6=h + 1, step_7=H - h - 1, step_8=h + 1)


def overlapped_pairs(h: int, H: int, n: int) -> int:
    """F&B pairs one rank runs: two per main step (the middle rank's first is not overlapped), one per step 5."""
    st = steps(h, H, n)
    return 2 * st.step_4 - (h == H - 1) + st.step_5


def pairs(ranks: int, microbatches: int) -> list[int]:
    """DualPipe's F&B pairs per rank."""
    H, n = ranks // 2, microbatches // 2
    return [overlapped_pairs(min(r, ranks - 1 - r), H, n) for r in range(ranks)]


class _Chunk:
    """The stage a rank runs in one phase and its next F and B micro-batch (a cursor, hence mutable)."""

    __slots__ = ("stage", "first", "f", "b")

    def __init__(self, stage: int, first_mb: int):
        self.stage, self.first, self.f, self.b = stage, first_mb, first_mb, first_mb

    def done(self, n: int) -> bool:
        return self.f == self.b == self.first + n

    def forward(self) -> Action:
        self.f += 1
        return new(Action, ("F", self.stage, self.f - 1))

    def backward(self, kind: str = "B") -> Action:
        self.b += 1
        return new(Action, (kind, self.stage, self.b - 1))


def eight_steps(half_rank: int, half_ranks: int, chunks: int, phase0: tuple[int, int],
                phase1: tuple[int, int]) -> list:
    """One rank's program: DualPipe's eight steps.

    ``half_rank`` is the rank's distance to its nearer end, ``half_ranks`` the
    number of such distances, ``chunks`` the micro-batches per phase, and each
    phase is (stage, first micro-batch).
    """
    h, H, n = half_rank, half_ranks, chunks
    st = steps(h, H, n)
    c0, c1 = _Chunk(*phase0), _Chunk(*phase1)
    middle = h == H - 1  # where the two directions meet
    prog: list = []
    pending_w: deque[Action] = deque()  # W's owed, in the order of their I's

    def split_backward(chunk: _Chunk) -> Action:
        i = chunk.backward("I")
        pending_w.append(new(Action, ("W", i.stage, i.mb)))
        return i

    # Step 1: nF0
    prog += [c0.forward() for _ in range(st.step_1)]
    # Step 2: nF0F1
    for _ in range(st.step_2):
        prog += (c0.forward(), c1.forward())
    # Step 3: nI1W1F1 (zero bubble)
    for _ in range(st.step_3):
        prog.append(split_backward(c1))
        prog += (pending_w.popleft(), c1.forward())
    # Step 4 (main step): n(F0&B1)(F1&B0)
    for i in range(st.step_4):
        if i == 0 and middle:  # not overlapped: the other direction's B is what the F's wait for
            prog += (c0.forward(), c1.backward())
        else:
            prog.append(Pair(c0.forward(), c1.backward()))
        prog.append(Pair(c1.forward(), c0.backward()))
    # Step 5: nB1(F1&B0)
    for _ in range(st.step_5):
        prog += (c1.backward(), Pair(c1.forward(), c0.backward()))
    # Step 6: nB1B0, the second half with split backward
    split = False
    for i in range(st.step_6):
        if i == st.step_6 // 2 and h % 2 == 1:
            split = True
        prog.append(split_backward(c1) if split else c1.backward())
        if i == st.step_6 // 2 and h % 2 == 0:
            split = True
        prog.append(split_backward(c0) if split else c0.backward())
    # Step 7: nWI0 (zero bubble)
    for _ in range(st.step_7):
        prog.append(pending_w.popleft())
        prog.append(split_backward(c0))
    # Step 8: nW
    prog += [pending_w.popleft() for _ in range(st.step_8)]
    assert not pending_w and c0.done(n) and c1.done(n), "every micro-batch forward and backward once"
    return prog
