// Flotilla console: the little the pages need beyond HTML — live regions fed by server-sent
// events, a banner while the connection is lost, typed confirmations, and the create form's
// CLI/Terraform preview (rendered by the server).
"use strict";

function banner(show) {
  const element = document.getElementById("connection-banner");
  if (element) element.hidden = !show;
}

// Row updates held back while the row has the focus, by element id.
const pending = new Map();

function applyPending(id) {
  const existing = document.getElementById(id);
  const html = pending.get(id);
  if (!existing || html === undefined) return;
  if (existing.contains(document.activeElement) && document.activeElement !== document.body) {
    existing.addEventListener("focusout", () => setTimeout(() => applyPending(id), 0), { once: true });
    return;
  }
  pending.delete(id);
  existing.outerHTML = html;
}

// <tbody data-live="/console/live/..."> receives `row` events ({id, html, parent}) that
// replace or add a row, `gone` events ({id}) that remove one, and after the first look one
// `present` event ({ids, parent}) naming every row there is.
function liveRegions() {
  for (const region of document.querySelectorAll("[data-live]")) {
    const source = new EventSource(region.dataset.live);
    source.addEventListener("open", () => banner(false));
    source.addEventListener("error", () => banner(true));
    source.addEventListener("row", (event) => {
      const change = JSON.parse(event.data);
      const existing = document.getElementById(change.id);
      if (existing && existing.contains(document.activeElement) && document.activeElement !== document.body) {
        // Someone is typing in this row (a scale form): its update waits until they leave it.
        pending.set(change.id, change.html);
        existing.addEventListener("focusout", () => setTimeout(() => applyPending(change.id), 0), { once: true });
      } else if (existing) {
        // The first look resends every row; one that did not change is left alone.
        if (existing.outerHTML !== change.html) existing.outerHTML = change.html;
      } else {
        const parent = document.getElementById(change.parent) || region;
        parent.insertAdjacentHTML("beforeend", change.html);
      }
      const empty = document.getElementById(region.id + "-empty");
      if (empty) empty.remove();
    });
    // Sent after the first look: every row id the list has now. A row the page was rendered
    // with that is not among them went away before the stream started, so no `gone` comes.
    source.addEventListener("present", (event) => {
      const change = JSON.parse(event.data);
      const ids = new Set(change.ids);
      const parent = document.getElementById(change.parent) || region;
      for (const row of parent.querySelectorAll(":scope > tr[id]")) {
        if (!ids.has(row.id) && row.id !== region.id + "-empty") row.remove();
      }
    });
    source.addEventListener("gone", (event) => {
      const change = JSON.parse(event.data);
      const existing = document.getElementById(change.id);
      if (existing) existing.remove();
    });
  }
}

// <input data-confirm="NAME"> enables its form's submit button only when NAME is typed.
function typedConfirmations() {
  for (const input of document.querySelectorAll("input[data-confirm]")) {
    const button = input.form && input.form.querySelector("button[type=submit]");
    if (!button) continue;
    const check = () => { button.disabled = input.value !== input.dataset.confirm; };
    input.addEventListener("input", check);
    check();
  }
}

// <form data-preview="URL">: the server renders the equivalent CLI command and Terraform
// block for what is typed so far, into #preview.
function previews() {
  for (const form of document.querySelectorAll("form[data-preview]")) {
    let timer = null;
    const refresh = async () => {
      const body = new URLSearchParams(new FormData(form));
      try {
        const answer = await fetch(form.dataset.preview, { method: "POST", body, credentials: "same-origin" });
        if (answer.ok) document.getElementById("preview").innerHTML = await answer.text();
      } catch (_) {
        banner(true);
      }
    };
    form.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(refresh, 250);
    });
  }
}

// <form data-ask="Question?">: submitted only when the question is answered OK.
function confirmations() {
  document.addEventListener("submit", (event) => {
    const question = event.target.dataset && event.target.dataset.ask;
    if (question && !window.confirm(question)) event.preventDefault();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  confirmations();
  liveRegions();
  typedConfirmations();
  previews();
});
