"""Seq1F1B's published timelines, reproduced: each device's order of slices and when it ends.

Sources: Sun et al., "Seq1F1B: Efficient Sequence-Level Pipeline Parallelism for Large Language Model
Training", NAACL 2025 (arXiv:2406.03488), Figure 1: 1F1B and Seq1F1B on 4 devices, 8 micro-batches, each cut
into 2 sequences (light: sequence 1, dark: sequence 2), a backward drawn twice a forward's width. And the
authors' repository (thunlp/Seq1F1B, picture/seq1f1b_zerobubble.png, shown in its README): ZB-1P and "Seq1F1B
integrated with ZB-1P" on the same shape, F, B (input gradient) and W drawn the same width.

The figures' rows are transcribed below cell by cell (``F3b``: the forward of micro-batch 3's second
sequence; ``B``, and ``I``/``W`` for the split backward), and each device's last cell's right edge was read
off the published PNGs (the first device's first cell starts at x = 332 / 314 px, a forward is 100 px wide
in both full-size images; a cell's border takes ~0.08 of a forward, so the figure's ends read 0.08 short).
The script compares both with `stagewise`'s generators (``seq1f1b``, ``seq1f1b-zb``, ``1f1b``, ``zb-h1``) and the
simulator at t_F = 1, t_B = 2 (t_I = t_W = 1) per micro-batch, a sequence costing half of it.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_seq1f1b.py
"""

from __future__ import annotations

from stagewise.costs import Costs
from stagewise.schedules import generate
from stagewise.simulate import simulate
from stagewise.timeline import metrics

P, M, K = 4, 8, 2
COSTS = Costs(t_f=1.0, t_b=2.0)

#: Figure 1, Seq1F1B, devices 1-4 as printed (device 2's 21st cell is labelled 1 where micro-batch 5's second
#: sequence runs: micro-batch 1's backwards are its 5th and 7th cells)
FIGURE_1 = [
    "F1a F1b F2a F2b F3a B1b F3b B1a F4a B2b F4b B2a F5a B3b F5b B3a F6a B4b F6b B4a F7a B5b F7b B5a F8a B6b F8b "
    "B6a B7b B7a B8b B8a",
    "F1a F1b F2a F2b B1b F3a B1a F3b B2b F4a B2a F4b B3b F5a B3a F5b B4b F6a B4a F6b B1b F7a B5a F7b B6b F8a B6a "
    "F8b B7b B7a B8b B8a",
    "F1a F1b F2a B1b F2b B1a F3a B2b F3b B2a F4a B3b F4b B3a F5a B4b F5b B4a F6a B5b F6b B5a F7a B6b F7b B6a F8a "
    "B7b F8b B7a B8b B8a",
    "F1a F1b B1b F2a B1a F2b B2b F3a B2a F3b B3b F4a B3a F4b B4b F5a B4a F5b B5b F6a B5a F6b B6b F7a B6a F7b B7b "
    "F8a B7a F8b B8b B8a",
]
#: the authors' Seq1F1B with ZB-1P, devices 1-4 (device 2's 28th cell is labelled 1 where micro-batch 5's second
#: sequence's input gradient runs, as in Figure 1)
FIGURE_ZB = [
    "F1a F1b F2a F2b F3a I1b W1b F3b I1a W1a F4a I2b W2b F4b I2a W2a F5a I3b W3b F5b I3a W3a F6a I4b W4b F6b I4a "
    "W4a F7a I5b W5b F7b I5a W5a F8a I6b W6b F8b I6a W6a I7b W7b I7a W7a I8b W8b I8a W8a",
    "F1a F1b F2a F2b I1b F3a I1a W1b F3b I2b W1a F4a I2a W2b F4b I3b W2a F5a I3a W3b F5b I4b W3a F6a I4a W4b F6b "
    "I1b W4a F7a I5a W5b F7b I6b W5a F8a I6a W6b F8b I7b W6a I7a W7b I8b W7a I8a W8b W8a",
    "F1a F1b F2a I1b F2b I1a F3a I2b W1b F3b I2a W1a F4a I3b W2b F4b I3a W2a F5a I4b W3b F5b I4a W3a F6a I5b W4b "
    "F6b I5a W4a F7a I6b W5b F7b I6a W5a F8a I7b W6b F8b I7a W6a I8b W7b I8a W7a W8b W8a",
    "F1a F1b I1b F2a I1a F2b I2b F3a I2a W1b F3b I3b W1a F4a I3a W2b F4b I4b W2a F5a I4a W3b F5b I5b W3a F6a I5a "
    "W4b F6b I6b W4a F7a I6a W5b F7b I7b W5a F8a I7a W6b F8b I8b W6a I8a W7b W7a W8b W8a",
]
#: each device's last cell's right edge, in forwards from the first cell's left edge (pixels / 100)
READ_ENDS = {
    "1f1b": [32.92, 30.92, 28.92, 26.92], "seq1f1b": [28.42, 27.42, 26.42, 25.42],
    "zb-h1": [26.92] * 4, "seq1f1b-zb": [25.42] * 4,
}


def cells(row: str) -> list[tuple[str, int]]:
    """'F3b' -> ('F', unit 5): micro-batch 3 (from 1), sequence b (the second), as a pipeline unit."""
    return [(c[0], (int(c[1:-1]) - 1) * K + "ab".index(c[-1])) for c in row.split()]


def compare_rows(name: str, rows: list[str]) -> None:
    sched = generate(name, P, M, slices=K)
    differ = []
    for r, row in enumerate(rows):
        ours = [(a.kind, a.mb) for a in sched.programs[r]]
        shown = cells(row)
        assert len(ours) == len(shown), (name, r, len(ours), len(shown))
        differ += [(r, i, s, o) for i, (s, o) in enumerate(zip(shown, ours)) if s != o]
    total = sum(len(p) for p in sched.programs)
    print(f"{name}: {total - len(differ)} of {total} cells as the figure orders them")
    for r, i, (sk, su), (ok, ou) in differ:
        print(f"  device {r + 1} cell {i + 1}: the figure labels {sk}{su // K + 1}{'ab'[su % K]}, "
              f"{name} runs {ok}{ou // K + 1}{'ab'[ou % K]}")


def compare_ends() -> None:
    print(f"\neach device's end, forwards (t_F = 1, t_B = 2 per micro-batch; p={P}, m={M}, {K} sequences)")
    print(f"{'schedule':<12} {'figure':>28} {'simulated':>28}  makespan / 1F1B's: figure, simulated")
    base = {}
    for name, k, ref in (("1f1b", 1, "1f1b"), ("seq1f1b", K, "1f1b"), ("zb-h1", 1, "zb-h1"), ("seq1f1b-zb", K, "zb-h1")):
        tl = simulate(generate(name, P, M, slices=k), COSTS)
        ends = [max(e) - tl.origin for e in tl.ends]
        base.setdefault(name, (max(READ_ENDS[name]), max(ends)))
        fig, sim = max(READ_ENDS[name]) / base[ref][0], max(ends) / base[ref][1]
        print(f"{name:<12} {' '.join(f'{x:6.2f}' for x in READ_ENDS[name]):>28} {' '.join(f'{x:6.2f}' for x in ends):>28}"
              f"  {fig:.3f}, {sim:.3f}")


def memory() -> None:
    print("\nrank 0's peak activations (micro-batches), Seq1F1B against 1F1B at m = 2p (the paper: \"half the "
          "memory\"; the model: (p+k-1)/(kp))")
    for p in (4, 8, 16, 32):
        one = max(metrics(simulate(generate("1f1b", p, 2 * p), COSTS)).peak_activations)
        row = [max(metrics(simulate(generate("seq1f1b", p, 2 * p, slices=k), COSTS)).peak_activations) / one
               for k in (2, 4, 8)]
        print(f"  p={p:<3} k=2: {row[0]:.3f}  k=4: {row[1]:.3f}  k=8: {row[2]:.3f}")


if __name__ == "__main__":
    print("Seq1F1B (Sun et al., NAACL 2025, arXiv:2406.03488) Figure 1, and the authors' Seq1F1B-ZB figure "
          "(thunlp/Seq1F1B README), against the generators and the simulator\n")
    compare_rows("seq1f1b", FIGURE_1)
    compare_rows("seq1f1b-zb", FIGURE_ZB)
    compare_ends()
    memory()
