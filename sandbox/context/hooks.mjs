// Source evaluated inside the script's vm context: the hooks a script sees (agent,
// workflow, phase, log, parallel, pipeline, race, waitN, bounded, budget, meta) and the
// `__sb` object the runner drives. Uses the names CALLS and GUARDS define.
export const HOOKS = String.raw`
  const isPlainObject = (o) => o !== null && typeof o === 'object' && !Array.isArray(o);

  function agent(prompt, opts) {
    if (typeof prompt !== 'string' || prompt.length === 0) {
      return Promise.reject(new TypeError('agent(prompt, opts): prompt must be a non-empty string'));
    }
    let o;
    try { o = plain(opts === undefined ? {} : opts, 'agent() options'); }
    catch (e) { return Promise.reject(e); }
    if (!isPlainObject(o)) return Promise.reject(new TypeError('agent(prompt, opts): opts must be an object'));
    return call('agent', { prompt, opts: o });
  }

  function workflow(source, args, opts) {
    const usage = 'workflow(source, args, opts): ';
    let src, a, o;
    try {
      if (typeof source === 'string') {
        if (!source.trim()) throw new TypeError(usage + 'source must be script text or { name }');
        src = source;
      } else if (isPlainObject(source) && typeof source.name === 'string' && source.name &&
                 Object.keys(source).length === 1) {
        src = { name: source.name };
      } else {
        throw new TypeError(usage + 'source must be script text or { name } of a saved workflow');
      }
      a = plain(args, 'workflow() args');
      o = plain(opts === undefined ? {} : opts, 'workflow() options');
      if (!isPlainObject(o)) throw new TypeError(usage + 'opts must be an object');
    } catch (e) { return Promise.reject(e); }
    return call('workflow', { source: src, args: a, opts: o });
  }

  function phase(title) { send({ t: 'phase', title: String(title) }); }
  function log(...parts) {
    send({ t: 'log', message: parts.map((p) => typeof p === 'string' ? p : JSON.stringify(p)).join(' ') });
  }

  const checkFunctions = (fns, usage, what) => {
    if (!Array.isArray(fns)) throw new TypeError(usage + ': ' + what + ' must be an array of functions');
    fns.forEach((f, i) => { if (typeof f !== 'function') throw new TypeError(usage + ': item ' + i + ' is not a function'); });
  };
  // Everything that can settle with a failure reports the first one in input order, with
  // a note of how many failed (see docs/decisions.md, "parallel() / pipeline() failure rule").
  function firstFailure(results, what, extra) {
    const failed = results.filter((r) => r && r.status === 'rejected');
    if (failed.length === 0) return null;
    const e = failed[0].reason;
    if (e && typeof e === 'object' && (failed.length > 1 || extra)) {
      try { e.message = e.message + ' (' + what + ': ' + failed.length + ' of ' + results.length + ' failed' + (extra || '') + ')'; } catch (_) {}
    }
    return e;
  }
  const settled = (ok, v) => ok ? { status: 'fulfilled', value: v } : { status: 'rejected', reason: v };
  const isValue = (v) => v !== null && v !== undefined;

  // parallel and pipeline settle everything they started before reporting a failure,
  // so no agent keeps running unobserved; then the first failure in input order is thrown.
  async function parallel(thunks) {
    checkFunctions(thunks, 'parallel(thunks)', 'thunks');
    const b = current;
    const results = await Promise.allSettled(thunks.map((t) => Promise.resolve().then(() => inBranch(b, t))));
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
    const b = current;
    const run = async (item, index) => {
      let v = item;
      for (const stage of stages) v = await inBranch(b, () => stage(v, index));
      return v;
    };
    const results = await Promise.allSettled(items.map((item, i) => Promise.resolve().then(() => run(item, i))));
    const err = firstFailure(results, 'pipeline');
    if (err) throw err;
    return results.map((r) => r.value);
  }

  // race: the first value that is not null wins; the other branches are cancelled.
  function race(thunks) {
    try { checkFunctions(thunks, 'race(thunks)', 'thunks'); } catch (e) { return Promise.reject(e); }
    const parent = current;
    return new Promise((resolve, reject) => {
      if (thunks.length === 0) { resolve(null); return; }
      const results = new Array(thunks.length);
      const branches = [];
      let left = thunks.length, decided = false;
      thunks.forEach((t, i) => branches.push(spawnBranch(parent, t, (ok, v) => {
        left--;
        results[i] = settled(ok, v);
        if (decided) return;
        if (ok && isValue(v)) {
          decided = true;
          cancelBranches(branches.filter((_, j) => j !== i), 'lost the race');
          resolve(v);
        } else if (left === 0) {
          decided = true;
          const err = firstFailure(results, 'race', ', none won');
          if (err) reject(err); else resolve(null);
        }
      })));
    });
  }

  // waitN: the first n values that are not null, in completion order; the rest are
  // cancelled. Throws as soon as fewer than n can succeed.
  function waitN(n, thunks) {
    try {
      checkFunctions(thunks, 'waitN(n, thunks)', 'thunks');
      if (!Number.isInteger(n) || n < 0) throw new TypeError('waitN(n, thunks): n must be a non-negative integer');
    } catch (e) { return Promise.reject(e); }
    if (n === 0) return Promise.resolve([]);
    if (n > thunks.length) {
      return Promise.reject(new Error('waitN(' + n + ', thunks): only ' + thunks.length + ' thunks, so ' + n + ' can never succeed'));
    }
    const parent = current;
    return new Promise((resolve, reject) => {
      const values = [], winners = new Set(), branches = [];
      let failed = 0, firstError = null, decided = false;
      const giveUp = () => {
        decided = true;
        const running = thunks.length - values.length - failed;
        cancelBranches(branches.filter((_, j) => !winners.has(j)), 'waitN could not succeed');
        const e = new Error('waitN(' + n + '): only ' + values.length + ' of ' + thunks.length + ' succeeded, ' +
          n + ' needed (' + failed + ' failed or returned null' +
          (running ? ', ' + running + ' still running were cancelled' : '') + ')' +
          (firstError ? '; first error: ' + String(firstError && firstError.message || firstError) : ''));
        e.values = values.slice();
        reject(e);
      };
      thunks.forEach((t, i) => branches.push(spawnBranch(parent, t, (ok, v) => {
        if (decided) return;
        if (ok && isValue(v)) {
          values.push(v);
          winners.add(i);
          if (values.length === n) {
            decided = true;
            cancelBranches(branches.filter((_, j) => !winners.has(j)), 'waitN had its ' + n + ' results');
            resolve(values.slice());
          }
          return;
        }
        failed++;
        if (!ok && firstError === null) firstError = v;
        if (thunks.length - failed < n) giveUp();
      })));
    });
  }

  // bounded: fn(item, index) over items with at most limit in flight, results in input
  // order. After a failure no new item starts; the started ones settle, then the first
  // failure in input order is thrown.
  function bounded(limit, items, fn) {
    try {
      if (!Number.isInteger(limit) || limit < 1) throw new TypeError('bounded(limit, items, fn): limit must be a positive integer');
      if (!Array.isArray(items)) throw new TypeError('bounded(limit, items, fn): items must be an array');
      if (typeof fn !== 'function') throw new TypeError('bounded(limit, items, fn): fn must be a function');
    } catch (e) { return Promise.reject(e); }
    const b = current;
    return new Promise((resolve, reject) => {
      const results = new Array(items.length);
      let next = 0, running = 0, stopped = false;
      const finishIfDone = () => {
        if (running > 0 || (next < items.length && !stopped)) return;
        const notStarted = items.length - next;
        const err = firstFailure(results, 'bounded', notStarted ? ', ' + notStarted + ' not started' : '');
        if (err) reject(err); else resolve(results.map((r) => r.value));
      };
      const launch = () => {
        while (!stopped && running < limit && next < items.length) {
          const i = next++;
          running++;
          startIn(b, () => fn(items[i], i)).then(
            (v) => { results[i] = settled(true, v); },
            (e) => { results[i] = settled(false, e); stopped = true; },
          ).then(() => { running--; launch(); finishIfDone(); });
        }
      };
      launch();
      finishIfDone();
    });
  }

  let budgetView = { total: 0, spent: 0, reserved: 0, remaining: 0 };
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
  def('workflow', workflow);
  def('parallel', parallel);
  def('pipeline', pipeline);
  def('race', race);
  def('waitN', waitN);
  def('bounded', bounded);
  def('phase', phase);
  def('log', log);
  def('budget', budget);
  def('__sbMeta', metaSink);
  def('console', Object.freeze({ log, info: log, warn: log, error: log }));

  const fail = (e) => {
    noteAllocFailure(e);
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
      if (msg.t === 'budget') budgetView = msg.budget;
      else if (msg.t === 'reply') deliverReply(msg);
    },
    startNext,
    // A failed allocation ends the run whatever the script did with the error, so it
    // replaces everything else the slice sent.
    drain() {
      if (allocFailed()) return '{"t":"memory"}';
      const s = out.join('\n');
      out.length = 0;
      return s;
    },
    pendingCount() { return pending.size; },
  }));
`;
