// threadkeep inspector: a single page over the JSON routes of `threadkeep serve`.
// Plain JavaScript, nothing loaded from the network. Every piece of data reaches the page
// as text (textContent, createTextNode, attribute values): never as HTML.
"use strict";

(function () {
  const KEY = "threadkeep.inspector.key";
  const PAGE = 50; // threads per listing page
  const HISTORY_PAGE = 50; // checkpoints per history page
  const READ_AHEAD = 20; // listing pages read for one click at most, while too few rows match
  const STATUSES = ["waiting", "finished", "parked", "interrupted"];
  const app = document.getElementById("app");
  const who = document.getElementById("who");
  let session = null; // {user, role} of the key in sessionStorage
  let generation = 0; // bumped on each navigation: a late answer for an old view is dropped

  // ---- DOM, without HTML --------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    append(node, children);
    return node;
  }
  function append(node, children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  function replace(node, ...children) {
    node.replaceChildren();
    return append(node, children);
  }

  // ---- formatting ---------------------------------------------------------------------
  function localTime(seconds) {
    if (seconds === null || seconds === undefined || seconds === "") return "—";
    const date = typeof seconds === "number" ? new Date(seconds * 1000) : new Date(seconds);
    if (Number.isNaN(date.getTime())) return String(seconds);
    return date.toLocaleString();
  }
  function isoTitle(seconds) {
    if (typeof seconds !== "number") return null;
    return new Date(seconds * 1000).toISOString();
  }
  function relative(seconds) {
    if (typeof seconds !== "number") return "";
    const delta = seconds - Date.now() / 1000;
    const abs = Math.abs(delta);
    const [n, unit] =
      abs < 90 ? [abs, "s"] : abs < 5400 ? [abs / 60, "min"] : abs < 129600 ? [abs / 3600, "h"] : [abs / 86400, "d"];
    const text = `${Math.round(n)} ${unit}`;
    return delta >= 0 ? `in ${text}` : `${text} ago`;
  }
  function time(seconds) {
    return el("time", { title: isoTitle(seconds), text: localTime(seconds) });
  }
  function json(value) {
    try {
      return JSON.stringify(value, null, 2);
    } catch (_) {
      return String(value);
    }
  }
  function compact(value) {
    if (value === null || value === undefined) return "";
    if (typeof value === "string") return value;
    try {
      return JSON.stringify(value);
    } catch (_) {
      return String(value);
    }
  }
  function short(id) {
    const text = String(id || "");
    return text.length > 14 ? `…${text.slice(-12)}` : text;
  }
  function badge(status) {
    return el("span", { class: `badge ${STATUSES.includes(status) ? status : ""}`, text: status || "?" });
  }
  function contentText(content) {
    if (content === null || content === undefined) return "";
    if (typeof content === "string") return content;
    if (Array.isArray(content)) {
      return content
        .map((block) => (typeof block === "string" ? block : block && block.type === "text" ? block.text : compact(block)))
        .join("\n");
    }
    return compact(content);
  }

  // ---- the API ------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }
  async function api(method, path, params) {
    const url = new URL(path, window.location.origin);
    for (const [name, value] of Object.entries(params || {})) {
      if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, value);
    }
    let response;
    try {
      response = await fetch(url, {
        method,
        headers: { Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}`, Accept: "application/json" },
      });
    } catch (error) {
      throw new ApiError(0, "unreachable", `the server does not answer (${error.message})`);
    }
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      const code = (body && body.error) || `http_${response.status}`;
      const message = (body && body.message) || `${method} ${url.pathname} answered ${response.status}`;
      if (response.status === 401) {
        sessionStorage.removeItem(KEY);
        session = null;
      }
      throw new ApiError(response.status, code, message);
    }
    return body;
  }
  const threadPath = (id, rest) => `/api/threads/${encodeURIComponent(id)}${rest || ""}`;

  function errorPanel(error) {
    if (error instanceof ApiError && error.status === 404) {
      return el(
        "section",
        { class: "panel error", "data-testid": "not-found" },
        el("h2", { text: "Not found" }),
        el("p", { text: error.message }),
        el("a", { href: "#/", text: "Back to the threads" })
      );
    }
    return el(
      "section",
      { class: "panel error", "data-testid": "error" },
      el("h2", { text: error instanceof ApiError ? `${error.status || ""} ${error.code}`.trim() : "Error" }),
      el("p", { text: error.message || String(error) })
    );
  }

  // ---- routing (#/, #/thread/<id>[/history|/diff|/retention|/checkpoint/<cid>]) ---------
  function parseHash() {
    const raw = window.location.hash.replace(/^#/, "") || "/";
    const [path, query] = raw.split("?");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    return { parts, query: new URLSearchParams(query || "") };
  }
  function href(parts, query) {
    const path = "#/" + parts.map(encodeURIComponent).join("/");
    const q = query ? new URLSearchParams(Object.entries(query).filter(([, v]) => v)).toString() : "";
    return q ? `${path}?${q}` : path;
  }

  async function route() {
    const mine = ++generation;
    const current = () => mine === generation;
    if (!sessionStorage.getItem(KEY)) return showLogin();
    if (!session) {
      try {
        session = await api("GET", "/inspector/session");
      } catch (error) {
        return showLogin(error);
      }
      if (!current()) return;
    }
    showSession();
    const { parts, query } = parseHash();
    if (parts.length === 0) return threadsView(query, current);
    if (parts[0] === "thread" && parts[1]) return threadView(parts[1], parts.slice(2), query, current);
    if (parts[0] === "sweep") return sweepView(current);
    replace(app, errorPanel(new ApiError(404, "not_found", `no page at ${window.location.hash}`)));
  }

  function showLogin(error) {
    session = null;
    replace(who);
    const input = el("input", {
      type: "password",
      name: "key",
      placeholder: "API key",
      autocomplete: "off",
      "aria-label": "API key",
      required: true,
    });
    const form = el(
      "form",
      {
        onsubmit: (event) => {
          event.preventDefault();
          sessionStorage.setItem(KEY, input.value.trim());
          route();
        },
      },
      input,
      el("button", { class: "primary", type: "submit", text: "Open" })
    );
    replace(
      app,
      el(
        "section",
        { class: "panel login", "data-testid": "login" },
        el("h2", { text: "Sign in with an API key" }),
        el("p", {
          class: "notice",
          text: "A key of LLM_PROVIDER_CHECKPOINT_API_KEYS. It is kept in this tab only (sessionStorage).",
        }),
        error ? el("p", { class: "error", "data-testid": "login-error", text: error.message }) : null,
        form
      )
    );
    input.focus();
  }

  function showSession() {
    replace(
      who,
      el("span", { "data-testid": "whoami", text: `${session.user} (${session.role})` }),
      session.role === "admin" ? el("a", { href: "#/sweep", "data-testid": "sweep-link" }, el("button", { text: "Sweep dry run" })) : null,
      el("button", {
        text: "Sign out",
        onclick: () => {
          sessionStorage.removeItem(KEY);
          session = null;
          window.location.hash = "#/";
          route();
        },
      })
    );
  }

  // ---- threads list -------------------------------------------------------------------
  // The search box: `key=value` pairs filter on metadata in the store (an index read); any
  // other text narrows the rows already listed by thread id and metadata text, and asks
  // the store for more pages while it matches fewer rows than a page.
  function parseSearch(text) {
    const pairs = text.trim().split(/\s+/).filter(Boolean);
    if (pairs.length && pairs.every((p) => /^[^=\s]+=.+$/.test(p))) {
      const metadata = {};
      for (const pair of pairs) {
        const at = pair.indexOf("=");
        const raw = pair.slice(at + 1);
        let value = raw;
        try {
          value = JSON.parse(raw);
        } catch (_) {
          value = raw;
        }
        metadata[pair.slice(0, at)] = value;
      }
      return { metadata, text: "" };
    }
    return { metadata: null, text: text.trim().toLowerCase() };
  }

  function threadsView(query, current) {
    const status = query.get("status") || "";
    const search = query.get("q") || "";
    const user = query.get("user") || "";
    const { metadata, text } = parseSearch(search);
    const setQuery = (changes) => {
      const next = { status, q: search, user, ...changes };
      window.location.hash = href([], next);
    };

    const box = el("input", {
      class: "grow",
      type: "search",
      name: "q",
      value: search,
      placeholder: "Search thread id or metadata text; key=value filters on metadata",
      "aria-label": "Search threads",
    });
    const userBox =
      session.role === "admin"
        ? el("input", { type: "search", name: "user", value: user, placeholder: "owner", "aria-label": "Owner" })
        : null;
    const chips = el(
      "span",
      { class: "chips", role: "group", "aria-label": "Status" },
      ["", ...STATUSES].map((s) =>
        el("button", {
          type: "button",
          "data-status": s || "all",
          "aria-pressed": String(s === status),
          text: s || "all",
          onclick: () => setQuery({ status: s }),
        })
      )
    );
    const form = el(
      "form",
      {
        class: "toolbar",
        onsubmit: (event) => {
          event.preventDefault();
          setQuery({ q: box.value, user: userBox ? userBox.value.trim() : "" });
        },
      },
      box,
      userBox,
      el("button", { type: "submit", text: "Search" }),
      chips
    );
    const body = el("tbody");
    const table = el(
      "table",
      { "data-testid": "threads" },
      el(
        "thead",
        {},
        el("tr", {}, ["Thread", "Owner", "Status", "Last write", "Due", "Metadata"].map((h) => el("th", { text: h })))
      ),
      body
    );
    const info = el("span", { class: "notice" });
    const moreButton = el("button", { type: "button", text: "Load more", hidden: true });
    replace(app, el("section", { class: "panel" }, form, table, el("div", { class: "more" }, moreButton, info)));

    let cursor = null;
    let shown = 0;
    let scanned = 0;
    const matches = (row) =>
      !text ||
      String(row.thread_id).toLowerCase().includes(text) ||
      compact(row.metadata).toLowerCase().includes(text);

    async function load() {
      moreButton.disabled = true;
      let found = 0;
      try {
        // Read on while a page comes back with no row (a store may end a filtered page short)
        // or, with a text search, until a page's worth matched; at most READ_AHEAD pages a click.
        let pages = 0;
        do {
          pages += 1;
          const page = await api("GET", "/api/threads", {
            status,
            user,
            metadata: metadata ? JSON.stringify(metadata) : "",
            limit: PAGE,
            cursor,
          });
          if (!current()) return;
          const rows = page.threads || [];
          scanned += rows.length;
          const fragment = document.createDocumentFragment();
          for (const row of rows.filter(matches)) {
            found += 1;
            fragment.appendChild(threadRow(row));
          }
          body.appendChild(fragment);
          cursor = page.next_cursor || null;
        } while (cursor && pages < READ_AHEAD && (text ? found < PAGE : found === 0));
      } catch (error) {
        if (!current()) return;
        cursor = null;
        app.appendChild(errorPanel(error));
      }
      shown += found;
      moreButton.hidden = !cursor;
      moreButton.disabled = false;
      info.textContent =
        shown === 0
          ? "No thread matches."
          : `${shown} thread${shown === 1 ? "" : "s"}${text ? ` matching, of ${scanned} read` : ""}${cursor ? "; more below" : ""}`;
      info.setAttribute("data-testid", "threads-count");
    }
    moreButton.addEventListener("click", load);
    return load();
  }

  // LangGraph's own checkpoint metadata: left out of the listing's preview (its tooltip and
  // the search still hold it).
  const LANGGRAPH_METADATA = new Set(["source", "step", "parents", "writes"]);
  function ownMetadata(metadata) {
    if (!metadata || typeof metadata !== "object") return metadata;
    return Object.fromEntries(Object.entries(metadata).filter(([k]) => !LANGGRAPH_METADATA.has(k)));
  }

  function threadRow(row) {
    return el(
      "tr",
      { "data-thread": row.thread_id },
      el("td", {}, el("a", { class: "mono", href: href(["thread", row.thread_id]), text: row.thread_id })),
      el("td", { text: row.owner }),
      el("td", {}, badge(row.status)),
      el("td", {}, time(row.written_at)),
      el("td", {}, row.due ? time(row.due) : "—"),
      el("td", { class: "meta", title: compact(row.metadata), text: compact(ownMetadata(row.metadata)) })
    );
  }

  // ---- one thread ---------------------------------------------------------------------
  const TABS = [
    ["", "Conversation"],
    ["history", "History"],
    ["diff", "Diff"],
    ["retention", "Retention"],
  ];

  async function threadView(id, rest, query, current) {
    const tab = rest[0] || "";
    const head = el("div", { class: "thread-head" }, el("h1", { "data-testid": "thread-id", text: id }));
    const tabs = el(
      "nav",
      { class: "tabs" },
      TABS.map(([name, label]) =>
        el("a", {
          href: href(["thread", id, ...(name ? [name] : [])]),
          "aria-current": name === tab || (tab === "checkpoint" && name === "history") ? "page" : null,
          "data-tab": name || "conversation",
          text: label,
        })
      )
    );
    const body = el("div", { "data-testid": `tab-${tab || "conversation"}` }, el("p", { class: "notice", text: "Loading…" }));
    replace(app, head, tabs, body);
    try {
      if (tab === "") await conversationTab(id, body, current);
      else if (tab === "checkpoint" && rest[1]) await checkpointTab(id, rest[1], body, current);
      else if (tab === "history") await historyTab(id, body, current);
      else if (tab === "diff") await diffTab(id, query, body, current);
      else if (tab === "retention") await retentionTab(id, body, head, current);
      else throw new ApiError(404, "not_found", `no tab ${tab}`);
    } catch (error) {
      if (current()) replace(app, head, errorPanel(error));
    }
  }

  function stateSummary(state) {
    return el(
      "dl",
      { class: "kv" },
      el("dt", { text: "Checkpoint" }),
      el("dd", { class: "mono", text: state.checkpoint_id || "—" }),
      el("dt", { text: "Step" }),
      el("dd", { text: state.step ?? "—" }),
      el("dt", { text: "Source" }),
      el("dd", { text: state.source || "—" }),
      el("dt", { text: "Written" }),
      el("dd", {}, time(state.created_at)),
      el("dt", { text: "Next" }),
      el("dd", { class: "mono", text: (state.next || []).join(", ") || "— (done)" })
    );
  }

  function statePanels(state) {
    const interrupts = state.interrupts || [];
    return [
      el("section", { class: "panel" }, stateSummary(state)),
      interrupts.length
        ? el(
            "section",
            { class: "panel", "data-testid": "interrupts" },
            el("h2", { text: "Waiting on" }),
            interrupts.map((i) => el("pre", { text: typeof i === "string" ? i : json(i.value !== undefined ? i.value : i) }))
          )
        : null,
      el("section", { class: "panel" }, el("h2", { text: "Conversation" }), chat(state.messages || [])),
      el(
        "section",
        { class: "panel" },
        el(
          "details",
          {},
          el("summary", { text: "Channel values and metadata" }),
          el("h3", { text: "values" }),
          el("pre", { text: json(state.values) }),
          el("h3", { text: "metadata" }),
          el("pre", { text: json(state.metadata) })
        )
      ),
    ];
  }

  async function conversationTab(id, body, current) {
    const state = await api("GET", threadPath(id, "/state"));
    if (!current()) return;
    replace(body, statePanels(state));
  }

  async function checkpointTab(id, checkpointId, body, current) {
    const state = await api("GET", threadPath(id, `/checkpoints/${encodeURIComponent(checkpointId)}`));
    if (!current()) return;
    replace(body, el("p", {}, el("a", { href: href(["thread", id, "history"]), text: "← History" })), statePanels(state));
  }

  // Messages as a chat: a tool's result is folded into the call that asked for it.
  function chat(messages, marks) {
    const results = new Map();
    const asked = new Set();
    for (const m of messages) for (const call of m.tool_calls || []) asked.add(call.id);
    for (const m of messages) if (m.type === "tool" && asked.has(m.tool_call_id)) results.set(m.tool_call_id, m);
    const box = el("div", { class: "chat", "data-testid": "chat" });
    if (!messages.length) box.appendChild(el("p", { class: "notice", text: "No messages." }));
    for (const m of messages) {
      if (m.type === "tool" && results.has(m.tool_call_id) && !(marks && marks.has(m.id))) continue;
      box.appendChild(bubble(m, results, marks && marks.get(m.id)));
    }
    return box;
  }

  function bubble(m, results, mark) {
    const kind = ["human", "ai", "system", "tool"].includes(m.type) ? m.type : "ai";
    const label = { human: "user", ai: "assistant", system: "system", tool: "tool" }[kind];
    const text = contentText(m.content);
    const node = el(
      "div",
      { class: `msg ${kind}${mark ? ` ${mark}` : ""}`, "data-message": m.id || null, "data-type": m.type },
      el("div", { class: "who", text: `${mark === "added" ? "+ " : mark === "removed" ? "− " : ""}${label}${m.name ? ` · ${m.name}` : ""}` }),
      text ? el("div", { class: "text", text }) : null
    );
    if (kind === "tool") node.appendChild(toolDetails({ id: m.tool_call_id, name: m.name || "tool result" }, m, true));
    for (const call of m.tool_calls || []) node.appendChild(toolDetails(call, results.get(call.id)));
    return node;
  }

  function toolDetails(call, result, resultOnly) {
    const failed = result && result.status === "error";
    const args = call.args !== undefined ? compact(call.args) : "";
    return el(
      "details",
      { class: `call${failed ? " error" : ""}`, "data-call": call.id || null },
      el("summary", {
        text: resultOnly
          ? `↳ result of ${call.id || "a call"}`
          : `call ${call.name}(${args.length > 80 ? args.slice(0, 77) + "…" : args})${result ? (failed ? " → error" : " → done") : " → no result yet"}`,
      }),
      resultOnly ? null : [el("div", { class: "label", text: "arguments" }), el("pre", { text: json(call.args) })],
      result ? [el("div", { class: "label", text: `result${failed ? " (error)" : ""}` }), el("pre", { text: contentText(result.content) })] : null
    );
  }

  // ---- history: a timeline read a page at a time, as it scrolls into view ---------------
  async function historyTab(id, body, current) {
    const picked = [];
    const list = el("ol", { class: "timeline", "data-testid": "timeline" });
    const compare = el("button", { class: "primary", type: "button", text: "Diff the two checked", disabled: true });
    const info = el("span", { class: "notice" });
    const more = el("button", { type: "button", text: "Load older", hidden: true });
    const sentinel = el("div", { class: "more" }, more, info);
    compare.addEventListener("click", () => {
      const [a, b] = picked;
      window.location.hash = href(["thread", id, "diff"], { a, b });
    });
    replace(
      body,
      el(
        "section",
        { class: "panel" },
        el("div", { class: "toolbar" }, el("span", { class: "grow notice", text: "Newest first. Check two checkpoints to diff them." }), compare),
        list,
        sentinel
      )
    );
    let cursor = null;
    let count = 0;
    let loading = false;
    let done = false;

    function onPick(event) {
      const cid = event.target.value;
      const item = event.target.closest("li");
      if (event.target.checked) {
        picked.push(cid);
        item.classList.add("sel");
        if (picked.length > 2) {
          const dropped = picked.shift();
          const box = list.querySelector(`input[data-checkpoint="${CSS.escape(dropped)}"]`);
          if (box) {
            box.checked = false;
            box.closest("li").classList.remove("sel");
          }
        }
      } else {
        picked.splice(picked.indexOf(cid), 1);
        item.classList.remove("sel");
      }
      compare.disabled = picked.length !== 2;
    }

    async function load() {
      if (loading || done) return;
      loading = true;
      more.disabled = true;
      try {
        const page = await api("GET", threadPath(id, "/history"), { limit: HISTORY_PAGE, cursor });
        if (!current()) return;
        const fragment = document.createDocumentFragment();
        for (const c of page.checkpoints || []) fragment.appendChild(checkpointItem(id, c, onPick));
        list.appendChild(fragment);
        count += (page.checkpoints || []).length;
        cursor = page.next_cursor || null;
        done = !cursor;
      } finally {
        loading = false;
      }
      more.hidden = done;
      more.disabled = false;
      info.textContent = `${count} checkpoint${count === 1 ? "" : "s"}${done ? "" : " so far"}`;
      info.setAttribute("data-testid", "history-count");
    }
    more.addEventListener("click", load);
    await load();
    if (!done && "IntersectionObserver" in window) {
      const observer = new IntersectionObserver((entries) => {
        if (!current() || done) return observer.disconnect();
        if (entries.some((e) => e.isIntersecting)) load().catch((error) => body.appendChild(errorPanel(error)));
      });
      observer.observe(sentinel);
    }
  }

  function checkpointItem(id, c, onPick) {
    const writes = c.writes || [];
    return el(
      "li",
      { "data-checkpoint": c.checkpoint_id },
      el("div", { class: "step", text: c.step ?? "" }),
      el(
        "div",
        {},
        el(
          "div",
          { class: "line1" },
          el("span", { class: "src", text: c.source || "?" }),
          el("a", { class: "mono", href: href(["thread", id, "checkpoint", c.checkpoint_id]), title: c.checkpoint_id, text: short(c.checkpoint_id) }),
          time(c.created_at),
          el(
            "label",
            { class: "pick" },
            el("input", { type: "checkbox", value: c.checkpoint_id, "data-checkpoint": c.checkpoint_id, onchange: onPick }),
            "diff"
          )
        ),
        writes.length
          ? el(
              "ul",
              { class: "writes" },
              writes.map((w) =>
                el("li", {}, el("code", { text: w.channel }), ` ← ${w.task_id ? short(w.task_id) + ": " : ""}`, compact(w.preview))
              )
            )
          : null
      )
    );
  }

  // ---- diff ---------------------------------------------------------------------------
  async function diffTab(id, query, body, current) {
    let a = query.get("a");
    let b = query.get("b");
    const page = await api("GET", threadPath(id, "/history"), { limit: HISTORY_PAGE });
    if (!current()) return;
    const checkpoints = page.checkpoints || [];
    if (!a || !b) {
      // By default: the newest checkpoint against the one before it.
      b = b || (checkpoints[0] && checkpoints[0].checkpoint_id);
      a = a || (checkpoints[1] && checkpoints[1].checkpoint_id) || b;
    }
    const options = (selected) => {
      const ids = checkpoints.map((c) => c.checkpoint_id);
      if (selected && !ids.includes(selected)) ids.push(selected);
      return ids.map((cid) => {
        const c = checkpoints.find((x) => x.checkpoint_id === cid);
        return el("option", { value: cid, selected: cid === selected, text: c ? `step ${c.step} · ${c.source} · ${short(cid)}` : cid });
      });
    };
    const pickA = el("select", { name: "a", "aria-label": "from checkpoint" }, options(a));
    const pickB = el("select", { name: "b", "aria-label": "to checkpoint" }, options(b));
    const go = () => (window.location.hash = href(["thread", id, "diff"], { a: pickA.value, b: pickB.value }));
    pickA.addEventListener("change", go);
    pickB.addEventListener("change", go);
    const out = el("div", { "data-testid": "diff" });
    replace(body, el("section", { class: "panel" }, el("div", { class: "toolbar" }, "from", pickA, "to", pickB), out));
    if (!a || !b) {
      replace(out, el("p", { class: "notice", text: "This thread has no checkpoint to compare." }));
      return;
    }
    const diff = await api("GET", threadPath(id, "/diff"), { a, b });
    if (!current()) return;
    replace(out, renderDiff(diff));
  }

  // The diff is threadkeep.views.diff_view: channel names added, removed and changed, and
  // per channel its change, before and after previews (message channels: messages added,
  // removed and changed, by id).
  function renderDiff(diff) {
    const channels = diff.channels || {};
    const entries = Object.entries(channels);
    const section = (title, testid, ...children) =>
      el("div", { class: "diff-section", "data-testid": testid }, el("h3", { text: title }), children);
    const parts = [
      section(
        "Channels",
        "diff-channels",
        entries.length
          ? el(
              "table",
              {},
              el("thead", {}, el("tr", {}, ["Channel", "Change", "Before", "After"].map((h) => el("th", { text: h })))),
              el(
                "tbody",
                {},
                entries.map(([name, c]) =>
                  el(
                    "tr",
                    { "data-channel": name },
                    el("td", {}, el("code", { text: name })),
                    el("td", { class: c.change === "added" ? "chg-added" : c.change === "removed" ? "chg-removed" : null, text: c.change }),
                    el("td", { class: "mono", text: c.before ?? "" }),
                    el("td", { class: "mono", text: c.after ?? "" })
                  )
                )
              )
            )
          : el("p", { class: "notice", text: "No channel changed." })
      ),
    ];
    for (const [name, c] of entries) {
      const added = c.messages_added || [];
      const removed = c.messages_removed || [];
      const changed = c.messages_changed || [];
      if (!added.length && !removed.length && !changed.length) continue;
      const marks = new Map();
      for (const m of added) marks.set(m.id, "added");
      for (const m of removed) marks.set(m.id, "removed");
      parts.push(
        section(
          `${name}: ${added.length} added, ${removed.length} removed, ${changed.length} changed`,
          "diff-messages",
          added.length || removed.length ? chat([...removed, ...added], marks) : null,
          changed.map((m) =>
            el(
              "div",
              { class: "chat" },
              bubble(m.before, new Map(), "removed"),
              bubble(m.after, new Map(), "added")
            )
          )
        )
      );
    }
    return parts;
  }

  // ---- retention ----------------------------------------------------------------------
  // The retention is threadkeep.views.retention_view: status, written_at, due, the horizons
  // in force, declared and the platform's, and spared_by (park, interrupt).
  const SPARED = {
    park: "a run on it is parked on a question whose deadline has not passed",
    interrupt: "it waits on an interrupt younger than the interrupt horizon",
  };
  const minutes = (m) => (m === null || m === undefined ? "—" : m % 1440 === 0 ? `${m / 1440} d` : m % 60 === 0 ? `${m / 60} h` : `${m} min`);

  async function retentionTab(id, body, head, current) {
    const r = await api("GET", threadPath(id, "/retention"));
    if (!current()) return;
    head.appendChild(badge(r.status));
    const spared = r.spared_by || [];
    const horizons = r.horizons || {};
    const declared = r.declared || {};
    const platform = r.platform || {};
    const finish = el("button", {
      type: "button",
      "data-testid": "mark-finished",
      text: "Mark finished",
      onclick: async () => {
        finish.disabled = true;
        try {
          await api("POST", threadPath(id, "/finished"));
          if (current()) route();
        } catch (error) {
          body.appendChild(errorPanel(error));
        }
      },
    });
    replace(
      body,
      el(
        "section",
        { class: "panel", "data-testid": "retention" },
        el(
          "dl",
          { class: "kv" },
          el("dt", { text: "Status" }),
          el("dd", {}, badge(r.status), r.status === "finished" ? null : [" ", finish]),
          el("dt", { text: "Last write" }),
          el("dd", {}, time(r.written_at)),
          el("dt", { text: "Due (local time)" }),
          el(
            "dd",
            { "data-testid": "due" },
            r.due ? [time(r.due), ` (${relative(r.due)}; ${r.status === "finished" ? "finished" : "waiting"} horizon)`] : "—"
          ),
          el("dt", { text: "Parks" }),
          el("dd", { text: spared.includes("park") ? "a live park holds it past its due time" : "no live park" }),
          el("dt", { text: "A sweep past its due time" }),
          el(
            "dd",
            { "data-testid": "spared" },
            spared.length
              ? el("ul", {}, spared.map((x) => el("li", { text: `spares it: ${SPARED[x] || x}` })))
              : "deletes it (no park or interrupt spares it)"
          )
        )
      ),
      el(
        "section",
        { class: "panel" },
        el("h2", { text: "Horizons" }),
        el(
          "table",
          {},
          el("thead", {}, el("tr", {}, ["", "Waiting", "Finished", "Interrupt"].map((h) => el("th", { text: h })))),
          el(
            "tbody",
            {},
            [
              ["In force", horizons],
              ["Declared by the owner", declared],
              ["Platform", platform],
            ].map(([label, h]) =>
              el(
                "tr",
                {},
                el("td", { text: label }),
                el("td", { text: minutes(h.waiting_minutes) }),
                el("td", { text: minutes(h.finished_minutes) }),
                el("td", { text: "interrupt_minutes" in h ? minutes(h.interrupt_minutes) : "" })
              )
            )
          )
        )
      )
    );
  }

  // ---- sweep dry run (admin) ----------------------------------------------------------
  function sweepView(current) {
    const out = el("div", { "data-testid": "sweep-result" });
    const run = el("button", {
      class: "primary",
      type: "button",
      "data-testid": "sweep-run",
      text: "Run a dry run",
      onclick: async () => {
        run.disabled = true;
        replace(out, el("p", { class: "notice", text: "Sweeping (dry run)…" }));
        try {
          const result = await api("POST", "/api/checkpoints/sweep", { dry_run: "true" });
          if (current()) replace(out, renderSweep(result));
        } catch (error) {
          if (current()) replace(out, errorPanel(error));
        } finally {
          run.disabled = false;
        }
      },
    });
    replace(
      app,
      el(
        "section",
        { class: "panel" },
        el("h2", { text: "Sweep: dry run" }),
        el("p", { class: "notice", text: "Lists what a sweep would delete now and what it would spare; deletes nothing." }),
        run,
        out
      )
    );
  }

  function renderSweep(result) {
    const doomed = result.doomed || [];
    const scalars = Object.entries(result).filter(([, v]) => v === null || typeof v !== "object");
    const nested = Object.entries(result).filter(([k, v]) => v !== null && typeof v === "object" && k !== "doomed");
    return [
      el("dl", { class: "kv" }, scalars.map(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v) })])),
      el("h3", { text: `Would delete ${doomed.length} thread${doomed.length === 1 ? "" : "s"}` }),
      doomed.length
        ? el(
            "table",
            {},
            el("thead", {}, el("tr", {}, el("th", { text: "Thread" }), el("th", { text: "Horizon" }))),
            el(
              "tbody",
              {},
              doomed.map((d) =>
                el(
                  "tr",
                  {},
                  el("td", {}, el("a", { class: "mono", href: href(["thread", d.thread_id]), text: d.thread_id })),
                  el("td", { text: d.horizon || "" })
                )
              )
            )
          )
        : null,
      nested.map(([k, v]) => el("details", {}, el("summary", { text: k }), el("pre", { text: json(v) }))),
    ];
  }

  window.addEventListener("hashchange", route);
  route();
})();
