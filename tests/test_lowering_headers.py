"""Message headers in the lowering: where they are, how the engine times them, and the validator's proof
that the shape exchange cannot deadlock (it travels on the data's channel, in the data's order; Megatron-LM
#5100 deadlocked at PP >= 4 with a shape exchange ordered apart from the data)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, strategies as st

from stagewise.comm_actions import (DATA_OF, HEADER_BYTES, HEADERS, P2P, RECV_F_HDR, CommAction,
                                    parse_comm)
from stagewise.costs import Costs
from stagewise.lowering import LoweringOptions, lower
from stagewise.lowering.check import check
from stagewise.lowering.play import simulate_lowered
from stagewise.parallelism import Parallelism
from stagewise.schedules import FAMILIES, generate
from stagewise.schedules.registry import ScheduleArgError
from stagewise.validate import ScheduleError


def texts(low, r: int) -> list[str]:
    return [str(a) for a in low.programs[r]]


def test_every_message_is_preceded_by_its_header_on_both_sides():
    low = lower(generate("1f1b", 2, 2), Parallelism(pp=2), LoweringOptions(headers="every"))
    assert low.text(0) == ("0F0 0SEND_F_HDR0 0SEND_F0 0F1 0SEND_F_HDR1 0SEND_F1 0RECV_B_HDR0 0RECV_B0 0B0 "
                           "0RECV_B_HDR1 0RECV_B1 0B1 0STEP_END")
    assert low.text(1) == ("1RECV_F_HDR0 1RECV_F0 1F0 1B0 1SEND_B_HDR0 1SEND_B0 1RECV_F_HDR1 1RECV_F1 1F1 1B1 "
                           "1SEND_B_HDR1 1SEND_B1 1STEP_END")
    assert parse_comm("1RECV_F_HDR0") == CommAction(RECV_F_HDR, 1, 0)


def test_first_heads_the_first_message_of_each_boundary_and_none_is_the_default():
    sched = generate("interleaved-1f1b", 2, 4, 2)
    first = lower(sched, Parallelism(pp=2), LoweringOptions(headers="first"))
    for r in range(2):
        heads = [a for a in first.programs[r] if type(a) is CommAction and a.kind in HEADERS]
        assert len({(a.kind, a.key[:2]) for a in heads}) == len(heads)  # one per boundary, direction and side
        assert all(a.mb == 0 for a in heads)
    assert lower(sched, Parallelism(pp=2)).programs == \
        lower(sched, Parallelism(pp=2), LoweringOptions(headers="none")).programs
    assert not any(type(a) is CommAction and a.kind in HEADERS for p in lower(sched).programs for a in p)


def test_the_engine_times_a_header_as_a_small_message_on_the_datas_link():
    low = lower(generate("gpipe", 2, 2), Parallelism(pp=2), LoweringOptions(headers="every"))
    tl = simulate_lowered(low, Costs(latency=0.5, bandwidth=1024.0))
    played = tl.meta["played"]
    k = texts(low, 0).index("0SEND_F_HDR0")
    assert played.ends[0][k] - played.starts[0][k] == pytest.approx(HEADER_BYTES / 1024.0 + 0.5)
    assert played.starts[0][k + 1] >= played.starts[0][k] + HEADER_BYTES / 1024.0  # the data after it


def test_a_header_taken_out_of_the_datas_order_is_refused_naming_the_wait_cycle():
    """Rank 1 reads micro-batch 2's header before it sends micro-batch 0's gradient, which rank 0 needs before
    its forward of micro-batch 2 sends that header: the shapes exchanged in another order than the data."""
    low = lower(generate("1f1b", 2, 3), Parallelism(pp=2), LoweringOptions(headers="every"))
    check(low)
    prog = list(low.programs[1])
    early = prog.pop(texts(low, 1).index("1RECV_F_HDR2"))
    prog.insert(texts(low, 1).index("1B0"), early)
    bad = dataclasses.replace(low, programs=(low.programs[0], tuple(prog)))
    with pytest.raises(ScheduleError, match=r"^deadlock: wait cycle: rank 0 position 6 \(0RECV_B_HDR0\) waits for "
                                            r"rank 1; rank 1 position 3 \(1RECV_F_HDR2\) waits for rank 0; back "
                                            r"to rank 0$"):
        check(bad)


def test_headers_swapped_on_a_channel_are_refused_naming_the_place():
    low = lower(generate("1f1b", 2, 3), Parallelism(pp=2), LoweringOptions(headers="every"))
    prog = list(low.programs[1])
    i, j = texts(low, 1).index("1RECV_F_HDR0"), texts(low, 1).index("1RECV_F_HDR1")
    prog[i], prog[j] = prog[j], prog[i]
    with pytest.raises(ScheduleError, match=r"^rank 1 position 0 \(1RECV_F_HDR1\): a header must come right before "
                                            r"its data on its channel \(rank 0 to rank 1\), in the data's order$"):
        check(dataclasses.replace(low, programs=(low.programs[0], tuple(prog))))


def _schedules():
    out = []
    for name in FAMILIES:
        for p in (2, 4):
            for m in (4, 8):
                try:
                    out.append(generate(name, p, m))
                except ScheduleArgError:
                    pass
    return out


SCHEDULES = _schedules()


@given(st.sampled_from(SCHEDULES), st.sampled_from(["first", "every"]),
       st.sampled_from([{}, {"fsdp": 2}, {"dp": 2}, {"fsdp": 2, "reshard_after_forward": True}]),
       st.lists(st.integers(1, 64), min_size=8, max_size=8))
def test_no_family_deadlocks_with_headers_whatever_the_lengths(sched, headers, layout, lengths):
    """Every family, 2 or 4 ranks, 4 or 8 micro-batches, with or without sharding: the lowering with headers
    passes the validator (its play finds no wait cycle) under boundary sizes from sequence lengths, every
    header sits right before its data, and in ``every`` each message has one."""
    from stagewise.lowering.options import Sizes

    sizes = Sizes(boundary=[256.0 * lengths[s % len(lengths)] for s in range(sched.stages)])
    low = check(lower(sched, Parallelism(pp=sched.ranks, **layout), LoweringOptions(headers=headers, sizes=sizes)))
    for prog in low.programs:
        for a, b in zip(prog, prog[1:]):
            if type(a) is CommAction and a.kind in HEADERS:
                assert type(b) is CommAction and b.kind == DATA_OF[a.kind] and b.key == a.key
        if headers == "every":
            data = sum(type(a) is CommAction and a.kind in P2P for a in prog)
            assert sum(type(a) is CommAction and a.kind in HEADERS for a in prog) == data
    simulate_lowered(low, Costs(latency=0.01, bandwidth=4096.0), check=False)
