"""Realistic mixes end to end: real Locust processes against the simulator started as a separate process.

Length distributions, prefix groups against the simulator's prefix cache, multi-turn conversations
and a class mix, each checked against what the scenario asked for and what the simulator's timing
model says (the fixed engine: TTFT = ttft + prefill per token x the prompt tokens not cached).
"""

from __future__ import annotations

import statistics
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from specload.core.records import PHASE_MEASURE, RequestRecord
from specload.present.report import Run, load_run
from specload.workload.config import Scenario, load_scenario, scenario_from_dict
from specload.workload.lengths import expected_mean, parse_dist
from specload.workload.request import draw_request, request_classes
from tests.conftest import specload_cmd
from tests.rundelay import RunDelay, client_lateness_s

FAST = ("--ttft-ms", "5", "--itl-ms", "1", "--max-running", "64", "--model", "m")
# The client's own delay on a TTFT, on a 2-core box shared with the simulator and other tests: the
# simulator is never early (it counts from the request's arrival), the client adds a few ms at most.
LATE_S = 0.008


def sweep(server_url: str, out: Path, *flags: str) -> Run:
    done = subprocess.run(
        specload_cmd("sweep", "--host", server_url, "--read-timeout", "30", "--out", str(out), *flags),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return load_run(run_dir)


def measured(run: Run) -> list[RequestRecord]:
    return [r for r in run.records if r.phase == PHASE_MEASURE]


def test_length_distributions_are_sent_as_drawn_by_every_process(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = sim(*FAST)
    inp, outp = "uniform:64:192", "lognormal:mean=24,sigma=0.5,min=4,max=64"
    run = sweep(
        server.url,
        tmp_path,
        "--levels",
        "1,8",
        "--requests-per-level",
        "48",
        "--warmup-requests",
        "2",
        "--input-dist",
        inp,
        "--output-dist",
        outp,
        "--processes",
        "2",
    )
    assert len({r.worker for r in run.records}) == 2  # two Locust processes drew
    classes = request_classes(_scenario(run))
    for r in run.records:  # warmups included: every ticket's lengths are the pure draw for it
        d = draw_request(classes, 0, r.level, r.phase, r.seq)
        assert (r.requested_prompt_tokens, r.requested_output_tokens) == (d.input_tokens, d.output_tokens)
        assert (r.prompt_tokens, r.output_tokens, r.status) == (d.input_tokens, d.output_tokens, "ok")
    for s in run.levels:
        drawn = [draw_request(classes, 0, s.index or 0, PHASE_MEASURE, q) for q in range(48)]
        ins, outs = [d.input_tokens for d in drawn], [d.output_tokens for d in drawn]
        lengths = s.mix.lengths
        assert lengths["input_sent"].n == lengths["input_counted"].n == 48
        assert lengths["input_sent"].mean == pytest.approx(statistics.fmean(ins))
        assert lengths["input_counted"].mean == pytest.approx(
            statistics.fmean(ins)
        )  # the server counted it so
        assert lengths["output_received"].mean == pytest.approx(statistics.fmean(outs))
        assert lengths["output_received"].max == max(outs) <= 64 and min(outs) >= 4
        assert min(ins) >= 64 and max(ins) <= 192 and lengths["input_sent"].max == max(ins)
        # And the draws follow the distribution asked for (48 draws: within 20% of its mean).
        assert statistics.fmean(ins) == pytest.approx(expected_mean(parse_dist(inp), 0), rel=0.2)
        assert statistics.fmean(outs) == pytest.approx(expected_mean(parse_dist(outp), 0), rel=0.2)
    report = (run.run_dir / "report.md").read_text()
    assert "## Request lengths" in report and "| input counted" in report


def _scenario(run: Run) -> Scenario:
    """The run's scenario as run.json has it."""
    sc = dict(run.meta["scenario"])
    if sc.get("token_id_range") is not None:
        sc["token_id_range"] = tuple(sc["token_id_range"])
    return scenario_from_dict(sc, "run.json")


def test_prefix_groups_hit_the_simulators_cache_and_cut_ttft_as_its_model_says(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ttft, prefill = 0.005, 0.0004  # s, s per prompt token computed
    server = sim(
        *FAST, "--prefill-us-per-token", "400", "--prefix-cache-tokens", "200000", "--metrics-style", "vllm"
    )
    common = ("--levels", "1", "--input-tokens", "512", "--output-tokens", "8", "--metrics-interval", "0.2")
    waited = RunDelay([server.proc.pid], this_thread=False)
    shared = sweep(
        server.url,
        tmp_path / "shared",
        *common,
        "--requests-per-level",
        "16",
        "--shared-prefix",
        "384",
        "--prefix-groups",
        "2",
    )
    alone = sweep(server.url, tmp_path / "alone", *common, "--requests-per-level", "6", "--seed", "1")
    cold, warm = ttft + prefill * 512, ttft + prefill * (512 - 384)  # 209.8 ms, 56.2 ms
    # A hit is under the midpoint, unless the simulator waited for a CPU, or the client lagged,
    # longer than the gap to it in this sweep (a loaded machine).
    slack = (cold - warm) / 2 + waited.s + client_lateness_s(shared, 0, worst=True)
    recs = sorted(measured(shared), key=lambda r: r.t_send)
    seen: set[int | None] = set()
    late: dict[bool, list[float]] = {True: [], False: []}  # TTFT - the model's, for hits and misses
    for r in recs:  # a group's first request computes its prefix; every later one finds it cached
        hit = r.prefix_group in seen
        seen.add(r.prefix_group)
        assert r.ttft_s is not None and r.ttft_s >= (cold if not hit else warm) - 0.0005, (
            r.prefix_group,
            r.ttft_s,
        )
        assert not hit or r.ttft_s < warm + slack, (r.prefix_group, r.ttft_s, slack)
        late[hit].append(r.ttft_s - (warm if hit else cold))
    assert seen == {0, 1} and len(late[False]) == 2
    late[False] += [r.ttft_s - cold for r in measured(alone) if r.ttft_s is not None]
    # The simulator is never early; the client adds a few ms at most, and a loaded machine what
    # the simulator waited for a CPU and the client measured of its own lag in the two sweeps.
    load = waited.s + max(client_lateness_s(shared, 0, worst=True), client_lateness_s(alone, 0, worst=True))
    for hit, xs in late.items():
        assert min(xs) >= -0.0005 and statistics.median(xs) <= LATE_S + load, (hit, xs, load)
    (s_shared,), (s_alone,) = shared.levels, alone.levels
    assert s_alone.figure("ttft_p50") is not None and s_shared.figure("ttft_p50") is not None
    drop_ms = s_alone.figure("ttft_p50") - s_shared.figure("ttft_p50")
    # 153.6 ms, the prefill of 384 tokens; each median is the model's plus at most that lateness
    assert abs(drop_ms - prefill * 384 * 1000) <= 0.05 * prefill * 384 * 1000 + load * 1000, (drop_ms, load)
    # The hit rate as the report reads it from the server's sampled counters: 14 of 16 requests had
    # 384 of their 512 tokens cached (the sampled window can miss the last 0.2 s: a few points).
    assert s_shared.sources["prefix_cache_hit_rate"] == "server_counters"
    assert s_shared.extra["prefix_cache_hit_rate"] == pytest.approx(14 * 384 / (16 * 512), abs=0.05)
    assert not s_alone.extra["prefix_cache_hit_rate"]
    report = (shared.run_dir / "report.md").read_text()
    assert "Prefix hit %" in report and "prefix cache counters" in report


@pytest.mark.parametrize("backend", ["chat", "sglang"])
def test_multi_turn_conversations_resend_their_history(sim, tmp_path: Path, backend: str) -> None:  # type: ignore[no-untyped-def]
    template = 3 if backend == "chat" else 0
    server = sim(
        *FAST,
        "--prefill-us-per-token",
        "200",
        "--prefix-cache-tokens",
        "100000",
        "--cache-report",
        "--chat-template-tokens",
        str(template),
    )
    waited = RunDelay([server.proc.pid], this_thread=False)
    run = sweep(
        server.url,
        tmp_path,
        "--backend",
        backend,
        "--levels",
        "2",
        "--requests-per-level",
        "12",
        "--input-tokens",
        "40",
        "--output-tokens",
        "16",
        "--turns",
        "3",
    )
    convs: dict[str | None, list[RequestRecord]] = defaultdict(list)
    for r in sorted(measured(run), key=lambda r: r.t_send):
        convs[r.conversation].append(r)
    assert None not in convs and sum(len(v) for v in convs.values()) == 12
    assert [len(v) for v in convs.values()] == [3] * 4  # 2 users x 2 conversations of 3 turns each
    late: list[float] = []  # TTFT - the model's (prefill of the prompt tokens not cached)
    for turns in convs.values():
        assert [r.turn for r in turns] == [0, 1, 2]
        assert len({r.worker for r in turns}) == 1
        units_before = 0  # the previous prompt and its answer, as the simulator's cache units
        for k, r in enumerate(turns):
            assert r.status == "ok" and r.prompt_tokens == r.requested_prompt_tokens
            if k == 0:
                assert r.prompt_tokens == 40 and r.cached_tokens == 0
            else:
                prev = turns[k - 1]
                assert r.t_send >= prev.t_end  # one user, one turn after the other
                assert r.prompt_tokens == prev.prompt_tokens + prev.output_tokens + 40  # the whole history
                assert r.cached_tokens == min(units_before // 16 * 16, r.prompt_tokens - 1)
            # Chat: each message adds its role and the prompt ends in the assistant's (the template
            # tokens are the server's, not units); token ids: the units are the ids.
            units = r.prompt_tokens - template + (2 * k + 2 if backend == "chat" else 0)
            units_before = units + r.output_tokens
            assert r.ttft_s is not None
            late.append(r.ttft_s - (0.005 + 0.0002 * (r.prompt_tokens - (r.cached_tokens or 0))))
    # The simulator's timing is exact; the client's stamps may be late by what the machine's load
    # made the simulator or the client wait for a CPU, measured here (a loaded run: median 8.3 ms).
    slack = waited.s + client_lateness_s(run, 0, worst=True)
    assert min(late) >= -0.0005 and statistics.median(late) <= LATE_S + slack, (late, slack)
    (s,) = run.levels
    assert [g.key for g in s.mix.turns] == [0, 1, 2] and s.mix.turns[0].stats.extra[
        "prefix_cache_hit_rate"
    ] == 0
    assert (
        s.mix.turns[2].stats.extra["prefix_cache_hit_rate"] > 0.7
        and s.sources["prefix_cache_hit_rate"] == "records"
    )
    assert "## Conversation turns" in (run.run_dir / "report.md").read_text()


def test_a_class_mix_is_sent_and_reported_per_class(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = sim(*FAST)
    scenario = tmp_path / "mix.toml"
    scenario.write_text(
        'name = "mix"\nlevels = [4]\nrequests = 40\n'
        '[[classes]]\nname = "chat"\nweight = 70\ninput_tokens = 64\noutput_dist = "uniform:8:24"\n'
        '[[classes]]\nname = "summary"\nweight = 30\ninput_dist = "uniform:300:500"\noutput_tokens = 48\n'
    )
    run = sweep(server.url, tmp_path / "out", "--scenario", str(scenario))
    classes = request_classes(load_scenario(str(scenario)))
    recs = measured(run)
    for r in recs:
        d = draw_request(classes, 0, r.level, r.phase, r.seq)
        assert (r.request_class, r.requested_prompt_tokens, r.output_tokens) == (
            d.cls.name,
            d.input_tokens,
            d.output_tokens,
        )
    (s,) = run.levels
    by_name = {g.key: g for g in s.mix.classes}
    for name in ("chat", "summary"):
        mine = [r for r in recs if r.request_class == name]
        g, lengths = by_name[name].stats, by_name[name].stats.mix.lengths  # type: ignore[union-attr]
        assert (g.sent, g.ok) == (len(mine), len(mine)) and by_name[name].share == pytest.approx(
            len(mine) / 40
        )
        assert lengths["input_sent"].mean == pytest.approx(
            statistics.fmean(r.requested_prompt_tokens for r in mine)
        )
        assert lengths["output_received"].mean == pytest.approx(
            statistics.fmean(r.output_tokens for r in mine)
        )
    assert by_name["chat"].stats.mix.lengths["input_sent"].mean == 64  # type: ignore[union-attr]
    assert by_name["summary"].stats.mix.lengths["output_received"].mean == 48  # type: ignore[union-attr]
    assert min(r.prompt_tokens for r in recs if r.request_class == "summary") >= 300
    assert abs(by_name["chat"].share - 0.7) <= 0.15  # 40 seeded draws of a 70/30 mix
    assert sum(g.stats.output_tokens for g in by_name.values()) == s.output_tokens
    report = (run.run_dir / "report.md").read_text()
    assert "## Request classes" in report and "| summary" in report and "| all" in report
