/*
 * The chat panel of the book's web page (chapter 15): the reader talks with the book's chat
 * model in the browser, turn after turn (chat.js's ChatSession on engine.js; models.js loads
 * the model when the reader first says something).
 *
 * Every <div class="tinygpt-chat" data-model="chat"> becomes a panel: the speaker and the
 * replier (the names the template writes), the temperature and the seed, the speech, Say and
 * New conversation. The transcript shows each speech and the reply as its characters are
 * sampled (a few milliseconds of sampling, then the page is drawn: single-threaded). Changing a
 * name, the temperature or the seed starts a new conversation at the next turn. The div first
 * holds one line saying why there is no panel, which stays when JavaScript is off.
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
    form.append(say, fresh);
    const out = document.createElement("pre");
    out.className = "tinygpt-output";
    const status = document.createElement("p");
    status.className = "tinygpt-status";
    status.textContent = "The chat model runs in your browser: no server, nothing sent anywhere.";
    div.append(form, out, status);

    let session = null, busy = false;  // a reply being written keeps its own session
    for (const input of [speaker, replier, temperature, seed]) {
      input.addEventListener("change", () => { session = null; });  // the next turn starts anew
    }
    fresh.addEventListener("click", () => {
      session = null;
      if (!busy) out.textContent = "";
    });

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (busy) return;
      busy = true;
      div.dataset.state = "loading";  // then running, and done or error
      try {
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
        status.textContent = "loading the chat model ...";
        const model = await load(name);
        if (!session) {
          session = new chat.ChatSession(model, { speaker: speaker.value.trim(),
                                                  replier: replier.value.trim(),
                                                  temperature: t, seed: s, maxChars: 200 });
          out.textContent = "";
        }
        const current = session;
        const pieces = current.reply(text);
        pieces.next();  // checks the speech; gives "REPLIER:\n", written below with the speech
        out.textContent += (out.textContent ? "\n\n" : "") + current.speaker + ":\n" +
          current.fit(text) + "\n\n" + current.replier + ":\n";
        div.dataset.state = "running";
        let made = 0;
        const chunk = () => {
          const until = performance.now() + 15;
          let piece = "", done = false;
          while (performance.now() < until) {
            const next = pieces.next();
            if (next.done) { done = true; break; }
            piece += next.value;
            made++;
          }
          out.textContent += piece;
          if (!done) { setTimeout(chunk, 0); return; }
          busy = false;
          div.dataset.state = "done";
          status.textContent = "replied in " + made + " characters (" + {
            end: "it ended its turn", max_chars: "the length limit", context: "the context is full",
          }[current.stop] + (current.cut ? "; the first " + current.cut + " characters of your " +
                             "speech did not fit and were left out" : "") + ")";
        };
        chunk();
      } catch (err) {
        busy = false;
        div.dataset.state = "error";
        status.textContent = "error: " + err.message;
      }
    });
  }

  startPanels("div.tinygpt-chat", buildPanel, "chat panel");
})();
