// The workshop page: controls -> /api/simulate -> one SVG of every timeline, to scale.
// The server simulates and explains (the same code as the CLI); these files only draw what it returns.
// This file: state, requests, the drawing; play.js, why.js, build.js and teach.js add the modes
// (loaded before this one, which starts the page).
"use strict";

const FIELDS = ["p", "m", "v", "tf", "tb", "ti", "tw", "tfb", "latency", "skew", "per", "free_at_i", "cap"];
const MODES = ["view", "play", "why", "build", "teach"];
const DEBOUNCE_MS = 120;
// Colours come from the server (stagewise.render.palette), so the page, the SVG files and the
// notebook look alike: forward blue, backward greens, lighter shades for a rank's later chunks.
const BAD = "#b3261e"; // over the memory cap, a deadlock: the page's error colour
const KIND_NAMES = { F: "forward", B: "backward", I: "input-grad backward", W: "weight-grad backward",
  "F&B": "overlapped forward & backward" };
const SVGNS = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);
let info = null;        // /api/families
let seq = 0;            // request counter: only the latest answer is drawn
let timer = null;
let shown = null;       // the results on screen, for hover, the modes and downloads
let shownQuery = "";
let geo = [];           // per result on screen: where its chart lies (rows, memory strips), for the modes' layers
let L = null;           // the drawing's scale (layout)
let notice = null;      // [field, message] to show once, after the first answer (a link naming a missing family)
const page = { mode: "view", t: null, gap: null }; // page state kept in the URL besides the settings

// ---- state: controls <-> URL -------------------------------------------------

function readControls() {
  const st = { schedules: [...document.querySelectorAll("#families input:checked")].map((x) => x.value) };
  for (const f of FIELDS) st[f] = $(f).value.trim();
  return st;
}

function toQuery(st) {
  const q = new URLSearchParams();
  const d = info.defaults;
  if (st.schedules.join(",") !== d.schedules.join(",")) q.set("schedules", st.schedules.join(","));
  for (const f of FIELDS) {
    const same = st[f] === String(d[f] ?? "") || (st[f] !== "" && Number(st[f]) === d[f]);
    if (st[f] !== "" && !same) q.set(f, st[f]);
  }
  return q.toString();
}

function pageQuery(settingsQuery) { // the settings, then the mode and its place (the cursor, the chosen gap)
  const q = new URLSearchParams(settingsQuery);
  if (page.mode !== "view") q.set("mode", page.mode);
  if (page.mode === "play" && page.t !== null) q.set("t", num(page.t));
  if (page.mode === "why" && page.gap) q.set("gap", page.gap.join(","));
  return q.toString();
}

function saveUrl() {
  const q = pageQuery(toQuery(readControls()));
  history.replaceState(null, "", q ? `?${q}` : location.pathname);
}

function writeControls(params) {
  const d = info.defaults;
  let wanted = (params.get("schedules") || d.schedules.join(",")).split(",").filter(Boolean);
  const have = new Set(info.families.map((f) => f.name));
  const missing = wanted.filter((n) => !have.has(n));
  if (missing.length === wanted.length) wanted = d.schedules;
  for (const box of document.querySelectorAll("#families input")) box.checked = wanted.includes(box.value);
  if (missing.length) notice = ["schedules", `the link names ${missing.join(", ")}, not in this version of stagewise`];
  for (const f of FIELDS) {
    const val = params.get(f) ?? (d[f] === null ? "" : String(d[f]));
    $(f).value = val;
    syncRange(f);
  }
  syncCapUnit();
  page.mode = MODES.includes(params.get("mode")) ? params.get("mode") : "view";
  page.t = params.has("t") && isFinite(Number(params.get("t"))) ? Number(params.get("t")) : null;
  const gap = (params.get("gap") || "").split(",").map(Number);
  page.gap = gap.length === 3 && gap.every(Number.isInteger) ? gap : null;
}

function syncCapUnit() { // the cap is in the unit of the peak column, which `per` sets
  $("cap-unit").textContent = $("per").value === "stage" ? "micro-batches of one stage" : "micro-batches of a rank's share";
}

function syncRange(f) {
  const r = $(`${f}-range`);
  if (r && $(f).value !== "") r.value = $(f).value;
}

// ---- fetch and redraw ----------------------------------------------------------

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(update, DEBOUNCE_MS);
}

async function post(path, body) {
  const resp = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body) });
  return [resp, await resp.json()];
}

async function update() {
  const st = readControls();
  const my = ++seq;
  const query = toQuery(st);
  const t0 = performance.now();
  let resp, data;
  try {
    [resp, data] = await post("/api/simulate", { ...st, messages: page.mode === "play" });
  } catch (e) {
    if (my === seq) setStatus(`cannot reach the workshop server (${e.message}); is it still running?`, true);
    return;
  }
  if (my !== seq) return; // a newer change is on its way
  clearErrors();
  if (notice) showError(...notice);
  notice = null;
  if (!resp.ok) {
    showError(data.field, data.error);
    $("view").classList.add("stale");
    setStatus("settings not valid: see the message next to the control", true);
    return;
  }
  const t1 = performance.now();
  if (query !== shownQuery) Modes.settingsChanged();
  shown = data.results;
  shownQuery = query;
  await Modes.arrive(shown); // a mode may replace what is drawn (Build your own: the edited schedule)
  if (my !== seq) return;
  redraw();
  saveUrl();
  $("view").classList.remove("stale");
  $("view").dataset.drawn = Number($("view").dataset.drawn || 0) + 1; // tests and benchmarks wait on it
  const t2 = performance.now();
  setStatus(`${data.results.length === 1 ? data.results[0].schedule : data.results.length + " schedules"}` +
    ` \u00b7 simulated in ${Math.round(t1 - t0)} ms (round trip), drawn in ${Math.round(t2 - t1)} ms`);
}

function setStatus(text, bad = false) {
  $("status").textContent = text;
  $("status").classList.toggle("bad", bad);
}

function clearErrors() {
  for (const e of document.querySelectorAll(".err")) if (e.id !== "err-programs") e.textContent = "";
  for (const e of document.querySelectorAll(".invalid")) e.classList.remove("invalid");
}

function showError(field, message) {
  const slot = $(`err-${field}`) || $("err-schedules");
  slot.textContent = message;
  const input = $(field) || $("f-schedules");
  input.classList.add("invalid");
}

// ---- drawing ---------------------------------------------------------------------

const pct = (x) => (x === null || x === undefined ? "\u2014" : `${(100 * x).toFixed(1)}%`);
const num = (x) => (Number.isInteger(x) ? String(x) : String(+x.toPrecision(4)));
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

function redraw() {
  const results = Modes.results(shown); // what the mode draws: the view's results, or the edited schedule
  $("tip").hidden = true; // it described what was under the pointer before
  $("summary").innerHTML = summaryHtml(results);
  $("legend").innerHTML = legendHtml(results);
  $("charts").innerHTML = chartSvg(results, Math.max(560, $("charts").clientWidth));
  Modes.drawn(results);
  $("view").dataset.redrawn = Number($("view").dataset.redrawn || 0) + 1; // every picture, an answer's or a mode's
}

function summaryHtml(results) {
  const unit = new URLSearchParams(shownQuery).get("per") === "stage" ? "one stage" : "one rank's share of the model";
  const head = "<tr><th>schedule</th><th>p</th><th>m</th><th>v</th><th>makespan</th>" +
    '<th title="idle share: 1 - busy / (ranks x makespan)">bubble</th>' +
    '<th title="the papers\' formula for these settings; \u2014 where none applies">closed form</th>' +
    `<th title="live activations at the peak, in micro-batches of ${unit}">peak activations per rank</th>` +
    (results.some((r) => r.memory_cap) ? '<th title="highest peak against the cap per rank (--cap)">peak vs cap</th>' : "") +
    '<th title="copies of the model\'s parameters held (DualPipe keeps two)">params</th><th>files</th></tr>';
  const rows = results.map((r, i) => {
    const formula = r.formula_bubble_fraction === null
      ? '<td class="na" title="no closed form for this family or these costs (uneven stages, latency)">\u2014</td>'
      : `<td class="formula">${pct(r.formula_bubble_fraction)}</td>`;
    const files = r.edited ? '<td><a href="#" data-dl="edited">CSV</a></td>'
      : `<td><a href="#" data-dl="csv" data-i="${i}">CSV</a> <a href="#" data-dl="trace" data-i="${i}">trace</a></td>`;
    if (r.stuck) { // a deadlock: nothing to measure
      return `<tr data-schedule="${esc(r.schedule)}" class="stuck"><td class="name">${esc(r.schedule)}</td>` +
        `<td>${r.ranks}</td><td>${r.microbatches}</td><td>${r.chunks}</td><td class="makespan">\u2014</td>` +
        `<td class="bubble over" colspan="3">does not run: the ranks stop in a wait cycle</td>${capCell(r)}` +
        `<td class="params">${num(Math.max(...r.parameter_copies))}\u00d7</td><td></td></tr>`;
    }
    return `<tr data-schedule="${esc(r.schedule)}"><td class="name">${esc(r.schedule)}</td><td>${r.ranks}</td>` +
      `<td>${r.microbatches}</td><td>${r.chunks}</td><td class="makespan">${num(r.makespan)}</td>` +
      `<td class="bubble">${pct(r.bubble_fraction)}</td>${formula}` +
      `<td class="peaks">${peaksHtml(r)}</td>${capCell(r)}` +
      `<td class="params">${num(Math.max(...r.parameter_copies))}\u00d7</td>${files}</tr>`;
  });
  return head + rows.join("");
}

const overCap = (r, rank) => r.memory_cap && r.peak_activations[rank] > r.memory_cap[rank] * (1 + 1e-9);

function peaksHtml(r) { // each rank's peak; those over the cap marked
  return r.peak_activations.map((x, rank) =>
    overCap(r, rank) ? `<span class="over" title="over the cap of ${num(r.memory_cap[rank])}">${num(x)}</span>` : num(x))
    .join(" ");
}

function capCell(r) {
  if (!r.memory_cap) return "";
  const over = r.peak_activations.filter((_, rank) => overCap(r, rank)).length;
  const peak = Math.max(...r.peak_activations), cap = Math.max(...r.memory_cap);
  return over
    ? `<td class="cap over" data-over="${over}">${num(peak)} &gt; ${num(cap)} \u2717 over on ${over} of ${r.ranks} ranks</td>`
    : `<td class="cap ok" data-over="0">${num(peak)} \u2264 ${num(cap)} \u2713 within</td>`;
}

// swatches are SVG: the page's CSP allows no inline style attributes
const swatch = (c) => `<svg width="14" height="12"><rect width="14" height="12" rx="2" fill="${c}"/></svg>`;

function legendHtml(results) {
  const kinds = new Set();
  for (const r of results) for (const row of r.ops) for (const op of row) kinds.add(op[1]).add(op[6]);
  const most = results.reduce((a, b) => (b.chunks > a.chunks ? b : a));
  const items = ["F", "B", "I", "W"].filter((k) => kinds.has(k)).map((k) =>
    `<span>${most.colours[k].map(swatch).join("")}${esc(info.style.labels[k])}</span>`);
  if (most.chunks > 1) items.push(`<span class="note">lighter: chunk 1${most.chunks > 2 ? "+" : ""} of a rank</span>`);
  if (kinds.has("F&B")) items.push(`<span>${swatch(most.colours.F[0])}over${swatch(most.colours.B[0])} F&amp;B pair</span>`);
  items.push(`<span>${swatch(info.style.memory)}live activations</span>`);
  if (results.some((r) => r.memory_cap)) {
    items.push(`<span><svg width="18" height="12"><line x1="0" x2="18" y1="6" y2="6" stroke="${BAD}" ` +
      `stroke-width="1.5" stroke-dasharray="4 3"/></svg>cap</span><span>${swatch(BAD)}over the cap</span>`);
  }
  items.push('<span><i class="idle"></i>idle</span><span class="note">numbers: micro-batch</span>');
  return items.join("") + Modes.legend(results);
}

function rightLabels(results) { // the memory strips' labels, to size the right margin to the longest
  return results.flatMap((r) => r.peak_activations.map((x, rank) =>
    `${rank === 0 ? "peak " : ""}${num(x)}${overCap(r, rank) ? " > cap" : ""}`));
}

function layout(results, width) {
  const p = Math.max(...results.map((r) => r.ranks));
  const row = Math.max(8, Math.min(24, Math.floor(380 / p)));
  const capped = results.some((r) => r.memory_cap);
  const mem = Math.max(5, Math.round(row * (capped ? 0.75 : 0.5))); // taller with a cap: the line must read
  const font = Math.min(10, mem + 2);
  const longest = Math.max(...rightLabels(results).map((s) => s.length));
  const left = 58, right = Math.ceil(14 + longest * font * 0.62);
  const span = Math.max(...results.map((r) => Modes.span(r))) || 1;
  const unit = results[0].unit === "t_f" ? "t_F units" : results[0].unit;
  // one memory scale for every schedule shown (and the cap), so the curves compare
  const top = Math.max(1e-9, ...results.flatMap((r) => [...r.peak_activations, ...(r.memory_cap || [])]));
  return { count: results.length, row, mem, font, left, right, width, x: (t) => left + (t / span) * (width - left - right),
    t: (x) => ((x - left) / (width - left - right)) * span, span, unit, top };
}

function chartSvg(results, width) {
  L = layout(results, width);
  geo = [];
  const parts = [defs()];
  let y = 4;
  results.forEach((r, i) => { y = block(parts, r, i, y); });
  // the modes draw on a second SVG over the first, a layer of its own: moving the Play cursor repaints
  // only it, not the cells (tens of thousands at p=16, m=64)
  const layers = geo.map((g) => `<g class="overlay" data-i="${g.i}"></g>`).join("");
  return `<svg xmlns="${SVGNS}" id="timeline" width="${width}" height="${y}" ` +
    `viewBox="0 0 ${width} ${y}" font-family="system-ui, sans-serif" font-size="11">` +
    `<rect width="${width}" height="${y}" fill="#fff"/>${parts.join("")}</svg>` +
    `<svg xmlns="${SVGNS}" id="layers" width="${width}" height="${y}" viewBox="0 0 ${width} ${y}" ` +
    `font-family="system-ui, sans-serif" font-size="11">${layers}</svg>`;
}

function defs() { // arrowheads for the modes' arrows, and the hatching of idle gaps
  const head = (id, c) => `<marker id="${id}" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="6" markerHeight="6" ` +
    `orient="auto-start-reverse"><path d="M0,0L8,4L0,8z" fill="${c}"/></marker>`;
  const hatch = Object.entries(info.style.causes).map(([cause, c]) =>
    `<pattern id="hatch-${cause.replace(" ", "-")}" width="6" height="6" patternUnits="userSpaceOnUse" ` +
    `patternTransform="rotate(45)"><rect width="6" height="6" fill="${c}" fill-opacity="0.16"/>` +
    `<line x1="0" y1="0" x2="0" y2="6" stroke="${c}" stroke-width="2.2" stroke-opacity="0.55"/></pattern>`).join("");
  return `<defs>${head("head-a", info.style.kinds.F)}${head("head-g", info.style.kinds.B)}` +
    `${head("head-w", "#222")}${head("head-x", BAD)}${hatch}</defs>`;
}

function block(parts, r, i, y) {
  const vtext = r.chunks > 1 ? ` v=${r.chunks}` : "";
  parts.push(`<text x="4" y="${y + 13}" font-weight="600" font-size="12">${esc(r.schedule)}</text>` +
    `<text x="${L.left + 80}" y="${y + 13}" fill="#555" class="head" data-i="${i}">p=${r.ranks} ` +
    `m=${r.microbatches}${vtext} \u00b7 ` + (r.stuck ? "does not run: pale ops are never reached; red: the wait cycle"
      : `makespan ${num(r.makespan)} \u00b7 bubble ${pct(r.bubble_fraction)} ` +
        `(closed form ${pct(r.formula_bubble_fraction)})${capText(r)}`) + "</text>");
  y += 20;
  const g = { i, y, rows: r.ranks * L.row };
  parts.push(`<rect x="${L.left}" y="${y}" width="${L.x(Modes.span(r)) - L.left}" height="${g.rows}" ` +
    `fill="#fff" stroke="#ccc" class="frame"/>`);
  r.ops.forEach((ops, rank) => {
    const ry = y + rank * L.row;
    parts.push(`<text x="${L.left - 6}" y="${ry + L.row / 2 + 4}" text-anchor="end" fill="#333" ` +
      `class="rank-label" data-rank="${rank}">rank ${rank}</text>`);
    ops.forEach((op, k) => parts.push(cell(op, r, L.x(op[4]), ry, L.x(op[5]), L.row, `${i},${rank},${k}`)));
  });
  parts.push(Modes.rows(r, i, g)); // a mode's own cells (Build your own: the ops a deadlock never reached)
  parts.push(`<g class="gaps" data-i="${i}">${gapRects(r, i, g)}</g>`);
  y += g.rows + 6;
  g.mem = y;
  parts.push(`<text x="${L.left - 6}" y="${y + 9}" text-anchor="end" fill="#777">memory</text>`);
  r.memory.forEach((steps, rank) => {
    const my = y + rank * L.mem;
    const cap = r.memory_cap ? r.memory_cap[rank] : null;
    const over = overCap(r, rank);
    parts.push(memoryPath(steps, my, cap, r.makespan, `over-${i}-${rank}`, rank) +
      `<text x="${L.width - L.right + 6}" y="${my + L.mem - 1}" fill="${over ? BAD : "#555"}" ` +
      `font-size="${L.font}"${over ? ' font-weight="600" class="over"' : ""}>` +
      `${rank === 0 ? "peak " : ""}${num(r.peak_activations[rank])}${over ? " > cap" : ""}</text>`);
  });
  y += r.ranks * L.mem + 4;
  g.end = y;
  geo.push(g);
  return axis(parts, y, Modes.span(r), i === L.count - 1) + 8;
}

function gapRects(r, i, g) { // every idle gap, clickable; shown in Why it waits and Teach
  return (r.gaps || []).map((gp, j) => {
    const [rank, a, b, , cause] = gp;
    const x0 = L.x(a), x1 = L.x(b);
    return `<rect class="gap" data-g="${i},${j}" data-cause="${cause}" x="${x0.toFixed(2)}" ` +
      `y="${g.y + rank * L.row + 1}" width="${Math.max(1, x1 - x0).toFixed(2)}" height="${L.row - 2}" ` +
      `fill="url(#hatch-${cause.replace(" ", "-")})"/>`;
  }).join("");
}

function cell(op, r, x0, y, x1, h, key, cls = "") {
  const [, kind, chunk, mb, , , bkind, bchunk] = op;
  const w = Math.max(0.5, x1 - x0 - 0.6);
  const xs = `x="${x0.toFixed(2)}" width="${w.toFixed(2)}"`;
  const klass = cls ? ` class="${cls}"` : ""; // cells are most of the page: nothing more on each
  let out, fill;
  if (kind === "F&B") { // forward over backward in one cell, as the SVG renderer draws a pair
    fill = r.colours.F[chunk];
    const half = (h - 2) / 2;
    out = `<g data-k="${key}"${klass}><rect ${xs} y="${y + 1}" height="${half}" fill="${fill}"/>` +
      `<rect ${xs} y="${y + 1 + half}" height="${half}" fill="${r.colours[bkind][bchunk]}"/></g>`;
  } else {
    fill = r.colours[kind][chunk];
    out = `<rect data-k="${key}"${klass} ${xs} y="${y + 1}" height="${h - 2}" fill="${fill}"/>`;
  }
  // the micro-batch number, as large as fits (down to 6 px), at any m
  const digits = String(mb).length;
  const size = Math.min(11, h - 5, (w - 2) / (digits * 0.62));
  if (size >= 6) {
    out += `<text x="${(x0 + w / 2).toFixed(2)}" y="${(y + h / 2 + size * 0.36).toFixed(2)}" text-anchor="middle" ` +
      `fill="${r.ink[fill]}" font-size="${size.toFixed(1)}" pointer-events="none">${mb}</text>`;
  }
  return out;
}

function capText(r) {
  if (!r.memory_cap) return "";
  const peak = Math.max(...r.peak_activations), cap = Math.max(...r.memory_cap);
  return ` \u00b7 peak ${num(peak)} ${r.within_cap ? "within" : "over"} cap ${num(cap)}`;
}

function memoryPath(steps, y, cap, end, clip, rank) {
  // live activations as a filled step curve, every schedule and rank on one scale (L.top);
  // with a cap: a dashed line at it, and what lies above it drawn again in red
  const h = L.mem - 1;
  const Y = (v) => (y + h - (v / L.top) * h).toFixed(2);
  let d = `M${L.x(0)},${y + h}`;
  let level = 0;
  for (const [t, v] of steps) {
    d += `L${L.x(t).toFixed(2)},${Y(level)}L${L.x(t).toFixed(2)},${Y(v)}`;
    level = v;
  }
  d += `L${L.x(end).toFixed(2)},${Y(level)}L${L.x(end).toFixed(2)},${y + h}Z`;
  let out = `<rect x="${L.left}" y="${y}" width="${L.x(end) - L.left}" height="${h}" fill="#f4f4f4" ` +
    `class="strip" data-rank="${rank}"/>` +
    `<path d="${d}" fill="${info.style.memory}" fill-opacity="0.55" stroke="${info.style.memory}" stroke-width="0.6"/>`;
  if (cap === null) return out;
  const cy = Y(cap);
  out += `<clipPath id="${clip}"><rect x="${L.left}" y="${y - 1}" width="${L.x(end) - L.left}" ` +
    `height="${Math.max(0, cy - y + 1).toFixed(2)}"/></clipPath>` +
    `<path d="${d}" fill="${BAD}" clip-path="url(#${clip})"/>` +
    `<line class="cap" x1="${L.left}" x2="${L.x(end).toFixed(2)}" y1="${cy}" y2="${cy}" stroke="${BAD}" ` +
    `stroke-width="0.8" stroke-dasharray="3 3"/>`;
  return out;
}

function axis(parts, y, end, last) { // a time axis under every chart; its unit under the last
  const step = niceStep(L.span / 8);
  parts.push(`<g class="axis"><line x1="${L.left}" x2="${L.x(end)}" y1="${y}" y2="${y}" stroke="#999"/>` +
    `<text x="${L.left - 6}" y="${y + 14}" text-anchor="end" fill="#777">time</text>`);
  for (let t = 0; t <= end + 1e-9; t += step) {
    parts.push(`<line x1="${L.x(t)}" x2="${L.x(t)}" y1="${y}" y2="${y + 4}" stroke="#999"/>` +
      `<text x="${L.x(t)}" y="${y + 14}" text-anchor="middle" fill="#555">${num(+t.toPrecision(12))}</text>`);
  }
  if (last) parts.push(`<text x="${L.x(end)}" y="${y + 27}" text-anchor="end" fill="#555">time (${esc(L.unit)})</text>`);
  parts.push("</g>");
  return y + (last ? 30 : 18);
}

function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(raw || 1));
  return [1, 2, 5, 10].map((k) => k * p).find((s) => s >= raw);
}

// where things are on the picture, for the modes' layers
const rowY = (i, rank) => geo[i].y + rank * L.row;
const opAt = (r, rank, k) => (k < r.ops[rank].length ? r.ops[rank][k] : Modes.extraOp(r, rank, k));
const overlay = (i) => document.querySelector(`#layers .overlay[data-i="${i}"]`); // the modes draw here

function arrow(x0, y0, x1, y1, head, cls, stroke) { // a slightly bent arrow from (x0, y0) to (x1, y1)
  const mx = (x0 + x1) / 2 + Math.min(12, Math.abs(y1 - y0) / 4);
  return `<path class="${cls}" d="M${x0.toFixed(1)},${y0.toFixed(1)}Q${mx.toFixed(1)},${((y0 + y1) / 2).toFixed(1)} ` +
    `${x1.toFixed(1)},${y1.toFixed(1)}" fill="none" stroke="${stroke}" stroke-width="1.3" marker-end="url(#${head})"/>`;
}

// ---- hover ---------------------------------------------------------------------------

function hover(ev) {
  const tip = $("tip");
  const el = ev.target.closest("[data-k], .gap");
  if (!el || !shown || Modes.dragging()) { tip.hidden = true; return; }
  const results = Modes.results(shown);
  let html;
  if (el.classList.contains("gap")) {
    const [i, j] = el.dataset.g.split(",").map(Number);
    const [rank, a, b, , cause] = results[i].gaps[j];
    html = `<b>idle</b> rank ${rank} \u00b7 ${num(a)}..${num(b)} (${num(b - a)}) \u00b7 <b>${esc(cause)}</b>` +
      "<br>click: what it waits for, and why";
  } else {
    const [i, rank, k] = el.dataset.k.split(",").map(Number);
    const [text, kind, , , start, end] = opAt(results[i], rank, k);
    html = `<b>${esc(text)}</b> ${KIND_NAMES[kind]}<br>rank ${rank} \u00b7 start ${num(start)} \u00b7 ` +
      `end ${num(end)} \u00b7 ${num(end - start)} long` + Modes.tip(results[i], i, rank, k);
  }
  tip.innerHTML = html;
  tip.hidden = false;
  tip.style.left = `${Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8)}px`;
  tip.style.top = `${ev.clientY + 16}px`;
}

// ---- downloads -------------------------------------------------------------------------

function save(blob, name) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function stem() { // names the file after what is on screen (the controls may hold a newer, invalid setting)
  const rs = Modes.results(shown);
  return `${rs.map((r) => r.schedule.replace(/ \(edited\)$/, "-edited")).join("-")}-p${rs[0].ranks}-m${rs[0].microbatches}`;
}

// the page's CSS does not travel with a file: what it sets on classed elements goes in as attributes
const STYLED = ["fill", "fill-opacity", "stroke", "stroke-width", "stroke-dasharray", "opacity", "display"];

function styledCopy(live) {
  const copy = live.cloneNode(true);
  const from = live.querySelectorAll("[class]"), to = copy.querySelectorAll("[class]");
  from.forEach((el, k) => {
    const cs = getComputedStyle(el);
    for (const prop of STYLED) to[k].setAttribute(prop, cs.getPropertyValue(prop));
  });
  return copy;
}

function svgText() { // the picture with what the mode drew on it
  const svg = styledCopy($("timeline"));
  for (const g of styledCopy($("layers")).children) svg.append(g);
  return new XMLSerializer().serializeToString(svg);
}

function downloadSvg() {
  if (shown) save(new Blob([svgText()], { type: "image/svg+xml" }), `${stem()}.svg`);
}

function downloadPng() {
  if (!shown) return;
  const svg = $("timeline");
  const scale = 2; // crisp on high-density screens and in slides
  const img = new Image();
  img.onload = () => {
    const c = document.createElement("canvas");
    c.width = svg.width.baseVal.value * scale;
    c.height = svg.height.baseVal.value * scale;
    const g = c.getContext("2d");
    g.scale(scale, scale);
    g.drawImage(img, 0, 0);
    URL.revokeObjectURL(img.src);
    c.toBlob((b) => save(b, `${stem()}.png`), "image/png");
  };
  img.src = URL.createObjectURL(new Blob([svgText()], { type: "image/svg+xml" }));
}

async function downloadFile(fmt, i) {
  // one schedule of the view: the same settings with only that family
  const q = new URLSearchParams(shownQuery);
  q.set("schedules", shown[i].schedule);
  q.set("format", fmt);
  const resp = await fetch(`/api/download?${q}`);
  if (!resp.ok) {
    $("err-format").textContent = (await resp.json()).error;
    return;
  }
  $("err-format").textContent = "";
  const name = /filename="([^"]+)"/.exec(resp.headers.get("Content-Disposition") || "");
  save(await resp.blob(), name ? name[1] : `${shown[i].schedule}.${fmt}`);
}

// ---- modes --------------------------------------------------------------------------------

// Each mode (play.js, why.js, build.js, teach.js) registers hooks here; the view mode has none.
const Modes = {
  all: { play: Play, why: Why, build: Build, teach: Teach },
  get current() { return this.all[page.mode] || {}; },
  call(name, ...args) { const m = this.current, f = m[name]; return f ? f.apply(m, args) : undefined; },
  results(rs) { return this.call("results", rs) || rs; },
  span(r) { return this.call("span", r) || r.makespan; },
  rows(r, i, g) { return this.call("rows", r, i, g) || ""; },
  extraOp(r, rank, k) { return this.call("extraOp", r, rank, k); },
  legend(rs) { return this.call("legend", rs) || ""; },
  tip(r, i, rank, k) { return this.call("tip", r, i, rank, k) || ""; },
  dragging() { return !!this.call("dragging"); },
  drawn(rs) { this.call("drawn", rs); },
  async arrive(rs) { await this.call("arrive", rs); },
  settingsChanged() { for (const m of Object.values(this.all)) if (m.settingsChanged) m.settingsChanged(); },
};

async function setMode(mode) {
  if (mode === page.mode) return;
  const was = page.mode;
  Modes.call("leave");
  page.mode = mode;
  syncModeTabs();
  Modes.call("enter");
  saveUrl();
  // Build your own draws its own schedule: ask again; the other modes add their layers to the picture
  if (mode === "build" || was === "build") return update();
  if (!shown) return;
  await Modes.arrive(shown); // Play fetches the messages, Teach its numbers
  if (mode === "teach" || was === "teach") redraw(); // the lesson takes width from the picture
  else relayer();
}

function relayer() { // a mode's layers on the picture already drawn (the cells stay)
  const results = Modes.results(shown);
  $("legend").innerHTML = legendHtml(results);
  for (const el of document.querySelectorAll("#layers .overlay")) el.innerHTML = "";
  $("why-detail").hidden = true;
  Modes.drawn(results);
  $("view").dataset.redrawn = Number($("view").dataset.redrawn || 0) + 1;
}

function syncModeTabs() {
  for (const b of document.querySelectorAll("#modes button")) b.setAttribute("aria-pressed", b.dataset.mode === page.mode);
  $("view").dataset.mode = page.mode;
  for (const m of MODES) { const el = $(`panel-${m}`); if (el) el.hidden = m !== page.mode; }
}

// ---- start --------------------------------------------------------------------------------

function buildFamilies() {
  $("families").innerHTML = info.families.map((f) =>
    `<label title="${esc(f.summary)}"><input type="checkbox" name="schedules" value="${esc(f.name)}">` +
    `<span>${esc(f.name)}</span></label>`).join("");
}

function bind() {
  $("controls").addEventListener("input", (ev) => {
    const target = ev.target;
    if (target.dataset.for) $(target.dataset.for).value = target.value;
    else if (FIELDS.includes(target.id)) syncRange(target.id);
    if (target.id === "per") syncCapUnit();
    schedule();
  });
  // a select may fire only `change` (WebDriver's option clicks do); the debounce merges the pair browsers send
  $("per").addEventListener("change", () => { syncCapUnit(); schedule(); });
  $("controls").addEventListener("submit", (ev) => ev.preventDefault());
  $("charts").addEventListener("mousemove", hover);
  $("charts").addEventListener("mouseleave", () => { $("tip").hidden = true; });
  $("dl-png").addEventListener("click", downloadPng);
  $("dl-svg").addEventListener("click", downloadSvg);
  $("modes").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-mode]");
    if (b) setMode(b.dataset.mode);
  });
  $("summary").addEventListener("click", (ev) => {
    const a = ev.target.closest("[data-dl]");
    if (!a) return;
    ev.preventDefault();
    if (a.dataset.dl === "edited") Modes.all.build.download();
    else downloadFile(a.dataset.dl, Number(a.dataset.i));
  });
  for (const m of Object.values(Modes.all)) if (m.bind) m.bind();
  let width = $("charts").clientWidth;
  window.addEventListener("resize", () => {
    if (shown && Math.abs($("charts").clientWidth - width) > 20) {
      width = $("charts").clientWidth;
      redraw();
    }
  });
}

async function start() {
  try {
    info = await (await fetch("/api/families")).json();
  } catch (e) {
    setStatus(`cannot reach the workshop server (${e.message})`, true);
    return;
  }
  buildFamilies();
  writeControls(new URLSearchParams(location.search));
  bind();
  syncModeTabs();
  Modes.call("enter");
  update();
}

start();
