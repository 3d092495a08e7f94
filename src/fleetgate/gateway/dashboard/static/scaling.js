// fleetgate live dashboard: replicas and the bill per pool. An autoscaled pool's figures are
// /admin/scaling's (the scaler's last tick), a fixed pool's are /admin/endpoints'; the
// fleet's total is their sum. Uses dashboard.js's helpers (val, esc, sig); no dependencies.
"use strict";

const SLOT_STATES = ["ready", "starting", "draining"];

// The fleet's $/hour now and at the desired replica counts: scaled pools at the scaler's
// figures, fixed pools at every configured replica.
function fleetBill(endpoints, scaled) {
  let now = 0, desired = 0;
  for (const p of endpoints.pools) {
    const s = scaled[p.pool];
    now += s ? s.usd_per_hour : p.usd_per_hour;
    desired += s ? s.usd_per_hour_at_desired : p.usd_per_hour;
  }
  return {now, desired};
}

// One square per replica slot: filled by what the replica is doing, ringed up to the
// desired count; a fixed pool's replicas are ready or down.
function slots(counts, total, desired, rest = "off") {
  const out = [];
  for (const state of SLOT_STATES) {
    for (let i = 0; i < (counts[state] || 0); i++) out.push(state);
  }
  while (out.length < total) out.push(rest);
  return `<span class="slots">${out.map((state, i) =>
    `<i class="slot ${state}${i < desired ? " want" : ""}" title="${state}"></i>`).join("")}</span>`;
}

function scaledRow(p, s) {
  const S = (k, fmt) => val("scaling", p.pool, k, s[k], fmt);
  const slotCount = Math.max(s.max, s.ready + s.starting + s.draining, s.desired);
  const mode = s.actuated ? "auto · the gateway starts and stops replicas"
    : "auto · desired count published for KEDA / the HPA";
  return `<tr data-scaling="${esc(p.pool)}" data-mode="auto">
    <td><b>${esc(p.pool)}</b><div class="sub">${mode}</div></td>
    <td>${slots(s, slotCount, s.desired)}</td>
    <td class="n">${S("ready", "int")}</td><td class="n">${S("starting", "int")}</td>
    <td class="n">${S("draining", "int")}</td><td class="n"><b>${S("desired", "int")}</b></td>
    <td class="n">${S("min", "int")}–${S("max", "int")}</td>
    <td class="n">${S("usd_per_hour", "usd")}</td>
    <td class="n">${S("usd_per_hour_at_desired", "usd")}</td>
    <td class="n">${S("load_per_s")} / ${S("replica_capacity_per_s")}</td>
    <td class="why">${esc(s.reason)}</td></tr>`;
}

function fixedRow(p) {
  const P = (k, fmt) => val("endpoints.pools", p.pool, k, p[k], fmt);
  return `<tr data-scaling="${esc(p.pool)}" data-mode="fixed">
    <td><b>${esc(p.pool)}</b><div class="sub">fixed · no autoscale</div></td>
    <td>${slots({ready: p.ready}, p.endpoints, 0, "down")}</td>
    <td class="n">${P("ready", "int")}</td><td class="n">–</td><td class="n">–</td>
    <td class="n"><b>${P("endpoints", "int")}</b></td><td class="n">fixed</td>
    <td class="n">${P("usd_per_hour", "usd")}</td><td class="n">${P("usd_per_hour", "usd")}</td>
    <td class="n">–</td><td class="why">every configured replica is billed</td></tr>`;
}

function renderScaling(endpoints, scaling) {
  const scaled = (scaling && scaling.pools) || {};
  const bill = fleetBill(endpoints, scaled);
  const total = (k, v) => `<span class="v" data-src="derived" data-k="${k}" data-fmt="usd" ` +
    `data-value="${v}">${FORMATS.usd(v)}</span>`;
  const rows = endpoints.pools.map(p => scaled[p.pool] ? scaledRow(p, scaled[p.pool]) : fixedRow(p));
  document.getElementById("scaling").innerHTML = `<thead><tr><th>pool</th><th>replicas</th>
    <th>ready</th><th>starting</th><th>draining</th><th>desired</th><th>min–max</th>
    <th>$/hour now</th><th>$/hour at desired</th><th>req/s / per replica</th><th>why</th></tr></thead>
    <tbody>${rows.join("") || '<tr><td colspan="11" class="empty">no pools configured</td></tr>'}
    <tr class="total" data-scaling="fleet"><td><b>fleet</b></td><td colspan="6"></td>
    <td class="n"><b>${total("fleet_usd_per_hour", bill.now)}</b></td>
    <td class="n"><b>${total("fleet_usd_per_hour_at_desired", bill.desired)}</b></td>
    <td colspan="2"></td></tr></tbody>`;
  document.getElementById("scaling-note").textContent = Object.keys(scaled).length
    ? `${Object.keys(scaled).length} of ${endpoints.pools.length} pools autoscale`
    : "no pool autoscales";
  return bill;
}

// An endpoint the scaler keeps out of routing (``s``: its pool's /admin/scaling row): off
// (no engine, so its probe fails: expected, not an error; or its engine is stopping while
// the pool has no replica starting or draining), else starting or draining.
function parkedLabel(e, s) {
  const moving = !s || s.starting + s.draining > 0;
  return e.health === "ready" && moving
    ? '<span class="state-parked">parked</span> · starting or draining: no new request'
    : '<span class="state-parked">off</span> · parked by the scaler: no replica runs here';
}
