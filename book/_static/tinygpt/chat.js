/*
 * A conversation with the book's chat model in the reader's page: tinygpt.chat.ChatSession in
 * JavaScript, on tinygpt's engine (engine.js, loaded before this file).
 *
 * Each reply(speech) adds the chat template's turn "▷SPEAKER:\nspeech\n▶REPLIER:\n" to the
 * conversation and samples the reply until "■", maxChars characters or the end of the context,
 * as ChatSession does: the replier's name is written by the program, the model may not write
 * "▷" or "▶" nor a blank line while it replies, a speech is cut to its last words so that
 * `reserve` tokens stay for the reply, the key/value cache is kept across turns, and the oldest
 * turns are dropped (the context restarts at a later "▷") when a turn would not fit. At
 * temperature 0 the replies are ChatSession's; above it the draws come from PCG32 (the page's
 * sampler), not torch's generator, so the text differs from `tinygpt chat`'s for the same seed.
 *
 * A classic script: in a page it defines the global `tinygptChat`; in Node, require() returns
 * it. It does not touch the page (chat_panel.js does).
 */
(function (root) {
  "use strict";
  const engine = root.tinygptEngine ||
    (typeof require === "function" ? require("./engine.js") : null);
  const SPEECH = "\u25b7", REPLY = "\u25b6", END = "\u25a0";  // ▷ ▶ ■
  const MAX_REPLY = 48;  // tinygpt.chat.MAX_REPLY: the tokens kept for a reply

  /** The template up to where the reply starts (tinygpt.chat.prompt). */
  function prompt(speaker, speech, replier) {
    return SPEECH + speaker + ":\n" + speech + "\n" + REPLY + replier + ":\n";
  }

  /** The end of text in at most limit characters, starting at a word; "" if none fits. */
  function lastWords(chars, limit) {
    if (chars.length <= limit) return chars.join("");
    const tail = chars.slice(chars.length - limit);
    if (" \n".includes(chars[chars.length - limit - 1])) return tail.join("");
    const cut = tail.findIndex((c) => c === " " || c === "\n");
    return cut < 0 ? "" : tail.slice(cut + 1).join("");
  }

  function checkName(name, what) {
    if (typeof name !== "string" || !name.trim() || name.includes("\n") || name.includes(":") ||
        [SPEECH, REPLY, END].some((c) => name.includes(c))) {
      throw new Error(what + " must be a name on one line without ':', got " +
                      JSON.stringify(name));
    }
    return name;
  }

  class ChatSession {
    constructor(model, options) {
      const o = options || {};
      for (const c of [SPEECH, REPLY, END]) {
        if (!model.stoi.has(c)) {
          throw new Error("this model has no chat template (no " + c + "): it was not " +
                          "fine-tuned to chat");
        }
      }
      this.model = model;
      this.speaker = checkName(o.speaker || "HAMLET", "speaker");
      this.replier = checkName(o.replier || "HORATIO", "replier");
      for (const c of this.speaker + this.replier) model.encode(c);  // unknown: an error
      this.settings = { temperature: o.temperature === undefined ? 0.8 : o.temperature,
                        topK: o.topK || null, topP: o.topP === undefined ? null : o.topP };
      this.maxChars = o.maxChars || 200;
      this.reserve = o.reserve || Math.min(MAX_REPLY, Math.floor(model.Tmax / 2));
      this.seed = o.seed || 0;
      this.ids = { speech: model.stoi.get(SPEECH), reply: model.stoi.get(REPLY),
                   end: model.stoi.get(END), newline: model.stoi.get("\n") };
      this.clear();
    }

    /** Forget the conversation (and restart the random numbers at the seed). */
    clear() {
      this.context = [];  // the conversation's latest tokens
      this.fed = 0;  // of them, those whose keys and values are in the cache
      this.cache = this.model.newCache();
      this.rng = new engine.PCG32(this.seed);
      this.stop = "";
      this.cut = 0;
    }

    /** The most characters of a speech one turn holds. */
    get room() {
      return Math.max(this.model.Tmax - this.reserve - [...prompt(this.speaker, "",
                                                                this.replier)].length, 1);
    }

    /** The end of speech that fits in a turn: its last words, or its last characters. */
    fit(speech) {
      const chars = [...speech], room = this.room;
      if (chars.length <= room) return speech;
      return lastWords(chars, room) || chars.slice(chars.length - room).join("");
    }

    /** Keep the last `keep` tokens of the context, from a ▷ if one is there. */
    crop(keep) {
      if (this.context.length <= keep) return;
      let tail = this.context.slice(this.context.length - keep);
      const at = tail.indexOf(this.ids.speech);
      if (at >= 0) tail = tail.slice(at);
      this.context = tail;
      this.fed = 0;
      this.cache = this.model.newCache();
    }

    nextToken() {
      const logits = this.model.forward(this.context.slice(this.fed), this.cache);
      this.fed = this.context.length;
      logits[this.ids.speech] = -Infinity;  // only ■ ends the turn, and it opens none
      logits[this.ids.reply] = -Infinity;
      if (this.context[this.context.length - 1] === this.ids.newline) {
        logits[this.ids.newline] = -Infinity;  // no blank line: that starts another speech
      }
      return engine.sampleToken(logits, this.settings, this.rng);
    }

    /**
     * Yield the reply to speech piece by piece: first "REPLIER:\n", then each character. When
     * it is done, this.stop says why ("end", "max_chars" or "context"), this.cut how many
     * characters of the speech were cut.
     */
    *reply(speech) {
      for (const c of [SPEECH, REPLY, END]) {
        if (speech.includes(c)) {
          throw new Error("the speech contains " + c + ", which only the chat template writes");
        }
      }
      const kept = this.fit(speech);
      this.cut = [...speech].length - [...kept].length;
      const turn = this.model.encode(prompt(this.speaker, kept, this.replier));
      this.context.push(...turn);
      this.crop(this.model.Tmax - this.reserve);
      yield this.replier + ":\n";
      let written = 0;
      this.stop = "context";
      while (this.context.length < this.model.Tmax) {
        if (written === this.maxChars) { this.stop = "max_chars"; break; }
        const token = this.nextToken();
        this.context.push(token);
        if (token === this.ids.end) { this.stop = "end"; break; }
        written++;
        yield this.model.chars[token];
      }
      if (this.stop !== "end") this.context.push(this.ids.end);  // the turn is closed
    }
  }

  const chat = { ChatSession, prompt, lastWords, SPEECH, REPLY, END };
  root.tinygptChat = chat;
  if (typeof module !== "undefined" && module.exports) module.exports = chat;
})(typeof globalThis !== "undefined" ? globalThis : this);
