// Runs book/_static/tinygpt/engine.js in Node for tests/test_web_engine.py.
// Usage: node engine_driver.js JOB.json -> JSON on stdout. The job names a model script written
// by tinygpt.book.web_export (<name>.js, loaded as the page loads it: a script that sets
// window.TINYGPT_MODELS) and lists cases: {kind: "logits", ids, cached} (the logits of every
// position, fed at once or one by one through the cache), {kind: "generate", ids, n, settings}
// (the token ids), {kind: "sample", rows, settings, seed} (one token per row of logits, one
// PCG32 for all rows), {kind: "pcg", seed, n} (raw outputs), {kind: "attention", ids},
// {kind: "weights_sha256"} (the SHA-256 of the weights as engine.unpackWeights unpacked them),
// {kind: "chat", speeches, settings} (chat.js's ChatSession: for each speech in turn, the reply,
// why it stopped, the characters of the speech cut and the context's length after it).
"use strict";
const fs = require("fs");
const path = require("path");
const vm = require("vm");
const STATIC = path.join(__dirname, "..", "..", "book", "_static", "tinygpt");
const engine = require(path.join(STATIC, "engine.js"));
const chat = require(path.join(STATIC, "chat.js"));

async function main() {
  const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  let model = null;
  let weights = null;
  if (job.model_js) {
    const context = { window: {} };
    vm.runInNewContext(fs.readFileSync(job.model_js, "utf8"), context);
    const entry = context.window.TINYGPT_MODELS[job.name];
    weights = await engine.unpackWeights(entry);
    model = engine.loadModel(entry.manifest, weights);
  }

  const results = job.cases.map((c) => {
    if (c.kind === "logits") {
      if (!c.cached) return model.forward(c.ids, null, { all: true }).map((r) => Array.from(r));
      const cache = model.newCache();
      return c.ids.map((id) => Array.from(model.forward([id], cache)));
    }
    if (c.kind === "generate") {
      return Array.from(engine.generateTokens(model, c.ids, c.n, c.settings));
    }
    if (c.kind === "sample") {
      const rng = new engine.PCG32(c.seed);
      return c.rows.map((row) => engine.sampleToken(row, c.settings, rng));
    }
    if (c.kind === "weights_sha256") {  // what unpackWeights gave, as the manifest hashes it
      return require("crypto").createHash("sha256").update(Buffer.from(weights)).digest("hex");
    }
    if (c.kind === "pcg") {
      const rng = new engine.PCG32(c.seed);
      return Array.from({ length: c.n }, () => rng.next());
    }
    if (c.kind === "attention") {
      return model.forward(c.ids, null, { attention: true }).attention
        .map((layers) => layers.map((heads) => heads.map((w) => Array.from(w))));
    }
    if (c.kind === "chat") {
      const session = new chat.ChatSession(model, c.settings);
      return c.speeches.map((speech) => ({ text: Array.from(session.reply(speech)).join(""),
                                           stop: session.stop, cut: session.cut,
                                           context: session.context.length }));
    }
    throw new Error("unknown case " + c.kind);
  });
  process.stdout.write(JSON.stringify(results));
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack || err) + "\n");
  process.exit(1);
});
