// The spend chart: the only part of the auditor's page that needs JavaScript (the numbers are in
// the table beside it). Reads the JSON block the server rendered; builds no HTML from its text.
(function () {
  "use strict";
  function draw() {
    var holder = document.getElementById("spend-chart");
    var source = document.getElementById("spend-data");
    if (!holder || !source || typeof uPlot === "undefined") { return; }
    var data;
    try { data = JSON.parse(source.textContent); } catch (err) { return; }
    if (!data.x || data.x.length === 0 || data.series.length === 0) { return; }
    var colours = ["#23395d", "#d1495b", "#2e933c", "#edae49", "#00798c", "#7b4b94", "#8c564b", "#5f6b6d"];
    var series = [{}];
    var columns = [data.x];
    data.series.forEach(function (s, i) {
      series.push({ label: String(s.plugin), stroke: colours[i % colours.length], width: 2,
                    value: function (u, v) { return v == null ? "-" : "$" + v.toFixed(6); } });
      columns.push(s.usd);
    });
    var width = Math.max(320, Math.min(1100, holder.clientWidth || 900));
    new uPlot({ width: width, height: 260, series: series,
                axes: [{}, { values: function (u, vals) { return vals.map(function (v) { return "$" + v; }); } }],
                scales: { x: { time: true } } }, columns, holder);
    holder.setAttribute("data-drawn", "1");
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", draw); } else { draw(); }
})();
