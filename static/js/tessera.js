// Small progressive enhancements; every page works without this file.

// Leave empty filter values out of HTMX requests, so pushed URLs read "?product=X" and not "?q=&cluster=&product=X".
document.addEventListener("htmx:configRequest", (event) => {
  const params = event.detail.parameters;
  for (const key of Object.keys(params)) {
    if (params[key] === "") delete params[key];
  }
});

// Close an open menu (<details class="menu">) on Escape or a click outside it.
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  document.querySelectorAll("details.menu[open]").forEach((menu) => {
    menu.open = false;
    menu.querySelector("summary").focus();
  });
});
document.addEventListener("click", (event) => {
  document.querySelectorAll("details.menu[open]").forEach((menu) => {
    if (!menu.contains(event.target)) menu.open = false;
  });
});
