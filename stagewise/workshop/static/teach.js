// Teach: a short lesson next to the picture, with this page's own numbers (the view's first schedule, and
// the families that each change one thing, simulated at the same settings by /api/teach). Every term lights
// up the place on the picture it names; a family's name adds it to the view. Loaded before app.js.
"use strict";

const Teach = {
  data: null, // /api/teach for `key`
  key: null,
  pinned: null,

  async arrive() {
    if (this.key === shownQuery && this.data) return;
    const resp = await fetch(`/api/teach?${shownQuery}`);
    this.data = resp.ok ? await resp.json() : null;
    this.key = shownQuery;
  },

  leave() { this.pinned = null; $("panel-teach").innerHTML = ""; },

  drawn(results) {
    $("panel-teach").innerHTML = this.data ? this.html(results[0]) : "<p>The lesson's numbers could not be simulated.</p>";
    if (this.pinned) light(this.pinned);
  },

  bind() {
    const panel = $("panel-teach");
    panel.addEventListener("mouseover", (ev) => { const t = ev.target.closest("[data-term]"); if (t) light(t.dataset.term); });
    panel.addEventListener("mouseout", (ev) => { if (ev.target.closest("[data-term]")) light(this.pinned); });
    panel.addEventListener("click", (ev) => {
      const t = ev.target.closest("[data-term], [data-add], [data-go]");
      if (!t) return;
      ev.preventDefault();
      if (t.dataset.add) return addFamily(t.dataset.add);
      if (t.dataset.go) return setMode(t.dataset.go);
      this.pinned = this.pinned === t.dataset.term ? null : t.dataset.term;
      light(this.pinned);
    });
  },

  html(r) {
    const rows = Object.fromEntries(this.data.rows.map((x) => [x.schedule, x]));
    const term = (key, text) => `<a href="#" class="term" data-term="${key}">${text}</a>`;
    const fam = (name, text = name) => `<a href="#" class="fam" data-add="${name}" title="add ${name} to the view">${text}</a>`;
    const p = r.ranks, m = r.microbatches, mk = r.makespan;
    const busy = r.busy.reduce((a, b) => a + b, 0), idle = r.idle.reduce((a, b) => a + b, 0);
    const lo = Math.min(...r.busy), hi = Math.max(...r.busy);
    const busyText = lo === hi ? num(+lo.toFixed(4)) : `${num(+lo.toFixed(4))} to ${num(+hi.toFixed(4))}`;
    const kinds = r.ops.flat().some((op) => op[1] === "I") ? `${term("kind:F", "forwards")}, ` +
      `${term("kind:I", "input-grad")} and ${term("kind:W", "weight-grad")} backwards` :
      `${term("kind:F", "forwards")} and ${term("kind:B", "backwards")}`;
    const out = [];
    out.push("<h3>The bubble</h3>" +
      `<p>Each of the ${term("ranks", `p = ${p} ranks`)} is busy ${busyText} of the ${term("axis", `makespan ${num(mk)}`)}` +
      ` running its ${kinds} for m = ${m} micro-batches. The rest is ${term("gaps", "idle")}: ` +
      `${p} \u00d7 ${num(mk)} \u2212 ${num(+busy.toFixed(4))} = ${num(+idle.toFixed(4))}. ` +
      `The bubble is idle / (p \u00d7 makespan) = ${num(+idle.toFixed(4))} / ${num(+(p * mk).toFixed(4))} = ` +
      `<b>${pct(r.bubble_fraction)}</b>.</p>`);
    out.push("<h3>Why the ranks wait</h3>" + `<p>${this.causes(r, term)} Open ` +
      '<a href="#" data-go="why">Why it waits</a> and click a gap for its chain of waits.</p>');
    out.push(`<h3>The formula</h3><p>${this.formula(r, rows)}</p>`);
    const gp = rows.gpipe, ob = rows["1f1b"];
    if (gp && ob && !gp.error && !ob.error) {
      const peak = (x) => Math.max(...x.peak_activations);
      out.push("<h3>Memory: GPipe vs 1F1B</h3>" +
        `<p>${fam("gpipe", "GPipe")} runs every forward before any backward, so a rank keeps all m = ${m} ` +
        `micro-batches' activations: peak ${num(peak(gp))}. ${fam("1f1b", "1F1B")} starts a backward as soon as one ` +
        `is ready and then alternates, so rank 0 keeps at most p = ${p} and the last rank one: peaks ` +
        `${ob.peak_activations.map(num).join(" ")}. The same bubble (${pct(gp.bubble_fraction)} and ` +
        `${pct(ob.bubble_fraction)}) for ${num(+(peak(gp) / peak(ob)).toFixed(2))}\u00d7 less ` +
        `${term("memory", "memory")}.</p>`);
    }
    out.push(`<h3>What the others change</h3><ul>${this.others(rows, term, fam)}</ul>`);
    return out.join("");
  },

  causes(r, term) {
    const by = r.idle_by_cause || {};
    const say = {
      fill: "a rank waits for the first micro-batch to reach it, or for its gradient to come back",
      drain: "a rank with no forward left waits for the last backwards",
      "slow stage": "a slower stage sets the pace of its neighbours",
      link: "messages are in flight between ranks",
      order: "the rank it waits on is busy with work its program runs first",
    };
    const parts = Object.keys(say).filter((c) => by[c] > 1e-9)
      .map((c) => `${term(`gaps:${c}`, `${c} ${num(+by[c].toFixed(4))}`)} (${say[c]})`);
    if (!parts.length) return "No rank is ever idle.";
    return `Of the idle time: ${parts.join("; ")}.`;
  },

  formula(r, rows) {
    const own = rows[r.schedule];
    const f = own && own.formula;
    if (f) {
      const same = Math.abs(f.value - r.bubble_fraction) < 1e-9;
      return `For ${esc(r.schedule)}: bubble = ${esc(f.form)} = ${esc(f.numbers)} = <b>${pct(f.value)}</b>` +
        (same ? ", the simulated bubble exactly." : `; the simulation gives ${pct(r.bubble_fraction)}.`) +
        " The fill and drain stay p\u22121 steps long while the work grows with m: more micro-batches, less bubble.";
    }
    const ob = rows["1f1b"];
    const base = ob && ob.formula ? ` For comparison, 1F1B at these p and m: ${esc(ob.formula.form)} = ` +
      `${esc(ob.formula.numbers)} = ${pct(ob.formula.value)}.` : "";
    return `${esc(r.schedule)} has no closed form at these settings (uneven stages, links, or none for a shared ` +
      `step end), so the page's number is the simulation's: ${pct(r.bubble_fraction)}.${base}`;
  },

  others(rows, term, fam) {
    const out = [];
    const bad = (x) => !x || x.error;
    const il = rows["interleaved-1f1b"], h1 = rows["zb-h1"], zv = rows["zb-v"], dp = rows["dualpipe-v"];
    if (!bad(il)) {
      out.push(`<li>${fam("interleaved-1f1b", "Interleaving")}: each rank holds v = ${il.chunks} chunks, so the ` +
        `pipeline fills in chunk steps, 1/v as long: ${pct(il.bubble_fraction)}` +
        (il.formula ? ` (${esc(il.formula.form)} = ${esc(il.formula.numbers)})` : "") + ", for v\u00d7 the messages.</li>");
    } else if (il) out.push(`<li>${fam("interleaved-1f1b", "Interleaving")}: ${esc(il.error)}.</li>`);
    if (!bad(h1)) {
      out.push(`<li>${fam("zb-h1", "Zero bubble")} splits each backward into ${term("kind:I", "I")} (the input ` +
        `gradient the previous rank waits for) and ${term("kind:W", "W")} (the weight gradient, which can wait): W ` +
        `fills the drain: ${pct(h1.bubble_fraction)} with 1F1B's memory (peak ${num(Math.max(...h1.peak_activations))})` +
        (!bad(zv) ? `; ${fam("zb-v")} puts two chunks per rank in a V: ${pct(zv.bubble_fraction)}` : "") + ".</li>");
    }
    if (!bad(dp)) {
      out.push(`<li>${fam("dualpipe-v", "DualPipe")} feeds micro-batches from both ends and overlaps one's ` +
        `forward with another's backward (F&amp;B pairs): dualpipe-v ${pct(dp.bubble_fraction)}, peak ` +
        `${num(Math.max(...dp.peak_activations))}.</li>`);
    } else if (dp) out.push(`<li>${fam("dualpipe-v", "DualPipe")}: ${esc(dp.error)}.</li>`);
    return out.join("");
  },
};

function light(termKey) { // the place on the picture a term names, in the first chart
  const svg = $("timeline");
  if (!svg) return;
  for (const el of svg.querySelectorAll(".hl")) el.classList.remove("hl");
  svg.classList.toggle("hl-any", !!termKey);
  if (!termKey) return;
  const [what, arg] = termKey.split(":");
  if (what === "kind") { // a kind's cells of the first chart, found from the data (cells carry no class)
    const r = Modes.results(shown)[0];
    for (const el of svg.querySelectorAll('[data-k^="0,"]')) {
      const [, rank, k] = el.dataset.k.split(",").map(Number);
      if (opAt(r, rank, k)[1] === arg) el.classList.add("hl");
    }
    return;
  }
  const sel = {
    gaps: `.gaps[data-i="0"] .gap${arg ? `[data-cause="${arg}"]` : ""}`,
    ranks: '.rank-label, [data-k^="0,"]',
    memory: ".strip",
    axis: ".axis",
  }[what];
  if (!sel) return;
  const els = svg.querySelectorAll(sel);
  for (const el of what === "axis" ? [...els].slice(0, 1) : els) el.classList.add("hl");
}

function addFamily(name) {
  const box = document.querySelector(`#families input[value="${name}"]`);
  if (!box || box.checked) return;
  box.checked = true;
  schedule();
}
