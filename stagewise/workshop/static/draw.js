// The picture: one SVG of every timeline on one time axis, to scale, in render.palette's colours (from the
// API: info.style), with the summary table and the legend. app.js calls chartSvg / summaryHtml / legendHtml;
// the modes draw on the second SVG (#layers) with rowY, opAt, overlay and arrow.
//
// A rank's block is its row of ops, then one thin lane per kind of communication the answer carries
// (r.lanes: today the expert-parallel all-to-all; sends, receives and collectives add lanes the same way),
// so a lane per rank needs no change here beyond its colours. Loaded before app.js.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const KIND_NAMES = { F: "forward", B: "backward", I: "input-grad backward", W: "weight-grad backward",
  "F&B": "overlapped forward & backward" };
const NOTE_ROW = 14; // a row over each chart's ranks for the modes' labels (Why it waits: the first cause)

const pct = (x) => (x === null || x === undefined ? "\u2014" : `${(100 * x).toFixed(1)}%`);
const num = (x) => (Number.isInteger(x) ? String(x) : String(+x.toPrecision(4)));
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

let geo = [];  // per result on screen: where its chart lies (rows, memory strips), for the modes' layers
let L = null;  // the drawing's scale (layout)

// the page's own colours (render.palette.PAGE), e.g. C.bad; set as CSS variables too (app.js, at start)
const C = new Proxy({}, { get: (_, name) => info.style.page[name] });

// ---- summary and legend ------------------------------------------------------------

// the kinds of lane (a2a, comm) any result draws, in first-seen order
const laneKeys = (results) => [...new Set(results.flatMap((r) => (r.lanes || []).map((ln) => ln.key)))];

// the time the busiest rank waited on a lane's transfers (each lane row: [start, end, waited, text])
const exposedOn = (r, key) => {
  const lane = (r.lanes || []).find((ln) => ln.key === key);
  return lane ? Math.max(...lane.rows.map((row) => row.reduce((sum, c) => sum + c[2], 0))) : null;
};

function summaryHtml(results, perStage) {
  const unit = perStage ? "one stage" : "one rank's share of the model";
  const kinds = laneKeys(results);
  const head = "<tr><th>schedule</th><th>p</th><th>m</th><th>v</th><th>makespan</th>" +
    '<th title="idle share: 1 - busy / (ranks x makespan)">bubble</th>' +
    '<th title="the papers\' formula for these settings; \u2014 where none applies">closed form</th>' +
    `<th title="live activations at the peak, in micro-batches of ${unit}">peak activations per rank</th>` +
    (results.some((r) => r.memory_cap) ? '<th title="highest peak against the cap per rank (--cap)">peak vs cap</th>' : "") +
    kinds.map((k) => (k === "a2a" ? '<th title="all-to-all the ranks waited for, the busiest rank">exposed a2a</th>'
      : '<th title="communication (gathers, reductions, sends) the busiest rank waited for">exposed comm</th>')).join("") +
    '<th title="copies of the model\'s parameters held (DualPipe keeps two)">params</th><th>files</th></tr>';
  const rows = results.map((r, i) => {
    const formula = r.formula_bubble_fraction === null
      ? '<td class="na" title="no closed form for this family or these costs (uneven stages, latency)">\u2014</td>'
      : `<td class="formula">${pct(r.formula_bubble_fraction)}</td>`;
    const files = r.edited ? '<td><a href="#" data-dl="edited">CSV</a></td>'
      : `<td><a href="#" data-dl="csv" data-i="${i}">CSV</a> <a href="#" data-dl="trace" data-i="${i}">trace</a></td>`;
    const a2a = kinds.map((k) => {  // one column per kind of lane drawn: what the busiest rank waited for
      const x = k === "a2a" ? (r.exposed_a2a ? Math.max(...r.exposed_a2a) : null) : exposedOn(r, k);
      return `<td class="${k}">${x === null ? "\u2014" : num(+x.toFixed(4))}</td>`;
    }).join("");
    if (r.stuck) { // a deadlock: nothing to measure
      return `<tr data-schedule="${esc(r.schedule)}" class="stuck"><td class="name">${esc(r.schedule)}</td>` +
        `<td>${r.ranks}</td><td>${r.microbatches}</td><td>${r.chunks}</td><td class="makespan">\u2014</td>` +
        `<td class="bubble over" colspan="3">does not run: the ranks stop in a wait cycle</td>${a2a}` +
        `<td class="params">${num(Math.max(...r.parameter_copies))}\u00d7</td><td></td></tr>`;
    }
    return `<tr data-schedule="${esc(r.schedule)}"><td class="name">${esc(r.schedule)}</td><td>${r.ranks}</td>` +
      `<td>${r.microbatches}</td><td>${r.chunks}</td><td class="makespan">${num(r.makespan)}</td>` +
      `<td class="bubble">${pct(r.bubble_fraction)}</td>${formula}` +
      `<td class="peaks">${peaksHtml(r)}</td>${capCell(r)}${a2a}` +
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

function causeSwatch(cause, w = 22, h = 12) { // a cause's hatch, with its own pattern (legend SVGs stand alone)
  const id = `lg-${hatchId(cause)}`;
  return `<svg width="${w}" height="${h}" class="hatch"><defs>${pattern(cause, id)}</defs>` +
    `<rect x="0.5" y="0.5" width="${w - 1}" height="${h - 1}" fill="url(#${id})" stroke="${info.style.causes[cause].colour}" ` +
    'stroke-width="0.8"/></svg>';
}

function causeLegend(causes) { // every cause drawn, each with its hatch, name and label; its meaning on hover
  if (!causes.size) return "";
  return '<span class="note">idle, by cause:</span>' + Object.entries(info.style.causes)
    .filter(([cause]) => causes.has(cause))
    .map(([cause, c]) => `<span class="cause" data-cause="${esc(cause)}" title="${esc(c.meaning)}">` +
      `${causeSwatch(cause)}<b>${esc(cause)}</b>&nbsp;${esc(c.label)}</span>`).join("");
}

function legendHtml(results, extra = "") {
  const kinds = new Set();
  for (const r of results) for (const row of r.ops) for (const op of row) kinds.add(op[1]).add(op[6]);
  const most = results.reduce((a, b) => (b.chunks > a.chunks ? b : a));
  const items = ["F", "B", "I", "W"].filter((k) => kinds.has(k)).map((k) =>
    `<span>${most.colours[k].map(swatch).join("")}${esc(info.style.labels[k])}</span>`);
  if (most.chunks > 1) items.push(`<span class="note">lighter: chunk 1${most.chunks > 2 ? "+" : ""} of a rank</span>`);
  if (kinds.has("F&B")) items.push(`<span>${swatch(most.colours.F[0])}over${swatch(most.colours.B[0])} F&amp;B pair</span>`);
  for (const key of laneKeys(results)) {
    const [hid, exp] = info.style.lanes[key];
    const label = results.flatMap((r) => r.lanes || []).find((ln) => ln.key === key).label;
    items.push(`<span>${swatch(hid)}${esc(label)} behind compute ${swatch(exp)}the rank waits for it</span>`);
  }
  if (!results.every((r) => r.stuck)) items.push(`<span>${swatch(info.style.memory)}live activations</span>`);
  if (results.some((r) => r.memory_cap)) {
    items.push(`<span><svg width="18" height="12"><line x1="0" x2="18" y1="6" y2="6" stroke="${C.bad}" ` +
      `stroke-width="1.5" stroke-dasharray="4 3"/></svg>cap</span><span>${swatch(C.bad)}over the cap</span>`);
  }
  items.push('<span><i class="idle"></i>idle</span>' +
    '<span class="note" title="where a number does not fit its cell, hover the cell or zoom in">numbers: micro-batch</span>');
  return items.join("") + extra;
}

// ---- the chart -------------------------------------------------------------------------

function rightLabels(results) { // the memory strips' labels, to size the right margin to the longest
  return results.filter((r) => !r.stuck).flatMap((r) => r.peak_activations.map((x, rank) =>
    `${rank === 0 ? "peak " : ""}${num(x)}${overCap(r, rank) ? " > cap" : ""}`));
}

function layout(results, width, span) {
  const p = Math.max(...results.map((r) => r.ranks));
  // rows as tall as the window allows (two charts share it), 10 to 24 px
  const room = Math.max(260, Math.min(720, window.innerHeight - 300)) / Math.min(2, results.length);
  const row = Math.max(10, Math.min(24, Math.floor(room / p)));
  const lanes = Math.max(0, ...results.map((r) => (r.lanes || []).length));
  const lane = lanes ? Math.max(3, Math.round(row * 0.22)) : 0;
  const capped = results.some((r) => r.memory_cap);
  const mem = Math.max(5, Math.round(row * (capped ? 0.75 : 0.5))); // taller with a cap: the line must read
  const font = Math.min(10, mem + 2);
  const longest = Math.max(4, ...rightLabels(results).map((s) => s.length));
  const left = 58, right = Math.ceil(14 + longest * font * 0.62);
  const unit = results[0].unit === "t_f" ? "t_F units" : results[0].unit;
  // one memory scale for every schedule shown (and the cap), so the curves compare
  const top = Math.max(1e-9, ...results.flatMap((r) => [...r.peak_activations, ...(r.memory_cap || [])]));
  return { count: results.length, row, lane, lanes, step: row + lanes * lane, mem, font, left, right, width, span, unit, top,
    x: (t) => left + (t / span) * (width - left - right), t: (x) => ((x - left) / (width - left - right)) * span };
}

function chartSvg(results, width, span) {
  L = layout(results, width, span);
  geo = [];
  const parts = [defs()];
  let y = 4;
  results.forEach((r, i) => { y = block(parts, r, i, y); });
  // the modes draw on a second SVG over the first, a layer of its own: moving the Play cursor repaints
  // only it, not the cells (tens of thousands at p=16, m=64)
  const layers = geo.map((g) => `<g class="overlay" data-i="${g.i}"></g>`).join("");
  return `<svg xmlns="${SVGNS}" id="timeline" width="${width}" height="${y}" ` +
    `viewBox="0 0 ${width} ${y}" font-family="system-ui, sans-serif" font-size="11">` +
    `<rect width="${width}" height="${y}" fill="${C.panel}"/>${parts.join("")}</svg>` +
    `<svg xmlns="${SVGNS}" id="layers" width="${width}" height="${y}" viewBox="0 0 ${width} ${y}" ` +
    `font-family="system-ui, sans-serif" font-size="11">${defs("l-")}${layers}</svg>`;
}

const hatchId = (cause) => `hatch-${cause.replace(/ /g, "-")}`;

function pattern(cause, id) { // one hatch per cause (render.palette.CAUSES): its colour and its own pattern
  const { colour: c, pattern: kind } = info.style.causes[cause];
  const line = (x1, y1, x2, y2) => `<line x1="${x1}" y1="${y1}" x2="${x2}" y2="${y2}" stroke="${c}" stroke-width="1.6" ` +
    'stroke-opacity="0.75"/>';
  const body = {
    diagonal: ["rotate(45)", line(0, 0, 0, 6)],
    backslash: ["rotate(-45)", line(0, 0, 0, 6)],
    cross: ["rotate(45)", line(0, 0, 0, 6) + line(0, 0, 6, 0)],
    horizontal: ["", line(0, 3, 6, 3)],
    vertical: ["", line(3, 0, 3, 6)],
    grid: ["", line(0, 3, 6, 3) + line(3, 0, 3, 6)],
    dots: ["", `<circle cx="3" cy="3" r="1.3" fill="${c}" fill-opacity="0.85"/>`],
  }[kind] || ["", ""];
  return `<pattern id="${id}" width="6" height="6" patternUnits="userSpaceOnUse"` +
    `${body[0] ? ` patternTransform="${body[0]}"` : ""}><rect width="6" height="6" fill="${c}" fill-opacity="0.13"/>` +
    `${body[1]}</pattern>`;
}

function defs(prefix = "") { // arrowheads for the modes' arrows, and the hatching of idle gaps
  const head = (id, c) => `<marker id="${prefix}${id}" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="6" ` +
    `markerHeight="6" orient="auto-start-reverse"><path d="M0,0L8,4L0,8z" fill="${c}"/></marker>`;
  const hatch = Object.keys(info.style.causes).map((cause) => pattern(cause, prefix + hatchId(cause))).join("");
  return `<defs>${head("head-a", info.style.kinds.F)}${head("head-g", info.style.kinds.B)}` +
    `${head("head-w", C.arrow)}${head("head-x", C.bad)}${hatch}</defs>`;
}

function block(parts, r, i, y) {
  const vtext = r.chunks > 1 ? ` v=${r.chunks}` : "";
  parts.push(`<text x="4" y="${y + 13}" font-weight="600" font-size="12">${esc(r.schedule)}</text>` +
    `<text x="${L.left + 80}" y="${y + 13}" fill="${C.label}" class="head" data-i="${i}">p=${r.ranks} ` +
    `m=${r.microbatches}${vtext} \u00b7 ` +
    (r.stuck ? "does not run: what ran before the ranks stopped; pale, dashed: ops never reached; red: the wait cycle"
      : `makespan ${num(r.makespan)} \u00b7 bubble ${pct(r.bubble_fraction)} ` +
        `(closed form ${pct(r.formula_bubble_fraction)})${capText(r)}`) + "</text>");
  y += 18;
  const g = { i, note: y, y: y + NOTE_ROW, rows: r.ranks * L.step };
  y = g.y;
  parts.push(`<rect x="${L.left}" y="${y}" width="${L.x(Modes.span(r)) - L.left}" height="${g.rows}" ` +
    `fill="${C.panel}" stroke="${C.frame}" class="frame"/>`);
  r.ops.forEach((ops, rank) => {
    const ry = y + rank * L.step;
    parts.push(`<text x="${L.left - 6}" y="${ry + L.row / 2 + 4}" text-anchor="end" fill="${C.text}" ` +
      `class="rank-label" data-rank="${rank}">rank ${rank}</text>`);
    ops.forEach((op, k) => parts.push(cell(op, r, L.x(op[4]), ry, L.x(op[5]), L.row, `${i},${rank},${k}`)));
  });
  parts.push(laneRects(r, i, y));
  parts.push(Modes.rows(r, i, g)); // a mode's own cells (Build your own: the ops a deadlock never reached)
  parts.push(`<g class="gaps" data-i="${i}">${gapRects(r, i, g)}</g>`);
  y += g.rows + 6;
  g.mem = y;
  if (!r.stuck) { // an order that never runs has no memory curve to show
    parts.push(`<text x="${L.left - 6}" y="${y + 9}" text-anchor="end" fill="${C.dim}">memory</text>`);
    const top = r.peak_activations.indexOf(Math.max(...r.peak_activations));
    r.memory.forEach((steps, rank) => {
      const my = y + rank * L.mem;
      const cap = r.memory_cap ? r.memory_cap[rank] : null;
      const over = overCap(r, rank);
      // strips too thin for a label each: the highest peak and those over the cap (the table has them all)
      const label = L.mem >= 8 || rank === top || over;
      parts.push(memoryPath(steps, my, cap, r.makespan, `over-${i}-${rank}`, rank) + (label
        ? `<text x="${L.width - L.right + 6}" y="${my + L.mem - 1}" fill="${over ? C.bad : C.label}" ` +
          `font-size="${L.font}"${over ? ' font-weight="600" class="over"' : ""}>` +
          `${rank === 0 || L.mem < 8 ? "peak " : ""}${num(r.peak_activations[rank])}${over ? " > cap" : ""}</text>` : ""));
    });
    y += r.ranks * L.mem + 4;
  }
  g.end = y;
  geo.push(g);
  return axis(parts, y, Modes.span(r), i === L.count - 1) + 8;
}

function laneRects(r, i, y) { // each lane under each rank's row: pale while hidden behind compute, dark where waited
  return (r.lanes || []).map((lane, j) => {
    const [hid, exp] = info.style.lanes[lane.key];
    return `<g class="lane" data-lane="${esc(lane.key)}">` + lane.rows.map((row, rank) => {
      const ly = y + rank * L.step + L.row + j * L.lane;
      return row.map(([a, b, waited], k) => {
        const key = `data-l="${i},${j},${rank},${k}"`;
        const mid = b - waited;
        return (mid > a ? `<rect ${key} x="${L.x(a).toFixed(2)}" y="${ly}" width="${(L.x(mid) - L.x(a)).toFixed(2)}" ` +
          `height="${L.lane - 0.5}" fill="${hid}"/>` : "") +
          (waited > 0 ? `<rect ${key} class="waited" x="${L.x(mid).toFixed(2)}" y="${ly}" ` +
          `width="${Math.max(0.5, L.x(b) - L.x(mid)).toFixed(2)}" height="${L.lane - 0.5}" fill="${exp}"/>` : "");
      }).join("");
    }).join("") + "</g>";
  }).join("");
}

function gapRects(r, i, g) { // every idle gap, clickable; shown in Why it waits, Build your own and Teach
  return (r.gaps || []).map((gp, j) => {
    const [rank, a, b, , cause] = gp;
    const x0 = L.x(a), x1 = L.x(b);
    return `<rect class="gap" data-g="${i},${j}" data-cause="${cause}" x="${x0.toFixed(2)}" ` +
      `y="${g.y + rank * L.step + 1}" width="${Math.max(1, x1 - x0).toFixed(2)}" height="${L.row - 2}" ` +
      `fill="url(#${hatchId(cause)})"/>`;
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
  return out + mbLabel(mb, x0 + w / 2, y, w, h, r.ink[fill]);
}

function mbLabel(mb, cx, y, w, h, ink, cls = "") { // the micro-batch number, as large as fits (down to 5 px)
  const size = Math.min(11, h - 5, (w - 1.5) / (String(mb).length * 0.6));
  if (size < 5) return ""; // too narrow: the cell's tip says it, and zooming in shows it
  return `<text${cls ? ` class="${cls}"` : ""} x="${cx.toFixed(2)}" y="${(y + h / 2 + size * 0.36).toFixed(2)}" ` +
    `text-anchor="middle" fill="${ink}" font-size="${size.toFixed(1)}" pointer-events="none">${mb}</text>`;
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
  let out = `<rect x="${L.left}" y="${y}" width="${L.x(end) - L.left}" height="${h}" fill="${C.strip}" ` +
    `class="strip" data-rank="${rank}"/>` +
    `<path d="${d}" fill="${info.style.memory}" fill-opacity="0.55" stroke="${info.style.memory}" stroke-width="0.6"/>`;
  if (cap === null) return out;
  const cy = Y(cap);
  out += `<clipPath id="${clip}"><rect x="${L.left}" y="${y - 1}" width="${L.x(end) - L.left}" ` +
    `height="${Math.max(0, cy - y + 1).toFixed(2)}"/></clipPath>` +
    `<path d="${d}" fill="${C.bad}" clip-path="url(#${clip})"/>` +
    `<line class="cap" x1="${L.left}" x2="${L.x(end).toFixed(2)}" y1="${cy}" y2="${cy}" stroke="${C.bad}" ` +
    `stroke-width="0.8" stroke-dasharray="3 3"/>`;
  return out;
}

function axis(parts, y, end, last) { // a time axis under every chart; its unit under the last
  const step = niceStep(L.span / Math.max(8, Math.round((L.width - L.left - L.right) / 110)));
  parts.push(`<g class="axis"><line x1="${L.left}" x2="${L.x(end)}" y1="${y}" y2="${y}" stroke="${C.axis}"/>` +
    `<text x="${L.left - 6}" y="${y + 14}" text-anchor="end" fill="${C.dim}">time</text>`);
  for (let t = 0; t <= end + 1e-9; t += step) {
    parts.push(`<line x1="${L.x(t)}" x2="${L.x(t)}" y1="${y}" y2="${y + 4}" stroke="${C.axis}"/>` +
      `<text x="${L.x(t)}" y="${y + 14}" text-anchor="middle" fill="${C.label}">${num(+t.toPrecision(12))}</text>`);
  }
  if (last) parts.push(`<text x="${L.x(end)}" y="${y + 27}" text-anchor="end" fill="${C.label}">time (${esc(L.unit)})</text>`);
  parts.push("</g>");
  return y + (last ? 30 : 18);
}

function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(raw || 1));
  return [1, 2, 5, 10].map((k) => k * p).find((s) => s >= raw);
}

// ---- where things are, for the modes' layers ------------------------------------------------

const rowY = (i, rank) => geo[i].y + rank * L.step;
const opAt = (r, rank, k) => (k < r.ops[rank].length ? r.ops[rank][k] : Modes.extraOp(r, rank, k));
const overlay = (i) => document.querySelector(`#layers .overlay[data-i="${i}"]`); // the modes draw here

function arrow(x0, y0, x1, y1, head, cls, stroke, bend = null, halo = false) {
  // an arrow from (x0, y0) to (x1, y1): straight where it is short or vertical (a message at latency 0),
  // else bent; `bend` (px) curves it to the right of its direction, so two opposite arrows form a loop
  const dx = x1 - x0, dy = y1 - y0, len = Math.hypot(dx, dy) || 1;
  const off = bend ?? (Math.abs(dx) < 6 ? 0 : Math.min(12, Math.abs(dy) / 4));
  const mx = (x0 + x1) / 2 - (dy / len) * off, my = (y0 + y1) / 2 + (dx / len) * off;
  const d = off ? `M${x0.toFixed(1)},${y0.toFixed(1)}Q${mx.toFixed(1)},${my.toFixed(1)} ${x1.toFixed(1)},${y1.toFixed(1)}`
    : `M${x0.toFixed(1)},${y0.toFixed(1)}L${x1.toFixed(1)},${y1.toFixed(1)}`;
  // a halo (the panel's colour, wider, under it) keeps an arrow readable over cells of any colour
  return (halo ? `<path class="halo" d="${d}" fill="none" stroke="${C.panel}" stroke-width="4" stroke-opacity="0.85"/>` : "") +
    `<path class="${cls}" d="${d}" fill="none" stroke="${stroke}" stroke-width="1.4" marker-end="url(#l-${head})"/>`;
}
