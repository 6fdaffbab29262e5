// gnomon web UI: buttons, forms and live updates. Every call goes to /ui/api/v1/...,
// which is the JSON API's /v1/... with the sign-in cookie's token and this CSRF token.
"use strict";

const PREFIX = "/ui";
const csrfMeta = document.querySelector('meta[name="csrf"]');
const CSRF = csrfMeta ? csrfMeta.content : "";
const RUN_FIELDS = ["slot", "startAt", "grantedAt", "startedAt", "startLagS", "finishedAt", "attempt",
  "maxAttempts", "replays", "worker", "exitCode", "error", "reason", "note", "nextAttemptAt"];
const TERMINAL = new Set(["succeeded", "failed", "cancelled", "skipped"]);

class ApiError extends Error {
  constructor(status, body) {
    const detail = body && (body.detail || body.title);
    super(body && body.field ? `${body.field}: ${detail}` : (detail || `HTTP ${status}`));
    this.status = status;
  }
}

async function api(method, path, body, headers = {}) {
  const init = { method, credentials: "same-origin", headers: { "X-CSRF-Token": CSRF, ...headers } };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const r = await fetch(PREFIX + "/api" + path, init);
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = { detail: text.slice(0, 300) }; }
  if (r.status === 401) { location.href = PREFIX + "/login?next=" + encodeURIComponent(location.pathname); }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

function flash(message, isError = false) {
  const el = document.getElementById("flash");
  if (!el) return;
  el.textContent = message;
  el.className = isError ? "error" : "ok";
  el.hidden = false;
}

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));
const randomKey = () => "ui-" + Array.from(crypto.getRandomValues(new Uint8Array(8)),
  (b) => b.toString(16).padStart(2, "0")).join("");

// A job's status changes once the processor applied the command and history has it.
async function waitForJobStatus(jobPath, status, timeoutMs = 15000) {
  const until = Date.now() + timeoutMs;
  while (Date.now() < until) {
    try { if ((await api("GET", jobPath)).status === status) return; } catch (e) { /* keep trying */ }
    await sleep(300);
  }
}

// ---- calendar rows: <button data-delete-calendar="NAME">
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-delete-calendar]");
  if (!button) return;
  event.preventDefault();
  button.disabled = true;
  try {
    await api("DELETE", `/v1/calendars/${encodeURIComponent(button.dataset.deleteCalendar)}`);
    location.reload();
  } catch (e) {
    flash(e.message, true);
    button.disabled = false;
  }
});

// ---- buttons: <button data-post="/v1/..." [data-trigger] data-done="...">
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-post]");
  if (!button) return;
  event.preventDefault();
  button.disabled = true;
  try {
    const path = button.dataset.post;
    const body = "trigger" in button.dataset ? { idempotencyKey: randomKey() } : undefined;
    const answer = await api("POST", path, body);
    const run = answer && answer.runId ? ` (${answer.runId})` : "";
    flash(`${button.dataset.done || "done"}${run}`);
    const row = button.closest("tr");
    if (row && row.closest("#dead-letters")) {
      button.replaceWith(document.createTextNode("replay requested"));
      return;
    }
    const action = path.slice(path.lastIndexOf(":") + 1);
    if (action === "pause" || action === "resume") {
      await waitForJobStatus(path.slice(0, path.lastIndexOf(":")), action === "pause" ? "paused" : "active");
      location.reload();
    } else {
      refreshAll();
    }
  } catch (e) {
    flash(e.message, true);
  } finally {
    button.disabled = false;
  }
});

// ---- the create form on the jobs page
function jobBody(form) {
  const f = new FormData(form);
  const value = (name) => (f.get(name) || "").toString().trim();
  const body = { name: value("name") };
  const upstreams = value("after").split(/[\s,]+/).filter((a) => a !== "");
  if (upstreams.length) body.after = upstreams.map((job) => ({ job }));
  if (value("when") === "after") {
    // no schedule of its own: a run after each run of its upstreams
  } else if (value("when") === "once") {
    body.runAt = value("runAt");
  } else if (value("when") === "every") {
    body.every = value("every");
    if (value("from")) body.from = value("from");
  } else {
    body.schedule = value("schedule");
  }
  if (value("when") === "cron" || value("when") === "every") {
    if (value("startAt")) body.startAt = value("startAt");
    if (value("endAt")) body.endAt = value("endAt");
    if (value("maxRuns")) body.maxRuns = Number(value("maxRuns"));
  }
  if (value("timezone")) body.timezone = value("timezone");
  const type = value("targetType");
  if (type === "command") {
    body.target = { type, argv: value("argv").split("\n").map((a) => a.replace(/\r$/, "")).filter((a) => a !== "") };
  } else if (type === "http") {
    body.target = { type, url: value("url") };
  } else {
    body.target = { type, name: value("handler") };
  }
  if (value("retryMax")) body.retry = { max: Number(value("retryMax")) };
  if (value("timeoutS")) body.timeoutS = Number(value("timeoutS"));
  if (value("priority")) body.priority = value("priority");
  if (value("pool")) body.pool = value("pool");
  return body;
}

document.addEventListener("submit", async (event) => {
  const form = event.target;
  if (form.matches("form[data-create-job]")) {
    event.preventDefault();
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      // the same key for every submit of this form: a retry after a lost answer is the same job
      const job = await api("POST", "/v1/jobs", jobBody(form), { "Idempotency-Key": form.dataset.key });
      flash(`created ${job.id}; waiting for the processor to apply it`);
      await waitForJobStatus(`/v1/jobs/${encodeURIComponent(job.id)}`, job.status);  // history has it
      location.href = `${PREFIX}/jobs/${encodeURIComponent(job.id)}`;
    } catch (e) {
      flash(e.message, true);
      if (e.status === 409) form.dataset.key = randomKey();
    } finally {
      button.disabled = false;
    }
  } else if (form.matches("form[data-put-calendar]")) {
    event.preventDefault();
    const f = new FormData(form);
    const name = (f.get("name") || "").toString().trim();
    const dates = (f.get("dates") || "").toString().split("\n").map((d) => d.trim()).filter((d) => d !== "")
      .map((d) => (d.includes("..") ? { from: d.split("..")[0].trim(), to: d.split("..")[1].trim() } : d));
    try {
      await api("PUT", `/v1/calendars/${encodeURIComponent(name)}`, { timezone: (f.get("timezone") || "UTC").toString().trim(), dates });
      location.reload();
    } catch (e) {
      flash(e.message, true);
    }
  } else if (form.matches("form[data-backfill]")) {
    event.preventDefault();
    const f = new FormData(form);
    try {
      const answer = await api("POST", form.dataset.path, { from: f.get("from"), to: f.get("to") });
      flash(`backfill: ${answer.slots} slots, ${answer.sent} new runs, ${answer.alreadyRun.length} already run`);
      refreshAll();
    } catch (e) {
      flash(e.message, true);
    }
  }
});

document.addEventListener("change", (event) => {
  if (event.target.matches("[data-autosubmit]")) event.target.form.submit();
});

// ---- parts of a page that reload themselves: <div data-refresh="URL" data-every-ms="2000">
const refreshers = [];
function refreshAll() { refreshers.forEach((f) => f()); }

for (const el of document.querySelectorAll("[data-refresh]")) {
  let busy = false;
  const refresh = async () => {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const r = await fetch(el.dataset.refresh, { credentials: "same-origin" });
      if (r.ok) {
        const html = await r.text();
        if (html !== el.dataset.last) { el.innerHTML = html; el.dataset.last = html; }
      }
    } catch (e) { /* the next tick tries again */ } finally { busy = false; }
  };
  refreshers.push(refresh);
  setInterval(refresh, Number(el.dataset.everyMs || 2000));
}

// ---- the live log tail of a run page: <pre data-tail="URL" data-terminal="false">
function showRun(run) {
  const badge = document.getElementById("run-status");
  if (badge) { badge.textContent = run.status; badge.className = "badge " + run.status; }
  const table = document.getElementById("run-fields");
  if (!table) return;
  table.replaceChildren(...RUN_FIELDS.filter((k) => run[k] !== null && run[k] !== undefined).map((k) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    const td = document.createElement("td");
    th.textContent = k; td.textContent = String(run[k]); td.dataset.field = k;
    tr.append(th, td);
    return tr;
  }));
}

async function tail(pre) {
  const state = document.getElementById("tail-state");
  let settled = 0; // polls since the run ended with no more lines to read
  while (settled < 2) {
    const last = pre.querySelector("span.line:last-of-type");
    const query = last ? `?attempt=${last.dataset.attempt}&seq=${last.dataset.seq}` : "";
    try {
      const r = await fetch(pre.dataset.tail + query, { credentials: "same-origin", headers: { "X-CSRF-Token": CSRF } });
      if (r.status === 401 || r.status === 404) break;
      if (r.ok) {
        const body = await r.json();
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        for (const l of body.lines) {
          const span = document.createElement("span");
          span.className = "line " + l.stream;
          span.dataset.attempt = l.attempt;
          span.dataset.seq = l.seq;
          span.textContent = `${l.at} [${l.attempt}] ${l.stream} ${l.line}\n`;
          pre.append(span);
        }
        if (body.lines.length && atBottom) pre.scrollTop = pre.scrollHeight;  // follow, unless scrolled up
        if (body.lines.length) { const none = document.getElementById("no-logs"); if (none) none.remove(); }
        showRun(body.run);
        settled = body.terminal && !body.more ? settled + 1 : 0;
        if (body.more) continue;
      }
    } catch (e) { /* try again */ }
    await sleep(1000);
  }
  if (state) state.textContent = "";
}

const logs = document.querySelector("pre[data-tail]");
if (logs && logs.dataset.terminal !== "true") tail(logs);
