// Page-building helpers shared by the views: elements from data, badges, times and numbers.

export const $ = (id) => document.getElementById(id);

// Every value from the API goes in as text, never as markup.
export function el(tag, attrs, ...children) {
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

export const badge = (state) => el("span", { class: "badge " + state }, state);
export const clock = (seconds) => new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
export const fixed = (value, digits) => (value === null || value === undefined ? "–" : value.toFixed(digits));

export const amount = (value) => (value === null || value === undefined ? "–" : si(value));

export function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

export function describeFailure(failure) {
  if (!failure) return "";
  const where = [failure.rank !== null ? "rank " + failure.rank : null, failure.node_id]
    .filter((part) => part !== null && part !== undefined)
    .join(" on ");
  const text = failure.kind + " (" + failure.category + ", " + failure.severity + ")";
  return text + (where ? " — " + where : "") + " → " + failure.action;
}

export function failureCell(failure) {
  if (!failure) return el("td", {}, "–");
  const at = failure.detected_at || failure.observed_at;
  return el("td", { class: "failure", title: failure.message || "" },
    describeFailure(failure), el("br"), "gen " + failure.generation + ", " + clock(at));
}

// 36300000000 → "36.3G": axis labels stay short whatever the unit's scale.
export function si(value) {
  const prefixes = ["", "k", "M", "G", "T", "P", "E"];
  let scaled = value;
  let power = 0;
  while (Math.abs(scaled) >= 1000 && power < prefixes.length - 1) {
    scaled /= 1000;
    power += 1;
  }
  return String(Number(scaled.toPrecision(3))) + prefixes[power];
}
