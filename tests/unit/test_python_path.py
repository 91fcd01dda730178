"""PYTHONPATH for tftrun's own processes: its absolute entries only (issue 38); the
sys.path a forked worker gets back: the user's, as a fresh ``python script.py`` has it;
and tftrun's own sys.path, without what stands for the working folder."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from launcher.own_path import without_working_folder
from launcher.procs.spec import own_env
from recovery.python_path import interpreter_sys_path, own_pythonpath, worker_sys_path

ENTRY = st.one_of(st.just(""), st.just("."), st.just("rel/dir"), st.just("/abs"), st.just("/x/y"),
                  st.text("abc/", max_size=6))


@given(st.lists(ENTRY, max_size=6))
def test_own_pythonpath_keeps_the_absolute_entries_in_their_order(entries: list[str]) -> None:
    kept = own_pythonpath(os.pathsep.join(entries))
    assert (kept.split(os.pathsep) if kept else []) == [e for e in entries if os.path.isabs(e)]


def test_an_empty_entry_is_dropped_and_an_empty_pythonpath_left_out() -> None:
    assert own_pythonpath(":/repo") == "/repo"
    assert own_env({"PYTHONPATH": ":.:rel", "A": "1"}) == {"A": "1"}
    assert own_env({"PYTHONPATH": "/repo::x"}) == {"PYTHONPATH": "/repo"}


def test_a_worker_gets_the_users_entries_after_its_first_and_before_the_interpreters() -> None:
    interpreter = interpreter_sys_path(["/repo", "/usr/lib/python3.11", "/site"], "/repo")
    assert interpreter == ["/usr/lib/python3.11", "/site"]
    path = worker_sys_path("/job/bin", ":/repo:rel", interpreter)
    cwd = os.getcwd()
    assert path == ["/job/bin", cwd, "/repo", os.path.join(cwd, "rel"), "/usr/lib/python3.11", "/site"]
    assert worker_sys_path("/site", "/site", interpreter) == ["/site", "/usr/lib/python3.11"]


def test_tftrun_drops_what_stands_for_the_working_folder_but_its_own_folder() -> None:
    site = ["/usr/lib/python3.11", "/site"]
    # python -m launcher.cli.tftrun in /job, PYTHONPATH=:/repo:rel
    assert without_working_folder(["/job", "/job", "/repo", "/job/rel", *site], ":/repo:rel",
                                  "/job", "/repo") == ["/repo", *site]
    # python -c, '' first; tftrun imported from the working folder itself is kept
    assert without_working_folder(["", *site], "", "/repo", "/repo") == ["", *site]
    assert without_working_folder(["", "/repo", *site], "", "/job", "/repo") == ["/repo", *site]
    # the working folder given as an absolute path on purpose is kept
    assert without_working_folder(["/bin", "/job", *site], "/job", "/job", "/repo") == ["/bin", "/job", *site]
