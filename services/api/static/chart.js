// The throughput chart: samples taken while the page is open (each running job's steps/s,
// and the plan's WAF), drawn as inline SVG polylines; no chart library.
import { $, si } from "./dom.js";

const SAMPLES_MAX = 180;
const samples = []; // {t, steps: {label: steps/s}, waf}
let lastSteps = null; // {t, byJob: {id: step}} of the previous poll

export function sample(running, waf) {
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
