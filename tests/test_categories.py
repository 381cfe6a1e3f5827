"""Categorised prompt sets (SPEED-Bench's rows: category and turns): read from a JSONL file, each
record carries its category, and the report and compare give acceptance and the change per category."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import orjson
import pytest

from specload.analysis.comparison import build_comparison
from specload.analysis.run import load_run
from specload.core.records import RequestRecord, read_records
from specload.present.compare import category_lines, to_dict
from specload.present.report import render_report
from specload.workload.datasets import DatasetError, Item, jsonl_pairs, sample
from tests.fixtures.make_compare_runs import TOKENS, write_reference_pair
from tests.fixtures.sim_sweep import Words, sim_sweep

FIXTURE = Path(__file__).parent / "fixtures" / "speed_bench_sample.jsonl"


def test_speed_bench_rows_are_read_with_their_category() -> None:
    pairs = list(jsonl_pairs(FIXTURE))
    assert len(pairs) == 12
    assert {p.category for p in pairs} == {"coding", "math", "writing"}
    first = json.loads(FIXTURE.read_text().splitlines()[0])
    assert pairs[0].prompt == first["turns"][0]  # the first turn is the prompt
    items = sample(iter(pairs), 100, 0, Words(), None, default_output=32)
    assert len(items) == 12 and {i.output_tokens for i in items} == {32}  # no reference: the scenario's
    assert all(msgspec.convert(msgspec.msgpack.decode(msgspec.msgpack.encode(i)), Item) == i for i in items)
    assert sorted(i.category or "" for i in items) == sorted(p.category or "" for p in pairs)


def test_a_categorised_row_is_not_held_to_the_sharegpt_caps(tmp_path: Path) -> None:
    long = " ".join(["w"] * 3000)
    path = tmp_path / "c.jsonl"
    path.write_text(
        json.dumps({"category": "rag", "turns": [long]}) + "\n" + json.dumps({"prompt": long}) + "\n"
    )
    items = sample(jsonl_pairs(path), 10, 0, Words(), 8)
    assert [(i.category, i.prompt_tokens) for i in items] == [("rag", 3000)]  # the plain row is capped out


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"category": "x", "turns": []}, "'turns' must be a list of texts"),
        ({"category": "x", "turns": [3]}, "'turns' must be a list of texts"),
        ({"category": 5, "turns": ["a b c d"]}, "'category' must be a non-empty string"),
    ],
)
def test_bad_categorised_rows_name_the_line(tmp_path: Path, row: dict[str, object], match: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match=match):
        list(jsonl_pairs(path))


ACCEPT = {"coding": 2.5, "writing": 1.25}  # the MTP run's accept length per category, by construction


def _categorise(d: Path, spec: bool) -> None:
    """Alternate the records between two categories; in the MTP run give each its own accept length."""
    recs = read_records(str(d / "records.jsonl"))
    out = []
    for r in recs:
        cat = "coding" if r.seq % 2 == 0 else "writing"
        r.category = cat
        if spec:
            r.spec_verify_ct = round(TOKENS / ACCEPT[cat])
        out.append(r)
    (d / "records.jsonl").write_bytes(b"".join(RequestRecord.to_json(r) + b"\n" for r in out))


def test_report_and_compare_per_category(tmp_path: Path) -> None:
    base, mtp = write_reference_pair(tmp_path)
    _categorise(base, False)
    _categorise(mtp, True)
    run = load_run(mtp)
    for s in run.levels:
        assert s.mix is not None
        cats = {g.key: g.stats for g in s.mix.categories}
        assert set(cats) == {"coding", "writing"}
        assert sum(g.sent for g in cats.values()) == s.sent
        for name, g in cats.items():
            assert g.figure("accept") == pytest.approx(ACCEPT[name])
        assert s.figure("accept") == pytest.approx(
            TOKENS * s.ok / sum(round(TOKENS / a) * (s.ok / 2) for a in ACCEPT.values())
        )
    text = render_report(run)
    assert "## Prompt categories" in text
    table = text.split("## Prompt categories")[1].split("\n## ")[0]
    assert "| coding" in table and "2.50" in table and "1.25" in table
    # a category's Agg tok/s is the level's times its token share: the share is shown instead
    assert "Agg tok/s" not in table.splitlines()[2] and "Tokens %" in table.splitlines()[2], table
    for s in run.levels:
        assert s.mix is not None
        assert [g.stats.extra["output_token_share"] for g in s.mix.categories] == [0.5, 0.5]
    comp = build_comparison([load_run(base), run])
    (coding, writing) = comp.categories
    assert (coding.category, writing.category) == ("coding", "writing")
    # Each category is half of every level in both runs: its per-request changes are the level's (its
    # aggregate's would be too, by construction: it has none, and its verdict speaks of per-request only).
    for cc in (coding, writing):
        assert not hasattr(cc, "agg")
        assert [ch.pct for ch in cc.per_req["mtp"]] == pytest.approx([ch.pct for ch in comp.per_req["mtp"]])
        assert [f.of("output_token_share") for f in cc.figures["mtp"]] == pytest.approx(
            [0.5] * len(comp.levels)
        )
        assert cc.sentences[0].startswith(
            f"mtp on {cc.category} prompts: per-request speed stays higher at every level"
        ), cc.sentences
        assert "aggregate" not in cc.sentences[0]
        assert [f.of("accept_length") for f in cc.figures["mtp"]] == pytest.approx(
            [ACCEPT[cc.category]] * len(comp.levels)
        )
    lines = "\n".join(category_lines(comp))
    assert "## Per prompt category" in lines and "mtp on writing prompts" in lines
    data = to_dict(comp)
    assert [c["category"] for c in data["categories"]] == ["coding", "writing"]
    assert list(data["categories"][0]["changes"]["mtp"]) == ["per_req"]
    assert data["categories"][0]["changes"]["mtp"]["per_req"][0]["pct"] == pytest.approx(
        comp.per_req["mtp"][0].pct
    )
    assert (
        "| TPOT p50 (ms)" in lines
        and "| Tokens %" in lines
        and "Δ agg" not in lines.split("## Per prompt category")[1]
    )


def test_no_categories_no_section(tmp_path: Path) -> None:
    base, mtp = write_reference_pair(tmp_path)
    assert "## Prompt categories" not in render_report(load_run(mtp))
    comp = build_comparison([load_run(base), load_run(mtp)])
    assert category_lines(comp) == [] and to_dict(comp)["categories"] == []


def test_sweep_with_a_categorised_dataset(sim, tmp_path: Path) -> None:
    s = sim("--engine", "batch", "--preset", "mtp", "--time-scale", "0.05")
    args = ["--backend", "sglang", "--dataset", str(FIXTURE), "--output-tokens", "24", "--levels", "1,4"]
    out = sim_sweep(s.url, tmp_path / "out", *args, "--metrics-interval", "0")
    run_dir = out.run_dir
    recs, measured = out.records(None), out.records()
    assert measured and {r.category for r in measured} <= {"coding", "math", "writing"}
    assert all(r.category is not None for r in recs)
    assert all(r.requested_output_tokens == 24 for r in measured)
    run = load_run(run_dir)
    for lv in run.levels:
        assert lv.mix is not None
        for g in lv.mix.categories:
            mine = [r for r in measured if r.level == lv.index and r.category == g.key and r.status == "ok"]
            used = [r for r in mine if r.spec_verify_ct]
            assert used, "the MTP simulator reports spec_verify_ct"
            want = sum(r.output_tokens for r in used) / sum(r.spec_verify_ct or 0 for r in used)
            assert g.stats.figure("accept") == pytest.approx(want)
    assert "## Prompt categories" in (run_dir / "report.md").read_text()
    assert orjson.loads((run_dir / "run.json").read_bytes())["prompts"]["material"] == "dataset"
