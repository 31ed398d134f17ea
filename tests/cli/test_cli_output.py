"""The client's output as a kubectl user expects it: pipes get one whole row per line, terminals a
fitted table with cut reasons marked, data never read as markup, and the kubectl habits
(AGE, ``-o wide|name|jsonpath``, ``--sort-by``, ``-l``, ``-w``, ``--version``)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.cli.client.jsonpath import JsonPathError, render_template, sort_key
from gpupool.cli.client.listing import PAGE, labels_of, list_all, parse_selector, watch_list
from gpupool.cli.client.output import Out, emit, parse_output, show
from gpupool.cli.client.rows import age, priority_class_rows, rows_for

runner = CliRunner()


def five_minutes_ago() -> str:
    """Computed per call: a constant taken at import is minutes old by the time a busy
    parallel run reaches the test (the AGE column then read 6m)."""
    return (datetime.now(UTC) - timedelta(minutes=5, seconds=1)).isoformat()


#: one fixed time for the tests that compare objects (a watch prints what changed)
FIVE_MINUTES_AGO = five_minutes_ago()
LONG = "waiting for quota in [h100-training]: " + "the cohort lends nothing right now " * 4


def wl(name: str, reason: str = LONG, **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "queue": "llm-research",
        "phase": "Pending",
        "owner": "alice",
        "placement": None,
        "reason": reason,
        "priorityClass": "batch",
        "submittedAt": FIVE_MINUTES_AGO,
        "seq": kw.pop("seq", 1),
        "manifest": {"metadata": {"name": name, "labels": kw.pop("labels", {})}},
        **kw,
    }


def terminal(width: int) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=width, color_system=None), buf


def test_a_pipe_gets_one_whole_row_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    at = five_minutes_ago()  # the AGE column below reads 5m
    items = [wl(f"llama-405b-pretrain-{i:03d}", submittedAt=at) for i in range(558)]
    emit({"items": items}, Out.table, rows_for("workloads", {"items": items}))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 559  # the header and one line per workload, nothing wrapped
    assert lines[0].split() == ["NAME", "QUEUE", "PHASE", "OWNER", "POOL", "AGE", "REASON"]
    assert lines[1].startswith("llama-405b-pretrain-000 ")
    assert lines[1].endswith(LONG.rstrip())  # never cut at 70 characters
    assert "[h100-training]" in lines[1]
    assert " 5m " in lines[1]


def test_a_terminal_fits_the_width_keeps_names_and_marks_the_cut() -> None:
    con, buf = terminal(130)
    show(rows_for("workloads", {"items": [wl("llama-405b-pretrain-with-a-long-name")]}), to=con)
    lines = buf.getvalue().splitlines()
    assert all(len(line) <= 130 for line in lines)
    assert len(lines) == 2  # no row broken over lines
    assert "llama-405b-pretrain-with-a-long-name" in lines[1]
    assert lines[1].rstrip().endswith("…")
    assert "[h100-training]" in lines[1]


def test_a_terminal_narrower_than_the_names_cuts_lines_visibly() -> None:
    con, buf = terminal(40)
    show(rows_for("workloads", {"items": [wl("llama-405b-pretrain-with-a-long-name")]}), to=con)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and all(len(line) == 40 and line.endswith("…") for line in lines)
    assert lines[1].startswith("llama-405b-pretrain-with-a-long-name ")


def test_markup_in_data_is_text_on_a_terminal_and_in_a_pipe(capsys: pytest.CaptureFixture[str]) -> None:
    items = [{"metadata": {"name": "batch"}, "spec": {"value": 10, "description": "low [/batch] [bold]x"}}]
    con, buf = terminal(120)
    show(priority_class_rows(items), to=con)
    assert "low [/batch] [bold]x" in buf.getvalue()
    show(priority_class_rows(items))
    assert "low [/batch] [bold]x" in capsys.readouterr().out


def test_age_reads_like_kubectl() -> None:
    now = datetime(2026, 1, 10, tzinfo=UTC)
    ago = [timedelta(seconds=42), timedelta(minutes=7), timedelta(hours=5), timedelta(days=3)]
    assert [age((now - d).isoformat(), now) for d in ago] == ["42s", "7m", "5h", "3d"]
    assert age(None, now) == "" and age("not a time", now) == ""


def test_output_formats_parse_and_refuse_clearly() -> None:
    assert parse_output("wide") is Out.wide and parse_output("name") is Out.name
    jp = parse_output("jsonpath={.items[*].name}")
    assert jp.kind == "jsonpath" and jp.template == "{.items[*].name}"
    with pytest.raises(typer.BadParameter, match="one of table, wide, name"):
        parse_output("xml")


def test_name_and_jsonpath_and_wide(capsys: pytest.CaptureFixture[str]) -> None:
    data = {"items": [wl("a"), wl("b", priorityClass="prod")]}
    emit(data, Out.name, kind="workload")
    assert capsys.readouterr().out.splitlines() == ["workload/a", "workload/b"]
    emit(data, parse_output("jsonpath={.items[*].name}"))
    assert capsys.readouterr().out == "a b\n"
    emit(data, parse_output("jsonpath={.items[-1].priorityClass}\\n"))
    assert capsys.readouterr().out == "prod\n\n"
    emit(data, Out.wide, rows_for("workloads", data, wide=True))
    assert "PRIORITY" in capsys.readouterr().out.splitlines()[0]


def test_jsonpath_refuses_what_it_cannot_read() -> None:
    with pytest.raises(JsonPathError, match="unbalanced"):
        render_template("{.items", {})
    with pytest.raises(JsonPathError, match="cannot read"):
        sort_key(".items[x")


def test_sort_by_numbers_then_text_then_missing() -> None:
    items = [{"n": "b"}, {"n": 3}, {}, {"n": 1}, {"n": "a"}]
    assert sorted(items, key=sort_key("{.n}")) == [{"n": 1}, {"n": 3}, {"n": "a"}, {"n": "b"}, {}]


def test_label_selectors() -> None:
    sel = parse_selector("team=vision,tier!=batch,!experimental,zone in (a, b)")
    assert sel({"team": "vision", "tier": "prod", "zone": "a"})
    assert not sel({"team": "vision", "tier": "batch", "zone": "a"})
    assert not sel({"team": "vision", "zone": "a", "experimental": "1"})
    assert not sel({"team": "vision", "zone": "c"})
    assert parse_selector("gpu")({"gpu": ""}) and not parse_selector("gpu")({})
    assert labels_of(wl("x", labels={"team": "v"})) == {"team": "v"}
    assert labels_of({"metadata": {"labels": {"a": "1"}}}) == {"a": "1"}


def test_a_bad_selector_is_one_line() -> None:
    with pytest.raises(typer.Exit):
        parse_selector("team=(x")


class FakeApi:
    """Answers pages of ``total`` workloads, newest first, with a continue token."""

    def __init__(self, total: int) -> None:
        self.items = [wl(f"w{i}", seq=i) for i in range(total, 0, -1)]
        self.calls: list[dict[str, Any]] = []

    def call(self, method: str, path: str, params: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(dict(params))
        start = int(params.get("continue", 0))
        page = self.items[start : start + params["limit"]]
        more = start + len(page) < len(self.items)
        return {"items": page, "metadata": {"continue": str(start + len(page)) if more else None}}


def test_every_page_is_followed() -> None:
    api = FakeApi(2 * PAGE + 7)
    data = list_all(api, "workloads", {"queue": "q"}, "/v1/workloads")  # type: ignore[arg-type]
    assert len(data["items"]) == 2 * PAGE + 7
    assert len(api.calls) == 3 and all(c["queue"] == "q" for c in api.calls)


def test_watch_prints_the_list_then_each_change(capsys: pytest.CaptureFixture[str]) -> None:
    states = iter(
        [
            {"items": [wl("a", reason="r1"), wl("b", reason="r1")]},
            {"items": [wl("a", reason="r1"), wl("b", reason="r1")]},
            {"items": [wl("a", reason="r1"), {**wl("b", reason="r1"), "phase": "Running"}]},
        ]
    )
    slept: list[float] = []
    watch_list(lambda: next(states), "workloads", Out.table, rounds=3, sleep=slept.append)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == ["NAME", "a", "b", "b"]
    assert "Running" in lines[-1] and slept == [2.0, 2.0]


def test_watch_json_prints_one_document_per_change(capsys: pytest.CaptureFixture[str]) -> None:
    states = iter([{"items": [wl("a")]}, {"items": [wl("a")]}])
    watch_list(lambda: next(states), "workloads", Out.json, rounds=2, sleep=lambda _: None)
    assert json.loads(capsys.readouterr().out)["name"] == "a"


def test_version_and_completion() -> None:
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("gpupool ")
    r = runner.invoke(app, ["--help"])
    assert "--install-completion" in r.output
