// The workshop page: controls -> /api/simulate -> one SVG of every timeline, to scale.
// The server simulates and explains (the same code as the CLI); these files only draw what it returns.
// This file: state, the address, requests and the modes' hooks; draw.js draws, and play.js, why.js, build.js,
// teach.js (with lessons.js) add the modes (all loaded before this one, which starts the page).
"use strict";

const FIELDS = ["p", "m", "v", "tf", "tb", "ti", "tw", "tfb", "a2a", "latency", "skew", "per", "free_at_i", "cap", "fsdp",
  "bandwidth", "slices"];
const MODES = ["view", "play", "why", "build", "teach"];
const ZOOMS = [1, 2, 4, 8];
const PLACES = ["mode", "t", "gap", "zoom", "lesson"]; // the page's own state in the address, besides the settings
const DEBOUNCE_MS = 120;

const $ = (id) => document.getElementById(id);
let info = null;        // /api/families
let seq = 0;            // request counter: only the latest answer is drawn
let timer = null;
let shown = null;       // the results on screen, for hover, the modes and downloads
let shownQuery = "";
let notices = [];       // [field, message] to show once, after the first answer: what the address asked that the page cannot do
const page = { mode: "view", t: null, gap: null, zoom: 1, lesson: null }; // page state kept in the URL

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
  if (page.mode === "teach" && page.lesson) q.set("lesson", page.lesson);
  if (page.zoom !== 1) q.set("zoom", page.zoom);
  return q.toString();
}

function saveUrl() {
  const q = pageQuery(toQuery(readControls()));
  history.replaceState(null, "", q ? `?${q}` : location.pathname);
}

function writeControls(params) {
  // every setting the address gives goes into its control, as given: the server checks it and a bad one is
  // shown at its control; what no control can hold (a name the page does not know) is reported, not dropped
  const d = info.defaults;
  notices = [];
  let wanted = (params.get("schedules") || d.schedules.join(",")).split(",").filter(Boolean);
  const have = new Set(info.families.map((f) => f.name));
  const missing = wanted.filter((n) => !have.has(n));
  if (missing.length === wanted.length) wanted = d.schedules;
  for (const box of document.querySelectorAll("#families input")) box.checked = wanted.includes(box.value);
  if (missing.length) notices.push(["schedules", `the link names ${missing.join(", ")}, not in this version of stagewise`]);
  for (const f of FIELDS) {
    const val = params.get(f) ?? (d[f] === null ? "" : String(d[f]));
    $(f).value = val;
    if (params.has(f) && $(f).value !== val) { // a select (per) holds only its options
      const takes = $(f).tagName === "SELECT" ? [...$(f).options].map((o) => o.value).join(" or ") : "a number";
      notices.push([f, `the address gives ${f}=${val}; this control takes ${takes}; the default is used`]);
      $(f).value = String(d[f]);
    }
    syncRange(f);
  }
  syncCapUnit();
  const known = new Set(["schedules", ...FIELDS, ...PLACES]);
  const unknown = [...params.keys()].filter((k) => !known.has(k));
  if (unknown.length) {
    notices.push(["address", `the address names ${unknown.map((k) => `"${k}"`).join(", ")}, which the page does not ` +
      `know (settings: schedules, ${FIELDS.join(", ")}; places: ${PLACES.join(", ")}); ignored`]);
  }
  readPlaces(params);
}

function readPlaces(params) { // mode, t, gap, zoom, lesson: a value the page cannot use is reported
  const bad = (key, rule) => notices.push(["address", `the address gives ${key}=${params.get(key)}; ${rule}; ignored`]);
  const mode = params.get("mode");
  page.mode = MODES.includes(mode) ? mode : "view";
  if (mode !== null && !MODES.includes(mode)) bad("mode", `the modes are ${MODES.join(", ")}`);
  const t = params.has("t") ? Number(params.get("t")) : null;
  page.t = t !== null && isFinite(t) && t >= 0 ? t : null;
  if (t !== null && page.t === null) bad("t", "the time must be a number >= 0");
  const gap = (params.get("gap") || "").split(",").map(Number);
  page.gap = gap.length === 3 && gap.every(Number.isInteger) ? gap : null;
  if (params.has("gap") && !page.gap) bad("gap", "a gap is chart,rank,position (three whole numbers)");
  const zoom = params.has("zoom") ? Number(params.get("zoom")) : 1;
  page.zoom = ZOOMS.includes(zoom) ? zoom : 1;
  if (!ZOOMS.includes(zoom)) bad("zoom", `the zoom is one of ${ZOOMS.join(", ")}`);
  $("zoom").value = String(page.zoom);
  page.lesson = params.get("lesson");
}

function syncCapUnit() { // the cap is in the unit of the peak column, which `per` sets
  $("cap-unit").textContent = $("per").value === "stage" ? "micro-batches of one stage" : "micro-batches of a rank's share";
}

function syncRange(f) {
  const r = $(`${f}-range`);
  if (r && $(f).value !== "") r.value = $(f).value;
}

function applySettings(settings) { // a lesson's starting point: these settings, every other control at its default
  const d = info.defaults;
  const names = settings.schedules ? settings.schedules.split(",") : d.schedules;
  for (const box of document.querySelectorAll("#families input")) box.checked = names.includes(box.value);
  for (const f of FIELDS) { $(f).value = f in settings ? String(settings[f]) : d[f] === null ? "" : String(d[f]); syncRange(f); }
  syncCapUnit();
  schedule();
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
  for (const [field, message] of notices) showError(field, message);
  notices = [];
  if (!resp.ok) {
    showError(data.field, data.error);
    $("view").classList.add("stale");
    setStatus("settings not valid: see the message next to the control", true);
    return;
  }
  const t1 = performance.now();
  if (shown && query !== shownQuery) Modes.settingsChanged(); // not on the first answer: the address chose the place
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
  slot.textContent = slot.textContent ? `${slot.textContent}; ${message}` : message;
  if (field === "address") return;
  const input = $(field) || $("f-schedules");
  input.classList.add("invalid");
}

// ---- drawing (draw.js) -----------------------------------------------------------------

function redraw() {
  const results = Modes.results(shown); // what the mode draws: the view's results, or the edited schedule
  $("tip").hidden = true; // it described what was under the pointer before
  $("summary").innerHTML = summaryHtml(results, new URLSearchParams(shownQuery).get("per") === "stage");
  $("legend").innerHTML = legendHtml(results, Modes.legend(results));
  const width = Math.max(560, $("charts").clientWidth - 2) * page.zoom;
  $("charts").innerHTML = chartSvg(results, width, Math.max(...results.map((r) => Modes.span(r))) || 1);
  Modes.drawn(results);
  $("view").dataset.redrawn = Number($("view").dataset.redrawn || 0) + 1; // every picture, an answer's or a mode's
}

// ---- hover ---------------------------------------------------------------------------

function hover(ev) {
  const tip = $("tip");
  const el = ev.target.closest("[data-k], [data-l], .gap");
  if (!el || !shown || Modes.dragging()) { tip.hidden = true; return; }
  const results = Modes.results(shown);
  let html;
  if (el.classList.contains("gap")) {
    const [i, j] = el.dataset.g.split(",").map(Number);
    const [rank, a, b, , cause] = results[i].gaps[j];
    html = `<b>idle</b> rank ${rank} \u00b7 ${num(a)}..${num(b)} (${num(b - a)}) \u00b7 <b>${esc(cause)}</b>: ` +
      `${esc(info.style.causes[cause].label)}<br>click: what it waits for, and why`;
  } else if (el.dataset.l) { // a lane's transfer
    const [i, j, rank, k] = el.dataset.l.split(",").map(Number);
    const lane = results[i].lanes[j];
    const [a, b, waited, text] = lane.rows[rank][k];
    html = `<b>${esc(text)}</b><br>rank ${rank} \u00b7 ${num(a)}..${num(b)} \u00b7 ` +
      (waited > 0 ? `the rank waited ${num(+waited.toFixed(4))} for it` : "hidden behind compute");
  } else {
    const [i, rank, k] = el.dataset.k.split(",").map(Number);
    const [text, kind, , mb, start, end] = opAt(results[i], rank, k);
    html = `<b>${esc(text)}</b> ${KIND_NAMES[kind]} \u00b7 micro-batch ${mb}<br>rank ${rank} \u00b7 start ${num(start)} ` +
      `\u00b7 end ${num(end)} \u00b7 ${num(end - start)} long` + Modes.tip(results[i], i, rank, k);
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
  for (const g of [...styledCopy($("layers")).children]) svg.append(g); // a copy: append moves each out
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
  $("legend").innerHTML = legendHtml(results, Modes.legend(results));
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
  $("zoom").addEventListener("change", () => {
    page.zoom = Number($("zoom").value) || 1;
    saveUrl();
    if (shown) redraw();
  });
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
  // the page's colours are render.palette's, as CSS variables (the stylesheet has none of its own)
  for (const [name, colour] of Object.entries(info.style.page)) document.documentElement.style.setProperty(`--${name}`, colour);
  buildFamilies();
  writeControls(new URLSearchParams(location.search));
  bind();
  syncModeTabs();
  Modes.call("enter");
  update();
}

start();
