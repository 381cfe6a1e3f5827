// specload's page: the sweep live, runs and their reports, comparisons. Plain JavaScript, no build
// step, no library: it reads specload's JSON routes (specload/locust/webui.py) and draws inline SVG.
"use strict";

const $ = (sel) => document.querySelector(sel);
const POLL_MS = 1000;
const VERDICT_FIELDS = new Set(["slo_met", "slo_good_share"]);  // the live table's verdict columns
const COLORS = ["#2f6fdd", "#d9480f", "#2b8a3e", "#862e9c", "#c92a2a", "#0b7285", "#5c940d", "#e67700"];

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function num(v, digits = 1) {
  return v === null || v === undefined || Number.isNaN(v) ? "-" : Number(v).toFixed(digits);
}
function count(v) {
  return v === null || v === undefined ? "-" : Number.isInteger(v) ? String(v) : Number(v).toFixed(1);
}
function secs(v) {
  if (v === null || v === undefined) return "-";
  if (v < 90) return `${Math.round(v)} s`;
  const m = Math.floor(v / 60), s = Math.round(v % 60);
  return m < 90 ? `${m} min ${s} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}
function when(t) {
  return t ? new Date(t * 1000).toLocaleString() : "-";
}

// ---------------------------------------------------------------- HTTP

class LoggedOut extends Error {}

async function getJSON(url) {
  const res = await fetch(url, { cache: "no-store" });
  if (res.redirected && res.url.includes("/login")) throw new LoggedOut("logged out");
  const body = await res.json().catch(() => ({ error: `HTTP ${res.status}` }));
  if (!res.ok && !body.error) body.error = `HTTP ${res.status}`;
  return body;
}

async function postForm(url, params) {
  const res = await fetch(url, {
    method: "POST", body: new URLSearchParams(params),
    headers: { "Content-Type": "application/x-www-form-urlencoded" },
  });
  if (res.redirected && res.url.includes("/login")) throw new LoggedOut("logged out");
  return res.json().catch(() => ({ success: false, message: `HTTP ${res.status}` }));
}

function loggedOut() {
  document.body.insertAdjacentHTML("afterbegin",
    '<p class="card error">Logged out: <a href="../login">log in again</a> with the token `specload ui` printed.</p>');
}

// ---------------------------------------------------------------- charts (inline SVG)

function niceTicks(lo, hi, n = 5) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / n, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => raw <= s);
  const out = [], top = Math.ceil(hi / step - 1e-9) * step;  // the last tick at or above hi
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= top + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

// A tick's text with every digit its value has (12.5, not 13; 88.4, not 88), as the HTML report's
// charts write it (specload/present/svg.py number): ticks are round numbers, so no long tails.
function tickText(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return `${+(v / 1e6).toPrecision(6)}M`;
  if (a >= 1e4) return `${+(v / 1e3).toPrecision(6)}k`;
  return String(+v.toPrecision(6));
}

// series: [{name, points: [[x, y], ...]}]; xlog: a log2 axis with the points' x values as ticks.
function chart(id, title, series, { xlabel, ylabel, xlog = false, empty = "no finished level yet" }) {
  const W = 460, H = 250, L = 52, R = 12, T = 10, B = 40;
  const pts = series.flatMap((s) => s.points.filter((p) => p[1] !== null && p[1] !== undefined));
  let body;
  if (!pts.length) {
    body = `<text class="empty" x="${W / 2}" y="${H / 2}" text-anchor="middle">${esc(empty)}</text>`;
  } else {
    const fx = xlog ? (x) => Math.log2(x) : (x) => x;
    let x0 = Math.min(...pts.map((p) => fx(p[0]))), x1 = Math.max(...pts.map((p) => fx(p[0])));
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    const pad = (x1 - x0) * 0.05;
    x0 -= pad; x1 += pad;
    const yTicks = niceTicks(0, Math.max(...pts.map((p) => p[1])) * 1.08 || 1);
    const y1 = yTicks[yTicks.length - 1];
    const sx = (x) => L + ((fx(x) - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - (y / y1) * (H - T - B);
    const xTicks = xlog ? [...new Set(pts.map((p) => p[0]))].sort((a, b) => a - b)
      : niceTicks(Math.max(0, x0), x1, 6).filter((v) => fx(v) >= x0 && fx(v) <= x1);
    body = yTicks.map((v) => `<line class="grid" x1="${L}" x2="${W - R}" y1="${sy(v)}" y2="${sy(v)}"/>` +
      `<text x="${L - 4}" y="${sy(v) + 4}" text-anchor="end">${tickText(v)}</text>`).join("");
    body += xTicks.map((v) => `<line class="grid" x1="${sx(v)}" x2="${sx(v)}" y1="${T}" y2="${H - B}"/>` +
      `<text x="${sx(v)}" y="${H - B + 14}" text-anchor="middle">${tickText(v)}</text>`).join("");
    body += `<line class="axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/>`;
    series.forEach((s, i) => {
      const ps = s.points.filter((p) => p[1] !== null && p[1] !== undefined).sort((a, b) => a[0] - b[0]);
      const c = COLORS[i % COLORS.length];
      if (ps.length > 1) {
        body += `<polyline fill="none" stroke="${c}" stroke-width="2" points="${ps.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" ")}"/>`;
      }
      if (ps.length <= 60) {
        body += ps.map((p) => `<circle cx="${sx(p[0])}" cy="${sy(p[1])}" r="3" fill="${c}"><title>${esc(s.name)}: ${esc(p[0])}, ${num(p[1])}</title></circle>`).join("");
      }
    });
  }
  const labels = `<text x="${(L + W - R) / 2}" y="${H - 6}" text-anchor="middle">${esc(xlabel)}</text>` +
    `<text transform="translate(12 ${(T + H - B) / 2}) rotate(-90)" text-anchor="middle">${esc(ylabel)}</text>`;
  const legend = series.length > 1 || series[0]?.name
    ? `<div class="legend">${series.map((s, i) => `<span><i style="background:${COLORS[i % COLORS.length]}"></i>${esc(s.name)}</span>`).join("")}</div>` : "";
  return `<figure class="chart" id="${id}"><figcaption>${esc(title)}</figcaption>` +
    `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}">${body}${labels}</svg>${legend}</figure>`;
}

// What a level is on the x axis: its request rate (a rate level), else its concurrency.
const xOf = (r) => (r.rate !== null && r.rate !== undefined ? r.rate : r.concurrency);
const levelName = (r) => (r.rate !== null && r.rate !== undefined ? `rate ${r.rate}/s` : `C=${r.concurrency}`);

// The charts against concurrency (or request rate), from per-level rows with the report's field names:
// the figure table's charts (analysis/figures.py CHARTS, sent as the live payload's ``charts``), each a
// line per figure; the Pareto picture follows the E2E chart, as in the HTML report.
function levelCharts(prefix, rows, empty, specs) {
  const pts = (field) => rows.map((r) => [xOf(r), r[field]]);
  const rates = rows.some((r) => r.rate !== null && r.rate !== undefined);
  const vs = rates ? "request rate" : "concurrency";
  const xlabel = rates ? "request rate (req/s, log2 axis)" : "concurrency C (log2 axis)";
  const pareto = chart(`${prefix}-pareto`, "Per-user vs aggregate tok/s (one point per level)",
    [{ name: "", points: rows.filter((r) => r.per_req_tok_s != null && r.agg_tok_s != null).map((r) => [r.per_req_tok_s, r.agg_tok_s]) }],
    { xlabel: "per-request tok/s", ylabel: "aggregate tok/s", empty });
  return (specs || [])
    .filter((c) => !c.if_value || rows.some((r) => c.lines.some((l) => r[l.field] != null)))
    .flatMap((c) => {
      const one = chart(`${prefix}-${c.id}`, `${c.title} vs ${vs}`, c.lines.map((l) => ({ name: l.name, points: pts(l.field) })),
        { xlabel, ylabel: c.y_label, xlog: true, empty });
      return c.key === "e2e" ? [one, pareto] : [one];
    });
}

// The server's gauges and the acceptance length over the run (its /metrics samples), as the HTML report draws them.
function serverCharts(d) {
  const g = d.server_series;
  if (!g) return [];
  const lines = (key) => Object.entries(g[key] || {}).map(([name, points]) => ({ name, points }));
  const out = [];
  if (lines("server").length) {
    out.push(chart("chart-server", "Server: running and queued requests over time", lines("server"),
      { xlabel: "seconds since the first sample", ylabel: "requests", empty: "no server sample yet" }));
  }
  if (lines("accept_over_time").length) {
    out.push(chart("chart-accept-time", "Acceptance length over time (server counters)", lines("accept_over_time"),
      { xlabel: "seconds since the first sample", ylabel: "tokens per verify step", empty: "no verify step yet" }));
  }
  return out;
}

// ---------------------------------------------------------------- markdown (the report's and compare's own text)

function inline(text) {
  return esc(text).replace(/\*\*(.+?)\*\*/g, "<b>$1</b>").replace(/`([^`]+)`/g, "<code>$1</code>");
}

function markdown(md) {
  const lines = md.split("\n"), out = [];
  let i = 0;
  const cells = (l) => l.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
  while (i < lines.length) {
    const l = lines[i];
    if (l.startsWith("|")) {
      const block = [];
      while (i < lines.length && lines[i].startsWith("|")) block.push(lines[i++]);
      const head = cells(block[0]), rows = block.slice(2).map(cells);
      out.push(`<div class="table-wrap"><table><thead><tr>${head.map((h, j) => `<th class="${j ? "" : "l"}">${inline(h)}</th>`).join("")}</tr></thead><tbody>` +
        rows.map((r) => `<tr>${r.map((c, j) => `<td class="${j ? "" : "l"}">${inline(c)}</td>`).join("")}</tr>`).join("") + "</tbody></table></div>");
      continue;
    }
    if (l.startsWith("- ")) {
      const items = [];
      while (i < lines.length && lines[i].startsWith("- ")) items.push(lines[i++].slice(2));
      out.push(`<ul>${items.map((t) => `<li>${inline(t)}</li>`).join("")}</ul>`);
      continue;
    }
    const h = /^(#+) (.*)$/.exec(l);
    if (h) out.push(`<h${Math.min(h[1].length + 2, 5)}>${inline(h[2])}</h${Math.min(h[1].length + 2, 5)}>`);
    else if (l.trim() && !l.startsWith("![")) out.push(`<p>${inline(l)}</p>`);
    i++;
  }
  return `<div class="md">${out.join("")}</div>`;
}

// ---------------------------------------------------------------- tabs

function showTab(name) {
  for (const b of document.querySelectorAll("button.tab")) b.setAttribute("aria-selected", String(b.dataset.tab === name));
  for (const s of document.querySelectorAll("main > section")) s.hidden = s.id !== `tab-${name}`;
  if (name === "runs") loadRuns();
}

// ---------------------------------------------------------------- the start form

let formLoaded = false;

async function loadForm() {
  const f = await getJSON("form");
  const main = $("#fields-main"), more = $("#fields-more");
  main.innerHTML = more.innerHTML = "";
  for (const fd of f.fields) {
    const id = `f-${fd.name}`;
    let input;
    if (fd.kind === "choice") {
      input = `<select id="${id}" name="${esc(fd.name)}">${fd.choices.map((c) => `<option${String(c) === String(fd.value) ? " selected" : ""}>${esc(c)}</option>`).join("")}</select>`;
    } else if (fd.kind === "checkbox") {
      input = `<input type="checkbox" id="${id}" name="${esc(fd.name)}"${fd.value ? " checked" : ""}>`;
    } else {
      input = `<input type="text" id="${id}" name="${esc(fd.name)}" value="${esc(fd.value)}" autocomplete="off"${fd.kind === "number" ? ' inputmode="decimal"' : ""}>`;
    }
    const html = `<div class="field${fd.name === "host" ? " host" : ""}"><label for="${id}">${esc(fd.label)}</label>${input}<div class="help">${esc(fd.help)}</div></div>`;
    (fd.group === "main" ? main : more).insertAdjacentHTML("beforeend", html);
  }
  $("#form-note").textContent = (f.scenario_file ? `Scenario ${f.scenario_file}; ` : "") +
    `the run goes to ${f.results_dir}/<label>-<time>/. Numbers: empty or 0 leaves an optional field unset.`;
  formLoaded = true;
}

async function openForm() {
  $("#form-error").hidden = true;
  await loadForm();  // the values the next run would start from (the last run's)
  $("#start-form").hidden = false;
  showTab("sweep");
}

async function submitForm(ev) {
  ev.preventDefault();
  const params = {};
  for (const el of $("#start-form").querySelectorAll("input, select")) {
    params[el.name] = el.type === "checkbox" ? (el.checked ? "true" : "false") : el.value;
  }
  $("#start").disabled = true;
  try {
    const reply = await postForm("../swarm", params);
    if (reply.success) {
      $("#start-form").hidden = true;
      $("#form-error").hidden = true;
    } else {
      $("#form-error").textContent = reply.message || "the run did not start";
      $("#form-error").hidden = false;
    }
  } catch (e) {
    if (e instanceof LoggedOut) loggedOut();
  } finally {
    $("#start").disabled = false;
    poll();
  }
}

// ---------------------------------------------------------------- the sweep, live

let last = null;
let stopping = false;

function renderState(d) {
  const st = $("#state");
  st.textContent = stopping && d.state === "running" ? "STOPPING" : d.state.toUpperCase();
  st.className = `badge ${d.state}`;
  $("#mode").textContent = d.mode === "master" ? `master, ${d.workers} worker(s) ready` : "";
  const idle = d.state === "ready" || d.state === "stopped";
  $("#new-run").disabled = !idle || !!d.start_blocked;
  $("#new-run").title = d.start_blocked || "";
  $("#stop").disabled = idle || stopping;
  if (idle) stopping = false;
}

function renderRun(d) {
  const r = d.run, el = $("#run-info");
  if (!r) {
    el.innerHTML = d.failure ? `<p class="error">The run did not start: ${esc(d.failure)}</p>`
      : '<p class="muted">No sweep yet: start one with <b>New run</b>.</p>';
    return;
  }
  const scen = [r.scenario, r.scenario_file && `(${r.scenario_file})`].filter(Boolean).join(" ");
  const links = r.report ? `<span class="downloads">Report: <a href="#" id="open-report" data-run="${esc(r.name)}">view</a>` +
    ["md", "csv", "json", "html"].map((f) => `<a href="runs/${encodeURIComponent(r.name)}/report.${f}" download>${f}</a>`).join("") + "</span>" : "";
  el.innerHTML = `<h2>Run <span id="run-name">${esc(r.name)}</span> <span class="muted" id="run-status">${esc(r.status)}</span></h2>` +
    `<div class="kv"><span>run dir <b id="run-dir">${esc(r.run_dir)}</b></span><span>scenario <b id="run-scenario">${esc(scen || "-")}</b></span>` +
    `<span>label <b>${esc(r.label)}</b></span><span>host <b>${esc(r.host)}</b></span><span>model <b>${esc(r.model || "-")}</b></span>` +
    `<span>backend <b>${esc(r.backend)}</b></span><span>tokens in/out <b>${esc(r.input_tokens)} / ${esc(r.output_tokens)}</b></span>` +
    (r.rates && r.rates.length ? `<span>rates <b>${esc(r.rates.join(", "))} req/s</b></span>`
      : `<span>levels <b>${esc((r.levels || []).join(", "))}</b></span>`) +
    `<span>started <b>${esc(when(r.started_at))}</b></span>` +
    (r.simulated ? '<span class="warn"><b>SIMULATED server</b></span>' : "") + "</div>" +
    (r.reason ? `<p class="warn">${esc(r.reason)}</p>` : "") +
    (d.failure ? `<p class="error">The last start failed: ${esc(d.failure)}</p>` : "") + links;
  const open = $("#open-report");
  if (open) open.onclick = (ev) => { ev.preventDefault(); showTab("runs"); openReport(open.dataset.run); };
}

function renderProgress(d) {
  const p = d.current, el = $("#progress");
  if (!p) { el.hidden = true; return; }
  el.hidden = false;
  const measured = p.budget ? `${p.done}/${p.budget} requests` : `${p.done} requests`;
  const frac = p.budget ? p.done / p.budget : p.duration_s ? Math.min(1, (p.elapsed_s || 0) / p.duration_s) : 0;
  const srv = d.server_now ? `<span>server now <b>${count(d.server_now.running)} running, ${count(d.server_now.queued)} queued</b></span>` : "";
  const warm = p.warmup ? `<span>warmup <b>${p.warmup_done}/${p.warmup}</b></span>` : "";
  el.innerHTML = `<h2 id="current-level">Level ${p.index + 1}/${p.levels} · ${esc(levelName(p))} · ${esc(p.phase)}</h2>` +
    `<div class="bar" title="${esc(measured)}"><div style="width:${(100 * frac).toFixed(1)}%"></div></div>` +
    `<div class="kv"><span id="progress-requests"><b>${esc(measured)}</b></span>${warm}<span>in flight now <b id="in-flight">${p.in_flight}</b></span>` +
    `<span>elapsed <b>${secs(p.elapsed_s)}</b></span><span>time left <b id="time-left">${p.left_s === null ? "-" : "~" + secs(p.left_s)}</b></span>${srv}</div>`;
}

function renderLevels(d) {
  const rows = d.levels;
  if (!rows.length) { $("#levels").innerHTML = '<p class="muted">-</p>'; return; }
  // the figure columns come from the figure table (analysis/figures.py), each shown by its rule
  const has = (c) => c.show === "always" || rows.some((r) => (c.show === "if_counted" ? r[c.field] : r[c.field] !== null && r[c.field] !== undefined));
  // the streamed tok/s of the level running (live only) follows the aggregate tok/s
  const live = { field: "live_tok_s", header: "Live tok/s", digits: 1, scale: 1, show: "always" };
  const cols = (d.columns || []).filter(has).flatMap((c) => (c.field === "agg_tok_s" ? [c, live] : [c]));
  // the verdicts (SLO met, Good %, the client's own) right after the throughput, so that they stay in
  // view on a 1400-px screen; the other figures follow them
  const agg = cols.findIndex((c) => c.field === "live_tok_s") + 1;
  const verdicts = cols.filter((c) => VERDICT_FIELDS.has(c.field));
  const first = cols.slice(0, agg).filter((c) => !VERDICT_FIELDS.has(c.field));
  const rest = cols.slice(agg).filter((c) => !VERDICT_FIELDS.has(c.field));
  const cur = d.current ? d.current.index : -1;
  const rates = rows.some((r) => r.rate !== null && r.rate !== undefined);
  const names = (cs) => cs.map((c) => c.header);
  const head = [rates ? "Rate (req/s)" : "C", "Status", "Requests", "Ok", "Fail", "Short", ...names(first), ...names(verdicts), "Client", ...names(rest)];
  const cell = (r) => (c) => `<td>${esc(c.text ? r[c.field] ?? "-" : num(r[c.field] === null || r[c.field] === undefined ? null : r[c.field] * c.scale, c.digits))}</td>`;
  const body = rows.map((r) => {
    const cells = [xOf(r) + (r.repeat ? ` r${r.repeat}` : ""), r.phase, r.budget ? `${r.done}/${r.budget}` : String(r.done),
      r.ok, r.failed, r.short];
    const client = r.client_flag ? `<td class="flag" title="${esc(r.client_flag)}">${esc(r.client)}</td>` : `<td class="l">${esc(r.client)}</td>`;
    // a level stopped before its budget is drawn as such (status "incomplete", in italics)
    const cls = [r.index === cur ? "current" : "", r.status === "incomplete" ? "incomplete" : ""].join(" ").trim();
    return `<tr data-level="${esc(r.label)}" class="${cls}">${cells.map((c, j) => `<td class="${j === 1 ? "l" : ""}">${esc(c)}</td>`).join("")}` +
      `${first.map(cell(r)).join("")}${verdicts.map(cell(r)).join("")}${client}${rest.map(cell(r)).join("")}</tr>`;
  }).join("");
  // why requests failed: each level's most frequent reasons, with their counts
  const reasons = rows.filter((r) => r.reasons && r.reasons.length).map((r) =>
    `<li data-level="${esc(r.label)}">${esc(levelName(r))}: ${r.reasons.map(([why, n]) => `${n} × ${esc(why)}`).join("; ")}</li>`).join("");
  $("#levels").innerHTML = `<table id="levels-table"><thead><tr>${head.map((h, j) => `<th class="${j === 1 || h === "Client" ? "l" : ""}">${esc(h)}</th>`).join("")}</tr></thead><tbody>${body}</tbody></table>` +
    (reasons ? `<h3>Failed and short requests</h3><ul id="failure-reasons">${reasons}</ul>` : "");
}

function renderCharts(d) {
  const done = d.levels.filter((r) => r.final && r.done > 0);
  const s = d.series;
  const over = s ? chart("chart-series", `Output tok/s over time: ${levelName(s)} (${s.source === "streamed" ? (s.running ? "live, streamed tokens" : "streamed tokens") : "from its records, tokens spread evenly"})`,
    [{ name: "", points: s.points }], { xlabel: s.running ? "seconds since the level's first sample" : "seconds since the level's first request", ylabel: "output tok/s", empty: "waiting for the first seconds of tokens" })
    : chart("chart-series", "Output tok/s over time of the current level", [{ name: "", points: [] }], { xlabel: "seconds", ylabel: "output tok/s", empty: "no level running yet" });
  $("#charts").innerHTML = [...levelCharts("chart", done, "no finished level yet", d.charts), over, ...serverCharts(d)].join("");
}

async function poll() {
  let d;
  try {
    d = await getJSON("live");
  } catch (e) {
    if (e instanceof LoggedOut) { loggedOut(); return false; }
    $("#state").textContent = "NO CONNECTION";
    return true;
  }
  const ended = last && last.active && !d.active;
  last = d;
  renderState(d);
  renderRun(d);
  renderProgress(d);
  renderLevels(d);
  renderCharts(d);
  if (!formLoaded && !d.run && d.state === "ready") openForm();
  if (ended && !$("#tab-runs").hidden) loadRuns();
  return true;
}

async function pollLoop() {
  if (document.visibilityState !== "hidden" && !(await poll())) return;
  setTimeout(pollLoop, POLL_MS);
}

async function stopRun() {
  stopping = true;
  $("#stop").disabled = true;
  $("#state").textContent = "STOPPING";
  try {
    await postForm("../stop", {});
  } catch (e) {
    if (e instanceof LoggedOut) loggedOut();
  }
  poll();
}

// ---------------------------------------------------------------- runs and reports

let selected = [];

async function loadRuns() {
  let d;
  try {
    d = await getJSON("runs");
  } catch (e) {
    if (e instanceof LoggedOut) loggedOut();
    return;
  }
  $("#results-dir").textContent = d.results_dir;
  const names = new Set(d.runs.map((r) => r.name));
  selected = selected.filter((n) => names.has(n));
  if (!d.runs.length) { $("#runs").innerHTML = '<p class="muted">No run yet.</p>'; updateCompareButton(); return; }
  $("#runs").innerHTML = `<table id="runs-table"><thead><tr><th></th><th class="l">Run</th><th class="l">Status</th><th class="l">Started</th>` +
    `<th class="l">Scenario</th><th class="l">Levels</th><th>In/out tokens</th><th class="l">Host</th><th></th></tr></thead><tbody>` +
    d.runs.map((r) => `<tr data-run="${esc(r.name)}"><td><input type="checkbox" class="pick" data-run="${esc(r.name)}"${selected.includes(r.name) ? " checked" : ""}></td>` +
      `<td class="l">${esc(r.name)}${r.simulated ? ' <span class="muted small">(simulated)</span>' : ""}</td><td class="l">${esc(r.name === d.active ? "running" : r.status)}</td>` +
      `<td class="l">${esc(when(r.started_at))}</td><td class="l">${esc(r.scenario || "-")}</td><td class="l">${esc(r.rates ? r.rates.map((x) => `${x}/s`).join(", ") : r.levels.join(", "))}</td>` +
      `<td>${esc(r.input_tokens)} / ${esc(r.output_tokens)}</td><td class="l">${esc(r.host)}</td>` +
      `<td>${r.name === d.active ? "" : `<button type="button" class="open" data-run="${esc(r.name)}">Report</button>`}</td></tr>`).join("") +
    "</tbody></table>";
  for (const b of document.querySelectorAll("#runs button.open")) b.onclick = () => openReport(b.dataset.run);
  for (const c of document.querySelectorAll("#runs input.pick")) {
    c.onchange = () => {
      selected = c.checked ? [...selected, c.dataset.run] : selected.filter((n) => n !== c.dataset.run);
      updateCompareButton();
    };
  }
  updateCompareButton();
}

function updateCompareButton() {
  const b = $("#compare-selected");
  b.disabled = selected.length < 2;
  b.textContent = selected.length >= 2 ? `Compare selected (${selected.length}; baseline ${selected[0]})` : "Compare selected";
}

async function openReport(name) {
  const el = $("#report");
  el.hidden = false;
  el.innerHTML = `<p class="muted">Making the report of ${esc(name)}…</p>`;
  let d;
  try {
    d = await getJSON(`runs/${encodeURIComponent(name)}/report`);
  } catch (e) {
    if (e instanceof LoggedOut) loggedOut();
    return;
  }
  if (d.error) { el.innerHTML = `<p class="error">${esc(d.error)}</p>`; return; }
  const base = `runs/${encodeURIComponent(name)}/report`;
  el.innerHTML = `<h2 id="report-title">Report: ${esc(name)}</h2>` +
    `<p class="downloads">Download: ${["md", "csv", "json", "html"].map((f) => `<a id="report-${f}" href="${base}.${f}" download>${f === "md" ? "report.md" : f === "html" ? "report.html" : f.toUpperCase()}</a>`).join("")}</p>` +
    `<div id="report-body">${markdown(d.markdown)}</div>` +
    `<div id="report-figures" class="svg-charts">${d.charts_html || ""}</div>`;
  el.scrollIntoView({ behavior: "smooth", block: "start" });
}

// ---------------------------------------------------------------- compare

async function compareSelected() {
  showTab("compare");
  const el = $("#compare");
  const query = selected.map((n) => `run=${encodeURIComponent(n)}`).join("&");
  el.innerHTML = `<p class="muted">Comparing ${esc(selected.join(" vs "))}…</p>`;
  let d;
  try {
    d = await getJSON(`compare?${query}`);
  } catch (e) {
    if (e instanceof LoggedOut) loggedOut();
    return;
  }
  if (d.error) { el.innerHTML = `<p class="error">${esc(d.error)}</p>`; return; }
  const table = `<div class="table-wrap"><table id="compare-table"><thead><tr>${d.columns.map((c, j) => `<th class="${j ? "" : "l"}">${esc(c)}</th>`).join("")}</tr></thead>` +
    `<tbody>${d.rows.map((r) => `<tr>${r.map((c, j) => `<td class="${j ? "" : "l"}">${esc(c)}</td>`).join("")}</tr>`).join("")}</tbody></table></div>`;
  // comparison.md as it is, every section (the verdict, per category, the capacity under the SLO,
  // the notes), its table the one above (the same cells, unescaped by the markdown's bold)
  const [head, rest] = splitAtTable(d.markdown);
  el.innerHTML = `<h2 id="compare-title">Comparison: ${esc(d.runs.join(" vs "))} <span class="muted small">(the first is the baseline)</span></h2>` +
    `<p class="downloads">Download: ${["md", "csv", "json", "html"].map((f) => `<a id="compare-${f}" href="compare.${f}?${query}" download>${f === "md" ? "comparison.md" : f === "html" ? "comparison.html" : f.toUpperCase()}</a>`).join("")}` +
    (d.plot ? `<a href="compare.png?${query}" download>comparison.png</a>` : "") + "</p>" +
    `<div id="compare-body">${markdown(head)}${table}${markdown(rest)}</div>` +
    `<div id="compare-figures" class="svg-charts">${d.charts_html || ""}</div>` +
    (d.plot ? `<img class="plot" id="compare-plot" alt="aggregate and per-request tok/s vs concurrency" src="compare.png?${query}">`
      : `<p class="muted">${esc(d.plot_note || "no plot")}</p>`);
  const verdict = [...el.querySelectorAll("#compare-body h4")].find((h) => h.textContent === "Verdict");
  if (verdict && verdict.nextElementSibling?.tagName === "UL") verdict.nextElementSibling.id = "verdict";
}

// The markdown before its first table (without its "# " title: the page has its own) and after it.
function splitAtTable(md) {
  const lines = md.split("\n");
  const i = lines.findIndex((l) => l.startsWith("|"));
  if (i < 0) return [lines.filter((l) => !l.startsWith("# ")).join("\n"), ""];
  let j = i;
  while (j < lines.length && lines[j].startsWith("|")) j++;
  return [lines.slice(0, i).filter((l) => !l.startsWith("# ")).join("\n"), lines.slice(j).join("\n")];
}

// ---------------------------------------------------------------- wiring

for (const b of document.querySelectorAll("button.tab")) b.onclick = () => showTab(b.dataset.tab);
$("#new-run").onclick = openForm;
$("#cancel-form").onclick = () => { $("#start-form").hidden = true; };
$("#start-form").onsubmit = submitForm;
$("#stop").onclick = stopRun;
$("#refresh-runs").onclick = loadRuns;
$("#compare-selected").onclick = compareSelected;
document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible") poll(); });
pollLoop();
