// Small progressive enhancements; every page works without this file.

// Leave empty filter values out of HTMX requests, so pushed URLs read "?product=X" and not "?q=&cluster=&product=X".
document.addEventListener("htmx:configRequest", (event) => {
  const params = event.detail.parameters;
  for (const key of Object.keys(params)) {
    if (params[key] === "") delete params[key];
  }
});

// Filters live in the URL (hx-push-url): one history entry per distinct URL (Enter in a search field both submits
// and ends a keyup, two requests for the same URL), and after Back or Forward the filter controls show the URL's
// filters again (htmx restores the page's HTML, but a control's chosen value is not part of its HTML).
// A response to a request sent before Back or Forward restored another page (a search's delayed keyup) must not
// push its URL over the one the user went back to: its target left the page with the restore.
document.addEventListener("htmx:beforeHistoryUpdate", (event) => {
  const update = event.detail.history;
  if (!event.detail.target.isConnected) {
    update.type = "replace";
    update.path = location.href;
  } else if (update.type === "push" && new URL(update.path, location.href).href === location.href) {
    update.type = "replace";
  }
});
// The option a single <select> shows as the page was rendered: its `selected` one, else the first.
function initialIndex(select) {
  return Math.max([...select.options].findIndex((option) => option.defaultSelected), 0);
}
function syncFiltersWithUrl() {
  const params = new URLSearchParams(location.search);
  document.querySelectorAll("form.filters").forEach((form) => {
    for (const control of form.elements) {
      if (!control.name || control.type === "hidden" || control.type === "submit") continue;
      if (control.type === "checkbox" || control.type === "radio") {
        control.checked = params.getAll(control.name).includes(control.value);
      } else if (control.tagName === "SELECT" && !params.has(control.name)) {
        control.selectedIndex = initialIndex(control);
      } else {
        control.value = params.get(control.name) || "";
      }
    }
  });
}
document.addEventListener("htmx:historyRestore", syncFiltersWithUrl);

// Close an open menu (the account menu, the narrow layout's Menu) on Escape or a click outside it; Escape gives the
// focus back to the menu's toggle.
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  document.querySelectorAll("details.menu[open], details.navmenu[open]").forEach((menu) => {
    menu.open = false;
    menu.querySelector("summary").focus();
  });
});

// A region htmx replaces (a live rollout every 2 s, a form's answer) must not take the focus from where the user is.
// htmx refocuses an element of the same id; others are found again by data-focus-key (a control that changes, as
// Pause becoming Resume), name or link, else the focus goes to the replaced region, never back to the page's top.
let focusBeforeSwap = null;
function focusSelector(el) {
  if (el.dataset.focusKey) return `[data-focus-key="${CSS.escape(el.dataset.focusKey)}"]`;
  if (el.id) return `#${CSS.escape(el.id)}`;
  if (el.name) return `${el.tagName}[name="${CSS.escape(el.name)}"]${el.value ? `[value="${CSS.escape(el.value)}"]` : ""}`;
  if (el.getAttribute("href")) return `a[href="${CSS.escape(el.getAttribute("href"))}"]`;
  const action = el.form && el.form.getAttribute("action");
  return action ? `form[action="${CSS.escape(action)}"] ${el.tagName}` : null;
}
document.addEventListener("htmx:beforeSwap", (event) => {
  const active = document.activeElement;
  const target = event.detail.target;
  focusBeforeSwap = active && active !== document.body && target && target.contains(active)
    ? { selector: focusSelector(active), region: target.id } : null;
});
document.addEventListener("htmx:afterSwap", () => {
  const before = focusBeforeSwap;
  focusBeforeSwap = null;
  if (!before || (document.activeElement && document.activeElement !== document.body)) return;
  let next = before.selector && document.querySelector(before.selector);
  if (!next && before.region) {
    next = document.getElementById(before.region);
    if (next && !next.hasAttribute("tabindex")) next.setAttribute("tabindex", "-1");
  }
  if (next) next.focus({ preventScroll: true });
});
document.addEventListener("click", (event) => {
  document.querySelectorAll("details.menu[open], details.navmenu[open]").forEach((menu) => {
    if (!menu.contains(event.target)) menu.open = false;
  });
});

// Sharing-profile editor: show only the fieldsets and fields of the chosen mode ([data-modes="mig mps"]).
// Without this script every field shows, labelled with its mode, and the server ignores the other modes' values.
function applyModeVisibility(form) {
  const checked = form.querySelector('input[name="mode"]:checked');
  if (!checked) return;
  form.querySelectorAll("[data-modes]").forEach((el) => {
    el.hidden = !el.dataset.modes.split(" ").includes(checked.value);
  });
}

// Rollout strategy fields only matter with "roll out now" ticked.
function applyShowIf(root) {
  root.querySelectorAll("[data-show-if]").forEach((el) => {
    const box = el.form ? el.form.elements[el.dataset.showIf] : document.querySelector(`[name="${el.dataset.showIf}"]`);
    if (box) el.hidden = !box.checked;
  });
}

// Formsets: "+ Add a row" clones the <template> of an empty form and bumps TOTAL_FORMS (plain forms show spare rows).
function addFormsetRow(button) {
  const prefix = button.dataset.formsetAdd;
  const total = document.getElementById(`id_${prefix}-TOTAL_FORMS`);
  const template = document.getElementById(button.dataset.template);
  const body = document.querySelector(`[data-formset-body="${prefix}"]`);
  if (!total || !template || !body) return;
  const index = Number(total.value);
  body.insertAdjacentHTML("beforeend", template.innerHTML.replaceAll("__prefix__", String(index)));
  total.value = String(index + 1);
  if (window.htmx) htmx.process(body.lastElementChild);
  const first = body.lastElementChild && body.lastElementChild.querySelector("input, select");
  if (first) first.focus();
}

// Narrow windows stack table rows (tessera.css): each cell gets its column's name to show beside its value. Cells
// spanning columns (group rows) keep none; an empty header (an action column) gives none either.
function labelTableCells(root) {
  root.querySelectorAll("table.table").forEach((table) => {
    const headers = [...table.querySelectorAll("thead tr:last-child > th")].map((th) => th.textContent.trim());
    if (!headers.length) return;
    const spanned = []; // columns a cell of an earlier row still covers (rowspan), rows left
    table.querySelectorAll("tbody tr").forEach((row) => {
      let column = 0;
      for (const cell of row.children) {
        while (spanned[column] > 0) spanned[column++] -= 1;
        const span = cell.colSpan || 1;
        if (span === 1 && headers[column] && !cell.hasAttribute("data-label")) cell.dataset.label = headers[column];
        if (cell.rowSpan > 1) spanned[column] = cell.rowSpan - 1;
        column += span;
      }
      while (column < spanned.length) if (spanned[column] > 0) spanned[column++] -= 1; else column++;
    });
    table.dataset.stacked = "";
  });
}

function enhance(root) {
  labelTableCells(root.closest ? root.closest("table") || root : root);
  root.querySelectorAll("form[data-mode-form]").forEach(applyModeVisibility);
  applyShowIf(root);
  root.querySelectorAll("[data-formset-add], [data-copy]").forEach((button) => { button.hidden = false; });
  // Buttons for browsers without JavaScript (e.g. "Check" in the QoS editor, which live checks make redundant).
  root.querySelectorAll("[data-nojs-only]").forEach((el) => { el.hidden = true; });
}

// Copy buttons: <button data-copy="element-id" hidden> copies that element's text (a command line, a token).
async function copyText(button) {
  const source = document.getElementById(button.dataset.copy);
  if (!source) return;
  const text = source.value !== undefined ? source.value : source.textContent;
  try {
    await navigator.clipboard.writeText(text.trim());
    button.textContent = "Copied";
  } catch {
    const range = document.createRange();
    range.selectNodeContents(source);
    window.getSelection().removeAllRanges();
    window.getSelection().addRange(range);
    button.textContent = "Selected: press Ctrl+C";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 2500);
}

// A token shown once: focusing its field selects it for copying (no inline handlers: the CSP allows no inline script).
document.addEventListener("focusin", (event) => {
  if (event.target.matches("[data-select-on-focus]")) event.target.select();
});

// Relative times (<time datetime=… data-relative>, "2 minutes ago") go on being true while a page stays open: the
// words are recomputed from the instant every 15 s, in the style of Django's naturaltime the server wrote them in.
function plural(n, unit) {
  return `${n} ${unit}${n === 1 ? "" : "s"}`;
}
function relativeWords(seconds) {
  const past = seconds >= 0;
  const s = Math.floor(Math.abs(seconds));
  let words;
  if (s < 1) return "now";
  if (s < 60) words = s === 1 ? "a second" : plural(s, "second");
  else if (s < 3600) words = s < 120 ? "a minute" : plural(Math.floor(s / 60), "minute");
  else if (s < 86400) words = s < 7200 ? "an hour" : plural(Math.floor(s / 3600), "hour");
  else {
    const days = Math.floor(s / 86400);
    const hours = Math.floor((s % 86400) / 3600);
    words = plural(days, "day") + (hours ? `, ${plural(hours, "hour")}` : "");
  }
  return past ? `${words} ago` : `${words} from now`;
}
function refreshRelativeTimes(root) {
  root.querySelectorAll("time[data-relative][datetime]").forEach((el) => {
    const at = Date.parse(el.getAttribute("datetime"));
    if (!Number.isNaN(at)) el.textContent = relativeWords((Date.now() - at) / 1000);
  });
}
setInterval(() => refreshRelativeTimes(document), 15000);

// A control changed before htmx took over its form (typed or picked while the page still loaded its scripts, or
// refilled by the browser on Back) sent no request, and htmx takes the value it then finds as already seen: the page
// would go on showing what the server rendered for the old values. Forms whose answers follow their controls
// (hx-trigger "tessera:edited") ask once for what their controls say now. Not the list filters: their requests push
// history, and their controls follow the URL (syncFiltersWithUrl), so a refilled control must not add an entry.
function isEdited(control) {
  if (control.type === "checkbox" || control.type === "radio") return control.checked !== control.defaultChecked;
  if (control.tagName === "SELECT") {
    const initial = control.multiple ? -1 : initialIndex(control);
    return [...control.options].some((option, index) => option.selected !== (option.defaultSelected || index === initial));
  }
  if (control.tagName === "TEXTAREA" || (control.tagName === "INPUT" && control.type !== "hidden")) {
    return control.value !== control.defaultValue;
  }
  return false;
}
function askForStaleAnswers() {
  document.querySelectorAll('form[hx-trigger*="tessera:edited"]').forEach((form) => {
    if ([...form.elements].some(isEdited)) htmx.trigger(form, "tessera:edited");
  });
}

// Live regions for screen readers: an element [data-announce="key"] says in one sentence what a region htmx refreshes
// shows (a rollout's progress, a check's verdict). When a swap changes a sentence, #announcer (aria-live polite, never
// swapped) says the new one, so a screen reader hears what changed and not the whole region again.
const announced = new Map();
function announcements() {
  return [...document.querySelectorAll("[data-announce]")].map((el) => [el.dataset.announce, el.textContent.trim()]);
}
document.addEventListener("htmx:afterSettle", () => {
  const changed = announcements().filter(([key, text]) => announced.get(key) !== text);
  changed.forEach(([key, text]) => announced.set(key, text));
  const announcer = document.getElementById("announcer");
  if (announcer && changed.length) announcer.textContent = changed.map(([, text]) => text).join(" ");
});

document.addEventListener("DOMContentLoaded", () => {
  enhance(document);
  announcements().forEach(([key, text]) => announced.set(key, text));
});
document.addEventListener("htmx:load", (event) => {
  enhance(event.detail.elt);
  if (event.detail.elt === document.body) askForStaleAnswers(); // htmx has processed the page it loaded with
});
document.addEventListener("change", (event) => {
  const form = event.target.form;
  if (!form) return;
  if (event.target.name === "mode" && form.hasAttribute("data-mode-form")) applyModeVisibility(form);
  applyShowIf(form);
});
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-formset-add]");
  if (button) addFormsetRow(button);
  const copy = event.target.closest("[data-copy]");
  if (copy) copyText(copy);
});
