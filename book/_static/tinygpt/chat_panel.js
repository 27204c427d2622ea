/*
 * The chat panel of the book's web page (chapter 15): the reader talks with the book's chat
 * model in the browser, turn after turn (chat.js's ChatSession on engine.js; models.js loads
 * the model when the reader first says something), and may see one speech answered by the chat
 * model and by the chat model tuned by DPO, side by side.
 *
 * Every <div class="tinygpt-chat" data-model="chat" data-compare="dpo"> becomes a panel: the
 * speaker and the replier (the names the template writes), the temperature and the seed, the
 * speech, Say, New conversation and Before and after DPO. The transcript shows each speech and
 * the reply as its characters are sampled (a few milliseconds of sampling, then the page is
 * drawn: single-threaded). Changing a name, the temperature or the seed starts a new
 * conversation at the next turn. Before and after DPO answers the speech as the first turn of a
 * fresh conversation with each model, by the same settings and seed, in two columns; the DPO
 * model (data-compare, "dpo" if absent) is loaded only then, so a page that never asks for it
 * never downloads it. The div first holds one line saying why there is no panel, which stays
 * when JavaScript is off.
 */
(function () {
  "use strict";
  const { load, field, startPanels } = window.tinygptModels;  // models.js
  const chat = window.tinygptChat;  // chat.js

  function buildPanel(div) {
    if (!chat) throw new Error("chat.js did not load");
    const name = div.dataset.model || "chat";
    div.textContent = "";
    const form = document.createElement("form");
    form.className = "tinygpt-form";
    const speaker = field(form, "you are", { name: "speaker", value: "HAMLET", size: "10" });
    const replier = field(form, "the model is", { name: "replier", value: "HORATIO",
                                                  size: "10" });
    const temperature = field(form, "temperature", { name: "temperature", value: "0.8",
                                                     size: "4" });
    const seed = field(form, "seed", { name: "seed", value: "0", size: "6" });
    const speech = field(form, "your speech", { tag: "textarea", name: "speech", rows: "2" });
    speech.value = div.dataset.speech || "What news from Elsinore?";
    const say = document.createElement("button");
    say.type = "submit";
    say.textContent = "Say";
    const fresh = document.createElement("button");
    fresh.type = "button";
    fresh.name = "new";
    fresh.textContent = "New conversation";
    const compare = document.createElement("button");
    compare.type = "button";
    compare.name = "compare";
    compare.textContent = "Before and after DPO";
    form.append(say, fresh, compare);
    const out = document.createElement("pre");
    out.className = "tinygpt-output";
    const sides = document.createElement("div");  // the comparison: two columns, once asked for
    sides.className = "tinygpt-compare";
    sides.hidden = true;
    const columns = [[name, "before DPO (the chat model)"],
                     [div.dataset.compare || "dpo", "after DPO"]].map(([model, title]) => {
      const column = document.createElement("div");
      const heading = document.createElement("p");
      heading.className = "tinygpt-compare-title";
      heading.textContent = title;
      const text = document.createElement("pre");
      text.className = "tinygpt-compare-output";
      text.dataset.model = model;
      column.append(heading, text);
      sides.appendChild(column);
      return text;
    });
    const status = document.createElement("p");
    status.className = "tinygpt-status";
    status.textContent = "The chat model runs in your browser: no server, nothing sent anywhere.";
    div.append(form, out, sides, status);

    let session = null, busy = false;  // a reply being written keeps its own session
    for (const input of [speaker, replier, temperature, seed]) {
      input.addEventListener("change", () => { session = null; });  // the next turn starts anew
    }
    fresh.addEventListener("click", () => {
      session = null;
      if (!busy) out.textContent = "";
    });

    /** The settings and the speech, checked: a one-line error for a bad one. */
    function read() {
      const t = Number(temperature.value.trim());
      if (temperature.value.trim() === "" || !Number.isFinite(t) || t < 0 || t > 100) {
        throw new Error("temperature must be a number in [0, 100], got " +
                        JSON.stringify(temperature.value));
      }
      const s = Number(seed.value.trim());
      if (!Number.isInteger(s) || s < 0) {
        throw new Error("seed must be a whole number, got " + JSON.stringify(seed.value));
      }
      const text = speech.value.trim();
      if (!text) throw new Error("say something first: the speech is empty");
      return { text, options: { speaker: speaker.value.trim(), replier: replier.value.trim(),
                                temperature: t, seed: s, maxChars: 200 } };
    }

    /** A turn of current to text, "SPEAKER:\nspeech\n\nREPLIER:\n" then its characters as
     * they are sampled, appended to element; a Promise of the characters written. */
    function write(current, text, element) {
      const pieces = current.reply(text);
      pieces.next();  // checks the speech; gives "REPLIER:\n", written below with the speech
      element.textContent += (element.textContent ? "\n\n" : "") + current.speaker + ":\n" +
        current.fit(text) + "\n\n" + current.replier + ":\n";
      div.dataset.state = "running";
      return new Promise((resolve, reject) => {
        let made = 0;
        const chunk = () => {
          try {
            const until = performance.now() + 15;
            let piece = "", done = false;
            while (performance.now() < until) {
              const next = pieces.next();
              if (next.done) { done = true; break; }
              piece += next.value;
              made++;
            }
            element.textContent += piece;
            if (done) resolve(made); else setTimeout(chunk, 0);
          } catch (err) {
            reject(err);
          }
        };
        chunk();
      });
    }

    /** Why a turn stopped, in words. */
    function why(current) {
      return {
        end: "it ended its turn", max_chars: "the length limit", context: "the context is full",
      }[current.stop] + (current.cut ? "; the first " + current.cut + " characters of your " +
                         "speech did not fit and were left out" : "");
    }

    /** run() with the panel busy: its state loading, then running, and done or error. */
    async function busyWith(run) {
      if (busy) return;
      busy = true;
      div.dataset.state = "loading";
      try {
        status.textContent = await run();
        div.dataset.state = "done";
      } catch (err) {
        div.dataset.state = "error";
        status.textContent = "error: " + err.message;
      } finally {
        busy = false;
      }
    }

    form.addEventListener("submit", (event) => {
      event.preventDefault();
      busyWith(async () => {
        const { text, options } = read();
        status.textContent = "loading the chat model ...";
        const model = await load(name);
        if (!session) {
          session = new chat.ChatSession(model, options);
          out.textContent = "";
        }
        const current = session;
        const made = await write(current, text, out);
        return "replied in " + made + " characters (" + why(current) + ")";
      });
    });

    compare.addEventListener("click", () => {
      busyWith(async () => {
        const { text, options } = read();
        status.textContent = "loading the chat model and the DPO model ...";
        const models = await Promise.all(columns.map((c) => load(c.dataset.model)));
        sides.hidden = false;
        const said = [];
        for (const [i, model] of models.entries()) {
          const current = new chat.ChatSession(model, options);  // a fresh conversation
          columns[i].textContent = "";
          const made = await write(current, text, columns[i]);
          said.push(made + " characters (" + why(current) + ")");
        }
        return "the same speech, seed and temperature: before DPO " + said[0] +
          ", after DPO " + said[1];
      });
    });
  }

  startPanels("div.tinygpt-chat", buildPanel, "chat panel");
})();
