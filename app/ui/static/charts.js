// Hand-written SVG charts: a line chart with optional 95% interval bands, and a sparkline.
import { s } from "./dom.js";

const W = 520, H = 300, M = { l: 52, r: 16, t: 16, b: 42 };
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563"];

function ticks(lo, hi, n = 5) {
  if (hi <= lo) return [lo];
  const step0 = (hi - lo) / n;
  const mag = 10 ** Math.floor(Math.log10(step0));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((st) => st >= step0) || step0;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

/**
 * series: [{name, points: [{x, y, lo?, hi?}], dash?}]; opts: {title, x, y, yMin, yMax, logX}.
 * Each series is one <path class="line" data-series=name> with a <circle> per point; a band (<polygon
 * class="band">) where points carry lo/hi.
 */
export function lineChart(series, opts = {}) {
  const pts = series.flatMap((se) => se.points);
  const tx = opts.logX ? (v) => Math.log2(Math.max(v, 1e-9)) : (v) => v;
  const xs = pts.map((p) => tx(p.x));
  const ys = pts.flatMap((p) => [p.y, p.lo ?? p.y, p.hi ?? p.y]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  let y0 = opts.yMin ?? Math.min(...ys), y1 = opts.yMax ?? Math.max(...ys);
  if (y0 === y1) { y0 -= 1; y1 += 1; }
  const px = (v) => M.l + ((tx(v) - x0) / (x1 - x0)) * (W - M.l - M.r);
  const py = (v) => H - M.b - ((v - y0) / (y1 - y0)) * (H - M.t - M.b);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": opts.title || "chart" });
  const xt = opts.logX ? ticks(x0, x1).filter(Number.isInteger).map((e) => 2 ** e) : ticks(x0, x1);
  for (const v of xt) {
    svg.append(s("line", { x1: px(v), x2: px(v), y1: M.t, y2: H - M.b, class: "grid" }),
      s("text", { x: px(v), y: H - M.b + 16, "text-anchor": "middle", class: "tick" }, +v.toPrecision(4)));
  }
  for (const v of ticks(y0, y1)) {
    svg.append(s("line", { x1: M.l, x2: W - M.r, y1: py(v), y2: py(v), class: "grid" }),
      s("text", { x: M.l - 6, y: py(v) + 4, "text-anchor": "end", class: "tick" }, +v.toPrecision(4)));
  }
  svg.append(s("text", { x: (M.l + W - M.r) / 2, y: H - 6, "text-anchor": "middle", class: "axis" }, opts.x || ""),
    s("text", { x: 12, y: (M.t + H - M.b) / 2, transform: `rotate(-90 12 ${(M.t + H - M.b) / 2})`,
      "text-anchor": "middle", class: "axis" }, opts.y || ""));
  series.forEach((se, i) => {
    const color = se.color || COLORS[i % COLORS.length];
    const p = [...se.points].sort((a, b) => a.x - b.x);
    if (p.length && p.every((q) => q.lo !== undefined && q.hi !== undefined)) {
      const upper = p.map((q) => `${px(q.x)},${py(q.hi)}`);
      const lower = p.slice().reverse().map((q) => `${px(q.x)},${py(q.lo)}`);
      svg.append(s("polygon", { points: [...upper, ...lower].join(" "), class: "band", fill: color }));
    }
    const d = p.map((q, j) => `${j ? "L" : "M"}${px(q.x).toFixed(1)},${py(q.y).toFixed(1)}`).join("");
    svg.append(s("path", { d, class: "line", stroke: color, "stroke-dasharray": se.dash || null, "data-series": se.name }));
    for (const q of p) {
      svg.append(s("circle", { cx: px(q.x), cy: py(q.y), r: 3, fill: color },
        s("title", null, `${se.name}: x=${+q.x.toPrecision(4)} y=${+q.y.toPrecision(4)}` +
          (q.lo !== undefined ? ` [${+q.lo.toPrecision(3)}, ${+q.hi.toPrecision(3)}]` : ""))));
    }
    svg.append(s("rect", { x: M.l + 8, y: M.t + 4 + i * 16, width: 10, height: 10, fill: color }),
      s("text", { x: M.l + 22, y: M.t + 13 + i * 16, class: "legend" }, se.name));
  });
  return svg;
}

/** A small line of the last values (no axes). */
export function sparkline(values, { width = 160, height = 36 } = {}) {
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "spark" });
  if (values.length < 2) return svg;
  const hi = Math.max(...values, 1e-9);
  const d = values.map((v, i) => `${i ? "L" : "M"}${((i / (values.length - 1)) * width).toFixed(1)},` +
    `${(height - 2 - (v / hi) * (height - 4)).toFixed(1)}`).join("");
  svg.append(s("path", { d, class: "line" }));
  return svg;
}

/** Horizontal bars, one per [label, value]. */
export function bars(entries, { width = 360 } = {}) {
  const rowH = 20, hi = Math.max(...entries.map((e) => e[1]), 1);
  const svg = s("svg", { viewBox: `0 0 ${width} ${Math.max(rowH * entries.length, rowH)}`, class: "bars" });
  entries.forEach(([label, value], i) => {
    svg.append(s("text", { x: 0, y: i * rowH + 14, class: "tick" }, String(label).slice(0, 14)),
      s("rect", { x: 110, y: i * rowH + 3, height: rowH - 6, width: Math.max(1, ((width - 160) * value) / hi),
        class: "bar", "data-label": label }),
      s("text", { x: 116 + ((width - 160) * value) / hi, y: i * rowH + 14, class: "tick" }, String(value)));
  });
  return svg;
}
