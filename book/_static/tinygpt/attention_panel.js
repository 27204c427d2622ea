/*
 * The attention panel of the book's web page (chapters 5 and 7): the reader types a text, the
 * book's model reads it in the browser (engine.js, with models.js to load the model), and for
 * the layer and head the reader chooses, pointing at a character (hovering, clicking, or
 * focusing it with Tab and moving with the arrow keys, Home and End) shades every earlier
 * character by the weight that position's query gives it (the darkest: the row's largest): the
 * row of softmax(q k^T / sqrt(d_k)) of chapter 5, causal, summing to 1. Later characters are
 * greyed: the mask hides them.
 *
 * Every <div class="tinygpt-attention" data-model="book" data-text="..."> becomes a panel; the
 * div first holds one line saying why there is none, which stays when JavaScript is off. Each
 * character's weight is also in its title and its data-weight attribute (four decimals); the
 * status line names the three it attends to most. Layers and heads are numbered from 0, as in
 * the model's parameter names (transformer.h.0.attn). It does not sample (panel.js does).
 */
(function () {
  "use strict";
  const { load, field, startPanels } = window.tinygptModels;  // models.js

  /** How a character is shown in the row of characters: visible spaces and line breaks. */
  function shown(ch) {
    if (ch === "\n") return "\u21b5";  // ↵
    if (ch === " ") return "\u2423";  // ␣
    return ch;
  }

  function options(select, n) {
    const keep = Number(select.value) || 0;
    select.textContent = "";
    for (let i = 0; i < n; i++) {
      const o = document.createElement("option");
      o.value = String(i);
      o.textContent = String(i);
      select.appendChild(o);
    }
    select.value = String(Math.min(keep, n - 1));
  }

  function buildPanel(div) {
    const name = div.dataset.model || "book";
    div.textContent = "";
    const form = document.createElement("form");
    form.className = "tinygpt-form";
    const text = field(form, "text", { tag: "textarea", name: "text", rows: "2" });
    text.value = div.dataset.text || "ROMEO:\nBut soft, what light through yonder window breaks?";
    const layer = field(form, "layer", { tag: "select", name: "layer" });
    const head = field(form, "head", { tag: "select", name: "head" });
    options(layer, 1);
    options(head, 1);
    const button = document.createElement("button");
    button.type = "submit";
    button.textContent = "Show attention";
    form.appendChild(button);
    const row = document.createElement("div");
    row.className = "tinygpt-tokens";
    row.setAttribute("role", "group");
    row.setAttribute("aria-label", "the text, one character each: point at one");
    const status = document.createElement("p");
    status.className = "tinygpt-status";
    status.textContent = "Runs the book's model in your browser: no server, nothing sent anywhere.";
    div.append(form, row, status);

    let model = null, chars = [], attention = null, pointed = -1;

    /** Shade the characters by the weights of position t's query (layer and head chosen). */
    function point(t) {
      if (!attention || t < 0 || t >= chars.length) return;
      pointed = t;
      const l = Number(layer.value), h = Number(head.value);
      const w = attention[t][l][h];  // Float64Array of t + 1 weights over 0 .. t
      const spans = row.children;
      const most = Math.max(...w);  // the darkest shade is the row's largest weight
      for (let j = 0; j < spans.length; j++) {
        const span = spans[j];
        span.classList.toggle("tinygpt-query", j === t);
        span.classList.toggle("tinygpt-future", j > t);
        if (j <= t) {
          span.dataset.weight = w[j].toFixed(4);
          span.title = "position " + j + ": weight " + w[j].toFixed(4);
          span.style.backgroundColor = "rgba(214, 39, 40, " + (0.85 * w[j] / most).toFixed(3) +
            ")";
        } else {
          delete span.dataset.weight;
          span.title = "position " + j + ": after the query, masked";
          span.style.backgroundColor = "";
        }
      }
      const top = Array.from(w, (v, j) => [v, j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
      status.textContent = "position " + t + " " + JSON.stringify(chars[t]) + " (layer " + l +
        ", head " + h + ") attends most to " + top.map(([v, j]) => "position " + j + " " +
        JSON.stringify(chars[j]) + " (" + v.toFixed(2) + ")").join(", ");
      div.dataset.pointed = String(t);
    }

    function render() {
      row.textContent = "";
      chars.forEach((ch, i) => {
        const span = document.createElement("span");
        span.className = "tinygpt-token";
        span.tabIndex = 0;
        span.dataset.pos = String(i);
        span.textContent = shown(ch);
        span.addEventListener("mouseenter", () => point(i));
        span.addEventListener("click", () => { span.focus(); point(i); });
        span.addEventListener("focus", () => point(i));
        span.addEventListener("keydown", (event) => {
          const to = { ArrowLeft: i - 1, ArrowRight: i + 1, Home: 0, End: chars.length - 1 }[
            event.key];
          if (to === undefined || to < 0 || to >= chars.length) return;
          event.preventDefault();
          row.children[to].focus();
        });
        if (ch === "\n") span.classList.add("tinygpt-line-end");  // book.css breaks the line
        row.appendChild(span);
      });
    }

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      div.dataset.state = "loading";
      try {
        status.textContent = "loading the book's model ...";
        model = await load(name);
        options(layer, model.config.n_layer);
        options(head, model.H);
        const ids = model.encode(text.value);
        if (ids.length === 0) throw new Error("the text is empty: type at least one character");
        if (ids.length > model.Tmax) {
          throw new Error("the text is " + ids.length + " characters; the model reads at most " +
                          model.Tmax);
        }
        attention = model.forward(ids, null, { attention: true }).attention;
        chars = [...text.value];
        render();
        div.dataset.state = "ready";
        point(Math.min(pointed >= 0 ? pointed : chars.length - 1, chars.length - 1));
      } catch (err) {
        div.dataset.state = "error";
        attention = null;
        row.textContent = "";
        status.textContent = "error: " + err.message;
      }
    });
    for (const select of [layer, head]) {
      select.addEventListener("change", () => point(pointed));
    }
  }

  startPanels("div.tinygpt-attention", buildPanel, "attention panel");
})();
