"""Starting the server as a service runs it: progress while ``make run`` installs, a banner that a
log file keeps whole, and the admin token kept out of logs (only where it is saved is printed)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.test_service_support import REPO, Server


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # a long state directory makes the banner's first line well past 80 columns
    srv = Server(tmp_path_factory.mktemp("startup") / ("state-with-a-long-directory-name" * 2))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_the_token_is_not_in_the_log_but_where_it_is_saved(logged: Server) -> None:
    log = logged.log.read_text()
    token = (logged.state_dir / "admin-token").read_text().strip()
    assert token.startswith("gpt_") and token not in log
    assert "bootstrap admin token: created (not printed: stdout is not a terminal)" in log
    assert f"saved to {logged.state_dir / 'admin-token'} (mode 0600)" in log


def test_the_banner_is_not_wrapped_in_a_log_file(logged: Server) -> None:
    lines = logged.log.read_text().splitlines()
    first = next(line for line in lines if "serving on" in line)
    assert len(first) > 80 and re.search(r"database sqlite:///\S+\)$", first), first


def test_make_run_says_it_is_installing_and_shows_pip_progress() -> None:
    text = (REPO / "Makefile").read_text()
    recipe = text.split("$(RUN_STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert "@echo" in recipe and "installing" in recipe
    assert re.search(r"pip install -e \.", recipe) and "-q -e ." not in recipe
