// The workshop page: controls -> /api/simulate -> one SVG of every timeline, to scale.
// The server simulates (the same code as the CLI); this file only draws what it returns.
"use strict";

const FIELDS = ["p", "m", "v", "tf", "tb", "ti", "tw", "tfb", "latency", "skew", "per", "free_at_i", "cap"];
const DEBOUNCE_MS = 120;
// Colours come from the server (stagewise.render.palette), so the page, the SVG files and the
// notebook look alike: forward blue, backward greens, lighter shades for a rank's later chunks.
const BAD = "#b3261e"; // over the memory cap: the page's error colour
const KIND_NAMES = { F: "forward", B: "backward", I: "input-grad backward", W: "weight-grad backward",
  "F&B": "overlapped forward & backward" };

const $ = (id) => document.getElementById(id);
let info = null;        // /api/families
let seq = 0;            // request counter: only the latest answer is drawn
let timer = null;
let shown = null;       // the results on screen, for hover and downloads
let shownQuery = "";
let notice = null;      // [field, message] to show once, after the first answer (a link naming a missing family)

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

async function update() {
  const st = readControls();
  const my = ++seq;
  const query = toQuery(st);
  history.replaceState(null, "", query ? `?${query}` : location.pathname);
  const t0 = performance.now();
  let resp, data;
  try {
    resp = await fetch("/api/simulate", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(st) });
    data = await resp.json();
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
  shown = data.results;
  shownQuery = query;
  draw(shown);
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
  for (const e of document.querySelectorAll(".err")) e.textContent = "";
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

function draw(results) {
  $("summary").innerHTML = summaryHtml(results);
  $("legend").innerHTML = legendHtml(results);
  $("charts").innerHTML = chartSvg(results, Math.max(640, $("charts").clientWidth));
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
    return `<tr data-schedule="${esc(r.schedule)}"><td class="name">${esc(r.schedule)}</td><td>${r.ranks}</td>` +
      `<td>${r.microbatches}</td><td>${r.chunks}</td><td class="makespan">${num(r.makespan)}</td>` +
      `<td class="bubble">${pct(r.bubble_fraction)}</td>${formula}` +
      `<td class="peaks">${peaksHtml(r)}</td>${capCell(r)}` +
      `<td class="params">${num(Math.max(...r.parameter_copies))}\u00d7</td>` +
      `<td><a href="#" data-dl="csv" data-i="${i}">CSV</a> <a href="#" data-dl="trace" data-i="${i}">trace</a></td></tr>`;
  });
  return head + rows.join("");
}

const overCap = (r, rank) => r.memory_cap !== null && r.peak_activations[rank] > r.memory_cap[rank] * (1 + 1e-9);

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

function legendHtml(results) {
  const kinds = new Set();
  for (const r of results) for (const row of r.ops) for (const op of row) kinds.add(op[1]).add(op[6]);
  const most = results.reduce((a, b) => (b.chunks > a.chunks ? b : a));
  // swatches are SVG: the page's CSP allows no inline style attributes
  const sw = (c) => `<svg width="14" height="12"><rect width="14" height="12" rx="2" fill="${c}"/></svg>`;
  const items = ["F", "B", "I", "W"].filter((k) => kinds.has(k)).map((k) =>
    `<span>${most.colours[k].map(sw).join("")}${esc(info.style.labels[k])}</span>`);
  if (most.chunks > 1) items.push(`<span class="note">lighter: chunk 1${most.chunks > 2 ? "+" : ""} of a rank</span>`);
  if (kinds.has("F&B")) items.push(`<span>${sw(most.colours.F[0])}over${sw(most.colours.B[0])} F&amp;B pair</span>`);
  items.push(`<span>${sw(info.style.memory)}live activations</span>`);
  if (results.some((r) => r.memory_cap)) {
    items.push(`<span><svg width="18" height="12"><line x1="0" x2="18" y1="6" y2="6" stroke="${BAD}" ` +
      `stroke-width="1.5" stroke-dasharray="4 3"/></svg>cap</span><span>${sw(BAD)}over the cap</span>`);
  }
  items.push('<span><i class="idle"></i>idle</span><span class="note">numbers: micro-batch</span>');
  return items.join("");
}

function layout(results, width) {
  const p = Math.max(...results.map((r) => r.ranks));
  const row = Math.max(8, Math.min(24, Math.floor(380 / p)));
  const capped = results.some((r) => r.memory_cap);
  const mem = Math.max(5, Math.round(row * (capped ? 0.75 : 0.5))); // taller with a cap: the line must read
  const left = 58, right = 86;
  const span = Math.max(...results.map((r) => r.makespan)) || 1;
  const unit = results[0].unit === "t_f" ? "t_F units" : results[0].unit;
  // one memory scale for every schedule shown (and the cap), so the curves compare
  const top = Math.max(1e-9, ...results.flatMap((r) => [...r.peak_activations, ...(r.memory_cap || [])]));
  return { row, mem, left, right, width, x: (t) => left + (t / span) * (width - left - right), span, unit, top };
}

function chartSvg(results, width) {
  const L = layout(results, width);
  const parts = [];
  let y = 4;
  results.forEach((r, i) => { y = block(parts, r, i, y, L); });
  y = axis(parts, y, L);
  return `<svg xmlns="http://www.w3.org/2000/svg" id="timeline" width="${width}" height="${y}" ` +
    `viewBox="0 0 ${width} ${y}" font-family="system-ui, sans-serif" font-size="11">` +
    `<rect width="${width}" height="${y}" fill="#fff"/>${parts.join("")}</svg>`;
}

function block(parts, r, i, y, L) {
  const vtext = r.chunks > 1 ? ` v=${r.chunks}` : "";
  parts.push(`<text x="4" y="${y + 13}" font-weight="600" font-size="12">${esc(r.schedule)}</text>` +
    `<text x="${L.left + 80}" y="${y + 13}" fill="#555">p=${r.ranks} m=${r.microbatches}${vtext} \u00b7 ` +
    `makespan ${num(r.makespan)} \u00b7 bubble ${pct(r.bubble_fraction)} (closed form ` +
    `${pct(r.formula_bubble_fraction)})${capText(r)}</text>`);
  y += 20;
  parts.push(`<rect x="${L.left}" y="${y}" width="${L.x(r.makespan) - L.left}" height="${r.ranks * L.row}" ` +
    `fill="#fff" stroke="#ccc"/>`);
  r.ops.forEach((ops, rank) => {
    const ry = y + rank * L.row;
    parts.push(`<text x="${L.left - 6}" y="${ry + L.row / 2 + 4}" text-anchor="end" fill="#333">rank ${rank}</text>`);
    ops.forEach((op, k) => parts.push(cell(op, r, L.x(op[4]), ry, L.x(op[5]), L.row, `${i},${rank},${k}`)));
  });
  y += r.ranks * L.row + 6;
  parts.push(`<text x="${L.left - 6}" y="${y + 9}" text-anchor="end" fill="#777">memory</text>`);
  r.memory.forEach((steps, rank) => {
    const my = y + rank * L.mem;
    const cap = r.memory_cap ? r.memory_cap[rank] : null;
    const over = overCap(r, rank);
    parts.push(memoryPath(steps, my, L, cap, r.makespan, `over-${i}-${rank}`) +
      `<text x="${L.width - L.right + 6}" y="${my + L.mem - 1}" fill="${over ? BAD : "#555"}" ` +
      `font-size="${Math.min(10, L.mem + 2)}"${over ? ' font-weight="600" class="over"' : ""}>` +
      `${rank === 0 ? "peak " : ""}${num(r.peak_activations[rank])}${over ? " > cap" : ""}</text>`);
  });
  return y + r.ranks * L.mem + 14;
}

function cell(op, r, x0, y, x1, h, key) {
  const [, kind, chunk, mb, , , bkind, bchunk] = op;
  const w = Math.max(0.5, x1 - x0 - 0.6);
  const xs = `x="${x0.toFixed(2)}" width="${w.toFixed(2)}"`;
  let out, fill;
  if (kind === "F&B") { // forward over backward in one cell, as the SVG renderer draws a pair
    fill = r.colours.F[chunk];
    const half = (h - 2) / 2;
    out = `<g data-k="${key}"><rect ${xs} y="${y + 1}" height="${half}" fill="${fill}"/>` +
      `<rect ${xs} y="${y + 1 + half}" height="${half}" fill="${r.colours[bkind][bchunk]}"/></g>`;
  } else {
    fill = r.colours[kind][chunk];
    out = `<rect data-k="${key}" ${xs} y="${y + 1}" height="${h - 2}" fill="${fill}"/>`;
  }
  const size = Math.min(11, h - 5);
  if (size >= 7 && w >= String(mb).length * size * 0.62 + 3) {
    out += `<text x="${(x0 + w / 2).toFixed(2)}" y="${y + h / 2 + size * 0.36}" text-anchor="middle" ` +
      `fill="${r.ink[fill]}" font-size="${size}" pointer-events="none">${mb}</text>`;
  }
  return out;
}

function capText(r) {
  if (!r.memory_cap) return "";
  const peak = Math.max(...r.peak_activations), cap = Math.max(...r.memory_cap);
  return ` \u00b7 peak ${num(peak)} ${r.within_cap ? "within" : "over"} cap ${num(cap)}`;
}

function memoryPath(steps, y, L, cap, end, clip) {
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
  let out = `<rect x="${L.left}" y="${y}" width="${L.x(end) - L.left}" height="${h}" fill="#f4f4f4"/>` +
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

function axis(parts, y, L) {
  const step = niceStep(L.span / 8);
  parts.push(`<line x1="${L.left}" x2="${L.x(L.span)}" y1="${y}" y2="${y}" stroke="#999"/>`);
  for (let t = 0; t <= L.span + 1e-9; t += step) {
    parts.push(`<line x1="${L.x(t)}" x2="${L.x(t)}" y1="${y}" y2="${y + 4}" stroke="#999"/>` +
      `<text x="${L.x(t)}" y="${y + 15}" text-anchor="middle" fill="#555">${num(t)}</text>`);
  }
  parts.push(`<text x="${L.x(L.span)}" y="${y + 28}" text-anchor="end" fill="#555">time (${esc(L.unit)})</text>`);
  return y + 34;
}

function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(raw || 1));
  return [1, 2, 5, 10].map((k) => k * p).find((s) => s >= raw);
}

// ---- hover ---------------------------------------------------------------------------

function hover(ev) {
  const el = ev.target.closest("[data-k]");
  const tip = $("tip");
  if (!el || !shown) { tip.hidden = true; return; }
  const [i, rank, k] = el.dataset.k.split(",").map(Number);
  const [text, kind, , , start, end] = shown[i].ops[rank][k];
  tip.innerHTML = `<b>${esc(text)}</b> ${KIND_NAMES[kind]}<br>rank ${rank} \u00b7 start ${num(start)} \u00b7 ` +
    `end ${num(end)} \u00b7 ${num(end - start)} long`;
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
  return `${shown.map((r) => r.schedule).join("-")}-p${shown[0].ranks}-m${shown[0].microbatches}`;
}

function svgText() {
  return new XMLSerializer().serializeToString($("timeline"));
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
  $("summary").addEventListener("click", (ev) => {
    const a = ev.target.closest("[data-dl]");
    if (!a) return;
    ev.preventDefault();
    downloadFile(a.dataset.dl, Number(a.dataset.i));
  });
  let width = $("charts").clientWidth;
  window.addEventListener("resize", () => {
    if (shown && Math.abs($("charts").clientWidth - width) > 20) {
      width = $("charts").clientWidth;
      draw(shown);
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
  update();
}

start();
