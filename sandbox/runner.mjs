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
// - Memory: after every slice the runner compares its usage with `memoryLimitMb` and
//   ends the run a little below it; a failed allocation (under the daemon's hard
//   RLIMIT_DATA) ends it too, even when the script catches the RangeError.
//
// Wire (JSON lines). daemon → runner:
//   {t:'start', script, args?, budget, sliceMs, memoryLimitMb}  (no args: the script's args is undefined)
//   {t:'reply', id, ok, value|error, kind?, cancelled?} {t:'budget', budget} {t:'ping', n}
//   {t:'sync', n}  (answered {t:'synced', n} in line order: a barrier)
//   {t:'probe', id, code}  (only with SWARMBASE_TEST_PROBE=1; tests)
// runner → daemon:
//   {t:'call', id, op:'agent', prompt, opts}
//   {t:'call', id, op:'workflow', source: name-or-text|{name}|{scriptPath}, args?, opts}
//   {t:'cancel', ids, reason}  (race/waitN losers' in-flight calls)
//   {t:'phase', title} {t:'log', message} {t:'pong', n} {t:'synced', n}
//   {t:'probe-result', id, ok, value|error} {t:'done', ok, value|error, line, watchdog?, memory?}

import vm from 'node:vm';
import readline from 'node:readline';
import { GUARDS } from './context/guards.mjs';
import { CALLS } from './context/calls.mjs';
import { HOOKS } from './context/hooks.mjs';

// The context's source is three parts joined into one strict function, so they share
// names without putting anything on the script's global object (see each part's header).
const BOOTSTRAP = "(function () {\n'use strict';\n" + GUARDS + CALLS + HOOKS + '\n})();';

const write = (msg) => process.stdout.write(JSON.stringify(msg) + '\n');

function scriptSource(script) {
  // `export const meta = {...}` is read by the daemon as a pure literal before the run
  // starts (swarmbase/script/meta.py); here the body of an async function cannot export,
  // so the keyword is dropped in place (same line, same numbering) and `meta` is a const.
  const rewritten = script.replace(/^(\s*)export\s+const\s+meta\s*=/m, '$1const meta =');
  if (/^\s*(export|import)\s/m.test(rewritten)) {
    throw new SyntaxError('only `export const meta = {...}` may be exported, and import is not available in a SwarmBase script');
  }
  // The wrapper sits on the same line as the first script line, so line N of the
  // compiled source is line N of the script.
  return 'globalThis.__sbBody = (async function () { ' + rewritten + '\n});';
}

const DEFAULT_MEMORY_MB = 512;
// The runner ends the run itself a little below the hard OS limit, while it can still
// say why; past the hard limit an allocation fails or the process dies.
const MEMORY_SOFT_FRACTION = 0.85;
// Test hook (issue 13): lets a test run code in this process, outside the vm. The daemon
// never sets it.
const PROBES = process.env.SWARMBASE_TEST_PROBE === '1';

class Runner {
  constructor() {
    this.ctx = vm.createContext(Object.create(null), {
      name: 'swarmbase-script',
      microtaskMode: 'afterEvaluate',
      codeGeneration: { strings: true, wasm: false },
    });
    this.sliceMs = 5000;
    this.memoryMb = DEFAULT_MEMORY_MB;
    this.finished = false;
    this.started = false;
    this.bootstrapError = null;
    this.drainScript = new vm.Script('__sb.drain()');
    this.pendingScript = new vm.Script('__sb.pendingCount()');
    this.startNextScript = new vm.Script('__sb.startNext()');
  }

  // The hooks are defined before any start message arrives: their source is the
  // runner's own and holds nothing of any run, so a warm spare has them ready.
  bootstrap() {
    try {
      this.eval(BOOTSTRAP, 'bootstrap.js');
    } catch (e) {
      this.bootstrapError = e;
    }
  }

  eval(source, filename = 'bridge.js', timeout = this.sliceMs) {
    const s = source instanceof vm.Script ? source : new vm.Script(source, { filename });
    return s.runInContext(this.ctx, { timeout, breakOnSigint: false });
  }

  // One timed slice of script work, then one slice per race/waitN branch it queued
  // (each branch starts in an evaluation of its own: see context/calls.mjs); then
  // forward whatever the script sent.
  step(source) {
    // The slice and the branch starts it queued share one time budget: a script whose
    // branches start races of their own would otherwise never yield.
    const deadline = performance.now() + this.sliceMs;
    try {
      this.eval(source);
      for (;;) {
        const left = Math.ceil(deadline - performance.now());
        if (left <= 0) throw Object.assign(new Error('slice over'), { code: 'ERR_SCRIPT_EXECUTION_TIMEOUT' });
        if (this.eval(this.startNextScript, undefined, left) !== true) break;
      }
    } catch (e) {
      return this.fatal(e);
    }
    if (this.overMemory()) return this.finishMemory();
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
      else if (msg.t === 'memory') this.finishMemory();
      else write(msg);
    }
  }

  overMemory() {
    const m = process.memoryUsage();
    return Math.max(m.rss, m.heapUsed + m.external) > this.memoryMb * 1024 * 1024 * MEMORY_SOFT_FRACTION;
  }

  finishMemory() {
    this.finish({ t: 'done', ok: false, line: null, memory: true,
      error: 'the script exceeded its memory limit (' + this.memoryMb + ' MB)' });
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
    if (e instanceof RangeError && /allocation failed/i.test(e.message)) return this.finishMemory();
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
    // One script per runner, ever (a warm spare is single-use): a second start is a daemon bug.
    if (this.started) return this.finish({ t: 'done', ok: false, line: null,
      error: 'runner: a second script was sent to this runner (a runner runs one script)' });
    this.started = true;
    if (Number.isInteger(msg.sliceMs) && msg.sliceMs > 0) this.sliceMs = msg.sliceMs;
    if (Number.isFinite(msg.memoryLimitMb) && msg.memoryLimitMb > 0) this.memoryMb = msg.memoryLimitMb;
    if (this.bootstrapError) return this.fatal(this.bootstrapError);
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
      (msg.args === undefined ? 'undefined' : JSON.stringify(msg.args)) + ', ' + JSON.stringify(msg.budget ?? {}) + '); })()');
  }

  handle(msg) {
    // Answered in line order: when the daemon reads `synced`, it has read everything
    // this process wrote while handling the lines before `sync` (cancels included).
    if (msg.t === 'ping') return write({ t: 'pong', n: msg.n });
    if (msg.t === 'sync') return write({ t: 'synced', n: msg.n });
    if (msg.t === 'probe') return PROBES ? probe(msg) : undefined;
    if (this.finished) return;
    if (msg.t === 'start') return this.start(msg);
    if (msg.t === 'reply' || msg.t === 'budget') return this.step('__sb.recv(' + JSON.stringify(msg) + ')');
  }
}

// Runs in this process's own realm, with everything the runner process itself can reach
// (import('node:net') and the rest): that is what the tests need to see.
async function probe(msg) {
  const AsyncFunction = (async () => {}).constructor;
  try {
    const value = await new AsyncFunction(String(msg.code))();
    write({ t: 'probe-result', id: msg.id, ok: true, value: value === undefined ? null : value });
  } catch (e) {
    write({ t: 'probe-result', id: msg.id, ok: false, error: String((e && e.stack) || e) });
  }
}

const runner = new Runner();
runner.bootstrap();
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', (line) => {
  if (!line.trim()) return;
  let msg;
  try { msg = JSON.parse(line); } catch {
    // The daemon never sends a line that does not parse; if one arrives the runner's state
    // cannot be trusted (a lost start or reply would hang the run): fail it at once.
    return runner.finish({ t: 'done', ok: false, line: null,
      error: 'runner: a message from the daemon was not valid JSON (' + line.length + ' bytes)' });
  }
  runner.handle(msg);
});
rl.on('close', () => process.exit(runner.finished ? 0 : 3));
