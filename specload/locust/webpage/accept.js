// specload's page, the acceptance card: per level the acceptance figures (length, rate, >=k per draft
// position, the histogram of accepted tokens per step as small bars, the length along the output), the
// reasoning figures and the prompt categories. The data are each level's "acceptance", "reasoning" and
// "categories" of /specload/live (specload.present.acceptview.live_figures: the report's own numbers).
// Loaded after app.js, whose renderLevels it extends: app.js draws the levels table, this the card below.
"use strict";

function pct(v, digits = 0) {
  return v === null || v === undefined ? "-" : (100 * v).toFixed(digits);
}

// the histogram as one small bar per number of drafts accepted, height the share of the steps
function histBars(shares) {
  if (!shares || !shares.length) return "-";
  const w = 10, h = 24;
  const bars = shares.map((s, j) =>
    `<rect fill="#2f6fdd" x="${j * (w + 2)}" y="${(h * (1 - s)).toFixed(1)}" width="${w}" height="${(h * s).toFixed(1)}"><title>${j} accepted: ${pct(s, 1)}% of steps</title></rect>`).join("");
  const text = shares.map((s, j) => `${j}:${pct(s)}%`).join(" ");
  return `<svg class="hist" width="${shares.length * (w + 2)}" height="${h}" role="img" aria-label="${esc(text)}">${bars}</svg> <span class="small">${esc(text)}</span>`;
}

function acceptRows(rows) {
  const with_ = rows.filter((r) => r.acceptance);
  if (!with_.length) return "";
  const bucket = (with_.find((r) => r.acceptance.along.length) || with_[0]).acceptance.along_bucket;
  const head = ["Level", "Accept len", "Accept rate %", "Accept >=k %", "Steps by accepted drafts", `Accept len per ${bucket} tok`];
  const body = with_.map((r) => {
    const a = r.acceptance;
    const cells = [levelName(r), num(a.length, 2), pct(a.rate, 1), a.per_position.length ? a.per_position.map((v) => pct(v)).join("/") : "-"];
    const along = a.along.length ? a.along.map((v) => num(v, 2)).join(" ") : "-";
    return `<tr data-level="${esc(r.label)}">${cells.map((c, j) => `<td class="${j ? "" : "l"}">${esc(c)}</td>`).join("")}` +
      `<td class="l">${histBars(a.histogram)}</td><td class="l">${esc(along)}</td></tr>`;
  }).join("");
  const bySource = {}; // the figures that came from the same source, on one line (as the report's notes)
  for (const r of with_) {
    for (const [fig, src] of Object.entries(r.acceptance.sources)) {
      const figs = (bySource[src] ||= []);
      if (!figs.includes(fig)) figs.push(fig);
    }
  }
  const notes = with_.filter((r) => r.acceptance.note).map((r) => `<li>${esc(levelName(r))}: ${esc(r.acceptance.note)}</li>`).join("");
  return `<table id="accept-table"><thead><tr>${head.map((h, j) => `<th class="${j ? "" : "l"}">${esc(h)}</th>`).join("")}</tr></thead><tbody>${body}</tbody></table>` +
    `<ul id="accept-sources" class="small">${Object.entries(bySource).map(([s, fs]) => `<li>${esc(fs.join(", "))} from ${esc(s)}</li>`).join("")}${notes}</ul>`;
}

function reasoningRows(rows) {
  const with_ = rows.filter((r) => r.reasoning);
  if (!with_.length) return "";
  const head = ["Level", "Reasoning reqs", "Reasoning tokens mean", "Reasoning %", "TTFT p50 (ms)", "First answer p50 (ms)", "First answer p99 (ms)", "Answer tok/s", "Agg answer tok/s"];
  const body = with_.map((r) => {
    const x = r.reasoning;
    const cells = [levelName(r), x.requests, num(x.reasoning_tokens_mean), pct(x.reasoning_share, 1), num(x.ttft_p50_ms), num(x.answer_ttft_p50_ms),
      num(x.answer_ttft_p99_ms), num(x.answer_tok_s_mean), num(x.agg_answer_tok_s)];
    return `<tr data-level="${esc(r.label)}">${cells.map((c, j) => `<td class="${j ? "" : "l"}">${esc(c)}</td>`).join("")}</tr>`;
  }).join("");
  return `<h3>Reasoning streams</h3><table id="reasoning-table"><thead><tr>${head.map((h, j) => `<th class="${j ? "" : "l"}">${esc(h)}</th>`).join("")}</tr></thead><tbody>${body}</tbody></table>`;
}

function categoryRows(rows) {
  const with_ = rows.filter((r) => r.categories && r.categories.length);
  if (!with_.length) return "";
  const head = ["Level", "Category", "Sent", "Tokens %", "Per-req tok/s", "Accept len"];
  const body = with_.flatMap((r) => r.categories.map((g) => {
    const cells = [levelName(r), g.category, g.sent, num(g.tokens_pct, 0), num(g.per_req_tok_s), num(g.accept_length, 2)];
    return `<tr data-level="${esc(r.label)}">${cells.map((c, j) => `<td class="${j < 2 ? "l" : ""}">${esc(c)}</td>`).join("")}</tr>`;
  })).join("");
  return `<h3>Prompt categories</h3><table id="category-table"><thead><tr>${head.map((h, j) => `<th class="${j < 2 ? "l" : ""}">${esc(h)}</th>`).join("")}</tr></thead><tbody>${body}</tbody></table>`;
}

function renderAcceptance(d) {
  let card = document.getElementById("acceptance");
  if (!card) {
    card = document.createElement("div");
    card.id = "acceptance";
    card.className = "card";
    card.hidden = true;
    $("#charts").before(card);
  }
  const rows = d.levels || [];
  const parts = [acceptRows(rows), reasoningRows(rows), categoryRows(rows)];
  card.hidden = !parts.some((p) => p);
  if (card.hidden) return;
  card.innerHTML = `<h2>Acceptance, reasoning, prompt categories</h2><div class="table-wrap">${parts.join("")}</div>` +
    '<p class="muted small">The report\'s own figures from the requests that have ended (docs/metrics.md, "Acceptance"): ' +
    "Accept >=k %: the share of verify steps that accepted at least k draft tokens; the bars: the share of steps by drafts accepted.</p>";
}

{
  const drawLevels = renderLevels;
  renderLevels = function (d) { // eslint-disable-line no-global-assign
    drawLevels(d);
    renderAcceptance(d);
  };
}
