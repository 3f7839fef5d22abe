// atomix view: draws each run table's plot with Plotly (bundled, served from /vendor).
// Hover a bar for its cell, N, interval and trials; click it to list those trials.
function atomixPlots() {
  if (typeof Plotly === "undefined") return;
  document.querySelectorAll(".plot[data-plot]:not([data-drawn])").forEach(function (el) {
    var spec = JSON.parse(el.dataset.plot);
    var traces = spec.traces.map(function (t) {
      return {
        type: "bar", name: t.name, x: t.x, y: t.y, customdata: t.custom,
        error_y: {type: "data", symmetric: false, array: t.hi, arrayminus: t.lo, thickness: 1.2, width: 3},
        hovertemplate: "<b>%{customdata[5]}</b> · %{customdata[0]}<br>value %{customdata[2]}" +
          "<br>N = %{customdata[1]}<br>95% CI %{customdata[3]}<br>%{customdata[4]}<extra></extra>"
      };
    });
    var layout = {
      barmode: "group", margin: {l: 48, r: 8, t: 8, b: 40}, height: 300,
      yaxis: {title: {text: spec.unit}, rangemode: "tozero", gridcolor: "#e6e8eb"},
      xaxis: {type: "category"}, legend: {orientation: "h", y: -0.18, font: {size: 11}},
      font: {family: "system-ui, sans-serif", size: 12}, plot_bgcolor: "#fff", paper_bgcolor: "#fff"
    };
    Plotly.newPlot(el, traces, layout, {displaylogo: false, responsive: true,
                                        modeBarButtonsToRemove: ["lasso2d", "select2d"]});
    el.setAttribute("data-drawn", "yes");
    if (el.dataset.link) {
      el.on("plotly_click", function (ev) {
        var c = ev.points[0].customdata;
        var q = new URLSearchParams({run: el.dataset.run, mode: c[5], cell: c[0]});
        window.location = "/trials?" + q.toString();
      });
    }
  });
}

// Tables that arrive later (a large run's, built in the background) are drawn when swapped in.
document.addEventListener("htmx:afterSettle", function () { atomixPlots(); });
