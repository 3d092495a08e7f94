// fleetgate live dashboard: polls the admin JSON API and renders it. No dependencies.
// Every number shown carries data-src/data-id/data-k/data-value: where it came from and the
// raw value, so a test (or a curious operator) can check it against the API's answer.
"use strict";

const params = new URLSearchParams(location.search);
const INTERVAL_S = Math.min(60, Math.max(1, Number(params.get("interval")) || 2));
const KEY_STORE = "fleetgate.adminKey";
const HISTORY = 150;            // traffic-share points kept (5 min at 2 s)
const DECISIONS = 15;           // decisions listed
const CANDIDATES = 64;          // candidates kept per decision (all on a small fleet)
const PER_POOL = 24;            // endpoint rows per pool card; the pool's figures count all
const COLORS = ["#4e9af1", "#f1a14e", "#8bd46e", "#d46ec2", "#e8d44d", "#6ed4cf", "#c9785a",
  "#9d8cf2", "#f26d6d", "#a3a3a3"];

const ui = {
  poll: 0, busy: false, paused: false, timer: null, openDecision: null, decisions: [],
  share: [], lastRequests: null, colors: {}, shadowMissing: 0, scaling: null,
};

// ------------------------------------------------------------------ formatting

function sig(v) {
  if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en-US");
  return String(Number(v.toPrecision(4)));
}
const FORMATS = {
  num: v => sig(v),
  int: v => Math.round(v).toLocaleString("en-US"),
  usd: v => "$" + sig(v),
  ms: v => sig(v * 1000) + " ms",
  pct: v => sig(v * 100) + "%",
};
function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
    '"': "&quot;", "'": "&#39;"}[c]));
}
// A number element: what it is (src, id, k) and its raw value beside the formatted text.
function val(src, id, k, v, fmt = "num") {
  const ok = typeof v === "number" && isFinite(v);
  const text = ok ? FORMATS[fmt](v) : "–";
  return `<span class="v" data-src="${src}" data-id="${esc(id)}" data-k="${k}" ` +
    `data-fmt="${fmt}" data-value="${ok ? v : ""}">${text}</span>`;
}
function stat(label, html) { return `<div><span class="l">${label}</span>${html}</div>`; }
function state(s) { return `<span class="state-${esc(s)}">${esc(s)}</span>`; }
function clock(t) { return new Date(t * 1000).toLocaleTimeString("en-GB"); }
function byKey(rows, key) { return Object.fromEntries((rows || []).map(r => [r[key], r])); }
function color(pool) {
  if (!(pool in ui.colors)) ui.colors[pool] = COLORS[Object.keys(ui.colors).length % COLORS.length];
  return ui.colors[pool];
}

// ------------------------------------------------------------------ fetching

function key() { return sessionStorage.getItem(KEY_STORE); }

async function get(path, poll) {
  const headers = {"x-dashboard-poll": String(poll)};
  if (key()) headers.authorization = "Bearer " + key();
  const r = await fetch(path, {headers, cache: "no-store"});
  if (r.status === 401 || r.status === 403) {
    const body = await r.json().catch(() => ({}));
    throw Object.assign(new Error((body.error && body.error.message) || "unauthorized"),
      {auth: true});
  }
  if (r.status === 404) return null;
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

async function poll() {
  if (ui.busy) return;
  ui.busy = true;
  document.body.dataset.busy = "true";
  try { await pollOnce(); } finally {
    ui.busy = false;
    document.body.dataset.busy = "false";
  }
}

async function pollOnce() {
  const n = ui.poll + 1;
  const shadowDue = ui.shadowMissing === 0 || n % 15 === 0;
  try {
    const [endpoints, costs, decisions, shadow, scaling] = await Promise.all([
      get(`/admin/endpoints?per_pool=${PER_POOL}`, n), get("/admin/costs", n),
      get(`/admin/decisions?limit=${DECISIONS}&candidates=${CANDIDATES}`, n),
      shadowDue ? get("/admin/shadow", n) : Promise.resolve(undefined),
      get("/admin/scaling", n)]);
    ui.poll = n;
    ui.scaling = scaling;
    const bill = render(endpoints, costs, decisions, shadow);
    document.body.dataset.poll = String(n);
    setStatus(`updated ${new Date().toLocaleTimeString("en-GB")} · every ${INTERVAL_S} s · ` +
      `${costs.total.requests} requests · $${sig(costs.total.usd)} since start · ` +
      `fleet $${sig(bill.now)}/hour`, false);
    showLogin(false);
  } catch (err) {
    if (err.auth) { showLogin(true, key() ? err.message : ""); return; }
    setStatus("update failed: " + err.message, true);
  }
  schedule();
}

function schedule() {
  clearTimeout(ui.timer);
  if (!ui.paused && !document.hidden) ui.timer = setTimeout(poll, INTERVAL_S * 1000);
}

function setStatus(text, bad) {
  const el = document.getElementById("status");
  el.textContent = ui.paused ? "paused · " + text : text;
  el.classList.toggle("error", bad);
}

function showLogin(show, error = "") {
  document.getElementById("login").hidden = !show;
  document.getElementById("main").hidden = show;
  document.getElementById("login-error").textContent = error;
  document.getElementById("forget").hidden = !key();
  if (show) setStatus("admin key needed", true);
}

// ------------------------------------------------------------------ rendering

function render(endpoints, costs, decisions, shadow) {
  const latest = predicted(decisions.decisions);
  const bill = renderScaling(endpoints, ui.scaling);
  renderPools(endpoints, costs, latest);
  recordShare(costs, endpoints.pools.map(p => p.pool));
  renderShare();
  ui.decisions = decisions.decisions;
  renderDecisions();
  renderCosts(costs);
  if (shadow !== undefined) renderShadow(shadow);
  return bill;
}

// The router's predicted $/Mtok per pool: its estimate in the newest decision naming it.
function predicted(decisions) {
  const out = {};
  for (const d of decisions) {
    for (const c of d.candidates) {
      if (!(c.pool in out) && c.estimates && c.estimates.usd_per_mtok != null) {
        out[c.pool] = c.estimates.usd_per_mtok;
      }
    }
  }
  return out;
}

function renderPools(endpoints, costs, latest) {
  const eps = {};
  for (const e of endpoints.endpoints) (eps[e.pool] = eps[e.pool] || []).push(e);
  const ledger = byKey(costs.pools, "pool");
  const scaled = (ui.scaling && ui.scaling.pools) || {};
  const html = endpoints.pools.map(p => {
    const listed = eps[p.pool] || [];
    const bill = scaled[p.pool] ? val("scaling", p.pool, "usd_per_hour", scaled[p.pool].usd_per_hour,
      "usd") : val("endpoints.pools", p.pool, "usd_per_hour", p.usd_per_hour, "usd");
    const spent = ledger[p.pool] || {};
    const P = (k, fmt) => val("endpoints.pools", p.pool, k, p[k], fmt);
    const C = (k, fmt) => val("costs.pools", p.pool, k, spent[k], fmt);
    const more = p.endpoints - listed.length;
    return `<article class="card ${esc(p.vendor)}" data-pool="${esc(p.pool)}">
      <h3><span>${esc(p.pool)}</span><span class="badge ${esc(p.vendor)}">${esc(p.vendor.toUpperCase())}</span></h3>
      <div class="meta">${esc(p.accelerator.toUpperCase())} × ${p.gpus_per_replica} · ${esc(p.engine)} ·
        ${P("price_per_gpu_hour", "usd")}/GPU-h ·
        ${bill}/h</div>
      <div class="stats">
        ${stat("health", `<span class="v">${p.parked ? `${p.routed} ready · ${p.parked} parked`
          : `${p.ready}/${p.endpoints} ready`}</span>`)}
        ${stat("breaker", `<span class="v">${p.breakers.map(state).join(" ")}</span>`)}
        ${stat("queue", P("queued"))}
        ${stat("in flight", P("in_flight"))}
        ${stat("tok/s", P("tokens_per_s"))}
        ${stat("tokens per $", C("tokens_per_usd", "int"))}
        ${stat("$/Mtok measured", P("usd_per_mtok", "usd"))}
        ${stat("$/Mtok charged", C("usd_per_mtok", "usd"))}
        ${stat("$/Mtok predicted", val("decisions", p.pool, "usd_per_mtok", latest[p.pool], "usd"))}
        ${stat("requests", C("requests", "int"))}
        ${stat("spent", C("usd", "usd"))}
        ${stat("failed $", C("failed_usd", "usd"))}
      </div>
      <div class="eps">${listed.map(e => endpointRow(e, scaled[p.pool])).join("")}${more > 0
        ? `<div class="ep more">and ${more} more (<code>/admin/endpoints?pool=${esc(p.pool)}</code>)</div>`
        : ""}</div>
    </article>`;
  }).join("");
  document.getElementById("pools").innerHTML = html ||
    '<div class="empty">no pools configured</div>';
}

function endpointRow(e, scaling) {
  const E = (k, fmt) => val("endpoints.endpoints", e.id, k, e[k], fmt);
  const status = e.parked ? parkedLabel(e, scaling) : `${state(e.health)} · breaker ${state(e.breaker)}`;
  return `<div class="ep${e.parked ? " parked" : ""}" data-endpoint="${esc(e.id)}">
    <div><b>${esc(e.id)}</b> ${status}</div>
    <div>queue ${E("queued")} · in flight ${E("in_flight")} · ${E("tokens_per_s")} tok/s</div>
    <div>TTFT p50 ${E("ttft_p50_s", "ms")} p95 ${E("ttft_p95_s", "ms")} ·
      TPOT p50 ${E("tpot_p50_s", "ms")} p95 ${E("tpot_p95_s", "ms")}</div></div>`;
}

// Traffic share: the ledger's requests per pool, differenced between polls.
function recordShare(costs, pools) {
  const now = byKey(costs.pools, "pool");
  const counts = Object.fromEntries(pools.map(p => [p, now[p] ? now[p].requests : 0]));
  if (ui.lastRequests) {
    const delta = {};
    let total = 0;
    for (const p of pools) {
      delta[p] = Math.max(0, counts[p] - (ui.lastRequests[p] || 0));
      total += delta[p];
    }
    ui.share.push({t: Date.now() / 1000, total, share: Object.fromEntries(
      pools.map(p => [p, total ? delta[p] / total : 0]))});
    if (ui.share.length > HISTORY) ui.share.shift();
  }
  ui.lastRequests = counts;
  ui.sharePools = pools;
}

function renderShare() {
  const W = 1000, H = 160, pts = ui.share, pools = ui.sharePools || [];
  const x = i => pts.length < 2 ? W : (i / (pts.length - 1)) * W;
  let paths = "";
  const base = pts.map(() => 0);
  for (const p of pools) {
    const top = pts.map((s, i) => base[i] + (s.total ? s.share[p] : 0));
    const upper = pts.map((s, i) => `${x(i).toFixed(1)},${(H - top[i] * H).toFixed(1)}`);
    const lower = pts.map((s, i) => `${x(i).toFixed(1)},${(H - base[i] * H).toFixed(1)}`);
    if (pts.some(s => s.total && s.share[p] > 0)) {
      paths += `<polygon data-pool="${esc(p)}" fill="${color(p)}" fill-opacity="0.85" ` +
        `points="${upper.join(" ")} ${lower.reverse().join(" ")}"/>`;
    }
    top.forEach((v, i) => { base[i] = v; });
  }
  document.getElementById("share").innerHTML =
    `<svg viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" role="img" ` +
    `aria-label="traffic share per pool">${paths}</svg>`;
  const last = pts.length ? pts[pts.length - 1] : null;
  document.getElementById("share-legend").innerHTML = pools.map(p =>
    `<span><i data-color="${color(p)}"></i>${esc(p)} ` +
    `${last && last.total ? sig(100 * last.share[p]) + "%" : ""}</span>`).join("");
  for (const i of document.querySelectorAll("#share-legend i[data-color]")) {
    i.style.background = i.dataset.color;  // CSSOM, allowed by the page's CSP
  }
  const busy = pts.filter(s => s.total).length;
  document.getElementById("share-note").textContent =
    `last ${Math.round(pts.length * INTERVAL_S)} s, ${busy} intervals with traffic`;
}

function renderDecisions() {
  const rows = ui.decisions.map(d => {
    const chips = d.candidates.slice(0, 6).map(c =>
      `<span class="chip ${c.endpoint === d.chosen ? "win" : ""}">${esc(c.pool)} ${sig(c.score)}</span>`
    ).join("") + (d.candidates.length > 6 ? `<span class="chip">+${d.candidates.length - 6}</span>` : "");
    const open = d.request_id === ui.openDecision ? "open" : "";
    return `<tr class="${open}" data-request="${esc(d.request_id)}"><td>${clock(d.at)}</td>
      <td>${esc(d.request_id.slice(0, 8))}</td><td>${esc(d.model)}</td><td>${esc(d.policy)}</td>
      <td>${esc(d.chosen_pool || "none")}</td><td>${esc(d.reason)}</td><td>${chips}</td>
      <td>${d.attempts.map(a => esc(a.status)).join(" → ")}</td></tr>`;
  }).join("");
  document.querySelector("#decisions tbody").innerHTML = rows ||
    '<tr><td colspan="8" class="empty">no routing decisions yet</td></tr>';
  renderDecisionDetail();
}

function renderDecisionDetail() {
  const box = document.getElementById("decision");
  const d = ui.decisions.find(x => x.request_id === ui.openDecision);
  if (!d) { box.hidden = true; return; }
  const chosen = d.candidates.find(c => c.endpoint === d.chosen);
  const scorers = [...new Set(d.candidates.flatMap(c => Object.keys(c.scores)))];
  const rows = d.candidates.map(c => `<tr data-candidate="${esc(c.endpoint)}">
    <td>${c.rank}</td><td>${esc(c.endpoint)}</td><td>${esc(c.pool)}</td><td>${esc(c.accelerator)}</td>
    <td class="n">${sig(c.score)}</td>${scorers.map(s => `<td class="n">${
      c.scores[s] == null ? "–" : sig(c.scores[s])}</td>`).join("")}
    <td class="n">${fmtOr(c.estimates.ttft_s, "ms")}</td><td class="n">${fmtOr(c.estimates.tpot_s, "ms")}</td>
    <td class="n">${fmtOr(c.estimates.usd_per_mtok, "usd")}</td>
    <td>${c.estimates.meets_slo == null ? "–" : c.estimates.meets_slo ? "yes" : "no"}</td>
    <td class="why">${esc(whyLost(c, chosen, d))}</td></tr>`).join("");
  const rejected = Object.entries(d.rejected || {}).map(([ep, why]) =>
    `<tr data-rejected="${esc(ep)}"><td>${esc(ep)}</td><td>${esc(why)}</td></tr>`).join("");
  box.innerHTML = `<h3>request ${esc(d.request_id)} · ${esc(d.model)} · policy ${esc(d.policy)}
      · ${clock(d.at)} <button type="button" id="close-decision">close</button></h3>
    <p>${esc(d.reason)}; chosen <b>${esc(d.chosen || "none")}</b>; attempts:
      ${d.attempts.map(a => esc(`${a.endpoint} ${a.status}`)).join(", ") || "none"}</p>
    <table class="grid"><thead><tr><th>rank</th><th>endpoint</th><th>pool</th><th>GPU</th>
      <th>score</th>${scorers.map(s => `<th>${esc(s)}</th>`).join("")}<th>TTFT est.</th>
      <th>TPOT est.</th><th>$/Mtok est.</th><th>meets SLO</th><th>why</th></tr></thead>
      <tbody>${rows}</tbody></table>
    ${rejected ? `<h3>rejected before scoring</h3><table class="grid"><tbody>${rejected}</tbody></table>` : ""}`;
  box.hidden = false;
  document.getElementById("close-decision").onclick = () => { ui.openDecision = null; renderDecisions(); };
}

function fmtOr(v, fmt) { return typeof v === "number" && isFinite(v) ? FORMATS[fmt](v) : "–"; }

// Why a candidate is not first: what the router's numbers say, in words.
function whyLost(c, chosen, d) {
  if (c.endpoint === d.chosen) return "chosen";
  if (!chosen) return `rank ${c.rank}`;
  const e = c.estimates || {}, w = chosen.estimates || {};
  if (e.fits_context === 0) return "the request does not fit its context";
  if (e.meets_slo === 0 && w.meets_slo !== 0) {
    return `predicted to miss the SLO (TTFT ${fmtOr(e.ttft_s, "ms")}, TPOT ${fmtOr(e.tpot_s, "ms")})`;
  }
  let worst = null, gap = 0;
  for (const [s, v] of Object.entries(c.scores)) {
    const g = (chosen.scores[s] ?? 0) - v;
    if (g > gap) { gap = g; worst = s; }
  }
  const detail = {
    cost: `$${fmtOr(e.usd_per_mtok, "num")} vs $${fmtOr(w.usd_per_mtok, "num")}/Mtok predicted`,
    latency: `e2e ${fmtOr(e.e2e_s, "ms")} vs ${fmtOr(w.e2e_s, "ms")} predicted`,
    slo: `TTFT ${fmtOr(e.ttft_s, "ms")}, TPOT ${fmtOr(e.tpot_s, "ms")} predicted`,
    queue: `load ${fmtOr(e.load, "num")} vs ${fmtOr(w.load, "num")}`,
    kv_headroom: `KV headroom ${fmtOr(e.kv_headroom_tokens, "int")} vs ${fmtOr(w.kv_headroom_tokens, "int")} tokens`,
  };
  if (worst) {
    return `lower ${worst} score ${sig(c.scores[worst])} vs ${sig(chosen.scores[worst])}` +
      (detail[worst] ? ` (${detail[worst]})` : "");
  }
  return `tie on scores (${sig(c.score)}): the picker put it at rank ${c.rank}`;
}

function costTable(id, rows, keyName) {
  const cols = [["requests", "int"], ["input_tokens", "int"], ["output_tokens", "int"],
    ["gpu_hours", "num"], ["usd", "usd"], ["failed_usd", "usd"], ["usd_per_mtok", "usd"],
    ["tokens_per_usd", "int"]];
  const head = `<thead><tr><th>${keyName}</th>${cols.map(([c]) =>
    `<th>${c.replace(/_/g, " ").replace("usd", "$")}</th>`).join("")}</tr></thead>`;
  const body = rows.map(r => `<tr data-row="${esc(r[keyName])}"><td>${esc(r[keyName])}</td>${
    cols.map(([c, f]) => `<td class="n">${val(id, r[keyName], c, r[c], f)}</td>`).join("")}</tr>`);
  return head + `<tbody>${body.join("") ||
    `<tr><td colspan="${cols.length + 1}" class="empty">no traffic yet</td></tr>`}</tbody>`;
}

function renderCosts(costs) {
  document.getElementById("tenants").innerHTML = costTable("costs.tenants", costs.tenants, "tenant");
  document.getElementById("costpools").innerHTML = costTable("costs.pools", costs.pools, "pool");
}

function renderShadow(shadow) {
  const box = document.getElementById("shadow");
  const rows = shadow && shadow.candidates ? shadow.candidates : [];
  ui.shadowMissing = rows.length ? 0 : ui.shadowMissing + 1;
  if (!rows.length) {
    box.innerHTML = '<div class="empty" id="no-shadow">no shadow configured</div>';
    return;
  }
  const fig = (r, k, fmt) => fmtOr(r ? r[k] : null, fmt);
  box.innerHTML = `<table class="grid"><thead><tr><th>shadow pool</th><th>serving pool</th>
    <th>mirrored</th><th>failed</th><th>skipped (budget)</th><th>$ shadow</th>
    <th>TTFT ms shadow / serving</th><th>TPOT ms shadow / serving</th>
    <th>$/Mtok shadow / serving</th></tr></thead><tbody>${rows.map(r => `<tr>
    <td>${esc(r.pool)}</td><td>${esc(r.serving_pool)}</td><td class="n">${fig(r, "mirrored", "int")}</td>
    <td class="n">${fig(r, "failed", "int")}</td><td class="n">${fig(r, "skipped_budget", "int")}</td>
    <td class="n">${fig(r, "usd", "usd")}</td>
    <td class="n">${fig(r, "ttft_ms", "num")} / ${fig(r.serving, "ttft_ms", "num")}</td>
    <td class="n">${fig(r, "tpot_ms", "num")} / ${fig(r.serving, "tpot_ms", "num")}</td>
    <td class="n">${fig(r, "usd_per_mtok", "usd")} / ${fig(r.serving, "usd_per_mtok", "usd")}</td>
    </tr>`).join("")}</tbody></table>`;
}

// ------------------------------------------------------------------ wiring

document.addEventListener("DOMContentLoaded", () => {
  document.querySelector("#decisions tbody").addEventListener("click", ev => {
    const tr = ev.target.closest("tr[data-request]");
    if (!tr) return;
    ui.openDecision = ui.openDecision === tr.dataset.request ? null : tr.dataset.request;
    renderDecisions();
  });
  document.getElementById("pause").addEventListener("click", ev => {
    ui.paused = !ui.paused;
    ev.target.textContent = ui.paused ? "Resume" : "Pause";
    document.body.dataset.paused = String(ui.paused);
    if (ui.paused) { clearTimeout(ui.timer); setStatus("polling stopped", false); } else poll();
  });
  document.getElementById("login").addEventListener("submit", ev => {
    ev.preventDefault();
    sessionStorage.setItem(KEY_STORE, document.getElementById("key").value.trim());
    document.getElementById("key").value = "";
    poll();
  });
  document.getElementById("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORE);
    location.reload();
  });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) poll(); });
  poll();
});
