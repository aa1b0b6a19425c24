// roost dashboard: one server-sent-event stream says when the state changed; htmx then
// reloads each page's live region (hx-trigger="tick from:body") and the charts refetch
// /api/history. No build step: plain ES2017 against the vendored htmx and uPlot.
(function () {
  "use strict";
  // Show error answers (a refused or failed drain) in their target, as notices.
  htmx.config.responseHandling = [
    { code: "204", swap: false },
    { code: "[23]..", swap: true },
    { code: "[45]..", swap: true, error: true }
  ];
  var conn = document.getElementById("conn");
  var live = document.getElementById("live");
  var updated = document.getElementById("updated");
  var charts = {};

  function hhmmss(t) { return new Date(t * 1000).toISOString().substr(11, 8); }

  var SERIES = {
    capacity: [["cpu", "CPU %", "#2f6fb3"], ["mem", "Memory %", "#116329"], ["gpu", "GPU %", "#a40e26"]],
    launches: [["launches", "launches/min", "#2f6fb3"]],
    stranded: [["stranded", "stranded GPU %", "#c2410c"]]
  };
  var POOL = [["demand", "queued + running", "#2f6fb3"], ["desired", "desired", "#a40e26"], ["current", "current", "#116329"]];

  function width(el) { return Math.max(280, el.clientWidth - 4); }

  function draw(key, el, columns, defs, percent) {
    var data = [columns.t].concat(defs.map(function (d) { return columns[d[0]]; }));
    var chart = charts[key];
    if (chart && chart.root.isConnected) { chart.setData(data); return; }
    var opts = {
      width: width(el), height: 200,
      scales: { x: { time: true }, y: percent ? { range: [0, 100] } : {} },
      series: [{ value: function (u, v) { return v == null ? "–" : hhmmss(v); } }].concat(defs.map(function (d) {
        return { label: d[1], stroke: d[2], width: 2, spanGaps: true };
      })),
      axes: [{}, { size: 50 }]
    };
    el.innerHTML = "";
    charts[key] = new uPlot(opts, data, el);
  }

  function drawAll() {
    var els = document.querySelectorAll("[data-chart]");
    if (!els.length || typeof uPlot === "undefined") { return; }
    fetch("/api/history", { credentials: "same-origin" }).then(function (r) { return r.json(); }).then(function (h) {
      els.forEach(function (el) {
        var kind = el.dataset.chart;
        if (kind === "pools") {
          Object.keys(h.pools).forEach(function (pid) {
            var box = document.getElementById("pool-chart-" + pid);
            if (!box) {
              var fig = document.createElement("figure");
              fig.innerHTML = "<figcaption></figcaption><div class='chart' role='img'></div>";
              fig.querySelector("figcaption").textContent = "Pool " + pid + ": queued + running tasks, desired and current replicas";
              box = fig.querySelector(".chart");
              box.id = "pool-chart-" + pid;
              box.setAttribute("aria-label", "Chart of pool " + pid + " demand and replicas over time");
              el.appendChild(fig);
            }
            var cols = Object.assign({ t: h.t }, h.pools[pid]);
            draw("pool:" + pid, box, cols, POOL, false);
          });
        } else if (SERIES[kind]) {
          draw(kind, el, h, SERIES[kind], kind !== "launches");
        }
      });
      document.body.dataset.charted = String(h.t.length);
    }).catch(function () { /* the next tick tries again */ });
  }

  function connect() {
    if (!window.EventSource) { return; }
    var es = new EventSource("/stream");
    es.addEventListener("hello", function () { conn.textContent = "live"; conn.dataset.state = "live"; });
    es.addEventListener("tick", function (e) {
      var d = JSON.parse(e.data);
      conn.textContent = "live"; conn.dataset.state = "live";
      if (d.at) { updated.textContent = hhmmss(d.at); }
      document.body.dataset.seq = String(d.seq);
      // Not under a keyboard user's feet: while focus is inside the live region, a swap
      // would throw it back to the top of the page; the next tick after it leaves
      // brings the region up to date.
      if (!(live && live.contains(document.activeElement))) {
        htmx.trigger(document.body, "tick");
      }
      drawAll();
    });
    es.onerror = function () { conn.textContent = "reconnecting…"; conn.dataset.state = "down"; };
  }

  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (k) {
      var c = charts[k];
      if (c.root.isConnected) { c.setSize({ width: width(c.root.parentNode), height: 200 }); }
    });
  });
  // After a drain, reload the live region at once rather than at the next tick.
  document.body.addEventListener("htmx:afterRequest", function (e) {
    if (e.detail.requestConfig && e.detail.requestConfig.verb === "post") { htmx.trigger(document.body, "tick"); }
  });
  drawAll();
  connect();
})();
