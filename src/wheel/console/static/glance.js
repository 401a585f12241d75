// The console's pages at a glance: the overview (the landing page), the feed
// of recent runs across jobs, a job's history strip, and the charts they
// draw with uPlot (vendored beside this file, loaded before it). Uses the
// helpers of console.js (el, api, when, fill, stateTag), which is loaded
// after it: everything here runs only once the page has started.
"use strict";

// The outcomes of the run chart, bottom up, and their colours.
const OUTCOMES = [
  ["succeeded", "#23803a"], ["failed", "#d0453a"], ["timed_out", "#e08a1e"],
  ["lost", "#7b3fb3"], ["dead_lettered", "#8c1d18"], ["missed", "#c9a227"],
  ["other", "#8a939c"],
];
const COLOUR = Object.fromEntries(OUTCOMES);
// The overview and the feed refresh this often while the tab is visible.
const REFRESH_MS = 5000;
const glance = {
  window: "hour", feedToken: "", charts: {}, timer: null, refreshes: 0, paused: 0, generation: 0,
};

// -- time zones -----------------------------------------------------------------------

function zoneName() {
  return state.zone === "local" ? Intl.DateTimeFormat().resolvedOptions().timeZone : "UTC";
}

// uPlot's dates in the chosen zone (the browser's own is uPlot's default).
function chartDate(ts) {
  return state.zone === "local" ? new Date(ts * 1000) : uPlot.tzDate(new Date(ts * 1000), "UTC");
}

// -- charts ---------------------------------------------------------------------------

function chartWidth(box) { return Math.max(360, Math.min(980, box.clientWidth || 720)); }

function mount(key, box, opts, data) {
  if (glance.charts[key]) glance.charts[key].destroy();
  box.replaceChildren();
  glance.charts[key] = new uPlot(opts, data, box);
  box.dataset.points = String(data[0].length);
  return glance.charts[key];
}

// A duration in milliseconds as a person reads it: 250 ms, 1.5 s, 9.4 h.
function humanMs(v) {
  if (v == null) return "–";
  if (v < 1000) return `${+v.toPrecision(3)} ms`;
  if (v < 60000) return `${+(v / 1000).toPrecision(3)} s`;
  if (v < 3600000) return `${+(v / 60000).toPrecision(3)} min`;
  return `${+(v / 3600000).toPrecision(3)} h`;
}

// Runs per bar stacked by outcome: each series is the sum of those below it,
// drawn top down so that each lower one paints over the one above.
function runsChart(box, data) {
  const xs = data.bucket_starts_ms.map((t) => t / 1000);
  const sums = [];
  let below = xs.map(() => 0);
  for (const [name] of OUTCOMES) {
    below = below.map((v, i) => v + data.runs[name][i]);
    sums.push([name, below]);
  }
  const shown = sums.filter(([name]) => data.totals[name] > 0 || name === "succeeded").reverse();
  const bars = uPlot.paths.bars({ size: [0.8, 40], align: 0 });
  // Half a bar of room at each end: the newest bar is whole at the right.
  const half = data.bucket_ms / 2000;
  const series = [{ label: `time (${zoneName()})`, value: (u, v) => (v == null ? "–" : when({ ms: v * 1000 })) }];
  for (const [name] of shown) {
    series.push({
      label: name.replace("_", " "), stroke: COLOUR[name], fill: COLOUR[name], width: 0,
      paths: bars, points: { show: false },
      value: (u, v, si, i) => (i == null ? "–" : data.runs[name][i]),
    });
  }
  const per = data.window === "hour" ? "minute" : "15 minutes";
  return mount("runs", box, {
    width: chartWidth(box), height: 220, tzDate: chartDate,
    title: `Runs per ${per}, by outcome`,
    scales: {
      x: { time: true, range: (u, lo, hi) => [lo - half, hi + half] },
      y: { range: (u, lo, hi) => [0, Math.max(1, Math.ceil(hi * 1.1))] },
    },
    axes: [{ label: `time (${zoneName()})` }, { label: "runs", values: (u, s) => s.map((v) => (Number.isInteger(v) ? v : "")) }],
    series,
  }, [xs, ...shown.map(([, v]) => v)]);
}

// Dispatch lag per minute on a log axis with labelled ticks, and the
// objective as a dashed line; a minute that handed nothing out is a gap.
function lagChartPlot(box, minutes, objectiveMs) {
  const xs = minutes.map((m) => m.minute.ms / 1000);
  // A log axis has no zero: sub-millisecond lag is drawn at 1 ms.
  const col = (key) => minutes.map((m) => (m.count ? Math.max(1, m[key]) : null));
  // A minute between quiet ones has no neighbour to join: its points show.
  const line = (label, stroke, dash) => ({
    label, stroke, width: 2, dash, spanGaps: false, points: { show: true, size: 5, fill: stroke },
    value: (u, v) => (v == null ? "–" : humanMs(v)),
  });
  const series = [{ label: `time (${zoneName()})`, value: (u, v) => (v == null ? "–" : when({ ms: v * 1000 })) },
    line("p50", "#2357c6"), line("p99", "#a86400"), line("max", "#b3261e")];
  const data = [xs, col("p50_ms"), col("p99_ms"), col("max_ms")];
  if (objectiveMs) {
    const objective = line(`objective (p99 ≤ ${humanMs(objectiveMs)})`, "#444", [6, 4]);
    series.push({ ...objective, width: 1, points: { show: false } });
    data.push(xs.map(() => objectiveMs));
  }
  return mount("lag", box, {
    width: chartWidth(box), height: 220, tzDate: chartDate,
    title: "Dispatch lag per minute (log scale)",
    scales: { x: { time: true }, y: { distr: 3, log: 10 } },
    axes: [{ label: `time (${zoneName()})` }, { label: "lag", size: 70, values: (u, s) => s.map(humanMs) }],
    series,
  }, data);
}

// -- the overview ---------------------------------------------------------------------

// An operator's panel: null (and a note in its box) when the token may not see it.
async function adminOnly(path, box) {
  try {
    return await api(path);
  } catch (e) {
    if (e.status !== 403) throw e;
    box.replaceChildren(el("p", { class: "muted" }, "needs an operator's token"));
    return null;
  }
}

function ageOf(t, now) {
  if (!t) return "–";
  const s = Math.max(0, Math.round((now - t.ms) / 1000));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

function card(label, value, cls) {
  return el("div", { class: "card " + (cls || "") }, el("b", {}, value), el("span", {}, label));
}

async function loadOverview() {
  const [runs, lag, workers, cluster, alerts] = await Promise.all([
    api(`/api/overview?window=${glance.window}`),
    adminOnly("/api/lag", $("#ov-lag")),
    adminOnly("/api/workers", $("#ov-workers")),
    adminOnly("/api/cluster", $("#ov-cluster")),
    adminOnly("/api/alerts", $("#ov-alerts")),
  ]);
  for (const b of document.querySelectorAll("#ov-window button")) {
    b.classList.toggle("on", b.dataset.window === glance.window);
  }
  const jobs = Object.entries(runs.jobs).sort((a, b) => b[1] - a[1]);
  $("#ov-jobs").replaceChildren(card("jobs", runs.jobs_total),
    ...jobs.map(([s, n]) => card(s, n, "state " + s)));
  const failing = runs.totals.failed + runs.totals.timed_out + runs.totals.lost + runs.totals.dead_lettered;
  $("#ov-totals").replaceChildren(
    ...OUTCOMES.filter(([o]) => o !== "other" || runs.totals.other)
      .map(([o]) => card(o.replace("_", " "), runs.totals[o], "outcome " + o)));
  $("#ov-verdict").textContent = failing || (alerts && alerts.firing.length)
    ? `${failing} runs did not succeed over the last ${glance.window}` +
      (alerts && alerts.firing.length ? `; ${alerts.firing.length} alerts firing` : "")
    : `all runs succeeded over the last ${glance.window}; no alert firing`;
  runsChart($("#ov-runs"), runs);
  if (lag) lagChartPlot($("#ov-lag"), lag.minutes, state.config.lag_objective_ms);
  if (workers) {
    const free = workers.workers.reduce((n, w) => n + Math.max(0, w.capacity - w.held), 0);
    const cap = workers.workers.reduce((n, w) => n + w.capacity, 0);
    $("#ov-workers").replaceChildren(
      el("div", { class: "cards" }, card("workers connected", workers.workers.length),
        card("free capacity", `${free} / ${cap}`)),
      el("ul", {}, ...workers.workers.map((w) =>
        el("li", {}, `${w.worker_id}: ${w.held} held of ${w.capacity}` +
          (w.draining ? " (draining)" : w.silent ? " (silent)" : "")))));
  }
  if (cluster) {
    const now = Date.parse(runs.now.iso);
    const moving = (cluster.released || []).filter((r) => now - r.at.ms < 60000).length;
    const unowned = cluster.shard_owners.filter((o) => !o).length;
    const held = {};
    for (const n of cluster.nodes) held[n.node_id] = n.shards_owned;
    $("#ov-cluster").replaceChildren(
      el("div", { class: "cards" }, card("members", cluster.members.length),
        card("shards", cluster.shard_owners.length),
        card("moving (last minute)", moving), card("without owner", unowned, unowned ? "warn" : "")),
      el("ul", {}, ...cluster.members.map((m) =>
        el("li", {}, `${m.node_id}${m.address ? ` (${m.address})` : ""}:` +
          ` ${held[m.node_id] ?? 0} shards`))));
  }
  if (alerts) {
    const now = Date.parse(runs.now.iso);
    const rows = alerts.firing.map((a) =>
      el("tr", { "data-kind": a.kind }, el("td", {}, stateTag(a.kind)),
        el("td", {}, a.since ? `raised ${ageOf(a.since, now)} ago` : "firing")));
    $("#ov-alerts").replaceChildren(el("table", { id: "ov-firing" },
      el("thead", {}, el("tr", {}, el("th", {}, "Alert firing"), el("th", {}, "Age"))),
      el("tbody", {})));
    fill($("#ov-firing tbody"), rows, "no alert firing", 2);
  }
}

// -- the feed of recent runs ----------------------------------------------------------

function feedQuery() {
  const q = new URLSearchParams();
  for (const k of ["outcome", "tenant", "handler", "job"]) {
    const v = $("#r-" + k).value.trim();
    if (v) q.set(k, v);
  }
  return q;
}

function feedRow(r) {
  const bad = ["failed", "timed_out", "lost", "dead_lettered", "unknown"].includes(r.state);
  return el("tr", { class: bad ? "bad" : "", "data-state": r.state, "data-run": r.run_id },
    el("td", {}, when(r.finished_at || r.dispatched_at)),
    el("td", {}, el("a", { href: "#/job/" + r.job_id }, r.job_name)),
    el("td", {}, r.tenant), el("td", {}, r.handler),
    el("td", {}, stateTag(r.state)), el("td", { class: "num" }, r.attempt),
    el("td", {}, r.worker_id || "–"),
    el("td", { class: "num" }, r.started_at && r.finished_at ? humanMs(r.finished_at.ms - r.started_at.ms) : "–"),
    el("td", { class: "detail" }, r.error || ""));
}

async function loadFeed(more) {
  const q = feedQuery();
  if (more && glance.feedToken) q.set("page_token", glance.feedToken);
  const data = await api("/api/runs?" + q.toString());
  const tbody = $("#feed tbody");
  if (!more) fill(tbody, [], "no runs match", 9);
  if (data.runs.length && tbody.querySelector("tr.empty")) tbody.replaceChildren();
  for (const r of data.runs) tbody.append(feedRow(r));
  glance.feedToken = data.next_page_token;
  $("#feed-more").disabled = !data.next_page_token;
  // A call reads a bounded range of runs: a short page may have older ones.
  $("#feed-note").textContent = data.next_page_token && data.runs.length < 50
    ? "fewer matches among the runs read this time: older runs may match too" : "";
}

// -- a job's history at a glance ------------------------------------------------------

async function loadHistory(jobId) {
  const h = await api(`/api/jobs/${jobId}/history`);
  const strip = $("#job-strip");
  strip.replaceChildren(...h.fires.map((f) => {
    const what = f.state === "missed" ? `missed: ${f.missed_reason}`
      : `${f.state}, attempt ${f.attempt}` + (f.error ? ` — ${f.error}` : "");
    return el("span", {
      class: "fire " + f.state, "data-state": f.state, title: `${when(f.scheduled_for)} · ${what}`,
    });
  }));
  if (!h.fires.length) strip.append(el("span", { class: "muted" }, "no fires yet"));
  const rate = h.success_rate == null ? "–" : `${(h.success_rate * 100).toFixed(1)}%`;
  $("#job-day").replaceChildren(
    card("runs, last day", h.runs), card("success rate", rate),
    card("p50 duration", humanMs(h.p50_ms)), card("p99 duration", humanMs(h.p99_ms)));
}

// -- refreshing -----------------------------------------------------------------------

// The overview and the feed refresh themselves every REFRESH_MS while the tab
// is visible; a hidden tab asks nothing, and shows fresh numbers on return.
function refreshing(view) {
  clearTimeout(glance.timer);
  glance.timer = null;
  // A refresh still running when the page moves on must not start another.
  const generation = ++glance.generation;
  if (view !== "overview" && view !== "runs") return;
  const tick = async () => {
    if (generation !== glance.generation) return;
    if (document.visibilityState !== "visible") {
      // Hidden: nothing asked until the tab shows again (visibilitychange).
      glance.paused += 1;
      document.body.dataset.paused = String(glance.paused);
      return;
    }
    try {
      if (view === "overview") await loadOverview(); else await loadFeed(false);
      glance.refreshes += 1;
      document.body.dataset.refreshes = String(glance.refreshes);
      showError("");
    } catch (e) {
      showError(e.message);
    }
    if (generation === glance.generation) glance.timer = setTimeout(tick, REFRESH_MS);
  };
  glance.timer = setTimeout(tick, REFRESH_MS);
  glance.resume = () => {
    clearTimeout(glance.timer);
    tick();
  };
}

function startGlance() {
  for (const b of document.querySelectorAll("#ov-window button")) {
    b.addEventListener("click", () => {
      glance.window = b.dataset.window;
      loadOverview().catch((e) => showError(e.message));
    });
  }
  $("#feed-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    loadFeed(false).catch((e) => showError(e.message));
  });
  $("#feed-more").addEventListener("click", () => {
    loadFeed(true).catch((e) => showError(e.message));
  });
  document.addEventListener("visibilitychange", () => {
    document.body.dataset.visible = document.visibilityState;
    if (document.visibilityState === "visible" && glance.timer !== null && glance.resume) {
      glance.resume();
    }
  });
}
