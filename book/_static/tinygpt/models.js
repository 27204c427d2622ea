/*
 * The book's exported models, loaded into the reader's page for its panels (panel.js,
 * attention_panel.js, chat_panel.js), each once.
 *
 * tinygptModels.load(name) is a Promise of the engine's Model (engine.js, loaded before this
 * file) of the files tinygpt.book.web_export wrote into _static/models/ when the book was built,
 * loaded when a panel first asks for it:
 *
 * - on a page served over http(s) (a static host, GitHub Pages), <name>.json and <name>.bin by
 *   fetch(): the float32 weights as they are, smaller than the script even packed;
 * - on a page opened from disk (file://), where Chromium refuses fetch(), or where the fetch
 *   fails, <name>.js by a <script> tag: the same manifest and weights, the weights packed
 *   (engine.unpackWeights: byte planes, deflated, in base64).
 *
 * It does not build any panel (startPanels calls the panel's own builder).
 */
(function () {
  "use strict";
  const engine = window.tinygptEngine;
  const MODELS_URL = new URL("../models/", document.currentScript.src);  // beside _static/tinygpt
  const loading = {};  // name -> Promise of a Model

  /** The Model from <name>.json and <name>.bin, fetched (http and https pages only). */
  async function fetchModel(name) {
    const get = async (file) => {
      const response = await fetch(new URL(file, MODELS_URL).href);
      if (!response.ok) throw new Error(file + ": HTTP " + response.status);
      return response;
    };
    const manifest = await (await get(name + ".json")).json();
    return engine.loadModel(manifest, await (await get(name + ".bin")).arrayBuffer());
  }

  /** The Model from <name>.js, added by a <script> tag (what works on file:// pages). */
  function scriptModel(name) {
    return new Promise((resolve, reject) => {
      const ready = () => {
        const entry = (window.TINYGPT_MODELS || {})[name];
        if (!entry) return reject(new Error("models/" + name + ".js did not define the model"));
        engine.unpackWeights(entry)
          .then((weights) => resolve(engine.loadModel(entry.manifest, weights)))
          .catch(reject);
      };
      if ((window.TINYGPT_MODELS || {})[name]) return ready();
      const script = document.createElement("script");
      script.src = new URL(name + ".js", MODELS_URL).href;
      script.onload = ready;
      script.onerror = () => reject(new Error("could not load " + script.src +
                                              " (the book was built without its models?)"));
      document.head.appendChild(script);
    });
  }

  /** The Model `name`, loaded once: fetched over http(s), else (or if that fails) by script. */
  function load(name) {
    if (!loading[name]) {
      loading[name] = /^https?:$/.test(MODELS_URL.protocol)
        ? fetchModel(name).catch(() => scriptModel(name)) : scriptModel(name);
      loading[name].catch(() => { delete loading[name]; });  // a later try may find it
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
