// Why it waits: every idle gap is hatched by its cause (a colour and a pattern each, in one legend); click one
// (or the late op after it) for what it waits for, in plain words first (stagewise.causes) and then the chain
// of waits in exact terms (stagewise.explain, as `stagewise explain` prints both), drawn on the timeline.
// Loaded before app.js, which registers it.
"use strict";

const Why = {
  detail: null, // the chosen gap's explanation: [key, gap dict]

  settingsChanged() { page.gap = null; this.detail = null; },

  bind() {
    $("charts").addEventListener("click", (ev) => {
      if (page.mode !== "why" && page.mode !== "build") return;
      if (Modes.dragging()) return;
      const results = Modes.results(shown);
      const gapEl = ev.target.closest(".gap");
      if (gapEl) {
        const [i, j] = gapEl.dataset.g.split(",").map(Number);
        const [rank, , , pos] = results[i].gaps[j];
        return this.choose([i, rank, pos]);
      }
      const opEl = ev.target.closest("[data-k]");
      if (!opEl || page.mode !== "why") return;
      const [i, rank, k] = opEl.dataset.k.split(",").map(Number);
      if (lateOp(results[i], rank, k)) this.choose([i, rank, k]); // a late op: the gap before it
      else this.show(null, `${opAt(results[i], rank, k)[0]} did not wait: it started as soon as rank ${rank} was ` +
        "free. Click an idle gap or an op that starts after one.");
    });
    $("why-detail").addEventListener("click", (ev) => {
      const a = ev.target.closest("a.ref");
      if (a) ev.preventDefault();
    });
  },

  legend(results) { return causeLegend(usedCauses(results)); },

  tip(r, i, rank, k) { return lateOp(r, rank, k) ? "<br>it waited: click for why" : ""; },

  drawn() {
    if (page.gap) this.choose(page.gap, false);
    else this.show(null, "Click an idle gap (hatched) or an op that starts after one: the page says what it " +
      "waits for and follows the waits back to the first cause.");
  },

  async choose(key, save = true) {
    page.gap = key;
    if (save) saveUrl();
    const [i, rank, pos] = key;
    const results = Modes.results(shown);
    const r = results[i];
    if (!r || !(r.gaps || []).some((g) => g[0] === rank && g[3] === pos)) { page.gap = null; return; }
    const same = this.detail && this.detail[0] === `${shownQuery}|${r.schedule}|${key}`;
    if (!same) {
      const body = { ...readControls(), rank, pos, schedule: r.schedule };
      if (r.edited) body.programs = Build.text();
      const [resp, data] = await post("/api/why", body);
      if (!resp.ok) { this.show(null, data.error); return; }
      this.detail = [`${shownQuery}|${r.schedule}|${key}`, data];
    }
    this.show(this.detail[1]);
    this.drawChain(i, this.detail[1]);
  },

  show(gap, message = "") {
    const box = $("why-detail");
    box.hidden = page.mode !== "why" && !(page.mode === "build" && gap);
    if (!gap) { box.innerHTML = `<p class="hint">${esc(message)}</p>`; return; }
    const ref = (x) => `<a href="#" class="ref" data-ref="${x.rank},${x.position}">${esc(x.op)}</a>`;
    const at = gap.text.indexOf(`: ${gap.cause}: `);
    const exact = at < 0 ? gap.text.split(": drain: ")[1] || gap.text : gap.text.slice(at + gap.cause.length + 4);
    // first the plain sentence; then, smaller, the chain and the exact terms (what `stagewise explain` prints)
    box.innerHTML =
      `<p class="why-plain">${causeSwatch(gap.cause)} <span>${esc(gap.plain)}.</span></p>` +
      `<p class="why-exact"><span class="why-head">rank ${gap.rank} idle ${num(gap.start)}..${num(gap.end)} ` +
      `(${num(gap.length)})</span> \u00b7 <b>${esc(gap.cause)}</b> (${esc(gap.label)}) \u00b7 ` +
      (gap.before
        ? `${ref(gap.before)} waits for ${ref(gap.waits_for)} (${esc(gap.chain[0].what)} from rank ` +
          `${gap.waits_for.rank})${gap.chain.length > 1 ? ` \u2190 ${gap.chain.slice(1).map(ref).join(" \u2190 ")}` : ""}: `
        : "") + `${esc(exact)}</p>`;
  },

  drawChain(i, gap) { // the gap, the op that waits, each wait as an arrow back along the chain, the first cause
    const layer = overlay(i);
    if (!layer) return;
    const r = Modes.results(shown)[i];
    const box = (ref, cls) => {
      const op = opAt(r, ref.rank, ref.position);
      const x0 = L.x(op[4]), y = rowY(i, ref.rank);
      return `<rect class="${cls}" x="${x0.toFixed(2)}" y="${y + 0.5}" width="${Math.max(1, L.x(op[5]) - x0).toFixed(2)}" ` +
        `height="${L.row - 1}"/>`;
    };
    const c = info.style.causes[gap.cause].colour;
    const y = rowY(i, gap.rank);
    const parts = [`<rect class="chosen-gap" x="${L.x(gap.start).toFixed(2)}" y="${y}" stroke="${c}" ` +
      `width="${Math.max(1, L.x(gap.end) - L.x(gap.start)).toFixed(2)}" height="${L.row}"/>`];
    if (gap.before) parts.push(box(gap.before, "waiter"));
    let at = gap.before;
    for (const step of gap.chain) {
      const a = opAt(r, step.rank, step.position), b = opAt(r, at.rank, at.position);
      parts.push(box(step, "link"));
      parts.push(arrow(L.x(a[5]), rowY(i, step.rank) + L.row / 2, L.x(b[4]) + 1, rowY(i, at.rank) + L.row / 2,
        "head-w", "wait", C.arrow));
      at = step;
    }
    if (gap.blocker) parts.push(box(gap.blocker, "blocker"));
    const first = gap.blocker || gap.origin; // where the chain starts: the step's first action, or a busy rank
    if (first) parts.push(this.label(i, r, first, gap));
    layer.innerHTML = parts.join("");
  },

  label(i, r, first, gap) {
    // the first cause's label, on the chart's own label row (over every rank, so it covers no cell), with a
    // leader down to the op on its rank
    const op = opAt(r, first.rank, first.position);
    const x = L.x(op[4]), note = geo[i].note;
    const text = gap.blocker ? `${gap.cause}: rank ${first.rank} busy with ${op[0]}`
      : gap.cause === "fill" ? `fill: the step starts here, rank ${first.rank}` : `${gap.cause}: rank ${first.rank}`;
    const colour = gap.blocker ? C.bad : info.style.causes[gap.cause].colour;
    const anchor = x > L.width - L.right - 200 ? "end" : "start";
    return `<line class="leader" x1="${x.toFixed(1)}" x2="${x.toFixed(1)}" y1="${note + 3}" ` +
      `y2="${rowY(i, first.rank)}" stroke="${colour}"/>` +
      `<text class="first-cause" x="${(x + (anchor === "end" ? -3 : 3)).toFixed(1)}" y="${note + 10}" ` +
      `text-anchor="${anchor}" fill="${colour}" data-rank="${first.rank}">${esc(text)}</text>`;
  },
};

function usedCauses(results) { return new Set(results.flatMap((r) => (r.gaps || []).map((g) => g[4]))); }

function lateOp(r, rank, k) { // the op after an idle gap of its rank
  return (r.gaps || []).some((g) => g[0] === rank && g[3] === k);
}
