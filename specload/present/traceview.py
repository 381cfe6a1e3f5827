"""The report's "Trace replay" section: the trace's own shape next to what was sent
(specload.analysis.tracereplay; docs/metrics.md, "Trace replay")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specload.analysis.tracereplay import KEPT_P99_MS, TraceReplay
from specload.present import svg
from specload.present.output import render_table


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _n(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


MAX_ROWS = 12  # rows of the arrival-rate table (adjacent bins merged)


def _window(m: dict[str, Any]) -> str:
    out = f"from {m.get('start_s', 0):g} s of trace time"
    if m.get("duration_s"):
        out += f" for {m['duration_s']:g} s"
    if m.get("first_n"):
        out += f", its first {m['first_n']} requests"
    return out


def merged(per_s: list[float], k: int) -> list[float]:
    """Rates of bins merged k by k (the mean of each group, so still requests/s)."""
    return [sum(per_s[i : i + k]) / len(per_s[i : i + k]) for i in range(0, len(per_s), k)]


def trace_lines(t: TraceReplay, fmt: str = "github") -> list[str]:
    """The section's lines (without its title)."""
    m = t.meta
    block = f"{m['block_size']}-token hash_id blocks" if m.get("block_size") else "no prefix blocks"
    lines = [
        f"- trace: {m.get('file')} ({m.get('format')}: time unit {m.get('time_unit')}, {block}); "
        f"{m.get('requests_in_file')} requests in the file ({m.get('rows')} rows"
        + (
            f", skipped: {', '.join(f'{n} {k}' for k, n in (m.get('skipped') or {}).items())}"
            if m.get("skipped")
            else ""
        )
        + ")",
        f"- window: {_window(m)}: {t.window} requests (rows {m.get('first_index')}..{m.get('last_index')}), "
        f"{_n(m.get('window_span_s'), 1)} s of trace replayed in {_n(m.get('replay_span_s'), 1)} s "
        f"(speed-up {m.get('speedup', 1):g}); sent {t.sent}, failed {t.failed}",
        f"- text that filled the lengths: {m.get('text', 'not recorded')}",
        f"- send lateness (t_send - t_sched): p50 {_n(t.late_p50_ms, 2)} ms, p99 {_n(t.late_p99_ms, 2)} ms, "
        f"max {_n(t.late_max_ms, 2)} ms; "
        + (
            f"kept the schedule (p99 within {KEPT_P99_MS:g} ms)"
            if t.kept_schedule
            else f"{t.late_over_ms} requests more than {KEPT_P99_MS:g} ms late"
        ),
        f"- prefix cache: the server served {_pct(t.server_hit_rate)} of the prompt tokens"
        + (f" ({t.server_hit_source})" if t.server_hit_source else "")
        + f"; the trace's ideal (an unbounded cache, requests in order): {_pct(t.ideal_hit_rate)}",
        "",
    ]
    rows = [
        [name, str(v.n), _n(v.mean, 1), _n(v.p50), _n(v.p90), _n(v.p99), _n(v.max)]
        for name, v in t.lengths.items()
    ]
    lines.append(render_table(["Length (tokens)", "n", "Mean", "p50", "p90", "p99", "Max"], rows, fmt))
    if t.due_per_s:
        k = -(-len(t.due_per_s) // MAX_ROWS)
        width = k * t.bin_s
        lines += [
            "",
            f"Arrival rate over the replay (requests/s in each {width:.3g} s of replay time; "
            "due: the trace's, sped up)",
            "",
        ]
        rows = [
            [f"{i * width:.3g}", f"{d:.3g}", f"{s:.3g}"]
            for i, (d, s) in enumerate(zip(merged(t.due_per_s, k), merged(t.sent_per_s, k), strict=True))
        ]
        lines.append(render_table(["From (s)", "Due (req/s)", "Sent (req/s)"], rows, fmt))
    if t.notes:
        lines += ["", *(f"- {n}" for n in t.notes)]
    return lines


def trace_json(replays: Mapping[int, TraceReplay], index: int | None) -> dict[str, Any]:
    """What a level's JSON adds when the level replayed a trace: ``trace``, the replay's figures
    (the same object as the report's section, unrounded); {} for any other level, whose JSON is unchanged."""
    replay = replays.get(index) if index is not None else None
    return {} if replay is None else {"trace": replay.to_json()}


def trace_charts(t: TraceReplay | None) -> list[svg.Chart]:
    """The page's charts of a replay: arrivals due and sent over the replay, and each request's lateness."""
    if t is None or not t.due_per_s:
        return []
    xs = [i * t.bin_s for i in range(len(t.due_per_s))]
    return [
        svg.Chart(
            "trace-arrivals",
            "Trace replay: arrival rate",
            "replay time (s)",
            "requests/s",
            [
                svg.Series("due (the trace's)", xs, list(t.due_per_s)),
                svg.Series("sent", xs, list(t.sent_per_s), True),
            ],
            note=f"requests per {t.bin_s:.3g} s bin, from the first due time",
        ),
        svg.Chart(
            "trace-lateness",
            "Trace replay: send lateness",
            "due time (s of replay)",
            "t_send - t_sched (ms)",
            [svg.Series("lateness", t.due_s, list(t.late_ms))],
            note=f"p50 {t.late_p50_ms or 0:.2f} ms, p99 {t.late_p99_ms or 0:.2f} ms, max {t.late_max_ms or 0:.2f} ms",
        ),
    ]
