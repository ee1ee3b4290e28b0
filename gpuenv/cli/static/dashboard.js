// gpuenv dashboard: reads /api/gpus, /api/usage and the server-drawn charts, and builds
// the page with DOM calls only (text is never parsed as HTML).
"use strict";

let chartWindow = "1h";
const CHARTS = ["utilization", "memory_used_mib", "temperature_c", "power_w"];

// Control characters, bidirectional overrides (which reorder what is shown) and line
// separators in text from users, engines or GPUs are shown as escapes, as the terminal
// views show them (gpuenv/common/text.py); very long text is cut.
const HIDDEN = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const TEXT_LIMIT = 500;

function visible(text, limit = TEXT_LIMIT) {
  const shown = text.replace(HIDDEN, (c) => {
    const code = c.charCodeAt(0);
    return code < 0x100 ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u${code.toString(16).padStart(4, "0")}`;
  });
  if (shown.length <= limit) return shown;
  const tail = `… (${text.length} chars)`;
  return shown.slice(0, limit - tail.length) + tail;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(visible(String(child))));
  }
  return node;
}

function duration(seconds) {
  seconds = Math.max(0, Math.floor(seconds));
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60);
  if (h) return `${h}h${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m${String(seconds % 60).padStart(2, "0")}s`;
  return `${seconds}s`;
}

function clock(epoch) {
  return new Date(epoch * 1000).toLocaleString([], { dateStyle: "short", timeStyle: "short" });
}

function meter(label, value, max, text, hot) {
  const share = value === null || max === null || !max ? 0 : Math.min(100, (100 * value) / max);
  const fill = el("div");
  fill.style.width = `${share}%`; // CSSOM, not a style attribute: the page's CSP allows no inline style
  const bar = el("div", { class: "bar" + (hot ? " hot" : "") }, fill);
  return [el("span", {}, label), bar, el("span", {}, value === null ? "n/a" : text)];
}

function holderLine(gpu, now) {
  const h = gpu.holder;
  if (!h) {
    const others = gpu.users.filter((u) => !u.run);
    if (others.length) return el("p", { class: "holder" }, "used outside gpuenv by " + others.map((u) => u.user || "?").join(", "));
    if (gpu.unfit) return el("p", { class: "holder unfit" }, gpu.unfit);
    return el("p", { class: "holder free" }, "free");
  }
  const idle = h.idle_seconds === null ? "" : `, idle ${duration(h.idle_seconds)}`;
  const run = h.run ? ` run ${h.run}` : "";
  const ports = h.ports && h.ports.length ? `, ports ${h.ports.join(" ")}` : "";
  return el("p", { class: "holder" }, `held by ${h.user} (${h.project}${run}${h.detached ? ", detached" : ""}${ports}) since ${clock(h.since)} — ${duration(now - h.since)}${idle}`);
}

function gpuCard(gpu, now) {
  const temp = gpu.temperature_c;
  const slow = gpu.slowdown_temperature_c;
  const tempText = temp === null ? "n/a" : `${temp} °C` + (slow ? ` / ${slow} °C` : "");
  const memText = gpu.memory_used_mib === null ? "n/a" : `${gpu.memory_used_mib} / ${gpu.memory_total_mib} MiB`;
  const powerText = gpu.power_w === null ? "n/a" : `${Math.round(gpu.power_w)} / ${gpu.power_limit_w === null ? "?" : Math.round(gpu.power_limit_w)} W`;
  const meters = el("div", { class: "meters" },
    ...meter("utilization", gpu.utilization, 100, `${gpu.utilization} %`),
    ...meter("memory", gpu.memory_used_mib, gpu.memory_total_mib, memText),
    ...meter("temperature", temp, slow || 100, tempText, slow !== null && temp !== null && temp >= slow - 5),
    ...meter("power", gpu.power_w, gpu.power_limit_w, powerText));
  const findings = el("ul", { class: "findings" });
  for (const f of gpu.health) {
    findings.append(el("li", { class: f.severity }, f.message, el("span", { class: "remedy" }, "→ " + f.remedy)));
  }
  for (const x of gpu.recent_xids) {
    findings.append(el("li", { class: "warn" }, `XID ${x.xid} at ${clock(x.at)}`));
  }
  const reasons = gpu.clocks_event_reasons.filter((r) => r !== "gpu_idle");
  const charts = el("div", { class: "charts", "data-gpu": gpu.key });
  for (const reading of CHARTS) charts.append(el("div", { class: "chart-slot", "data-reading": reading }));
  const card = el("article", { class: "gpu", "data-key": gpu.key },
    el("h3", {}, `GPU ${gpu.index}: ${gpu.name}`),
    holderLine(gpu, now), meters,
    reasons.length ? el("p", {}, "clock events: " + reasons.join(", ")) : null,
    findings.children.length ? findings : null, charts);
  for (const mig of gpu.mig) {
    const who = mig.holder ? `held by ${mig.holder.user} (${mig.holder.project})` : "free";
    card.append(el("p", {}, `MIG ${gpu.index}:${mig.index} ${mig.profile || ""}: ${who}`));
  }
  return card;
}

async function getJson(url) {
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`${url}: ${response.status} ${(await response.json()).error || ""}`);
  return response.json();
}

async function loadCharts() {
  for (const slot of document.querySelectorAll(".chart-slot")) {
    const gpu = slot.parentElement.getAttribute("data-gpu");
    const reading = slot.getAttribute("data-reading");
    const params = new URLSearchParams({ gpu, window: chartWindow, reading });
    const response = await fetch(`/chart.svg?${params}`, { credentials: "same-origin" });
    if (!response.ok) continue;
    const doc = new DOMParser().parseFromString(await response.text(), "image/svg+xml");
    slot.replaceChildren(document.importNode(doc.documentElement, true));
  }
}

function rows(table, items, cells) {
  const body = table.querySelector("tbody");
  body.replaceChildren();
  if (!items.length) body.append(el("tr", {}, el("td", { class: "empty", colspan: "5" }, "none")));
  for (const item of items) body.append(el("tr", {}, ...cells(item).map((c) => el("td", {}, c))));
}

async function loadGpus() {
  const data = await getJson("/api/gpus");
  document.getElementById("hostname").textContent = visible(data.hostname);
  const driver = data.host.driver ? `driver ${data.host.driver}` : "no NVIDIA driver";
  const history = data.history;
  const sampled = history.last_sample ? `, last sample ${clock(history.last_sample)}` : "";
  document.getElementById("host").textContent = visible(
    `${driver} · ${data.gpus.length} GPU(s) · history: ${history.source || "none"} (sampler: ${history.sampler}${sampled})` +
    (history.note ? ` · ${history.note}` : "") + (data.engine_note ? ` · ${data.engine_note}` : ""), 2000);
  const known = Array.from(document.querySelectorAll(".gpu")).map((n) => n.getAttribute("data-key")).join();
  const fresh = data.gpus.map((g) => g.key).join();
  const grid = document.getElementById("gpus");
  const slots = new Map(Array.from(document.querySelectorAll(".chart-slot")).map((s) => [s.parentElement.getAttribute("data-gpu") + s.getAttribute("data-reading"), s]));
  grid.replaceChildren(...data.gpus.map((g) => gpuCard(g, data.generated)));
  if (!data.gpus.length) grid.append(el("p", { class: "empty" }, data.host.note || "no NVIDIA GPU on this host"));
  // keep the charts drawn so far until the next chart refresh
  for (const slot of document.querySelectorAll(".chart-slot")) {
    const old = slots.get(slot.parentElement.getAttribute("data-gpu") + slot.getAttribute("data-reading"));
    if (old) slot.replaceChildren(...old.childNodes);
  }
  if (known !== fresh) await loadCharts();
  const sizing = document.getElementById("sizing");
  sizing.replaceChildren(...data.sizing.map((f) => el("li", { class: f.status },
    `${f.check}: ${f.detail}`, f.remedy ? el("span", { class: "remedy" }, "→ " + f.remedy) : null)));
  rows(document.getElementById("queue"), data.queue, (w) => [w.user, clock(w.since)]);
  rows(document.getElementById("detached"), data.detached, (r) => [r.name, r.user, r.project, r.gpus, r.started]);
}

async function loadUsage() {
  const data = await getJson("/api/usage");
  const box = document.getElementById("usage");
  box.replaceChildren();
  for (const period of data.periods) {
    for (const [by, items] of [["user", period.by_user], ["project", period.by_project]]) {
      const head = el("tr", {}, el("th", {}, by), el("th", {}, "runs"), el("th", {}, "GPU-hours"),
        data.currency !== null ? el("th", {}, `cost (${data.currency})`) : null);
      const table = el("table", { class: "usage", "data-days": period.days, "data-by": by }, el("thead", {}, head), el("tbody"));
      for (const row of items) {
        table.tBodies[0].append(el("tr", {}, el("td", {}, row.key), el("td", { class: "number" }, row.runs),
          el("td", { class: "number" }, row.gpu_hours.toFixed(2)),
          data.currency !== null ? el("td", { class: "number" }, row.cost === undefined ? "unknown" : row.cost.toFixed(2)) : null));
      }
      if (!items.length) table.tBodies[0].append(el("tr", {}, el("td", { class: "empty", colspan: "4" }, "no usage recorded")));
      box.append(el("div", {}, el("h3", {}, `last ${period.days} days, by ${by}`), table));
    }
  }
}

async function refresh(what) {
  const status = document.getElementById("status");
  try {
    await what();
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    status.textContent = `cannot update: ${error.message}`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("[data-window]")) {
    button.addEventListener("click", () => {
      chartWindow = button.getAttribute("data-window");
      for (const b of document.querySelectorAll("[data-window]")) b.classList.toggle("on", b === button);
      refresh(loadCharts);
    });
  }
  refresh(async () => { await loadGpus(); await loadCharts(); await loadUsage(); });
  setInterval(() => refresh(loadGpus), 5000);
  setInterval(() => refresh(loadCharts), 30000);
  setInterval(() => refresh(loadUsage), 60000);
});
