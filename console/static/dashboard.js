// The live part of a page (#live) is fetched again every data-refresh ms and replaced
// in place; a failed fetch leaves the last one shown and marks it stale.
(function () {
  const live = document.getElementById("live");
  if (!live) return;
  const every = Number(live.dataset.refresh) || 3000;
  async function refresh() {
    try {
      const r = await fetch(location.pathname + location.search,
                            {headers: {"X-Fragment": "live"}, cache: "no-store"});
      if (!r.ok) throw new Error(r.status);
      live.innerHTML = await r.text();
      live.classList.remove("stale");
      live.dataset.refreshed = String(Date.now());
    } catch (e) {
      live.classList.add("stale");
    }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);
})();
