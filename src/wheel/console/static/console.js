// The wheel web console: one page over the node's JSON API under /api/.
// No framework and no build step. Everything the API answers is put in the
// page as text (textContent), never as HTML.
"use strict";

const TOKEN_KEY = "wheel.token";
const ZONE_KEY = "wheel.zone";
const state = {
  config: null, jobsToken: "", jobsPages: [], runsToken: "", deadToken: "", jobId: null,
  // Times in UTC, or in the browser's zone ("local"); every time shown carries it.
  zone: localStorage.getItem(ZONE_KEY) === "local" ? "local" : "UTC",
};

// -- small helpers --------------------------------------------------------------------

function $(sel) { return document.querySelector(sel); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    // Through the CSSOM: the page's policy refuses style attributes.
    else if (k === "style") node.style.cssText = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c ?? ""));
  return node;
}

function fill(tbody, rows, empty, columns) {
  tbody.replaceChildren();
  if (!rows.length) {
    tbody.append(el("tr", { class: "empty" }, el("td", { colspan: String(columns) }, empty)));
    return;
  }
  for (const r of rows) tbody.append(r);
}

function pad(n, width) { return String(n).padStart(width || 2, "0"); }

function when(t) {
  if (!t) return "–";
  // The one form of a time, the JSON API's own: ISO 8601 with milliseconds,
  // in UTC (Z) or in the browser's zone with its offset (+01:00).
  const d = new Date(t.ms);
  if (state.zone !== "local") return d.toISOString();
  const off = -d.getTimezoneOffset();
  const sign = off < 0 ? "-" : "+";
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}` +
    `T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}` +
    `${sign}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)}`;
}

function stateTag(s) { return el("span", { class: "state " + s }, s); }

function showError(message) {
  const box = $("#error");
  box.textContent = message || "";
  box.hidden = !message;
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options) {
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = "Bearer " + token();
  const init = Object.assign({ headers }, options || {});
  if (init.body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(init.body);
  }
  const resp = await fetch(path, init);
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (!resp.ok) {
    const message = (body && body.error) || resp.status + " " + resp.statusText;
    if (resp.status === 401) askToken(message);
    throw new ApiError(resp.status, message);
  }
  return body;
}

function askToken(message) {
  $("#signin").hidden = false;
  for (const v of document.querySelectorAll(".view")) v.hidden = true;
  if (message && token()) showError(message);
}

// -- jobs -----------------------------------------------------------------------------

function jobQuery() {
  const q = new URLSearchParams();
  for (const k of ["name", "state", "tenant"]) {
    const v = $("#f-" + k).value.trim();
    if (v) q.set(k, v);
  }
  return q;
}

async function loadJobs(pageToken) {
  const q = jobQuery();
  if (pageToken) q.set("page_token", pageToken);
  const data = await api("/api/jobs?" + q.toString());
  const rows = data.jobs.map((j) =>
    el("tr", { "data-job": j.job_id },
      el("td", { class: "num" }, el("a", { href: "#/job/" + j.job_id }, j.job_id)),
      el("td", {}, el("a", { href: "#/job/" + j.job_id }, j.name)),
      el("td", {}, j.tenant),
      el("td", {}, stateTag(j.state)),
      el("td", {}, j.schedule),
      el("td", {}, when(j.next_fire)),
      el("td", {}, j.handler)));
  fill($("#jobs tbody"), rows, "no jobs match", 7);
  state.jobsToken = data.next_page_token;
  $("#jobs-more").disabled = !data.next_page_token;
  $("#jobs-first").disabled = !pageToken;
}

// -- one job --------------------------------------------------------------------------

function spec(job) {
  const rows = [
    ["id", job.job_id], ["name", job.name], ["tenant", job.tenant], ["state", stateTag(job.state)],
    ["handler", job.handler], ["pool", job.pool], ["priority", job.priority],
    ["schedule", job.schedule_text],
    ["shard", job.shard],
    ["catch-up", `${job.catch_up.mode}, window ${job.catch_up.window ?? "none"}` +
      (job.catch_up.window !== null ? " s" : "") + `, max ${job.catch_up.max_count}`],
    ["overlap", `${job.overlap.policy} (max concurrent ${job.overlap.max_concurrent},` +
      ` max buffered ${job.overlap.max_buffered})`],
    ["retry", `${job.retry.max_attempts} attempts, backoff ${job.retry.initial_backoff} s` +
      ` ×${job.retry.multiplier} up to ${job.retry.max_backoff} s`],
    ["timeout", job.timeout + " s"], ["jitter", job.jitter + " s"],
    ["side effects", job.at_most_once ? "at most once" : "idempotent"],
    ["created", when(job.created_at)], ["updated", when(job.updated_at)],
    ["payload", job.payload.size === 0 ? el("span", { class: "muted" }, "none")
      : job.payload.text !== null
        ? el("pre", {}, job.payload.text + (job.payload.truncated ? "…" : ""))
        : job.payload.encrypted
          ? `encrypted, key ${job.payload.encrypted} (${job.payload.size} bytes)`
          : `${job.payload.size} bytes (binary)`],
  ];
  if (job.schedule_kind === "cron") {
    rows.splice(7, 0, ["DST", `gap: ${job.schedule.dst_gap}, fold: ${job.schedule.dst_fold}`]);
  }
  if (job.http) {
    const t = job.http;
    const headers = Object.entries(t.headers).map(([k, v]) => `${k}: ${v}`).join("\n");
    rows.splice(5, 0,
      ["http target", `${t.method} ${t.url}`],
      ["http", `timeout ${t.timeout} s, ` +
        (t.signing_secret ? `signed with secret ${t.signing_secret}` : "unsigned") +
        (t.retry_4xx ? ", 4xx retried" : "") + (t.follow_redirects ? ", redirects followed" : "")]);
    if (headers) rows.splice(7, 0, ["http headers", el("pre", {}, headers)]);
  }
  if (job.skip_calendars && job.skip_calendars.length) {
    rows.push(["skips", `the days of ${job.skip_calendars.join(", ")} (calendars)`]);
  }
  const dl = $("#job-spec");
  dl.replaceChildren();
  for (const [k, v] of rows) dl.append(el("dt", {}, k), el("dd", {}, v));
}

function resultCell(r) {
  // The result is the endpoint's or the handler's data: text only, like
  // everything else; in full (pretty-printed) on expand and as the title.
  if (!r.result) return el("td", { class: "result" }, "–");
  const full = JSON.stringify(r.result, null, 2);
  return el("td", { class: "result", title: full },
    el("details", {}, el("summary", {}, r.result_summary), el("pre", {}, full)));
}

function runRow(r) {
  const detail = r.missed_reason || r.error || "";
  const cls = r.state === "missed" ? "missed" : (r.error ? "bad" : "");
  return el("tr", { class: cls, "data-state": r.state },
    el("td", {}, when(r.scheduled_for)),
    el("td", { class: "num" }, r.run_id === "0" ? "–" : r.attempt),
    el("td", {}, stateTag(r.state)),
    el("td", { class: "num" }, r.run_id === "0" ? "–" : r.run_id),
    el("td", { class: "num" }, r.run_id === "0" ? "–" : r.fence),
    el("td", {}, r.worker_id || "–"),
    el("td", {}, when(r.started_at)),
    el("td", {}, when(r.finished_at)),
    resultCell(r),
    el("td", { class: "detail" }, r.missed_reason ? "missed: " + detail : detail));
}

async function loadRuns(jobId, more) {
  const q = new URLSearchParams();
  if (more && state.runsToken) q.set("page_token", state.runsToken);
  const data = await api(`/api/jobs/${jobId}/runs?` + q.toString());
  const tbody = $("#runs tbody");
  if (!more) fill(tbody, [], "no runs yet", 10);
  if (data.runs.length && tbody.querySelector("tr.empty")) tbody.replaceChildren();
  for (const r of data.runs) tbody.append(runRow(r));
  state.runsToken = data.next_page_token;
  $("#runs-more").disabled = !data.next_page_token;
}

function redriveButton(jobId, runId) {
  return el("button", {
    type: "button", class: "redrive",
    onclick: () => act(`/api/jobs/${jobId}/dead-letters/redrive`, runId ? { run_id: runId } : {}),
  }, runId ? "Redrive" : "Redrive all");
}

async function loadJobDead(jobId) {
  const data = await api(`/api/jobs/${jobId}/dead-letters`);
  const all = $("#job-dead-all");
  all.replaceChildren();
  if (data.redrive && data.runs.length) all.append(redriveButton(jobId, null));
  const rows = data.runs.map((r) =>
    el("tr", { "data-run": r.run_id },
      el("td", {}, when(r.scheduled_for)), el("td", { class: "num" }, r.attempt),
      el("td", { class: "num" }, r.run_id), el("td", { class: "num" }, r.fence),
      el("td", {}, r.worker_id || "–"), el("td", {}, r.error || ""),
      el("td", {}, data.redrive ? redriveButton(jobId, r.run_id) : "")));
  fill($("#job-dead tbody"), rows, "no dead letters", 7);
}

async function act(path, body) {
  try {
    await api(path, { method: "POST", body: body || {} });
    showError("");
    await route();
  } catch (e) {
    showError(e.message);
  }
}

async function loadJob(jobId) {
  state.jobId = jobId;
  const job = await api(`/api/jobs/${jobId}`);
  $("#job-title").textContent = `${job.name} (job ${job.job_id})`;
  spec(job);
  const next = job.next_fires.map((t) => el("li", {}, when(t)));
  $("#job-next").replaceChildren(...(next.length ? next : [el("li", { class: "muted" }, "none")]));
  const actions = $("#job-actions");
  actions.replaceChildren();
  if (state.config.actions) {
    const verbs = job.state === "paused" ? ["resume", "trigger", "cancel"]
      : job.state === "active" ? ["pause", "trigger", "cancel"] : [];
    for (const v of verbs) {
      actions.append(el("button", { type: "button", "data-action": v,
        onclick: () => act(`/api/jobs/${jobId}/${v}`) }, v[0].toUpperCase() + v.slice(1)));
    }
  }
  await Promise.all([loadRuns(jobId, false), loadJobDead(jobId), loadHistory(jobId)]);
}

// -- dead letters, runtime, cluster, lag ----------------------------------------------

async function loadDead(pageToken) {
  const q = new URLSearchParams();
  if (pageToken) q.set("page_token", pageToken);
  const data = await api("/api/dead-letters?" + q.toString());
  const rows = data.runs.map((r) =>
    el("tr", { "data-run": r.run_id },
      el("td", {}, el("a", { href: "#/job/" + r.job_id }, r.job_id)),
      el("td", {}, when(r.scheduled_for)), el("td", { class: "num" }, r.attempt),
      el("td", { class: "num" }, r.run_id), el("td", { class: "num" }, r.fence),
      el("td", {}, r.error || ""),
      el("td", {}, data.redrive ? redriveButton(r.job_id, r.run_id) : "")));
  fill($("#dead tbody"), rows, "no dead letters", 7);
  state.deadToken = data.next_page_token;
  $("#dead-more").disabled = !data.next_page_token;
  $("#dead-note").textContent = data.redrive ? "" : "read-only: no redrive";
}

async function loadRuntime() {
  const [held, workers, limits] = await Promise.all(
    [api("/api/in-flight"), api("/api/workers"), api("/api/limits")]);
  const missing = held.unreachable.length ? `; not answering: ${held.unreachable.join(", ")}` : "";
  $("#inflight-total").textContent = `(${held.total} held in all${missing})`;
  fill($("#inflight tbody"), held.runs.map((r) =>
    el("tr", {},
      el("td", { class: "num" }, r.run_id),
      el("td", {}, el("a", { href: "#/job/" + r.job_id }, r.job_id)),
      el("td", {}, when(r.scheduled_for)), el("td", { class: "num" }, r.attempt),
      el("td", { class: "num" }, r.fence), el("td", {}, r.node_id || "–"),
      el("td", {}, r.worker_id || "–"), el("td", {}, r.phase))), "nothing in flight", 8);
  $("#workers-node").textContent = `(to ${workers.node_id}; a worker holds a stream to every member)`;
  fill($("#workers tbody"), workers.workers.map((w) =>
    el("tr", {},
      el("td", {}, w.worker_id), el("td", { class: "num" }, `${w.held} / ${w.capacity}`),
      el("td", {}, w.pools.join(", ")),
      el("td", {}, w.handlers.length ? w.handlers.join(", ") : "any"),
      el("td", {}, w.draining ? "draining" : w.silent ? "silent" : "serving"))),
  "no worker connected", 5);
  fill($("#unserved tbody"), workers.unserved.map((u) =>
    el("tr", {}, el("td", {}, u.pool), el("td", {}, u.handler),
      el("td", { class: "num" }, u.waiting))), "none", 3);
  fill($("#limits tbody"), limits.limits.map((x) =>
    el("tr", {}, el("td", {}, x.tenant), el("td", {}, x.key),
      el("td", { class: "num" }, x.max_concurrent || "–"),
      el("td", {}, x.rate ? `${x.rate}/${x.rate_period_ms === 1000 ? "s" : "min"} (burst ${x.burst})` : "–"),
      el("td", { class: "num" }, x.in_flight), el("td", { class: "num" }, x.waiting))),
  "no limits", 6);
}

const PALETTE = ["#2357c6", "#23803a", "#a86400", "#7b3fb3", "#0f7c8c", "#b3261e", "#5c6b1f", "#c2418a"];

async function loadCluster() {
  const c = await api("/api/cluster");
  const held = {};
  for (const n of c.nodes) held[n.node_id] = n.shards_owned;
  fill($("#members tbody"), c.members.map((m) =>
    el("tr", {}, el("td", {}, m.node_id), el("td", {}, m.address),
      el("td", { class: "num" }, held[m.node_id] ?? 0))), "no members", 3);
  $("#cluster-summary").textContent =
    `asked ${c.node_id}: ${c.jobs} jobs held, ${c.in_flight} in flight, backlog ${c.backlog}` +
    ` (${c.overdue_backlog} overdue), ${c.workers} workers, membership version ${c.membership_version}`;
  const color = {};
  c.members.forEach((m, i) => { color[m.node_id] = PALETTE[i % PALETTE.length]; });
  const grid = $("#shards");
  grid.replaceChildren();
  c.shard_owners.forEach((owner, shard) => {
    grid.append(el("div", {
      title: `shard ${shard}: ${owner || "no owner"}`,
      style: "background:" + (owner ? (color[owner] || "#888") : "#ccc"),
    }, shard));
  });
  $("#shard-legend").replaceChildren(...Object.entries(color).map(([n, col]) =>
    el("span", {}, el("i", { style: "background:" + col }), n)));
}

async function loadLag() {
  const data = await api("/api/lag");
  lagChartPlot($("#lag-chart"), data.minutes, state.config.lag_objective_ms);
  const rows = data.minutes.filter((m) => m.count).reverse().map((m) =>
    el("tr", {}, el("td", {}, when(m.minute)), el("td", { class: "num" }, m.count),
      el("td", { class: "num" }, m.p50_ms), el("td", { class: "num" }, m.p99_ms),
      el("td", { class: "num" }, m.max_ms)));
  fill($("#lag tbody"), rows, "no runs handed out in the last hour", 5);
}

async function loadAudit(pageToken) {
  const q = new URLSearchParams();
  if (pageToken) q.set("page_token", pageToken);
  const data = await api("/api/audit?" + q.toString());
  const rows = data.entries.map((e) =>
    el("tr", { "data-entry": e.entry_id },
      el("td", {}, when(e.at)), el("td", {}, e.action),
      el("td", {}, e.job_id ? el("a", { href: "#/job/" + e.job_id }, e.target) : e.target),
      el("td", {}, e.tenant), el("td", {}, e.actor || "–"), el("td", {}, e.address),
      el("td", {}, el("code", {}, JSON.stringify(e.details)))));
  const body = $("#audit tbody");
  if (pageToken) for (const r of rows) body.append(r);
  else fill(body, rows, "no administrative changes recorded", 7);
  state.auditToken = data.next_page_token;
  $("#audit-more").disabled = !data.next_page_token;
}

// -- routing --------------------------------------------------------------------------

function show(view, tab) {
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== "view-" + view;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("on", a.dataset.tab === tab);
}

async function route() {
  const hash = location.hash || "#/overview";
  const [, view, arg] = hash.split("/");
  $("#signin").hidden = true;
  refreshing(view);
  try {
    if (view === "job" && arg) { show("job", "jobs"); await loadJob(arg); }
    else if (view === "jobs") { show("jobs", "jobs"); await loadJobs(""); }
    else if (view === "runs") { show("runs", "runs"); await loadFeed(false); }
    else if (view === "dead-letters") { show("dead-letters", view); await loadDead(""); }
    else if (view === "runtime") { show("runtime", view); await loadRuntime(); }
    else if (view === "cluster") { show("cluster", view); await loadCluster(); }
    else if (view === "lag") { show("lag", view); await loadLag(); }
    else if (view === "audit") { show("audit", view); await loadAudit(""); }
    else { show("overview", "overview"); await loadOverview(); }
    showError("");
    document.body.dataset.loaded = hash;
  } catch (e) {
    if (e.status !== 401) showError(e.message);
    document.body.dataset.loaded = hash;
  }
}

async function start() {
  state.config = await api("/api/config");
  $("#node").textContent = "node " + state.config.node_id;
  const mode = $("#mode");
  mode.textContent = state.config.actions ? "actions on" : "read-only";
  mode.classList.toggle("act", state.config.actions);
  $("#sign-out").hidden = !state.config.auth;
  const zone = $("#zone");
  zone.options[1].textContent = `local (${Intl.DateTimeFormat().resolvedOptions().timeZone})`;
  zone.value = state.zone;
  zone.addEventListener("change", () => {
    state.zone = zone.value;
    localStorage.setItem(ZONE_KEY, state.zone);
    route();
  });
  startGlance();
  $("#sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    askToken("");
  });
  $("#signin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
    $("#token").value = "";
    showError("");
    route();
  });
  $("#job-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.jobsPages = [];
    loadJobs("").catch((e) => showError(e.message));
  });
  $("#jobs-more").addEventListener("click", () => {
    state.jobsPages.push(state.jobsToken);
    loadJobs(state.jobsToken).catch((e) => showError(e.message));
  });
  $("#jobs-first").addEventListener("click", () => {
    state.jobsPages = [];
    loadJobs("").catch((e) => showError(e.message));
  });
  $("#dead-more").addEventListener("click", () => {
    loadDead(state.deadToken).catch((e) => showError(e.message));
  });
  $("#audit-more").addEventListener("click", () => {
    loadAudit(state.auditToken).catch((e) => showError(e.message));
  });
  $("#runs-more").addEventListener("click", () => {
    loadRuns(state.jobId, true).catch((e) => showError(e.message));
  });
  window.addEventListener("hashchange", route);
  if (state.config.auth && !token()) { askToken(""); return; }
  await route();
}

start().catch((e) => showError(e.message));
