"""Other tools' result files beside specload's: each reader against a real file made by its tool
(tests/fixtures/foreign/README.md says how), and the one-table comparison with the marks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specload.analysis.foreign import MARK, ForeignRun, load_foreign
from specload.present.compare import CompareError, run_compare, table_columns, table_rows
from specload.present.compare import render_table as compare_table

FIX = Path(__file__).parent / "fixtures" / "foreign"


def _load(name: str) -> ForeignRun:
    run = load_foreign(FIX / name)
    assert run is not None
    return run


def _lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIX / name).read_text().splitlines() if line.strip()]


def test_vllm_appended_results_are_levels_with_figures_from_the_file():
    run = _load("vllm.json")
    raw = _lines("vllm.json")
    assert run.tool == "vllm bench serve" and run.info.model == "tiny"
    assert [s.concurrency for s in run.levels] == [r["max_concurrency"] for r in raw] == [1, 4]
    for s, r in zip(run.levels, raw, strict=True):
        assert s.ok == r["completed"] and s.failed == r["failed"]
        assert s.agg_tok_s == pytest.approx(r["output_throughput"])
        assert s.figure("tpot_p50") == pytest.approx(r["median_tpot_ms"])
        assert s.dists["itl"].p[99.0] * 1e3 == pytest.approx(r["p99_itl_ms"])
        # --save-detailed: Per-req tok/s is specload's definition over the per-request lists
        want = np.mean(
            [
                n / e
                for n, e, err in zip(r["output_lens"], r["latencies"], r["errors"], strict=True)
                if not err
            ]
        )
        assert s.per_req_tok_s == pytest.approx(want)
        assert s.figure("ttft_p50") == pytest.approx(r["median_ttft_ms"])  # same numpy median as vLLM's
    assert run.marked == {"itl_p99", "per_req"}  # no failures: Agg is specload's definition


def test_sglang_jsonl_lines_are_levels_and_tpot_is_marked():
    run = _load("sglang.jsonl")
    raw = _lines("sglang.jsonl")
    assert run.tool == "sglang bench_serving"
    assert [s.concurrency for s in run.levels] == [1, 4]
    for s, r in zip(run.levels, raw, strict=True):
        assert s.agg_tok_s == pytest.approx(r["output_throughput"])
        assert s.figure("ttft_p99") == pytest.approx(r["p99_ttft_ms"])
        assert s.figure("tpot_p50") == pytest.approx(r["median_tpot_ms"])
        assert s.per_req_tok_s is None  # the file has no per-request E2E
        assert s.output_tokens == r["total_output_tokens"]
    # the native backend's ITL is per token, as specload's on /generate: not marked
    assert run.marked == {"tpot_p50", "agg"}


def test_guidellm_figures_are_computed_from_its_requests():
    run = _load("guidellm.json")
    doc = json.loads((FIX / "guidellm.json").read_text())
    assert [s.concurrency for s in run.levels] == [
        b["config"]["strategy"]["streams"] for b in doc["benchmarks"]
    ]
    for s, b in zip(run.levels, doc["benchmarks"], strict=True):
        ok = b["requests"]["successful"]
        assert s.ok == b["metrics"]["request_totals"]["successful"] == len(ok)
        wall = max(r["request_end_time"] for r in ok) - min(r["request_start_time"] for r in ok)
        assert s.agg_tok_s == pytest.approx(sum(r["output_tokens"] for r in ok) / wall)
        assert s.per_req_tok_s == pytest.approx(
            np.mean([r["output_tokens"] / r["request_latency"] for r in ok])
        )
        # GuideLLM's ITL is specload's TPOT: the same median as its own aggregate
        itl = b["metrics"]["inter_token_latency_ms"]["successful"]
        assert s.figure("tpot_p50") == pytest.approx(np.median([r["inter_token_latency_ms"] for r in ok]))
        assert itl["count"] > 0
    assert run.marked == {"tpot_p50"}


def test_genai_bench_folder_is_one_run_of_its_concurrencies():
    run = _load("genai-bench")
    assert run.tool == "genai-bench" and run.info.model == "tiny"
    files = sorted((FIX / "genai-bench").glob("D*.json"))
    raw = sorted(
        (json.loads(p.read_text()) for p in files), key=lambda d: d["aggregated_metrics"]["num_concurrency"]
    )
    assert [s.concurrency for s in run.levels] == [1, 4]
    for s, d in zip(run.levels, raw, strict=True):
        a = d["aggregated_metrics"]
        assert s.agg_tok_s == pytest.approx(a["mean_output_throughput_tokens_per_s"])
        reqs = d["individual_request_metrics"]
        assert s.figure("ttft_p50") == pytest.approx(a["stats"]["ttft"]["p50"] * 1e3)
        assert s.per_req_tok_s == pytest.approx(
            np.mean([r["num_output_tokens"] / r["e2e_latency"] for r in reqs])
        )
    assert run.marked == {"agg", "tpot_p50"}


def test_a_specload_run_directory_is_not_foreign(tmp_path):
    assert load_foreign(FIX / "specload") is None
    (tmp_path / "x.json").write_text('{"a": 1}')
    assert load_foreign(tmp_path / "x.json") is None


def test_one_table_of_every_tool_with_the_marks(tmp_path):
    paths = [FIX / n for n in ("specload", "vllm.json", "sglang.jsonl", "guidellm.json", "genai-bench")]
    result = run_compare(paths, out=tmp_path, plot=False)
    comp = result.comparison
    assert [r.label for r in comp.runs] == ["specload", "vllm", "sglang", "guidellm", "genai-bench"]
    assert comp.levels == [1, 4]
    cols, rows = table_columns(comp), table_rows(comp)
    cell = {(row[0], name): row[j] for row in rows for j, name in enumerate(cols)}
    assert not cell[("1", "Agg tok/s specload")].endswith(MARK)
    assert cell[("1", "Agg tok/s genai-bench")].endswith(MARK)
    assert cell[("4", "Δ agg genai-bench")].endswith(MARK)
    assert cell[("4", "TPOT p50 (ms) guidellm")].endswith(MARK)
    assert cell[("4", "ITL p99 (ms) vllm")].endswith(MARK)
    assert not cell[("4", "ITL p99 (ms) sglang")].endswith(MARK)
    assert cell[("1", "Per-req tok/s sglang")] == "-"  # not in the file: left out, not marked
    assert not cell[("4", "Agg tok/s vllm")].endswith(MARK)
    text = (tmp_path / "comparison.md").read_text()
    assert f"genai-bench: Agg tok/s{MARK} (genai-bench): mean_output_throughput_tokens_per_s" in text
    assert f"guidellm: TPOT p50{MARK} (guidellm): named ITL by GuideLLM" in text
    # the figures are the files' own: vLLM's Agg at C=4 as it printed it
    assert cell[("4", "Agg tok/s vllm")] == f"{_lines('vllm.json')[1]['output_throughput']:.1f}"


def test_the_json_carries_the_marks_per_figure(tmp_path):
    """compare's JSON says per figure of each run what the table's † says: the mark, the tool, how."""
    paths = [FIX / n for n in ("specload", "vllm.json", "sglang.jsonl", "guidellm.json", "genai-bench")]
    result = run_compare(paths, out=tmp_path, plot=False)
    comp = result.comparison
    data = json.loads(compare_table(comp, "json"))
    cols, rows = table_columns(comp), table_rows(comp)
    keys = {
        "Agg tok/s": "agg_tok_s",
        "Per-req tok/s": "per_req_tok_s",
        "TTFT p50 (ms)": "ttft_p50_ms",
        "TTFT p99 (ms)": "ttft_p99_ms",
        "TPOT p50 (ms)": "tpot_p50_ms",
        "ITL p99 (ms)": "itl_p99_ms",
    }
    checked = 0
    for lv, row in zip(data["levels"], rows, strict=True):
        for label, fig in lv["runs"].items():
            for head, key in keys.items():
                name = f"{head} {label}"
                if name not in cols or row[cols.index(name)] == "-":
                    continue
                marked = row[cols.index(name)].endswith(MARK)
                assert (key in fig["marks"]) == marked, (label, key, fig["marks"])
                if marked:
                    m = fig["marks"][key]
                    assert m["mark"] == MARK and m["tool"] and m["how"], m
                    assert f"{MARK} ({m['tool']}): {m['how']}" in " ".join(data["notes"]), m
                    checked += 1
        for label, ch in lv["changes"].items():
            for k, head in (("agg", "Δ agg"), ("per_req", "Δ per-req")):
                name = f"{head} {label}"
                if name in cols and row[cols.index(name)] not in ("-", ""):
                    assert (k in ch["marks"]) == row[cols.index(name)].endswith(MARK), (label, k)
    assert checked >= 4
    assert all(not fig["marks"] for lv in data["levels"] for fig in [lv["runs"]["specload"]])


def test_a_file_of_no_known_tool_is_refused(tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text("[1, 2]")
    with pytest.raises(CompareError, match="not a directory"):
        run_compare([FIX / "specload", bad], out=tmp_path, plot=False)


# The keys llm-d-benchmark's v0.2 schema (llmdbenchmark/analysis/benchmark_report/schema_v0_2.py,
# every model extra="forbid") allows where specload writes; checked against it by hand with pydantic.
_V02_KEYS = {
    "": {"version", "run", "scenario", "results"},
    "run": {"uid", "eid", "cid", "time", "user"},
    "load.standardized": {
        "tool",
        "tool_version",
        "source",
        "stage",
        "input_seq_len",
        "output_seq_len",
        "prefix",
        "multi_turn",
        "rate_qps",
        "concurrency",
    },
    "aggregate": {"requests", "latency", "throughput"},
    "latency": {
        "time_to_first_token",
        "normalized_time_per_output_token",
        "time_per_output_token",
        "inter_token_latency",
        "request_latency",
    },
    "throughput": {"input_token_rate", "output_token_rate", "total_token_rate", "request_rate"},
    "statistics": {
        "units",
        "mean",
        "mode",
        "stddev",
        "min",
        "p0p1",
        "p1",
        "p5",
        "p10",
        "p25",
        "p50",
        "p75",
        "p90",
        "p95",
        "p99",
        "p99p9",
        "max",
    },
}


def test_llmd_reports_one_per_level_with_specload_figures(tmp_path):
    from specload.analysis.run import load_run
    from specload.present.llmd import main, reports

    run = load_run(FIX / "specload")
    docs = reports(run)
    assert [label for label, _ in docs] == [s.label for s in run.levels] == ["c001", "c004"]
    for (_, doc), s in zip(docs, run.levels, strict=True):
        assert set(doc) <= _V02_KEYS[""] and doc["version"] == "0.2"
        assert set(doc["run"]) <= _V02_KEYS["run"]
        load = doc["scenario"]["load"]["standardized"]
        assert set(load) <= _V02_KEYS["load.standardized"]
        assert load["concurrency"] == s.concurrency and load["output_seq_len"]["value"] == 32
        agg = doc["results"]["request_performance"]["aggregate"]
        assert set(agg) <= _V02_KEYS["aggregate"]
        assert (
            set(agg["latency"]) <= _V02_KEYS["latency"] and set(agg["throughput"]) <= _V02_KEYS["throughput"]
        )
        for stats in [*agg["latency"].values(), *agg["throughput"].values()]:
            assert set(stats) <= _V02_KEYS["statistics"] and "mean" in stats
        assert agg["throughput"]["output_token_rate"] == {"units": "tokens/s", "mean": s.agg_tok_s}
        assert agg["latency"]["time_to_first_token"]["p50"] == s.dists["ttft"].p[50.0]
        assert agg["latency"]["time_per_output_token"]["units"] == "s/token"
        assert agg["requests"]["total"] == s.sent
    assert main([str(FIX / "specload"), "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "llmd-c004.json").read_text()) == docs[1][1]


def test_a_genai_bench_folder_of_several_scenarios_is_refused(tmp_path):
    folder = tmp_path / "genai"
    folder.mkdir()
    for p in (FIX / "genai-bench").glob("*.json"):
        (folder / p.name).write_text(p.read_text())
    other = json.loads(
        (FIX / "genai-bench" / "D64_32_text-to-text_num_concurrency_4_time_2s.json").read_text()
    )
    other["aggregated_metrics"]["scenario"] = "D(128,32)"
    (folder / "D128_32_text-to-text_num_concurrency_4_time_2s.json").write_text(json.dumps(other))
    with pytest.raises(CompareError, match="several traffic scenarios"):
        run_compare([FIX / "specload", folder], out=tmp_path / "out", plot=False)
