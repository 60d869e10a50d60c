// Build your own: drag an op along its rank's row (or edit the programs as text, one line per rank, every line
// shown) and the server checks and simulates the new order at once (/api/edit). An order that cannot run shows
// the loop in plain words and the validator's message (positions counted from 1), what ran before the ranks
// stopped, the ops they never reached (pale, dashed) and the wait cycle in red, its arrows bent apart.
// Loaded before app.js, which registers it.
"use strict";

const EDIT_DEBOUNCE_MS = 250;

const Build = {
  programs: null, // per rank, the op texts in program order: what is being edited
  base: null,     // the family and settings it started from
  answer: null,   // the server's answer for `programs`
  drag: null,
  dropped: -1e9,
  timer: null,

  settingsChanged() { this.programs = null; this.answer = null; },
  enter() { $("why-detail").hidden = true; },
  leave() { $("why-detail").hidden = true; },

  text() { return this.programs ? this.programs.map((row) => row.join(" ")).join("\n") : ""; },

  async arrive(results) {
    const base = `${shownQuery}|${results[0].schedule}`;
    if (!this.programs || this.base !== base) { // start from the family's own order
      this.base = base;
      this.programs = results[0].ops.map((row) => row.map((op) => op[0]));
      $("programs").value = this.text();
    }
    $("programs").rows = Math.max(2, Math.min(64, this.programs.length)) + 1; // every rank's line, and the scroll bar
    await this.send();
  },

  async send() {
    const [resp, data] = await post("/api/edit", { ...readControls(), programs: $("programs").value });
    if (!resp.ok) { // a setting (shown at its control) or the request itself (too long: shown here)
      if (data.field && data.field !== "programs" && $(data.field)) showError(data.field, data.error);
      else $("err-programs").textContent = data.error;
      return;
    }
    this.answer = data;
    if (data.valid) this.programs = data.results[0].ops.map((row) => row.map((op) => op[0]));
    else if (data.drawing) this.programs = data.drawing.ops.map((row, r) => [...row, ...data.drawing.pending[r]].map((op) => op[0]));
    $("err-programs").innerHTML = data.valid ? "" : (data.plain ? `<span class="plain">${esc(data.plain)}</span><br>` : "") +
      `<span class="exact">${esc(data.error)}</span>`;
    $("programs").classList.toggle("invalid", !data.valid);
    this.summary();
  },

  summary() {
    const was = shown[0], a = this.answer;
    const edited = a && a.valid ? a.results[0] : null;
    $("build-bubble").innerHTML = a && a.untouched
      ? `your order is ${esc(was.schedule)}'s own: bubble <b class="bubble">${pct(edited.bubble_fraction)}</b>, ` +
        `makespan ${num(edited.makespan)}; drag an op to change it`
      : edited
        ? `bubble ${pct(was.bubble_fraction)} (${esc(was.schedule)}) \u2192 <b class="bubble">` +
          `${pct(edited.bubble_fraction)}</b> (your order), makespan ${num(was.makespan)} \u2192 ${num(edited.makespan)}`
        : `bubble ${pct(was.bubble_fraction)} (${esc(was.schedule)}) \u2192 <b class="bubble bad">does not run</b>`;
    $("dl-edited").disabled = !edited;
  },

  results(results) {
    const a = this.answer;
    if (!a) return [results[0]];
    if (a.valid) return [{ ...a.results[0], edited: true }];
    if (!a.drawing) return [results[0]]; // not even parsed: keep the last picture (stale)
    const d = a.drawing;
    const peaks = d.memory.map((steps) => Math.max(0, ...steps.map((s) => s[1])));
    const end = Math.max(0, ...d.ops.flat().map((op) => op[5]), ...d.pending.flat().map((op) => op[5]));
    return [{ ...d, schedule: `${results[0].schedule} (edited)`, ranks: d.ops.length, microbatches: results[0].microbatches,
      chunks: results[0].chunks, makespan: end, bubble_fraction: null, formula_bubble_fraction: null,
      peak_activations: peaks, memory_cap: null, parameter_copies: results[0].parameter_copies, gaps: [],
      edited: true, stuck: true }];
  },

  span(r) { return r.pending ? Math.max(r.makespan, ...r.pending.flat().map((op) => op[5])) : r.makespan; },

  rows(r, i, g) { // the ops a deadlock never reached, after what each rank ran
    if (!r.pending) return "";
    return r.pending.map((row, rank) => row.map((op, j) =>
      cell(op, r, L.x(op[4]), g.y + rank * L.step, L.x(op[5]), L.row, `${i},${rank},${r.ops[rank].length + j}`,
        "pending")).join("")).join("");
  },

  extraOp(r, rank, k) { return r.pending ? r.pending[rank][k - r.ops[rank].length] : undefined; },

  drawn(results) {
    const r = results[0], a = this.answer;
    if (!a || a.valid || !a.cycle) { overlay(0).innerHTML = ""; return; }
    const place = (rank, k) => { const op = opAt(r, rank, k); return [L.x(op[4]), L.x(op[5]), rowY(0, rank)]; };
    const parts = [];
    const blockedOn = new Map(a.cycle.map(([br, bk]) => [br, bk]));
    const mid = a.cycle.reduce((t, [br]) => t + br, 0) / a.cycle.length;
    for (const [br, bk, wr, wk] of a.cycle) { // the blocked op, and an arrow to the op it waits for
      const [x0, x1, y0] = place(br, bk);
      parts.push(`<rect class="stuck" x="${x0.toFixed(2)}" y="${y0 + 0.5}" width="${Math.max(2, x1 - x0).toFixed(2)}" ` +
        `height="${L.row - 1}"/>`);
      if (wr === null) continue;
      const [w0, w1, y1] = place(wr, wk);
      parts.push(`<rect class="awaited" x="${w0.toFixed(2)}" y="${y1 + 0.5}" width="${Math.max(2, w1 - w0).toFixed(2)}" ` +
        `height="${L.row - 1}"/>`);
      parts.push(arrow((x0 + x1) / 2, y0 + L.row / 2, (w0 + w1) / 2, y1 + L.row / 2, "head-x", "cycle", C.bad,
        br === wr ? -Math.max(12, L.row) : 0));
      // the loop closes through the waited-for rank's program: its awaited op comes only after its own blocked
      // op, drawn as a dashed arc from one to the other, bulging away from the loop's middle
      if (!blockedOn.has(wr) || blockedOn.get(wr) === wk) continue;
      const [b0, b1] = place(wr, blockedOn.get(wr));
      const up = wr < mid || (wr === mid && br > wr);
      const y = y1 + (up ? 1 : L.row - 1);
      parts.push(arrow((w0 + w1) / 2, y, (b0 + b1) / 2, y, "head-x", "cycle after", C.bad,
        (up ? 1 : -1) * Math.max(10, L.row * 0.8)));
    }
    overlay(0).innerHTML = parts.join("");
  },

  legend(results) {
    return causeLegend(usedCauses(results)) +
      `<span><svg width="22" height="12"><line x1="1" y1="6" x2="17" y2="6" stroke="${C.bad}" stroke-width="1.5"/>` +
      `<path d="M15,2L21,6L15,10z" fill="${C.bad}"/></svg>waits for</span>` +
      `<span><svg width="22" height="12"><line x1="1" y1="6" x2="17" y2="6" stroke="${C.bad}" stroke-width="1.3" ` +
      `stroke-dasharray="4 3"/><path d="M15,2L21,6L15,10z" fill="${C.bad}"/></svg>comes only after, in the rank's ` +
      "program (round the loop: a deadlock)</span>" +
      '<span class="note">drag an op along its row to move it in its rank\'s program</span>';
  },

  // the click a browser sends after a drag's release is part of the drag
  dragging() { return !!(this.drag && this.drag.moved) || performance.now() - this.dropped < 300; },

  bind() {
    $("programs").addEventListener("input", () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.edited(), EDIT_DEBOUNCE_MS);
    });
    $("reset-build").addEventListener("click", () => { this.programs = null; this.answer = null; update(); });
    $("dl-edited").addEventListener("click", () => this.download());
    const charts = $("charts");
    charts.addEventListener("pointerdown", (ev) => this.down(ev));
    charts.addEventListener("pointermove", (ev) => this.move(ev));
    charts.addEventListener("pointerup", (ev) => this.up(ev));
    charts.addEventListener("pointercancel", () => { this.drag = null; });
  },

  async edited() { // the text changed: check and simulate it, then redraw
    await this.send();
    redraw();
  },

  svgX(ev) { return ev.clientX - $("timeline").getBoundingClientRect().left; },

  down(ev) {
    if (page.mode !== "build") return;
    const el = ev.target.closest("[data-k]");
    if (!el) return;
    const [, rank, k] = el.dataset.k.split(",").map(Number);
    this.drag = { el, rank, k, x: this.svgX(ev), moved: false };
    ev.preventDefault();
  },

  move(ev) {
    const d = this.drag;
    if (!d) return;
    const dx = this.svgX(ev) - d.x;
    if (Math.abs(dx) > 3) d.moved = true;
    d.el.setAttribute("transform", `translate(${dx.toFixed(1)},0)`);
    d.el.classList.add("dragged");
  },

  async up(ev) {
    const d = this.drag;
    if (!d) return;
    this.drag = null;
    d.el.removeAttribute("transform");
    d.el.classList.remove("dragged");
    if (!d.moved) return;
    this.dropped = performance.now();
    const r = Modes.results(shown)[0];
    const op = opAt(r, d.rank, d.k);
    const t = L.t(L.x((op[4] + op[5]) / 2) + this.svgX(ev) - d.x); // where the op's middle was dropped
    const row = this.programs[d.rank];
    const others = row.map((_, k) => k).filter((k) => k !== d.k);
    const to = others.filter((k) => { const o = opAt(r, d.rank, k); return (o[4] + o[5]) / 2 < t; }).length;
    if (to === d.k) return;
    const [moved] = row.splice(d.k, 1);
    row.splice(to, 0, moved);
    $("programs").value = this.text();
    await this.edited();
  },

  download() {
    const a = this.answer;
    if (!a || !a.valid) return;
    const r = a.results[0];
    save(new Blob([a.csv], { type: "text/csv" }), `${r.schedule.replace(/ \(edited\)$/, "")}-edited-p${r.ranks}-m${r.microbatches}.csv`);
  },
};
