// cast_rl trajectory viewer: filter and sort the episode index (no libraries, no network).
(function () {
  "use strict";
  var table = document.getElementById("episodes");
  if (!table) return;
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var field = function (id) { return document.getElementById(id); };
  var controls = ["f-text", "f-configuration", "f-domain", "f-outcome", "f-critiqued"].map(field);

  function apply() {
    var text = field("f-text").value.trim().toLowerCase();
    var conf = field("f-configuration").value, domain = field("f-domain").value;
    var outcome = field("f-outcome").value, critiqued = field("f-critiqued").checked;
    var shown = 0;
    rows.forEach(function (row) {
      var d = row.dataset;
      var ok = (!conf || d.configuration === conf) && (!domain || d.domain === domain) &&
        (!outcome || d.outcome === outcome) && (!critiqued || Number(d.critiques) > 0) &&
        (!text || row.textContent.toLowerCase().indexOf(text) >= 0);
      row.hidden = !ok;
      if (ok) shown += 1;
    });
    field("f-count").textContent = shown + " of " + rows.length + " shown";
  }

  function sortBy(th) {
    var index = th.cellIndex, numeric = th.dataset.sort === "number";
    var asc = !th.classList.contains("asc");
    Array.prototype.forEach.call(th.parentNode.cells, function (c) { c.classList.remove("asc", "desc"); });
    th.classList.add(asc ? "asc" : "desc");
    var key = function (row) {
      var cell = row.cells[index];
      var v = cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent.trim();
      return numeric ? Number(v) : v.toLowerCase();
    };
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }

  // index.html?outcome=failure&critiqued=1&text=... opens with those filters set (shareable)
  var query = new URLSearchParams(window.location.search);
  ["text", "configuration", "domain", "outcome"].forEach(function (name) {
    if (query.has(name)) field("f-" + name).value = query.get(name);
  });
  if (query.get("critiqued") === "1") field("f-critiqued").checked = true;

  controls.forEach(function (c) { c.addEventListener("input", apply); c.addEventListener("change", apply); });
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
    if (th.dataset.sort) th.addEventListener("click", function () { sortBy(th); });
  });
  apply();
})();
