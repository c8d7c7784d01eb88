// The daemon's web dashboard: one page that reads the JSON API (service.h) and redraws every two seconds.
#include "crosstrain/scheduler/dashboard.h"

namespace crosstrain::scheduler {

const char* dashboard_html() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>crosstrain scheduler</title>
<style>
body{font-family:system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
table{border-collapse:collapse;font-size:13px;min-width:600px}
th,td{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left} th{background:#f4f4f4}
.up{color:#1a7f37}.down{color:#cf222e}.state-running{color:#1a7f37}.state-failed{color:#cf222e}
.state-queued{color:#9a6700}.muted{color:#777} .bar{background:#e8e8e8;width:120px;height:10px;display:inline-block}
.bar>span{background:#2f81f7;height:10px;display:block}
</style></head>
<body data-status="loading">
<h1>crosstrain scheduler</h1><div class="muted" id="summary">loading...</div>
<h2>Clusters (resource layer)</h2><table id="clusters"><thead><tr><th>cluster</th><th>device</th><th>devices</th>
<th>in use</th><th>state</th><th>price / device-hour</th><th>power / device</th></tr></thead><tbody></tbody></table>
<h2>Links between clusters</h2><table id="links"><thead><tr><th>between</th><th>bandwidth</th><th>latency</th></tr></thead>
<tbody></tbody></table>
<h2>Jobs (queue and placements)</h2><table id="jobs"><thead><tr><th>id</th><th>name</th><th>state</th><th>ranks</th>
<th>placement</th><th>sync</th><th>progress</th><th>attempts</th><th>note</th></tr></thead><tbody></tbody></table>
<h2>Events of job <span id="event-job">-</span></h2><table id="events"><thead><tr><th>time (s)</th><th>event</th>
<th>detail</th></tr></thead><tbody></tbody></table>
<script>
function cell(text, cls) { const td = document.createElement('td'); td.textContent = text; if (cls) td.className = cls; return td; }
function fill(id, rows) { const body = document.querySelector('#' + id + ' tbody'); body.replaceChildren(...rows); }
function row(cells) { const tr = document.createElement('tr'); tr.append(...cells); return tr; }
function where(p) { return p ? p.shares.map(s => s.cluster + ':' + s.ranks).join(' + ') : ''; }
function progress(j) {
  const td = document.createElement('td'); const bar = document.createElement('span'); bar.className = 'bar';
  const fill = document.createElement('span'); fill.style.width = Math.min(100, 100 * j.step / Math.max(1, j.steps)) + '%';
  bar.append(fill); td.append(bar, document.createTextNode(' ' + j.step + ' / ' + j.steps)); return td;
}
let selected = null;
async function refresh() {
  try {
    const [clusters, jobs] = await Promise.all([fetch('/api/clusters').then(r => r.json()), fetch('/api/jobs').then(r => r.json())]);
    fill('clusters', clusters.clusters.map(c => row([cell(c.name), cell(c.device), cell(c.devices), cell(c.devices - c.free),
      cell(c.up ? 'up' : 'lost', c.up ? 'up' : 'down'), cell(c.price_per_device_hour.toFixed(2)), cell(c.power_w + ' W')])));
    fill('links', clusters.links.map(l => row([cell(l.a + ' - ' + l.b), cell((l.bandwidth_Bps * 8 / 1e9).toFixed(1) + ' Gbit/s'),
      cell((l.latency_s * 1e3).toFixed(1) + ' ms')])));
    fill('jobs', jobs.map(j => { const tr = row([cell(j.id), cell(j.name), cell(j.state, 'state-' + j.state), cell(j.ranks),
      cell(where(j.placement)), cell(j.placement ? j.placement.sync : ''), progress(j), cell(j.attempts), cell(j.reason, 'muted')]);
      tr.onclick = () => { selected = j.id; refresh(); }; return tr; }));
    const running = jobs.filter(j => j.state === 'running').length, queued = jobs.filter(j => j.state === 'queued').length;
    document.getElementById('summary').textContent = clusters.clusters.length + ' clusters, ' + jobs.length + ' jobs: ' +
      running + ' running, ' + queued + ' queued';
    if (selected === null && jobs.length) selected = (jobs.find(j => j.placement) || jobs[jobs.length - 1]).id;
    if (selected !== null) {
      const events = await fetch('/api/jobs/' + selected + '/events').then(r => r.json());
      document.getElementById('event-job').textContent = selected;
      fill('events', events.map(e => row([cell(e.time_s.toFixed(3)), cell(e.kind), cell(e.detail)])));
    }
    document.body.dataset.status = 'ok';
  } catch (e) {
    document.body.dataset.status = 'error: ' + e;
  }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
)HTML";
}

}  // namespace crosstrain::scheduler
