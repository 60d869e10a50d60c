// Teach: a lesson per idea next to the picture (lessons.js writes each one's text with this page's own
// numbers), ending with a question the student answers by changing a control; the server checks the view
// against it (/api/teach: stagewise.workshop.teach.LESSONS) and the page marks it answered. Every term lights
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

  legend(results) { return causeLegend(usedCauses(results)); },

  lesson() {
    const all = this.data.lessons;
    return all.find((x) => x.key === page.lesson) || all[0];
  },

  drawn(results) {
    $("panel-teach").innerHTML = this.data ? this.html(results) : "<p>The lesson's numbers could not be simulated.</p>";
    if (this.pinned) light(this.pinned);
  },

  bind() {
    const panel = $("panel-teach");
    panel.addEventListener("mouseover", (ev) => { const t = ev.target.closest("[data-term]"); if (t) light(t.dataset.term); });
    panel.addEventListener("mouseout", (ev) => { if (ev.target.closest("[data-term]")) light(this.pinned); });
    panel.addEventListener("click", (ev) => {
      const t = ev.target.closest("[data-term], [data-add], [data-go], [data-lesson], [data-start]");
      if (!t) return;
      ev.preventDefault();
      if (t.dataset.add) return addFamily(t.dataset.add);
      if (t.dataset.go) return setMode(t.dataset.go);
      if (t.dataset.lesson) return this.open(t.dataset.lesson);
      if (t.dataset.start !== undefined) return applySettings(this.lesson().start);
      this.pinned = this.pinned === t.dataset.term ? null : t.dataset.term;
      light(this.pinned);
    });
  },

  open(key) { // a lesson starts at its own settings
    page.lesson = key;
    this.pinned = null;
    saveUrl();
    applySettings(this.lesson().start);
  },

  html(results) {
    const lesson = this.lesson();
    const rows = Object.fromEntries(this.data.rows.map((x) => [x.schedule, x]));
    const nav = this.data.lessons.map((x, k) =>
      `<a href="#" data-lesson="${x.key}" class="${x.key === lesson.key ? "on" : ""}${x.answered ? " done" : ""}" ` +
      `title="${esc(x.title)}">${k + 1}${x.answered ? "\u2713" : ""}</a>`).join("");
    const text = (LESSONS[lesson.key] || (() => ""))(lessonContext(results, rows));
    const all = this.data.lessons, next = all[all.indexOf(lesson) + 1];
    return `<nav class="lessons" aria-label="lessons">${nav}</nav><h3>${esc(lesson.title)}</h3>${text}` +
      `<div class="question" data-answered="${lesson.answered}"><p><b>Question.</b> ${esc(lesson.question)}</p>` +
      `<p class="answer ${lesson.answered ? "ok" : "no"}">${lesson.answered ? "\u2713 answered" : "not yet"}: ` +
      `${esc(lesson.now)}</p><p><a href="#" data-start>start the lesson's view again</a>` +
      (next ? ` \u00b7 next: <a href="#" data-lesson="${next.key}">${esc(next.title)} \u2192</a>` : "") + "</p></div>";
  },
};

function lessonContext(results, rows) { // what a lesson's text reads: the view, the families' rows, link makers
  const term = (key, text) => `<a href="#" class="term" data-term="${key}">${text}</a>`;
  const fam = (name, text = name) => `<a href="#" class="fam" data-add="${name}" title="add ${name} to the view">${text}</a>`;
  const ok = (name) => rows[name] && !rows[name].error;
  const peak = (x) => num(Math.max(...x.peak_activations));
  const by = Object.fromEntries(results.map((x) => [x.schedule, x]));
  return { r: results[0], results, by, rows, term, fam, ok, peak, p: results[0].ranks, m: results[0].microbatches };
}

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
    lane: '.lane rect, [data-k^="0,"]',
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
