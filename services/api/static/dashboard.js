// The Unicron dashboard: reads the /v1 API and its event stream, never writes (see api.js for
// the token). /ui shows the cluster, /ui/jobs/{id} one job; both refresh every POLL_MS and at
// once when the feed brings an event that changes what they show.
import { needToken, showForget, TOKEN_KEY, Unauthorized } from "./api.js";
import { $ } from "./dom.js";
import { follow } from "./feed.js";
import { refreshCluster, refreshJob } from "./pages.js";

const POLL_MS = 2000;
const jobPath = location.pathname.match(/^\/ui\/jobs\/([^/]+)\/?$/);
const JOB_ID = jobPath ? decodeURIComponent(jobPath[1]) : null;
let refreshTimer = null;

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
    await (JOB_ID ? refreshJob(JOB_ID) : refreshCluster());
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
  $("rank").onchange = soon;
  $("forget").onclick = () => { sessionStorage.removeItem(TOKEN_KEY); location.reload(); };
  showForget();
  refresh();
  follow(JOB_ID, soon);
}

start();

