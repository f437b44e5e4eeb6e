// The live view: renders the server's snapshots (Server-Sent Events from /api/events), at most
// once per animation frame; a snapshot that arrives before the last one was drawn replaces it.
"use strict";

const HORIZON_MS = 30000;
const MAX_DOTS_PER_S = 25;
const OPS = ["c", "u", "d", "r"];
const OP_NAMES = { c: "inserts", u: "updates", d: "deletes", r: "chunk rows emitted at hw" };
let latest = null;          // the newest snapshot not yet drawn
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

function connect() {
  const live = $("#live");
  const source = new EventSource("/api/events");
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
    const snap = latest;
    latest = null;
    draw(snap);
  }
}

function draw(snap) {
  if (snap.source) $("#source").textContent = snap.source;
  const error = $("#error");
  error.hidden = !snap.error;
  error.textContent = snap.error || "";
  if (snap.error) return;
  drawTailer(snap.tailer);
  drawTables(snap.tailer);
  drawCompaction(snap.compaction);
  drawWindows(snap.windows, snap.now_ms);
  drawDumps(snap.dumps);
}

function drawTailer(tailer) {
  const box = $("#tailer");
  if (!tailer) { box.textContent = "tailer: no heartbeat (not running?)"; return; }
  const m = tailer.metrics;
  box.innerHTML = "";
  box.append("tailer ", el("b", {}, tailer.owner), ` · ${m.state ?? "?"} · lag `,
    el("b", {}, `${num(m.lag_ms)} ms`), ` · ${num(m.events)} events · ${num(m.dump_rows)} chunk rows · `,
    el("b", {}, `${m.open_windows ?? 0}`), " open windows · ",
    `${num(m.windows_closed)} closed · ${num(m.windows_failed)} failed · beat ${num(tailer.age_ms)} ms ago`);
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
    for (const w of list) {
      const end = w.ended ? w.updated_ms : now;
      if (end < now - HORIZON_MS) continue;
      const left = Math.max(0, (w.registered_ms - (now - HORIZON_MS)) / HORIZON_MS);
      const width = Math.max(0, (end - Math.max(w.registered_ms, now - HORIZON_MS)) / HORIZON_MS);
      const bar = el("div", { class: `bar ${w.state}`, title: `${w.window_id} ${w.state} ${w.reason}` },
        `#${w.seq ?? ""}`);
      bar.style.left = `${(left * 100).toFixed(2)}%`;
      bar.style.width = `${(width * 100).toFixed(2)}%`;
      bars.append(bar);
    }
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

function drawDumps(dumps) {
  const box = $("#dumps");
  if (!dumps.length) { box.textContent = "no dumps"; return; }
  if (!box.querySelector(".dump")) box.textContent = "";
  const ids = new Set(dumps.map((d) => d.dump_id));
  for (const card of box.querySelectorAll(".dump")) if (!ids.has(card.dataset.dumpId)) card.remove();
  let before = null;
  for (const d of dumps) {
    let card = box.querySelector(`.dump[data-dump-id="${CSS.escape(d.dump_id)}"]`);
    if (!card) card = dumpCard(d.dump_id);
    box.insertBefore(card, before ? before.nextSibling : box.firstChild);
    before = card;
    fillDump(card, d);
  }
}

function dumpCard(id) {
  const input = (name, placeholder) => el("input", { name, placeholder, inputmode: "decimal" });
  const card = el("div", { class: "dump", "data-dump-id": id },
    el("div", { class: "head" }, el("b", {}, `dump ${id}`), el("span", { class: "state" }),
      el("span", { class: "counters" }), el("span", { class: "pace" })),
    el("div", { class: "reason" }), el("div", { class: "filter" }), el("div", { class: "tables" }),
    el("div", { class: "controls" },
      el("button", { "data-action": "pause" }, "pause"), el("button", { "data-action": "resume" }, "resume"),
      el("button", { "data-action": "cancel" }, "cancel"),
      input("chunk_size", "chunk size"), input("delay_ms", "delay ms"), input("max_rows_per_s", "rows/s (0: no limit)"),
      el("button", { "data-action": "throttle" }, "throttle"), el("span", { class: "message" })));
  for (const button of card.querySelectorAll("button")) {
    button.addEventListener("click", () => act(card, id, button.dataset.action));
  }
  return card;
}

function fillDump(card, d) {
  card.dataset.state = d.state;
  const c = d.controls;
  $(".state", card).textContent = d.state + (c && c.paused && d.state !== "paused" ? " (pause asked)" : "");
  $(".counters", card).textContent = `${num(d.chunks)} chunks · ${num(d.rows)} rows · ${num(d.windows_retried)} windows retried`;
  $(".pace", card).textContent = c ? `chunk ${num(c.chunk_size)} · delay ${num(c.delay_ms)} ms · ${
    c.max_rows_per_s == null ? "no rate limit" : `${num(c.max_rows_per_s)} rows/s`}` : "";
  card.dataset.paused = c && c.paused ? "yes" : "no";
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
    $(".figures", row).textContent = `${known ? percent + "% · " : ""}${num(t.rows)} rows · ${num(t.chunks)} chunks${
      t.done ? " · done" : t.started ? "" : " · waiting"}`;
  }
  const finished = ["done", "failed", "cancelled"].includes(d.state);
  for (const button of card.querySelectorAll("button")) button.disabled = finished;
}

async function act(card, id, action) {
  const body = {};
  if (action === "throttle") {
    for (const input of card.querySelectorAll(".controls input")) {
      if (input.value.trim() !== "") body[input.name] = input.value.trim();
    }
  }
  const message = $(".message", card);
  try {
    const answer = await fetch(`/api/dumps/${encodeURIComponent(id)}/${action}`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const reply = await answer.json();
    message.classList.toggle("bad", !answer.ok);
    message.textContent = reply.message || reply.error;
  } catch (exc) {
    message.classList.add("bad");
    message.textContent = `not sent: ${exc}`;
  }
}

connect();
