"""A sweep against the simulator, read back: every acceptance figure reaches the report, the JSON, the
CSV and the comparison (the sim's acceptance is exact: k = 3, every draft accepted, 64 tokens a
request, so 16 verify steps with 47 drafts accepted of 48: tests/test_acceptance_sim.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specload.cli import main
from specload.core.records import SPEC_VLLM
from specload.present.webview import report_bundle
from tests.fixtures.sim_sweep import sim_sweep
from tests.test_acceptance_sim import K3


def _sweep(url: str, out: Path) -> Path:
    """Samples of /metrics every 30 s, longer than the sweep: the periodic ones bound no level, and
    the counters' figures come from the samples taken as each level closed."""
    args = ["--levels", "1,2", "--requests-per-level", "6", "--warmup-requests", "0", "--input-tokens", "16"]
    args += ["--metrics-interval", "30"]
    return sim_sweep(url, out, *args, "--output-tokens", "64", "--read-timeout", "30").run_dir


def test_acceptance_in_report_json_csv_and_compare(
    sim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    s = sim(*K3, "--metrics-style", "vllm", "--per-request-spec-decode-metrics", "detailed")
    run = _sweep(s.url, tmp_path / "runs")
    assert main(["report", str(run), "--format", "json", "--no-write"]) == 0
    levels = json.loads(capsys.readouterr().out)
    for lv in levels:
        a = lv["acceptance"]
        assert a["length"] == pytest.approx(1 + 47 / 16) and a["rate"] == pytest.approx(47 / 48)
        assert a["per_position"] == pytest.approx([1.0, 1.0, 15 / 16])
        assert a["histogram"] == [0, 0, 6, 90] and a["along"] == pytest.approx([1 + 47 / 16])
        assert a["sources"]["length"] == SPEC_VLLM and a["note"] is None
        assert lv["accept_length_source"] == SPEC_VLLM and lv["itl_unit"] == "token"
        # the server's counters over the level, to its close sample: the same figures exactly
        assert a["counter_length"] == pytest.approx(a["length"]) and a["counter_rate"] == pytest.approx(
            a["rate"]
        )
        assert a["counter_per_position"] == pytest.approx(a["per_position"])
    closes = [json.loads(line).get("closes") for line in (run / "server_samples.jsonl").open()]
    assert sorted(c for c in closes if c is not None) == [0, 1]
    assert main(["report", str(run), "--format", "csv", "--no-write"]) == 0
    csv = capsys.readouterr().out.splitlines()
    header = csv[0].split(",")
    assert "Accept rate %" in header and "Accept >=k %" in header
    assert csv[1].split(",")[header.index("Accept rate %")] == "97.9"
    assert csv[1].split(",")[header.index("Accept >=k %")] == "100/100/94"
    assert main(["report", str(run), "--no-write"]) == 0
    text = capsys.readouterr().out
    assert "## Acceptance" in text and "0:0% 1:0% 2:6% 3:94%" in text
    (sources,) = [line for line in text.splitlines() if line.startswith("- Accept len, Accept rate")]
    assert sources.endswith(
        "the acceptance along the output from vLLM's per-request metrics.speculative_decoding"
    )
    page = report_bundle(run)  # the web page's report: the same text and data
    assert "## Acceptance" in page["markdown"] and "Accept rate %" in page["csv"]
    assert page["levels"][0]["acceptance"]["rate"] == pytest.approx(47 / 48)
    args = ["compare", str(run), str(run), "--out", str(tmp_path / "cmp"), "--no-plot"]
    assert main([*args, "--format", "json"]) == 0
    levels = json.loads(capsys.readouterr().out)["levels"]
    assert all(f["accept_rate"] == pytest.approx(47 / 48) for lv in levels for f in lv["runs"].values())
    assert main([*args, "--format", "csv"]) == 0
    csv = capsys.readouterr().out.splitlines()
    rates = [i for i, h in enumerate(csv[0].split(",")) if h.startswith("Accept rate %")]
    assert len(rates) == 2 and all(row.split(",")[i] == "97.9" for row in csv[1:] for i in rates)
