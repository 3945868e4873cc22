// Line and bar charts with Plotly's basic bundle (vendored: api/static/vendor, see api/dashboard.py).

function themeColors() {
  const css = getComputedStyle(document.documentElement);
  return {
    fg: css.getPropertyValue("--fg").trim(),
    grid: css.getPropertyValue("--grid").trim(),
  };
}

export function plotlyReady() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  return new Promise((resolve) => {
    window.addEventListener("load", () => resolve(window.Plotly), { once: true });
  });
}

/** Plotly's default colour cycle: one colour per run or series, its smoothed and raw traces alike. */
export const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];

/**
 * Draw or update the chart in `node`: `traces` is [{name, x, y}], each optionally with `color`,
 * `opacity`, `legend` (false: left out of the legend), `hover` (false: no hover label) and
 * `meta` (kept on the trace, for tests), `dash` (Plotly's line dash, e.g. "dot").
 * `hovermode`: "closest" (one trace), or "x unified" (every trace at that x, as Compare wants).
 * Keeps the user's zoom across updates while
 * `uirevision` stays the same, so live points do not reset a zoomed view. `yFormat`/`xFormat`:
 * d3 formats for the values (ticks and hover), e.g. ".3s" for bytes as 365M; `ySuffix` a unit
 * after each (" s", "B": 365MB). `xHover` ({title, text}): how hover labels write an x value
 * when no d3 format can (seconds as "3m51s"): `text(x)` under `title`, never the raw number.
 * `yHover(y)`: how hover labels write a y value (`fmtBytes`, `fmtRate`: the CLI's digits for
 * the same point, which no d3 format gives), in place of `yFormat` and `ySuffix`.
 */
export async function lineChart(node, traces, {
  title, xTitle = "step", yLog = false, yFormat, xFormat, uirevision = "keep", hovermode = "closest",
  ySuffix = "", xHover, yHover,
} = {}) {
  const Plotly = await plotlyReady();
  const { fg, grid } = themeColors();
  const data = traces.map((t) => ({
    type: "scatter",
    mode: t.x.length > 60 ? "lines" : "lines+markers",
    marker: { size: 4, ...(t.color ? { color: t.color } : {}) },
    name: t.name,
    x: t.x,
    y: t.y,
    line: { width: 1.5, ...(t.color ? { color: t.color } : {}), ...(t.dash ? { dash: t.dash } : {}) },
    ...(t.opacity !== undefined ? { opacity: t.opacity } : {}),
    ...(t.legend === false ? { showlegend: false } : {}),
    ...(t.meta !== undefined ? { meta: t.meta } : {}),
    ...(t.hover === false ? { hoverinfo: "skip" } : {
      ...(xHover ? { customdata: t.x.map(xHover.text) } : {}),
      ...(yHover ? { text: t.y.map(yHover) } : {}),
      hovertemplate: `${t.name} ${yHover ? "%{text}" : `%{y:${yFormat ?? ".4g"}}${ySuffix}`} @ ${
        xHover ? `${xHover.title} %{customdata}` : `${xTitle} %{x${xFormat ? `:${xFormat}` : ""}}`}<extra></extra>`,
    }),
  }));
  const legend = traces.filter((t) => t.legend !== false).length > 1;
  const layout = {
    title: { text: title, font: { size: 13 }, x: 0.02, xanchor: "left" },
    uirevision,
    margin: { l: 52, r: 12, t: 32, b: legend ? 64 : 36 },
    height: legend ? 272 : 240,
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: fg, size: 11 },
    xaxis: { title: { text: xTitle }, gridcolor: grid, zerolinecolor: grid,
      ...(xFormat ? { tickformat: xFormat } : {}),
      // "x unified" heads its label with the x value, which only a d3 format could write
      ...(xHover ? { unifiedhovertitle: { text: xHover.title } } : {}) },
    yaxis: { gridcolor: grid, zerolinecolor: grid, type: yLog ? "log" : "linear",
      exponentformat: "e", ...(yFormat ? { tickformat: yFormat } : {}), ticksuffix: ySuffix },
    hovermode,
    // The legend under the plot: at its top right, Plotly's toolbar covered it on hover.
    showlegend: legend,
    legend: { orientation: "h", x: 0, y: -0.3, yanchor: "top" },
  };
  await Plotly.react(node, data, layout, { displaylogo: false, responsive: true });
}

export function purge(node) {
  if (window.Plotly && node) window.Plotly.purge(node);
}

/** Call `handler([x0, x1])` when the user zooms `node`'s x axis, `handler(null)` on reset. */
export function onZoom(node, handler) {
  node.on("plotly_relayout", (change) => {
    if (change["xaxis.autorange"]) handler(null);
    else if ("xaxis.range[0]" in change) handler([change["xaxis.range[0]"], change["xaxis.range[1]"]]);
    else if (Array.isArray(change["xaxis.range"])) handler(change["xaxis.range"]);
  });
}

/** Draw a bar chart in `node`: one bar per `x` (e.g. days) of height `y`. */
export async function barChart(node, x, y, { title, yTitle } = {}) {
  const Plotly = await plotlyReady();
  const { fg, grid } = themeColors();
  const layout = {
    title: { text: title, font: { size: 13 }, x: 0.02, xanchor: "left" },
    margin: { l: 52, r: 12, t: 32, b: 36 },
    height: 240,
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: fg, size: 11 },
    xaxis: { type: "category", gridcolor: grid },
    yaxis: { title: { text: yTitle ?? "" }, gridcolor: grid, zerolinecolor: grid, rangemode: "tozero" },
    showlegend: false,
  };
  const data = [{ type: "bar", x, y, hovertemplate: "%{x}: %{y:.2f}<extra></extra>" }];
  await Plotly.react(node, data, layout, { displaylogo: false, responsive: true });
}
