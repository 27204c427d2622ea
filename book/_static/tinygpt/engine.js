/*
 * tinygpt's engine for the reader's page: the book's GPT, forward pass and sampling, in plain
 * JavaScript.
 *
 * It runs a model that tinygpt.book.web_export wrote at build time (its config, its float32
 * weights and its characters) with the same arithmetic as src/tinygpt/model.py: the embeddings,
 * the blocks (a norm, causal attention with a key/value cache, a norm, the MLP), the final norm
 * and the output layer. It covers every switch of GPTConfig the book's models use: LayerNorm or
 * RMSNorm, pre- or post-norm, GELU (exact or tanh), ReLU, ReLU^2 or SwiGLU, learned, sinusoidal
 * or rotary positions (RoPE), QK-norm, tied or untied output layer. Weights stay float32; every
 * sum is computed in float64, so the logits agree with PyTorch's float32 to about 1e-6.
 *
 * Sampling (sampleToken, generateTokens) follows tinygpt.sample (PCG32, choose_token, generate):
 * temperature, then top-k, then top-p, then one draw from PCG32, all in float64.
 *
 * It is a classic script, not an ES module: Chromium refuses module scripts from file:// pages,
 * and the book must work opened from disk. In a page it defines the global `tinygptEngine`; in
 * Node, `require()` returns the same object. It does not touch the page (book/_static/tinygpt/
 * panel.js does) and does not tokenize anything but single characters.
 */
(function (root) {
  "use strict";

  // --- loading -----------------------------------------------------------------------------------

  /** The bytes of a base64 string, as an ArrayBuffer (atob in a page, Buffer in Node). */
  function base64ToBuffer(text) {
    if (typeof atob === "function") {
      const binary = atob(text);
      const bytes = new Uint8Array(binary.length);
      for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
      return bytes.buffer;
    }
    const buf = Buffer.from(text, "base64");
    return buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
  }

  /**
   * The float32 weights of a model script's entry ({manifest, packing, weights}, web_export's
   * <name>.js), as an ArrayBuffer: a Promise. Packing "shuffle4-deflate": base64 of zlib's
   * deflate of four byte planes (byte 0 of every float, then byte 1, 2, 3), inflated by the
   * browser's own DecompressionStream and interleaved again. An entry without packing holds
   * the plain bytes in base64.
   */
  async function unpackWeights(entry) {
    const raw = base64ToBuffer(entry.weights);
    if (!entry.packing) return raw;
    if (entry.packing !== "shuffle4-deflate") {
      throw new Error("unknown packing of the weights: " + entry.packing);
    }
    if (typeof DecompressionStream !== "function") {
      throw new Error("this browser has no DecompressionStream to unpack the weights");
    }
    const stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate"));
    const planes = new Uint8Array(await new Response(stream).arrayBuffer());
    const n = planes.length / 4;
    if (planes.length !== entry.manifest.bytes || !Number.isInteger(n)) {
      throw new Error("the unpacked weights hold " + planes.length + " bytes, the manifest " +
                      "says " + entry.manifest.bytes);
    }
    const out = new Uint8Array(planes.length);
    for (let j = 0; j < 4; j++) {
      const plane = planes.subarray(j * n, (j + 1) * n);
      for (let i = 0; i < n; i++) out[4 * i + j] = plane[i];
    }
    return out.buffer;
  }

  /**
   * A Model from a manifest (web_export's JSON: config, chars, tensors with name, shape and byte
   * offset) and the float32 little-endian bytes it describes.
   */
  function loadModel(manifest, buffer) {
    if (manifest.format !== "tinygpt-web-model" || manifest.version !== 1) {
      throw new Error("not a tinygpt web model (format " + manifest.format + ", version " +
                      manifest.version + ")");
    }
    if (buffer.byteLength !== manifest.bytes) {
      throw new Error("the weights hold " + buffer.byteLength + " bytes, the manifest says " +
                      manifest.bytes);
    }
    const tensors = {};
    for (const t of manifest.tensors) {
      const n = t.shape.reduce((a, b) => a * b, 1);
      tensors[t.name] = new Float32Array(buffer, t.offset, n);  // a view: no copy
    }
    return new Model(manifest.config, manifest.chars, tensors, manifest.name || "");
  }

  // --- the pieces the book builds, one function each ------------------------------------------

  /** y (n_out) = W x + b: W is (n_out, n_in) row-major, as torch's nn.Linear stores it. */
  function linear(x, W, b, nOut, nIn) {
    const y = new Float64Array(nOut);
    for (let o = 0; o < nOut; o++) {
      let s = b ? b[o] : 0.0;
      const row = o * nIn;
      for (let i = 0; i < nIn; i++) s += W[row + i] * x[i];
      y[o] = s;
    }
    return y;
  }

  /** LayerNorm over a vector: (x - mean) / sqrt(var + eps) * weight (+ bias). */
  function layerNorm(x, weight, bias, eps) {
    const n = x.length;
    let mean = 0.0;
    for (let i = 0; i < n; i++) mean += x[i];
    mean /= n;
    let v = 0.0;
    for (let i = 0; i < n; i++) v += (x[i] - mean) * (x[i] - mean);
    const inv = 1.0 / Math.sqrt(v / n + eps);
    const y = new Float64Array(n);
    for (let i = 0; i < n; i++) y[i] = (x[i] - mean) * inv * weight[i] + (bias ? bias[i] : 0.0);
    return y;
  }

  /** RMSNorm over x[start .. start+n): x / sqrt(mean(x^2) + eps) * weight, in place. */
  function rmsNormInPlace(x, start, n, weight, eps) {
    let ms = 0.0;
    for (let i = 0; i < n; i++) ms += x[start + i] * x[start + i];
    const inv = 1.0 / Math.sqrt(ms / n + eps);
    for (let i = 0; i < n; i++) x[start + i] = x[start + i] * inv * weight[i];
  }

  /**
   * erf(x), which JavaScript's Math lacks: its Taylor series below |x| = 2.5 (summed until the
   * terms vanish), Abramowitz and Stegun's formula 7.1.26 above (error below 1.5e-7 where erf
   * is within 4e-4 of 1); both far under what float32 weights carry.
   */
  function erf(x) {
    const sign = x < 0 ? -1 : 1;
    const a = Math.abs(x);
    if (a > 6) return sign;
    const t = 1.0 / (1.0 + 0.3275911 * a);
    const poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 +
                 t * (-1.453152027 + t * 1.061405429))));
    let y = 1.0 - poly * Math.exp(-a * a);  // within 1.5e-7
    if (a < 2.5) {
      let term = a, sum = a;
      for (let k = 1; k < 60; k++) {
        term *= -a * a / k;
        const add = term / (2 * k + 1);
        sum += add;
        if (Math.abs(add) < 1e-17) break;
      }
      y = sum * 2.0 / Math.sqrt(Math.PI);
    }
    return sign * y;
  }

  // The MLP's nonlinearities, by GPTConfig.activation (src/tinygpt/block.py).
  const ACTIVATIONS = {
    gelu: (x) => 0.5 * x * (1.0 + erf(x / Math.SQRT2)),
    gelu_tanh: (x) => 0.5 * x * (1.0 + Math.tanh(Math.sqrt(2.0 / Math.PI) *
                                                  (x + 0.044715 * x * x * x))),
    relu: (x) => (x > 0 ? x : 0.0),
    relu2: (x) => (x > 0 ? x * x : 0.0),
  };

  /** Vaswani et al.'s sinusoid for position t and column c of width C (embedding.py). */
  function sinusoid(t, c, C) {
    const angle = t * Math.pow(10000.0, -(c - (c % 2)) / C);
    return c % 2 === 0 ? Math.sin(angle) : Math.cos(angle);
  }

  /** RoPE, halves layout (rope.py): pair (m, m + d/2) of q[start ..] turned by t * theta_m. */
  function ropeInPlace(q, start, d, t, base) {
    const half = d / 2;
    for (let m = 0; m < half; m++) {
      // the angle as torch computes it: inv_freq in float32, t * inv_freq in float32
      const invFreq = Math.fround(1.0 / Math.pow(base, Math.fround((2 * m) / d)));
      const angle = Math.fround(t * invFreq);
      const c = Math.cos(angle), s = Math.sin(angle);
      const x1 = q[start + m], x2 = q[start + m + half];
      q[start + m] = x1 * c - x2 * s;
      q[start + m + half] = x2 * c + x1 * s;
    }
  }

  // --- the model -------------------------------------------------------------------------------

  class Model {
    constructor(config, chars, tensors, name) {
      this.config = config;
      this.chars = chars;  // id -> character (the book's CharTokenizer)
      this.stoi = new Map(chars.map((c, i) => [c, i]));  // character -> id
      this.w = tensors;
      this.name = name;
      this.C = config.n_embd;
      this.H = config.n_head;
      this.dk = this.C / this.H;
      this.V = config.vocab_size;
      this.Tmax = config.block_size;
      this.F = config.mlp_hidden === null || config.mlp_hidden === undefined
        ? 4 * this.C : config.mlp_hidden;
      this.gated = config.activation === "swiglu";
    }

    /** The ids of text; an unknown character is an error that names it. */
    encode(text) {
      const ids = [];
      for (const ch of text) {
        if (!this.stoi.has(ch)) {
          throw new Error("the character " + JSON.stringify(ch) + " is not in this model's " +
                          this.V + "-character vocabulary");
        }
        ids.push(this.stoi.get(ch));
      }
      return ids;
    }

    decode(ids) { return ids.map((i) => this.chars[i]).join(""); }

    /** An empty key/value cache: per layer, keys and values (H, T_max, d_k) in float64. */
    newCache() {
      const size = this.H * this.Tmax * this.dk;
      const layers = [];
      for (let l = 0; l < this.config.n_layer; l++) {
        layers.push({ k: new Float64Array(size), v: new Float64Array(size) });
      }
      return { length: 0, layers: layers };
    }

    /** The norm named by the config, with the parameters under `prefix`. */
    norm(x, prefix) {
      const eps = this.config.norm_eps;
      if (this.config.norm === "layernorm") {
        return layerNorm(x, this.w[prefix + ".weight"], this.w[prefix + ".bias"] || null, eps);
      }
      const y = Float64Array.from(x);
      rmsNormInPlace(y, 0, y.length, this.w[prefix + ".weight"], eps);
      return y;
    }

    /**
     * Attention of one position, at absolute position t, over the cached positions and itself.
     * Writes its key and value into the cache; returns the output (C) and, when asked, the
     * weights (H rows of t + 1).
     */
    attend(x, layer, cache, t, wantWeights) {
      const C = this.C, H = this.H, dk = this.dk, p = "transformer.h." + layer + ".attn.";
      const qkv = linear(x, this.w[p + "c_attn.weight"], this.w[p + "c_attn.bias"], 3 * C, C);
      // qkv = [q | k | v], each C wide: head h holds columns h*dk .. (h+1)*dk
      const q = qkv.subarray(0, C), k = qkv.subarray(C, 2 * C), v = qkv.subarray(2 * C);
      const { k: K, v: Vc } = cache.layers[layer];
      const y = new Float64Array(C);
      const weights = wantWeights ? [] : null;
      const scale = 1.0 / Math.sqrt(dk);
      for (let h = 0; h < H; h++) {
        const o = h * dk;
        if (this.config.qk_norm) {  // chapter 12: unit-RMS queries and keys, per head
          rmsNormInPlace(q, o, dk, this.w[p + "q_norm.weight"], this.config.norm_eps);
          rmsNormInPlace(k, o, dk, this.w[p + "k_norm.weight"], this.config.norm_eps);
        }
        if (this.config.positional === "rope") {  // rotate to position t
          ropeInPlace(q, o, dk, t, this.config.rope_theta);
          ropeInPlace(k, o, dk, t, this.config.rope_theta);
        }
        const base = h * this.Tmax * dk;  // the cache of head h: (T_max, d_k)
        for (let i = 0; i < dk; i++) {
          K[base + cache.length * dk + i] = k[o + i];
          Vc[base + cache.length * dk + i] = v[o + i];
        }
        // scores of the query against every visible key (the causal mask: keys 0 .. now)
        const n = cache.length + 1;
        const scores = new Float64Array(n);
        let max = -Infinity;
        for (let j = 0; j < n; j++) {
          let s = 0.0;
          for (let i = 0; i < dk; i++) s += q[o + i] * K[base + j * dk + i];
          scores[j] = s * scale;
          if (scores[j] > max) max = scores[j];
        }
        let total = 0.0;  // softmax, shifted by the largest score
        for (let j = 0; j < n; j++) { scores[j] = Math.exp(scores[j] - max); total += scores[j]; }
        for (let j = 0; j < n; j++) {
          const a = scores[j] / total;
          scores[j] = a;
          for (let i = 0; i < dk; i++) y[o + i] += a * Vc[base + j * dk + i];
        }
        if (weights) weights.push(scores);
      }
      const out = linear(y, this.w[p + "c_proj.weight"], this.w[p + "c_proj.bias"], C, C);
      return { out: out, weights: weights };
    }

    /** The MLP of one position: expand to F (2F for SwiGLU), activate, contract to C. */
    mlp(x, layer) {
      const C = this.C, F = this.F, p = "transformer.h." + layer + ".mlp.";
      const width = this.gated ? 2 * F : F;
      const h = linear(x, this.w[p + "c_fc.weight"], this.w[p + "c_fc.bias"], width, C);
      let a;
      if (this.gated) {  // SwiGLU: [gate | up] -> silu(gate) * up
        a = new Float64Array(F);
        for (let i = 0; i < F; i++) {
          const g = h[i];
          a[i] = (g / (1.0 + Math.exp(-g))) * h[F + i];
        }
      } else {
        const f = ACTIVATIONS[this.config.activation];
        a = h.map(f);
      }
      return linear(a, this.w[p + "c_proj.weight"], this.w[p + "c_proj.bias"], C, F);
    }

    /**
     * Feed the ids, one position after another, through the model, extending `cache` (a new
     * one when null: no past). Returns the logits (V, float64) of the last position, or of every
     * position with options.all; options.attention also returns the attention weights,
     * attention[t][layer][head] = the weights of position t over positions 0 .. t.
     */
    forward(ids, cache, options) {
      options = options || {};
      cache = cache || this.newCache();
      if (ids.length === 0 || cache.length + ids.length > this.Tmax) {
        throw new Error("sequence length must be in [1, " + this.Tmax + "], got " +
                        cache.length + " cached + " + ids.length + " new");
      }
      const C = this.C, cfg = this.config;
      const wte = this.w["transformer.embed.wte.weight"];
      const wpe = this.w["transformer.embed.wpe.weight"];
      const all = [], attention = [];
      for (const id of ids) {
        if (!(Number.isInteger(id) && id >= 0 && id < this.V)) {
          throw new Error("token id " + id + " is outside [0, " + this.V + ")");
        }
        const t = cache.length;
        // embeddings: the token's vector plus its position's (RoPE adds none here)
        let x = new Float64Array(C);
        for (let c = 0; c < C; c++) {
          let pos = 0.0;
          if (cfg.positional === "learned") pos = wpe[t * C + c];
          else if (cfg.positional === "sinusoidal") pos = Math.fround(sinusoid(t, c, C));
          x[c] = wte[id * C + c] + pos;
        }
        const perLayer = [];
        for (let l = 0; l < cfg.n_layer; l++) {
          const p = "transformer.h." + l + ".";
          if (cfg.norm_position === "pre") {  // GPT-2: x + attn(norm(x)), x + mlp(norm(x))
            const a = this.attend(this.norm(x, p + "ln_1"), l, cache, t, options.attention);
            for (let c = 0; c < C; c++) x[c] += a.out[c];
            const m = this.mlp(this.norm(x, p + "ln_2"), l);
            for (let c = 0; c < C; c++) x[c] += m[c];
            perLayer.push(a.weights);
          } else {  // GPT-1: norm(x + attn(x)), norm(x + mlp(x))
            const a = this.attend(x, l, cache, t, options.attention);
            for (let c = 0; c < C; c++) x[c] += a.out[c];
            x = this.norm(x, p + "ln_1");
            const m = this.mlp(x, l);
            for (let c = 0; c < C; c++) x[c] += m[c];
            x = this.norm(x, p + "ln_2");
            perLayer.push(a.weights);
          }
        }
        cache.length += 1;  // every layer has stored this position's key and value
        if (options.attention) attention.push(perLayer);
        const last = ids.length === all.length + 1;
        if (options.all || last) all.push(this.logits(x));
        else all.push(null);
      }
      const logits = options.all ? all : all[all.length - 1];
      return options.attention ? { logits: logits, attention: attention } : logits;
    }

    /** The final norm (pre-norm models only) and the output layer: logits (V). */
    logits(x) {
      const h = this.config.norm_position === "pre" ? this.norm(x, "transformer.ln_f") : x;
      const head = this.config.tie_weights ? this.w["transformer.embed.wte.weight"]
                                           : this.w["lm_head.weight"];
      const out = linear(h, head, null, this.V, this.C);
      const cap = this.config.logit_softcap;  // chapter 12's soft cap: c tanh(logit / c)
      if (cap) for (let i = 0; i < out.length; i++) out[i] = cap * Math.tanh(out[i] / cap);
      return out;
    }
  }

  // --- sampling ----------------------------------------------------------------------------------

  const MASK64 = (1n << 64n) - 1n;
  const PCG_MULT = 6364136223846793005n;

  /**
   * PCG32 (O'Neill's pcg32, XSH RR, 64-bit state): seeded as pcg32_srandom(seed, 54), the
   * generator of tinygpt.sample.PCG32. uniform() is next() / 2^32, in [0, 1).
   */
  class PCG32 {
    constructor(seed, sequence) {
      this.state = 0n;
      this.inc = ((BigInt(sequence === undefined ? 54 : sequence) << 1n) | 1n) & MASK64;
      this.next();
      this.state = (this.state + (BigInt(seed) & MASK64)) & MASK64;
      this.next();
    }

    next() {
      const old = this.state;
      this.state = (old * PCG_MULT + this.inc) & MASK64;
      const xorshifted = Number((((old >> 18n) ^ old) >> 27n) & 0xffffffffn);
      const rot = Number(old >> 59n);
      return ((xorshifted >>> rot) | (xorshifted << ((32 - rot) & 31))) >>> 0;
    }

    uniform() { return this.next() / 4294967296; }
  }

  /**
   * One token id from logits (V numbers): temperature 0 is the argmax (the lowest id on ties);
   * otherwise the logits are divided by the temperature, the top_k largest kept (ties: the lower
   * id first), then the smallest prefix whose probability reaches top_p (a token is kept while
   * the mass before it is below p), and one draw u * total walks the kept tokens from the
   * likeliest. Everything in float64, as tinygpt.sample.choose_token.
   */
  function sampleToken(logits, settings, rng) {
    const V = logits.length;
    const temperature = settings.temperature;
    if (temperature === 0) {
      let best = 0;
      for (let i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
      return best;
    }
    let max = -Infinity;
    for (let i = 0; i < V; i++) if (logits[i] > max) max = logits[i];
    const z = new Float64Array(V);
    for (let i = 0; i < V; i++) z[i] = (logits[i] - max) / temperature;
    const order = Array.from({ length: V }, (_, i) => i);
    order.sort((a, b) => (z[b] - z[a]) || (a - b));  // likeliest first, ties by id
    const k = settings.topK ? Math.min(settings.topK, V) : V;
    let kept = order.slice(0, k);
    const probs = kept.map((i) => Math.exp(z[i]));
    let total = probs.reduce((a, b) => a + b, 0.0);
    if (settings.topP !== null && settings.topP !== undefined) {
      let before = 0.0, n = 0;
      while (n < kept.length && (n === 0 || before / total < settings.topP)) {
        before += probs[n];
        n++;
      }
      kept = kept.slice(0, n);
      probs.length = n;
      total = probs.reduce((a, b) => a + b, 0.0);
    }
    const u = rng.uniform() * total;
    let cum = 0.0;
    for (let j = 0; j < kept.length; j++) {
      cum += probs[j];
      if (u < cum) return kept[j];
    }
    return kept[kept.length - 1];  // u rounded up to the total
  }

  /**
   * Generate up to maxNew tokens after the prompt ids, yielding each as it is chosen: the loop
   * of tinygpt.sample.generate. The context is cropped to its last cropTo (default T_max / 2)
   * tokens once it no longer fits, and the cache then rebuilt from them (positions are
   * absolute). useCache false feeds the whole context every step: same tokens, slower.
   */
  function* generateTokens(model, promptIds, maxNew, settings) {
    const Tmax = model.Tmax;
    const cropTo = settings.cropTo || Math.max(Math.floor(Tmax / 2), 1);
    const useCache = settings.useCache !== false;
    const rng = settings.temperature === 0 ? null : new PCG32(settings.seed || 0);
    const out = promptIds.slice();
    let start = Math.max(0, out.length - Tmax);
    let cache = model.newCache(), fed = 0;
    for (let step = 0; step < maxNew; step++) {
      const n = out.length;
      if (n - start > Tmax) {  // the context is full: keep its last cropTo tokens
        start = n - cropTo;
        cache = model.newCache();
        fed = 0;
      }
      let logits;
      if (useCache) {
        logits = model.forward(out.slice(start + fed, n), cache);
        fed = n - start;
      } else {
        logits = model.forward(out.slice(start, n), null);
      }
      const token = sampleToken(logits, settings, rng);
      out.push(token);
      yield token;
    }
  }

  const engine = {
    base64ToBuffer, unpackWeights, loadModel, Model, PCG32, sampleToken, generateTokens, erf,
  };
  root.tinygptEngine = engine;
  if (typeof module !== "undefined" && module.exports) module.exports = engine;
})(typeof globalThis !== "undefined" ? globalThis : this);
