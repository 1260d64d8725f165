// pgjobs dashboard: progressive enhancement only. Every page works without this file; it adds
// (1) the overview's refresh: its live part is fetched as an HTML fragment every few seconds and
//     swapped in (no full reload), paused while the tab is hidden;
// (2) a confirmation dialog on forms marked data-confirm (force-cancel);
// (3) a bulk action's progress: its live part is fetched every second and swapped in until the
//     action has ended (without the script, the page reloads itself instead).
(function () {
  "use strict";

  function startRefresh(live) {
    var url = live.getAttribute("data-refresh");
    var seconds = Number(live.getAttribute("data-interval")) || 5;
    var status = document.getElementById("refresh-status");
    var timer = null;
    var busy = false;

    function say(text) {
      if (status) status.textContent = text;
    }

    function schedule() {
      clearTimeout(timer);
      if (!document.hidden) timer = setTimeout(refresh, seconds * 1000);
    }

    function refresh() {
      if (busy || document.hidden) return;
      busy = true;
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (response) {
          if (response.status === 401) {
            say("Signed out: reload the page to sign in again.");
            return null;
          }
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.text();
        })
        .then(function (html) {
          if (html === null) return;
          // Keep the keyboard focus where it was when the focused element is replaced.
          var focused = document.activeElement && live.contains(document.activeElement)
            ? document.activeElement.getAttribute("href") : null;
          live.innerHTML = html; // server-rendered, every value escaped there
          if (focused) {
            var again = live.querySelector('a[href="' + CSS.escape(focused) + '"]');
            if (again) again.focus();
          }
          say("Updated " + new Date().toISOString().slice(11, 19) + "Z · every " + seconds +
              " s, paused while this tab is hidden.");
          schedule();
        })
        .catch(function () {
          say("Could not refresh (server unreachable); trying again.");
          schedule();
        })
        .finally(function () { busy = false; });
    }

    document.addEventListener("visibilitychange", function () {
      if (document.hidden) {
        clearTimeout(timer);
        say("Paused while this tab is hidden.");
      } else {
        refresh();
      }
    });
    schedule();
  }

  function followProgress(box) {
    var url = box.getAttribute("data-refresh");
    var seconds = Number(box.getAttribute("data-interval")) || 1;

    function running() {
      var state = box.querySelector("[data-state]");
      return state !== null && state.getAttribute("data-state") === "running";
    }

    function stop(text) {
      var status = box.querySelector("#action-status");
      if (status) status.textContent = text;
    }

    function poll() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (response) {
          if (response.status === 401) {
            stop("Signed out: reload the page to sign in again (the action goes on).");
            return null;
          }
          if (response.status === 404) {
            stop("This server no longer knows the action (it restarted, or the action expired).");
            return null;
          }
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.text();
        })
        .then(function (html) {
          if (html === null) return;
          box.innerHTML = html; // server-rendered, every value escaped there
          if (running()) setTimeout(poll, seconds * 1000);
        })
        .catch(function () {
          // The server is unreachable for now: keep asking, a little less often.
          setTimeout(poll, seconds * 3000);
        });
    }

    if (running()) setTimeout(poll, seconds * 1000);
  }

  function confirmForms() {
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (event) {
        if (!window.confirm(form.getAttribute("data-confirm"))) event.preventDefault();
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var live = document.getElementById("live");
    if (live && window.fetch) startRefresh(live);
    var progress = document.getElementById("progress");
    if (progress && window.fetch) followProgress(progress);
    confirmForms();
  });
})();
