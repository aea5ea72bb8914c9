// Element builders: text goes in as text nodes (never HTML), so nothing from the service is markup.
const SVG_NS = "http://www.w3.org/2000/svg";
const PROPS = new Set(["value", "checked", "selected", "readOnly", "disabled", "hidden"]);

function build(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.setAttribute("class", v);
    else if (PROPS.has(k) && !(el instanceof SVGElement)) el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const h = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);
export const s = (tag, attrs, ...children) => build(document.createElementNS(SVG_NS, tag), attrs, children);

export function table(columns, rows, attrs = {}) {
  return h("table", attrs,
    h("thead", null, h("tr", null, columns.map((c) => h("th", null, c)))),
    h("tbody", null, rows.map((r) => (r instanceof Node ? r : h("tr", null, r.map((v) => h("td", null, v)))))));
}

export function fmt(x, digits = 2) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return x.toLocaleString("en-US");
  return x.toFixed(digits);
}

export function errorBox(err) {
  return h("p", { class: "error", role: "alert" }, err.status ? `${err.status}: ${err.message}` : String(err.message || err));
}
