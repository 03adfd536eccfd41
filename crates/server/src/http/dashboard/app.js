// ai-crew-sync dashboard: redraws each section from /dashboard/data every
// few seconds. Every value goes into the page as text, the textContent way
// (text nodes made by el/replace below, through shown); no markup is ever
// built from data.
"use strict";

(function () {
  var POLL_MS = 3000;
  var COLUMNS = ["open", "claimed", "done", "cancelled"];
  // The bidirectional embeddings, overrides and isolates, drawn spelled out
  // (<U+202E>) as the server's first render and the console client show
  // them, so no text displays in another order than it was written in. The
  // server writes the list in when it serves this file, from the one list in
  // src/store/text.rs (BIDI_CONTROLS).
  var BIDI = new RegExp("[" + "__BIDI_CONTROLS__" + "]", "g");

  function shown(text) {
    return String(text).replace(BIDI, function (c) {
      return "<U+" + c.charCodeAt(0).toString(16).toUpperCase() + ">";
    });
  }

  function textNode(text) {
    return document.createTextNode(shown(text));
  }

  function el(tag, className, children) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    (children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? textNode(child) : child);
    });
    return node;
  }

  function time(iso) {
    return iso ? iso.slice(0, 19).replace("T", " ") + " UTC" : "—";
  }

  function dash(text) {
    return text === null || text === undefined || text === "" ? "—" : String(text);
  }

  function pill(state) {
    return el("span", "pill pill-" + state.replace(/[^a-z_]/g, ""), [state]);
  }

  function cell(content) {
    return el("td", null, [content]);
  }

  function table(headers, rows, empty) {
    if (rows.length === 0) return el("p", "muted", [empty]);
    var head = el("tr", null, headers.map(function (h) { return el("th", null, [h]); }));
    return el("table", null, [el("thead", null, [head]), el("tbody", null, rows)]);
  }

  function health(h) {
    var o = h.outbox;
    var facts = el("dl", "facts");
    [
      ["pending", String(o.pending)],
      ["leased", String(o.leased)],
      ["failed", String(o.failed)],
      ["uncertain", String(o.uncertain)],
      ["oldest pending", o.oldest_pending_seconds === null ? "—" : o.oldest_pending_seconds + " s"],
      ["bytes waiting", String(o.pending_bytes)],
    ].forEach(function (fact) {
      facts.appendChild(el("dt", null, [fact[0]]));
      facts.appendChild(el("dd", null, [fact[1]]));
    });
    facts.appendChild(el("dt", null, ["broker"]));
    facts.appendChild(el("dd", null, [pill(h.broker)]));
    facts.appendChild(el("dt", null, ["events"]));
    facts.appendChild(el("dd", null, [pill(h.events)]));
    var nodes = [facts];
    h.broker_conditions.forEach(function (c) { nodes.push(el("p", "error", [c])); });
    return nodes;
  }

  function agents(list) {
    var rows = [];
    list.forEach(function (a) {
      function name() {
        var nodes = [a.name];
        if (a.disabled) nodes.push(" ", el("span", "pill pill-disabled", ["disabled"]));
        return el("td", null, nodes);
      }
      if (a.windows.length === 0) {
        rows.push(el("tr", null, [name(), cell("—"), el("td", null, [pill("offline")]),
          cell("—"), cell("—"), cell("—"), cell("—"),
          cell(a.older_windows > 0 ? "over a day ago" : "never")]));
      }
      a.windows.forEach(function (w) {
        rows.push(el("tr", null, [
          name(),
          cell(w.session === "" ? "(shared)" : w.session),
          el("td", null, [pill(w.state)]),
          cell(w.status),
          cell(dash(w.activity)), cell(dash(w.project)), cell(dash(w.role)),
          cell(time(w.last_seen_at)),
        ]));
      });
      if (a.older_windows > 0) {
        var older = el("td", "muted", ["+ " + a.older_windows +
          " window(s) offline for more than a day (list_sessions {all: true} lists them)"]);
        older.colSpan = 7;
        rows.push(el("tr", "older", [name(), older]));
      }
    });
    return [table(["Agent", "Window", "State", "Status", "Activity", "Project", "Role", "Last seen"],
      rows, "No agents yet.")];
  }

  function tasks(list) {
    var board = el("div", "board");
    COLUMNS.forEach(function (status) {
      var inColumn = list.filter(function (t) { return t.status === status; });
      var column = el("div", "column", [
        el("h3", null, [status + " ", el("span", "count", [String(inColumn.length)])]),
      ]);
      inColumn.forEach(function (t) {
        var card = el("div", "task task-" + status, [
          el("div", "title", [t.title]),
          el("div", "key", [t.key]),
        ]);
        if (t.holder) {
          var holder = "held by " + t.holder;
          if (t.lease_expires_at) holder += " · lease until " + time(t.lease_expires_at);
          card.appendChild(el("div", "holder", [holder]));
        }
        column.appendChild(card);
      });
      board.appendChild(column);
    });
    return [board];
  }

  function locks(list) {
    var rows = list.map(function (l) {
      return el("tr", null, [cell(l.name), cell(l.holder), cell(dash(l.purpose)), cell(time(l.expires_at))]);
    });
    return [table(["Lock", "Holder", "Purpose", "Expires"], rows, "No locks held.")];
  }

  function reservations(list) {
    var rows = list.map(function (r) {
      return el("tr", null, [el("td", "pattern", [r.pattern]), cell(r.holder),
        el("td", null, [pill(r.exclusive ? "exclusive" : "shared")]), cell(dash(r.project)),
        cell(dash(r.reason)), cell(time(r.expires_at))]);
    });
    return [table(["Paths", "Holder", "Mode", "Project", "Reason", "Expires"], rows,
      "No paths reserved.")];
  }

  function overdueAcks(list) {
    var rows = list.map(function (o) {
      var place = o.channel !== null ? "#" + o.channel : (o.to !== null ? "direct to " + o.to : "-");
      return el("tr", null, [cell(o.debtor), cell(o.from), cell(place), cell(time(o.sent_at)),
        cell(time(o.due_at))]);
    });
    return [table(["Owed by", "Asked by", "Where", "Sent", "Due"], rows,
      "No acknowledgement is overdue.")];
  }

  function messages(list) {
    if (list.length === 0) return [el("p", "muted", ["No channel messages yet."])];
    var ul = el("ul", "messages");
    list.forEach(function (m) {
      var meta = el("div", "meta", [
        el("span", "channel", ["#" + m.channel]), " ",
        el("strong", null, [m.from]), " ",
        el("span", "muted", [time(m.created_at)]),
      ]);
      if (m.from_person) meta.insertBefore(el("span", null, [el("span", "pill pill-person", ["person"]), " "]), meta.childNodes[3]);
      if (m.announce) meta.appendChild(el("span", null, [" ", el("span", "pill pill-announce", ["announcement"])]));
      ul.appendChild(el("li", m.announce ? "announce" : null, [
        meta, el("div", "text", [m.body + (m.truncated ? " …" : "")]),
      ]));
    });
    return [ul];
  }

  function conversations(c) {
    var nodes = [el("p", "muted", [c.note])];
    if (c.items.length === 0) nodes.push(el("p", "muted", ["No conversations to show."]));
    c.items.forEach(function (conv) {
      var rows = conv.messages.map(function (m) {
        var body = m.body !== null ? cell(m.body) : el("td", null, [el("span", "muted", [dash(m.body_note)])]);
        var n = m.recipients;
        return el("tr", null, [
          el("td", null, [String(m.seq), el("div", "key", [m.id])]), cell(m.from), body, el("td", null, [pill(m.publication_state)]),
          cell("stored " + m.stored + "/" + n + " · delivered " + m.delivered + "/" + n +
            " · acknowledged " + m.acknowledged + "/" + n),
        ]);
      });
      nodes.push(el("div", "conversation", [
        el("h3", null, [conv.title + " ", el("span", "muted", [conv.visibility + (conv.archived ? " · archived" : "")])]),
        table(["Seq", "From", "Message", "State", "Receipts"], rows, "No messages yet."),
      ]));
    });
    return nodes;
  }

  function replace(id, nodes) {
    var target = document.getElementById(id);
    if (!target) return;
    while (target.firstChild) target.removeChild(target.firstChild);
    nodes.forEach(function (node) {
      target.appendChild(typeof node === "string" ? textNode(node) : node);
    });
  }

  function render(data) {
    replace("health", health(data.health));
    replace("agents", agents(data.agents));
    replace("tasks", tasks(data.tasks));
    replace("locks", locks(data.locks));
    replace("reservations", reservations(data.reservations));
    replace("messages", messages(data.messages));
    replace("conversations", conversations(data.conversations));
    replace("overdue-acks", overdueAcks(data.overdue_acks));
    replace("updated", ["updated " + time(data.generated_at)]);
    // A person's questions carry answer forms this script does not draw:
    // say when the waiting ones are no longer those on the page.
    if (data.questions) {
      var shownIds = Array.prototype.map.call(
        document.querySelectorAll("#questions li.question"),
        function (li) { return li.getAttribute("data-question"); }).sort().join(",");
      var waitingIds = data.questions.map(function (q) { return q.id; }).sort().join(",");
      replace("questions-note", shownIds === waitingIds ? [] :
        [data.questions.length + " question(s) waiting now: reload the page to answer the new ones."]);
    }
  }

  function poll() {
    fetch("/dashboard/data", { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.status === 401) {
          // Signed out elsewhere, revoked, or expired: the page shows why.
          window.location.reload();
          return null;
        }
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (data) {
        if (data) {
          render(data);
          document.body.classList.remove("stale");
        }
      })
      .catch(function () {
        document.body.classList.add("stale");
      })
      .then(function () { window.setTimeout(poll, POLL_MS); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (document.getElementById("tasks")) window.setTimeout(poll, POLL_MS);
  });
})();
