// Play: a cursor moves through the step; what lies ahead is pale, so cells fill as they run (the op each rank
// is running stays whole, outlined, its number readable); an arrow shows each activation and gradient crossing
// ranks as it is sent (straight down or up when the link takes no time); the memory strips follow the cursor;
// the counters give the bubble so far next to the closed form. Loaded before app.js, which registers it.
"use strict";

const PLAY_SECONDS = 10; // the whole step at speed 1

const Play = {
  playing: false,
  raf: null,
  last: 0,
  times: [],  // every op's start and end, for the step buttons
  sent: [],   // per result: its messages sorted by send time, with those times

  enter() { if (page.t === null) page.t = 0; },
  leave() { this.pause(); },

  async arrive(results) { // the messages, when the answer came without them (the page was in another mode)
    if (results.every((r) => r.messages)) return;
    const resp = await fetch(`/api/messages?${shownQuery}`);
    if (!resp.ok) return;
    const got = await resp.json();
    got.results.forEach((x, i) => { if (results[i] && results[i].schedule === x.schedule) results[i].messages = x.messages; });
  },

  bind() {
    $("play").addEventListener("click", () => (this.playing ? this.pause() : this.play()));
    $("step-back").addEventListener("click", () => this.step(-1));
    $("step").addEventListener("click", () => this.step(1));
    $("t-range").addEventListener("input", (ev) => { this.pause(); this.seek(Number(ev.target.value)); saveUrl(); });
    $("speed").addEventListener("change", () => {});
  },

  drawn(results) {
    const span = L.span;
    page.t = Math.min(Math.max(0, page.t ?? 0), span);
    $("t-range").max = span;
    $("t-range").step = span / 1000;
    this.times = [...new Set(results.flatMap((r) => r.ops.flat().flatMap((op) => [op[4], op[5]])))].sort((a, b) => a - b);
    this.sent = results.map((r) => {
      const ms = (r.messages || []).map((msg) => [r.ops[msg[0]][msg[1]][5], msg]).sort((a, b) => a[0] - b[0]);
      let hold = span / 20;
      for (const row of r.ops) for (const op of row) if (op[5] > op[4] && op[5] - op[4] < hold) hold = op[5] - op[4];
      let flight = 0;
      for (const [t, msg] of ms) flight = Math.max(flight, msg[4] - t);
      return { times: ms.map((x) => x[0]), msgs: ms.map((x) => x[1]), hold, flight };
    });
    // per rank: op starts and the busy time before each op, so a frame costs ranks x log(ops)
    this.busy = results.map((r) => r.ops.map((row) => {
      const starts = row.map((op) => op[4]), before = [0];
      for (const op of row) before.push(before[before.length - 1] + op[5] - op[4]);
      return { starts, before, row };
    }));
    this.memTimes = results.map((r) => r.memory.map((steps) => steps.map((x) => x[0])));
    results.forEach((r, i) => {
      const g = geo[i], right = L.x(Modes.span(r));
      const rows = r.ops.map((_, rank) =>
        `<rect class="ahead" data-rank="${rank}" x="0" y="${rowY(i, rank)}" width="0" height="${L.step}"/>`).join("");
      overlay(i).innerHTML = `<g class="masks">${rows}` +
        (r.stuck ? "" : `<rect class="ahead" x="0" y="${g.mem}" width="0" height="${r.ranks * L.mem}"/>`) + "</g>" +
        `<g class="running"></g><line class="cursor" x1="0" x2="0" y1="${g.y - 3}" y2="${g.end}" data-right="${right}"/>` +
        '<g class="arrows"></g><g class="levels"></g>';
    });
    $("play-counters").innerHTML = "<tr><th>schedule</th><th>busy so far</th><th>idle so far</th>" +
      "<th>bubble so far</th><th>of it fill</th><th>of it drain</th><th>at the end</th><th>closed form</th></tr>" +
      results.map((r, i) => `<tr data-i="${i}" data-schedule="${esc(r.schedule)}"><td>${esc(r.schedule)}</td>` +
        '<td class="busy"></td><td class="idle"></td><td class="sofar"></td><td class="fill"></td><td class="drain"></td>' +
        `<td>${pct(r.bubble_fraction)}</td><td>${pct(r.formula_bubble_fraction)}</td></tr>`).join("");
    this.seek(page.t);
  },

  seek(t) {
    page.t = Math.min(Math.max(0, t), L.span);
    const results = Modes.results(shown);
    $("t-range").value = page.t;
    $("t-now").textContent = `t = ${num(+page.t.toFixed(3))} of ${num(L.span)}`;
    results.forEach((r, i) => this.cursor(r, i, page.t));
  },

  cursor(r, i, t) {
    const layer = overlay(i);
    if (!layer) return;
    const x = L.x(Math.min(t, Modes.span(r)));
    const line = layer.querySelector(".cursor");
    const right = Number(line.dataset.right);
    line.setAttribute("x1", x.toFixed(2));
    line.setAttribute("x2", x.toFixed(2));
    line.dataset.t = t;
    const running = [];
    for (const mask of layer.querySelectorAll(".ahead")) { // what has not run yet is pale
      let from = x;
      if (mask.dataset.rank !== undefined) { // a rank's row: the op it runs now stays whole
        const rank = Number(mask.dataset.rank), row = this.busy[i][rank];
        const j = upperBound(row.starts, t) - 1;
        const op = j >= 0 ? row.row[j] : null;
        if (op && op[5] > t) {
          from = Math.max(x, L.x(op[5]));
          running.push(`<rect class="now" x="${L.x(op[4]).toFixed(2)}" y="${rowY(i, rank) + 0.5}" ` +
            `width="${Math.max(1, L.x(op[5]) - L.x(op[4]) - 0.6).toFixed(2)}" height="${L.row - 1}"/>`);
        }
      }
      mask.setAttribute("x", from.toFixed(2));
      mask.setAttribute("width", Math.max(0, right - from).toFixed(2));
    }
    layer.querySelector(".running").innerHTML = running.join("");
    layer.querySelector(".arrows").innerHTML = this.arrows(r, i, t);
    layer.querySelector(".levels").innerHTML = r.stuck ? "" : r.memory.map((steps, rank) => {
      const j = upperBound(this.memTimes[i][rank], t) - 1; // the last step at or before t
      const h = L.mem - 1, level = j >= 0 ? steps[j][1] : 0;
      return `<circle cx="${x.toFixed(2)}" cy="${(geo[i].mem + rank * L.mem + h - (level / L.top) * h).toFixed(2)}" ` +
        `r="${Math.max(2.5, Math.min(4, L.mem / 2.5)).toFixed(1)}" data-level="${level}"/>`;
    }).join("");
    this.count(r, i, t);
  },

  arrows(r, i, t) { // the messages sent up to t and not long arrived: dashed while in flight
    const s = this.sent[i];
    if (!s || !s.msgs.length) return "";
    const out = [];
    const from = lowerBound(s.times, t - s.hold - s.flight);
    for (let j = from; j < s.times.length && s.times[j] <= t; j++) {
      const [fr, fk, tr, , arrival, grad] = s.msgs[j];
      if (arrival + s.hold < t) continue;
      // row middle to row middle: a message that takes no time is a straight arrow a row long, drawn over the cursor
      const down = tr > fr;
      const y0 = rowY(i, fr) + L.row / 2, y1 = rowY(i, tr) + L.row / 2 + (down ? -2 : 2);
      // just inside the receiving op, off its outline and the cursor
      const x0 = L.x(r.ops[fr][fk][5]) + 3, x1 = Math.max(x0, L.x(arrival) + 3);
      const cls = `msg ${grad ? "gradient" : "activation"}${arrival > t ? " flying" : ""}`;
      out.push(arrow(x0, y0, x1, y1, grad ? "head-g" : "head-a", cls, grad ? info.style.kinds.B : info.style.kinds.F,
        null, true));
    }
    return out.join("");
  },

  count(r, i, t) { // busy and idle up to t, and the idle's causes so far
    let busy = 0;
    for (const { starts, before, row } of this.busy[i]) { // the ops begun by t: all of them but the last, whole
      const j = upperBound(starts, t) - 1;
      if (j >= 0) busy += before[j] + Math.min(t, row[j][5]) - row[j][4];
    }
    const upto = Math.min(t, r.makespan), total = r.ranks * upto, idle = Math.max(0, total - busy);
    const by = {};
    for (const [, a, b, , cause] of r.gaps || []) by[cause] = (by[cause] || 0) + Math.max(0, Math.min(b, t) - a);
    const end = r.idle_by_cause || {};
    const row = document.querySelector(`#play-counters tr[data-i="${i}"]`);
    if (!row) return;
    row.querySelector(".busy").textContent = num(+busy.toFixed(3));
    row.querySelector(".idle").textContent = `${num(+idle.toFixed(3))} of ${num(+total.toFixed(3))}`;
    row.querySelector(".sofar").textContent = total > 0 ? pct(idle / total) : "\u2014";
    row.querySelector(".fill").textContent = `${num(+(by.fill || 0).toFixed(3))} of ${num(end.fill || 0)}`;
    row.querySelector(".drain").textContent = `${num(+(by.drain || 0).toFixed(3))} of ${num(end.drain || 0)}`;
  },

  play() {
    if (page.t >= L.span - 1e-9) page.t = 0;
    this.playing = true;
    $("play").textContent = "\u25ae\u25ae pause";
    this.last = performance.now();
    const tick = (now) => {
      if (!this.playing) return;
      const speed = Number($("speed").value) || 1;
      this.seek(page.t + ((now - this.last) / 1000) * (L.span / PLAY_SECONDS) * speed);
      this.last = now;
      if (page.t >= L.span - 1e-9) { this.pause(); return; }
      this.raf = requestAnimationFrame(tick);
    };
    this.raf = requestAnimationFrame(tick);
  },

  pause() {
    if (this.raf) cancelAnimationFrame(this.raf);
    this.raf = null;
    if (this.playing) saveUrl();
    this.playing = false;
    $("play").textContent = "\u25b6 play";
  },

  step(dir) { // to the next (or previous) start or end of an op
    this.pause();
    const eps = 1e-9 * Math.max(1, L.span);
    const t = page.t;
    const next = dir > 0 ? this.times.find((x) => x > t + eps) : [...this.times].reverse().find((x) => x < t - eps);
    this.seek(next ?? (dir > 0 ? L.span : 0));
    saveUrl();
  },

  legend() {
    const a = (c) => `<svg width="22" height="12"><line x1="1" y1="6" x2="17" y2="6" stroke="${c}" stroke-width="1.5"/>` +
      `<path d="M15,2L21,6L15,10z" fill="${c}"/></svg>`;
    return `<span>${a(info.style.kinds.F)}activation sent</span><span>${a(info.style.kinds.B)}gradient sent</span>` +
      '<span class="note">dashed: in flight \u00b7 pale: not run yet</span>';
  },
};

function lowerBound(xs, x) {
  let lo = 0, hi = xs.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid + 1; else hi = mid; }
  return lo;
}

function upperBound(xs, x) { // the first index whose value is above x
  let lo = 0, hi = xs.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (xs[mid] <= x) lo = mid + 1; else hi = mid; }
  return lo;
}
