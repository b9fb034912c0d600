// The edgemux dashboard (docs/dashboard.md): polls GET /v1/overview and GET /v1/events?since= every 2 s and draws
// the nodes and their devices, the apps with predicted beside observed latency over time, and the events.
//
// Security: the admin token comes from the URL's fragment (#token=..., never sent to a server; moved to this
// tab's sessionStorage and cleared from the address at once) or from the sign-in form, and goes out only as an
// Authorization header on this origin's /v1 calls (never a cookie). Without a valid token the page shows its
// sign-in form and no data. Everything the control plane sends is written as text (textContent, SVG attributes),
// never parsed as markup. No framework, nothing from another origin (the page's Content-Security-Policy).
"use strict";

(() => {
  const POLL_MS = 2000;
  const STORAGE_KEY = "edgemux.dashboard.token";
  const MAX_EVENTS = 200;        // shown in the timeline, newest first
  const MAX_POINTS = 360;        // per app's chart (the control plane keeps as many windows)
  const SVG = "http://www.w3.org/2000/svg";

  const state = {
    token: null,          // the admin token (null: none, e.g. an open cluster)
    memoryToken: null,    // where the token lives when sessionStorage cannot be used
    timer: null,
    generation: 0,        // bumped at sign-in/out: an answer to an older poll is dropped
    full: true,           // the next overview asks every app's whole series (?since=0)
    since: 0,             // the newest series point held (Unix s, as the control plane wrote it)
    lastSeq: 0,           // the newest event held
    series: new Map(),    // app -> [{time_s, predicted_ms, observed_ms, ...}], oldest first
    events: [],           // the control plane's events (the operator's and the cluster's own), any order
  };

  // ------------------------------------------------------------------------------------------------ token

  function storedToken() {
    try {
      return window.sessionStorage.getItem(STORAGE_KEY);
    } catch (e) {
      return state.memoryToken;
    }
  }

  function storeToken(token) {
    state.memoryToken = token;
    try {
      if (token) window.sessionStorage.setItem(STORAGE_KEY, token);
      else window.sessionStorage.removeItem(STORAGE_KEY);
    } catch (e) {
      // storage refused (a private mode): the token lives as long as this page
    }
  }

  // #token=... -> sessionStorage, and the fragment cleared from the address bar and the history entry
  function takeTokenFromFragment() {
    const hash = window.location.hash;
    if (!hash || hash.length < 2) return;
    const params = new URLSearchParams(hash.slice(1));
    if (!params.has("token")) return;
    const token = (params.get("token") || "").trim();
    if (token) storeToken(token);
    params.delete("token");
    const rest = params.toString();
    window.history.replaceState(null, "", window.location.pathname + window.location.search + (rest ? "#" + rest : ""));
  }

  // -------------------------------------------------------------------------------------------------- API

  class AuthRefused extends Error {}

  async function api(path) {
    const headers = {"Accept": "application/json"};
    if (state.token) headers["Authorization"] = "Bearer " + state.token;
    const answer = await fetch(path, {headers, cache: "no-store", credentials: "omit", redirect: "error"});
    if (answer.status === 401 || answer.status === 403) {
      throw new AuthRefused(state.token ? "the control plane refused this token" : "");
    }
    if (!answer.ok) {
      let why = answer.statusText;
      try {
        why = (await answer.json()).error || why;
      } catch (e) {
        // not JSON: the status line says enough
      }
      throw new Error(`${path.split("?")[0]}: ${answer.status} ${why}`);
    }
    return answer.json();
  }

  // ----------------------------------------------------------------------------------------------- polling

  function schedule() {
    window.clearTimeout(state.timer);
    state.timer = window.setTimeout(poll, POLL_MS);
  }

  async function poll() {
    const generation = state.generation;
    try {
      const overview = await api("/v1/overview?since=" + encodeURIComponent(state.full ? 0 : state.since));
      if (overview.last_event < state.lastSeq) {  // a new control plane (its sequence started again)
        state.events = [];
        state.lastSeq = 0;
      }
      const events = await api("/v1/events?since=" + encodeURIComponent(state.lastSeq));
      if (generation !== state.generation) return;
      absorb(overview, events);
      showData(true);
      render(overview);
      setStatus(`live · updated ${clock(overview.time_s)}`, "ok");
    } catch (e) {
      if (generation !== state.generation) return;
      if (e instanceof AuthRefused) {
        signOut(e.message);
        return;
      }
      setStatus(`cannot reach the control plane (${e.message}); trying again every ${POLL_MS / 1000} s`, "bad");
    }
    schedule();
  }

  // the new answers into the state: series merged, new events kept
  function absorb(overview, answer) {
    const wasFull = state.full;
    state.full = false;
    const names = new Set();
    for (const app of overview.apps || []) {
      names.add(app.name);
      const points = app.series || [];
      let held = state.series.get(app.name);
      if (held === undefined || wasFull) {
        held = [];
        if (!wasFull) state.full = true;  // an app this page had not seen: its whole series next time
      }
      const last = held.length ? held[held.length - 1].time_s : -Infinity;
      for (const p of points) if (p.time_s > last) held.push(p);
      if (held.length > MAX_POINTS) held.splice(0, held.length - MAX_POINTS);
      state.series.set(app.name, held);
      for (const p of points) state.since = Math.max(state.since, p.time_s);
    }
    for (const name of [...state.series.keys()]) {
      if (!names.has(name)) state.series.delete(name);  // deleted: its chart goes
    }
    for (const e of answer.events || []) {
      state.lastSeq = Math.max(state.lastSeq, e.seq);
      state.events.push(e);
    }
    state.events.sort((a, b) => b.time_s - a.time_s);
    state.events.splice(MAX_EVENTS);
  }

  // --------------------------------------------------------------------------------------------- sign-in

  function start() {
    state.generation += 1;
    state.token = storedToken();
    state.full = true;
    state.since = 0;
    state.lastSeq = 0;
    state.series.clear();
    state.events = [];
    byId("signout").hidden = !state.token;
    setStatus("connecting…", "");
    window.clearTimeout(state.timer);
    poll();
  }

  function signOut(problem) {
    state.generation += 1;
    window.clearTimeout(state.timer);
    storeToken(null);
    state.token = null;
    showData(false);
    for (const id of ["nodes", "apps", "events"]) byId(id).replaceChildren();  // no data stays on the page
    byId("cluster").textContent = "";
    byId("signout").hidden = true;
    byId("signin-error").textContent = problem || "";
    setStatus("signed out", "");
    byId("token").focus();
  }

  function showData(on) {
    byId("data").hidden = !on;
    byId("signin").hidden = on;
  }

  // ---------------------------------------------------------------------------------------------- drawing

  function render(overview) {
    const nodes = overview.nodes || [];
    const apps = overview.apps || [];
    const devices = nodes.reduce((n, node) => n + (node.devices || []).length, 0);
    const adapt = overview.adapt ? `adaptation on (window ${num(overview.window_s)} s)` : "adaptation off";
    byId("cluster").textContent = `${nodes.length} nodes · ${devices} devices · ${apps.length} apps · policy ` +
      `${overview.policy} · ${adapt} · consolidation ${overview.consolidate ? "on" : "off"}`;
    byId("nodes").replaceChildren(...nodes.map(nodeCard));
    byId("apps").replaceChildren(...apps.map(appCard));
    byId("events").replaceChildren(...state.events.map(eventItem));
    if (!state.events.length) byId("events").append(el("li", {class: "muted"}, "no events yet"));
  }

  function nodeCard(node) {
    const agent = node.agent;
    const agentText = agent
      ? `agent ${agent.ready ? "ready" : "not ready"} · ${agent.url} · edgemux ${agent.version || "?"}` +
        (agent.runs_on ? ` · runs on ${agent.runs_on}` : "")
      : "no agent registered";
    const rows = (node.devices || []).map(deviceRow);
    return el("article", {class: "card node", "data-node": node.name},
      el("h3", {}, node.name, " ", badge(node.power, "power-" + node.power)),
      el("p", {class: "muted"}, agentText),
      el("p", {class: "muted"}, `serving path ${ms(node.serving_ms)}` +
        (node.serving_from ? ` (${node.serving_from})` : "") + ` · apps: ${(node.apps || []).join(", ") || "none"}`),
      el("table", {class: "devices"},
        el("thead", {}, el("tr", {}, ...["device", "kind", "real or emulated", "power", "utilization",
                                         "queue", "memory", "tenants"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...rows)));
  }

  function deviceRow(d) {
    const real = d.emulated === true ? badge("emulated", "emulated")
      : d.emulated === false ? badge("real" + (d.backend ? ` (${d.backend})` : ""), "real")
      : badge("not reported", "unknown");
    const u = d.utilization || {};
    const tenants = (d.tenants || []).map((t) => `${t.app} ×${num(t.weight)}`).join(", ") || "—";
    return el("tr", {"data-device": d.path},
      el("td", {class: "path"}, d.path),
      el("td", {}, `${d.kind} · ${d.discipline}`),
      el("td", {class: "backend"}, real),
      el("td", {}, badge(d.power, "power-" + d.power)),
      el("td", {class: "util"}, bar("predicted", u.predicted, "util-pred"), bar("observed", u.observed, "util-obs")),
      el("td", {}, d.queue_depth === null || d.queue_depth === undefined ? "—"
        : `${d.queue_depth} queued · ${d.inflight ?? 0} running`),
      el("td", {}, `${num(d.memory_used_mb)} / ${num(d.memory_mb)} MB`),
      el("td", {class: "tenants"}, tenants),
      d.error ? el("td", {class: "bad"}, d.error) : null);
  }

  function bar(label, value, cls) {
    const known = typeof value === "number" && isFinite(value);
    const meter = el("span", {class: "fill"});
    meter.style.width = known ? `${Math.min(100, Math.max(0, value * 100)).toFixed(1)}%` : "0";  // CSSOM: the CSP allows it
    return el("div", {class: "bar " + cls, "data-value": known ? value : null},
      el("span", {class: "label"}, label),
      el("span", {class: "track"}, meter),
      el("span", {class: "value"}, known ? `${(value * 100).toFixed(1)} %` : "—"));
  }

  function appCard(app) {
    const slo = app.slo || {};
    const stat = slo.stat || "mean";
    const pred = app.predicted || {};
    const obs = app.observed;
    const predValue = pred.at_slo_stat_ms;
    const obsValue = obs ? obs.at_slo_stat_ms : null;
    const verdict = (met) => met === true ? badge("meets SLO", "ok") : met === false ? badge("misses SLO", "bad")
      : badge("no verdict", "unknown");
    const obsDetail = obs ? ` (${num(obs.rate_rps)} req/s over ${num(obs.window_s)} s, ${obs.answered} answered` +
      (obs.refused || obs.failed ? `, ${obs.refused} refused, ${obs.failed} failed` : "") + ")" : "";
    return el("article", {class: "card app", "data-app": app.name},
      el("h3", {}, app.name, " ", badge(app.status, "status-" + app.status)),
      el("dl", {},
        el("dt", {}, "model"), el("dd", {}, `${app.model} · ${num(app.rate_rps)} req/s` +
                                            (app.periodic ? " periodic" : " Poisson")),
        el("dt", {}, "SLO"), el("dd", {class: "app-slo"}, `${stat} ≤ ${num(slo.latency_ms)} ms`),
        el("dt", {}, "placement"), el("dd", {class: "app-placement"}, placementText(app) +
                                                                  (app.cpu_node ? ` · CPU stage on ${app.cpu_node}` : "")),
        el("dt", {}, `predicted ${stat}`),
        el("dd", {}, el("span", {class: "latency-pred", "data-ms": msData(predValue)}, ms(predValue)), " ",
           verdict(app.predicted_meets_slo)),
        el("dt", {}, `observed ${stat}`),
        el("dd", {}, el("span", {class: "latency-obs", "data-ms": msData(obsValue)}, ms(obsValue)), obsDetail, " ",
           obs ? verdict(app.observed_meets_slo) : null),
        el("dt", {}, "attainment"),
        el("dd", {class: "app-attainment"}, app.attainment === null || app.attainment === undefined ? "— (no window with traffic yet)"
          : `${(app.attainment * 100).toFixed(1)} % of the windows with traffic met the SLO`)),
      chart(app.name, stat, slo.latency_ms, state.series.get(app.name) || []));
  }

  function eventItem(e) {
    return el("li", {class: "event kind-" + e.kind, "data-kind": e.kind,
                     "data-app": e.app, "data-seq": e.seq},
      el("time", {datetime: new Date(e.time_s * 1000).toISOString()}, clock(e.time_s)),
      badge(e.kind, "kind"),
      e.app ? el("span", {class: "event-app"}, e.app) : null,
      el("span", {class: "message"}, e.message),
      e.data && e.data.by === "operator" ? el("span", {class: "muted"}, " (operator)") : null);
  }

  // --------------------------------------------------------------------------------------------- the chart

  // predicted and observed latency at the app's SLO statistic over its windows, the SLO as a dashed line
  function chart(name, stat, sloMs, points) {
    const W = 320, H = 120, L = 46, R = 8, T = 8, B = 18;
    const svg = svgEl("svg", {class: "chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
                              "aria-label": `${name}: predicted and observed ${stat} latency per window`});
    svg.append(svgEl("title", {}, `${name}: predicted and observed ${stat} latency per window (ms)`));
    const finite = (v) => typeof v === "number" && isFinite(v);
    const values = [];
    for (const p of points) for (const v of [p.predicted_ms, p.observed_ms]) if (finite(v)) values.push(v);
    const top = Math.max(finite(sloMs) ? sloMs * 1.15 : 0, values.length ? Math.max(...values) * 1.1 : 0, 1);
    const t0 = points.length ? points[0].time_s : 0;
    const t1 = points.length ? points[points.length - 1].time_s : 1;
    const x = (t) => L + (t1 > t0 ? (t - t0) / (t1 - t0) : 0.5) * (W - L - R);
    const y = (v) => T + (1 - Math.min(v, top) / top) * (H - T - B);
    for (const f of [0, 0.5, 1]) {
      svg.append(svgEl("line", {class: "grid", x1: L, x2: W - R, y1: y(top * f), y2: y(top * f)}));
      svg.append(svgEl("text", {class: "axis", x: L - 4, y: y(top * f) + 3, "text-anchor": "end"},
                       num(top * f) + (f === 1 ? " ms" : "")));
    }
    if (finite(sloMs)) svg.append(svgEl("line", {class: "slo", x1: L, x2: W - R, y1: y(sloMs), y2: y(sloMs)}));
    if (!points.length) {
      svg.append(svgEl("text", {class: "axis", x: (L + W - R) / 2, y: H / 2, "text-anchor": "middle"},
                       "no window closed yet"));
      return svg;
    }
    svg.append(svgEl("text", {class: "axis", x: L, y: H - 4}, clock(t0)));
    svg.append(svgEl("text", {class: "axis", x: W - R, y: H - 4, "text-anchor": "end"}, clock(t1)));
    const series = [["pred", "predicted_ms"], ["obs", "observed_ms"]];
    for (const [cls, key] of series) {
      let d = "", drawn = 0;
      points.forEach((p, i) => {
        const v = p[key];
        if (!finite(v)) return;
        const prev = i > 0 ? points[i - 1][key] : null;
        const next = i + 1 < points.length ? points[i + 1][key] : null;
        d += `${finite(prev) ? "L" : "M"}${x(p.time_s).toFixed(1)},${y(v).toFixed(1)}`;
        drawn += 1;
        if (!finite(prev) && !finite(next)) {  // a lone point: a dot, or the path would not show it
          svg.append(svgEl("circle", {class: "dot " + cls, cx: x(p.time_s).toFixed(1), cy: y(v).toFixed(1), r: 2}));
        }
      });
      if (d) svg.append(svgEl("path", {class: "line " + cls, d}));
      svg.setAttribute(`data-${cls}-points`, String(drawn));
    }
    for (const p of points) {  // an unstable prediction (a queue without bound): a mark at the top
      if (p.predicted_ms === "unstable") {
        svg.append(svgEl("text", {class: "unstable", x: x(p.time_s), y: T + 8, "text-anchor": "middle"}, "∞"));
      }
    }
    return svg;
  }

  // ------------------------------------------------------------------------------------------------ helpers

  function byId(id) {
    return document.getElementById(id);
  }

  function el(tag, attrs, ...children) {
    return fill(document.createElement(tag), attrs, children);
  }

  function svgEl(tag, attrs, ...children) {
    return fill(document.createElementNS(SVG, tag), attrs, children);
  }

  // attributes set as attributes and children appended as nodes or text: data never becomes markup
  function fill(node, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }

  function badge(text, cls) {
    return el("span", {class: "badge " + String(cls || "").replace(/[^A-Za-z0-9_-]/g, "")}, text ?? "?");
  }

  function placementText(app) {
    return (app.placement || []).map((s) => `${s.device} ×${num(s.weight)}`).join(", ") || "—";
  }

  function num(v) {
    if (typeof v !== "number" || !isFinite(v)) return "—";
    const a = Math.abs(v);
    if (a === 0 || a >= 100) return String(Math.round(v));
    return String(Number(v.toPrecision(3)));
  }

  function ms(v) {
    if (v === "unstable") return "unstable";
    if (typeof v !== "number" || !isFinite(v)) return "—";
    return (v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0)) + " ms";
  }

  function msData(v) {
    return typeof v === "number" && isFinite(v) ? String(v) : v === "unstable" ? "unstable" : null;
  }

  function clock(time_s) {
    return typeof time_s === "number" ? new Date(time_s * 1000).toTimeString().slice(0, 8) : "—";
  }

  function setStatus(text, cls) {
    const s = byId("status");
    s.textContent = text;
    s.className = "status " + (cls || "");
  }

  // ------------------------------------------------------------------------------------------------- start

  document.addEventListener("DOMContentLoaded", () => {
    takeTokenFromFragment();
    byId("signin-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const input = byId("token");
      const token = input.value.trim();
      input.value = "";
      if (!token) return;
      storeToken(token);
      byId("signin-error").textContent = "";
      start();
    });
    byId("signout").addEventListener("click", () => signOut(""));
    window.addEventListener("hashchange", () => {  // a new #token=... pasted into the address bar
      if (new URLSearchParams(window.location.hash.slice(1)).has("token")) {
        takeTokenFromFragment();
        start();
      }
    });
    start();
  });
})();
