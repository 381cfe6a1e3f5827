"""What a terminal shows of the wide tables: the column priority, --columns, fitting to a width.

Against the reference-shaped run directories of tests/fixtures/make_compare_runs.py (the MTP run has
every optional column: accept length and the server's running/queued samples); no server, no Locust.
"""

from __future__ import annotations

import dataclasses
import io
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from specload.analysis.comparison import build_comparison
from specload.analysis.run import Run, load_run
from specload.cli import build_parser
from specload.present.compare import _columns, run_compare
from specload.present.compare import main as compare_main
from specload.present.compare import render_table as render_comparison
from specload.present.output import render_view
from specload.present.report import level_columns, print_report, render_levels, render_report
from specload.present.report import main as report_main
from specload.present.tableview import (
    FIGURES,
    PRIORITY,
    RANK,
    SETS,
    WHOLE,
    TableView,
    choose,
    hidden_note,
    parse_columns,
    view_for,
)
from tests.fixtures.make_compare_runs import write_reference_pair

REPO = Path(__file__).resolve().parent.parent
SEED = ["C", "Agg tok/s", "Per-req tok/s", "Tokens", "Wall(s)", "Ok"]  # the reference benchmark's table
LATENCY = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p99", "e2e_p50")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_reference_pair(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def mtp(pair: tuple[Path, Path]) -> Run:
    return load_run(pair[1])


def table_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("|")]


def header(text: str) -> list[str]:
    return [c.strip() for c in table_lines(text)[0].strip("|").split("|")]


def note(text: str) -> str | None:
    lines = [ln for ln in text.splitlines() if " with --columns all (or in " in ln]
    assert len(lines) <= 1, text
    return lines[0] if lines else None


# ---------------------------------------------------------------- the priority table, --columns


def test_every_column_of_every_table_has_one_place_in_the_priority() -> None:
    assert len(RANK) == len(PRIORITY) + 1  # each key once, and compare's repeats to settle (not a figure)
    assert {c.key for c in level_columns()} <= set(FIGURES)
    assert [f.key for f in PRIORITY[:8]] == [
        "rate",
        "c",
        "agg",
        "per_req",
        "tokens",
        "wall",
        "ok",
        "accept",
    ]  # the seed first, and a speculative run's acceptance length
    assert [f.key for f in PRIORITY[8:15]] == [
        "fail",
        "short",
        "429",
        "late",
        "ttft_p50",
        "tpot_p50",
        "srv_queue_max",
    ]
    assert all(any(s in f.sets for f in PRIORITY) for s in SETS)


def test_compare_columns_have_keys(pair: tuple[Path, Path]) -> None:
    comp = build_comparison([load_run(p) for p in pair])
    keys = {key for _name, key in _columns(comp)}
    assert keys <= set(FIGURES)
    assert keys == {
        "c",
        "agg",
        "per_req",
        "ttft_p50",
        "ttft_p99",
        "tpot_p50",
        "accept",
        "srv_run_queue",
    }  # no ITL here


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("seed", {"agg", "per_req", "tokens", "wall", "ok"}),
        ("latency", {*LATENCY}),
        (
            "server",
            {
                "accept",
                "accept_rate",
                "accept_pos",
                "srv_run_max",
                "srv_run_mean",
                "srv_queue_max",
                "srv_queue_mean",
                "srv_run_queue",
                "prefix_hit",
            },
        ),
        ("failures", {"ok", "fail", "short", "429", "late"}),
        ("throughput", {"steady", "req_s", "mean_conc"}),
        ("all", set(FIGURES)),
        ("ALL", set(FIGURES)),
        ("seed,latency", {"agg", "per_req", "tokens", "wall", "ok", *LATENCY}),
        ("agg, fail,srv_queue_max", {"agg", "fail", "srv_queue_max"}),  # single columns by key
        ("TTFT p50,Srv queue max,Per-req tok/s", {"ttft_p50", "srv_queue_max", "per_req"}),  # or by title
        ("auto", None),
    ],
)
def test_parse_columns(text: str, keys: set[str] | None) -> None:
    # The levels' own column (C, or a rate level's Rate) comes with every choice.
    assert parse_columns(text) == (None if keys is None else frozenset(keys) | {"rate", "c"})


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "nope",
            "unknown column or set 'nope'; use auto, all, a set (seed, failures, latency, throughput, server, slo, acceptance, reasoning)",
        ),
        ("seed,nope", "'nope'"),
        ("auto,seed", "'auto' goes alone"),
        (",", "expected auto, all"),
    ],
)
def test_parse_columns_errors_name_what_is_accepted(text: str, named: str) -> None:
    with pytest.raises(ValueError, match="^--columns: ") as e:
        parse_columns(text)
    assert named in str(e.value)


def test_view_for() -> None:
    assert view_for(None, 90) == TableView(None, 90)
    assert view_for("auto", 90) == TableView(None, 90)
    assert view_for("seed", 90) == TableView(parse_columns("seed"), None)  # a choice is not fitted


# ---------------------------------------------------------------- choosing by width (pure)


def test_choose_drops_the_least_important_until_it_fits() -> None:
    keys = ["c", "agg", "ttft_p99", "fail", "per_req"]  # the table's order is not the priority's
    widths = {"c": 5, "agg": 10, "ttft_p99": 10, "fail": 5, "per_req": 10}

    def measure(cols: list[int]) -> int:
        return 1 + sum(widths[keys[i]] for i in cols)

    assert choose(keys, TableView(width=41), measure).shown == (0, 1, 2, 3, 4)
    c = choose(keys, TableView(width=40), measure)  # ttft_p99 is the least important
    assert (c.shown, c.hidden) == ((0, 1, 3, 4), ("TTFT p99",))
    c = choose(keys, TableView(width=30), measure)  # fail (rank 6) goes next although it alone would fit
    assert (c.shown, c.hidden) == ((0, 1, 4), ("TTFT p99", "Fail"))
    c = choose(keys, TableView(width=3), measure)  # never below C and Agg tok/s
    assert (c.shown, c.hidden) == ((0, 1), ("TTFT p99", "Fail", "Per-req tok/s"))
    assert choose(keys, WHOLE, measure).shown == (0, 1, 2, 3, 4)
    chosen = frozenset({"c", "fail"})
    assert choose(keys, TableView(chosen), measure).shown == (0, 3)  # exactly those, in the table's order
    assert choose(keys, TableView(chosen, 3), measure).shown == (0, 3)  # whatever the width


def test_hidden_note_is_one_line_within_the_width() -> None:
    hidden = [f.title for f in PRIORITY[10:]]
    assert hidden_note(["Srv run mean"], 200, "report.md") == (
        "1 more column with --columns all (or in report.md): Srv run mean"
    )
    for width in (60, 80, 100, 120):
        text = hidden_note(hidden, width, "report.md")
        assert "\n" not in text and len(text) <= width, text
        assert text.startswith(f"{len(hidden)} more columns with --columns all (or in report.md): ")
        assert text.endswith(", ...") or text.endswith(": ...")
    assert hidden_note(["Agg tok/s", "TTFT p50"], 200, "comparison.md", 5) == (
        "5 more columns with --columns all (or in comparison.md): Agg tok/s, TTFT p50"
    )  # compare: a figure is a column per run (and the change)


# ---------------------------------------------------------------- the per-level table


@pytest.mark.parametrize(
    ("width", "shown"),
    [
        # a speculative run's acceptance length comes right after the seed (the table's own order)
        (80, [*SEED, "Fail", "Accept len"]),
        (120, [*SEED, "Fail", "Short", "TTFT p50 (ms)", "TPOT p50 (ms)", "Accept len"]),
        (136, [*SEED, "Fail", "Short", "TTFT p50 (ms)", "TPOT p50 (ms)", "Accept len", "Srv queue max"]),
        (
            250,
            [
                *SEED,
                "Fail",
                "Short",
                "TTFT p50 (ms)",
                "TTFT p99 (ms)",
                "TPOT p50 (ms)",
                "TPOT p99 (ms)",
                "E2E p50 (s)",
                "Steady tok/s",
                "Mean conc",
                "Req/s",
                "Accept len",
                "Srv run max",
                "Srv queue max",
                "Srv queue mean",
            ],
        ),
    ],
)
def test_level_table_fits_the_width(mtp: Run, width: int, shown: list[str]) -> None:
    text = render_levels(mtp.levels, "github", TableView(width=width))
    assert header(text) == shown
    assert max(len(ln) for ln in text.splitlines()) <= width
    # The longest head of the priority that fits: the next one hidden would not.
    keys = [c.key for c in level_columns() if c.header in shown]
    hidden = [c for c in level_columns() if c.header not in shown and c.shown(mtp.levels)]
    nxt = min(hidden, key=lambda c: RANK[c.key])
    wider = render_levels(mtp.levels, "github", TableView(frozenset([*keys, nxt.key])))
    assert max(len(ln) for ln in wider.splitlines()) > width
    assert note(text) is not None and len(note(text) or "") <= width
    assert (note(text) or "").startswith(f"{len(hidden)} more column")


def test_level_table_whole_and_machine_formats_keep_every_column(mtp: Run) -> None:
    narrow = TableView(width=80)
    whole = render_levels(mtp.levels, "github")
    assert len(header(whole)) == 21 and note(whole) is None
    assert "|   C |   Agg tok/s |" in whole  # the files keep tabulate's own padding
    for fmt in ("csv", "json"):
        assert render_levels(mtp.levels, fmt, narrow) == render_levels(mtp.levels, fmt)


@pytest.mark.parametrize(
    ("columns", "shown"),
    [
        ("seed", SEED),
        ("latency", ["C", "TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)", "TPOT p99 (ms)", "E2E p50 (s)"]),
        ("server", ["C", "Accept len", "Srv run max", "Srv run mean", "Srv queue max", "Srv queue mean"]),
        ("failures", ["C", "Ok", "Fail", "Short"]),  # no 429 column: no level had one
        ("throughput", ["C", "Steady tok/s", "Mean conc", "Req/s"]),
        ("seed,srv_queue_max,fail", [*SEED, "Fail", "Srv queue max"]),
    ],
)
def test_level_table_columns_sets(mtp: Run, columns: str, shown: list[str]) -> None:
    text = render_levels(mtp.levels, "github", view_for(columns, 80))
    assert header(text) == shown and note(text) is None  # exactly what was asked for, nothing said
    assert "| C |" in text or "|   C |" in text


def test_all_is_every_column_even_wider_than_the_terminal(mtp: Run) -> None:
    text = render_levels(mtp.levels, "github", view_for("all", 80))
    assert len(header(text)) == 21 and note(text) is None
    assert max(len(ln) for ln in text.splitlines()) > 200


def test_report_prints_the_view_and_writes_the_whole_table(pair: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir = tmp_path / "mtp"
    shutil.copytree(pair[1], run_dir)
    run = load_run(run_dir)
    out, err = io.StringIO(), io.StringIO()
    path = print_report(run, "github", out=out, err=err, view=TableView(width=100))
    printed = out.getvalue()
    assert max(len(ln) for ln in table_lines(printed)) <= 100
    assert (note(printed) or "").startswith(
        "12 more columns with --columns all (or in report.md): TTFT p50, TTFT p99, TPOT p50, "
    )
    assert path is not None and path.read_text() == render_report(run, "github")  # report.md: whole
    assert len(header(path.read_text())) == 21


def test_report_command_columns_flag(pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert report_main([str(pair[1]), "--no-write", "--columns", "seed"]) == 0
    assert header(capsys.readouterr().out) == SEED
    assert report_main([str(pair[1]), "--no-write", "--columns", "nope"]) == 2
    assert "--columns: unknown column or set 'nope'" in capsys.readouterr().err


# ---------------------------------------------------------------- compare's table


@pytest.mark.parametrize(
    ("width", "groups"),
    [
        (120, ["agg", "per_req"]),
        (250, ["agg", "per_req", "ttft_p50", "accept"]),
        (360, ["agg", "per_req", "ttft_p50", "tpot_p50", "srv_run_queue", "accept", "ttft_p99"]),  # all: 352
    ],
)
def test_compare_table_fits_the_width(pair: tuple[Path, Path], width: int, groups: list[str]) -> None:
    comp = build_comparison([load_run(p) for p in pair])
    text = render_comparison(comp, "github", TableView(width=width))
    cols = _columns(comp)
    expected = [name for name, key in cols if key == "c" or key in groups]
    assert header(text) == expected  # a figure's columns go together: both runs' values and the change
    assert max(len(ln) for ln in text.splitlines()) <= width
    hidden = {key for _, key in cols} - {"c", *groups}
    if hidden:  # counted in columns, named by figure
        n = sum(key in hidden for _, key in cols)
        assert (note(text) or "").startswith(f"{n} more columns with --columns all (or in comparison.md): ")
    else:
        assert note(text) is None


def test_compare_at_80_columns_has_a_row_per_run_with_both_speeds_and_their_changes(
    pair: tuple[Path, Path],
) -> None:
    """Too narrow for each run's per-request tok/s beside its aggregate (as wide for 2 runs as for 5):
    a row per level and run, the change on the treatment's row, the level on its first row."""
    comp = build_comparison([load_run(p) for p in pair])
    text = render_comparison(comp, "github", TableView(width=80))
    assert header(text) == ["C", "Run", "Agg tok/s", "Δ agg", "Per-req tok/s", "Δ per-req"]
    assert max(len(ln) for ln in text.splitlines()) <= 80
    rows = [ln.strip("|").split("|") for ln in table_lines(text)[2:]]
    assert [[c.strip() for c in r] for r in rows[8:10]] == [
        ["64", "baseline", "2327.0", "", "40.0", ""],
        ["", "mtp", "1571.1", "-32% (1 run)", "65.7", "+64% (1 run)"],
    ]
    assert (note(text) or "").startswith("6 more columns with --columns all (or in comparison.md): TTFT p50")


def test_compare_columns_sets(pair: tuple[Path, Path]) -> None:
    comp = build_comparison([load_run(p) for p in pair])
    text = render_comparison(comp, "github", view_for("seed", 80))
    assert header(text) == [
        "C",
        "Agg tok/s baseline",
        "Agg tok/s mtp",
        "Δ agg mtp",
        "Per-req tok/s baseline",
        "Per-req tok/s mtp",
        "Δ per-req mtp",
    ]
    text = render_comparison(comp, "github", view_for("latency", 80))
    assert header(text) == [
        "C",
        "TTFT p50 (ms) baseline",
        "TTFT p50 (ms) mtp",
        "TTFT p99 (ms) baseline",
        "TTFT p99 (ms) mtp",
        "TPOT p50 (ms) baseline",
        "TPOT p50 (ms) mtp",
        "Δ TPOT mtp",
    ]
    text = render_comparison(comp, "github", view_for("server", 80))
    assert header(text) == [
        "C",
        "Accept len baseline",
        "Accept len mtp",
        "Srv run/queue baseline",
        "Srv run/queue mtp",
    ]
    assert render_comparison(comp, "csv", TableView(width=80)) == render_comparison(comp, "csv")


def test_compare_writes_the_whole_table_and_prints_the_view(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_compare(pair, out=tmp_path / "c", plot=False, view=TableView(width=120))
    assert max(len(ln) for ln in table_lines(result.text)) <= 120 and note(result.text)
    assert len(header(result.markdown.read_text())) == len(_columns(result.comparison))
    assert note(result.markdown.read_text()) is None
    assert compare_main([*map(str, pair), "--out", str(tmp_path / "d"), "--no-plot", "--columns", "x"]) == 2
    assert "--columns: unknown column or set 'x'" in capsys.readouterr().err


def test_render_view_keeps_the_note_out_of_machine_formats() -> None:
    headers, keys, rows = ["C", "Agg tok/s", "TTFT p99 (ms)"], ["c", "agg", "ttft_p99"], [["1", "5.0", "9.9"]]
    csv = render_view(headers, keys, rows, "csv", TableView(width=10), "report.md")
    assert csv == "C,Agg tok/s,TTFT p99 (ms)\n1,5.0,9.9\n"
    text = render_view(headers, keys, rows, "plain", TableView(width=20), "report.md")
    assert text.splitlines()[0].split() == ["C", "Agg", "tok/s"] and note(text) is not None


# ---------------------------------------------------------------- the command line


def test_columns_is_a_display_flag_of_sweep_and_demo_not_a_scenario_field() -> None:
    args = build_parser().parse_args(["sweep", "--host", "http://h:1", "--levels", "1,2", "--columns=all"])
    assert args.columns == "all" and args.locust_args == []
    assert "sc_columns" not in vars(args)  # not in the field table: it never reaches Locust or run.json
    assert build_parser().parse_args(["demo", "--columns", "seed,latency"]).columns == "seed,latency"
    assert build_parser().parse_args(["sweep", "--host", "http://h:1"]).columns is None


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_sweep_passes_columns_through_args() -> None:
    out = subprocess.run(
        ["make", "-n", "-s", "sweep", "HOST=http://h:1", "ARGS=--columns=all", "VENV=/nonexistent"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("/nonexistent/bin/specload sweep"))
    args = build_parser().parse_args(shlex.split(line)[1:])
    assert (args.command, args.host, args.columns) == ("sweep", "http://h:1", "all")


def test_rate_levels_keep_their_rate_column(mtp: Run) -> None:
    levels = [dataclasses.replace(s, rate=float(2 * (i + 1))) for i, s in enumerate(mtp.levels)]
    text = render_levels(levels, "github", TableView(width=80))
    assert header(text)[:3] == ["Rate (req/s)", "C", "Agg tok/s"]  # the levels' own columns, always
    assert max(len(ln) for ln in text.splitlines()) <= 80
    latency = render_levels(levels, "github", view_for("latency", 80))
    assert header(latency)[:3] == ["Rate (req/s)", "C", "TTFT p50 (ms)"]
