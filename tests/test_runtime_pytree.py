"""Boundaries as pytrees: flatten and rebuild every container kind, name leaves, cut a batch into micro-batches."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest
import torch

from stagewise.runtime.stages import pytree
from stagewise.runtime.config import RunError


@dataclasses.dataclass
class Hidden:
    h: torch.Tensor
    pos: torch.Tensor


class Pair(NamedTuple):
    a: torch.Tensor
    b: int


def example():
    return {"x": (torch.ones(4, 2), [torch.arange(4), None]), "state": Hidden(torch.zeros(4, 3), torch.arange(4)),
            "pair": Pair(torch.ones(4), 7)}


def test_flatten_then_unflatten_rebuilds_every_container_kind():
    tree = example()
    leaves, spec = pytree.flatten(tree)
    back = pytree.unflatten(spec, leaves)
    assert type(back["state"]) is Hidden and type(back["pair"]) is Pair and type(back["x"][1]) is list
    assert back["pair"].b == 7 and back["x"][1][1] is None
    assert all(a is b for a, b in zip(pytree.flatten(back)[0], leaves))


def test_leaf_paths_read_like_indexing():
    assert pytree.paths(pytree.flatten(example())[1]) == [
        "['x'][0]", "['x'][1][0]", "['x'][1][1]", "['state'].h", "['state'].pos", "['pair'].a", "['pair'].b"]
    assert pytree.paths(pytree.flatten(torch.ones(1))[1]) == [""]


def test_only_floating_leaves_that_need_a_gradient_carry_one():
    w = torch.ones(2, requires_grad=True)
    tree = (w * 2, torch.arange(2), (w * 3).detach(), torch.ones(2) > 0)
    assert [t is tree[0] for t in pytree.grad_leaves(tree)] == [True]
    fresh = pytree.detached(tree)
    assert [t.requires_grad for t in fresh] == [True, False, False, False]
    assert fresh[0].grad_fn is None  # a new autograd leaf


def test_split_cuts_each_tensor_leaf_and_copies_the_rest():
    parts = pytree.split(example(), 2, "inputs")
    assert len(parts) == 2 and parts[1]["state"].pos.tolist() == [2, 3] and parts[0]["pair"].b == 7


def test_split_names_the_leaf_that_does_not_divide():
    with pytest.raises(RunError, match=r"inputs\['state'\].h has 4 rows \(dimension 0 of shape \(4, 3\)\); it must "
                       r"split into 3 equal micro-batches"):
        pytree.split({"ids": torch.ones(6, 2), "state": Hidden(torch.zeros(4, 3), torch.arange(6))}, 3, "inputs")
