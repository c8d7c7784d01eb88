// The daemon's web dashboard: one page that reads the JSON API (service.h) and redraws every two seconds. The
// selected job (a click, or #job=ID in the address) shows its events and its live metrics: the latest figures and
// loss and tokens/s charts (Chart.js, served by the daemon at /chart.js), and a link to its run report.
#include "crosstrain/scheduler/dashboard.h"

#include <string>

namespace crosstrain::scheduler {
namespace {

constexpr const char* kHead = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>crosstrain scheduler</title>
<style>
body{font-family:system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
table{border-collapse:collapse;font-size:13px;min-width:600px}
th,td{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left} th{background:#f4f4f4}
.up{color:#1a7f37}.down{color:#cf222e}.state-running{color:#1a7f37}.state-failed{color:#cf222e}
.state-queued{color:#9a6700}.muted{color:#777} .bar{background:#e8e8e8;width:120px;height:10px;display:inline-block}
.bar>span{background:#2f81f7;height:10px;display:block}
#jobs tbody tr{cursor:pointer} #jobs tr.selected{background:#eef4ff}
.figures{display:flex;gap:24px;font-size:14px;align-items:baseline} .figures b{font-size:18px}
.charts{display:flex;gap:16px;margin-top:8px} .chart{position:relative;width:460px;height:200px}
#metrics.empty .charts,#metrics.empty #m-report{display:none}
</style>
<script src="/chart.js"></script></head>
)HTML";

constexpr const char* kBody = R"HTML(<body data-status="loading">
<h1>crosstrain scheduler</h1><div class="muted" id="summary">loading...</div>
<h2>Clusters (resource layer)</h2><table id="clusters"><thead><tr><th>cluster</th><th>device</th><th>devices</th>
<th>in use</th><th>state</th><th>price / device-hour</th><th>power / device</th></tr></thead><tbody></tbody></table>
<h2>Links between clusters</h2><table id="links"><thead><tr><th>between</th><th>bandwidth</th><th>latency</th></tr></thead>
<tbody></tbody></table>
<h2>Jobs (queue and placements)</h2><table id="jobs"><thead><tr><th>id</th><th>name</th><th>state</th><th>ranks</th>
<th>placement</th><th>sync</th><th>progress</th><th>attempts</th><th>note</th></tr></thead><tbody></tbody></table>
<h2>Usage (device-hours by user and cluster; steps, tokens and FLOPs as the clusters signed them in the ledger)</h2>
<table id="usage"><thead><tr><th>user</th><th>cluster</th><th>device-hours</th><th>steps</th><th>tokens</th>
<th>PFLOP</th><th>ledger</th></tr></thead><tbody></tbody></table>
<h2>Live metrics of job <span id="metrics-job">-</span></h2>
<div id="metrics" class="empty" data-rows="0" data-chart="none">
<div class="figures"><span>step <b id="m-step">-</b></span><span>loss <b id="m-loss">-</b></span>
<span>tokens/s <b id="m-tps">-</b></span><span>MFU <b id="m-mfu">-</b></span>
<a id="m-report" href="#" target="_blank">run report</a></div>
<div class="muted" id="m-note"></div>
<div class="charts"><div class="chart"><canvas id="chart-loss"></canvas></div>
<div class="chart"><canvas id="chart-tps"></canvas></div></div></div>
<h2>Events of job <span id="event-job">-</span></h2><table id="events"><thead><tr><th>since submitted (s)</th><th>event</th>
<th>detail</th></tr></thead><tbody></tbody></table>
)HTML";

constexpr const char* kTablesScript = R"HTML(<script>
function cell(text, cls) { const td = document.createElement('td'); td.textContent = text; if (cls) td.className = cls; return td; }
function fill(id, rows) { const body = document.querySelector('#' + id + ' tbody'); body.replaceChildren(...rows); }
function row(cells) { const tr = document.createElement('tr'); tr.append(...cells); return tr; }
function where(p) {
  return p ? p.shares.map(s => (s.absent ? '(' : '') + s.cluster + ':' + s.ranks + (s.absent ? ' absent)' : '')).join(' + ') : '';
}
function progress(j) {
  const td = document.createElement('td'); const bar = document.createElement('span'); bar.className = 'bar';
  const fill = document.createElement('span'); fill.style.width = Math.min(100, 100 * j.step / Math.max(1, j.steps)) + '%';
  bar.append(fill); td.append(bar, document.createTextNode(' ' + j.step + ' / ' + j.steps)); return td;
}
// The token the page was opened with (#token=...), kept for the tab: every API call sends it.
const token = (/token=([^&]+)/.exec(location.hash) || [])[1] || sessionStorage.getItem('crosstrain-token');
if (token) sessionStorage.setItem('crosstrain-token', token);
const api = path => fetch(path, token ? {headers: {Authorization: 'Bearer ' + token}} : {});
const fromHash = /job=(\d+)/.exec(location.hash);
let selected = fromHash ? Number(fromHash[1]) : null;
function select(id) { selected = id; history.replaceState(null, '', '#job=' + id); refresh(); }
async function refresh() {
  try {
    const [clusters, jobs, usage] = await Promise.all([api('/api/clusters').then(r => r.json()),
      api('/api/jobs').then(r => r.json()), api('/api/usage').then(r => r.json())]);
    fill('usage', usage.map(u => row([cell(u.user), cell(u.cluster), cell(u.device_hours.toFixed(3)), cell(u.steps),
      cell(u.tokens), cell((u.flops / 1e15).toFixed(3)), cell(u.ledger || '-')])));
    fill('clusters', clusters.clusters.map(c => row([cell(c.name), cell(c.device), cell(c.devices), cell(c.devices - c.free),
      cell(c.up ? 'up' : 'lost', c.up ? 'up' : 'down'), cell(c.price_per_device_hour.toFixed(2)), cell(c.power_w + ' W')])));
    fill('links', clusters.links.map(l => row([cell(l.a + ' - ' + l.b), cell((l.bandwidth_Bps * 8 / 1e9).toFixed(1) + ' Gbit/s'),
      cell((l.latency_s * 1e3).toFixed(1) + ' ms')])));
    if (selected === null && jobs.length) selected = (jobs.find(j => j.placement) || jobs[jobs.length - 1]).id;
    fill('jobs', jobs.map(j => { const tr = row([cell(j.id), cell(j.name), cell(j.state, 'state-' + j.state), cell(j.ranks),
      cell(where(j.placement)), cell(j.placement ? j.placement.sync : ''), progress(j), cell(j.attempts), cell(j.reason, 'muted')]);
      if (j.id === selected) tr.className = 'selected';
      tr.onclick = () => select(j.id); return tr; }));
    const running = jobs.filter(j => j.state === 'running').length, queued = jobs.filter(j => j.state === 'queued').length;
    document.getElementById('summary').textContent = clusters.clusters.length + ' clusters, ' + jobs.length + ' jobs: ' +
      running + ' running, ' + queued + ' queued';
    if (selected !== null) {
      const events = await api('/api/jobs/' + selected + '/events').then(r => r.json());
      document.getElementById('event-job').textContent = selected;
      const evs = Array.isArray(events) ? events : [], t0 = evs.length ? evs[0].time_s : 0;
      fill('events', evs.map(e => row([cell('+' + (e.time_s - t0).toFixed(3)), cell(e.kind), cell(e.detail)])));
      await refreshMetrics(jobs.find(j => j.id === selected) || {id: selected, name: 'unknown', attempts: 0, spec: {}});
    }
    document.body.dataset.status = 'ok';
  } catch (e) {
    document.body.dataset.status = 'error: ' + e;
  }
}
</script>
)HTML";

// The selected job's rows are kept between redraws; each poll asks only for the steps past the last one it has
// (?since=), and a new placement (attempt) starts over, since a resumed run rewrites the steps after its checkpoint.
constexpr const char* kMetricsScript = R"HTML(<script>
const metrics = {job: null, attempts: null, rows: [], charts: {}};
function show(id, text) { document.getElementById(id).textContent = text; }
function fixed(v, digits) { return typeof v === 'number' ? v.toFixed(digits) : '-'; }
async function refreshMetrics(job) {
  if (metrics.job !== job.id || metrics.attempts !== job.attempts) {
    Object.values(metrics.charts).forEach(c => c.destroy());
    Object.assign(metrics, {job: job.id, attempts: job.attempts, rows: [], charts: {}});
  }
  const last = metrics.rows.length ? metrics.rows[metrics.rows.length - 1].step : null;
  const reply = await api('/api/jobs/' + job.id + '/metrics' + (last === null ? '' : '?since=' + last));
  const fresh = reply.ok ? await reply.json() : [];
  if (metrics.job !== job.id) return;  // another job was selected meanwhile
  const have = metrics.rows.length ? metrics.rows[metrics.rows.length - 1].step : -Infinity;  // two polls may overlap
  metrics.rows = metrics.rows.concat(fresh.filter(r => !(r.step <= have))).slice(-1000);
  drawMetrics(job);
}
function drawMetrics(job) {
  const rows = metrics.rows, latest = rows.length ? rows[rows.length - 1] : {}, box = document.getElementById('metrics');
  show('metrics-job', job.id + ' (' + job.name + ')');
  box.dataset.rows = rows.length;
  box.classList.toggle('empty', !rows.length);
  show('m-step', latest.step ?? '-'); show('m-loss', fixed(latest.loss, 4));
  show('m-tps', typeof latest.tokens_per_s === 'number' ? Math.round(latest.tokens_per_s).toLocaleString('en') : '-');
  show('m-mfu', typeof latest.mfu === 'number' ? (100 * latest.mfu).toFixed(1) + '%' : '-');
  document.getElementById('m-report').href = '/api/jobs/' + job.id + '/report' + (token ? '?access_token=' + token : '');
  if (!rows.length) {
    box.dataset.chart = 'none';
    return show('m-note', job.spec && job.spec.recipe ? 'no metrics yet: the job has not trained a step'
                                                     : 'no metrics: a simulated job (no recipe) has no run folder');
  }
  if (typeof Chart === 'undefined') {
    box.dataset.chart = 'none';
    return show('m-note', 'no charts: the daemon serves no /chart.js (apt-get install libjs-chart.js)');
  }
  show('m-note', rows.length + ' steps shown (the newest 1000 at most)');
  plot('chart-loss', 'loss', [['loss', 'loss', '#2f81f7', 0], ['val_loss', 'validation loss', '#cf222e', 3]]);
  plot('chart-tps', 'tokens/s', [['tokens_per_s', 'tokens/s', '#1a7f37', 0]]);
  box.dataset.chart = 'drawn';
}
function plot(id, title, series) {
  const datasets = series.map(([key, label, color, radius]) => ({label, borderColor: color, backgroundColor: color,
    borderWidth: 1.5, pointRadius: radius, data: metrics.rows.filter(r => typeof r[key] === 'number')
      .map(r => ({x: r.step, y: r[key]}))})).filter(d => d.data.length);
  const chart = metrics.charts[id];
  if (chart) { chart.data.datasets = datasets; return chart.update('none'); }
  metrics.charts[id] = new Chart(document.getElementById(id), {type: 'line', data: {datasets},
    options: {animation: false, maintainAspectRatio: false, parsing: false,
              scales: {x: {type: 'linear', ticks: {precision: 0}, title: {display: true, text: 'step'}}, y: {title: {display: true, text: title}}},
              plugins: {legend: {labels: {boxWidth: 12}}}}});
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
)HTML";

}  // namespace

const char* dashboard_html() {
  static const std::string page = std::string(kHead) + kBody + kTablesScript + kMetricsScript;
  return page.c_str();
}

}  // namespace crosstrain::scheduler
