// The two views of the page: the cluster (nodes x slots, jobs) and one job (its workers, plan,
// output and history). Each refresh reads the API and redraws from what came back.
import { get, getJson, reason } from "./api.js";
import { sample } from "./chart.js";
import { $, amount, badge, clock, describeFailure, el, failureCell, fill, fixed } from "./dom.js";

const DETAILS_MAX = 20; // active jobs whose full record (workers) the node grid reads
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

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
      // a GPU its agent took out of service after a fault: no slot, but the node is short of it
      for (const [gpu, why] of Object.entries(node.retired_gpus || {})) {
        cells.push(el("span", { class: "cell retired", title: "GPU " + gpu + " retired: " + why },
          "GPU " + gpu + " retired"));
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

export async function refreshCluster() {
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
    const chosen = select.value || "0"; // a world that changed size keeps the rank shown
    select.replaceChildren(...Array.from({ length: ranks }, (_, r) => el("option", { value: r }, r)));
    select.value = chosen;
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

export async function refreshJob(jobId) {
  const job = await getJson("/v1/jobs/" + encodeURIComponent(jobId));
  renderJob(job);
  const waf = renderPlan(await planOf(job), job);
  sample(job.state === "RUNNING" ? [job] : [], waf);
  await refreshLogs(job);
}
