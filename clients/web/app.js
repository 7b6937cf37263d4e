// simulserve live captions: German in, English captions out, word by word, over /v1/stream.
// Plain browser JavaScript, no build step. One websocket per pane (policy); every pane gets
// the same source words at the same moment, so two policies can be compared side by side.
"use strict";
(() => {
  // The server's automatic segmentation (models/sentence_boundary.py `ends_sentence`), mirrored so the
  // page knows where each sentence ends without waiting for the server.
  const SENTENCE_END = /[.!?…。！？]["'»«”’)\]]*$/;
  const endsSentence = (w) => SENTENCE_END.test(w);

  const params = new URLSearchParams(location.search);
  const SERVER = (params.get("server") || location.origin).replace(/\/+$/, "");
  const WS_URL = SERVER.replace(/^http/, "ws") + "/v1/stream";
  const POLICY = { gma: "GMA", waitk: "wait-k", offline: "offline" };
  const KNOB = { gma: ["delta", "δ"], waitk: ["k", "k"] };

  // error code (server/protocol.py ERRORS) -> what the user should know
  const ERROR_TEXT = {
    server_full: "The server is full: all its streams are in use.",
    server_busy: "The server is at its real-time capacity: it keeps the streams it has in real time and takes new ones as others end.",
    not_ready: "The server is still loading its models.",
    unauthorized: "The server needs an API key, or this key is wrong. Enter the key above, then press Reconnect.",
    too_many_auth_failures: "Too many wrong API keys from this address: wait a minute, then press Reconnect.",
    too_many_connections: "This address has too many streams open on the server; close some, then Reconnect.",
    origin_not_allowed: "The server does not accept connections from this page's address (allowed_origins).",
    idle_timeout: "Closed after a long pause without input. Typing (or Reconnect) opens a new stream.",
    rate_limited: "Too many messages per second: the server closed the stream.",
    slow_consumer: "This page did not keep up with the server's messages: the server closed the stream.",
    internal_error: "The server hit an internal error on this stream.",
  };
  const CLOSE_TEXT = { 1000: "closed", 1001: "going away", 1006: "connection lost", 1011: "server error",
    1012: "server restarting", 1013: "try again later" };
  const PLAIN = new Set(["server_full", "server_busy", "not_ready", "unauthorized", "origin_not_allowed", "too_many_auth_failures",
    "too_many_connections"]);   // no detail needed
  const AUTO_RETRY = new Set(["server_full", "server_busy", "not_ready", "internal_error", "disconnect"]);
  const NEEDS_USER = new Set(["unauthorized", "origin_not_allowed", "bad_setting", "unknown_model",
    "too_many_auth_failures", "too_many_connections"]);
  const HOLD_WORDS = 500;   // words typed while a lost connection comes back: held and sent then (more: not sent)

  function keyProtocol(key) {   // "simulserve.key." + base64url(UTF-8 key), no padding
    const bytes = new TextEncoder().encode(key);
    let bin = "";
    for (const b of bytes) bin += String.fromCharCode(b);
    return "simulserve.key." + btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  const $ = (sel, root = document) => root.querySelector(sel);
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const fmt = (x) => (x === null || x === undefined || Number.isNaN(x) ? "—" : Number(x).toFixed(2));

  const state = { models: [], byName: {}, key: sessionStorage.getItem("simulserve.key") || "", panes: [] };

  // ------------------------------------------------------------------ banner (page-wide)
  const banner = $("#banner");
  function showBanner(text, kind = "error") {
    banner.textContent = text;
    banner.className = `banner ${kind}`;
  }
  const hideBanner = () => { banner.className = "banner hidden"; };

  // ------------------------------------------------------------------ saving: the transcript and subtitles
  // WebVTT roll-up cues as clients/subtitles.py writes them for `simulserve stream --vtt` (tests/test_browser.py
  // holds the two to the same file): every arriving word starts a cue showing the last two lines until the next
  // word (at most HOLD_MS); a sentence starts a line; a line holds at most LINE_CHARS characters.
  const LINE_CHARS = 42;
  const HOLD_MS = 5000;
  const chars = (text) => [...text].length;   // code points, as Python counts them
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  const vttTime = (ms) => `${pad(Math.floor(ms / 3600000))}:${pad(Math.floor(ms / 60000) % 60)}:` +
    `${pad(Math.floor(ms / 1000) % 60)}.${pad(ms % 1000, 3)}`;
  const vttEscape = (text) => text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

  function webvtt(entries) {
    // entries in arrival order: a word {sentence, text, ms} (ms an integer), or {restart: sentence} where a lost
    // connection sent that sentence and the later ones again (their words leave the lines; cues shown stay)
    const blocks = ["WEBVTT\n"];
    let lines = [];          // [sentence, [word texts]]
    let open = null;         // the last word's cue, its end not known yet: [start ms, text]
    const close = (next) => {
      if (!open) return;
      const [start, text] = open;
      const end = next === null ? start + HOLD_MS : Math.min(next, start + HOLD_MS);
      if (end > start) blocks.push(`${vttTime(start)} --> ${vttTime(end)}\n${vttEscape(text)}\n`);
      open = null;
    };
    for (const w of entries) {
      if (w.restart !== undefined) { lines = lines.filter((l) => l[0] < w.restart); continue; }
      const last = lines[lines.length - 1];
      if (!last || last[0] !== w.sentence || chars([...last[1], w.text].join(" ")) > LINE_CHARS) {
        lines.push([w.sentence, [w.text]]);
      } else {
        last[1].push(w.text);
      }
      close(w.ms);
      open = [w.ms, lines.slice(-2).map((l) => l[1].join(" ")).join("\n")];
    }
    close(null);
    return blocks.join("\n");
  }

  function download(name, text, type) {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([text], { type: `${type};charset=utf-8` }));
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }

  // ------------------------------------------------------------------ one policy = one pane
  class Pane {
    constructor(id) {
      this.id = id;
      this.root = $("#pane-template").content.firstElementChild.cloneNode(true);
      this.root.id = `pane-${id}`;
      this.root.dataset.pane = id;
      $(".pane-tag", this.root).textContent = id.toUpperCase();
      for (const [name, sel] of Object.entries({
        select: ".model", knobBox: ".knob", knobName: ".knob-name", knob: ".knob-value", status: ".status",
        reconnectBtn: ".reconnect", alert: ".alert", liveSrc: ".live-src", caption: ".caption",
        summary: ".summary", list: ".sentences", saveTxt: ".save-txt", saveVtt: ".save-vtt", shareBox: ".share",
        shareLink: ".share-link",
      })) this[name] = $(sel, this.root);
      this.shareKey = null;     // the shared feed's key: a new stream of this pane carries the feed on
      this.enabled = true;
      this.ws = null;
      this.ready = false;
      this.queue = [];          // {words, end} sent once the stream is ready (held while a lost connection comes back)
      this.resend = null;       // index in `sentences` of the first unfinished sentence a lost connection left
      this.sentences = [];      // every sentence this pane has seen, over all its connections
      this.open = null;         // the local sentence that is still receiving source words
      this.base = 0;            // index in `sentences` of the current stream's sentence 0
      this.msgId = 0;
      this.lastError = null;
      this.retryDelay = 1000;
      this.retryTimer = null;
      this.retryLeft = 0;
      this.failText = null;
      this.unsent = 0;
      this.streamLabel = null;
      this.arrivals = [];       // every target word shown: {sentence, text, ms since clock0}, for the subtitles
      this.clock0 = null;       // performance.now() when this pane sent its first source word
      this.keys = 0;            // sentences made so far (each one's key)
      this.saveTxt.addEventListener("click", () => download(`captions-${id}.txt`, this.transcript(), "text/plain"));
      this.saveVtt.addEventListener("click", () => download(`captions-${id}.vtt`, webvtt(this.arrivals), "text/vtt"));
      this.select.addEventListener("change", () => { this.configureKnob(); this.reconnect(); });
      this.knob.addEventListener("change", () => { this.clampKnob(); this.reconnect(); });
      this.reconnectBtn.addEventListener("click", () => this.reconnect());
      this.shareBox.addEventListener("change", () => {
        if (!this.shareBox.checked) { this.shareKey = null; this.shareLink.classList.add("hidden"); }
        // the stream goes on: the server starts or ends its feed (the next stream's `start` asks for it anyway)
        if (this.ready) this.ws.send(JSON.stringify({ type: "share", on: this.shareBox.checked }));
      });
    }

    get model() { return state.byName[this.select.value]; }

    setModels(models, preferred) {
      const current = this.select.value;
      this.select.replaceChildren(...models.map((m) => {
        const o = el("option", "", `${m.name} (${POLICY[m.policy] || m.policy})`);
        o.value = m.name;
        return o;
      }));
      const pick = [current, preferred].find((n) => n && state.byName[n]) || models[0]?.name;
      if (pick) this.select.value = pick;
      this.configureKnob();
    }

    configureKnob() {
      const m = this.model;
      const knob = m && KNOB[m.policy];
      this.knobBox.hidden = !knob;
      if (!knob) return;
      const spec = (m.settings || {})[knob[0]] || {};
      this.knobName.textContent = knob[1];
      this.knob.step = m.policy === "waitk" ? "1" : "0.5";
      this.knob.min = spec.min ?? 0;
      if (spec.max !== undefined) this.knob.max = spec.max; else this.knob.removeAttribute("max");
      this.knob.value = spec.default ?? (m.policy === "waitk" ? 3 : 1);
    }

    clampKnob() {
      const m = this.model;
      if (!m || !KNOB[m.policy]) return;
      let v = Number(this.knob.value);
      if (!Number.isFinite(v)) v = Number(this.knob.min) || 0;
      if (m.policy === "waitk") v = Math.round(v);
      if (this.knob.min !== "") v = Math.max(v, Number(this.knob.min));
      if (this.knob.max !== "") v = Math.min(v, Number(this.knob.max));
      this.knob.value = v;
    }

    label() {
      const m = this.model;
      if (!m) return "";
      const knob = KNOB[m.policy];
      const name = POLICY[m.policy] || m.policy;
      return knob ? `${name} ${knob[1]}=${this.knob.value}` : `${name} (whole sentence)`;
    }

    setStatus(st, text) {
      this.status.dataset.state = st;
      this.status.textContent = text;
      this.root.dataset.state = st;
    }

    showAlert(text, kind = "error", hideAfterMs = 0) {
      clearTimeout(this.alertTimer);
      this.alert.textContent = text;
      this.alert.className = `alert ${kind}`;
      this.alert.dataset.kind = kind;
      if (hideAfterMs) this.alertTimer = setTimeout(() => this.hideAlert(), hideAfterMs);
    }

    hideAlert() { this.alert.className = "alert hidden"; this.alert.textContent = ""; }

    // ---------------------------------------------------------------- connection
    connect() {
      clearInterval(this.retryTimer);
      this.retryTimer = null;
      this.drop();
      const m = this.model;
      if (!this.enabled || !m) return;
      const url = new URL(WS_URL);
      // a browser cannot set headers on a websocket: the key travels as a subprotocol (not in the URL,
      // so not in any log); the server answers with "simulserve.v1", never with the key
      const protocols = state.key ? ["simulserve.v1", keyProtocol(state.key)] : [];
      const start = { type: "start", model: m.name, auto_segment: true };
      if (m.policy === "waitk") start.k = Math.round(Number(this.knob.value));
      if (m.policy === "gma") start.delta = Number(this.knob.value);
      if (this.shareBox.checked) start.share = this.shareKey || true;
      if (state.pause > 0) start.end_after_pause_s = state.pause;
      this.start = start;
      const label = this.label();
      this.setStatus("connecting", "connecting…");
      this.retryLeft = 0;
      let ws;
      try {
        ws = new WebSocket(url, protocols);
      } catch (e) {
        this.failed("disconnect", `Cannot open a websocket to ${WS_URL}: ${e.message}`);
        return;
      }
      this.ws = ws;
      this.ready = false;
      this.fatal = null;
      if (this.failText) this.renderFailure();
      ws.onopen = () => ws.send(JSON.stringify(start));
      ws.onmessage = (ev) => { if (ws === this.ws) this.onMessage(JSON.parse(ev.data), label); };
      ws.onclose = (ev) => { if (ws === this.ws) this.onClose(ev); };
    }

    drop() {   // forget the current socket without treating its closing as an error
      if (!this.ws) return;
      const ws = this.ws;
      this.ws = null;
      this.ready = false;
      ws.onmessage = ws.onclose = ws.onopen = null;
      try { ws.close(1000); } catch (e) { /* already closed */ }
      this.interrupt();
    }

    reconnect() {      // the user asked for it: start over at once
      this.retryDelay = 1000;
      this.lastError = null;
      this.failText = null;
      this.unsent = 0;
      this.hideAlert();
      if (!state.models.length) { loadModels(); return; }
      this.connect();
    }

    disable() {
      this.enabled = false;
      clearInterval(this.retryTimer);
      this.retryTimer = null;
      this.drop();
      this.setStatus("idle", "off");
    }

    enable() { this.enabled = true; this.reconnect(); }

    onMessage(msg, label) {
      switch (msg.type) {
        case "ready":
          this.ready = true;
          this.retryDelay = 1000;
          this.lastError = null;
          this.failText = null;
          this.unsent = 0;
          delete this.root.dataset.error;
          this.base = this.resend ?? this.sentences.length;
          if (this.streamLabel !== null && this.streamLabel !== label && this.sentences.length) {
            this.list.prepend(el("li", "divider", `now: ${msg.model} · ${label}`));
          }
          this.streamLabel = label;
          this.shareTries = 0;
          this.showShare(msg.share);
          if (!!msg.share !== this.shareBox.checked) {   // the box changed while the stream was starting
            this.ws.send(JSON.stringify({ type: "share", on: this.shareBox.checked }));
          }
          this.setStatus("ready", `live · ${label}`);
          if (this.alert.dataset.kind === "error") this.hideAlert();
          this.sendAgain();
          for (const item of this.queue.splice(0)) this.transmit(item);
          break;
        case "word": this.onWord(msg); break;
        case "sentence": this.onSentence(msg); break;
        case "shared": if (this.shareBox.checked === !!msg.share) this.showShare(msg.share); break;
        case "warning": this.showAlert(msg.message, "warn", 5000); break;
        case "error": this.onError(msg); break;
        default: break;   // "end": the server closes the socket next
      }
    }

    showShare(share) {   // the feed viewers watch (`ready`, `shared`), or none
      if (!share) {
        this.shareKey = null;
        this.shareLink.classList.add("hidden");
        return;
      }
      this.shareKey = share.key;
      const a = $("a", this.shareLink);
      a.href = a.textContent = new URL(share.url, SERVER + "/").href;
      this.shareLink.classList.remove("hidden");
    }

    onError(msg) {
      if (msg.fatal) {          // the server closes the socket next; onClose shows it
        this.fatal = msg;
        return;
      }
      if (msg.rejected_words) this.unsend(msg.id);
      if (!this.ready && this.shareKey && /share key/.test(msg.message)) {
        const ws = this.ws;
        if (/still open/.test(msg.message) && (this.shareTries = (this.shareTries || 0) + 1) <= 10) {
          // this pane's previous stream is still closing on the server: carry its feed on a moment later
          setTimeout(() => { if (ws === this.ws) ws.send(JSON.stringify(this.start)); }, 300);
        } else {   // the server lost the feed (it restarted, or the grace time passed): a new one, a new link
          this.shareKey = null;
          ws.send(JSON.stringify({ ...this.start, share: true }));
        }
        return;
      }
      if (!this.ready) {        // `start` was refused (bad_setting, unknown_model): fix it, then reconnect
        const ws = this.ws;
        this.ws = null;
        ws.onmessage = ws.onclose = null;
        try { ws.close(1000); } catch (e) { /* gone */ }
        this.unsent += this.queue.splice(0).reduce((n, it) => n + it.words.length, 0);
        this.failed(msg.code, msg.message);
        return;
      }
      if (msg.code === "bad_setting" && /share/.test(msg.message)) this.shareBox.checked = false;   // (refused)
      this.showAlert(`${msg.message} [${msg.code}]`, "warn", 8000);
    }

    onClose(ev) {
      this.ws = null;
      this.ready = false;
      if (this.fatal && !AUTO_RETRY.has(this.fatal.code)) {   // no new stream comes by itself
        this.interrupt();
        this.unsent += this.queue.splice(0).reduce((n, it) => n + it.words.length, 0);
      } else {
        this.holdForResend();
      }
      if (this.fatal) {
        const { code, message, retry_after: retryAfter } = this.fatal;
        this.failed(code, ERROR_TEXT[code] || message, PLAIN.has(code) ? null : message, retryAfter);
      } else {
        const why = [CLOSE_TEXT[ev.code], ev.reason].filter(Boolean).join(": ");
        this.failed("disconnect", `Disconnected from the server (close code ${ev.code}${why ? `, ${why}` : ""}).`);
      }
    }

    failed(code, text, detail, retryAfter) {   // retryAfter: seconds, when the server says when (server_busy)
      this.lastError = code;
      this.setStatus(code === "disconnect" ? "disconnected" : "error",
        code === "disconnect" ? "disconnected" : code.replace(/_/g, " "));
      this.root.dataset.error = code;
      this.failText = detail && detail !== text ? `${text} (${detail})` : text;
      this.retryLeft = 0;
      if (AUTO_RETRY.has(code)) {
        if (retryAfter > 0) {
          this.retryLeft = Math.max(1, Math.ceil(retryAfter));
        } else {
          this.retryLeft = Math.round(this.retryDelay / 1000);
          this.retryDelay = Math.min(this.retryDelay * 2, 16000);
        }
        this.retryTimer = setInterval(() => {
          this.retryLeft -= 1;
          if (this.retryLeft > 0) this.renderFailure(); else this.connect();
        }, 1000);
      }
      this.renderFailure();
    }

    renderFailure() {   // the failure, the retry countdown, and what could not be sent meanwhile
      let text = this.failText;
      if (this.retryLeft > 0) text += ` Reconnecting in ${this.retryLeft} s…`;
      else if (this.ws && AUTO_RETRY.has(this.lastError)) text += " Reconnecting…";
      const held = this.heldWords();
      if (held) text += ` ${held} word(s) held: sent when the connection is back.`;
      if (this.unsent) text += ` Not sent: ${this.unsent} word(s).`;
      this.showAlert(text, "error");
    }

    // ---------------------------------------------------------------- sending
    send(words, end) {
      if (!this.enabled || (!words.length && !end)) return;
      if (this.ready) { this.transmit({ words, end }); return; }
      if (!this.ws && !this.retryTimer && !NEEDS_USER.has(this.lastError)) this.connect();
      // connecting, or a lost connection coming back by itself: hold the words, they go out with it
      const comingBack = this.retryTimer && AUTO_RETRY.has(this.lastError);
      if (this.ws || (comingBack && this.heldWords() + words.length <= HOLD_WORDS)) {
        this.queue.push({ words, end });
        if (!this.ws) this.renderFailure();
        return;
      }
      if (words.length) {   // no stream: say so rather than lose the words silently
        this.unsent += words.length;
        if (this.failText) this.renderFailure(); else this.showAlert(`Not connected. Not sent: ${this.unsent} word(s).`);
      }
    }

    transmit({ words, end }) {
      const ws = this.ws;
      if (words.length) {
        const id = ++this.msgId;
        ws.send(JSON.stringify({ type: "words", words, id }));
        for (const w of words) this.addSource(w, id);
      }
      if (end && this.open && this.open.source.length) {
        ws.send(JSON.stringify({ type: "end_sentence" }));
        this.closeOpen();
      }
    }

    addSource(text, id) {
      if (this.clock0 === null) this.clock0 = performance.now();
      if (!this.open) this.open = this.newSentence();
      this.open.source.push({ text, id });
      const s = this.open;
      if (endsSentence(text)) this.closeOpen();
      this.render(s);
    }

    closeOpen() {
      const s = this.open;
      this.open = null;
      if (s) { s.ended = true; this.render(s); }
    }

    unsend(id) {   // a message was rejected whole: its words never reached the model
      for (let i = this.sentences.length - 1; i >= this.base; i--) {
        const s = this.sentences[i];
        const before = s.source.length;
        s.source = s.source.filter((w) => w.id !== id);
        if (s.source.length === before || s.done) continue;
        if (!s.source.length) {
          s.li.remove();
          this.sentences.splice(i, 1);
          if (this.open === s) this.open = null;
          continue;
        }
        if (i === this.sentences.length - 1 && s.ended && !endsSentence(s.source[s.source.length - 1].text)) {
          s.ended = false;   // the server still holds this sentence open
          this.open = s;
        }
        this.render(s);
      }
      this.sentences.forEach((s, i) => { s.idx = i; s.li.dataset.sentence = i; });
      this.updateLive();
    }

    heldWords() {   // source words waiting for a connection: unfinished sentences to send again, and new input
      const again = this.resend === null ? 0
        : this.sentences.slice(this.resend).reduce((n, s) => n + s.source.length, 0);
      return again + this.queue.reduce((n, it) => n + it.words.length, 0);
    }

    holdForResend() {   // a lost connection: its unfinished sentences start again, from their first word, when it is back
      let i = this.base;
      while (i < this.sentences.length && this.sentences[i].done) i++;
      if (this.resend === null) this.resend = i < this.sentences.length ? i : null;
      this.open = null;
      this.base = this.sentences.length;
      if (this.resend === null) return;
      this.arrivals.push({ restart: this.sentences[this.resend].key });   // (the subtitles start them on a new line)
      for (const s of this.sentences.slice(this.resend)) {
        s.words = [];       // their translation starts again too (the words shown so far are void)
        s.waiting = true;
        this.render(s);
      }
    }

    sendAgain() {   // on `ready`: the held unfinished sentences first, each as it was sent before
      if (this.resend === null) return;
      const again = this.sentences.slice(this.resend);
      this.resend = null;
      for (const s of again) {
        s.waiting = false;
        const id = ++this.msgId;
        this.ws.send(JSON.stringify({ type: "words", words: s.source.map((w) => w.text), id }));
        for (const w of s.source) w.id = id;
        if (s.ended && !endsSentence(s.source[s.source.length - 1].text)) {
          this.ws.send(JSON.stringify({ type: "end_sentence" }));
        }
        if (!s.ended) this.open = s;
        this.render(s);
      }
    }

    interrupt() {   // the stream is gone: its unfinished sentences (held ones too) will never finish
      const from = this.resend ?? this.base;
      this.resend = null;
      for (let i = from; i < this.sentences.length; i++) {
        const s = this.sentences[i];
        if (!s.done && !s.interrupted) { s.interrupted = true; s.waiting = false; s.ended = true; this.render(s); }
      }
      this.open = null;
      this.base = this.sentences.length;
    }

    // ---------------------------------------------------------------- receiving
    newSentence() {
      // key: the sentence's number for good (idx moves where unsend drops a sentence)
      const s = { idx: this.sentences.length, key: ++this.keys, source: [], words: [], ended: false, done: false,
        li: el("li", "sentence") };
      s.li.dataset.sentence = s.idx;
      this.sentences.push(s);
      this.list.prepend(s.li);
      return s;
    }

    insertAfter(s) {   // a new sentence right after `s` (the ones after it move one place on)
      const n = { idx: s.idx + 1, key: ++this.keys, source: [], words: [], ended: false, done: false,
        li: el("li", "sentence") };
      this.sentences.splice(s.idx + 1, 0, n);
      s.li.before(n.li);   // (the list shows the newest first)
      this.sentences.forEach((x, i) => { x.idx = i; x.li.dataset.sentence = i; });
      return n;
    }

    sentenceAt(i) {
      while (this.sentences.length <= this.base + i) this.newSentence();   // only if the mirror slipped
      return this.sentences[this.base + i];
    }

    onWord(msg) {
      const s = this.sentenceAt(msg.sentence);
      s.words[msg.index] = { text: msg.text, delay: msg.delay, complete: msg.source_complete, lag: msg.lag_ms };
      const now = performance.now();
      this.arrivals.push({ sentence: s.key, text: msg.text, ms: Math.round(now - (this.clock0 ?? now)) });
      this.saveTxt.disabled = this.saveVtt.disabled = false;
      this.render(s);
    }

    onSentence(msg) {
      const s = this.sentenceAt(msg.sentence);
      const src = msg.source.split(/\s+/).filter(Boolean);
      const mine = s.source.map((w) => w.text);
      // the server may end a sentence by itself: at a pause (end_after_pause_s) or at its word limit
      // (sentence_cut); the words sent after that end are its next sentence's, and move there (`source` is
      // the words read: those sent after the model had ended the sentence, `unread_words`, were still its own)
      const own = src.length + (msg.unread_words || 0);
      const rest = s.source.slice(own);
      if (!s.done && rest.length && src.every((w, i) => w === mine[i])) {
        s.source = s.source.slice(0, own);
        const next = this.insertAfter(s);
        next.source = rest;
        next.ended = s.ended;   // (an end sent after them was theirs)
        if (this.open === s) this.open = next;
        this.render(next);
      }
      if (this.open === s) { this.open = null; serverEnded(); }
      if (src.join(" ") !== s.source.map((w) => w.text).join(" ")) s.source = src.map((text) => ({ text }));
      s.done = true;
      s.ended = true;
      Object.assign(s, { translation: msg.translation, latency: msg.latency, compute: msg.compute_ms,
        elapsed: msg.elapsed_ms });
      this.render(s);
      this.updateSummary();
    }

    transcript() {   // the English of every sentence with words, one a line (an unfinished one: its words so far)
      return this.sentences.map((s) => (s.done ? s.translation : s.words.filter(Boolean).map((w) => w.text).join(" ")))
        .filter(Boolean).map((t) => t + "\n").join("");
    }

    // ---------------------------------------------------------------- drawing
    render(s) {
      const li = s.li;
      li.dataset.done = s.done;
      li.classList.toggle("done", s.done);
      li.classList.toggle("interrupted", !!s.interrupted);
      const words = s.words.map((w, index) => w && { ...w, index }).filter(Boolean);
      // READ/WRITE alignment: one column per source word, the target words written right after it below
      const grid = el("div", "grid");
      const cols = s.source.map((w, i) => {
        const col = el("div", "col");
        col.dataset.col = i;
        col.append(el("span", "src", w.text));
        grid.append(col);
        return col;
      });
      let endCol = null;
      if (s.ended || words.some((w) => w.complete)) {
        endCol = el("div", "col end");
        endCol.dataset.col = "end";
        const mark = el("span", "src endmark", "⏎");
        mark.title = "end of sentence";
        endCol.append(mark);
        grid.append(endCol);
      }
      for (const w of words) {
        const chip = el("span", "tgt", w.text);
        Object.assign(chip.dataset, { index: w.index, delay: w.delay, complete: w.complete });
        chip.title = w.complete ? "written after the sentence ended"
          : `written after reading ${w.delay} source word(s)` + (w.lag !== undefined ? `, ${Math.round(w.lag)} ms lag` : "");
        const target = w.complete ? endCol : cols[Math.min(Math.max(w.delay, 1), cols.length) - 1];
        (target || endCol || grid).append(chip);
      }
      // the same rhythm as a tape of READs and WRITEs
      const tape = el("div", "tape");
      const put = (ch, n = 1) => { for (let i = 0; i < n; i++) tape.append(el("span", ch === "W" ? "w" : ch === "R" ? "r" : "e", ch)); };
      put("W", words.filter((w) => !w.complete && w.delay <= 0).length);
      s.source.forEach((_, i) => { put("R"); put("W", words.filter((w) => !w.complete && w.delay === i + 1).length); });
      if (endCol) { put("⏎"); put("W", words.filter((w) => w.complete).length); }
      const trans = el("div", "translation", s.done ? s.translation : words.map((w) => w.text).join(" "));
      let stats;
      if (s.done) {
        const lat = s.latency;
        stats = el("div", "stats");
        stats.append(
          lat ? metric("AL", lat.AL) : el("span", "", "nothing written"),
          lat ? metric("CW", lat.CW) : "",
          lat && lat.LAAL !== undefined ? metric("LAAL", lat.LAAL) : "",
          el("span", "ms", `${Math.round(s.compute)} ms compute`));
      } else {
        stats = el("div", "stats pending", s.interrupted ? "interrupted: the stream closed"
          : s.waiting ? "connection lost: sent again when it is back" : "translating…");
      }
      li.replaceChildren(grid, tape, trans, stats);
      this.updateLive();
    }

    updateLive() {
      const last = this.sentences[this.sentences.length - 1];
      const prev = this.sentences[this.sentences.length - 2];
      this.liveSrc.textContent = last ? last.source.map((w) => w.text).join(" ") : "";
      const line = (s, cls) => {
        const text = s.done ? s.translation : s.words.filter(Boolean).map((w) => w.text).join(" ");
        return el("div", cls, text || (s.done ? "" : "…"));
      };
      const lines = [];
      if (prev && last && !last.done && prev.done) lines.push(line(prev, "line prev"));
      if (last) lines.push(line(last, last.done ? "line" : "line current"));
      this.caption.replaceChildren(...lines);
    }

    updateSummary() {
      const done = this.sentences.filter((s) => s.done && s.latency);
      const mean = (k) => done.reduce((a, s) => a + (s.latency[k] ?? 0), 0) / done.length;
      this.summary.replaceChildren();
      if (!done.length) return;
      this.summary.append(el("span", "", `${done.length} sentence${done.length > 1 ? "s" : ""}`),
        metric("mean AL", mean("AL")), metric("mean CW", mean("CW")));
    }
  }

  function metric(name, value) {
    const m = el("span", "metric");
    m.dataset.metric = name;
    m.append(el("b", "", name), ` ${fmt(value)}`);
    return m;
  }

  // ------------------------------------------------------------------ models
  let modelsTimer = null;
  async function loadModels() {
    clearTimeout(modelsTimer);
    let res;
    try {
      res = await fetch(SERVER + "/v1/models", { cache: "no-store" });
    } catch (e) {
      showBanner(`Cannot reach the server at ${SERVER}. Retrying…`);
      modelsTimer = setTimeout(loadModels, 3000);
      return;
    }
    if (res.status === 503) {
      showBanner("The server is loading its models…", "info");
      modelsTimer = setTimeout(loadModels, 1000);
      return;
    }
    if (!res.ok) {
      showBanner(`GET /v1/models failed: HTTP ${res.status}. Retrying…`);
      modelsTimer = setTimeout(loadModels, 3000);
      return;
    }
    const data = await res.json();
    hideBanner();
    state.models = data.models;
    state.byName = Object.fromEntries(data.models.map((m) => [m.name, m]));
    const first = (policy) => data.models.find((m) => m.policy === policy)?.name;
    const a = params.get("a") || first("gma") || data.default;
    const b = params.get("b") || first("waitk") || data.models.find((m) => m.name !== a)?.name || a;
    const [pa, pb] = state.panes;
    pa.setModels(data.models, a);
    pb.setModels(data.models, b);
    for (const p of state.panes) if (p.enabled) p.reconnect();
  }

  // ------------------------------------------------------------------ input: every enabled pane gets the same words
  const feed = (words, end) => state.panes.forEach((p) => p.send(words, end));

  const live = $("#live-input");
  const liveHint = $("#live-hint");
  let sentWords = [];   // words of the current line already sent

  function hint(text) {
    liveHint.textContent = text;
    clearTimeout(hint.timer);
    hint.timer = setTimeout(() => { liveHint.textContent = ""; }, 4000);
  }

  // Send the complete words of `text` not sent yet; `complete`: the last word is complete too.
  function sendLine(text, complete) {
    const words = text.split(/\s+/).filter(Boolean);
    const done = complete || /\s$/.test(text) ? words : words.slice(0, -1);
    if (sentWords.some((w, i) => done[i] !== undefined && done[i] !== w)) hint("Words already sent cannot be changed.");
    const fresh = done.slice(sentWords.length);
    if (fresh.length) {
      // a sentence end inside the new words splits the message, as the server does
      let cur = [];
      for (const w of fresh) {
        cur.push(w);
        if (endsSentence(w) || cur.length >= 50) { feed(cur, false); cur = []; }
      }
      if (cur.length) feed(cur, false);
      sentWords = sentWords.concat(fresh);
    }
  }

  function onLiveInput() {
    const lines = live.value.split(/\r?\n/);
    let rest = lines.pop();
    for (const line of lines) {   // pasted line breaks end sentences, like Enter
      sendLine(line, true);
      feed([], true);
      sentWords = [];
    }
    sendLine(rest, false);
    // words up to the last sentence end leave the box: the box holds the open sentence only
    const lastEnd = sentWords.map(endsSentence).lastIndexOf(true);
    if (lastEnd >= 0) {
      const re = new RegExp(`^\\s*(?:\\S+\\s+){${lastEnd}}\\S+\\s*`);
      rest = rest.replace(re, "");
      sentWords = sentWords.slice(lastEnd + 1);
    }
    if (lines.length || lastEnd >= 0) live.value = rest;
  }

  // A pane's server ended the open sentence by itself (a pause): the words sent leave the box, as at a full stop
  function serverEnded() {
    if (!sentWords.length) return;
    live.value = live.value.replace(new RegExp(`^\\s*(?:\\S+\\s+){${sentWords.length}}`), "");
    sentWords = [];
  }

  function finishLine() {
    sendLine(live.value.replace(/\r?\n/g, " "), true);
    feed([], true);
    sentWords = [];
    live.value = "";
  }

  live.addEventListener("input", onLiveInput);
  live.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); finishLine(); }
  });

  // ------------------------------------------------------------------ transcript player
  const script = $("#script");
  const playBtn = $("#play");
  const stopBtn = $("#stop");
  const wpm = $("#wpm");
  const wpmOut = $("#wpm-value");
  const progress = $("#play-progress");
  let player = null;

  async function loadDemo() {
    try {
      const res = await fetch("demo_de.txt", { cache: "no-store" });
      if (res.ok) script.value = (await res.text()).trim();
    } catch (e) { /* the page works without it */ }
  }

  function tick() {
    if (!player || player.paused) return;
    const item = player.items[player.i++];
    feed([item.word], item.end);
    progress.textContent = `word ${player.i} of ${player.items.length}`;
    if (player.i >= player.items.length) { stopPlaying(false); progress.textContent = "done"; return; }
    player.timer = setTimeout(tick, 60000 / Number(wpm.value));
  }

  function startPlaying() {
    if (player) {   // pause / resume
      player.paused = !player.paused;
      playBtn.textContent = player.paused ? "▶ Resume" : "❚❚ Pause";
      if (!player.paused) tick(); else clearTimeout(player.timer);
      return;
    }
    const items = [];
    for (const line of script.value.split(/\r?\n/)) {
      const words = line.split(/\s+/).filter(Boolean);
      words.forEach((word, i) => items.push({ word, end: i === words.length - 1 }));
    }
    if (!items.length) { progress.textContent = "nothing to play"; return; }
    player = { items, i: 0, paused: false, timer: null };
    playBtn.textContent = "❚❚ Pause";
    stopBtn.disabled = false;
    tick();
  }

  function stopPlaying(endSentence = true) {
    if (!player) return;
    clearTimeout(player.timer);
    if (endSentence && player.i > 0 && !player.items[player.i - 1].end) feed([], true);
    player = null;
    playBtn.textContent = "▶ Play";
    stopBtn.disabled = true;
  }

  playBtn.addEventListener("click", startPlaying);
  stopBtn.addEventListener("click", () => { stopPlaying(); progress.textContent = "stopped"; });
  wpm.addEventListener("input", () => { wpmOut.textContent = wpm.value; });
  $("#reset-script").addEventListener("click", loadDemo);

  // ------------------------------------------------------------------ page set-up
  const keyInput = $("#api-key");
  keyInput.value = state.key;
  $("#key-form").addEventListener("submit", (e) => { e.preventDefault(); keyInput.dispatchEvent(new Event("change")); });
  keyInput.addEventListener("change", () => {
    const key = keyInput.value.trim();
    if (key === state.key && state.panes.every((p) => !p.enabled || p.ready || p.ws)) return;   // nothing new
    state.key = key;
    sessionStorage.setItem("simulserve.key", state.key);
    state.panes.forEach((p) => p.enabled && p.reconnect());
  });

  const panesBox = $("#panes");
  state.panes = ["a", "b"].map((id) => new Pane(id));
  state.panes.forEach((p) => panesBox.append(p.root));
  const compare = $("#compare");
  const applyCompare = () => {
    const b = state.panes[1];
    panesBox.classList.toggle("single", !compare.checked);
    b.root.hidden = !compare.checked;
    if (compare.checked && !b.enabled) b.enable();
    if (!compare.checked) b.disable();
  };
  if (params.get("compare") === "0") compare.checked = false;
  const pause = $("#pause");
  if ([...pause.options].some((o) => o.value === params.get("pause"))) pause.value = params.get("pause");
  state.pause = Number(pause.value);
  pause.addEventListener("change", () => {   // a stream's setting: new streams
    state.pause = Number(pause.value);
    state.panes.forEach((p) => p.enabled && p.reconnect());
  });
  compare.addEventListener("change", applyCompare);
  if (!compare.checked) applyCompare();

  window.simulserve = { state, feed, webvtt };   // for the console (and the tests)
  loadDemo();
  loadModels();
})();
