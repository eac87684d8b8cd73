// Training Monitor viewer: one script for every page; the path picks the page, the JSON API feeds it.
// Why plain DOM code: no build step and no CDN (the monitor runs offline next to a training run).
// Every value from the store is inserted as text (never as HTML), and links only to http(s) (webUrl). Pages
// re-fetch every refresh interval and redraw only when the data changed, so a run in progress updates in place.
"use strict";

const app = document.getElementById("app");
const REFRESH_MS = Number(app.dataset.refreshMs) || 3000;
const state = { lastJson: null, turn: 0, playing: null, tokenMode: null };

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el[k] = v; else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const svgNS = "http://www.w3.org/2000/svg";
function s(tag, attrs) {
  const el = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  return el;
}
const num = (v, d = 3) => (v === null || v === undefined ? "–" : Number(v).toFixed(d));
const pct = (v) => (v === null || v === undefined ? "–" : (100 * v).toFixed(0) + "%");
const badge = (status) => h("span", { class: "badge " + (status || ""), "data-testid": "status" }, status || "?");
const when = (t) => (t ? String(t).replace("T", " ").slice(0, 19) : "–");
// An address becomes a link only when it is http(s) (a relative path resolves to this page's): the store holds
// addresses others sent (a gym's live view), and a "javascript:" or "data:" link would run in this page.
function webUrl(address) {
  try {
    const url = new URL(String(address), location.href);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch { return null; }
}
const link = (href, text) => (webUrl(href) ? h("a", { href: webUrl(href) }, text) : text);

async function getJson(path) {
  const res = await fetch(path, { cache: "no-store" });
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
  return res.text();
}

// ---- routing and live refresh -------------------------------------------------------------------
function route() {
  const p = location.pathname.replace(/\/+$/, "");
  let m;
  if (p === "") return { api: "/api/trainings", render: renderRuns };
  if ((m = p.match(/^\/(steps|evals|baselines)\/(\d+)$/))) return { api: `/api/${m[1]}/${m[2]}`, render: renderGroups };
  if ((m = p.match(/^\/rollouts\/(\d+)$/))) return { api: `/api/rollouts/${m[1]}`, render: renderRollout };
  if ((m = p.match(/^\/(\d+)$/))) return { api: `/api/trainings/${m[1]}`, render: renderRun };
  return null;
}

async function refresh() {
  const r = route();
  if (!r) { app.replaceChildren(h("p", {}, "Unknown page.")); return; }
  try {
    const text = await getJson(r.api);
    document.getElementById("live").textContent = "updated " + new Date().toLocaleTimeString();
    if (text === state.lastJson) { if (r.render === renderRun) loadRollouts(); return; }
    state.lastJson = text;
    r.render(JSON.parse(text));
  } catch (err) {
    document.getElementById("live").textContent = "offline: " + err.message;
  }
}

// ---- runs ---------------------------------------------------------------------------------------
function renderRuns(runs) {
  const rows = runs.map((r) => h("tr", { "data-testid": "run-row" },
    h("td", {}, link(`/${r.id}`, `#${r.id}`)), h("td", {}, link(`/${r.id}`, r.run_name || "(unnamed)")),
    h("td", {}, r.project || ""), h("td", {}, badge(r.status)), h("td", {}, r.current_phase || ""),
    h("td", {}, when(r.start_time)), h("td", {}, when(r.end_time)), h("td", {}, r.num_rollouts)));
  app.replaceChildren(h("h1", {}, "Training runs"),
    runs.length ? h("table", {}, h("tr", {}, ...["id", "run", "project", "status", "phase", "started", "ended",
      "rollouts"].map((c) => h("th", {}, c))), rows) : h("p", { class: "muted" }, "No runs yet."));
}

// ---- one run ------------------------------------------------------------------------------------
// Round tick values for [lo, hi]: about n of them, at 1, 2 or 5 times a power of ten (whole numbers when
// ``whole``: steps).
function ticks(lo, hi, n, whole = false) {
  const span = hi - lo || Math.abs(hi) || 1;
  let step = Math.pow(10, Math.floor(Math.log10(span / n)));
  for (const k of [1, 2, 5, 10]) { if (span / (k * step) <= n) { step *= k; break; } }
  if (whole) step = Math.max(1, Math.round(step));
  const out = [];
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}
const tickText = (v) => (v !== 0 && Math.abs(v) < 0.01 ? v.toExponential(1).replace(".0e", "e")
  : Number(v.toPrecision(3)).toString());

// A line chart with axes: x the step (``xLabel`` says which numbering), y the quantity and its unit (``yLabel``),
// both with ticks; ``empty`` is said when there is nothing to draw. ``also``: { points, color, label } drawn on
// the same axes as dots (e.g. the baseline beside the evaluations); ``yFormat`` writes the y ticks (percent).
function chart(points, key, label, color, { yMax = null, id = key, also = null, yLabel = label, xLabel = "step",
  empty = "no values yet", yFormat = tickText } = {}) {
  const W = 420, H = 200, L = 58, R = 14, T = 26, B = 40;
  const svg = s("svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, "data-testid": `chart-${id}` });
  const text = (x, y, content, attrs = {}) => {
    const t = s("text", { x, y, "font-size": 11, fill: "#6a7683", ...attrs });
    t.textContent = content;
    svg.append(t);
    return t;
  };
  text(L, 16, label, { "font-size": 12, fill: "#1d232b", class: "chart-title" });
  const pts = points.filter((p) => Number.isFinite(p[key]));
  const more = also ? also.points.filter((p) => Number.isFinite(p[key])) : [];
  if (!pts.length && !more.length) {
    text(W / 2, H / 2, empty, { "text-anchor": "middle", "data-testid": "chart-empty" });
    return svg;
  }
  const xs = [...pts, ...more].map((p) => p.step), ys = [...pts, ...more].map((p) => p[key]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  let y0 = Math.min(0, ...ys), y1 = yMax !== null ? Math.max(yMax, ...ys) : Math.max(...ys);
  if (y1 <= y0) y1 = y0 + (Math.abs(y0) || 1);
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  // the axes, their ticks and labels: x below, y on the left (the label turned along it)
  svg.append(s("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#9aa4ae", class: "x-axis" }));
  svg.append(s("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#9aa4ae", class: "y-axis" }));
  for (const v of ticks(x0, x1, 6, true)) {
    svg.append(s("line", { x1: X(v), y1: H - B, x2: X(v), y2: H - B + 4, stroke: "#9aa4ae" }));
    text(X(v), H - B + 15, String(v), { "text-anchor": "middle", class: "x-tick" });
  }
  for (const v of ticks(y0, y1, 4)) {
    svg.append(s("line", { x1: L, y1: Y(v), x2: W - R, y2: Y(v), stroke: "#eef0f2" }));
    svg.append(s("line", { x1: L - 4, y1: Y(v), x2: L, y2: Y(v), stroke: "#9aa4ae" }));
    text(L - 6, Y(v) + 4, yFormat(v), { "text-anchor": "end", class: "y-tick" });
  }
  text((L + W - R) / 2, H - 6, xLabel, { "text-anchor": "middle", class: "x-label", "data-testid": "x-label" });
  text(12, (T + H - B) / 2, yLabel, { "text-anchor": "middle", class: "y-label", "data-testid": "y-label",
    transform: `rotate(-90 12 ${(T + H - B) / 2})` });
  svg.append(s("polyline", { points: pts.map((p) => `${X(p.step)},${Y(p[key])}`).join(" "), fill: "none",
    stroke: color, "stroke-width": 2 }));
  for (const [series, colour, cls, name] of [[pts, color, "point", ""], [more, also && also.color, "point also",
    also ? also.label + " " : ""]]) {
    for (const p of series) {
      const dot = s("circle", { cx: X(p.step), cy: Y(p[key]), r: cls === "point" ? 3.5 : 5, fill: colour, class: cls });
      const tip = s("title", {});
      tip.textContent = `${name}${xLabel} ${p.step}: ${num(p[key])}`;
      dot.append(tip);
      svg.append(dot);
    }
  }
  if (also && more.length) text(W - R, 16, "● " + also.label, { "font-size": 11, fill: also.color, "text-anchor": "end" });
  return svg;
}
const percent = (v) => `${Math.round(100 * v)}%`;
// The x axes: the rollout curves count policy versions (the rollouts of version k train console step k+1);
// the trainer's curves count the training steps (console step N, checkpoint globalstep N-1).
const VERSION_AXIS = "policy version sampled (= step − 1)", TRAIN_AXIS = "training step";

function summaryCells(sm) {
  return [h("td", {}, sm.rollouts), h("td", {}, sm.completed), h("td", {}, num(sm.reward_mean)),
    h("td", {}, pct(sm.success_rate))];
}

function parentTable(rows, kind, stepLabel) {
  if (!rows.length) return h("p", { class: "muted" }, `No ${kind} yet.`);
  const health = kind === "steps";   // the trainer's verdict on the update that trained the step's rollouts
  return h("table", { "data-testid": `${kind}-table` },
    h("tr", {}, ...[stepLabel, "status", "started", "rollouts", "completed", "mean reward", "success",
      ...(health ? ["health"] : [])].map((c) => h("th", {}, c))),
    rows.map((r) => h("tr", {}, h("td", {}, link(`/${kind}/${r.id}`, `${r.step}${r.batch ? "/" + r.batch : ""}`)),
      h("td", {}, badge(r.status)), h("td", {}, when(r.start_time)), ...summaryCells(r.summary),
      ...(health ? [h("td", {}, healthCell(r.update))] : []))));
}

function healthCell(update) {
  if (!update) return h("span", { class: "muted" }, "–");
  const values = Object.entries(update.health || {}).map(([k, v]) => `${k} ${num(v, 4)}`).join("\n");
  const found = update.anomalies || [];
  if (!found.length) return h("span", { class: "ok", title: values, "data-testid": "health-ok" }, "ok");
  return h("span", { class: "anomaly", title: found.map((a) => a.line).join("\n\n") + "\n\n" + values,
    "data-testid": "health-anomaly" }, found.map((a) => `${a.name} ${num(a.value, 3)} (${a.action})`).join(", "));
}

function anomalyList(anomalies) {
  if (!anomalies.length) return h("p", { class: "muted", "data-testid": "health-none" }, "No health check tripped.");
  return h("ul", { class: "anomalies" }, anomalies.map((a) => h("li", { "data-testid": "health-finding" },
    h("b", {}, `${a.action === "stop" ? "STOP" : "warn"} · training step ${a.train_step}: `), a.line)));
}

// The run's verdict on learning (cua_rl/verdict.py), filed on the run when it finished: held-out greedy success
// of the starting policy (the baseline, step 0) and the last step (an evaluation), each rise with its interval.
function verdictBox(verdict) {
  if (!verdict || !verdict.summary) return [];
  return [h("h2", {}, "Verdict on learning (held-out, greedy: the baseline is the starting policy)"),
    h("div", { class: "card", "data-testid": "verdict" }, h("b", {}, verdict.summary),
      h("ul", {}, ...(verdict.lines || []).map((line) => h("li", {}, line))))];
}

function renderRun(run) {
  const sm = run.summary;
  const stats = h("div", { class: "cards" },
    ...[["status", badge(run.status)], ["phase", run.current_phase || "–"], ["rollouts", sm.rollouts],
      ["completed", sm.completed], ["mean reward", num(sm.reward_mean)], ["success", pct(sm.success_rate)],
      ["started", when(run.start_time)], ["ended", when(run.end_time)]]
      .map(([k, v]) => h("div", { class: "card stat" }, h("span", { class: "muted" }, k), h("b", {}, v))));
  app.replaceChildren(
    h("h1", {}, `Run #${run.id} ${run.run_name || ""}`),
    h("p", { class: "muted" }, `${run.experiment_name || ""} / ${run.trial_name || ""} · project ${run.project || "?"}`),
    stats,
    ...verdictBox(run.verdict),
    h("h2", {}, "Curves (training rollouts per policy version; held-out: the evaluations and the baseline)"),
    h("div", { class: "cards" },
      chart(run.curve, "reward_mean", "mean reward of the rollouts", "#1463b8",
        { yLabel: "reward (gym score, 0–1)", xLabel: VERSION_AXIS }),
      chart(run.curve, "success_rate", "success rate of the rollouts", "#3c9a5f",
        { yMax: 1, yLabel: "success (% of episodes)", xLabel: VERSION_AXIS, yFormat: percent }),
      chart((run.heldout_curve || []).filter((p) => p.kind === "eval"), "success_rate", "held-out success",
        "#b8541c", { yMax: 1, id: "heldout", yLabel: "success (% of episodes)", xLabel: VERSION_AXIS, yFormat: percent,
          empty: "no held-out evaluation in this run (no eval split)",
          also: { points: (run.heldout_curve || []).filter((p) => p.kind === "baseline"), color: "#6a7683",
            label: "baseline" } })),
    h("h2", {}, "Training (the trainer's statistics per update)"),
    h("div", { class: "cards" }, ...[["loss", "loss", "#8a4fd0", "loss (per token)"],
      ["entropy", "entropy", "#c07a14", "entropy (nats per token)"],
      ["approx_kl", "approx. KL (update)", "#b83a3a", "KL (nats per token)"],
      ["grad_norm", "grad norm", "#2f7f8a", "gradient L2 norm"], ["lr", "learning rate", "#1463b8", "learning rate"],
      ["sampler_logprob_gap", "|trainer − engine| logprob", "#6a7683", "|Δ logprob| (nats)"],
      ["behave_kl", "KL sampler → trained", "#7a5c2e", "KL (nats per token)", true],
      ["kl_reward", "KL penalty (to reference)", "#a0306a", "penalty (reward units)", true],
      ["entropy_bonus", "entropy bonus", "#c07a14", "bonus (loss units)", true]]
      // the last three only when the run has them (stale rows, actor.kl_ctl > 0, entropy_bonus > 0)
      .filter(([key, , , , optional]) => !optional || (run.update_curve || []).some((p) => Number.isFinite(p[key])))
      .map(([key, label, colour, yLabel]) => chart((run.update_curve || []).map((p) => ({ ...p, step: p.train_step ?? p.step + 1 })),
        key, label, colour, { yLabel, xLabel: TRAIN_AXIS }))),
    h("h2", {}, "Health"), anomalyList(run.anomalies || []),
    h("h2", {}, "Steps"), parentTable(run.steps, "steps", "step (policy version)"),
    h("h2", {}, "Baseline (base model before training)"), parentTable(run.baselines, "baselines", "step"),
    h("h2", {}, "Evaluations"), parentTable(run.evals, "evals", "step"),
    h("h2", {}, "Rollouts"), rolloutsBox(run.id),
    h("h2", {}, "Configuration"),
    run.config ? h("details", {}, h("summary", {}, "resolved config"), h("pre", {}, JSON.stringify(run.config, null, 2)))
      : h("p", { class: "muted" }, "Not recorded."));
}

// ---- a run's rollouts: filtered, a page at a time, exported --------------------------------------
// The filters and the page live in the address (?task=&status=&source=&min_reward=&max_reward=&offset=), so a
// filtered view can be shared and survives a reload; the list is fetched apart from the run's JSON.
const FILTERS = ["task", "status", "source", "min_reward", "max_reward"];
const PAGE = 50;
function rolloutQuery(extra = {}) {
  const q = new URLSearchParams(location.search);
  for (const [k, v] of Object.entries(extra)) { if (v === "" || v === null) q.delete(k); else q.set(k, v); }
  return q;
}

function rolloutsBox(runId) {
  const box = h("div", { id: "rollouts", "data-run": runId });
  state.rolloutsJson = null;
  loadRollouts();
  return box;
}

async function loadRollouts() {
  const box = document.getElementById("rollouts");
  if (!box) return;
  const q = rolloutQuery();
  q.set("limit", PAGE);
  const text = await getJson(`/api/trainings/${box.dataset.run}/rollouts?${q}`).catch((err) => {
    box.replaceChildren(h("p", { class: "anomaly" }, err.message)); return null; });
  if (text === null || text === state.rolloutsJson) return;
  state.rolloutsJson = text;
  renderRolloutList(box, JSON.parse(text));
}

function go(extra) {   // a new filter or page: into the address, then fetched
  history.replaceState(null, "", location.pathname + "?" + rolloutQuery(extra));
  loadRollouts();
}

function renderRolloutList(box, page) {
  const f = page.filters || {};
  const pick = (name, values, label) => h("label", {}, label + " ",
    h("select", { "data-testid": `filter-${name}`, onchange: (e) => go({ [name]: e.target.value, offset: "" }) },
      h("option", { value: "" }, "all"),
      values.map((v) => { const o = h("option", { value: v.value ?? v }, v.label ?? v); o.selected = String(f[name] ?? "") === String(v.value ?? v); return o; })));
  const bound = (name, label) => h("label", {}, label + " ", h("input", { type: "number", step: "any", size: 5,
    value: f[name] ?? "", "data-testid": `filter-${name}`, onchange: (e) => go({ [name]: e.target.value, offset: "" }) }));
  const exportQ = rolloutQuery({ offset: "" });
  const form = h("div", { class: "controls filters" },
    pick("task", page.tasks.map((t) => ({ value: t.key, label: t.name && t.name !== t.key ? `${t.name} · ${t.key}` : t.key })), "task"),
    pick("status", page.statuses, "status"), pick("source", page.sources, "source"),
    bound("min_reward", "reward ≥"), bound("max_reward", "≤"),
    h("span", { class: "muted" }, "export:"),
    link(`/api/trainings/${box.dataset.run}/rollouts.csv?${exportQ}`, "CSV"),
    link(`/api/trainings/${box.dataset.run}/rollouts.jsonl?${exportQ}`, "JSONL"));
  const first = page.total ? page.offset + 1 : 0, last = page.offset + page.rollouts.length;
  const pager = h("div", { class: "controls" },
    h("button", { disabled: page.offset === 0, "data-testid": "page-prev",
      onclick: () => go({ offset: Math.max(0, page.offset - page.limit) || "" }) }, "← newer"),
    h("span", { "data-testid": "page-info" }, `${first}–${last} of ${page.total}`),
    h("button", { disabled: last >= page.total, "data-testid": "page-next",
      onclick: () => go({ offset: page.offset + page.limit }) }, "older →"));
  const rows = page.rollouts.map((r) => h("tr", { "data-testid": "rollout-row" },
    h("td", {}, link(`/rollouts/${r.id}`, `#${r.id}`)), h("td", {}, r.task_name || r.task_key || ""),
    h("td", {}, r.source_type || ""), h("td", {}, badge(r.status)), h("td", {}, r.group_id || ""),
    h("td", {}, r.env_index ?? ""), h("td", { "data-testid": "row-reward" }, num(r.reward)),
    h("td", {}, num(r.advantage)), h("td", {}, r.num_turns ?? "")));
  box.replaceChildren(form, pager, rows.length ? h("table", {}, h("tr", {}, ...["rollout", "task", "source",
    "status", "group", "member", "reward", "advantage", "turns"].map((c) => h("th", {}, c))), rows)
    : h("p", { class: "muted" }, page.total === 0 && !Object.keys(f).length ? "No rollouts yet." : "No rollout matches."));
}

// ---- GRPO groups of a step / eval / baseline ---------------------------------------------------
function advBar(a) {
  if (a === null || a === undefined) return "";
  const w = Math.min(60, Math.abs(a) * 30);
  return h("span", { class: "bar " + (a >= 0 ? "pos" : "neg"), style: `width:${w}px` });
}

function renderGroups(p) {
  const title = { steps: "Step", evals: "Evaluation at step", baselines: "Baseline at step" }[p.kind];
  const cards = p.groups.map((g) => h("div", { class: "card group", "data-testid": "group" },
    h("h3", {}, g.task || g.group_id),
    h("div", { class: "muted" }, `group ${g.group_id} · mean ${num(g.summary.reward_mean)} · success ${pct(g.summary.success_rate)}`),
    h("table", {}, h("tr", {}, ...["member", "status", "reward", "advantage", ""].map((c) => h("th", {}, c))),
      g.members.map((m) => h("tr", { "data-testid": "member" },
        h("td", { style: m.tree ? `padding-left:${m.tree.depth * 18}px` : "" },
          m.tree && m.tree.parent ? "↳ " : "", link(`/rollouts/${m.id}`, `#${m.env_index ?? m.id}`),
          m.tree && m.tree.parent ? h("span", { class: "muted", "data-testid": "forked" },
            ` forked at turn ${m.tree.first_turn}`) : ""), h("td", {}, badge(m.status)),
        h("td", { "data-testid": "reward" }, num(m.reward)), h("td", { "data-testid": "advantage" }, num(m.advantage)),
        h("td", {}, advBar(m.advantage)))))));
  app.replaceChildren(
    h("h1", {}, `${title} ${p.step}`),
    p.training_id ? h("p", {}, link(`/${p.training_id}`, `← run #${p.training_id}`)) : null,
    h("p", { class: "muted" }, `${p.summary.rollouts} rollouts · ${p.summary.completed} completed · mean reward ${num(p.summary.reward_mean)} · success ${pct(p.summary.success_rate)}`),
    h("h2", {}, "GRPO groups"),
    cards.length ? h("div", { class: "cards" }, cards) : h("p", { class: "muted" }, "No rollouts yet."));
}

// ---- one rollout, played turn by turn ------------------------------------------------------------
function drawAction(svg, action, w, h_) {
  svg.replaceChildren();
  if (!action) return;
  const fx = (v) => (v > 1 ? v : v * w), fy = (v) => (v > 1 ? v : v * h_);
  const r = Math.max(6, w * 0.018);
  const type = String(action.type || "");
  const defs = s("defs", {});
  const marker = s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 8, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" });
  marker.append(s("path", { d: "M0,0 L10,5 L0,10 z", fill: "#ff2d55" }));
  defs.append(marker);
  svg.append(defs);
  if (action.x !== undefined && action.y !== undefined) {
    const x = fx(action.x), y = fy(action.y);
    if (action.x2 !== undefined && action.y2 !== undefined) {
      svg.append(s("line", { x1: x, y1: y, x2: fx(action.x2), y2: fy(action.y2), stroke: "#ff2d55",
        "stroke-width": Math.max(3, w * 0.006), "marker-end": "url(#arrow)", class: "drag-path", "data-testid": "drag" }));
    }
    svg.append(s("circle", { cx: x, cy: y, r, fill: "rgba(255,45,85,0.25)", stroke: "#ff2d55",
      "stroke-width": Math.max(2, w * 0.004), class: "click-point", "data-testid": "click-point",
      "data-x": action.x, "data-y": action.y }));
    svg.append(s("line", { x1: x - 2 * r, y1: y, x2: x + 2 * r, y2: y, stroke: "#ff2d55", "stroke-width": 1.5 }));
    svg.append(s("line", { x1: x, y1: y - 2 * r, x2: x, y2: y + 2 * r, stroke: "#ff2d55", "stroke-width": 1.5 }));
    if (type === "scroll" && (action.dy || action.dx)) {
      const k = r * 1.5;
      svg.append(s("line", { x1: x, y1: y, x2: x + Math.sign(action.dx || 0) * k * 2, y2: y + Math.sign(action.dy || 0) * k * 2,
        stroke: "#ff2d55", "stroke-width": 3, "marker-end": "url(#arrow)" }));
    }
  }
  const label = s("text", { x: 8, y: Math.max(18, h_ * 0.05), "font-size": Math.max(12, w * 0.022), fill: "#fff",
    stroke: "#000", "stroke-width": 0.6, "paint-order": "stroke", class: "action-label" });
  label.textContent = type + (action.text ? ` "${action.text}"` : "") + (action.keys ? ` ${action.keys.join("+")}` : "");
  svg.append(label);
}

function tokenColour(lp) {
  const p = Math.exp(lp);
  return `hsl(${Math.round(120 * p)}, 75%, 82%)`;
}

function tokenView(tokens, text) {
  if (!tokens || !tokens.pieces || !tokens.logprobs) return h("div", { class: "tokens" }, text || "");
  const trainer = tokens.trainer_logprobs;
  const mode = trainer && state.tokenMode !== "logprob" ? "mismatch" : "logprob";
  // a turn sampled at another policy version than the trainer's differs by the updates between, not a defect
  const tv = tokens.trainer_version;
  const sampled = [...new Set(tokens.versions || [])];
  const offPolicy = trainer && tv !== undefined && tv !== null && sampled.some((v) => v !== tv)
    ? h("span", { class: "off-policy", "data-testid": "off-policy" },
      `sampled at version ${sampled.join(", ")}, trainer at ${tv}: |Δ| includes the updates between `)
    : null;
  const spans = tokens.pieces.map((piece, i) => {
    const lp = tokens.logprobs[i];
    let bg = tokenColour(lp), cls = "tok", tip = `logprob ${num(lp, 4)} (p=${num(Math.exp(lp), 3)})`;
    if (trainer && trainer[i] !== undefined) {
      const d = Math.abs(trainer[i] - lp);
      tip += ` · trainer${tv !== undefined && tv !== null ? ` (v${tv})` : ""} ${num(trainer[i], 4)} · |Δ| ${num(d, 4)}`;
      if (mode === "mismatch") bg = `hsl(0, 85%, ${Math.round(100 - Math.min(45, d * 150))}%)`;
      if (d > 0.1) cls += " mismatch";
    }
    return h("span", { class: cls, style: `background:${bg}`, title: tip, "data-testid": "token", "data-logprob": lp }, piece);
  });
  const legend = h("div", { class: "legend muted" }, mode === "mismatch"
    ? ["red = trainer and engine logprobs disagree (|Δ|), outlined when |Δ| > 0.1 ", offPolicy,
      h("button", { onclick: () => { state.tokenMode = "logprob"; state.lastJson = null; refresh(); } }, "colour by logprob")]
    : [h("span", { style: `background:${tokenColour(Math.log(0.05))}` }, "p≈0.05"),
      h("span", { style: `background:${tokenColour(Math.log(0.5))}` }, "p≈0.5"),
      h("span", { style: `background:${tokenColour(0)}` }, "p≈1"),
      trainer ? h("button", { onclick: () => { state.tokenMode = "mismatch"; state.lastJson = null; refresh(); } }, "colour by mismatch") : null]);
  return h("div", {}, legend, h("div", { class: "tokens", "data-testid": "tokens" }, spans));
}

function validationView(vals) {
  if (!vals.length) return h("p", { class: "muted" }, "No validation recorded.");
  return vals.map((v) => {
    const details = v.details_json || {};
    const ev = details.genv_evaluation || {};
    const validators = Array.isArray(ev.validators) ? ev.validators
      : (ev.result && Array.isArray(ev.result.validators) ? ev.result.validators : []);
    return h("div", { class: "card", "data-testid": "validation" },
      h("div", {}, badge(v.success ? "completed" : "failed"), " ", v.actual_result || ""),
      validators.length ? h("table", {}, h("tr", {}, h("th", {}, "validator"), h("th", {}, "score"), h("th", {}, "detail")),
        validators.map((x) => h("tr", {}, h("td", {}, x.name || x.id || x.type || "?"),
          h("td", {}, x.score ?? (x.passed !== undefined ? String(x.passed) : "")),
          h("td", {}, x.message || x.detail || x.reason || "")))) : null,
      h("details", {}, h("summary", {}, "raw evaluation"), h("pre", {}, JSON.stringify(details, null, 2))));
  });
}

// The task instruction the agent got: the instance's own (seeded tasks word it per instance), else the task's.
const instructionOf = (r) => (r.summary && r.summary.instruction) || (r.task && r.task.description) || "";

function renderRollout(r) {
  const turns = r.turns || [];
  if (state.turn >= turns.length) state.turn = Math.max(0, turns.length - 1);
  const t = turns[state.turn];
  const parent = r.step_id ? `/steps/${r.step_id}` : r.eval_id ? `/evals/${r.eval_id}` : r.baseline_id ? `/baselines/${r.baseline_id}` : null;
  const header = h("div", {},
    h("h1", {}, `Rollout #${r.id} `, badge(r.status)),
    h("p", {}, r.training_id ? link(`/${r.training_id}`, `run #${r.training_id}`) : "", parent ? [" · ", link(parent, "its group")] : "",
      " · task ", h("b", {}, (r.task && (r.task.name || r.task.task_id)) || "?"), ` · source ${r.source_type || "?"}`,
      // the gym's live view of the running execution (our gym; view-only, ended with the execution)
      r.status === "running" && webUrl(r.live_view) ? [" · ", h("a", { href: webUrl(r.live_view), target: "_blank",
        rel: "noopener", "data-testid": "live-view" }, "watch live")] : ""),
    instructionOf(r) ? h("p", { class: "instruction", "data-testid": "instruction" },
      h("span", { class: "muted" }, "instruction: "), instructionOf(r)) : null,
    // why a rollout ended without a reward: dropped (failed) or stopped with the run (cancelled)
    (r.status === "failed" || r.status === "cancelled") && r.summary && r.summary.error
      ? h("p", { class: "muted", "data-testid": "rollout-error" }, r.summary.error) : null,
    h("div", { class: "cards" }, ...[["reward", num(r.reward)], ["advantage", num(r.advantage)],
      ["success", r.task_success === null || r.task_success === undefined ? "–" : String(r.task_success)],
      ["turns", r.num_turns ?? turns.length], ...(r.status === "running" ? [["phase", r.current_phase || "–"]] : [])]
      .map(([k, v]) => h("div", { class: "card stat" }, h("span", { class: "muted" }, k), h("b", { "data-testid": `rollout-${k}` }, v)))),
    r.group && r.group.length > 1 ? h("p", {}, "Group: ", r.group.map((g) => [g.id === r.id ? h("b", {}, `#${g.env_index ?? g.id}`)
      : link(`/rollouts/${g.id}`, `#${g.env_index ?? g.id}`), ` (r=${num(g.reward, 2)}, A=${num(g.advantage, 2)})  `])) : null);
  if (!t) {
    app.replaceChildren(header, h("p", { class: "muted" }, "No turns recorded yet."), h("h2", {}, "Validation"), ...[validationView(r.validations)].flat());
    return;
  }
  const img = h("img", { alt: `screenshot of turn ${t.turn}`, "data-testid": "screenshot" });
  const svg = s("svg", { "data-testid": "overlay" });
  const action = (t.actions[0] && t.actions[0].action) || t.action;
  img.onload = () => {
    svg.setAttribute("viewBox", `0 0 ${img.naturalWidth} ${img.naturalHeight}`);
    drawAction(svg, action, img.naturalWidth, img.naturalHeight);
  };
  if (t.image_sha256) img.src = `/blobs/${t.image_sha256}`;
  const go = (i) => { state.turn = Math.max(0, Math.min(turns.length - 1, i)); renderRollout(r); };
  const play = () => {
    if (state.playing) { clearInterval(state.playing); state.playing = null; renderRollout(r); return; }
    state.playing = setInterval(() => {
      if (state.turn >= turns.length - 1) { clearInterval(state.playing); state.playing = null; renderRollout(r); return; }
      go(state.turn + 1);
    }, 1200);
    renderRollout(r);
  };
  const controls = h("div", { class: "controls" },
    h("button", { onclick: () => go(state.turn - 1), disabled: state.turn === 0, "data-testid": "prev" }, "◀ prev"),
    h("button", { onclick: play, "data-testid": "play" }, state.playing ? "❚❚ pause" : "▶ play"),
    h("button", { onclick: () => go(state.turn + 1), disabled: state.turn >= turns.length - 1, "data-testid": "next" }, "next ▶"),
    h("input", { type: "range", min: 0, max: turns.length - 1, value: state.turn, oninput: (e) => go(Number(e.target.value)) }),
    h("span", { "data-testid": "turn-label" }, `turn ${t.turn} of ${turns.length}`));
  const metrics = t.metrics || {};
  const tokens = t.tokens || {};
  const info = h("dl", { class: "kv" },
    h("dt", {}, "action"), h("dd", { "data-testid": "action" }, t.actions.length ? t.actions.map((a) => `${a.action_name} ${JSON.stringify(a.action || a.action_args || {})}`).join("; ") : JSON.stringify(t.action || null)),
    metrics.invalid ? [h("dt", {}, "invalid"), h("dd", {}, metrics.invalid)] : null,
    h("dt", {}, "image sha256"), h("dd", { class: "hash", "data-testid": "image-hash" }, t.image_sha256 || "–"),
    h("dt", {}, "pixel tensor"), h("dd", { class: "hash" }, metrics.pixel_sha256 || "–"),
    h("dt", {}, "latency"), h("dd", { "data-testid": "latency" }, t.turn_time !== null && t.turn_time !== undefined ? `${num(t.turn_time, 2)} s` : "–"),
    h("dt", {}, "tokens"), h("dd", {}, `${(tokens.ids || []).length} out / ${tokens.prompt_tokens ?? "?"} prompt, policy v${(tokens.versions || []).join(",")}, ${tokens.stop_reason || ""}`),
    h("dt", {}, "reward / advantage"), h("dd", {}, `${num(t.reward)} / ${num(t.advantage)}`));
  app.replaceChildren(header, controls,
    h("div", { class: "player" },
      h("div", {}, h("div", { class: "shot" }, img, svg)),
      h("div", {}, info, t.thinking ? [h("h2", {}, "Thinking"), h("div", { class: "tokens" }, t.thinking)] : null,
        h("h2", {}, "Model output"), tokenView(t.tokens, t.text))),
    h("h2", {}, "Validation"), ...[validationView(r.validations)].flat());
}

document.addEventListener("keydown", (e) => {
  if (!route() || route().render !== renderRollout || !state.lastJson) return;
  const r = JSON.parse(state.lastJson);
  if (e.key === "ArrowRight") { state.turn = Math.min(state.turn + 1, r.turns.length - 1); renderRollout(r); }
  if (e.key === "ArrowLeft") { state.turn = Math.max(state.turn - 1, 0); renderRollout(r); }
});

refresh();
setInterval(refresh, REFRESH_MS);
