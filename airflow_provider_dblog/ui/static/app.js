// The live view: renders the server's snapshots (Server-Sent Events from /api/events), at most
// once per animation frame; a snapshot that arrives before the last one was drawn replaces it.
"use strict";

const HORIZON_MS = 30000;
const MAX_DOTS_PER_S = 25;
const LANE_PX = 18;         // one lane of the window timeline
const LABEL_WIDTH = 0.03;   // the share of the timeline a bar's "#seq" label needs
const OPS = ["c", "u", "d", "r"];
const OP_NAMES = { c: "inserts", u: "updates", d: "deletes", r: "chunk rows emitted at hw" };
const DUMPS_SHOWN = 5;      // dumps drawn until "show more" is pressed
const FINISHED = ["done", "failed", "cancelled"];
const RESUMABLE = ["failed", "cancelled"];
let latest = null;          // the newest snapshot not yet drawn
let shown = null;           // the snapshot drawn last (redrawn when the view changes)
let showAll = false;        // every listed dump drawn, not only the first DUMPS_SHOWN
const previous = {};        // table -> its counts in the snapshot before
const seen = {};            // window id -> the states this page has seen it in

const $ = (sel, root = document) => root.querySelector(sel);
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}
const num = (n) => (n ?? 0).toLocaleString("en");

let source = null;          // the open stream (of one dump's page: that dump is always listed)
function connect() {
  const live = $("#live");
  if (source) source.close();
  const focus = focused();
  source = new EventSource(focus === null ? "/api/events" : `/api/events?dump=${encodeURIComponent(focus)}`);
  source.onopen = () => { live.dataset.live = "live"; live.textContent = "live"; };
  source.onerror = () => { live.dataset.live = "reconnecting"; live.textContent = "reconnecting…"; };
  source.onmessage = (message) => {
    latest = JSON.parse(message.data);
    if (!scheduled) schedule();
  };
}
let scheduled = false;
function schedule() { scheduled = true; requestAnimationFrame(frame); }
function frame() {
  scheduled = false;
  if (latest !== null) {
    shown = latest;
    latest = null;
    draw(shown);
  }
}
function redraw() { if (shown && !shown.error) drawDumps(shown); }

// `#dump=<id>` opens one dump's page (the link Airflow's dump task shows).
function focused() {
  const match = /^#dump=(.+)$/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}
window.addEventListener("hashchange", () => { connect(); redraw(); });

function draw(snap) {
  if (snap.source) $("#source").textContent = snap.source;
  const error = $("#error");
  error.hidden = !snap.error;
  error.textContent = snap.error || "";
  if (snap.error) return;
  drawTailer(snap.tailer, snap.windows);
  drawTables(snap.tailer);
  drawCompaction(snap.compaction);
  drawWindows(snap.windows, snap.now_ms);
  drawDumps(snap);
  drawVerifies(snap.verifies || []);
}

const tailerAlive = (tailer) => !!tailer && tailer.alive;

// The window counts come from this snapshot's windows, read with its dumps: the header never
// trails the dump cards below it. The heartbeat gives the rest, with its age.
function drawTailer(tailer, windows) {
  const box = $("#tailer");
  box.dataset.alive = tailerAlive(tailer) ? "yes" : "no";
  const ended = (state) => windows.filter((w) => w.state === state).length;
  const counts = [el("b", {}, `${windows.filter((w) => !w.ended).length}`), " open windows · ",
    `${ended("closed")} closed · ${ended("failed")} failed in the last minutes`];
  box.innerHTML = "";
  if (!tailer) {
    box.append(el("b", { class: "stopped" }, "no tailer: no heartbeat (not running?)"), " · ", ...counts);
    return;
  }
  const m = tailer.metrics;
  if (!tailer.alive) {
    box.append(el("b", { class: "stopped" }, `tailer ${tailer.owner} stopped?`),
      ` no heartbeat for ${(tailer.age_ms / 1000).toFixed(1)} s (it was ${m.state ?? "?"}) · `, ...counts);
    return;
  }
  box.append("tailer ", el("b", {}, tailer.owner), ` · ${m.state ?? "?"} · lag `,
    el("b", {}, `${num(m.lag_ms)} ms`), ` · ${num(m.events)} events · `, ...counts,
    ` · beat ${num(tailer.age_ms)} ms ago`);
}

function drawCompaction(compaction) {
  const box = $("#compaction");
  box.hidden = !compaction;
  if (!compaction) return;
  const fresh = compaction.freshness_s == null ? "unknown" : `${compaction.freshness_s.toFixed(1)} s`;
  box.replaceChildren("lake ", el("b", {}, compaction.owner), ` folds · freshness ${fresh} · `,
    `${num(compaction.events)} events folded · ${num(compaction.pending_bytes)} bytes pending`);
}

function drawTables(tailer) {
  const box = $("#tables");
  const rows = tailer ? tailer.tables : [];
  if (!rows.length) { box.textContent = "no events counted yet"; return; }
  for (const row of rows) {
    let line = box.querySelector(`.row[data-table="${CSS.escape(row.table)}"]`);
    if (!line) {
      if (!box.querySelector(".row")) box.textContent = "";
      line = el("div", { class: "row", "data-table": row.table },
        el("div", { class: "name" }, row.table), el("div", { class: "lane" }), el("div", { class: "counts" }));
      box.append(line);
    }
    const counts = $(".counts", line);
    counts.innerHTML = "";
    for (const op of OPS) {
      const n = row.ops[op] ?? 0;
      counts.append(el("span", { class: op, "data-op": op, "data-count": n, title: OP_NAMES[op] }, `${op} ${num(n)}`));
    }
    counts.append(el("span", { class: "dropped", "data-op": "dropped", "data-count": row.dropped,
        title: "chunk rows dropped: their key changed inside the window" }, `✕ ${num(row.dropped)}`),
      el("span", { class: "rate" }, `${row.per_s}/s`));
    flow($(".lane", line), previous[row.table], row);
    previous[row.table] = row;
  }
}

// Verify runs, newest first: one line each with the counts `dblog status` prints.
const VERIFY_COUNTS = ["checked", "in_flux", "missing", "extra", "changed"];
function drawVerifies(runs) {
  const box = $("#verifies");
  if (!runs.length) { box.textContent = "no verify runs"; return; }
  const head = el("tr", {}, ...["verify", "state", "chunks", ...VERIFY_COUNTS, "repair"]
    .map((name) => el("th", {}, name.replace("_", " "))));
  const rows = runs.map((run) => {
    const differs = run.missing + run.extra + run.changed > 0;
    const repair = run.repair_dumps === null ? "" : `${num(run.removed)} removed; ${run.repair_dumps.join(", ") || "no key dumps"}`;
    return el("tr", { class: `verify ${run.state}${differs ? " differs" : ""}`, "data-verify": run.verify_id },
      el("td", {}, run.verify_id), el("td", { class: "state", title: run.reason || "" }, run.state),
      el("td", {}, num(run.chunks)),
      ...VERIFY_COUNTS.map((c) => el("td", { "data-count": c }, num(run[c]))), el("td", {}, repair));
  });
  box.replaceChildren(el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
}

// Dots for what moved since the last snapshot: a sample, never more than MAX_DOTS_PER_S.
function flow(lane, before, row) {
  if (!before) return;
  const moved = [];
  for (const op of OPS) moved.push(...Array(Math.max(0, (row.ops[op] ?? 0) - (before.ops[op] ?? 0))).fill(op));
  const dropped = Math.max(0, row.dropped - before.dropped);
  const total = moved.length + dropped;
  const budget = Math.min(total, MAX_DOTS_PER_S);
  for (let i = 0; i < budget; i++) {
    const pick = Math.floor((i * total) / budget);
    const kind = pick < moved.length ? moved[pick] : "dropped";
    const dot = el("span", { class: `dot ${kind}` }, kind === "dropped" ? "✕" : "");
    dot.style.animationDelay = `${(i / budget) * 0.5}s`;
    dot.addEventListener("animationend", () => dot.remove());
    lane.append(dot);
  }
}

function drawWindows(windows, now) {
  const listed = new Set(windows.map((w) => w.window_id));
  for (const id of Object.keys(seen)) if (!listed.has(id)) delete seen[id];
  for (const w of windows) {
    const states = (seen[w.window_id] ||= []);
    if (states[states.length - 1] !== w.state) states.push(w.state);
  }
  const timeline = $("#timeline");
  timeline.innerHTML = "";
  const byTable = {};
  for (const w of windows) (byTable[w.table] ||= []).push(w);
  for (const [table, list] of Object.entries(byTable).sort()) {
    const bars = el("div", { class: "bars" });
    const laneEnds = [];  // where each lane's last bar ends (0..1): windows that overlap in time stack
    for (const w of list) {
      const end = w.ended ? w.updated_ms : now;
      if (end < now - HORIZON_MS) continue;
      const left = Math.max(0, (w.registered_ms - (now - HORIZON_MS)) / HORIZON_MS);
      const width = Math.max(0, (end - Math.max(w.registered_ms, now - HORIZON_MS)) / HORIZON_MS);
      // A bar needs room for its label (about 3% of the track) or goes on another lane.
      let lane = laneEnds.findIndex((e) => e <= left);
      if (lane < 0) { lane = laneEnds.length; laneEnds.push(0); }
      laneEnds[lane] = left + Math.max(width, LABEL_WIDTH);
      const bar = el("div", { class: `bar ${w.state}`, title: `${w.window_id} ${w.state} ${w.reason}`,
        "data-lane": lane }, width >= LABEL_WIDTH ? `#${w.seq ?? ""}` : "");
      bar.style.left = `${(left * 100).toFixed(2)}%`;
      bar.style.width = `${(width * 100).toFixed(2)}%`;
      bar.style.top = `${3 + lane * LANE_PX}px`;
      bars.append(bar);
    }
    bars.style.height = `${6 + Math.max(1, laneEnds.length) * LANE_PX}px`;
    timeline.append(el("div", { class: "track" }, el("div", {}, table), bars));
  }
  const body = el("tbody");
  for (const w of [...windows].reverse().slice(0, 60)) {
    const chunk = w.keys != null ? `${w.keys} keys`
      : `after ${w.after ? JSON.stringify(w.after) : "start"} to ${w.upto ? JSON.stringify(w.upto) : "end"}${
        w.limit != null ? `, ≤ ${num(w.limit)} rows` : ""}`;
    body.append(el("tr", { class: `window ${w.state}`, "data-window-id": w.window_id, "data-state": w.state,
        "data-seen": seen[w.window_id].join(" ") },
      el("td", {}, w.window_id.slice(0, 8)), el("td", {}, w.table), el("td", {}, `#${w.seq ?? ""}`),
      el("td", {}, chunk), el("td", { class: "state" }, w.state),
      el("td", {}, `${num((w.ended ? w.updated_ms : now) - w.registered_ms)} ms`),
      el("td", {}, w.reason)));
  }
  const table = el("table", {}, el("thead", {}, el("tr", {}, ...["window", "table", "chunk", "keys", "state",
    "for", "reason"].map((h) => el("th", {}, h)))), body);
  const box = $("#windows");
  box.innerHTML = "";
  box.append(windows.length ? table : "no windows in the last minutes");
}

function drawDumps(snap) {
  const box = $("#dumps");
  const focus = focused();
  let dumps = snap.dumps;
  if (focus !== null) dumps = [...dumps, ...snap.pinned].filter((d) => d.dump_id === focus);
  else if (!showAll) dumps = dumps.slice(0, DUMPS_SHOWN);
  drawDumpsNote(snap, focus, dumps.length);
  if (!dumps.length) {
    for (const card of box.querySelectorAll(".dump")) card.remove();
    // A page just opened waits for a snapshot taken since it asked for its dump.
    box.textContent = focus === null ? "no dumps" : snap.pins.includes(focus)
      ? `no dump ${focus} in this source` : `looking for dump ${focus}…`;
    return;
  }
  if (!box.querySelector(".dump")) box.textContent = "";
  const ids = new Set(dumps.map((d) => d.dump_id));
  for (const card of box.querySelectorAll(".dump")) if (!ids.has(card.dataset.dumpId)) card.remove();
  let before = null;
  for (const d of dumps) {
    let card = box.querySelector(`.dump[data-dump-id="${CSS.escape(d.dump_id)}"]`);
    if (!card) card = dumpCard(d.dump_id);
    // Moved only when out of place: moving a card blurs the field someone is typing into.
    const place = before ? before.nextSibling : box.firstChild;
    if (place !== card) box.insertBefore(card, place);
    before = card;
    fillDump(card, d, snap.tailer);
  }
}

// What is not drawn: the dumps behind "show more", those older than the snapshot lists.
function drawDumpsNote(snap, focus, drawn) {
  const note = $("#dumps-note");
  note.replaceChildren();
  if (focus !== null) {
    note.append(`dump ${focus} only · `, el("a", { href: "#", class: "all" }, "all dumps"));
    return;
  }
  const hidden = snap.dumps.length - drawn;
  if (hidden > 0) {
    const more = el("button", { class: "more" }, `show ${hidden} more`);
    more.addEventListener("click", () => { showAll = true; redraw(); });
    note.append(more);
  } else if (showAll && snap.dumps.length > DUMPS_SHOWN) {
    const fewer = el("button", { class: "more" }, "show fewer");
    fewer.addEventListener("click", () => { showAll = false; redraw(); });
    note.append(fewer);
  }
  const older = snap.dumps_total - snap.dumps.length;
  if (older > 0) note.append(` ${num(older)} older dumps not listed (dblog status --dump ID)`);
}

function dumpCard(id) {
  const input = (name, placeholder) => el("input", { name, placeholder, inputmode: "decimal" });
  const card = el("div", { class: "dump", "data-dump-id": id },
    el("div", { class: "head" }, el("a", { class: "id", href: `#dump=${encodeURIComponent(id)}` }, `dump ${id}`),
      el("span", { class: "state" }), el("span", { class: "counters" }), el("span", { class: "times" }),
      el("span", { class: "pace" }), el("span", { class: "origin" })),
    el("div", { class: "warning", hidden: "" }), el("div", { class: "reason" }), el("div", { class: "filter" }),
    el("div", { class: "tables" }),
    el("div", { class: "controls" },
      el("button", { "data-action": "pause" }, "pause"), el("button", { "data-action": "resume" }, "resume"),
      el("button", { "data-action": "cancel" }, "cancel"),
      input("chunk_size", "chunk size"), input("delay_ms", "delay ms"), input("max_rows_per_s", "rows/s (0: no limit)"),
      el("button", { "data-action": "throttle" }, "throttle"),
      el("span", { class: "confirm", hidden: "" }, `cancel dump ${id}? It stops after its current chunk. `,
        el("button", { "data-action": "confirm-cancel" }, "yes, cancel it"),
        el("button", { "data-action": "keep" }, "no")),
      el("span", { class: "message" })),
    el("div", { class: "rerun", hidden: "" },
      el("button", { "data-action": "rerun" }, "resume from its last chunk"),
      " or in a shell: ", el("code", {}, `dblog dump --dump-id ${id} --resume`),
      el("span", { class: "message" })));
  for (const button of card.querySelectorAll("button")) {
    button.addEventListener("click", () => press(card, id, button.dataset.action));
  }
  return card;
}

// Cancel asks first; the rest act at once.
function press(card, id, action) {
  const confirm = $(".confirm", card);
  if (action === "cancel") { confirm.hidden = false; return; }
  confirm.hidden = true;
  if (action === "keep") return;
  act(card, id, action === "confirm-cancel" ? "cancel" : action);
}

const clockTime = (ms) => new Date(ms).toLocaleString("en-GB");

function fillDump(card, d, tailer) {
  card.dataset.state = d.state;
  const c = d.controls;
  const finished = FINISHED.includes(d.state);
  $(".state", card).textContent = d.state + (c && c.paused && d.state !== "paused" ? " (pause asked)" : "");
  $(".counters", card).textContent = `${num(d.chunks)} chunks · ${num(d.rows)} rows · ${num(d.windows_retried)} windows retried`
    + (d.read_only ? " · read-only: nothing written to the source" : "");
  $(".times", card).textContent = d.started_ms == null ? `asked ${clockTime(d.created_ms)}`
    : `started ${clockTime(d.started_ms)} · ${finished ? "took" : "running for"} ${d.duration}`;
  // The pace measured (rows/s, an ETA when every table left has one), then the settings.
  const measured = d.rows_per_s == null ? [] : [`${num(d.rows_per_s)} rows/s${finished ? " on average" : ""}`];
  if (d.eta) measured.push(`ETA ${d.eta}`);
  const settings = c && !finished ? [`chunk ${num(c.chunk_size)}`, `delay ${num(c.delay_ms)} ms`,
    c.max_rows_per_s == null ? "no rate limit" : `limit ${num(c.max_rows_per_s)} rows/s`] : [];
  $(".pace", card).textContent = [...measured, ...settings].join(" · ");
  card.dataset.paused = c && c.paused ? "yes" : "no";
  const origin = $(".origin", card);
  origin.replaceChildren(...(d.origin && d.origin.run_url
    ? [el("a", { href: d.origin.run_url, target: "_blank", rel: "noopener" }, `Airflow: ${d.origin.dag_id} run`)] : []));
  const warning = $(".warning", card);
  warning.hidden = finished || tailerAlive(tailer);
  warning.textContent = warning.hidden ? "" : "no tailer is running: this dump's windows cannot close, "
    + "so its chunks wait, then fail. Start dblog tail.";
  $(".reason", card).textContent = d.reason;
  // The filter is user SQL: shown as text, never parsed as HTML.
  const filter = $(".filter", card);
  filter.hidden = !d.where;
  filter.replaceChildren(...(d.where ? [el("span", {}, "where "), el("code", {}, d.where)] : []));
  const tables = $(".tables", card);
  for (const t of d.tables) {
    let row = tables.querySelector(`.progress[data-table="${CSS.escape(t.table)}"]`);
    if (!row) {
      row = el("div", { class: "progress", "data-table": t.table }, el("div", {}, t.table),
        el("div", { class: "track" }, el("div", { class: "fill" })), el("div", { class: "figures" }));
      tables.append(row);
    }
    const known = t.fraction != null;
    const percent = known ? Math.floor(t.fraction * 100) : null;
    row.dataset.known = known ? "yes" : "no";
    row.dataset.percent = known ? String(percent) : "";
    $(".fill", row).style.width = known ? `${t.fraction * 100}%` : "100%";
    const figures = [`${num(t.rows)} rows`, `${num(t.chunks)} chunks`];
    if (known) figures.unshift(`${percent}%`);
    if (t.rows_per_s != null) figures.push(`${num(t.rows_per_s)} rows/s`);
    if (t.eta) figures.push(`ETA ${t.eta}`);
    if (t.done) figures.push("done");
    else if (!t.started) figures.push(finished ? "not started" : "waiting");
    else if (finished) figures.push(`stopped (${d.state})`);
    $(".figures", row).textContent = figures.join(" · ");
  }
  // A finished dump takes no control: only "resume from its last chunk", if it can resume.
  $(".controls", card).hidden = finished;
  if (finished) $(".confirm", card).hidden = true;
  $(".rerun", card).hidden = !RESUMABLE.includes(d.state);
}

// Answers can come back out of order (one server thread per request): a message shows the
// answer to the latest press only, never a slower answer to an earlier one.
async function act(card, id, action) {
  const asked = String(Number(card.dataset.asked || 0) + 1);
  card.dataset.asked = asked;
  const body = {};
  if (action === "throttle") {
    for (const input of card.querySelectorAll(".controls input")) {
      if (input.value.trim() !== "") body[input.name] = input.value.trim();
    }
  }
  const message = $(action === "rerun" ? ".rerun .message" : ".controls .message", card);
  try {
    const answer = await fetch(`/api/dumps/${encodeURIComponent(id)}/${action}`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const reply = await answer.json();
    if (card.dataset.asked !== asked) return;
    message.classList.toggle("bad", !answer.ok);
    message.textContent = reply.message || reply.error;
  } catch (exc) {
    if (card.dataset.asked !== asked) return;
    message.classList.add("bad");
    message.textContent = `not sent: ${exc}`;
  }
}

connect();
