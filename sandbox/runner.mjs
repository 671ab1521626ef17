// SwarmBase script runner.
//
// Started by the daemon as
//   node --experimental-permission --allow-fs-read=<this dir> runner.mjs
// in its own process group, with a minimal environment: no fs writes, no child
// processes, no workers. It runs one script and exits.
//
// Design log (why it looks like this):
// - The script runs in a `vm` context with microtaskMode 'afterEvaluate', so both
//   synchronous loops and microtask loops hit the per-slice `timeout`.
// - No host-realm object is ever put into the context: any host object leads via
//   `.constructor.constructor` to the host's Function (the classic escape). The
//   context is made from a null-prototype object, the hooks are defined by source
//   evaluated *inside* the context, and the host talks to the context only by
//   evaluating small scripts whose inputs are JSON literals in the source text and
//   whose outputs are strings. The host checks `typeof === 'string'` and never
//   touches a context object, so getters and Proxies never run outside a timed slice.
// - Host timers are not exposed: their callbacks would escape the timeout.
// - In 'afterEvaluate' mode a promise resolved from outside only continues when the
//   context is evaluated again, so every inbound message is delivered by evaluating
//   `__sb.recv(<json>)`, which also drains the queue under the timeout.
// - The daemon also pings this process over stdin; a runner whose event loop is
//   stuck stops answering and is killed by the daemon (second watchdog layer).
//
// Wire (JSON lines). daemon → runner: {t:'start', script, args, budget, sliceMs}
// {t:'reply', id, ok, value|error} {t:'budget', budget} {t:'ping', n}.
// runner → daemon: {t:'meta', meta} {t:'call', id, op:'agent', prompt, opts}
// {t:'phase', title} {t:'log', message} {t:'pong', n} {t:'done', ok, value|error, line}.

import vm from 'node:vm';
import readline from 'node:readline';

const BOOTSTRAP = String.raw`
(function () {
  'use strict';
  const out = [];
  const pending = new Map();
  let nextId = 1;
  let budgetView = { total: 0, spent: 0, reserved: 0, remaining: 0 };
  const send = (msg) => { out.push(JSON.stringify(msg)); };
  const plain = (v, what) => {
    if (v === undefined) return null;
    const text = JSON.stringify(v);
    if (text === undefined) throw new TypeError(what + ' must be JSON-serialisable');
    return JSON.parse(text);
  };
  const def = (name, value) => Object.defineProperty(globalThis, name,
    { value, writable: false, enumerable: false, configurable: false });

  // Determinism guards: these would give a different answer on resume.
  const RealDate = Date;
  const why = ' would differ when the run is resumed, so SwarmBase scripts may not use it. ' +
              'Pass times and seeds in args instead.';
  function SbDate(...a) {
    if (!new.target) throw new Error('Date() (the current time as text)' + why);
    if (a.length === 0) throw new Error('new Date() without arguments (the current time)' + why);
    return Reflect.construct(RealDate, a, new.target);
  }
  Object.setPrototypeOf(SbDate, RealDate);
  SbDate.prototype = RealDate.prototype;
  Object.defineProperty(RealDate.prototype, 'constructor', { value: SbDate });
  SbDate.now = function now() { throw new Error('Date.now()' + why); };
  Object.defineProperty(globalThis, 'Date', { value: SbDate, writable: false, configurable: false });
  Object.defineProperty(Math, 'random', { value: function random() { throw new Error('Math.random()' + why); },
    writable: false, configurable: false });

  // The call site's stack is captured now, so a rejection points at the script line
  // that called the hook rather than at the bridge.
  const call = (op, payload) => {
    const site = new Error();
    return new Promise((resolve, reject) => {
      const id = nextId++;
      pending.set(id, { resolve, reject, site });
      send(Object.assign({ t: 'call', id, op }, payload));
    });
  };

  function agent(prompt, opts) {
    if (typeof prompt !== 'string' || prompt.length === 0) {
      return Promise.reject(new TypeError('agent(prompt, opts): prompt must be a non-empty string'));
    }
    let o;
    try { o = plain(opts === undefined ? {} : opts, 'agent() options'); }
    catch (e) { return Promise.reject(e); }
    if (o === null || typeof o !== 'object' || Array.isArray(o)) {
      return Promise.reject(new TypeError('agent(prompt, opts): opts must be an object'));
    }
    return call('agent', { prompt, opts: o });
  }

  function phase(title) { send({ t: 'phase', title: String(title) }); }
  function log(...parts) {
    send({ t: 'log', message: parts.map((p) => typeof p === 'string' ? p : JSON.stringify(p)).join(' ') });
  }

  // parallel and pipeline settle everything they started before reporting a failure,
  // so no agent keeps running unobserved; then the first failure in input order is thrown.
  function firstFailure(results, what) {
    const failed = results.filter((r) => r.status === 'rejected');
    if (failed.length === 0) return null;
    const e = failed[0].reason;
    if (e && typeof e === 'object' && failed.length > 1) {
      try { e.message = e.message + ' (' + what + ': ' + failed.length + ' of ' + results.length + ' failed)'; } catch (_) {}
    }
    return e;
  }
  async function parallel(thunks) {
    if (!Array.isArray(thunks)) throw new TypeError('parallel(thunks): thunks must be an array of functions');
    thunks.forEach((t, i) => { if (typeof t !== 'function') throw new TypeError('parallel(thunks): item ' + i + ' is not a function'); });
    const results = await Promise.allSettled(thunks.map((t) => Promise.resolve().then(() => t())));
    const err = firstFailure(results, 'parallel');
    if (err) throw err;
    return results.map((r) => r.value);
  }
  async function pipeline(items, ...stages) {
    if (!Array.isArray(items)) throw new TypeError('pipeline(items, ...stages): items must be an array');
    stages.forEach((s, i) => { if (typeof s !== 'function') throw new TypeError('pipeline: stage ' + i + ' is not a function'); });
    // Each item runs through the stages on its own chain, so different items are in
    // different stages at once; stage k of an item starts as soon as stage k-1 of that
    // item is done. A stage gets (value, index).
    const run = async (item, index) => {
      let v = item;
      for (const stage of stages) v = await stage(v, index);
      return v;
    };
    const results = await Promise.allSettled(items.map((item, i) => Promise.resolve().then(() => run(item, i))));
    const err = firstFailure(results, 'pipeline');
    if (err) throw err;
    return results.map((r) => r.value);
  }

  const budget = Object.freeze(Object.create(null, {
    total: { get: () => budgetView.total, enumerable: true },
    spent: { get: () => budgetView.spent, enumerable: true },
    reserved: { get: () => budgetView.reserved, enumerable: true },
    remaining: { get: () => budgetView.remaining, enumerable: true },
    tokens: { get: () => budgetView.tokens === undefined ? null : Object.freeze(Object.assign({}, budgetView.tokens)), enumerable: true },
    toJSON: { value: () => Object.assign({}, budgetView) },
  }));

  let meta = null;
  const metaSink = Object.freeze(Object.create(null, {
    value: { set: (v) => { meta = plain(v, 'meta'); send({ t: 'meta', meta }); }, get: () => meta },
  }));

  def('agent', agent);
  def('parallel', parallel);
  def('pipeline', pipeline);
  def('phase', phase);
  def('log', log);
  def('budget', budget);
  def('__sbMeta', metaSink);
  def('console', Object.freeze({ log, info: log, warn: log, error: log }));

  const fail = (e) => {
    let message, line = null;
    if (e && typeof e === 'object') {
      message = (e.name ? e.name + ': ' : '') + e.message;
      const m = /script\.js:(\d+)/.exec(String(e.stack || ''));
      if (m) line = Number(m[1]);
    } else {
      message = 'the script threw a non-error value: ' + String(e);
    }
    send({ t: 'done', ok: false, error: message, line });
  };

  def('__sb', Object.freeze({
    start(body, argsValue, b) {
      budgetView = b;
      def('args', Object.freeze(argsValue));
      let result;
      try { result = body(); } catch (e) { fail(e); return; }
      Promise.resolve(result).then((value) => {
        let v;
        try { v = plain(value, 'the return value'); } catch (e) { fail(e); return; }
        send({ t: 'done', ok: true, value: v });
      }, fail);
    },
    recv(msg) {
      if (msg.t === 'budget') { budgetView = msg.budget; return; }
      if (msg.t === 'reply') {
        const p = pending.get(msg.id);
        if (!p) return;
        pending.delete(msg.id);
        if (msg.ok) { p.resolve(msg.value); return; }
        const err = new Error(msg.error);
        err.stack = 'Error: ' + msg.error + '\n' + String(p.site.stack).split('\n').slice(1).join('\n');
        p.reject(err);
      }
    },
    drain() { const s = out.join('\n'); out.length = 0; return s; },
    pendingCount() { return pending.size; },
  }));
})();
`;

const write = (msg) => process.stdout.write(JSON.stringify(msg) + '\n');

function scriptSource(script) {
  // `export const meta = {...}` labels the run; the body of an async function cannot
  // export, so the keyword is rewritten in place (same line, same numbering).
  const rewritten = script.replace(/^(\s*)export\s+const\s+meta\s*=/m, '$1const meta = __sbMeta.value =');
  if (/^\s*(export|import)\s/m.test(rewritten)) {
    throw new SyntaxError('only `export const meta = {...}` may be exported, and import is not available in a SwarmBase script');
  }
  // The wrapper sits on the same line as the first script line, so line N of the
  // compiled source is line N of the script.
  return 'globalThis.__sbBody = (async function () { ' + rewritten + '\n});';
}

class Runner {
  constructor() {
    this.ctx = vm.createContext(Object.create(null), {
      name: 'swarmbase-script',
      microtaskMode: 'afterEvaluate',
      codeGeneration: { strings: true, wasm: false },
    });
    this.sliceMs = 5000;
    this.finished = false;
    this.drainScript = new vm.Script('__sb.drain()');
    this.pendingScript = new vm.Script('__sb.pendingCount()');
  }

  eval(source, filename = 'bridge.js') {
    const s = source instanceof vm.Script ? source : new vm.Script(source, { filename });
    return s.runInContext(this.ctx, { timeout: this.sliceMs, breakOnSigint: false });
  }

  // One timed slice of script work; then forward whatever the script sent.
  step(source) {
    try {
      this.eval(source);
    } catch (e) {
      return this.fatal(e);
    }
    this.flush();
    if (!this.finished) this.checkDeadlock();
  }

  flush() {
    let text;
    try { text = this.eval(this.drainScript); } catch (e) { return this.fatal(e); }
    if (typeof text !== 'string') return this.finish({ t: 'done', ok: false, error: 'internal: the bridge was tampered with', line: null });
    if (!text) return;
    for (const line of text.split('\n')) {
      if (this.finished) return;
      const msg = JSON.parse(line);
      if (msg.t === 'done') this.finish(msg);
      else write(msg);
    }
  }

  checkDeadlock() {
    let n;
    try { n = this.eval(this.pendingScript); } catch (e) { return this.fatal(e); }
    if (n === 0) {
      this.finish({ t: 'done', ok: false, line: null,
        error: 'the script is waiting on a promise that nothing can settle (no agent() call is pending, and scripts have no timers)' });
    }
  }

  fatal(e) {
    if (e && e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT') {
      return this.finish({ t: 'done', ok: false, line: null, watchdog: true,
        error: 'watchdog: the script ran for more than ' + this.sliceMs + ' ms without yielding (a busy loop?)' });
    }
    return this.finish({ t: 'done', ok: false, line: null, error: 'runner error: ' + String(e && e.message) });
  }

  finish(msg) {
    if (this.finished) return;
    this.finished = true;
    write(msg);
    // Leave promptly; the daemon also kills the group.
    process.stdout.write('', () => process.exit(0));
  }

  start(msg) {
    if (Number.isInteger(msg.sliceMs) && msg.sliceMs > 0) this.sliceMs = msg.sliceMs;
    try {
      this.eval(BOOTSTRAP, 'bootstrap.js');
    } catch (e) {
      return this.fatal(e);
    }
    let body;
    try {
      body = new vm.Script(scriptSource(msg.script), { filename: 'script.js' });
    } catch (e) {
      const m = /script\.js:(\d+)/.exec(String(e.stack || ''));
      return this.finish({ t: 'done', ok: false, error: 'SyntaxError: ' + e.message, line: m ? Number(m[1]) : null });
    }
    // Evaluating the body only defines the function (kept on a context global; the
    // host never holds it), then __sb.start calls it inside a timed slice.
    try {
      body.runInContext(this.ctx, { timeout: this.sliceMs });
    } catch (e) {
      return this.fatal(e);
    }
    this.step('(function () { const body = globalThis.__sbBody; delete globalThis.__sbBody; __sb.start(body, ' +
      JSON.stringify(msg.args ?? null) + ', ' + JSON.stringify(msg.budget ?? {}) + '); })()');
  }

  handle(msg) {
    if (msg.t === 'ping') return write({ t: 'pong', n: msg.n });
    if (this.finished) return;
    if (msg.t === 'start') return this.start(msg);
    if (msg.t === 'reply' || msg.t === 'budget') return this.step('__sb.recv(' + JSON.stringify(msg) + ')');
  }
}

const runner = new Runner();
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', (line) => {
  if (!line.trim()) return;
  let msg;
  try { msg = JSON.parse(line); } catch { return; }
  runner.handle(msg);
});
rl.on('close', () => process.exit(runner.finished ? 0 : 3));
