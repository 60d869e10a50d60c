"""The overlapped F&B pair (execution/fb_pair.py): the halves interleaved at their all-to-alls.

In one process, the baton with stand-in communications: who runs when, errors from either half, a
communication from a third thread (autograd's) counted as the backward's. On 2 ranks (pp 1 x ep 2: one
pipeline rank holding two stages, a schedule of F&B pairs read from torch's CSV text, an own model with
stagewise.MoE): the generic interleave, no overlap and a user's hook give the same loss and gradients,
equal to the unpipelined model's; every all-to-all is posted before the other micro-batch computes and
waited for after it (the order of events, never their timing); a hook that forgets a half is refused.
"""

from __future__ import annotations

import threading

import pytest
import torch

from stagewise.runtime.execution import fb_pair
from stagewise.runtime.execution.fb_pair import Half, OverlapPair, interleave


class Work:
    """A stand-in for an async collective: records when it is waited for."""

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def wait(self):
        self.log.append(("waited", self.name))


def _pair(forward, backward) -> OverlapPair:
    stage = torch.nn.Linear(1, 1)
    return OverlapPair(op="pair", forward=Half(action="F", stage=stage, run=forward),
                       backward=Half(action="B", stage=stage, run=backward))


def _half(log: list, half: str, comms: list[str]):
    def run():
        for name in comms:
            log.append((half, "compute before", name))
            fb_pair.wait(Work(log, f"{half} {name}"), name)
        log.append((half, "compute to the end", ""))
    return run


def test_the_halves_hand_over_at_each_communication_backward_first():
    log: list = []
    pair = _pair(_half(log, "F", ["dispatch", "combine"]), _half(log, "B", ["combine", "dispatch"]))
    interleave(pair)
    assert log == [("B", "compute before", "combine"),  # the backward starts; it posts its combine and hands over
                   ("F", "compute before", "dispatch"),  # the forward computes while B's combine is in flight
                   ("waited", "B combine"),  # B has the rank again: only now is its all-to-all waited for
                   ("B", "compute before", "dispatch"),
                   ("waited", "F dispatch"),
                   ("F", "compute before", "combine"),
                   ("waited", "B dispatch"),
                   ("B", "compute to the end", ""),
                   ("waited", "F combine"),  # B ended: F waits for its combine at once
                   ("F", "compute to the end", "")]
    kinds = [(e.half, e.what, e.name) for e in pair.events]
    assert kinds[:4] == [("B", "start", ""), ("B", "post", "combine"), ("F", "start", ""), ("F", "post", "dispatch")]
    assert kinds[-1] == ("F", "end", "")
    assert fb_pair._current is None  # outside a pair, a wait is a plain wait


def test_a_half_without_communication_runs_to_its_end_first():
    log: list = []
    interleave(_pair(_half(log, "F", ["dispatch"]), _half(log, "B", [])))
    assert log == [("B", "compute to the end", ""), ("F", "compute before", "dispatch"), ("waited", "F dispatch"),
                   ("F", "compute to the end", "")]


@pytest.mark.parametrize("failing", ["F", "B"])
def test_an_error_in_either_half_is_raised_on_the_callers_thread_after_both_stop(failing):
    log: list = []

    def boom():
        fb_pair.wait(Work(log, "x"), "dispatch")
        raise RuntimeError(f"{failing} failed")

    good = _half(log, "B" if failing == "F" else "F", ["combine"])
    pair = _pair(boom, good) if failing == "F" else _pair(good, boom)
    with pytest.raises(RuntimeError, match=f"{failing} failed"):
        interleave(pair)
    assert pair.events[-1].what == "end" and {e.half for e in pair.events if e.what == "end"} == {"F", "B"}


def test_a_communication_from_another_thread_inside_the_backward_counts_as_the_backward():
    """Autograd runs a GPU backward's nodes on its own threads: whatever is not the forward's thread is B."""
    log: list = []

    def backward():
        t = threading.Thread(target=lambda: fb_pair.wait(Work(log, "B combine"), "combine"))
        t.start()
        t.join()

    pair = _pair(_half(log, "F", ["dispatch"]), backward)
    interleave(pair)
    assert [(e.half, e.what) for e in pair.events][:3] == [("B", "start"), ("B", "post"), ("F", "start")]


# ---- on ranks: pp 1 x ep 2, a schedule of F&B pairs on one pipeline rank

PAIRS = ("0F0,1F0,(0F1;1B0)OVERLAP_F_B,(1F1;0B0)OVERLAP_F_B,(0F2;1B1)OVERLAP_F_B,(1F2;0B1)OVERLAP_F_B,"
         "(0F3;1B2)OVERLAP_F_B,(1F3;0B2)OVERLAP_F_B,1B3,0B3\n")


@pytest.fixture(scope="module")
def ranks():
    import stagewise
    from stagewise.torch_csv import loads
    from runtime_helpers import backward_first, forward_only_hook, pipelined_own_moe

    sched = loads(PAIRS, "pairs")
    cases = [("interleaved", sched, {"ep": 2}), ("sequential", sched, {"ep": 2, "overlap": False}),
             ("backward first", sched, {"ep": 2, "overlap": backward_first}),
             ("forgets a half", sched, {"ep": 2, "overlap": forward_only_hook})]
    return stagewise.launch(pipelined_own_moe, 2, cases, 8, 2, capacity=1.0, timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_interleaved_sequential_and_a_users_hook_equal_each_other_and_the_unpipelined_model(ranks):
    from runtime_helpers import own_moe_reference, rel_err

    loss, grads = own_moe_reference(8, 2, capacity=1.0)
    base_loss, base_grads, _ = ranks["sequential"]
    for label in ("interleaved", "backward first"):
        got_loss, got_grads, _ = ranks[label]
        assert got_loss == base_loss, label  # the same operations in the same order per half: bitwise
        for mine, theirs in zip(got_grads, base_grads):
            assert mine.keys() == theirs.keys()
            assert all(torch.equal(mine[n], theirs[n]) for n in mine), label
    assert base_loss == pytest.approx(loss, rel=1e-5)
    for per_rank in base_grads:
        for name, g in per_rank.items():
            assert rel_err(g, grads[name]) <= 1e-5, name


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_all_to_all_is_posted_before_the_other_half_computes_and_waited_after(ranks):
    _, _, per_rank = ranks["interleaved"]
    for rank, pairs in enumerate(per_rank):
        assert len(pairs) == 6, rank  # every F&B pair went through the interleave
        for op, events in pairs:
            posts = [k for k, e in enumerate(events) if e[1] == "post"]
            assert len(posts) == 4, (op, events)  # each half: a dispatch and a combine
            for k in posts:
                half, _, name = events[k]
                waited = next(j for j in range(k, len(events)) if events[j] == (half, "waited", name))
                other_ended = any(e == (other(half), "end", "") for e in events[:k])
                if other_ended:
                    continue
                between = events[k + 1:waited]
                assert between and between[0][0] == other(half) and between[0][1] in ("start", "resume"), (op, k)
            assert [e[:2] for e in events[:2]] == [("B", "start"), ("B", "post")]
    _, _, sequential = ranks["sequential"]
    assert all(pairs == [] for pairs in sequential)  # no hook: nothing interleaved


@pytest.mark.slow
def test_a_hook_that_forgets_a_half_is_refused_naming_it(ranks):
    msg = ranks["forgets a half"]
    assert "`overlap` hook returned without running the pair's 1B0 ((0F1;1B0)OVERLAP_F_B)" in msg


def other(half: str) -> str:
    return "F" if half == "B" else "B"
