"""The live page's SLO column: each level judged by the run's SLO exactly as the report judges it."""

from __future__ import annotations

from pathlib import Path

from specload.analysis.live import LiveRun
from specload.analysis.run import load_run
from specload.core.slo import parse_slo
from specload.present.report import slo_met_cell
from tests.test_report import T0, sample_meta, sample_records, write_run


def test_live_slo_verdicts_are_the_reports(tmp_path: Path) -> None:
    records = sample_records()
    slo = parse_slo("ttft_p50=2s,tpot_p50=50ms")
    run_dir = write_run(tmp_path / "r", records, sample_meta())
    live = LiveRun(3, slo=slo)
    for r in records:
        live.add_record(r)
    report = load_run(run_dir, slo).levels
    cells = []
    for i, c in enumerate((1, 2)):
        s = live.stats(i, c, 0, "completed", final=True, now=T0)
        assert s is not None and s.slo is not None and report[i].slo is not None
        assert (s.slo.good, s.slo.sent, s.slo.met) == (
            report[i].slo.good,
            report[i].slo.sent,
            report[i].slo.met,
        )
        cells.append(slo_met_cell(s.slo))
    assert all(c in ("yes", "no", "yes ~", "no ~") for c in cells), cells
    no_slo = LiveRun(3)
    for r in records:
        no_slo.add_record(r)
    s = no_slo.stats(0, 1, 0, "completed", final=True, now=T0)
    assert s is not None and s.slo is None
