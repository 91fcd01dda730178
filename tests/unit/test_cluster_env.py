"""launcher/nodes/cluster_env.py: Slurm hostlists, and flags over Slurm/Kubernetes over defaults."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.errors import ConfigError
from launcher.nodes.cluster_env import DEFAULT_MASTER_ADDR, NodePlace, expand_hostlist, resolve_place
from recovery import env as names

# ---------------------------------------------------------------- hostlists

# A generated hostlist is a list of patterns; a pattern is literal pieces around bracket
# groups; a group is ranges (low, count, width). The test model expands them on its own.
_literal = st.text("abcxyz-.", max_size=4)
_range = st.tuples(st.integers(0, 120), st.integers(1, 4), st.integers(1, 4))
_group = st.lists(_range, min_size=1, max_size=3)
_pattern = st.integers(0, 2).flatmap(
    lambda n: st.tuples(st.lists(_literal, min_size=n + 1, max_size=n + 1),
                        st.lists(_group, min_size=n, max_size=n)))
_hostlist = st.lists(_pattern, min_size=1, max_size=4).filter(
    # A pattern that is one empty literal is an empty item, which Slurm drops.
    lambda patterns: all(groups or literals[0] for literals, groups in patterns))


def _write(patterns: list[tuple[list[str], list[list[tuple[int, int, int]]]]]) -> str:
    def group(ranges: list[tuple[int, int, int]]) -> str:
        return ",".join(f"{low:0{width}d}" if count == 1 else
                        f"{low:0{width}d}-{low + count - 1}" for low, count, width in ranges)

    return ",".join(
        literals[0] + "".join(f"[{group(g)}]{lit}" for g, lit in zip(groups, literals[1:]))
        for literals, groups in patterns)


def _expected(patterns: list[tuple[list[str], list[list[tuple[int, int, int]]]]]) -> list[str]:
    hosts = []
    for literals, groups in patterns:
        names_so_far = [literals[0]]
        for ranges, literal in zip(groups, literals[1:]):
            values = [str(n).zfill(width) for low, count, width in ranges
                      for n in range(low, low + count)]
            names_so_far = [head + value + literal for head in names_so_far for value in values]
        hosts.extend(names_so_far)
    return hosts


@settings(max_examples=300, deadline=None)
@given(_hostlist)
def test_a_written_hostlist_expands_to_its_hosts(patterns) -> None:
    assert list(expand_hostlist(_write(patterns))) == _expected(patterns)


@pytest.mark.parametrize(("hostlist", "hosts"), [
    # Each checked against `scontrol show hostnames` of slurm-wlm 22.05.
    ("node[01-03,07],gpu-a[1-2]", ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]),
    ("node[8-10]", ["node8", "node9", "node10"]),
    ("n[1-010]", [f"n{i}" for i in range(1, 11)]),
    ("n[007]", ["n007"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a,,b", ["a", "b"]),
    ("vm", ["vm"]),
])
def test_slurms_own_expansions(hostlist: str, hosts: list[str]) -> None:
    assert list(expand_hostlist(hostlist)) == hosts


@pytest.mark.parametrize("hostlist", ["n[3-1]", "a[1", "a]", "n[x]", "n[[1]]", "n[1-]", "n[]"])
def test_a_malformed_hostlist_is_refused(hostlist: str) -> None:
    with pytest.raises(ValueError, match="bad Slurm hostlist"):
        expand_hostlist(hostlist)


def test_the_first_host_of_a_huge_allocation_is_cheap() -> None:
    assert next(expand_hostlist("n[000000-999999999],m[1-999999999]")) == "n000000"


# ---------------------------------------------------------------- precedence

def _slurm(procid: int, ntasks: int, nodelist: str = "gpu[07-09]") -> dict[str, str]:
    return {names.SLURM_STEP_ID: "0", names.SLURM_PROCID: str(procid),
            names.SLURM_NTASKS: str(ntasks), names.SLURM_STEP_NUM_NODES: str(ntasks),
            names.SLURM_STEP_NODELIST: nodelist, names.SLURM_JOB_NODELIST: "login,gpu[01-09]"}


def _kubernetes(index: int, master: str | None = "job-0.svc") -> dict[str, str]:
    return {names.JOB_COMPLETION_INDEX: str(index),
            **({names.MASTER_ADDR: master} if master else {})}


_flags = st.builds(NodePlace, st.none() | st.integers(0, 7), st.none() | st.integers(1, 8),
                   st.none() | st.sampled_from(["10.0.0.1", "head"]))
_envs = st.one_of(
    st.just({}),
    st.integers(1, 8).flatmap(lambda n: st.integers(0, n - 1).map(lambda r: _slurm(r, n))),
    st.integers(0, 7).map(_kubernetes),
)


@settings(max_examples=200, deadline=None)
@given(_flags, _envs)
def test_a_given_flag_always_wins_and_a_left_out_one_is_filled(flags: NodePlace,
                                                                env: dict[str, str]) -> None:
    placement = resolve_place(flags, env)
    found = resolve_place(NodePlace(), env)
    assert placement.node_rank == (flags.node_rank if flags.node_rank is not None
                                   else found.node_rank)
    assert placement.nnodes == (flags.nnodes if flags.nnodes is not None else found.nnodes)
    assert placement.master_addr == (flags.master_addr if flags.master_addr is not None
                                     else found.master_addr)
    for name in ("node_rank", "nnodes", "master_addr"):  # the note names what env gave
        assert (f"{name}=" in placement.note) == (
            getattr(flags, name) is None and f"{name}=" in found.note)


def test_under_srun_each_task_is_a_node_and_task_0s_host_is_the_master() -> None:
    placement = resolve_place(NodePlace(), _slurm(2, 3))
    assert (placement.node_rank, placement.nnodes, placement.master_addr) == (2, 3, "gpu07")
    assert placement.note == "from Slurm: node_rank=2 nnodes=3 master_addr=gpu07"


def test_without_a_step_nodelist_the_jobs_first_host_is_the_master() -> None:
    env = _slurm(0, 1)
    del env[names.SLURM_STEP_NODELIST]
    assert resolve_place(NodePlace(), env).master_addr == "login"


def test_the_batch_script_outside_srun_is_a_one_node_job() -> None:
    env = _slurm(0, 4)
    del env[names.SLURM_STEP_ID]
    placement = resolve_place(NodePlace(), env)
    assert (placement.node_rank, placement.nnodes, placement.master_addr, placement.note) == (
        None, None, DEFAULT_MASTER_ADDR, "")


def test_explicit_flags_win_over_slurm() -> None:
    placement = resolve_place(NodePlace(node_rank=0, master_addr="head"), _slurm(1, 2))
    assert (placement.node_rank, placement.nnodes, placement.master_addr) == (0, 2, "head")
    assert placement.note == "from Slurm: nnodes=2"


def test_several_tasks_per_node_is_refused() -> None:
    env = {**_slurm(0, 4), names.SLURM_STEP_NUM_NODES: "2"}
    with pytest.raises(ConfigError, match="srun --ntasks-per-node=1"):
        resolve_place(NodePlace(), env)
    mine = resolve_place(NodePlace(node_rank=1, nnodes=2), env)  # then tasks are not read
    assert (mine.node_rank, mine.nnodes, mine.master_addr) == (1, 2, "gpu07")


@pytest.mark.parametrize(("name", "value"), [(names.SLURM_PROCID, "x"),
                                             (names.SLURM_NTASKS, "-1")])
def test_a_bad_slurm_number_is_a_usage_error(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        resolve_place(NodePlace(), {**_slurm(0, 1), name: value})


def test_a_bad_nodelist_asks_for_master_addr() -> None:
    with pytest.raises(ConfigError, match="give --master_addr"):
        resolve_place(NodePlace(), _slurm(0, 1, nodelist="gpu[2-1]"))
    assert resolve_place(NodePlace(master_addr="head"),
                         _slurm(0, 1, nodelist="gpu[2-1]")).master_addr == "head"


def test_a_kubernetes_index_is_the_node_rank_and_master_addr_the_master() -> None:
    placement = resolve_place(NodePlace(nnodes=4), _kubernetes(3))
    assert (placement.node_rank, placement.nnodes, placement.master_addr) == (3, 4, "job-0.svc")
    assert placement.note == "from Kubernetes: node_rank=3 master_addr=job-0.svc"


def test_a_kubernetes_pod_past_index_0_needs_a_master() -> None:
    with pytest.raises(ConfigError, match="--master_addr or MASTER_ADDR"):
        resolve_place(NodePlace(nnodes=2), _kubernetes(1, master=None))
    alone = resolve_place(NodePlace(), _kubernetes(0, master=None))
    assert alone.master_addr == DEFAULT_MASTER_ADDR


def test_master_addr_alone_is_not_read_outside_an_indexed_job() -> None:
    placement = resolve_place(NodePlace(), {names.MASTER_ADDR: "elsewhere"})
    assert (placement.node_rank, placement.master_addr, placement.note) == (
        None, DEFAULT_MASTER_ADDR, "")
