// josef console: refresh the page's main section in place every few seconds (no full reload).
// The server answers a request carrying the X-Josef-Fragment header with the main section alone.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var status = document.getElementById("status");
  var every = parseInt(document.body.getAttribute("data-refresh-ms"), 10) || 0;
  if (!main || every <= 0) { return; }
  var busy = false;

  function shown(text) { if (status) { status.textContent = text; } }

  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(window.location.href, {headers: {"X-Josef-Fragment": "1"}, credentials: "same-origin", cache: "no-store"})
      .then(function (answer) {
        if (!answer.ok) { throw new Error("HTTP " + answer.status); }
        return answer.text();
      })
      .then(function (fragment) {
        main.innerHTML = fragment;
        document.body.classList.remove("stale");
        main.setAttribute("data-refreshed", String(Date.now()));
        shown("updated " + new Date().toLocaleTimeString());
      })
      .catch(function (error) {
        document.body.classList.add("stale");
        shown("not updated: " + error.message);
      })
      .then(function () { busy = false; });
  }

  window.setInterval(refresh, every);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { refresh(); } });
})();
