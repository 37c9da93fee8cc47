// The live event feed, read from GET /v1/events with fetch and a stream reader rather than
// EventSource: EventSource cannot send an Authorization header, and a token in the URL would
// end up in access logs. A reconnect sends Last-Event-ID and resumes after the last event.
import { get, needToken, reason, Unauthorized } from "./api.js";
import { $, amount, describeFailure, el, fixed } from "./dom.js";

const RECONNECT_MS = 1000;
const FEED_MAX = 200;
const REFRESHING_EVENTS = /^(job|failure|plan|transition|node)\./;

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

function showEvent(event, jobId, onChange) {
  const d = event.data || {};
  if (jobId && d.job_id !== jobId && !event.type.startsWith("node.")) return;
  // An advisory (a straggler: action "report") interrupts nothing; it is shown as a warning.
  const failure = event.type === "failure.detected";
  const kind = failure && d.action !== "report" ? "failure-event"
    : failure || event.type.startsWith("node.") ? "warning-event" : "";
  const feed = $("feed");
  feed.prepend(el("li", { class: kind, "data-type": event.type },
    el("time", {}, new Date(event.time).toLocaleTimeString([], { hour12: false })),
    el("span", { class: "type" }, event.type), summarize(event.type, d)));
  while (feed.children.length > FEED_MAX) feed.lastChild.remove();
  if (REFRESHING_EVENTS.test(event.type)) onChange();
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

async function readStream(response, onEvent, onId) {
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
      if (event) onEvent(event);
      if (id) onId(id);
    }
  }
}

// Show the events (only those of ``jobId`` and of nodes when given) for as long as the page
// is open; ``onChange`` is called for each that changes what the page shows.
export async function follow(jobId, onChange) {
  const onEvent = (event) => showEvent(event, jobId, onChange);
  let lastId = null; // a reconnect resumes after the last event shown
  for (;;) {
    try {
      const response = await get("/v1/events", lastId ? { "Last-Event-ID": lastId } : {});
      if (!response.ok) throw new Error("event stream: " + (await reason(response)));
      setLive(true);
      await readStream(response, onEvent, (id) => { lastId = id; });
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
