"""The one parallel-layout value: its sizes, builders and rules (no torch)."""

import doctest

import pytest
from hypothesis import given, strategies as st

import stagewise.parallelism as parallelism
from stagewise import Parallelism, ParallelismError, StagewiseError


def test_doctests():
    assert doctest.testmod(parallelism).failed == 0


degree = st.sampled_from([1, 2, 3, 4, 8])


@given(pp=degree, dp=degree, fsdp=degree, tp=degree, ep=degree)
def test_of_world_divides_the_rest_into_pp(pp, dp, fsdp, tp, ep):
    par = Parallelism.of_world(pp * dp * fsdp * tp * ep, dp=dp, fsdp=fsdp, tp=tp, ep=ep)
    assert par == Parallelism(pp=pp, dp=dp, fsdp=fsdp, tp=tp, ep=ep)
    assert par.world == pp * dp * fsdp * tp * ep and par.data_shards == dp * fsdp * ep
    assert Parallelism.from_dict(par.to_dict()) == par
    names = par.dims()
    assert Parallelism.of_mesh(names, [par.size(d) for d in names]) == par


@pytest.mark.parametrize("sharding, shard, want", [
    ("ddp", None, Parallelism(pp=4, dp=8, tp=2)),
    ("zero1", None, Parallelism(pp=4, dp=8, tp=2, zero=1)),
    ("fsdp", None, Parallelism(pp=4, fsdp=8, tp=2)),
    ("hsdp", 2, Parallelism(pp=4, dp=4, fsdp=2, tp=2)),
])
def test_of_plan_maps_the_planners_words(sharding, shard, want):
    par = Parallelism.of_plan(p=4, dp=8, t=2, sharding=sharding, shard=shard)
    assert par == want and par.sharding == sharding and par.world == 64


def test_of_plan_expert_parallel_takes_data_ranks():
    par = Parallelism.of_plan(p=2, dp=8, ep=4, sharding="zero1")
    assert (par.dp, par.ep, par.zero, par.data_shards) == (2, 4, 1, 8)


@pytest.mark.parametrize("build, words", [
    (lambda: Parallelism(dp=0).check(), "`dp` must be a whole number >= 1; got 0"),
    (lambda: Parallelism(tp=True).check(), "`tp` must be a whole number"),
    (lambda: Parallelism(zero=1).check(), "it needs `dp` >= 2"),
    (lambda: Parallelism(zero=2, dp=2).check(), "`zero` must be 0"),
    (lambda: Parallelism(dp=2, fsdp=2, zero=1).check(), "FSDP already shards"),
    (lambda: Parallelism(reshard_after_forward=True).check(), "needs `fsdp` >= 2"),
    (lambda: Parallelism(tp=4, etp=3).check(), "`etp` 3 and `tp` 4"),
    (lambda: Parallelism.of_world(10, dp=4), "`dp` 4 = 4 does not divide the 10 ranks"),
    (lambda: Parallelism.of_world(8, pp=2, dp=2), "= 4 ranks, but the world has 8"),
    (lambda: Parallelism.of_world(0), "`world` must be a whole number >= 1"),
    (lambda: Parallelism.of_mesh(("pp", "dp", "pp"), (2, 2, 2)), "names the dimension 'pp' twice"),
    (lambda: Parallelism.of_mesh(("pp", "cp"), (2, 2)), "'cp' (of ('pp', 'cp')) is not one of"),
    (lambda: Parallelism.of_mesh(("dp",), (2,)), "has no 'pp' dimension"),
    (lambda: Parallelism.of_mesh((), (2,)), "need names"),
    (lambda: Parallelism.of_plan(p=2, dp=6, ep=4), "`ep` 4 does not divide `dp` 6"),
    (lambda: Parallelism.of_plan(p=2, dp=6, sharding="hsdp", shard=4), "`shard` 4 must divide"),
    (lambda: Parallelism.of_plan(p=2, dp=6, sharding="zero3"), "`sharding` 'zero3' is not one of"),
    (lambda: Parallelism().size("cp"), "`dim` 'cp' is not one of"),
    (lambda: Parallelism.from_dict({"pp": 2, "world": 4}), "`world` 4 does not match"),
])
def test_bad_layouts_are_refused_naming_the_degree(build, words):
    with pytest.raises(ParallelismError, match=".*") as e:
        build()
    assert words in str(e.value)
    assert isinstance(e.value, StagewiseError)


def test_unsupported_is_the_runtimes_one_rule():
    assert Parallelism(pp=2, dp=2, ep=2).unsupported() is None
    assert "not composed with FSDP or tensor parallel" in Parallelism(pp=2, ep=2, tp=2).unsupported()
    with pytest.raises(ParallelismError, match="expert parallel is not composed"):
        Parallelism(pp=2, ep=2, fsdp=2).check_runs()


def test_flags_say_only_what_differs_from_the_defaults():
    assert Parallelism(pp=2).flags() == ["-p", "2"]
    assert Parallelism(pp=2, dp=2, tp=2, zero=1).flags() == ["-p", "2", "--dp", "2", "--tp", "2", "--zero", "1"]
    assert Parallelism(pp=2, fsdp=2, reshard_after_forward=True).flags() == [
        "-p", "2", "--fsdp", "2", "--reshard-after-forward"]
    assert Parallelism(pp=2, tp=2, etp=2).flags() == ["-p", "2", "--tp", "2"]


def test_describe():
    assert Parallelism(pp=4, dp=2, fsdp=2, tp=2, zero=0).describe() == "pp 4 x dp 2 x fsdp 2 x tp 2"
    assert str(Parallelism(pp=2, dp=2, zero=1)) == "pp 2 x dp 2, zero 1"


def test_of_plan_folds_expert_parallel_over_the_tensor_parallel_ranks():
    """Megatron-Core's MoE parallel folding in the planner's words: EP 8 over a stage's t 2 x dp 16 GPUs with each
    expert whole (etp 1) is 4 data ranks with their tp pairs, the experts spread over 8 GPUs."""
    par = Parallelism.of_plan(p=2, dp=16, t=2, ep=8, etp=1, sharding="zero1")
    assert (par.ep, par.tp, par.etp, par.dp, par.expert_degree, par.world) == (4, 2, 1, 4, 8, 64)
    assert par.describe() == "pp 2 x dp 4 x ep 4 x tp 2, etp 1, zero 1"
    same = Parallelism.of_plan(p=2, dp=16, t=2, ep=8, sharding="zero1")  # etp = t: ep 8 data ranks
    assert (same.ep, same.expert_degree) == (8, 8)


@pytest.mark.parametrize("kw, words", [
    (dict(p=2, dp=8, t=4, ep=2, etp=1), "`ep` 2 x `etp` 1 is not a multiple of `t` 4"),
    (dict(p=2, dp=6, t=2, ep=8, etp=1), "= 4 does not divide `dp` 6"),
])
def test_of_plan_refuses_expert_layouts_that_do_not_cover_whole_groups(kw, words):
    with pytest.raises(ParallelismError, match=words.replace("(", r"\(")):
        Parallelism.of_plan(**kw)
