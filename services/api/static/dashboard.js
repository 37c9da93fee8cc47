// The Unicron dashboard: reads the /v1 API and its event stream, never writes. Every request is
// a GET carrying the token the user typed (kept in this tab's sessionStorage), so the page
// sees exactly what that token may see. The event stream is read with fetch, not
// EventSource, because EventSource cannot send an Authorization header and a token in the
// URL would end up in access logs.
"use strict";

const TOKEN_KEY = "unicron.token";
const POLL_MS = 2000;
const RECONNECT_MS = 1000;
const FEED_MAX = 200;
const SAMPLES_MAX = 180;
const DETAILS_MAX = 20; // active jobs whose full record (workers) the node grid reads
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const REFRESHING_EVENTS = /^(job|failure|plan|transition|node)\./;
const jobPath = location.pathname.match(/^\/ui\/jobs\/([^/]+)\/?$/);
const JOB_ID = jobPath ? decodeURIComponent(jobPath[1]) : null;

const $ = (id) => document.getElementById(id);
const samples = []; // {t, steps: {label: steps/s}, waf}
let lastSteps = null; // {t, byJob: {id: step}} of the previous poll
let logsRank = null;
let refreshTimer = null;
let tokenWanted = null; // the promise of the token dialog while it is open

// A 401, with the token the refused request carried (null: none).
class Unauthorized extends Error {
  constructor(message, token) {
    super(message);
    this.token = token;
  }
}

// ---- requests -------------------------------------------------------------------------------

function authHeaders(extra) {
  const headers = Object.assign({}, extra);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  return headers;
}

async function reason(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === "string") return body.detail;
    return body.message || response.statusText;
  } catch {
    return response.status + " " + response.statusText;
  }
}

async function get(path, extra) {
  const sent = sessionStorage.getItem(TOKEN_KEY);
  const response = await fetch(path, { headers: authHeaders(extra), cache: "no-store" });
  if (response.status === 401) throw new Unauthorized(await reason(response), sent);
  return response;
}

async function getJson(path, missing) {
  const response = await get(path);
  if (response.status === 404 && missing !== undefined) return missing;
  if (!response.ok) throw new Error(path + ": " + (await reason(response)));
  return response.json();
}

// Ask for a token, once however many requests were refused. A refusal of a token the user
// has since replaced asks nothing: the caller just tries again with the new one.
function needToken(refused) {
  if (tokenWanted) return tokenWanted;
  if (refused.token !== sessionStorage.getItem(TOKEN_KEY)) return Promise.resolve();
  sessionStorage.removeItem(TOKEN_KEY);
  $("login-why").textContent = refused.message;
  const dialog = $("login");
  tokenWanted = new Promise((resolve) => {
    $("login-form").onsubmit = (submitted) => {
      submitted.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      dialog.close();
      tokenWanted = null;
      showForget();
      resolve();
    };
  });
  dialog.showModal();
  return tokenWanted;
}

function showForget() {
  $("forget").hidden = !sessionStorage.getItem(TOKEN_KEY);
}

// ---- DOM helpers ----------------------------------------------------------------------------

// Every value from the API goes in as text, never as markup.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const badge = (state) => el("span", { class: "badge " + state }, state);
const clock = (seconds) => new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
const fixed = (value, digits) => (value === null || value === undefined ? "–" : value.toFixed(digits));

const amount = (value) => (value === null || value === undefined ? "–" : si(value));

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function describeFailure(failure) {
  if (!failure) return "";
  const where = [failure.rank !== null ? "rank " + failure.rank : null, failure.node_id]
    .filter((part) => part !== null && part !== undefined)
    .join(" on ");
  const text = failure.kind + " (" + failure.category + ", " + failure.severity + ")";
  return text + (where ? " — " + where : "") + " → " + failure.action;
}

function failureCell(failure) {
  if (!failure) return el("td", {}, "–");
  const at = failure.detected_at || failure.observed_at;
  return el("td", { class: "failure", title: failure.message || "" },
    describeFailure(failure), el("br"), "gen " + failure.generation + ", " + clock(at));
}

// ---- cluster page ---------------------------------------------------------------------------

function renderNodes(nodes, records) {
  const byNode = {};
  for (const job of records) {
    for (const worker of job.workers) {
      if (worker.state === "SUCCEEDED" || worker.state === "STOPPED") continue;
      (byNode[worker.node_id] ||= []).push({ job, worker });
    }
  }
  const rows = nodes
    .sort((a, b) => a.id.localeCompare(b.id))
    .map((node) => {
      const placed = (byNode[node.id] || []).sort((a, b) => a.worker.rank - b.worker.rank);
      const cells = placed.map(({ job, worker }) =>
        el("span", {
          class: "cell " + worker.state,
          title: job.id + " rank " + worker.rank + " " + worker.state + " pid " + worker.pid,
        }, job.name + " r" + worker.rank));
      for (let free = placed.length; free < node.slots; free++) {
        cells.push(el("span", { class: "cell free" }, "free"));
      }
      const facts = node.slots + (node.slots === 1 ? " slot" : " slots") + (node.gpus ? ", " + node.gpus + " GPUs" : "") +
        (node.spares_ready ? ", " + node.spares_ready + " spares" : "");
      return el("div", { class: "node " + node.state, "data-node": node.id },
        el("div", { class: "node-name" }, node.id + " ", badge(node.state), el("br"),
          el("span", { class: "muted" }, facts)),
        el("div", { class: "slots" }, ...cells));
    });
  $("nodes").replaceChildren(...(rows.length ? rows : [el("p", { class: "muted" }, "no nodes")]));
}

// Newest first: the job someone just submitted is the one they look for.
function renderJobs(jobs) {
  const rows = jobs.slice().reverse().map((job) => el("tr", {
    "data-job": job.id, "data-state": job.state, "data-recoveries": job.recoveries,
  },
    el("td", {}, el("a", { href: "/ui/jobs/" + encodeURIComponent(job.id) }, job.name),
      el("br"), el("span", { class: "muted" }, job.id)),
    el("td", { title: job.reason }, badge(job.state)),
    el("td", { class: "num" }, job.step + " / " + job.spec.steps),
    el("td", { class: "num" }, job.world_size),
    el("td", { class: "num" }, job.recoveries),
    failureCell(job.last_failure)));
  const empty = el("tr", {}, el("td", { colspan: "6", class: "muted" }, "no jobs"));
  fill($("jobs").tBodies[0], rows.length ? rows : [empty]);
}

async function refreshCluster() {
  const [nodes, jobs, plan] = await Promise.all([
    getJson("/v1/nodes"),
    getJson("/v1/jobs?limit=500"),
    getJson("/v1/plans/latest", null),
  ]);
  const active = jobs.filter((job) => !TERMINAL.has(job.state)).slice(-DETAILS_MAX);
  const records = await Promise.all(
    active.map((job) => getJson("/v1/jobs/" + encodeURIComponent(job.id), null)));
  renderNodes(nodes, records.filter(Boolean));
  renderJobs(jobs);
  sample(jobs.filter((job) => job.state === "RUNNING"), plan ? plan.expected_waf : null);
}

// ---- job page -------------------------------------------------------------------------------

function renderJob(job) {
  $("job-name").replaceChildren(job.name + " ", badge(job.state));
  const facts = [
    ["id", job.id], ["tenant", job.tenant || "–"], ["step", job.step + " / " + job.spec.steps],
    ["loss", fixed(job.loss, 4)], ["world size", job.world_size],
    ["generation", job.generation], ["recoveries", job.recoveries],
    ["transition", job.transition ? job.transition + " (" + (job.transition_kind || "?") + ")" : "–"],
    ["last failure", job.last_failure ? describeFailure(job.last_failure) : "–"],
    ["failure message", job.last_failure && job.last_failure.message ? job.last_failure.message : "–"],
  ];
  $("job-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  fill($("workers").tBodies[0], job.workers.map((w) => el("tr", { "data-rank": w.rank },
    el("td", { class: "num" }, w.rank), el("td", {}, w.node_id), el("td", {}, badge(w.state)),
    el("td", { class: "num" }, w.pid ?? "–"), el("td", { class: "num" }, w.exit_code ?? "–"),
    el("td", {}, w.state_source || "–"))));
  fill($("history").tBodies[0], job.history.slice().reverse().map((h) =>
    el("tr", {}, el("td", {}, clock(h.at)), el("td", {}, badge(h.state)), el("td", {}, h.reason))));
  const ranks = Math.max(job.workers.length, job.world_size, 1);
  const select = $("rank");
  if (select.options.length !== ranks) {
    select.replaceChildren(...Array.from({ length: ranks }, (_, r) => el("option", { value: r }, r)));
    select.value = String(logsRank ?? 0);
  }
}

// The plan that placed the job. A recovery on the executor's fast path runs under a plan id
// of its own that is never stored; the standing plan it acted within explains the job then.
async function planOf(job) {
  if (!job.plan_id) return null;
  const plan = await getJson("/v1/plans/" + encodeURIComponent(job.plan_id), null);
  return plan || getJson("/v1/plans/latest", null);
}

function renderPlan(plan, job) {
  const allocation = plan && plan.allocations.find((a) => a.job_id === job.id);
  const via = plan && job.plan_id !== plan.id ? ", last recovered by " + job.plan_id : "";
  $("plan-id").textContent = plan ? plan.id + " (" + plan.trigger + via + ")" : "";
  if (!allocation) {
    $("plan").replaceChildren(el("p", { class: "muted" }, "no plan for this job yet"));
    return null;
  }
  const x = allocation.explanation || {};
  const layout = (c) => (c ? "tp " + c.tp + " × pp " + c.pp + " × dp " + c.dp : "–");
  const facts = [
    ["action", allocation.action + ": " + allocation.previous_workers + " → " + allocation.workers + " workers"],
    ["why", allocation.reason || "–"], ["nodes", allocation.nodes.join(", ") || "–"],
    ["layout", layout(allocation.config)],
    ["throughput", amount(x.predicted_throughput_old) + " → " + amount(x.predicted_throughput) + " FLOP/s"],
    ["predicted WAF", amount(x.predicted_waf) + " (weight " + fixed(x.weight, 1) + ")"],
    ["transition", (x.transition || "–") + ", state from " + (x.state_source || "–")],
    ["downtime", fixed(x.predicted_downtime_s, 1) + " s predicted"],
  ];
  const alternatives = (x.alternatives || []).map((a) => el("tr", {},
    el("td", { class: "num" }, a.workers), el("td", {}, layout(a.config)),
    el("td", { class: "num" }, amount(a.predicted_throughput)),
    el("td", { class: "num" }, amount(a.shortfall))));
  $("plan").replaceChildren(
    el("dl", { class: "facts" }, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
    alternatives.length ? el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "alternative workers"),
      el("th", {}, "layout"), el("th", {}, "throughput"), el("th", {}, "shortfall"))),
    el("tbody", {}, ...alternatives)) : el("p", { class: "muted" }, "no alternatives recorded"));
  return x.predicted_waf ?? null;
}

async function refreshLogs(job) {
  if (!job.generation) return;
  const rank = Number($("rank").value || 0);
  const response = await get("/v1/jobs/" + encodeURIComponent(job.id) + "/logs?tail=200&rank=" + rank);
  const logs = $("logs");
  const atEnd = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
  logs.textContent = response.ok ? await response.text() : "(" + (await reason(response)) + ")";
  if (atEnd) logs.scrollTop = logs.scrollHeight; // follow the output unless scrolled back
}

async function refreshJob() {
  const job = await getJson("/v1/jobs/" + encodeURIComponent(JOB_ID));
  renderJob(job);
  const waf = renderPlan(await planOf(job), job);
  sample(job.state === "RUNNING" ? [job] : [], waf);
  await refreshLogs(job);
}

// ---- throughput chart -----------------------------------------------------------------------

function sample(running, waf) {
  const t = Date.now() / 1000;
  if (lastSteps && t - lastSteps.t < 1) return; // an event's extra refresh: too short to rate
  const byJob = Object.fromEntries(running.map((job) => [job.id, job.step]));
  const steps = {};
  if (lastSteps) {
    for (const job of running) {
      const before = lastSteps.byJob[job.id];
      if (before !== undefined) steps[job.name] = Math.max(job.step - before, 0) / (t - lastSteps.t);
    }
  }
  lastSteps = { t, byJob };
  samples.push({ t, steps, waf });
  if (samples.length > SAMPLES_MAX) samples.shift();
  drawChart($("chart-steps"), seriesOf((s) => Object.entries(s.steps)));
  drawChart($("chart-waf"), seriesOf((s) => (s.waf === null ? [] : [["WAF", s.waf]])));
}

function seriesOf(pick) {
  const series = {};
  for (const s of samples) {
    for (const [name, value] of pick(s)) (series[name] ||= []).push([s.t, value]);
  }
  return series;
}

// 36300000000 → "36.3G": axis labels stay short whatever the unit's scale.
function si(value) {
  const prefixes = ["", "k", "M", "G", "T", "P", "E"];
  let scaled = value;
  let power = 0;
  while (Math.abs(scaled) >= 1000 && power < prefixes.length - 1) {
    scaled /= 1000;
    power += 1;
  }
  return String(Number(scaled.toPrecision(3))) + prefixes[power];
}

function drawChart(svg, series) {
  const width = svg.clientWidth || 600;
  const height = svg.clientHeight || 120;
  const pad = { left: 40, right: 8, top: 8, bottom: 16 };
  svg.setAttribute("viewBox", "0 0 " + width + " " + height);
  const ns = "http://www.w3.org/2000/svg";
  const make = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const points = Object.values(series).flat();
  if (!points.length) {
    svg.replaceChildren(make("text", { x: pad.left, y: height / 2 }, "collecting samples…"));
    return;
  }
  const t0 = samples[0].t;
  const t1 = Math.max(samples[samples.length - 1].t, t0 + 1);
  const top = Math.max(...points.map(([, v]) => v)) * 1.1 || 1;
  const x = (t) => pad.left + ((t - t0) / (t1 - t0)) * (width - pad.left - pad.right);
  const y = (v) => height - pad.bottom - (v / top) * (height - pad.top - pad.bottom);
  const children = [
    make("line", { class: "axis", x1: pad.left, y1: y(0), x2: width - pad.right, y2: y(0) }),
    make("line", { class: "axis", x1: pad.left, y1: pad.top, x2: pad.left, y2: y(0) }),
    make("text", { x: 2, y: pad.top + 8 }, si(top)),
    make("text", { x: 2, y: y(0) }, "0"),
    make("text", { x: pad.left, y: height - 2 }, Math.round(t1 - t0) + " s"),
  ];
  Object.entries(series).forEach(([name, values], index) => {
    const line = values.map(([t, v]) => x(t).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
    const colour = "series-" + (index % 4);
    children.push(make("polyline", { class: colour, points: line, "data-series": name }));
    const [tLast, vLast] = values[values.length - 1]; // a lone sample still shows
    children.push(make("circle", { class: colour, cx: x(tLast), cy: y(vLast), r: 2.5 }));
    children.push(make("text", { x: width - pad.right - 140, y: pad.top + 10 + 12 * index },
      name + " " + si(vLast)));
  });
  svg.replaceChildren(...children);
}

// ---- live event feed ------------------------------------------------------------------------

function summarize(type, d) {
  switch (type) {
    case "failure.detected":
      return describeFailure(d) + (d.job_id ? " in " + d.job_id : "") + (d.message ? ": " + d.message : "");
    case "job.state_changed":
      return d.job_id + ": " + d.old + " → " + d.new + " (" + d.reason + ")";
    case "job.submitted":
      return d.job_id + " submitted (" + d.name + ")";
    case "plan.created":
      return "plan " + d.seq + ": " + d.trigger + ", expected WAF " + amount(d.expected_waf);
    case "transition.started":
      return d.job_id + ": " + d.action + " " + d.from_workers + " → " + d.to_workers + " workers";
    case "transition.completed":
      return d.job_id + ": back at world size " + d.world_size + " from step " + d.resumed_step +
        " in " + fixed(d.duration_s, 2) + " s";
    case "node.state_changed":
      return d.node_id + ": " + d.old + " → " + d.new + (d.reason ? " (" + d.reason + ")" : "");
    default:
      return d.node_id ? d.node_id : JSON.stringify(d).slice(0, 160);
  }
}

function showEvent(event) {
  const d = event.data || {};
  if (JOB_ID && d.job_id !== JOB_ID && !event.type.startsWith("node.")) return;
  // An advisory (a straggler: action "report") interrupts nothing; it is shown as a warning.
  const failure = event.type === "failure.detected";
  const kind = failure && d.action !== "report" ? "failure-event"
    : failure || event.type.startsWith("node.") ? "warning-event" : "";
  const feed = $("feed");
  feed.prepend(el("li", { class: kind, "data-type": event.type },
    el("time", {}, new Date(event.time).toLocaleTimeString([], { hour12: false })),
    el("span", { class: "type" }, event.type), summarize(event.type, d)));
  while (feed.children.length > FEED_MAX) feed.lastChild.remove();
  if (REFRESHING_EVENTS.test(event.type)) soon();
}

// One SSE message: its id, and the CloudEvent in its data lines.
function parseMessage(block) {
  let id = null;
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("id:")) id = line.slice(3).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  return { id, event: data.length ? JSON.parse(data.join("\n")) : null };
}

async function readStream(response, onId) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer = (buffer + value).replace(/\r\n/g, "\n"); // sse-starlette ends lines with CRLF
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const { id, event } = parseMessage(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
      if (event) showEvent(event);
      if (id) onId(id);
    }
  }
}

async function follow() {
  let lastId = null; // a reconnect resumes after the last event shown
  for (;;) {
    try {
      const response = await get("/v1/events", lastId ? { "Last-Event-ID": lastId } : {});
      if (!response.ok) throw new Error("event stream: " + (await reason(response)));
      setLive(true);
      await readStream(response, (id) => { lastId = id; });
    } catch (error) {
      if (error instanceof Unauthorized) await needToken(error);
      else console.warn(error);
    }
    setLive(false);
    await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
  }
}

function setLive(on) {
  const pill = $("live");
  pill.className = "pill " + (on ? "on" : "off");
  pill.textContent = on ? "feed: live" : "feed: reconnecting";
}

// ---- refresh loop ---------------------------------------------------------------------------

// One refresh at a time: a request made while one runs is folded into one more after it.
let refreshing = false;
let refreshAgain = false;

async function refresh() {
  if (refreshing) {
    refreshAgain = true;
    return;
  }
  refreshing = true;
  clearTimeout(refreshTimer);
  try {
    await (JOB_ID ? refreshJob() : refreshCluster());
    $("error").hidden = true;
    $("updated").textContent = "updated " + new Date().toLocaleTimeString([], { hour12: false });
  } catch (error) {
    if (error instanceof Unauthorized) {
      await needToken(error);
      refreshAgain = true;
    } else {
      $("error").textContent = error.message;
      $("error").hidden = false;
    }
  } finally {
    refreshing = false;
  }
  if (refreshAgain) {
    refreshAgain = false;
    return refresh();
  }
  refreshTimer = setTimeout(refresh, POLL_MS);
}

// An event that changes what the page shows refreshes it now rather than at the next poll.
let soonTimer = null;
function soon() {
  if (soonTimer) return;
  soonTimer = setTimeout(() => { soonTimer = null; refresh(); }, 150);
}

function start() {
  $(JOB_ID ? "job" : "cluster").hidden = false;
  $("title").textContent = JOB_ID ? "job " + JOB_ID : "cluster";
  $("waf-caption").textContent = JOB_ID ? "this job's predicted WAF (its plan)" : "plan WAF (expected)";
  document.title = "Unicron — " + (JOB_ID || "cluster");
  $("rank").onchange = () => { logsRank = Number($("rank").value); soon(); };
  $("forget").onclick = () => { sessionStorage.removeItem(TOKEN_KEY); location.reload(); };
  showForget();
  refresh();
  follow();
}

start();
