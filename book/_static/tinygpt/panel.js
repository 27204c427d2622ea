/*
 * The sampling panel of the book's web page: prompt, temperature, top-k, top-p, seed, length
 * and a choice of model, generating in the reader's browser with tinygpt's engine (engine.js,
 * loaded before this file).
 *
 * Every <div class="tinygpt-panel" data-models="book modern"> of the page becomes a panel. The
 * div first holds one line saying why there is no panel; it stays when JavaScript is off, and
 * an error line replaces it when the engine fails. A model's weights are loaded when the reader
 * first asks for it (models.js, loaded before this file: a <script> tag for
 * _static/models/<name>.js, which works on a page opened from disk). Characters are shown as
 * they are chosen: the loop runs for a few milliseconds, shows them, and yields to the browser
 * (setTimeout), so the page stays responsive; it is single-threaded and needs no special
 * headers.
 */
(function () {
  "use strict";
  const engine = window.tinygptEngine;
  const { load: loadModel, field, startPanels } = window.tinygptModels;  // models.js
  const LABELS = {
    book: "the book's model (chapter 8)",
    modern: "the modern book model (chapter 12)",
  };

  function number(input, name, low, high) {
    const text = input.value.trim();
    const v = Number(text);
    if (text === "" || !Number.isFinite(v) || v < low || v > high) {
      throw new Error(name + " must be a number in [" + low + ", " + high + "], got " +
                      JSON.stringify(text));
    }
    return v;
  }

  function buildPanel(div) {
    const names = (div.dataset.models || "book").split(/\s+/).filter(Boolean);
    div.textContent = "";
    const form = document.createElement("form");
    form.className = "tinygpt-form";
    const model = field(form, "model", { tag: "select", name: "model" });
    for (const n of names) {
      const o = document.createElement("option");
      o.value = n;
      o.textContent = LABELS[n] || n;
      model.appendChild(o);
    }
    const prompt = field(form, "prompt", { tag: "textarea", name: "prompt", rows: "2" });
    prompt.value = div.dataset.prompt || "ROMEO:";
    const temperature = field(form, "temperature", { name: "temperature", value: "0.8",
                                                     size: "4" });
    const topK = field(form, "top-k (empty: all)", { name: "top_k", value: "", size: "4" });
    const topP = field(form, "top-p (empty: 1)", { name: "top_p", value: "", size: "4" });
    const seed = field(form, "seed", { name: "seed", value: "0", size: "6" });
    const length = field(form, "characters", { name: "length", value: "300", size: "5" });
    const button = document.createElement("button");
    button.type = "submit";
    button.textContent = "Generate";
    form.appendChild(button);
    const out = document.createElement("pre");
    out.className = "tinygpt-output";
    const status = document.createElement("p");
    status.className = "tinygpt-status";
    status.textContent = "Generates in your browser: no server, nothing sent anywhere.";
    div.append(form, out, status);

    let running = null;  // the current run's token, to stop an older one
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const run = {};
      running = run;
      div.dataset.state = "loading";  // then running, and done or error
      out.textContent = "";
      try {
        const settings = {
          temperature: number(temperature, "temperature", 0, 100),
          topK: topK.value.trim() === "" ? null : number(topK, "top-k", 1, 1e6),
          topP: topP.value.trim() === "" ? null : number(topP, "top-p", 1e-9, 1),
          seed: number(seed, "seed", 0, Number.MAX_SAFE_INTEGER),
          useCache: true,
        };
        if (settings.topK !== null && !Number.isInteger(settings.topK)) {
          throw new Error("top-k must be a whole number");
        }
        if (!Number.isInteger(settings.seed)) throw new Error("seed must be a whole number");
        const n = number(length, "characters", 1, 5000);
        status.textContent = "loading " + (LABELS[model.value] || model.value) + " ...";
        const m = await loadModel(model.value);
        if (m.V < (settings.topK || 0)) throw new Error("top-k must be at most " + m.V);
        const ids = m.encode(prompt.value);
        if (ids.length === 0) throw new Error("the prompt is empty: type at least one character");
        out.textContent = prompt.value;
        const tokens = engine.generateTokens(m, ids, n, settings);
        const t0 = performance.now();
        let made = 0;
        const chunk = () => {
          if (running !== run) return;  // a newer run started
          const until = performance.now() + 15;  // about one frame, then let the page breathe
          let text = "", done = false;
          while (performance.now() < until) {
            const next = tokens.next();
            if (next.done) { done = true; break; }
            text += m.chars[next.value];
            made++;
          }
          out.textContent += text;
          const s = (performance.now() - t0) / 1000;
          status.textContent = (done ? "done: " : "generating: ") + made + " characters, " +
            Math.round(made / Math.max(s, 1e-3)) + " per second";
          if (done) div.dataset.state = "done";
          else setTimeout(chunk, 0);
        };
        div.dataset.state = "running";
        chunk();
      } catch (err) {
        div.dataset.state = "error";
        status.textContent = "error: " + err.message;
      }
    });
  }

  startPanels("div.tinygpt-panel", buildPanel, "sampling panel");
})();
