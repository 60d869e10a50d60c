"""Communication actions: one posted transfer or collective of a rank, and their text (torch's).

torch.distributed.pipelining writes them ``{stage}{KIND}{mb}``: ``1SEND_F0`` (stage 1 sends micro-batch
0's activation on), ``2RECV_F0`` (stage 2 receives it), ``1SEND_B0`` / ``0RECV_B0`` for the gradient,
``0UNSHARD``, ``0RESHARD`` and ``0REDUCE_GRAD`` for a stage (no micro-batch). stagewise adds what torch's
runtime does outside its programs: ``ALL_TO_ALL`` (an MoE action's dispatch and combine, inside it),
``TIE_GRAD`` (the all-reduce of a tied weight's gradients between the ranks holding its copies) and
``STEP_END`` (the gradient-norm and loss all-reduces of every rank), and the headers of messages whose shapes
are not known in advance (``0SEND_F_HDR1`` / ``1RECV_F_HDR1``, ``_B_HDR`` for a gradient): a small message
on the same channel as its data, right before it, that gives the data's structure, shapes and dtypes (the
receiver reads it before it posts the data's receive). Those are never written to torch's CSV (its loader
refuses them).
"""

from __future__ import annotations

import re
from typing import NamedTuple

SEND_F, RECV_F, SEND_B, RECV_B = "SEND_F", "RECV_F", "SEND_B", "RECV_B"
UNSHARD, RESHARD, REDUCE_GRAD = "UNSHARD", "RESHARD", "REDUCE_GRAD"
ALL_TO_ALL, TIE_GRAD, STEP_END = "ALL_TO_ALL", "TIE_GRAD", "STEP_END"
SEND_F_HDR, RECV_F_HDR, SEND_B_HDR, RECV_B_HDR = "SEND_F_HDR", "RECV_F_HDR", "SEND_B_HDR", "RECV_B_HDR"
#: what torch's compute+comms CSV carries
TORCH_KINDS = (SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD)
SENDS, RECVS = (SEND_F, SEND_B), (RECV_F, RECV_B)
P2P = SENDS + RECVS
#: a message's header: sent right before its data on the same channel (the kind of that data: ``DATA_OF``)
HEADER_SENDS, HEADER_RECVS = (SEND_F_HDR, SEND_B_HDR), (RECV_F_HDR, RECV_B_HDR)
HEADERS = HEADER_SENDS + HEADER_RECVS
DATA_OF = {SEND_F_HDR: SEND_F, RECV_F_HDR: RECV_F, SEND_B_HDR: SEND_B, RECV_B_HDR: RECV_B}
HEADER_OF = {data: header for header, data in DATA_OF.items()}
#: the bytes a header counts on its link (a pickled structure and shapes: the runtime's fixed buffer)
HEADER_BYTES = 2048.0
KINDS = TORCH_KINDS + (ALL_TO_ALL, TIE_GRAD, STEP_END) + HEADERS
#: collectives: every member of the group enters them, in one order
COLLECTIVES = (UNSHARD, REDUCE_GRAD, ALL_TO_ALL, TIE_GRAD, STEP_END)

#: what each kind is, in words (explain, the pictures' legend)
WORDS = {SEND_F: "activation send", RECV_F: "activation receive", SEND_B: "gradient send",
         RECV_B: "gradient receive", UNSHARD: "all-gather", RESHARD: "reshard", REDUCE_GRAD: "gradient reduction",
         ALL_TO_ALL: "all-to-all", TIE_GRAD: "tied-weight all-reduce", STEP_END: "step-end all-reduce",
         SEND_F_HDR: "activation header send", RECV_F_HDR: "activation header receive",
         SEND_B_HDR: "gradient header send", RECV_B_HDR: "gradient header receive"}

_COMM_RE = re.compile(r"([0-9]+)(" + "|".join(sorted(KINDS, key=len, reverse=True)) + r")([0-9]*)")  # ASCII digits


class CommAction(NamedTuple):
    """One communication action of a rank. ``peer``: the other pipeline rank of a send or receive (-1 for a
    collective); ``group``: what it runs over (``pp`` for a send or receive; ``fsdp``, ``dp``, ``hsdp``, ``ep``,
    ``tie``, ``world``); ``nbytes``: the bytes this rank moves; ``stream``: the resource it occupies
    (``p2p``, or the group's name: collectives over one group run one after another); ``op``: what it is
    (``all-gather``, ``reduce-scatter``, ``all-reduce``, ``reduce-scatter+all-reduce``, ``all-to-all``, ``""``
    for a send or receive); ``during``: a bucket of a collective that overlaps the op before it (Megatron's
    bucketed gradient reduction, a layer-wise gather), posted once that fraction of the op has run (a number in
    (0, 1]: its layers' share so far); ``True``, a whole reduction over its op: posted when the op starts, done
    no earlier than it ends."""

    kind: str
    stage: int
    mb: int | None = None
    peer: int = -1
    group: str = ""
    nbytes: float = 0.0
    stream: str = ""
    op: str = ""
    during: bool | float = False

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{'' if self.mb is None else self.mb}"

    @property
    def key(self) -> tuple:
        """What pairs a send with its receive: (direction, the stage the data goes into, mb); a header's is
        its data's."""
        kind = DATA_OF.get(self.kind, self.kind)
        if kind == SEND_F:
            return ("F", self.stage + 1, self.mb)
        if kind == RECV_F:
            return ("F", self.stage, self.mb)
        if kind == SEND_B:
            return ("B", self.stage - 1, self.mb)
        return ("B", self.stage, self.mb)


def parse_comm(text: str) -> CommAction | None:
    """``1SEND_F0`` -> CommAction (peer, group and bytes filled in by the reader); None when not one."""
    m = _COMM_RE.fullmatch(text.strip())
    if not m:
        return None
    kind, mb = m[2], m[3]
    if (kind in P2P or kind in HEADERS or kind == ALL_TO_ALL) != bool(mb):
        return None
    return CommAction(kind, int(m[1]), int(mb) if mb else None)


def describe(c: CommAction, rank: int) -> str:
    """A transfer in words, without op codes: 'the reduce-scatter of stage 3 over fsdp'."""
    if c.kind in P2P or c.kind in HEADERS:
        kind = DATA_OF.get(c.kind, c.kind)
        what = ("activation" if kind in (SEND_F, RECV_F) else "gradient") + (" header" if c.kind in HEADERS else "")
        return f"micro-batch {c.mb}'s {what} of stage {c.stage} {'to' if kind in SENDS else 'from'} rank {c.peer}"
    if c.kind == TIE_GRAD:
        return f"the tied-weight all-reduce of stage {c.stage} with rank {c.peer}"
    if c.kind == STEP_END:
        return "the step-end all-reduce (gradient norm and loss) over every rank"
    if c.kind == ALL_TO_ALL:
        return f"micro-batch {c.mb}'s all-to-all of stage {c.stage} over ep"
    if c.kind == RESHARD:
        return f"the reshard of stage {c.stage}"
    op = c.op or WORDS[c.kind]
    return f"the {op} of stage {c.stage} over {c.group}"
