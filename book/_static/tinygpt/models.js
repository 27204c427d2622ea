/*
 * The book's exported models, loaded into the reader's page for its panels (panel.js,
 * attention_panel.js, chat_panel.js), each once.
 *
 * tinygptModels.load(name) is a Promise of the engine's Model (engine.js, loaded before this
 * file) of _static/models/<name>.js, which tinygpt.book.web_export wrote when the book was
 * built. The script is added by a <script> tag when a panel first asks for it: a script tag
 * works on a page opened from disk (file://), where the browser refuses fetch(). It does not
 * build any panel.
 */
(function () {
  "use strict";
  const engine = window.tinygptEngine;
  const MODELS_URL = new URL("../models/", document.currentScript.src);  // beside _static/tinygpt
  const loading = {};  // name -> Promise of a Model

  function load(name) {
    if (!loading[name]) {
      loading[name] = new Promise((resolve, reject) => {
        const ready = () => {
          const entry = (window.TINYGPT_MODELS || {})[name];
          if (!entry) return reject(new Error("models/" + name + ".js did not define the model"));
          try {
            resolve(engine.loadModel(entry.manifest, engine.base64ToBuffer(entry.weights)));
          } catch (err) {
            reject(err);
          }
        };
        if ((window.TINYGPT_MODELS || {})[name]) return ready();
        const script = document.createElement("script");
        script.src = new URL(name + ".js", MODELS_URL).href;
        script.onload = ready;
        script.onerror = () => {
          delete loading[name];  // a later try may find it
          reject(new Error("could not load " + script.src +
                           " (the book was built without its models?)"));
        };
        document.head.appendChild(script);
      });
    }
    return loading[name];
  }

  /** A labelled field appended to form: returns the input (or attrs.tag) element. */
  function field(form, label, attrs) {
    const wrap = document.createElement("label");
    wrap.className = "tinygpt-field";
    wrap.append(label + " ");
    const input = document.createElement(attrs.tag || "input");
    for (const [k, v] of Object.entries(attrs)) if (k !== "tag") input.setAttribute(k, v);
    wrap.appendChild(input);
    form.appendChild(wrap);
    return input;
  }

  /**
   * Build a panel in each div matching selector with build(div); where the engine is missing
   * or build fails, the div says so in one line, pointing at the output above.
   */
  function startPanels(selector, build, what) {
    const run = () => {
      for (const div of document.querySelectorAll(selector)) {
        try {
          if (!engine) throw new Error("the engine (engine.js) did not load");
          build(div);
        } catch (err) {
          div.textContent = "The " + what + " could not start (" + err.message + "); the " +
            "output above is from when the book was built.";
        }
      }
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
    else run();
  }

  window.tinygptModels = { load, field, startPanels };
})();
