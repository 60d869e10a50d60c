// The lessons' text, one function per lesson of stagewise.workshop.teach.LESSONS (same keys), written with the
// page's own numbers: the view on screen (c.r, c.by) and every taught family simulated at its p, m and costs
// (c.rows). c.term(key, text) links a word to the picture (teach.js' light); c.fam(name) adds a family.
// Loaded before teach.js and app.js.
"use strict";

const sum = (xs) => xs.reduce((a, b) => a + b, 0);
const n4 = (x) => num(+x.toFixed(4));

function causesText(c, r) { // the view's idle time by cause, each in plain words, each lighting its gaps
  const by = r.idle_by_cause || {};
  const parts = Object.entries(info.style.causes).filter(([cause]) => by[cause] > 1e-9)
    .map(([cause, x]) => `${c.term(`gaps:${cause}`, `${causeSwatch(cause, 16, 10)} ${cause} ${n4(by[cause])}`)}: ` +
      `${esc(x.meaning)}`);
  return parts.length ? `<ul class="causes">${parts.map((x) => `<li>${x}</li>`).join("")}</ul>` : "<p>No rank is ever idle.</p>";
}

function kindsText(c, r) {
  return r.ops.flat().some((op) => op[1] === "I")
    ? `${c.term("kind:F", "forwards")}, ${c.term("kind:I", "input-grad")} and ${c.term("kind:W", "weight-grad")} backwards`
    : `${c.term("kind:F", "forwards")} and ${c.term("kind:B", "backwards")}`;
}

const LESSONS = {
  bubble(c) {
    const { r, p, m } = c;
    const busy = sum(r.busy), idle = sum(r.idle), mk = r.makespan;
    const lo = Math.min(...r.busy), hi = Math.max(...r.busy);
    const busyText = lo === hi ? n4(lo) : `${n4(lo)} to ${n4(hi)}`;
    const f = c.rows[r.schedule] && c.rows[r.schedule].formula;
    return `<p>Each of the ${c.term("ranks", `p = ${p} ranks`)} of ${esc(r.schedule)} is busy ${busyText} of the ` +
      `${c.term("axis", `makespan ${num(mk)}`)}, running its ${kindsText(c, r)} for m = ${m} micro-batches. ` +
      `The rest is ${c.term("gaps", "idle")}: ${p} \u00d7 ${num(mk)} \u2212 ${n4(busy)} = ${n4(idle)}, and the ` +
      `<b>bubble</b> is idle / (p \u00d7 makespan) = ${n4(idle)} / ${n4(p * mk)} = <b>${pct(r.bubble_fraction)}</b>.</p>` +
      `<p>Why the ranks wait (open <a href="#" data-go="why">Why it waits</a> and click a gap for its chain):</p>` +
      causesText(c, r) +
      (f ? `<p>The papers' formula: bubble = ${esc(f.form)} = ${esc(f.numbers)} = <b>${pct(f.value)}</b>. The fill and ` +
        "the drain stay p\u22121 steps long while the work grows with m: more micro-batches, less bubble.</p>"
        : `<p>${esc(r.schedule)} has no closed form at these settings (uneven stages or links), so the page's number is ` +
          "the simulation's.</p>");
  },

  memory(c) {
    const { m, p } = c;
    const gp = c.rows.gpipe, ob = c.rows["1f1b"];
    if (!c.ok("gpipe") || !c.ok("1f1b")) return "<p>GPipe and 1F1B do not run at these settings.</p>";
    return `<p>${c.fam("gpipe", "GPipe")} runs every forward before any backward, so each rank keeps all m = ${m} ` +
      `micro-batches' activations: peak ${c.peak(gp)}. ${c.fam("1f1b", "1F1B")} starts a backward as soon as one is ` +
      `ready and then alternates one forward, one backward, so rank 0 keeps at most p = ${p} and the last rank one: ` +
      `peaks ${ob.peak_activations.map(num).join(" ")} (${c.term("memory", "the memory strips")}).</p>` +
      `<p>1F1B does not shrink the bubble: its fill and drain are GPipe's (${pct(gp.bubble_fraction)} and ` +
      `${pct(ob.bubble_fraction)}); what it buys is ${num(+(Math.max(...gp.peak_activations) / Math.max(...ob.peak_activations)).toFixed(2))}` +
      "\u00d7 less memory, and the gap grows with m.</p>";
  },

  interleaving(c) {
    const il = c.by["interleaved-1f1b"] || c.rows["interleaved-1f1b"], ob = c.rows["1f1b"];
    if (!il || il.error) return `<p>Interleaved 1F1B does not run at these settings${il ? `: ${esc(il.error)}` : ""}.</p>`;
    const v = il.chunks, { p, m } = c;
    return `<p>${c.fam("interleaved-1f1b", "Interleaving")} gives each rank v chunks of the model instead of one ` +
      `block (here v = ${v}), so a micro-batch crosses every rank v times and the pipeline fills in chunk steps, ` +
      `1/v as long: bubble (p\u22121) / (v\u00b7m+p\u22121) = (${p}\u22121) / (${v}\u00b7${m}+${p}\u22121) = ` +
      `<b>${pct((p - 1) / (v * m + p - 1))}</b>` + (ob && !ob.error ? `, against 1F1B's ${pct(ob.bubble_fraction)}` : "") +
      `. The lighter ${c.term("kind:F", "shades")} are a rank's later chunks.</p>` +
      `<p>The price: v\u00d7 the messages between ranks (try a latency), and each rank's peak is ${c.peak(il)} ` +
      "micro-batches of its share. The v control sets the chunks.</p>";
  },

  "zero-bubble"(c) {
    const h1 = c.rows["zb-h1"], h2 = c.rows["zb-h2"], ob = c.rows["1f1b"];
    if (!c.ok("zb-h1")) return `<p>ZB-H1 does not run at these settings: ${esc(h1 ? h1.error : "not built")}.</p>`;
    const f = h1.formula;
    return `<p>A backward is two halves: ${c.term("kind:I", "I")}, the input gradient the previous rank waits for, and ` +
      `${c.term("kind:W", "W")}, the weight gradient nobody waits for. ${c.fam("zb-h1", "ZB-H1")} runs each I as early as ` +
      `it can and puts the W's in the gaps 1F1B leaves idle: bubble <b>${pct(h1.bubble_fraction)}</b>` +
      (c.ok("1f1b") ? ` against 1F1B's ${pct(ob.bubble_fraction)}, with the same peak (${c.peak(h1)} and ${c.peak(ob)})` : "") +
      (f ? `; its form: ${esc(f.form)} = ${esc(f.numbers)}` : "") + ".</p>" +
      (c.ok("zb-h2") ? `<p>Its memory: ${c.fam("zb-h2", "ZB-H2")} runs more forwards in the warm-up, so rank 0 holds ` +
        `${c.peak(h2)} micro-batches instead of ${c.peak(h1)}, to leave less idle at the start ` +
        `(${pct(h2.bubble_fraction)} here). A W keeps what it needs until it runs: the "I frees" control says how much ` +
        "of an activation I may free early.</p>" : "");
  },

  "v-shape"(c) {
    const names = ["zb-v", "v-half", "v-min"].filter((x) => c.ok(x));
    if (!names.length) return "<p>The V schedules do not run at these settings.</p>";
    const list = names.map((x) => `<li>${c.fam(x)}: bubble ${pct(c.rows[x].bubble_fraction)}, peak ${c.peak(c.rows[x])}` +
      "</li>").join("");
    return `<p>A V puts two chunks on each rank: rank 0 holds the first and the last stage, so a micro-batch goes down ` +
      "the ranks and comes back up, and its backward starts where its forward began. With the split backward (I and " +
      "W) this nearly closes the bubble, at a price in memory. The controllable-memory schedules repeat a building " +
      "block that holds fewer micro-batches at a time: </p>" + `<ul>${list}</ul>` +
      `<p>Memory against bubble: set a cap (activations per rank, in a rank's share) and the summary and the ` +
      `${c.term("memory", "memory strips")} mark who fits.</p>`;
  },

  dualpipe(c) {
    const dp = c.by["dualpipe-v"] || c.rows["dualpipe-v"], zv = c.by["zb-v"] || c.rows["zb-v"];
    if (!dp || dp.error) return `<p>DualPipe-V does not run at these settings${dp ? `: ${esc(dp.error)}` : ""}.</p>`;
    const hidden = (x) => x && x.exposed_a2a ? n4(Math.max(...x.exposed_a2a)) : "0";
    const lanes = c.results.some((x) => x.lanes && x.lanes.length);
    return `<p>${c.fam("dualpipe", "DualPipe")} feeds micro-batches from both ends of the pipeline: each rank holds a ` +
      "stage of two model copies, one per direction (params 2\u00d7), so one direction's fill is the other's drain. " +
      `${c.fam("dualpipe-v", "DualPipe-V")} folds it into a V with one copy. Both run ${c.term("kind:F", "F&amp;B pairs")}: ` +
      "one micro-batch's forward and another's backward as one op on one rank.</p>" +
      "<p>With mixture-of-experts layers each forward and backward also sends its tokens to the experts and back, an " +
      "all-to-all (the all-to-all control: its time for one forward). A plain op waits for its own; in a pair one half " +
      "computes while the other's all-to-all runs, so the pair hides it." +
      (lanes ? ` The ${c.term("lane", "lane")} under each rank shows it: pale where hidden, dark where the rank waits. ` +
        `DualPipe-V exposes ${hidden(dp)} of it on its busiest rank, ZB-V ${hidden(zv)}.` : " Set an all-to-all to see " +
        "its lane under each rank.") + "</p>";
  },

  slices(c) {
    const sq = c.by.seq1f1b || c.rows.seq1f1b, ob = c.rows["1f1b"];
    if (!sq || sq.error || !c.ok("1f1b")) return `<p>Seq1F1B does not run at these settings${sq && sq.error ? `: ${esc(sq.error)}` : ""}.</p>`;
    const k = sq.slices || 1, p = c.p;
    return `<p>${c.fam("seq1f1b", "Seq1F1B")} cuts each micro-batch into k slices along the sequence (the slices ` +
      `control, here k = ${k}) and runs 1F1B over the slices: a cell ${c.term("kind:F", "2.1")} is micro-batch 2's ` +
      "slice 1. A slice's forward attends to the keys and values of the slices before it, so it runs after them on " +
      "its stage; the backwards run the other way, last slice first, each handing the gradients of those keys and " +
      "values back (Why it waits names such a wait).</p>" +
      `<p>A slice is 1/k of the work, so the pipeline fills and drains in steps 1/k as long: bubble ` +
      `<b>${pct(sq.bubble_fraction)}</b> against 1F1B's ${pct(ob.bubble_fraction)}. And rank 0 keeps p+k−1 slices ` +
      `at its peak, (p+k−1)/k micro-batches: ${c.peak(sq)} against 1F1B's ${c.peak(ob)} ` +
      `(${c.term("memory", "the memory strips")}), toward 1/k of it as p grows (here p = ${p}).</p>`;
  },

  uneven(c) {
    const { r, p, m } = c;
    const tf = $("tf").value, tb = $("tb").value;
    return `<p>t<sub>F</sub> and t<sub>B</sub> take one number per stage (here ${esc(tf)} and ${esc(tb)}), as ` +
      "<code>stagewise simulate --tf 1,1,1,2 --tb 2,2,2,4</code> does. In 1F1B's steady state each rank runs one " +
      "forward and one backward per micro-batch, and a stage slower than the rest makes its neighbours wait for it " +
      `every time (${c.term("gaps:slow stage", "slow-stage gaps")}): the slowest stage sets the pace.</p>` +
      `<p>Here ${esc(r.schedule)} at p = ${p}, m = ${m}: makespan <b>${num(r.makespan)}</b>, bubble ` +
      `${pct(r.bubble_fraction)}. With the same work spread evenly, (m+p\u22121)(t<sub>F</sub>+t<sub>B</sub>) for ` +
      "each stage's share. The planner (<code>stagewise plan</code>) looks for such splits.</p>";
  },
};
