/*
 * converger demo page: one conversation over one WebSocket (docs/protocol.md).
 *
 * - hello with the watermark kept in sessionStorage per conversation, so a
 *   reconnect or a page reload resumes where the page left off;
 * - a msg is delivered only when seq == watermark + 1; seq <= watermark is a
 *   duplicate and dropped; a gap sends one sync (until synced) and drops the
 *   frame, since the replay brings it again in order;
 * - sends carry a client message id; unacknowledged sends are sent again with
 *   the same id after a reconnect (the server answers the same seq);
 * - reconnect after every close except Disconnect: decorrelated jitter (base
 *   250 ms, cap 10 s), the server's retryAfterMs as a floor, reset by welcome;
 *   a drain frame moves the page to reconnectTo after afterMs.
 *
 * Only the current socket may change state: every handler first checks that
 * its socket is still state.ws, so a replaced socket is inert.
 */
(function () {
  'use strict';

  const SUBPROTOCOL = 'converger.v1';
  const BACKOFF_BASE_MS = 250;
  const BACKOFF_CAP_MS = 10000;
  const CONNECT_TIMEOUT_MS = 15000; /* socket opened until welcome */
  const SYNC_RETRY_MS = 1000; /* replay_unavailable without a hint */
  const LOG_MAX_LINES = 500;
  const WATERMARK_KEY = 'converger.watermark.';

  const state = {
    url: '',
    conv: '',
    token: '',
    ws: null, /* the current socket; null while waiting to reconnect */
    node: '',
    welcomed: false,
    syncPending: false, /* a sync is in flight: no second one until synced */
    stopped: true, /* Disconnect pressed (or never connected): no reconnect */
    rejected: null, /* why the token was refused (error unauthorized) */
    backoffMs: BACKOFF_BASE_MS, /* previous delay, for decorrelated jitter */
    notBefore: 0, /* server retry hint: no reconnect before (ms epoch) */
    timers: { reconnect: 0, connect: 0, drain: 0, sync: 0 },
    head: null,
    watermark: null, /* last delivered seq; null = none yet (start at head) */
    duplicates: 0,
    pending: new Map(), /* client message id -> text, until its sent ack */
  };

  const $ = (id) => document.getElementById(id);

  /* ---- display ---- */

  function clock() {
    const d = new Date();
    const p = (n, w) => String(n).padStart(w, '0');
    return p(d.getHours(), 2) + ':' + p(d.getMinutes(), 2) + ':' +
      p(d.getSeconds(), 2) + '.' + p(d.getMilliseconds(), 3);
  }

  /* kind: 'msg', 'info', 'err'. Text only: never innerHTML. */
  function log(kind, text) {
    const el = $('log');
    const atBottom = el.scrollTop + el.clientHeight >= el.scrollHeight - 4;
    const line = document.createElement('div');
    line.className = 'line ' + kind;
    line.textContent = clock() + '  ' + text;
    el.appendChild(line);
    while (el.childElementCount > LOG_MAX_LINES) el.firstElementChild.remove();
    if (atBottom) el.scrollTop = el.scrollHeight;
  }

  function setStatus(text, kind) {
    const el = $('state');
    el.textContent = text;
    el.className = 'state ' + (kind || '');
  }

  function render() {
    $('head').textContent = state.head === null ? '-' : String(state.head);
    $('watermark').textContent =
      state.watermark === null ? 'null' : String(state.watermark);
    $('duplicates').textContent = String(state.duplicates);
    $('pending').textContent = String(state.pending.size);
  }

  function short(v) {
    let s;
    try {
      s = typeof v === 'string' ? v : JSON.stringify(v);
    } catch (e) {
      s = String(v);
    }
    if (s === undefined) s = String(v);
    return s.length > 300 ? s.slice(0, 300) + '…' : s;
  }

  /* ---- watermark, kept per conversation for reloads ---- */

  const isSeq = (v, min) => Number.isSafeInteger(v) && v >= min;

  function loadWatermark(conv) {
    try {
      const v = sessionStorage.getItem(WATERMARK_KEY + conv);
      const n = v === null ? NaN : Number(v);
      return isSeq(n, 0) ? n : null;
    } catch (e) {
      return null; /* storage disabled: start at the head */
    }
  }

  function setWatermark(n) {
    state.watermark = n;
    try {
      sessionStorage.setItem(WATERMARK_KEY + state.conv, String(n));
    } catch (e) {
      /* storage full or disabled: the in-memory watermark still works */
    }
  }

  function noteHead(h) {
    if (isSeq(h, 0)) state.head = h;
  }

  /* ---- helpers ---- */

  function uuid() {
    if (window.crypto && typeof crypto.randomUUID === 'function') {
      return crypto.randomUUID();
    }
    const b = new Uint8Array(16);
    if (window.crypto && typeof crypto.getRandomValues === 'function') {
      crypto.getRandomValues(b);
    } else {
      for (let i = 0; i < 16; i++) b[i] = Math.floor(Math.random() * 256);
    }
    b[6] = (b[6] & 0x0f) | 0x40; /* version 4 */
    b[8] = (b[8] & 0x3f) | 0x80; /* RFC 4122 variant */
    const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
    return h.slice(0, 8) + '-' + h.slice(8, 12) + '-' + h.slice(12, 16) +
      '-' + h.slice(16, 20) + '-' + h.slice(20);
  }

  function clearTimer(name) {
    clearTimeout(state.timers[name]);
    state.timers[name] = 0;
  }

  function clearTimers() {
    Object.keys(state.timers).forEach(clearTimer);
  }

  function sendFrame(frame) {
    const ws = state.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN) return false;
    ws.send(JSON.stringify(frame));
    return true;
  }

  /* A server retry hint is a floor for the next reconnect. */
  function addHint(ms) {
    if (typeof ms === 'number' && Number.isFinite(ms) && ms > 0) {
      state.notBefore = Math.max(state.notBefore, Date.now() + ms);
    }
  }

  function defaultUrl() {
    const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
    return scheme + '//' + (location.host || '127.0.0.1:8080') + '/v1/ws';
  }

  const isWsUrl = (s) => typeof s === 'string' && /^wss?:\/\/\S+$/i.test(s);

  /* ---- connection ---- */

  /* Forget the current socket without reacting to its close. */
  function detach(reason) {
    const old = state.ws;
    state.ws = null;
    state.welcomed = false;
    state.syncPending = false;
    if (!old) return;
    old.onopen = old.onmessage = old.onerror = old.onclose = null;
    try {
      old.close(1000, reason);
    } catch (e) {
      /* already closing */
    }
  }

  function connect() {
    clearTimers();
    detach('reconnecting');
    let ws;
    try {
      ws = new WebSocket(state.url, SUBPROTOCOL);
    } catch (e) {
      state.stopped = true;
      log('err', 'cannot open ' + state.url + ': ' + e.message);
      setStatus('closed (bad node URL)', 'bad');
      return;
    }
    state.ws = ws;
    setStatus('connecting to ' + state.url, 'wait');

    state.timers.connect = setTimeout(() => {
      if (ws !== state.ws || state.welcomed) return;
      log('err', 'no welcome within ' + CONNECT_TIMEOUT_MS + ' ms');
      ws.close(); /* the close handler schedules the reconnect */
    }, CONNECT_TIMEOUT_MS);

    ws.onopen = () => {
      if (ws !== state.ws) return;
      if (ws.protocol !== SUBPROTOCOL) {
        log('err', 'server chose subprotocol "' + ws.protocol + '"');
      }
      sendFrame({
        type: 'hello',
        token: state.token,
        subs: [{ conv: state.conv, watermark: state.watermark }],
      });
      log('info', 'hello conv=' + state.conv + ' watermark=' + state.watermark);
    };
    ws.onmessage = (ev) => {
      if (ws === state.ws) onMessage(ev.data);
    };
    ws.onerror = () => {
      /* no details in browsers; a close event always follows */
    };
    ws.onclose = (ev) => {
      if (ws === state.ws) onClose(ev);
    };
  }

  function onClose(ev) {
    clearTimers();
    state.ws = null;
    state.welcomed = false;
    state.syncPending = false;
    if (ev.code === 1012 || ev.code === 1013) {
      try {
        const r = JSON.parse(ev.reason);
        if (r && typeof r === 'object') addHint(r.retryAfterMs);
      } catch (e) {
        /* a reason that is not JSON carries no hint */
      }
    }
    const what = 'closed ' + ev.code + (ev.reason ? ' ' + ev.reason : '');
    log(ev.code === 1000 ? 'info' : 'err', what);
    if (ev.code === 1008 && state.rejected) {
      /* the token was refused: the same token would be refused again */
      state.stopped = true;
      setStatus('token rejected (' + state.rejected + '): get a new token and connect again', 'bad');
      return;
    }
    if (state.stopped) {
      setStatus(what, 'bad');
      return;
    }
    /* decorrelated jitter: min(cap, random between base and 3 * previous) */
    const prev = state.backoffMs;
    state.backoffMs = Math.min(BACKOFF_CAP_MS,
      BACKOFF_BASE_MS + Math.random() * (3 * prev - BACKOFF_BASE_MS));
    const delay = Math.round(
      Math.max(state.notBefore - Date.now(), state.backoffMs));
    setStatus(what + ', reconnecting in ' + delay + ' ms', 'wait');
    state.timers.reconnect = setTimeout(connect, delay);
  }

  /* ---- frames ---- */

  function onMessage(data) {
    if (typeof data !== 'string') {
      log('err', 'ignored a binary frame');
      return;
    }
    let f;
    try {
      f = JSON.parse(data);
    } catch (e) {
      log('err', 'ignored a frame that is not JSON: ' + short(data));
      return;
    }
    if (!f || typeof f !== 'object' || typeof f.type !== 'string') {
      log('err', 'ignored a frame without a type: ' + short(data));
      return;
    }
    const handle = Object.prototype.hasOwnProperty.call(handlers, f.type)
      ? handlers[f.type] : null;
    try {
      if (handle) handle(f);
      else log('info', 'ignored frame type ' + short(f.type));
    } catch (e) {
      log('err', 'could not handle ' + f.type + ': ' + e.message);
    }
    render();
  }

  function requestSync(why) {
    if (state.syncPending) return;
    if (!sendFrame({ type: 'sync', conv: state.conv, watermark: state.watermark })) return;
    state.syncPending = true;
    log('info', why + ': sync from watermark ' + state.watermark);
  }

  const handlers = {
    welcome(f) {
      state.welcomed = true;
      clearTimer('connect');
      state.backoffMs = BACKOFF_BASE_MS;
      state.notBefore = 0;
      state.node = typeof f.node === 'string' ? f.node : '?';
      setStatus('connected (node ' + state.node + ')', 'ok');
      log('info', 'welcome node=' + state.node + ' session=' + short(f.session) +
        ' heartbeatMs=' + short(f.heartbeatMs));
      const sub = Array.isArray(f.subs)
        ? f.subs.find((s) => s && s.conv === state.conv) : null;
      if (sub) {
        noteHead(sub.head);
        log('info', 'subscribed conv=' + state.conv + ' head=' + short(sub.head) +
          ' presence=' + short(sub.presence));
        if (isSeq(sub.head, 0) && state.watermark !== null &&
            (sub.reset === true || state.watermark > sub.head)) {
          /* the node says our watermark is not in its history (a restored
           * store, another cluster): docs/protocol.md section 3.1 */
          log('err', 'reset: watermark ' + state.watermark + ' is not in the history' +
            ' (head ' + sub.head + ', epoch ' + short(sub.epoch) + '); going on from the head');
          setWatermark(sub.head);
        }
        if (state.watermark === null && isSeq(sub.head, 0)) {
          setWatermark(sub.head); /* null = start live at the head */
        }
      } else {
        log('err', 'conv ' + state.conv + ' is not in welcome.subs');
      }
      for (const [id, text] of state.pending) {
        sendFrame({ type: 'send', conv: state.conv, id: id, body: { text: text } });
        log('info', 'send again id=' + id);
      }
    },

    msg(f) {
      if (f.conv !== state.conv) return;
      if (!isSeq(f.seq, 1)) {
        log('err', 'ignored a msg with seq ' + short(f.seq));
        return;
      }
      const wm = state.watermark;
      if (wm !== null && f.seq <= wm) {
        state.duplicates++;
        return;
      }
      if (wm !== null && f.seq > wm + 1) {
        requestSync('gap: seq ' + f.seq + ' after ' + wm);
        return; /* the replay brings it again, in order */
      }
      setWatermark(f.seq);
      if (state.head === null || f.seq > state.head) state.head = f.seq;
      log('msg', ('#' + f.seq).padEnd(7) + ' ' + String(f.sender).padEnd(12) +
        ' ' + String(f.ts) + '  ' + short(f.body));
    },

    synced(f) {
      if (f.conv !== state.conv) return;
      state.syncPending = false;
      noteHead(f.head);
      if (state.watermark === null && isSeq(f.head, 0)) setWatermark(f.head);
      log('info', 'synced head=' + short(f.head) + ' watermark=' + state.watermark);
    },

    sent(f) {
      const text = state.pending.get(f.id);
      state.pending.delete(f.id);
      log('info', 'sent id=' + short(f.id) + ' seq=' + short(f.seq) +
        (text === undefined ? '' : '  ' + short(text)));
    },

    error(f) {
      addHint(f.retryAfterMs);
      if (f.code === 'unauthorized') state.rejected = short(f.message);
      log('err', 'error ' + short(f.code) + ': ' + short(f.message) +
        (f.conv !== undefined ? ' conv=' + short(f.conv) : '') +
        (f.retryAfterMs !== undefined ? ' retryAfterMs=' + short(f.retryAfterMs) : '') +
        (f.details !== undefined ? ' details=' + short(f.details) : ''));
      if (f.code === 'replay_unavailable' && f.conv === state.conv) {
        /* the connection stays: ask again later */
        state.syncPending = false;
        const ws = state.ws;
        const after = typeof f.retryAfterMs === 'number' && f.retryAfterMs > 0
          ? f.retryAfterMs : SYNC_RETRY_MS;
        clearTimer('sync');
        state.timers.sync = setTimeout(() => {
          if (ws === state.ws) requestSync('retry after replay_unavailable');
        }, after);
      }
    },

    drain(f) {
      const after = typeof f.afterMs === 'number' && f.afterMs > 0 ? f.afterMs : 0;
      if (isWsUrl(f.reconnectTo)) {
        state.url = f.reconnectTo; /* also used if this socket dies first */
        $('node').value = f.reconnectTo;
      } else if (f.reconnectTo !== null && f.reconnectTo !== undefined) {
        log('err', 'ignored reconnectTo ' + short(f.reconnectTo));
      }
      log('info', 'drain: moving to ' + state.url + ' in ' + Math.round(after) +
        ' ms (deadlineMs=' + short(f.deadlineMs) + ')');
      setStatus('connected (node ' + state.node + '), draining: moving in ' +
        Math.round(after) + ' ms', 'wait');
      clearTimer('drain');
      state.timers.drain = setTimeout(connect, after);
    },

    pong() {},
  };

  /* ---- controls ---- */

  function onConnect(ev) {
    ev.preventDefault();
    const url = $('node').value.trim() || defaultUrl();
    const conv = $('conv').value.trim();
    const token = $('token').value.trim();
    if (!conv || !token) {
      log('err', 'conversation id and token are both needed');
      return;
    }
    if (!isWsUrl(url)) {
      log('err', 'node must be a ws:// or wss:// URL');
      return;
    }
    if (conv !== state.conv) {
      state.pending.clear();
      state.head = null;
      state.duplicates = 0;
      state.watermark = loadWatermark(conv);
    }
    state.url = url;
    state.conv = conv;
    state.token = token;
    state.stopped = false;
    state.rejected = null;
    state.backoffMs = BACKOFF_BASE_MS;
    state.notBefore = 0;
    render();
    connect();
  }

  function onDisconnect() {
    state.stopped = true;
    clearTimers();
    if (state.ws) {
      setStatus('closing', 'wait');
      state.ws.close(1000, 'user disconnect');
    } else {
      setStatus('closed (disconnected)', 'bad');
    }
  }

  function onSend(ev) {
    ev.preventDefault();
    const input = $('text');
    const text = input.value;
    if (!text) return;
    if (!state.conv) {
      log('err', 'connect to a conversation first');
      return;
    }
    const id = uuid();
    state.pending.set(id, text);
    if (state.welcomed &&
        sendFrame({ type: 'send', conv: state.conv, id: id, body: { text: text } })) {
      log('info', 'send id=' + id);
    } else {
      log('info', 'queued id=' + id + ' until connected');
    }
    input.value = '';
    render();
  }

  function init() {
    const q = new URLSearchParams(location.search);
    $('node').value = q.get('node') || defaultUrl();
    $('conv').value = q.get('conv') || '';
    $('token').value = q.get('token') || '';
    $('connect-form').addEventListener('submit', onConnect);
    $('disconnect').addEventListener('click', onDisconnect);
    $('send-form').addEventListener('submit', onSend);
    render();
    if (q.get('conv') && q.get('token')) $('connect').click();
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', init);
  } else {
    init();
  }
})();
