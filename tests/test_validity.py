"""Records read back are held to the client's own rules (review ab9c161, M11): a record that
breaks them is counted as invalid with a note in the report, never used in a figure."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from specload.analysis.run import load_run
from specload.analysis.validity import E2E, OK_COUNT, RULES, TIMES, TOKENS, Validity, broken
from specload.core.records import make_record
from specload.core.tokencap import overrun_cap

SAMPLE = Path(__file__).parent / "fixtures" / "sample_run"
T = 1_764_475_200.0


def _rec(**kw: object):  # type: ignore[no-untyped-def]
    fields = dict(
        level=0,
        concurrency=1,
        phase="measure",
        seq=0,
        backend="openai",
        status="ok",
        reason=None,
        http_status=200,
        prompt_tokens=8,
        requested_output_tokens=16,
        requested_prompt_tokens=8,
        chunks=16,
        itl_max_s=None,
        spec_verify_ct=None,
        worker="local",
        output_tokens_source="usage",
    )
    times = {"t_send": T, "t_first": T + 0.05, "t_last": T + 0.2, "t_end": T + 0.2, "output_tokens": 16}
    for k in list(kw):
        if k in times:
            times[k] = kw.pop(k)  # type: ignore[assignment]
    fields.update(kw)
    return make_record(**times, **fields)  # type: ignore[arg-type]


def test_each_rule_is_the_clients_own() -> None:
    good = [
        _rec(),
        _rec(status="short", output_tokens=9, reason="server counted 9 of 16 tokens asked for"),
        _rec(status="ok", output_tokens=15, output_tokens_source="chunks"),  # a chunk count approximates
        _rec(status="failed", output_tokens=overrun_cap(16), output_tokens_source="chunks"),
        _rec(status="failed", t_first=None, t_last=None, output_tokens=0),
    ]
    assert broken(good).tolist() == [-1] * len(good)
    assert broken([_rec(status="great")]).tolist() == [-1]  # counted under its own name by the report
    bad = {
        OK_COUNT: _rec(output_tokens=15),
        TOKENS: _rec(status="failed", output_tokens=10**12),
        TIMES: _rec(t_first=T - 1.0),
    }
    verdict = broken(list(bad.values())).tolist()
    assert [RULES[v] for v in verdict] == list(bad)
    assert broken([_rec(output_tokens=10**12)]).tolist() == [RULES.index(OK_COUNT)]  # the first rule wins
    assert broken([_rec(t_last=T + 0.3)]).tolist() == [RULES.index(TIMES)]  # the last token after the end
    assert broken([replace(_rec(), e2e_s=5.0)]).tolist() == [RULES.index(E2E)]
    assert broken([_rec(requested_output_tokens=0, output_tokens=0)]).tolist() == [RULES.index(TOKENS)]


def test_invalid_records_are_counted_and_described_once() -> None:
    v = Validity()
    recs = [_rec(seq=0), _rec(seq=1, output_tokens=10**12, status="failed"), _rec(seq=2, t_first=T - 1)]
    assert v.keep(recs) == recs[:1]
    assert v.keep(recs[:1]) == recs[:1]
    later = Validity()
    later.keep([_rec(seq=3, t_first=T - 1)])
    v.merge(later)
    assert v.invalid == 3
    note = v.note() or ""
    assert note.startswith("3 record(s) break the client's own rules and are left out of every figure")
    assert f"2 {TIMES}" in note and f"1 {TOKENS}" in note
    assert "the first: level 0 measure #1" in note and "the client accepts at most 32" in note
    assert Validity().note() is None


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d)
    return d


def test_a_whole_run_keeps_every_rule(tmp_path: Path) -> None:
    run = load_run(_copy(tmp_path))
    assert not [n for n in run.notices if "client's own rules" in n], run.notices


def test_a_record_claiming_a_trillion_tokens_is_left_out_with_a_note(tmp_path: Path) -> None:
    """The review's record: status ok, 10^12 tokens of 16 asked made Agg tok/s 1.4e12."""
    d = _copy(tmp_path)
    lines = (d / "records.jsonl").read_text().splitlines(keepends=True)
    i = next(i for i, ln in enumerate(lines) if json.loads(ln)["phase"] == "measure")
    honest = load_run(d)
    forged = json.loads(lines[i])
    forged["output_tokens"] = 10**12
    (d / "records.jsonl").write_text("".join(lines[:i] + [json.dumps(forged) + "\n"] + lines[i + 1 :]))
    run = load_run(d)
    (note,) = [n for n in run.notices if "client's own rules" in n]
    assert note.startswith("1 record(s) break the client's own rules") and "1000000000000 tokens" in note
    level = forged["level"]
    before = next(s for s in honest.levels if s.index == level)
    after = next(s for s in run.levels if s.index == level)
    assert after.agg_tok_s is not None and before.agg_tok_s is not None
    assert after.agg_tok_s < 10 * before.agg_tok_s  # not 1e12: the record is not used
    assert after.sent == before.sent - 1
    # and the count against run.json says so too (specload.analysis.reconcile)
    assert any("1 measured record(s) missing" in n for n in run.notices), run.notices


@pytest.mark.parametrize("n", [1, 3000])
def test_a_block_of_valid_records_passes_unchanged(n: int) -> None:
    recs = [_rec(seq=i) for i in range(n)]
    assert Validity().keep(recs) is recs


def test_warmup_records_enter_no_figure_and_are_not_judged() -> None:
    assert broken([_rec(phase="warmup", output_tokens=3)]).tolist() == [-1]
